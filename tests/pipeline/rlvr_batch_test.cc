// BuildTrainingBatch: the layout of the training batch and DAPO's reward
// shaping (overlong masking, the soft overlong penalty, reward clipping).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "roll/pipeline/rlvr.h"
#include "roll/pipeline/train_phase.h"
#include "roll/pipeline/validation.h"

namespace roll {
namespace {

SampleResult Sample(std::vector<int64_t> prompt, int64_t response_len, double score, const std::string& finish,
                    const std::string& tag = "math") {
  SampleResult s;
  s.prompt_ids = std::move(prompt);
  for (int64_t i = 0; i < response_len; ++i) {
    s.response_ids.push_back(10 + i);
    s.logprobs.push_back(-0.5f - static_cast<float>(i));
  }
  s.finish_reason = finish;
  s.score = score;
  s.tag = tag;
  s.weight_version = 3;
  return s;
}

PipelineConfig Config() {
  PipelineConfig c;
  c.response_length = 8;
  return c;
}

TEST(RlvrBatchTest, LayoutMasksAndGeneratorLogProbs) {
  RolloutGroup g;
  g.samples = {Sample({1, 2, 3}, 2, 1.0, "stop_token"), Sample({4}, 3, 0.0, "stop_token")};
  auto tb = BuildTrainingBatch(Config(), {g});
  ASSERT_TRUE(tb.ok()) << tb.status();
  const at::Tensor ids = *tb->batch.Tensor("input_ids");
  ASSERT_EQ(ids.sizes(), (at::IntArrayRef{2, 5}));
  EXPECT_TRUE(at::equal(ids[0], at::tensor({1, 2, 3, 10, 11}, at::kLong)));
  EXPECT_TRUE(at::equal(ids[1], at::tensor({4, 10, 11, 12, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(*tb->batch.Tensor("response_mask"),
                        at::tensor({0, 0, 0, 1, 1, 0, 1, 1, 1, 0}, at::kLong).view({2, 5})));
  EXPECT_TRUE(at::equal(*tb->batch.Tensor("attention_mask"),
                        at::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, at::kLong).view({2, 5})));
  // Column t scores token t + 1: the first response token of row 0 is at 3.
  const at::Tensor lp = *tb->batch.Tensor("infer_log_probs");
  EXPECT_FLOAT_EQ(lp[0][2].item<float>(), -0.5f);
  EXPECT_FLOAT_EQ(lp[0][3].item<float>(), -1.5f);
  EXPECT_FLOAT_EQ(lp[1][0].item<float>(), -0.5f);
  EXPECT_EQ(tb->metrics.at("train/accuracy"), 0.5);
  EXPECT_EQ(tb->metrics.at("rollout/weight_version_min"), 3);
  EXPECT_EQ(tb->metrics.at("reward/math_samples"), 2);
}

TEST(RlvrBatchTest, OverlongMaskDropsTruncatedResponsesFromTheLoss) {
  RolloutGroup g;
  g.samples = {Sample({1}, 8, 0.0, "length"), Sample({1}, 2, 1.0, "stop_token")};
  PipelineConfig c = Config();
  c.overlong_mask = true;
  auto tb = BuildTrainingBatch(c, {g});
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->batch.Tensor("response_mask")->select(0, 0).sum().item<int64_t>(), 0);
  EXPECT_EQ(tb->batch.Tensor("response_mask")->select(0, 1).sum().item<int64_t>(), 2);
  EXPECT_EQ(tb->metrics.at("train/truncated_fraction"), 0.5);
  c.overlong_mask = false;
  tb = BuildTrainingBatch(c, {g});
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->batch.Tensor("response_mask")->select(0, 0).sum().item<int64_t>(), 8);
}

TEST(RlvrBatchTest, SoftOverlongPenaltyIsLinearInTheBuffer) {
  // response_length 8, buffer 4: no penalty up to 4 tokens, then
  // (len - 4) / 4 x factor.
  PipelineConfig c = Config();
  c.overlong_buffer_len = 4;
  c.overlong_penalty_factor = 1.0;
  RolloutGroup g;
  g.samples = {Sample({1}, 4, 1.0, "stop_token"), Sample({1}, 5, 1.0, "stop_token"),
               Sample({1}, 7, 1.0, "stop_token"), Sample({1}, 8, 1.0, "length")};
  auto tb = BuildTrainingBatch(c, {g});
  ASSERT_TRUE(tb.ok());
  const at::Tensor s = *tb->batch.Tensor("scores");
  EXPECT_FLOAT_EQ(s[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(s[1].item<float>(), 0.75f);
  EXPECT_FLOAT_EQ(s[2].item<float>(), 0.25f);
  EXPECT_FLOAT_EQ(s[3].item<float>(), 0.0f);
  EXPECT_EQ(tb->metrics.at("train/reward_raw_mean"), 1.0);
  // reward_clip bounds the shaped score.
  c.reward_clip = 0.5;
  tb = BuildTrainingBatch(c, {g});
  ASSERT_TRUE(tb.ok());
  EXPECT_FLOAT_EQ((*tb->batch.Tensor("scores"))[0].item<float>(), 0.5f);
  EXPECT_FLOAT_EQ((*tb->batch.Tensor("scores"))[2].item<float>(), 0.25f);
}

TEST(RlvrBatchTest, PromptMeanWeightsMakeEveryPromptCountTheSame) {
  RolloutGroup a, b;
  a.samples = {Sample({1}, 2, 1, "stop_token"), Sample({1}, 2, 0, "stop_token")};  // 4 tokens
  b.samples = {Sample({1}, 6, 1, "stop_token"), Sample({1}, 2, 0, "stop_token")};  // 8 tokens
  auto tb = BuildTrainingBatch(Config(), {a, b});
  ASSERT_TRUE(tb.ok());
  const at::Tensor w = *tb->batch.Tensor("sample_weight");
  const at::Tensor tokens = tb->batch.Tensor("response_mask")->sum(1).to(at::kFloat);
  // Each group's weighted tokens sum to 1 / groups.
  EXPECT_NEAR((w * tokens).slice(0, 0, 2).sum().item<float>(), 0.5f, 1e-6);
  EXPECT_NEAR((w * tokens).slice(0, 2, 4).sum().item<float>(), 0.5f, 1e-6);
}

}  // namespace
}  // namespace roll
