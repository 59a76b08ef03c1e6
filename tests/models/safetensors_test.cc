#include "roll/models/safetensors.h"

#include <torch/torch.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/temp_dir.h"
#include "testing/files.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult HasSub(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("safetensors");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }
  static std::string ReadBytes(const std::string& path) { return testing::ReadFile(path); }
  // Files in dir_ whose names contain `needle`.
  std::vector<std::string> FilesContaining(const std::string& needle) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      std::string n = e.path().filename().string();
      if (n.find(needle) != std::string::npos) out.push_back(n);
    }
    return out;
  }

  // A file per the spec: u64 LE length, header text, data bytes.
  static std::string Encode(const std::string& header, const std::string& data) {
    std::string out;
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return out + header + data;
  }

  // Opens a hand-built file and returns the error (expects failure).
  absl::Status OpenError(const std::string& header, const std::string& data,
                         const std::string& name = "bad.safetensors") {
    WriteBytes(Path(name), Encode(header, data));
    auto f = SafetensorsFile::Open(Path(name));
    EXPECT_FALSE(f.ok()) << "opened a corrupt file";
    return f.ok() ? absl::OkStatus() : f.status();
  }

  std::string dir_;
};

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// One tensor per supported dtype, with awkward shapes and special values.
std::map<std::string, at::Tensor> EveryDtype() {
  torch::manual_seed(7);
  std::map<std::string, at::Tensor> t;
  at::Tensor special = torch::tensor({0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 3.14159f});
  t["f64"] = torch::randn({3, 5}, torch::kFloat64);
  t["f32"] = torch::cat({torch::randn({9}), special});
  t["f16"] = torch::cat({torch::randn({5}), special}).to(torch::kFloat16);
  t["bf16"] = torch::cat({torch::randn({2, 3}).flatten(), special}).to(torch::kBFloat16);
  t["i64"] = torch::tensor({INT64_MIN, int64_t{-1}, int64_t{0}, INT64_MAX});
  t["i32"] = torch::randint(-1000000, 1000000, {2, 2, 3}, torch::kInt32);
  t["i16"] = torch::randint(-30000, 30000, {7}, torch::kInt16);
  t["i8"] = torch::randint(-128, 127, {11}, torch::kInt8);
  t["u8"] = torch::randint(0, 255, {1, 13}, torch::kUInt8);
  t["bool"] = torch::randint(0, 2, {3, 3}).to(torch::kBool);
  t["scalar"] = torch::tensor(2.5f).reshape({});
  t["empty"] = torch::zeros({0, 4}, torch::kFloat32);
  return t;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeBitExact) {
  auto tensors = EveryDtype();
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), tensors).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<std::string> expected_names;
  for (const auto& [name, t] : tensors) expected_names.push_back(name);
  EXPECT_EQ((*f)->names(), expected_names);

  const std::map<std::string, std::string> dtype_names = {
      {"f64", "F64"}, {"f32", "F32"}, {"f16", "F16"},   {"bf16", "BF16"},
      {"i64", "I64"}, {"i32", "I32"}, {"i16", "I16"},   {"i8", "I8"},
      {"u8", "U8"},   {"bool", "BOOL"}, {"scalar", "F32"}, {"empty", "F32"}};
  for (const auto& [name, t] : tensors) {
    auto info = (*f)->Info(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->dtype, dtype_names.at(name));
    EXPECT_EQ(info->scalar_type, t.scalar_type());
    EXPECT_EQ(at::IntArrayRef(info->shape), t.sizes()) << name;
    auto loaded = (*f)->Load(name);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(BitEqual(*loaded, t)) << name;
    auto viewed = (*f)->View(name);
    ASSERT_TRUE(viewed.ok()) << viewed.status();
    EXPECT_TRUE(BitEqual(*viewed, t)) << name;
  }
}

TEST_F(SafetensorsTest, NonContiguousAndGradTensorsAreSavedByValue) {
  at::Tensor base = torch::arange(12, torch::kFloat32).reshape({3, 4});
  at::Tensor param = torch::randn({4}).requires_grad_(true);
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"t", base.t()}, {"p", param}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(torch::equal((*f)->Load("t").value(), base.t()));
  EXPECT_TRUE(torch::equal((*f)->Load("p").value(), param.detach()));
}

