// BuildTrainingBatch: the layout of the training batch and DAPO's reward
// shaping (overlong masking, the soft overlong penalty, reward clipping);
// ScaleRL's zero-variance filtering and No-Positive-Resampling.

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

TEST(RlvrBatchTest, ZeroVarianceGroupsGetNoLossButKeepTheirRows) {
  RolloutGroup mixed, solved, failed;
  mixed.samples = {Sample({1}, 2, 1.0, "stop_token"), Sample({1}, 2, 0.0, "stop_token")};
  solved.samples = {Sample({2}, 2, 1.0, "stop_token"), Sample({2}, 3, 1.0, "stop_token")};
  failed.samples = {Sample({3}, 1, 0.0, "stop_token"), Sample({3}, 2, 0.0, "stop_token")};
  PipelineConfig cfg = Config();
  cfg.filter_zero_variance_groups = true;
  auto tb = BuildTrainingBatch(cfg, {mixed, solved, failed});
  ASSERT_TRUE(tb.ok()) << tb.status();
  const at::Tensor resp = *tb->batch.Tensor("response_mask");
  ASSERT_EQ(resp.size(0), 6) << "the batch keeps its size";
  EXPECT_EQ(resp[0].sum().item<int64_t>(), 2);
  EXPECT_EQ(resp[1].sum().item<int64_t>(), 2);
  for (int64_t i = 2; i < 6; ++i) EXPECT_EQ(resp[i].sum().item<int64_t>(), 0) << "row " << i;
  const at::Tensor w = *tb->batch.Tensor("sample_weight");
  for (int64_t i = 2; i < 6; ++i) EXPECT_EQ(w[i].item<float>(), 0.0f) << "row " << i;
  EXPECT_DOUBLE_EQ(tb->metrics.at("train/zero_variance_filtered"), 2.0 / 3.0);
  // Off: every response token has loss.
  auto plain = BuildTrainingBatch(Config(), {mixed, solved, failed});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain->batch.Tensor("response_mask")).sum().item<int64_t>(), 12);
  EXPECT_FALSE(plain->metrics.count("train/zero_variance_filtered"));
}

// PODS's rule against subsets worked out by hand (population variance).
TEST(MaxVarianceSubsetTest, KeepsTheHighestAndLowestScoresWhoseVarianceIsLargest) {
  // Binary rewards, 2 correct of 8, m = 4: both correct and two wrong
  // (variance 0.25) beat one correct and three wrong (0.1875).
  EXPECT_EQ(MaxVarianceSubset({0, 1, 0, 0, 1, 0, 0, 0}, 4), (std::vector<size_t>{0, 1, 2, 4}));
  // 6 correct of 8, m = 4: every subset of two wrong and two correct has
  // variance 0.25; the k = 0 one wins the tie: the four lowest in sorted
  // order, both wrong (2, 5) and the two earliest correct (0, 1).
  EXPECT_EQ(MaxVarianceSubset({1, 1, 0, 1, 1, 0, 1, 1}, 4), (std::vector<size_t>{0, 1, 2, 5}));
  // Graded scores 0, 0.2, 0.5, 0.9, 1.0, m = 3: {0, 0.9, 1.0} has variance
  // 0.2022, above {0, 0.2, 1.0} (0.1867) and {0, 0.2, 0.5} or {0.5, 0.9, 1.0}.
  EXPECT_EQ(MaxVarianceSubset({0.5f, 1.0f, 0.0f, 0.9f, 0.2f}, 3), (std::vector<size_t>{1, 2, 3}));
  // All alike: no subset varies; the lowest k = 0 subset, earliest indices.
  EXPECT_EQ(MaxVarianceSubset({1, 1, 1, 1}, 2), (std::vector<size_t>{0, 1}));
  // m at least the group: every index.
  EXPECT_EQ(MaxVarianceSubset({0, 1}, 2), (std::vector<size_t>{0, 1}));
}

