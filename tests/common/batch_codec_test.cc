#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "roll/common/batch.h"

namespace roll {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Hand-written encodings, built from the documented layout rather than from
// EncodeBatch, so malformed headers can be produced field by field.
class Raw {
 public:
  Raw() {
    bytes_.append("RBT1", 4);
    U16(1);
    U16(0);
  }
  Raw& U8(uint8_t v) { return Put(v); }
  Raw& U16(uint16_t v) { return Put(v); }
  Raw& U32(uint32_t v) { return Put(v); }
  Raw& U64(uint64_t v) { return Put(v); }
  Raw& I64(int64_t v) { return Put(v); }
  Raw& Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    bytes_.append(s.data(), s.size());
    return *this;
  }
  Raw& Bytes(std::string_view s) {
    bytes_.append(s.data(), s.size());
    return *this;
  }
  // One tensor entry.
  Raw& Tensor(std::string_view name, uint8_t code, std::vector<int64_t> dims,
              uint64_t nbytes, std::string_view payload) {
    Str(name).U8(code).U8(static_cast<uint8_t>(dims.size()));
    for (int64_t d : dims) I64(d);
    return U64(nbytes).Bytes(payload);
  }
  const std::string& str() const { return bytes_; }

 private:
  template <typename T>
  Raw& Put(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    bytes_.append(buf, sizeof(T));
    return *this;
  }
  std::string bytes_;
};

constexpr uint8_t kFloat32Code = 1;
constexpr uint8_t kBoolCode = 10;

// A one-tensor batch: "x" float32 with `dims`, `nbytes` declared.
std::string OneTensor(std::vector<int64_t> dims, uint64_t nbytes,
                      std::string_view payload, uint8_t code = kFloat32Code) {
  Raw r;
  r.U32(1).Tensor("x", code, std::move(dims), nbytes, payload);
  r.U32(0).U32(0);
  return r.str();
}

void ExpectDecodeError(const std::string& bytes, const std::string& needle) {
  auto b = DecodeBatch(bytes);
  ASSERT_FALSE(b.ok()) << "decoded a malformed encoding";
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
      << b.status();
  EXPECT_THAT(std::string(b.status().message()), StartsWith("batch decode: "));
  EXPECT_THAT(std::string(b.status().message()), HasSubstr(needle));
}

// Byte comparison, so NaNs produced by corrupting float payloads compare
// equal to themselves.
bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.contiguous();
  at::Tensor y = b.contiguous();
  if (x.nbytes() != y.nbytes()) return false;
  return x.nbytes() == 0 ||
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void ExpectSameBatch(const Batch& a, const Batch& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, t] : a.tensors()) {
    ASSERT_TRUE(b.HasTensor(name)) << name;
    const at::Tensor& u = b.tensors().at(name);
    EXPECT_EQ(t.scalar_type(), u.scalar_type()) << name;
    EXPECT_EQ(t.sizes(), u.sizes()) << name;
    EXPECT_TRUE(BitwiseEqual(t, u)) << name;
  }
  EXPECT_EQ(a.columns(), b.columns());
  EXPECT_EQ(a.meta(), b.meta());
}

std::vector<at::ScalarType> AllDtypes() {
  return {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong,
          at::kInt,   at::kShort,  at::kChar, at::kByte,     at::kBool};
}

// Values that exercise every byte of the element (negative, large) where the
// dtype allows.
at::Tensor Sample(at::ScalarType type, std::vector<int64_t> shape) {
  at::Tensor base =
      at::arange(1, 1 + c10::multiply_integers(shape), at::kDouble)
          .reshape(shape);
  if (type == at::kBool) return (base.remainder(3) == 0);
  if (type == at::kByte) return base.remainder(256).to(type);
  if (at::isFloatingType(type)) return (base * -1.25 + 0.5).to(type);
  return (base * -3).to(type);
}

TEST(BatchCodecTest, RoundTripsEveryDtype) {
  for (at::ScalarType type : AllDtypes()) {
    SCOPED_TRACE(c10::toString(type));
    Batch b;
    b.SetTensor("matrix", Sample(type, {3, 4, 2}));
    b.SetTensor("per_sample", Sample(type, {3}));
    auto decoded = DecodeBatch(EncodeBatch(b));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectSameBatch(b, *decoded);
  }
}

TEST(BatchCodecTest, RoundTripsZeroSamples) {
  Batch b;
  for (at::ScalarType type : AllDtypes()) {
    b.SetTensor(std::string("t_") + c10::toString(type),
                at::empty({0, 5}, at::TensorOptions().dtype(type)));
  }
  b.SetTensor("flat", at::empty({0}, at::kFloat));
  b.SetColumn("prompt", {});
  b.SetMeta("k", "v");
  auto decoded = DecodeBatch(EncodeBatch(b));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->size(), 0);
  ExpectSameBatch(b, *decoded);
}