TEST_F(SafetensorsTest, MetadataRoundTripsAndFormatPtIsAdded) {
  std::map<std::string, std::string> meta = {{"step", "10"}, {"note", "caf\xc3\xa9"}};
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", torch::ones({2})}}, meta).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  std::map<std::string, std::string> expected = meta;
  expected["format"] = "pt";
  EXPECT_EQ((*f)->metadata(), expected);

  ASSERT_TRUE(SaveSafetensors(Path("n.safetensors"), {{"w", torch::ones({2})}}, {{"format", "np"}}).ok());
  EXPECT_EQ(SafetensorsFile::Open(Path("n.safetensors")).value()->metadata().at("format"), "np");
}

TEST_F(SafetensorsTest, DataStartAndEveryTensorAreAligned) {
  // Vary the header length so padding is exercised for every remainder.
  for (int len = 1; len <= 9; ++len) {
    std::map<std::string, at::Tensor> t = {
        {std::string(len, 'a'), torch::ones({3}, torch::kBool)},
        {"b", torch::ones({5}, torch::kBFloat16)},
        {"c", torch::ones({3}, torch::kFloat64)},
        {"d", torch::ones({1}, torch::kInt8)},
        {"e", torch::ones({3}, torch::kFloat32)}};
    const std::string path = Path("a.safetensors");
    ASSERT_TRUE(SaveSafetensors(path, t).ok());
    auto f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->data_start() % 8, 0u) << "name length " << len;
    // The header padding is spaces, per the format.
    std::string bytes = ReadBytes(path);
    EXPECT_EQ(bytes[(*f)->data_start() - 1] == ' ' || bytes[(*f)->data_start() - 1] == '}', true);
    for (const std::string& name : (*f)->names()) {
      auto info = (*f)->Info(name).value();
      EXPECT_EQ(info.begin % c10::elementSize(info.scalar_type), 0u) << name;
    }
  }
}

TEST_F(SafetensorsTest, ViewAliasesTheMappingAndOutlivesTheFile) {
  at::Tensor w = torch::randn({64, 8});
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", w}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  at::Tensor v1 = (*f)->View("w").value();
  at::Tensor v2 = (*f)->View("w").value();
  at::Tensor owned = (*f)->Load("w").value();
  EXPECT_EQ(v1.data_ptr(), v2.data_ptr()) << "views must share the mapping, not copy";
  EXPECT_NE(owned.data_ptr(), v1.data_ptr()) << "Load must copy";
  f->reset();  // the views keep the mapping alive
  EXPECT_TRUE(torch::equal(v1, w));
  // The mapping is private: writing into a view never reaches the file.
  v1.fill_(0);
  auto again = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(torch::equal((*again)->Load("w").value(), w));
  EXPECT_TRUE(torch::equal(owned, w));
}

TEST_F(SafetensorsTest, LoadConvertsDtype) {
  at::Tensor w = torch::randn({4, 4}).to(torch::kBFloat16);
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", w}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  at::Tensor as_f32 = f->Load("w", torch::kFloat32).value();
  EXPECT_EQ(as_f32.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(as_f32, w.to(torch::kFloat32)));
  at::Tensor same = f->Load("w", torch::kBFloat16).value();
  EXPECT_TRUE(BitEqual(same, w));
}

TEST_F(SafetensorsTest, LoadWithExpectedShape) {
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"layer.w", torch::ones({2, 3})}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  EXPECT_TRUE(f->Load("layer.w", std::vector<int64_t>{2, 3}).ok());
  auto bad = f->Load("layer.w", std::vector<int64_t>{3, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), "'layer.w'"));
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), "m.safetensors"));
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), "[2, 3]"));
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), "[3, 2]"));
}

TEST_F(SafetensorsTest, LoadIntoConvertsAndChecksShape) {
  at::Tensor w = torch::randn({3, 2}).to(torch::kBFloat16);
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", w}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  at::Tensor param = torch::zeros({3, 2}).requires_grad_(true);
  ASSERT_TRUE(f->LoadInto("w", param).ok());
  EXPECT_TRUE(torch::equal(param.detach(), w.to(torch::kFloat32)));
  EXPECT_TRUE(param.requires_grad());

  at::Tensor wrong = torch::zeros({2, 3});
  absl::Status s = f->LoadInto("w", wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(torch::equal(wrong, torch::zeros({2, 3}))) << "a failed LoadInto must not write";
}

TEST_F(SafetensorsTest, MissingTensorNamesTensorAndFile) {
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", torch::ones({1})}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  for (const absl::Status& s : {f->Load("lm_head.weight").status(), f->Info("lm_head.weight").status(),
                                f->View("lm_head.weight").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(HasSub(std::string(s.message()), "'lm_head.weight'"));
    EXPECT_TRUE(HasSub(std::string(s.message()), "m.safetensors"));
  }
  EXPECT_FALSE(f->Contains("lm_head.weight"));
}

