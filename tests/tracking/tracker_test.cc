#include "roll/tracking/tracker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

using TempDir = testing::ScratchDir;  // removed with the test

using ::testing::HasSubstr;
using ::testing::StartsWith;


std::vector<nlohmann::json> ReadLines(const std::string &path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
}

TEST(MetricsWriterTest, WritesStepAndGroupNameKeys) {
  TempDir dir;
  const std::string path = dir / "run/metrics.jsonl";  // the parent is created
  auto w = MetricsWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Log(0, {{"val/accuracy", 0.25}}).ok());
  ASSERT_TRUE(
      (*w)->Log(1, {{"train/reward_mean", 0.5}, {"actor/grad_norm", 1.5}, {"time/step_s", 2.0}}).ok());
  auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], nlohmann::json({{"step", 0}, {"val/accuracy", 0.25}}));
  EXPECT_EQ(lines[1],
            nlohmann::json(
                {{"step", 1}, {"train/reward_mean", 0.5}, {"actor/grad_norm", 1.5}, {"time/step_s", 2.0}}));
  EXPECT_TRUE(lines[1]["step"].is_number_integer());
}

TEST(MetricsWriterTest, NonFiniteValuesAreNull) {
  TempDir dir;
  auto w = MetricsWriter::Open(dir / "metrics.jsonl");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(
      (*w)->Log(3, {{"actor/kl", std::nan("")}, {"actor/lr", std::numeric_limits<double>::infinity()}}).ok());
  auto lines = ReadLines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(lines[0]["actor/kl"].is_null());
  EXPECT_TRUE(lines[0]["actor/lr"].is_null());
}

TEST(MetricsWriterTest, RejectsKeysWithoutGroup) {
  TempDir dir;
  auto w = MetricsWriter::Open(dir / "metrics.jsonl");
  ASSERT_TRUE(w.ok()) << w.status();
  for (const char *bad : {"reward", "/reward", "train/", ""}) {
    absl::Status s = (*w)->Log(1, {{bad, 1.0}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(std::string("'") + bad + "'"));
  }
  EXPECT_TRUE(ReadLines(dir / "metrics.jsonl").empty()) << "nothing written for a rejected step";
}

TEST(MetricsWriterTest, AppendsAcrossOpens) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  ASSERT_TRUE((*MetricsWriter::Open(path))->Log(1, {{"train/x", 1}}).ok());
  ASSERT_TRUE((*MetricsWriter::Open(path))->Log(2, {{"train/x", 2}}).ok());
  EXPECT_EQ(ReadLines(path).size(), 2u);
}

TEST(MetricsWriterTest, TruncateAfterDropsLaterSteps) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  {
    auto w = MetricsWriter::Open(path);
    ASSERT_TRUE(w.ok());
    for (int step = 0; step <= 5; ++step) ASSERT_TRUE((*w)->Log(step, {{"train/x", step * 1.0}}).ok());
  }
  {
    std::ofstream f(path, std::ios::app);
    f << R"({"step": 6, "train/x")";  // a torn line from a crash
  }
  auto w = MetricsWriter::Open(path, /*truncate_after=*/3);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Log(4, {{"train/x", 40.0}}).ok());
  auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["step"], i);
  EXPECT_EQ(lines[4], nlohmann::json({{"step", 4}, {"train/x", 40.0}}));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TensorBoardWriterTest, ReaderReturnsTheSameScalars) {
  TempDir dir;
  auto w = TensorBoardWriter::Create(dir / "tensorboard");
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = (*w)->path();
  EXPECT_THAT(std::filesystem::path(path).filename().string(), StartsWith("events.out.tfevents."));
  EXPECT_EQ(std::filesystem::path(path).parent_path().string(), dir / "tensorboard");
  ASSERT_TRUE((*w)->Log(0, {{"val/accuracy", 0.125}}).ok());
  ASSERT_TRUE((*w)->Log(1, {{"train/reward_mean", 0.5}, {"actor/pg_loss", -1.25}}).ok());
  ASSERT_TRUE((*w)->Log(300, {{"train/reward_mean", 0.75}, {"actor/kl", std::nan("")}}).ok());  // NaN skipped

  auto events = ReadTensorBoardEvents(path);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  struct Want {
    int64_t step;
    const char *tag;
    float value;
  };
  // Within a step, in key order (the map's).
  const Want want[] = {
      {0, "val/accuracy", 0.125f},
      {1, "actor/pg_loss", -1.25f},
      {1, "train/reward_mean", 0.5f},
      {300, "train/reward_mean", 0.75f},
  };
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*events)[i].step, want[i].step) << i;
    EXPECT_EQ((*events)[i].tag, want[i].tag) << i;
    EXPECT_EQ((*events)[i].value, want[i].value) << i;
    EXPECT_GT((*events)[i].wall_time, 1.5e9) << i;
  }
}