TEST(BatchCodecTest, RoundTripsEmptyBatch) {
  auto decoded = DecodeBatch(EncodeBatch(Batch()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->tensors().empty());
  EXPECT_TRUE(decoded->columns().empty());
  EXPECT_TRUE(decoded->meta().empty());
}

TEST(BatchCodecTest, RoundTripsNonContiguousTensors) {
  at::Tensor base = at::arange(60, at::kFloat).reshape({6, 10});
  Batch b;
  b.SetTensor("transposed", base.t());                 // [10, 6]
  b.SetTensor("strided", base.t().slice(1, 0, 6, 2));  // [10, 3]
  b.SetTensor("expanded",
              at::arange(10, at::kLong).unsqueeze(1).expand({10, 4}));
  ASSERT_FALSE(b.tensors().at("transposed").is_contiguous());
  ASSERT_FALSE(b.tensors().at("strided").is_contiguous());
  ASSERT_TRUE(b.Validate().ok());
  auto decoded = DecodeBatch(EncodeBatch(b));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameBatch(b, *decoded);
  EXPECT_TRUE(decoded->tensors().at("transposed").is_contiguous());
}

TEST(BatchCodecTest, RoundTripsColumnsAndMetaWithBinaryBytes) {
  Batch b;
  b.SetTensor("x", at::ones({3}));
  b.SetColumn("prompt", {"", std::string("a\0b", 3), std::string(1000, 'z')});
  b.SetColumn("tag", {"math", "code", "math"});
  b.SetMeta("", "empty key");
  b.SetMeta("bin", std::string("\xff\x00\x01", 3));
  auto decoded = DecodeBatch(EncodeBatch(b));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameBatch(b, *decoded);
}

TEST(BatchCodecTest, DecodedTensorsOwnTheirMemory) {
  Batch b;
  b.SetTensor("x", at::arange(4, at::kFloat));
  std::string bytes = EncodeBatch(b);
  auto decoded = DecodeBatch(bytes);
  ASSERT_TRUE(decoded.ok());
  bytes.assign(bytes.size(), '\x7f');
  EXPECT_TRUE(at::equal(decoded->tensors().at("x"), at::arange(4, at::kFloat)));
}

TEST(BatchCodecTest, EncodeToAppendsAfterExistingBytes) {
  Batch b;
  b.SetTensor("x", at::arange(5, at::kInt));
  b.SetMeta("m", "1");
  std::string out = "prefix";
  EncodeBatchTo(b, &out);
  ASSERT_THAT(out, StartsWith("prefix"));
  EXPECT_EQ(out.substr(6), EncodeBatch(b));
  auto decoded = DecodeBatch(std::string_view(out).substr(6));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameBatch(b, *decoded);
}

TEST(BatchCodecTest, HandWrittenEncodingDecodes) {
  // Guards the Raw helper: the malformed cases below differ from this one
  // only in the field they break.
  const float values[2] = {1.5f, -2.0f};
  auto b = DecodeBatch(OneTensor(
      {2}, 8, std::string_view(reinterpret_cast<const char*>(values), 8)));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(at::equal(b->tensors().at("x"), at::tensor({1.5f, -2.0f})));
}

TEST(BatchCodecTest, RejectsWrongMagicAndVersion) {
  std::string bytes = EncodeBatch(Batch());
  std::string bad = bytes;
  bad[0] = 'X';
  ExpectDecodeError(bad, "magic");
  bad = bytes;
  bad[4] = 9;
  ExpectDecodeError(bad, "version 9");
  ExpectDecodeError("", "truncated");
  ExpectDecodeError("GET / HTTP/1.1\r\n", "magic");
}

TEST(BatchCodecTest, RejectsUnknownDtype) {
  ExpectDecodeError(OneTensor({1}, 4, "abcd", /*code=*/77),
                    "tensor 'x': unknown dtype code 77");
  ExpectDecodeError(OneTensor({1}, 4, "abcd", /*code=*/0), "tensor 'x'");
}

TEST(BatchCodecTest, UnsupportedDtypeEncodesButDoesNotDecode) {
  Batch b;
  b.SetTensor("z", at::zeros({2}, at::kComplexFloat));
  auto decoded = DecodeBatch(EncodeBatch(b));
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("tensor 'z'"));
}

TEST(BatchCodecTest, RejectsHugeAndNegativeDims) {
  const int64_t big = int64_t{1} << 40;
  ExpectDecodeError(OneTensor({big, big}, 0, ""),
                    "tensor 'x': shape overflows");
  // A zero dim must not let its neighbours overflow.
  ExpectDecodeError(OneTensor({0, big, big}, 0, ""), "shape overflows");
  // Fits in int64 but the payload is not there: no allocation attempted.
  ExpectDecodeError(OneTensor({big}, 4 * big, ""), "tensor 'x': truncated");
  ExpectDecodeError(OneTensor({-1}, 0, ""), "tensor 'x': negative dim");
  ExpectDecodeError(OneTensor(std::vector<int64_t>(40, 1), 4, "abcd"),
                    "tensor 'x': ndim 40");
}

TEST(BatchCodecTest, RejectsByteLengthThatDisagreesWithShape) {
  ExpectDecodeError(OneTensor({2}, 4, "abcd"),
                    "tensor 'x': byte length 4 disagrees with shape");
  ExpectDecodeError(OneTensor({1}, ~uint64_t{0}, "abcd"),
                    "tensor 'x': byte length");
}