TEST_F(SafetensorsTest, ConcurrentLoadsFromManyThreads) {
  auto tensors = EveryDtype();
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), tensors).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const auto& [name, t] : tensors) ok[i] += BitEqual(f->Load(name).value(), t) ? 1 : 0;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int v : ok) EXPECT_EQ(v, 20 * static_cast<int>(tensors.size()));
}

// --- The format itself, independent of our writer -------------------------

TEST_F(SafetensorsTest, ParsesHandWrittenBytes) {
  // Two tensors: a = F32 [1.0, -2.0]; b = I16 [[0x1234]], little-endian.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I16","shape":[1,1],"data_offsets":[8,10]},)"
      R"("__metadata__":{"k":"v"}})";
  const char data[] = {0x00, 0x00, char(0x80), 0x3f, 0x00, 0x00, 0x00, char(0xc0), 0x34, 0x12};
  std::string bytes;
  const uint64_t n = header.size();
  // Length prefix written byte by byte, least significant first.
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(n >> (8 * i)));
  bytes += header;
  bytes.append(data, sizeof(data));
  WriteBytes(Path("hand.safetensors"), bytes);

  auto f = SafetensorsFile::Open(Path("hand.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->data_start(), 8 + header.size());
  EXPECT_EQ((*f)->metadata(), (std::map<std::string, std::string>{{"k", "v"}}));
  at::Tensor a = (*f)->Load("a").value();
  EXPECT_EQ(a.scalar_type(), torch::kFloat32);
  EXPECT_EQ(a[0].item<float>(), 1.0f);
  EXPECT_EQ(a[1].item<float>(), -2.0f);
  at::Tensor b = (*f)->Load("b").value();
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(b[0][0].item<int16_t>(), 0x1234);
  // The header is unpadded, so b's data sits at an odd address in the
  // mapping; View must still return correct values (it falls back to a copy).
  EXPECT_TRUE(torch::equal((*f)->View("b").value(), b));
}

TEST_F(SafetensorsTest, WritesTheExactBytesTheFormatPrescribes) {
  ASSERT_TRUE(SaveSafetensors(Path("x.safetensors"), {{"x", torch::tensor({1.5f})}}).ok());
  std::string json =
      R"({"__metadata__":{"format":"pt"},"x":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}})";
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::string expected;
  for (int i = 0; i < 8; ++i) expected.push_back(static_cast<char>(json.size() >> (8 * i)));
  expected += json;
  const char one_point_five[] = {0x00, 0x00, char(0xc0), 0x3f};  // 1.5f little-endian
  expected.append(one_point_five, 4);
  EXPECT_EQ(ReadBytes(Path("x.safetensors")), expected);
}

// --- Corrupt files: each must fail with a message naming file and tensor ---

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthPrefix) {
  WriteBytes(Path("short.safetensors"), std::string("\x05\x00\x00", 3));
  auto f = SafetensorsFile::Open(Path("short.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "short.safetensors"));
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "truncated"));
}

TEST_F(SafetensorsTest, RejectsEmptyFile) {
  WriteBytes(Path("empty.safetensors"), "");
  auto f = SafetensorsFile::Open(Path("empty.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "empty.safetensors"));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthLargerThanFile) {
  std::string bytes = Encode(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  bytes[0] = static_cast<char>(0xff);
  bytes[1] = static_cast<char>(0xff);
  WriteBytes(Path("long.safetensors"), bytes);
  auto f = SafetensorsFile::Open(Path("long.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "long.safetensors"));
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "header length 65535"));
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"big", torch::ones({100})}}).ok());
  std::string bytes = ReadBytes(Path("m.safetensors"));
  WriteBytes(Path("cut.safetensors"), bytes.substr(0, bytes.size() - 10));
  auto f = SafetensorsFile::Open(Path("cut.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "cut.safetensors"));
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "'big'"));
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "past the end"));
}

