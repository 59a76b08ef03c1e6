// The parts of the train phase that are functions of their inputs: the
// mini-batch size and slices, and the advantage stage.

#include "roll/pipeline/train_phase.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace roll {
namespace {

using ::testing::HasSubstr;

PipelineConfig Config(int per_device, int accumulation, int world) {
  PipelineConfig c;
  c.actor_train.training_args.per_device_train_batch_size = per_device;
  c.actor_train.training_args.gradient_accumulation_steps = accumulation;
  c.actor_train.world_size = world;
  return c;
}

TEST(TrainPhaseTest, MiniBatchIsPerDeviceTimesAccumulationTimesRanks) {
  auto mini = MiniBatchSize(Config(4, 2, 2), 32, "32");
  ASSERT_TRUE(mini.ok());
  EXPECT_EQ(*mini, 16);
}

TEST(TrainPhaseTest, StepThatIsNoMultipleOfTheMiniBatchIsRefusedWithTheNumbers) {
  auto mini = MiniBatchSize(Config(4, 2, 2), 24, "rollout_batch_size x num_return_sequences_in_group = 3 x 8 = 24");
  ASSERT_FALSE(mini.ok());
  EXPECT_EQ(mini.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mini.status().message()), HasSubstr("3 x 8 = 24 samples per step"));
  EXPECT_THAT(std::string(mini.status().message()), HasSubstr("= 4 x 2 x 2 = 16"));
}

TEST(TrainPhaseTest, MiniBatchRangesCoverEveryEpochInOrder) {
  using R = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(MiniBatchRanges(8, 4, 1), (R{{0, 4}, {4, 8}}));
  EXPECT_EQ(MiniBatchRanges(8, 4, 2), (R{{0, 4}, {4, 8}, {0, 4}, {4, 8}}));
  EXPECT_EQ(MiniBatchRanges(5, 4, 1), (R{{0, 4}, {4, 5}}));
  EXPECT_TRUE(MiniBatchRanges(8, 0, 1).empty());
}

// Two groups of two samples, each a 2-token prompt and a 2-token response.
Batch TwoGroups(std::vector<float> scores) {
  Batch b;
  b.SetTensor("input_ids", at::ones({4, 4}, at::kLong));
  b.SetTensor("attention_mask", at::ones({4, 4}, at::kLong));
  b.SetTensor("response_mask", at::tensor({0, 0, 1, 1}, at::kLong).repeat({4, 1}));
  b.SetTensor("scores", at::tensor(scores, at::kFloat));
  b.SetTensor("group_index", at::tensor({0, 0, 1, 1}, at::kLong));
  return b;
}

TEST(TrainPhaseTest, GrpoAdvantagesAreGroupRelativeOnResponseTokens) {
  PipelineConfig c;
  c.adv_estimator = "grpo";
  Batch b = TwoGroups({1, 0, 1, 1});
  Metrics m;
  ASSERT_TRUE(ComputeAdvantagesInto(c, &b, &m).ok());
  at::Tensor adv = *b.Tensor("advantages");
  ASSERT_EQ(adv.sizes(), (at::IntArrayRef{4, 3}));
  // Group 0: the correct sample above the mean, the other below; the prompt
  // position (index 0 of the shifted mask) gets nothing.
  EXPECT_GT(adv[0][2].item<float>(), 0);
  EXPECT_LT(adv[1][2].item<float>(), 0);
  EXPECT_EQ(adv[0][0].item<float>(), 0);
  // Group 1 scored alike: no signal.
  EXPECT_EQ(adv[2].abs().sum().item<float>(), 0);
  EXPECT_TRUE(b.HasTensor("returns"));
  EXPECT_EQ(m.count("train/advantage_mean"), 1u);
  EXPECT_GT(m["train/advantage_abs_mean"], 0);
}

TEST(TrainPhaseTest, MissingColumnsAreNamed) {
  PipelineConfig c;
  Batch b = TwoGroups({1, 0, 1, 1});
  Batch no_scores;
  no_scores.SetTensor("group_index", *b.Tensor("group_index"));
  Metrics m;
  absl::Status s = ComputeAdvantagesInto(c, &no_scores, &m);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("scores"));
}

}  // namespace
}  // namespace roll