TEST(RlvrBatchTest, DownSamplingTrainsEachGroupsMaxVarianceSubsetAndCountsEverySample) {
  RolloutGroup a, b;
  // Group a: one correct of four (response lengths tell the rows apart).
  a.samples = {Sample({1}, 1, 0.0, "stop_token"), Sample({1}, 2, 0.0, "stop_token"),
               Sample({1}, 3, 1.0, "stop_token"), Sample({1}, 4, 0.0, "stop_token")};
  // Group b: three correct of four.
  b.samples = {Sample({2}, 5, 1.0, "stop_token"), Sample({2}, 6, 0.0, "stop_token"),
               Sample({2}, 7, 1.0, "stop_token"), Sample({2}, 8, 1.0, "stop_token")};
  PipelineConfig cfg = Config();
  cfg.downsample_samples_per_group = 2;
  auto tb = BuildTrainingBatch(cfg, {a, b});
  ASSERT_TRUE(tb.ok()) << tb.status();
  const at::Tensor resp = *tb->batch.Tensor("response_mask");
  ASSERT_EQ(resp.size(0), 4) << "two rows of each group";
  // Kept: a's first wrong one and its correct one; b's first correct one and
  // its wrong one.
  const std::vector<int64_t> lengths = {1, 3, 5, 6};
  const std::vector<float> scores = {0, 1, 1, 0};
  const std::vector<int64_t> groups = {0, 0, 1, 1};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resp[i].sum().item<int64_t>(), lengths[i]) << "row " << i;
    EXPECT_EQ((*tb->batch.Tensor("scores"))[i].item<float>(), scores[i]) << "row " << i;
    EXPECT_EQ((*tb->batch.Tensor("group_index"))[i].item<int64_t>(), groups[i]) << "row " << i;
  }
  EXPECT_DOUBLE_EQ(tb->metrics.at("train/trained_samples"), 4.0);
  // The rollout's metrics cover all eight samples generated.
  EXPECT_DOUBLE_EQ(tb->metrics.at("train/accuracy"), 4.0 / 8.0);
  EXPECT_DOUBLE_EQ(tb->metrics.at("train/response_tokens"), 36.0);
}

TEST(RlvrBatchTest, TokensInjectedByLengthInterruptionGetNoLoss) {
  RolloutGroup g;
  g.samples = {Sample({1, 2}, 5, 1.0, "stop_token")};
  g.samples[0].forced = {0, 1, 1, 0, 0};
  PipelineConfig cfg = Config();
  cfg.interrupt_min_tokens = 1;
  auto tb = BuildTrainingBatch(cfg, {g});
  ASSERT_TRUE(tb.ok()) << tb.status();
  EXPECT_TRUE(at::equal(*tb->batch.Tensor("response_mask"), at::tensor({0, 0, 1, 0, 0, 1, 1}, at::kLong).view({1, 7})));
  EXPECT_EQ(tb->metrics.at("train/interrupted_fraction"), 1.0);
}

// Prompts a, b, c, d in a fixed order, endlessly.
class ListIterator : public PromptIterator {
 public:
  absl::StatusOr<PromptItem> Next() override {
    PromptItem p;
    p.id = std::string(1, static_cast<char>('a' + (i_++ % 4)));
    return p;
  }
  std::string PositionJson() const override { return std::to_string(i_); }
  absl::Status RestorePositionJson(const std::string&) override { return absl::OkStatus(); }

 private:
  int64_t i_ = 0;
};

TEST(PositiveResamplingTest, APromptRetiresAtItsPassRateAndIsSkippedAfter) {
  PositiveResampling npr(0.9);
  npr.Observe("a", 8, 8);  // 1.0
  npr.Observe("b", 7, 8);  // 0.875: stays
  EXPECT_TRUE(npr.Retired("a"));
  EXPECT_FALSE(npr.Retired("b"));
  npr.Observe("b", 8, 8);  // 15 / 16 = 0.9375 over its history
  EXPECT_TRUE(npr.Retired("b"));
  npr.Observe("c", 1, 8);
  EXPECT_EQ(npr.retired(), 2);
  ListIterator it;
  std::vector<std::string> drawn;
  for (int i = 0; i < 4; ++i) drawn.push_back(npr.Next(&it, 5)->id);
  EXPECT_EQ(drawn, (std::vector<std::string>{"c", "d", "c", "d"}));
  // The state survives a checkpoint: the history, and the retired set it implies.
  PositiveResampling restored(0.9);
  ASSERT_TRUE(restored.RestoreJson(npr.StateJson()).ok());
  EXPECT_TRUE(restored.Retired("a") && restored.Retired("b"));
  EXPECT_FALSE(restored.Retired("c"));
  restored.Observe("c", 8, 8);  // 9 / 16: history counts, not just this step
  EXPECT_FALSE(restored.Retired("c"));
}

TEST(PositiveResamplingTest, EveryPromptRetiredIsAClearError) {
  PositiveResampling npr(0.5);
  for (const char* id : {"a", "b", "c", "d"}) npr.Observe(id, 1, 1);
  ListIterator it;
  auto p = npr.Next(&it, 5);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("positive_pass_rate"), std::string::npos) << p.status();
  EXPECT_FALSE(npr.RestoreJson(R"({"history": {"a": [3, 2]}})").ok()) << "3 correct of 2";
}

}  // namespace
}  // namespace roll