TEST_F(SafetensorsTest, RejectsInvalidJsonHeader) {
  absl::Status s = OpenError(R"({"a": {"dtype": "F32", )", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "invalid JSON header"));
}

TEST_F(SafetensorsTest, RejectsNonObjectHeader) {
  absl::Status s = OpenError("[1, 2, 3]", "");
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "not a JSON object"));
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsets) {
  absl::Status s = OpenError(
      R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'second'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "overlap tensor 'first'"));
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfBounds) {
  absl::Status s =
      OpenError(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "past the end of the data buffer (8 bytes)"));
}

TEST_F(SafetensorsTest, RejectsSizeThatDisagreesWithShape) {
  absl::Status s =
      OpenError(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "span 8 bytes but BF16 [2, 3] needs 12"));
}

TEST_F(SafetensorsTest, RejectsBeginAfterEnd) {
  absl::Status s =
      OpenError(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", std::string(4, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "begin > end"));
}

TEST_F(SafetensorsTest, RejectsGapInDataBuffer) {
  absl::Status s = OpenError(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
      std::string(6, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'b'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "gap"));
}

TEST_F(SafetensorsTest, RejectsTrailingUnindexedBytes) {
  absl::Status s =
      OpenError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", std::string(5, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "indexes only 2"));
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  absl::Status s =
      OpenError(R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "unknown dtype 'F17'"));
}

TEST_F(SafetensorsTest, RejectsNegativeOrNonIntegerDimensions) {
  absl::Status s =
      OpenError(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", "");
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "not a non-negative integer"));
  s = OpenError(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", "");
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
}

TEST_F(SafetensorsTest, RejectsMissingEntryFields) {
  absl::Status s = OpenError(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "dtype"));
  s = OpenError(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", std::string(1, '\0'));
  EXPECT_TRUE(HasSub(std::string(s.message()), "data_offsets"));
}

TEST_F(SafetensorsTest, RejectsNonStringMetadata) {
  absl::Status s = OpenError(R"({"__metadata__":{"step":10}})", "");
  EXPECT_TRUE(HasSub(std::string(s.message()), "bad.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'step'"));
}

TEST_F(SafetensorsTest, DtypeWithoutTorchEquivalentOpensButDoesNotLoad) {
  WriteBytes(Path("u16.safetensors"),
             Encode(R"({"w":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", std::string(4, 1)));
  auto f = SafetensorsFile::Open(Path("u16.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Info("w").value().dtype, "U16");
  auto t = (*f)->Load("w");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(HasSub(std::string(t.status().message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(t.status().message()), "U16"));
}

TEST_F(SafetensorsTest, RejectsBoolBytesOtherThanZeroOrOne) {
  WriteBytes(Path("b.safetensors"),
             Encode(R"({"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                    std::string("\x01\x00\x07", 3)));
  auto f = SafetensorsFile::Open(Path("b.safetensors")).value();
  auto t = f->Load("mask");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(HasSub(std::string(t.status().message()), "'mask'"));
  EXPECT_TRUE(HasSub(std::string(t.status().message()), "byte value 7"));
  EXPECT_FALSE(f->View("mask").ok());
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open(Path("nope.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSub(std::string(f.status().message()), "nope.safetensors"));
}

// --- Writing: validation and atomicity -------------------------------------

TEST_F(SafetensorsTest, SaveRejectsBadTensorsNamingThem) {
  absl::Status s = SaveSafetensors(Path("m.safetensors"), {{"c", torch::ones({2}, torch::kComplexFloat)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'c'"));
  s = SaveSafetensors(Path("m.safetensors"), {{"__metadata__", torch::ones({1})}});
  EXPECT_TRUE(HasSub(std::string(s.message()), "reserved"));
  s = SaveSafetensors(Path("m.safetensors"), {{"u", at::Tensor()}});
  EXPECT_TRUE(HasSub(std::string(s.message()), "'u'"));
  EXPECT_FALSE(fs::exists(Path("m.safetensors")));
}

TEST_F(SafetensorsTest, OverwriteReplacesContents) {
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"a", torch::ones({2})}}).ok());
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"b", torch::zeros({3})}}).ok());
  auto f = SafetensorsFile::Open(Path("m.safetensors")).value();
  EXPECT_EQ(f->names(), std::vector<std::string>{"b"});
  EXPECT_TRUE(FilesContaining(".tmp").empty());
}