TEST(BatchCodecTest, RejectsBoolBytesOtherThanZeroOrOne) {
  ExpectDecodeError(OneTensor({2}, 2, std::string("\x01\x02", 2), kBoolCode),
                    "tensor 'x': bool");
}

TEST(BatchCodecTest, RejectsTooManyEntries) {
  Raw many;
  many.U32(0xFFFFFFFF);
  ExpectDecodeError(many.str(), "too many tensors");
  Raw forged;  // under the cap, but cannot fit in the bytes present
  forged.U32(1000).U32(0).U32(0);
  ExpectDecodeError(forged.str(), "tensor count 1000");
  Raw rows;
  rows.U32(0).U32(1).Str("c").U64(uint64_t{1} << 60).U32(0);
  ExpectDecodeError(rows.str(), "column 'c': row count");
  Raw meta;
  meta.U32(0).U32(0).U32(0x7FFFFFFF);
  ExpectDecodeError(meta.str(), "too many meta entries");
}

TEST(BatchCodecTest, RejectsDuplicatesTrailingBytesAndBadSizes) {
  Raw dup;
  dup.U32(2).Tensor("x", kFloat32Code, {1}, 4, "abcd");
  dup.Tensor("x", kFloat32Code, {1}, 4, "abcd").U32(0).U32(0);
  ExpectDecodeError(dup.str(), "tensor 'x': duplicate");

  ExpectDecodeError(EncodeBatch(Batch()) + "x", "trailing");

  // Well-formed entries that disagree on the number of samples.
  Raw sizes;
  sizes.U32(1).Tensor("x", kFloat32Code, {1}, 4, "abcd");
  sizes.U32(1).Str("c").U64(2).Str("a").Str("b").U32(0);
  ExpectDecodeError(sizes.str(), "column 'c' has 2");

  Raw scalar;
  scalar.U32(1).Tensor("s", kFloat32Code, {}, 4, "abcd").U32(0).U32(0);
  ExpectDecodeError(scalar.str(), "'s'");

  Raw long_name;
  long_name.U32(1).Str(std::string(5000, 'n'));
  ExpectDecodeError(long_name.str(), "tensor #0: name length 5000");
}

Batch RichBatch() {
  Batch b;
  b.SetTensor("f", at::arange(6, at::kFloat).reshape({3, 2}));
  b.SetTensor("h", at::arange(3, at::kHalf));
  b.SetTensor("ids", at::arange(9, at::kLong).reshape({3, 3}));
  b.SetTensor("mask", at::arange(3, at::kLong).remainder(2) == 0);  // 1 0 1
  b.SetColumn("prompt", {"a", "bb", "ccc"});
  b.SetMeta("step", "3");
  return b;
}

// A result is acceptable if it is an InvalidArgument error with context, or
// a batch that is valid and survives another round trip.
void ExpectErrorOrValid(const std::string& bytes) {
  auto b = DecodeBatch(bytes);
  if (!b.ok()) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
        << b.status();
    EXPECT_THAT(std::string(b.status().message()),
                StartsWith("batch decode: "));
    return;
  }
  ASSERT_TRUE(b->Validate().ok()) << b->Validate();
  auto again = DecodeBatch(EncodeBatch(*b));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameBatch(*b, *again);
}

TEST(BatchCodecTest, EveryTruncationIsAnError) {
  const std::string bytes = EncodeBatch(RichBatch());
  ASSERT_TRUE(DecodeBatch(bytes).ok());
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto b = DecodeBatch(std::string_view(bytes).substr(0, len));
    ASSERT_FALSE(b.ok()) << "prefix of length " << len << " decoded";
    EXPECT_THAT(std::string(b.status().message()),
                StartsWith("batch decode: "));
  }
}

TEST(BatchCodecTest, RandomCorruptionsNeverCrash) {
  const std::string bytes = EncodeBatch(RichBatch());
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<size_t> pos(0, bytes.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  int decoded_ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bad = bytes;
    switch (iter % 3) {
      case 0:  // a few random bytes
        for (int k = 0, n = 1 + iter % 4; k < n; ++k) bad[pos(rng)] = byte(rng);
        break;
      case 1: {  // an 8-byte window of 0xFF: forged lengths and dims
        size_t p = pos(rng);
        for (size_t k = p; k < std::min(bad.size(), p + 8); ++k)
          bad[k] = '\xff';
        break;
      }
      case 2:  // a single bit flip
        bad[pos(rng)] ^= static_cast<char>(1 << (iter % 8));
        break;
    }
    SCOPED_TRACE(iter);
    ExpectErrorOrValid(bad);
    if (DecodeBatch(bad).ok()) ++decoded_ok;
    if (HasFatalFailure()) return;
  }
  // Flips inside tensor payloads leave a valid batch; flips in headers do
  // not. Both paths must have been exercised.
  EXPECT_GT(decoded_ok, 0);
  EXPECT_LT(decoded_ok, 3000);
}

}  // namespace
}  // namespace roll