TEST(TensorBoardWriterTest, FileStartsWithTheVersionRecord) {
  TempDir dir;
  auto w = TensorBoardWriter::Create(dir / "tb");
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string bytes = testing::ReadFile((*w)->path());
  EXPECT_THAT(bytes, HasSubstr("brain.Event:2"));
  auto events = ReadTensorBoardEvents((*w)->path());
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_TRUE(events->empty());  // no scalars yet
}

TEST(TensorBoardWriterTest, FlippedByteIsDetectedWithItsOffset) {
  TempDir dir;
  auto w = TensorBoardWriter::Create(dir / "tb");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Log(1, {{"train/a", 1.0}}).ok());
  ASSERT_TRUE((*w)->Log(2, {{"train/a", 2.0}}).ok());
  const std::string path = (*w)->path();
  const std::string good = testing::ReadFile(path);
  w->reset();

  // Record boundaries, from the framing: 8-byte length, 4 + data + 4.
  std::vector<size_t> starts;
  for (size_t pos = 0; pos < good.size();) {
    starts.push_back(pos);
    uint64_t len = 0;
    std::memcpy(&len, good.data() + pos, 8);
    pos += 12 + len + 4;
  }
  ASSERT_EQ(starts.size(), 3u);  // version, two scalars

  auto flip_and_read = [&](size_t at) {
    std::string bad = good;
    bad[at] ^= 0x20;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    return ReadTensorBoardEvents(path);
  };
  // A byte in the data of the third record.
  auto r = flip_and_read(starts[2] + 14);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("record at byte " + std::to_string(starts[2])));
  EXPECT_THAT(r.status().message(), HasSubstr("data CRC mismatch"));
  // A byte of the length of the second record.
  r = flip_and_read(starts[1]);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("record at byte " + std::to_string(starts[1])));
  EXPECT_THAT(r.status().message(), HasSubstr("length CRC mismatch"));
  // A byte of the data CRC itself.
  r = flip_and_read(good.size() - 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("record at byte " + std::to_string(starts[2])));
}

TEST(TensorBoardWriterTest, TruncatedFileIsDetected) {
  TempDir dir;
  auto w = TensorBoardWriter::Create(dir / "tb");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Log(1, {{"train/a", 1.0}}).ok());
  const std::string path = (*w)->path();
  const std::string good = testing::ReadFile(path);
  w->reset();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 3);
  auto r = ReadTensorBoardEvents(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
}

TEST(TensorBoardWriterTest, MissingFileIsNotFound) {
  TempDir dir;
  auto r = ReadTensorBoardEvents(dir / "events.out.tfevents.0.none");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST(FormatProgressLineTest, AllParts) {
  const MetricMap m = {{"train/reward_mean", 0.41},
                       {"val/accuracy", 0.38},
                       {"throughput/gen_tokens_per_s", 1234.4},
                       {"actor/grad_norm", 3.0}};  // not shown
  EXPECT_EQ(FormatProgressLine(12, 200, m, 3.2),
            "step 12/200 | reward 0.410 | val acc 0.380 | 1234 tok/s | "
            "3.2 s/step | ETA 10m01s");
}

TEST(FormatProgressLineTest, AbsentPartsAreLeftOut) {
  EXPECT_EQ(FormatProgressLine(0, 100, {}, 0), "step 0/100");
  EXPECT_EQ(FormatProgressLine(99, 100, {{"train/reward_mean", 1.0}}, 2.0),
            "step 99/100 | reward 1.000 | 2.0 s/step | ETA 0m02s");
  EXPECT_EQ(FormatProgressLine(5, 10, {{"val/accuracy", 0.5}}, 0), "step 5/10 | val acc 0.500");
}

}  // namespace
}  // namespace roll