TEST_F(SafetensorsTest, FailedWriteLeavesPreviousFileIntactAndNoTemporary) {
  at::Tensor old = torch::arange(16, torch::kFloat32);
  ASSERT_TRUE(SaveSafetensors(Path("m.safetensors"), {{"w", old}}).ok());

  // A real mid-write failure: cap the file size this process may write, so
  // the data write fails with EFBIG after the header went out.
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto prev_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status s = SaveSafetensors(Path("m.safetensors"), {{"w", torch::ones({100000})}});
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, prev_handler);

  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(HasSub(std::string(s.message()), "m.safetensors"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'w'"));
  EXPECT_TRUE(FilesContaining(".tmp").empty()) << "temporary file left behind";
  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(torch::equal((*f)->Load("w").value(), old));
}

TEST_F(SafetensorsTest, SaveIntoMissingDirectoryFailsCleanly) {
  absl::Status s = SaveSafetensors(Path("no/such/dir/m.safetensors"), {{"w", torch::ones({1})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSub(std::string(s.message()), "no/such/dir/m.safetensors"));
}

// --- Sharded checkpoints ---------------------------------------------------

std::map<std::string, at::Tensor> SomeLayers(int n) {
  torch::manual_seed(3);
  std::map<std::string, at::Tensor> t;
  for (int i = 0; i < n; ++i) {
    std::string p = "model.layers." + std::to_string(i);
    t[p + ".w"] = torch::randn({16, 16});                      // 1024 bytes
    t[p + ".b"] = torch::randn({16}).to(torch::kBFloat16);     // 32 bytes
  }
  t["model.embed_tokens.weight"] = torch::randn({10, 8});      // 320 bytes
  return t;
}

TEST_F(SafetensorsTest, ShardedRoundTripWithSmallShards) {
  auto tensors = SomeLayers(5);
  ASSERT_TRUE(SaveSharded(dir_, tensors, /*max_shard_bytes=*/2100).ok());
  EXPECT_FALSE(fs::exists(Path(kSafetensorsSingleFile)));
  ASSERT_TRUE(fs::exists(Path(kSafetensorsIndexFile)));

  std::ifstream in(Path(kSafetensorsIndexFile));
  nlohmann::json index = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const auto& [n, t] : tensors) total += t.numel() * t.element_size();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file.get<std::string>());
  ASSERT_GE(shard_files.size(), 3u);
  const size_t n = shard_files.size();
  size_t k = 1;
  for (const std::string& file : shard_files) {
    char expected[64];
    snprintf(expected, sizeof(expected), "model-%05zu-of-%05zu.safetensors", k++, n);
    EXPECT_EQ(file, expected);
    // No shard exceeds the limit unless it holds a single tensor.
    auto f = SafetensorsFile::Open(Path(file)).value();
    uint64_t bytes = 0;
    for (const auto& name : f->names()) bytes += f->Info(name).value().nbytes();
    if (f->names().size() > 1) {
      EXPECT_LE(bytes, 2100u) << file;
    }
  }

  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->sharded());
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  EXPECT_EQ((*ckpt)->names(), names);
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(BitEqual((*ckpt)->Load(name).value(), t)) << name;
    EXPECT_EQ(index["weight_map"][name].get<std::string>(),
              fs::path((*ckpt)->FileFor(name).value()->path()).filename().string());
  }
  EXPECT_EQ((*ckpt)->metadata().at("total_size"), std::to_string(total));
  // The index file path opens the same checkpoint.
  EXPECT_EQ(Checkpoint::Open(Path(kSafetensorsIndexFile)).value()->names(), names);
  EXPECT_TRUE(FilesContaining(".tmp").empty());
}

TEST_F(SafetensorsTest, TensorLargerThanShardLimitGetsItsOwnShard) {
  std::map<std::string, at::Tensor> t = {{"a", torch::ones({4})}, {"big", torch::ones({1000})},
                                         {"c", torch::ones({4})}};
  ASSERT_TRUE(SaveSharded(dir_, t, /*max_shard_bytes=*/100).ok());
  auto ckpt = Checkpoint::Open(dir_).value();
  const SafetensorsFile* big = ckpt->FileFor("big").value();
  EXPECT_EQ(big->names(), std::vector<std::string>{"big"});
  EXPECT_NE(ckpt->FileFor("a").value(), big);
  EXPECT_NE(ckpt->FileFor("c").value(), big);
}

