// ValidationStats and val_pass_k: the validation metrics every pipeline logs.

#include "roll/pipeline/validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace roll {
namespace {

using ::testing::HasSubstr;

TEST(ValidationStatsTest, AccuracyIsAMeanOverGroupsAndRewardOverSamples) {
  ValidationStats stats;
  stats.AddGroup({1.0, 0.0, 0.0, 0.0}, {2, 4, 6, 8});  // 1 of 4 correct
  stats.AddGroup({1.0, 1.0}, {1, 1});                  // 2 of 2 correct
  std::map<std::string, double> m;
  stats.WriteTo({1, 2}, &m);
  EXPECT_DOUBLE_EQ(m["val/accuracy"], (0.25 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m["val/reward_mean"], 3.0 / 6);
  EXPECT_DOUBLE_EQ(m["val/response_length"], 22.0 / 6);
  // pass@1 is the accuracy; pass@2 of 1-in-4 is 1 - C(3,2)/C(4,2) = 0.5.
  EXPECT_DOUBLE_EQ(m["val/pass@1"], (0.25 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m["val/pass@2"], (0.5 + 1.0) / 2);
  EXPECT_EQ(stats.groups(), 2);
}

TEST(ValidationStatsTest, PassAtKLeavesOutGroupsWithFewerSamples) {
  EXPECT_DOUBLE_EQ(MeanPassAtK({{4, 1}, {1, 1}}, 2), 0.5);
  EXPECT_DOUBLE_EQ(MeanPassAtK({{1, 1}}, 2), 0.0);
  ValidationStats none;
  std::map<std::string, double> m;
  none.WriteTo({1}, &m, "eval/");
  EXPECT_EQ(m["eval/accuracy"], 0.0);
  EXPECT_EQ(m.count("val/accuracy"), 0u);
}

TEST(ValidationStatsTest, ScoresJustBelowOneAreNotCorrect) {
  ValidationStats stats;
  stats.AddGroup({0.999, 1.0 - 1e-12}, {1, 1});
  std::map<std::string, double> m;
  stats.WriteTo({}, &m);
  EXPECT_DOUBLE_EQ(m["val/accuracy"], 0.5);
}

TEST(ValidationStatsTest, GeneratedSamplesAddTokenAndAnswerEntropy) {
  auto sample = [](double score, std::vector<float> entropies, std::string answer) {
    SampleResult s;
    s.score = score;
    s.response_ids.assign(entropies.size(), 7);
    s.entropies = std::move(entropies);
    s.extracted_answer = std::move(answer);
    return s;
  };
  ValidationStats stats;
  // Answers {4, 4, 5, 6}: entropy -(1/2 ln 1/2 + 2 x 1/4 ln 1/4) = 1.5 ln 2.
  stats.AddGroup({sample(1, {0.5f, 1.5f}, "4"), sample(1, {1.0f}, "4"), sample(0, {2.0f}, "5"),
                  sample(0, {}, "6")});
  // One answer for all: entropy 0.
  stats.AddGroup({sample(0, {3.0f}, "9"), sample(0, {3.0f}, "9")});
  std::map<std::string, double> m;
  stats.WriteTo({1}, &m);
  EXPECT_DOUBLE_EQ(m["val/token_entropy"], (0.5 + 1.5 + 1.0 + 2.0 + 3.0 + 3.0) / 6);
  EXPECT_NEAR(m["val/answer_entropy"], (1.5 * std::log(2.0) + 0.0) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(m["val/accuracy"], (0.5 + 0.0) / 2);
  EXPECT_EQ(stats.solved(), (std::vector<bool>{true, false}));
}

TEST(ValidationStatsTest, PassKEntriesAreChecked) {
  PipelineConfig c;
  c.val_num_return_sequences = 4;
  c.val_pass_k = {"1", "4"};
  auto ks = ParsePassK(c);
  ASSERT_TRUE(ks.ok());
  EXPECT_EQ(*ks, (std::vector<int64_t>{1, 4}));
  c.val_pass_k = {"8"};
  EXPECT_THAT(std::string(ParsePassK(c).status().message()),
              HasSubstr("pass@8 needs val_num_return_sequences >= 8, got 4"));
  c.val_pass_k = {"two"};
  EXPECT_THAT(std::string(ParsePassK(c).status().message()), HasSubstr("'two' is not a positive integer"));
}

}  // namespace
}  // namespace roll
