// RunTracker: metrics.jsonl of a fresh and of a resumed run, and when the
// progress line is printed.

#include "roll/pipeline/run_tracker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "nlohmann/json.hpp"
#include "testing/temp_dir.h"

namespace roll {
namespace {

std::vector<int64_t> LoggedSteps(const std::string& path) {
  std::vector<int64_t> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  return out;
}

PipelineConfig Config(const std::string& dir) {
  PipelineConfig c;
  c.output_dir = dir;
  c.max_steps = 6;
  c.logging_steps = 3;
  return c;
}

TEST(RunTrackerTest, FreshRunReplacesAnEarlierRunsMetrics) {
  testing::ScratchDir out;
  std::ofstream(out / "metrics.jsonl") << "{\"step\": 9, \"train/x\": 1}\n";
  auto t = RunTracker::Open(Config(out.path()), 0, {/*progress=*/false, nullptr});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Log(0, {{"val/accuracy", 0.5}}).ok());
  ASSERT_TRUE((*t)->Log(1, {{"train/reward_mean", 0.25}}).ok());
  EXPECT_EQ(LoggedSteps(out / "metrics.jsonl"), (std::vector<int64_t>{0, 1}));
}

TEST(RunTrackerTest, ResumedRunKeepsEarlierStepsAndDropsLaterOnes) {
  testing::ScratchDir out;
  {
    auto t = RunTracker::Open(Config(out.path()), 0, {false, nullptr});
    ASSERT_TRUE(t.ok());
    for (int64_t s = 0; s <= 4; ++s) ASSERT_TRUE((*t)->Log(s, {{"train/x", 1.0 * s}}).ok());
  }
  auto t = RunTracker::Open(Config(out.path()), 2, {false, nullptr});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Log(3, {{"train/x", 3.5}}).ok());
  EXPECT_EQ(LoggedSteps(out / "metrics.jsonl"), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(RunTrackerTest, ProgressLineEveryLoggingStepsAndTheCallbackEveryStep) {
  testing::ScratchDir out;
  std::vector<int64_t> seen;
  TrackerOptions o;
  o.progress = true;
  o.on_step = [&](int64_t step, const std::map<std::string, double>&) { seen.push_back(step); };
  auto t = RunTracker::Open(Config(out.path()), 0, o);
  ASSERT_TRUE(t.ok());
  ::testing::internal::CaptureStdout();
  for (int64_t s = 0; s <= 6; ++s) ASSERT_TRUE((*t)->Log(s, {{"time/step_s", 1.0}}).ok());
  const std::string printed = ::testing::internal::GetCapturedStdout();
  // Step 0, every third step, and the last.
  std::vector<std::string> lines;
  for (size_t b = 0, e; (e = printed.find('\n', b)) != std::string::npos; b = e + 1) {
    lines.push_back(printed.substr(b, e - b));
  }
  ASSERT_EQ(lines.size(), 3u) << printed;
  EXPECT_THAT(lines[0], ::testing::StartsWith("step 0/6"));
  EXPECT_THAT(lines[1], ::testing::StartsWith("step 3/6"));
  EXPECT_THAT(lines[2], ::testing::StartsWith("step 6/6"));
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(RunTrackerTest, BadMetricNameIsRefused) {
  testing::ScratchDir out;
  auto t = RunTracker::Open(Config(out.path()), 0, {false, nullptr});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Log(1, {{"no_group", 1.0}}).ok());
}

}  // namespace
}  // namespace roll