TEST_F(SafetensorsTest, OneShardIsAPlainModelSafetensorsAndStaleShardsGo) {
  auto tensors = SomeLayers(3);
  ASSERT_TRUE(SaveSharded(dir_, tensors, 1100).ok());
  ASSERT_TRUE(fs::exists(Path(kSafetensorsIndexFile)));
  std::map<std::string, at::Tensor> smaller = {{"only", torch::arange(5)}};
  ASSERT_TRUE(SaveSharded(dir_, smaller).ok());
  EXPECT_TRUE(fs::exists(Path(kSafetensorsSingleFile)));
  EXPECT_FALSE(fs::exists(Path(kSafetensorsIndexFile)));
  EXPECT_TRUE(FilesContaining("-of-").empty());
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE((*ckpt)->sharded());
  EXPECT_EQ((*ckpt)->names(), std::vector<std::string>{"only"});
  EXPECT_TRUE(torch::equal((*ckpt)->Load("only").value(), torch::arange(5)));
}

TEST_F(SafetensorsTest, CheckpointOpensSingleFileAndDirectory) {
  ASSERT_TRUE(SaveSafetensors(Path(kSafetensorsSingleFile), {{"w", torch::ones({2})}}).ok());
  for (const std::string& p : {dir_, Path(kSafetensorsSingleFile)}) {
    auto ckpt = Checkpoint::Open(p);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_FALSE((*ckpt)->sharded());
    EXPECT_TRUE(torch::equal((*ckpt)->Load("w", std::vector<int64_t>{2}).value(), torch::ones({2})));
    EXPECT_EQ((*ckpt)->metadata().at("format"), "pt");
  }
}

TEST_F(SafetensorsTest, CheckpointOnEmptyDirectoryIsNotFound) {
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSub(std::string(ckpt.status().message()), kSafetensorsIndexFile));
}

TEST_F(SafetensorsTest, IndexNamingMissingShardNamesIndexShardAndTensor) {
  ASSERT_TRUE(SaveSharded(dir_, SomeLayers(3), 1100).ok());
  fs::remove(Path("model-00002-of-00004.safetensors"));
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(ckpt.status().message());
  EXPECT_TRUE(HasSub(msg, kSafetensorsIndexFile));
  EXPECT_TRUE(HasSub(msg, "model-00002-of-00004.safetensors"));
  EXPECT_TRUE(HasSub(msg, "holds tensor 'model.layers."));
}

TEST_F(SafetensorsTest, IndexNamingTensorAbsentFromShard) {
  ASSERT_TRUE(SaveSafetensors(Path("part.safetensors"), {{"a", torch::ones({1})}}).ok());
  WriteBytes(Path(kSafetensorsIndexFile),
             R"({"weight_map": {"a": "part.safetensors", "ghost": "part.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_TRUE(HasSub(std::string(ckpt.status().message()), "'ghost'"));
  EXPECT_TRUE(HasSub(std::string(ckpt.status().message()), "part.safetensors"));
}

TEST_F(SafetensorsTest, InvalidIndexFiles) {
  WriteBytes(Path(kSafetensorsIndexFile), "{not json");
  auto c = Checkpoint::Open(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), kSafetensorsIndexFile));

  WriteBytes(Path(kSafetensorsIndexFile), R"({"metadata": {}})");
  c = Checkpoint::Open(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "weight_map"));

  WriteBytes(Path(kSafetensorsIndexFile), R"({"weight_map": {"w": "../outside.safetensors"}})");
  c = Checkpoint::Open(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "'w'"));
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "inside the checkpoint directory"));

  WriteBytes(Path(kSafetensorsIndexFile), R"({"weight_map": {"w": 3}})");
  c = Checkpoint::Open(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "'w'"));
}

TEST_F(SafetensorsTest, CorruptShardErrorNamesShardFileAndIndex) {
  ASSERT_TRUE(SaveSharded(dir_, SomeLayers(3), 1100).ok());
  WriteBytes(Path("model-00003-of-00004.safetensors"), "garbage!garbage!");
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_TRUE(HasSub(std::string(ckpt.status().message()), "model-00003-of-00004.safetensors"));
  EXPECT_TRUE(HasSub(std::string(ckpt.status().message()), kSafetensorsIndexFile));
}

}  // namespace
}  // namespace roll
