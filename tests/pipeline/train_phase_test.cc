// The parts of the train phase that are functions of their inputs: the
// mini-batch size and slices, the advantage stage, the compute counter
// against a hand count, and the loss-key checks.

#include "roll/pipeline/train_phase.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "testing/temp_dir.h"

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
  c.adv_estimator = AdvEstimator::kGrpo;
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

// hidden 8, 2 layers, 2 heads of 4 (1 kv head), MLP 16, vocabulary 10.
ModelConfig SmallModel() {
  ModelConfig m;
  m.model_type = "qwen2";
  m.hidden_size = 8;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 4;
  m.intermediate_size = 16;
  m.vocab_size = 10;
  m.max_position_embeddings = 64;
  return m;
}

TEST(ComputeCounterTest, FlopsAgainstAHandCount) {
  // Per layer q 8x8=64, k 8x4=32, v 32, o 8x8=64, MLP 3x8x16=384: 576;
  // x 2 layers + LM head 8x10 = 1232 weights.
  EXPECT_EQ(MatmulParams(SmallModel()), 1232);
  // Length 3: 2 x 1232 x 3 tokens + 4 x (2 layers x 2 heads x 4) x 6 pairs.
  EXPECT_DOUBLE_EQ(ForwardFlops(SmallModel(), 3), 7392.0 + 384.0);
  EXPECT_DOUBLE_EQ(ForwardFlops(SmallModel(), 2), 4928.0 + 192.0);

  testing::ScratchDir dir;
  absl::Status written = SmallModel().WriteJsonFile(dir / "config.json");
  ASSERT_TRUE(written.ok()) << written;
  PipelineConfig cfg;
  cfg.actor_train.present = true;
  cfg.actor_train.model_args.model_name_or_path = dir.path();
  auto counter = ComputeCounter::FromConfig(cfg);
  ASSERT_TRUE(counter.ok()) << counter.status();
  Batch b;
  b.SetTensor("attention_mask", at::tensor({1, 1, 1, 1, 1, 0}, at::kLong).view({2, 3}));
  // Old log-probs (a forward) + one epoch of forward and backward (3
  // forwards) over lengths 3 and 2.
  EXPECT_DOUBLE_EQ(counter->TrainFlops(b), 4 * (7776.0 + 5120.0));
  cfg.use_decoupled_loss = false;  // no recompute pass
  cfg.ppo_epochs = 2;
  EXPECT_DOUBLE_EQ(ComputeCounter::FromConfig(cfg)->TrainFlops(b), 6 * (7776.0 + 5120.0));
  // Generation: prompt 2 + response 2 runs 3 positions; no response, none.
  EXPECT_DOUBLE_EQ(counter->GenerationFlops({{2, 2}, {4, 0}}), 7776.0);
}

TEST(ComputeCounterTest, AMissingModelConfigIsNamed) {
  PipelineConfig cfg;
  cfg.actor_train.present = true;
  cfg.actor_train.model_args.model_name_or_path = "/nonexistent/model";
  auto counter = ComputeCounter::FromConfig(cfg);
  ASSERT_FALSE(counter.ok());
  EXPECT_THAT(std::string(counter.status().message()), HasSubstr("/nonexistent/model/config.json"));
}

// The sections every training pipeline needs, the checks' starting point.
PipelineConfig WithActors() {
  PipelineConfig cfg;
  cfg.actor_train.present = true;
  cfg.actor_infer.present = true;
  return cfg;
}

TEST(TrainPhaseTest, RolesTheAlgorithmNeedsAreCheckedForEveryPipeline) {
  PipelineConfig cfg = WithActors();
  cfg.pipeline = "keyword";
  ASSERT_TRUE(CheckTrainPhaseConfig(cfg).ok());
  cfg.actor_infer.present = false;
  EXPECT_THAT(std::string(CheckTrainPhaseConfig(cfg).message()),
              HasSubstr("the keyword pipeline needs actor_train and actor_infer sections"));
  cfg = WithActors();
  cfg.adv_estimator = AdvEstimator::kGae;
  EXPECT_THAT(std::string(CheckTrainPhaseConfig(cfg).message()), HasSubstr("'gae' needs a critic section"));
  cfg.critic.present = true;
  EXPECT_TRUE(CheckTrainPhaseConfig(cfg).ok());
  for (bool loss : {true, false}) {
    cfg = WithActors();
    (loss ? cfg.use_kl_loss : cfg.add_token_level_kl) = true;
    EXPECT_THAT(std::string(CheckTrainPhaseConfig(cfg).message()), HasSubstr("need a reference section"));
    cfg.reference.present = true;
    EXPECT_TRUE(CheckTrainPhaseConfig(cfg).ok());
  }
}

TEST(TrainPhaseTest, RewardClipBoundsBothSidesAndZeroIsOff) {
  PipelineConfig cfg;
  EXPECT_EQ(ClipReward(cfg, 7.5), 7.5);
  cfg.reward_clip = 2;
  EXPECT_EQ(ClipReward(cfg, 7.5), 2);
  EXPECT_EQ(ClipReward(cfg, -7.5), -2);
  EXPECT_EQ(ClipReward(cfg, 0.5), 0.5);
}

TEST(TrainPhaseTest, RolloutIsWithoutTheDecoupledLossIsRefused) {
  PipelineConfig cfg = WithActors();
  cfg.use_decoupled_loss = false;
  cfg.rollout_is = RolloutIs::kToken;
  absl::Status s = CheckTrainPhaseConfig(cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("use_decoupled_loss"));
  cfg.rollout_is = RolloutIs::kNone;
  EXPECT_TRUE(CheckTrainPhaseConfig(cfg).ok());
}

}  // namespace
}  // namespace roll
