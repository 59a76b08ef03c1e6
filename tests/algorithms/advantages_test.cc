#include "roll/algorithms/advantages.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace roll {
namespace {

at::Tensor F(std::vector<float> v) { return torch::tensor(v); }
at::Tensor F2(std::vector<std::vector<float>> rows) {
  std::vector<at::Tensor> ts;
  for (auto& r : rows) ts.push_back(torch::tensor(r));
  return torch::stack(ts);
}
at::Tensor I(std::vector<int64_t> v) { return torch::tensor(v, torch::kLong); }

void ExpectNear(const at::Tensor& got, std::vector<float> want, double tol = 1e-5) {
  at::Tensor g = got.flatten().to(at::kFloat).contiguous();
  ASSERT_EQ(g.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(g[static_cast<int64_t>(i)].item<float>(), want[i], tol) << "index " << i;
  }
}

// Two groups of four samples: group 0 has rewards {1,0,0,1}, group 1 {1,1,1,0}.
const std::vector<float> kScores = {1, 0, 0, 1, 1, 1, 1, 0};
const std::vector<int64_t> kGroups = {0, 0, 0, 0, 1, 1, 1, 1};

TEST(AdvantagesTest, GrpoDividesByTheUnbiasedGroupStd) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kGrpo;
  o.eps = 0;
  auto a = OutcomeAdvantages(o, F(kScores), I(kGroups));
  ASSERT_TRUE(a.ok()) << a.status();
  // Group 0: mean 0.5, std sqrt(1/3); group 1: mean 0.75, std 0.5.
  const float g0 = 0.5f / std::sqrt(1.0f / 3.0f);
  ExpectNear(*a, {g0, -g0, -g0, g0, 0.5f, 0.5f, 0.5f, -1.5f});
}

TEST(AdvantagesTest, DrGrpoOnlySubtractsTheGroupMean) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kDrGrpo;
  auto a = OutcomeAdvantages(o, F(kScores), I(kGroups));
  ASSERT_TRUE(a.ok());
  ExpectNear(*a, {0.5f, -0.5f, -0.5f, 0.5f, 0.25f, 0.25f, 0.25f, -0.75f});
}

TEST(AdvantagesTest, RlooSubtractsTheMeanOfTheOtherSamples) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kRloo;
  auto a = OutcomeAdvantages(o, F(kScores), I(kGroups));
  ASSERT_TRUE(a.ok());
  // Sample 0: 1 - mean(0, 0, 1) = 2/3; sample 7: 0 - mean(1, 1, 1) = -1.
  ExpectNear(*a, {2.f / 3, -2.f / 3, -2.f / 3, 2.f / 3, 1.f / 3, 1.f / 3, 1.f / 3, -1.f});
  // A group of one has no baseline: advantage 0.
  auto single = OutcomeAdvantages(o, F({1, 0.5f}), I({0, 1}));
  ASSERT_TRUE(single.ok());
  ExpectNear(*single, {0, 0});
}

TEST(AdvantagesTest, BatchNormalizationUsesTheWholeBatch) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kGrpo;
  o.norm_mean_type = NormType::kBatch;
  o.norm_std_type = NormType::kBatch;
  o.eps = 0;
  auto a = OutcomeAdvantages(o, F(kScores), I(kGroups));
  ASSERT_TRUE(a.ok());
  // Mean 5/8; unbiased variance (5 * 0.375^2 + 3 * 0.625^2) / 7.
  const float sd = std::sqrt((5 * 0.375f * 0.375f + 3 * 0.625f * 0.625f) / 7);
  const float hi = 0.375f / sd, lo = -0.625f / sd;
  ExpectNear(*a, {hi, lo, lo, hi, hi, hi, hi, lo});
  // No baseline and no scale: the raw scores.
  o.norm_mean_type = NormType::kNone;
  o.norm_std_type = NormType::kNone;
  auto raw = OutcomeAdvantages(o, F(kScores), I(kGroups));
  ASSERT_TRUE(raw.ok());
  ExpectNear(*raw, kScores);
}

TEST(AdvantagesTest, GaeMatchesTheHandComputedRecursion) {
  at::Tensor adv, ret;
  // One row, rewards only at the end; values 0.5, 0.6, 0.7; padding after.
  at::Tensor rewards = F2({{0, 0, 1, 0}});
  at::Tensor values = F2({{0.5f, 0.6f, 0.7f, 9}});
  at::Tensor mask = F2({{1, 1, 1, 0}});
  Gae(rewards, values, mask, /*gamma=*/1.0, /*lambd=*/0.95, &adv, &ret);
  // delta = (0.1, 0.1, 0.3); A2 = 0.3, A1 = 0.1 + 0.95 * 0.3, A0 = 0.1 + 0.95 * A1.
  ExpectNear(adv, {0.46575f, 0.385f, 0.3f, 0});
  ExpectNear(ret, {0.96575f, 0.985f, 1.0f, 0});
  Gae(rewards, values, mask, /*gamma=*/0.9, /*lambd=*/0.8, &adv, &ret);
  // delta = (0.04, 0.03, 0.3); gamma * lambda = 0.72.
  ExpectNear(adv, {0.04f + 0.72f * 0.246f, 0.246f, 0.3f, 0});
}

TEST(AdvantagesTest, GaeSkipsMaskedPositionsInsideARow) {
  at::Tensor adv, ret;
  // A masked hole between tokens must not break the recursion.
  at::Tensor rewards = F2({{0, 5, 0, 1}});
  at::Tensor values = F2({{0.5f, 7, 0.6f, 0.7f}});
  at::Tensor mask = F2({{1, 0, 1, 1}});
  Gae(rewards, values, mask, 1.0, 0.95, &adv, &ret);
  ExpectNear(adv, {0.46575f, 0, 0.385f, 0.3f});
}

TEST(AdvantagesTest, ComputeAdvantagesPutsTheScoreOnTheLastResponseToken) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kGae;
  o.gamma = 1.0;
  o.lambd = 0.95;
  AdvantageInputs in;
  in.scores = F({1});
  in.mask = F2({{1, 1, 1, 0}});
  in.values = F2({{0.5f, 0.6f, 0.7f, 9}});
  auto out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectNear(out->token_rewards, {0, 0, 1, 0});
  ExpectNear(out->advantages, {0.46575f, 0.385f, 0.3f, 0});
  ExpectNear(out->returns, {0.96575f, 0.985f, 1.0f, 0});
  in.values = at::Tensor();
  EXPECT_FALSE(ComputeAdvantages(o, in).ok()) << "gae without values";
}

TEST(AdvantagesTest, ReinforcePlusPlusWhitensDiscountedReturnsOverTheBatch) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kReinforcePlusPlus;
  o.gamma = 1.0;
  o.eps = 0;
  AdvantageInputs in;
  in.scores = F({1, 0});
  in.mask = F2({{1, 1}, {1, 0}});
  auto out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  // Returns-to-go {1, 1} and {0}: mean 2/3, unbiased std sqrt(1/3).
  const float sd = std::sqrt(1.0f / 3);
  ExpectNear(out->returns, {1, 1, 0, 0});
  ExpectNear(out->advantages, {(1 - 2.f / 3) / sd, (1 - 2.f / 3) / sd, -(2.f / 3) / sd, 0});
  o.gamma = 0.5;
  out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok());
  ExpectNear(out->returns, {0.5f, 1, 0, 0});
}

TEST(AdvantagesTest, KlInTheRewardLowersTheScoreBeforeTheBaseline) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kDrGrpo;
  AdvantageInputs in;
  in.scores = F({1, 1});
  in.group_index = I({0, 0});
  in.mask = F2({{1, 1}, {1, 1}});
  in.token_kl = F2({{0.5f, 0.5f}, {0, 0}});
  in.kl_coef = 0.1;
  auto out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  // Effective scores 0.9 and 1.0; mean 0.95.
  ExpectNear(out->advantages, {-0.05f, -0.05f, 0.05f, 0.05f});
  ExpectNear(out->token_rewards, {-0.05f, 0.95f, 0, 1});
}

TEST(AdvantagesTest, ClipAndWhitenApplyAfterTheEstimator) {
  AdvantageOptions o;
  o.estimator = AdvEstimator::kGrpo;
  o.advantage_clip = 0.6;
  AdvantageInputs in;
  in.scores = F(kScores);
  in.group_index = I(kGroups);
  in.mask = at::ones({8, 2});
  in.mask.index_put_({0, 1}, 0);
  auto out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok());
  EXPECT_LE(out->advantages.abs().max().item<float>(), 0.6f + 1e-6f);
  EXPECT_NEAR(out->advantages[7][0].item<float>(), -0.6f, 1e-6);
  EXPECT_EQ(out->advantages[0][1].item<float>(), 0.0f) << "masked token";
  o.advantage_clip = 0;
  o.whiten_advantages = true;
  out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok());
  at::Tensor m = in.mask > 0;
  at::Tensor vals = out->advantages.masked_select(m);
  EXPECT_NEAR(vals.mean().item<float>(), 0.0f, 1e-5);
  EXPECT_NEAR(vals.std().item<float>(), 1.0f, 1e-4);
}

TEST(AdvantagesTest, StepLevelScoresNormalizeOverTheTurnsOfAGroup) {
  // Group 0: row 0 has turns 0 (two tokens, return 1.5) and 1 (return 1.0),
  // row 1 one turn (return -1); group 1: row 2 one turn alone.
  AdvantageOptions o;
  o.estimator = AdvEstimator::kDrGrpo;
  AdvantageInputs in;
  in.scores = F({0, 0, 0});
  in.group_index = I({0, 0, 1});
  in.mask = F2({{1, 1, 0, 1}, {1, 1, 1, 0}, {1, 0, 0, 0}});
  in.token_turn = torch::tensor({0, 0, -1, 1, 2, 2, 2, -1, 3, -1, -1, -1}, torch::kLong).view({3, 4});
  in.turn_scores = F2({{1.5f, 1.5f, 0, 1.0f}, {-1, -1, -1, 0}, {7, 0, 0, 0}});
  auto out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  // Turn scores {1.5, 1, -1} have mean 0.5; a group of one turn gets 0.
  ExpectNear(out->advantages, {1.0f, 1.0f, 0, 0.5f, -1.5f, -1.5f, -1.5f, 0, 0, 0, 0, 0});
  // grpo divides by their unbiased std, sqrt(1.75).
  o.estimator = AdvEstimator::kGrpo;
  out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  const float s = std::sqrt(1.75f);
  ExpectNear(out->advantages, {1 / s, 1 / s, 0, 0.5f / s, -1.5f / s, -1.5f / s, -1.5f / s, 0, 0, 0, 0, 0}, 1e-4);
  // KL in the reward is summed per turn: 0.2, 0.1 and 0.3 off the three.
  o.estimator = AdvEstimator::kDrGrpo;
  in.token_kl = torch::full({3, 4}, 0.1f);
  in.kl_coef = 1.0;
  out = ComputeAdvantages(o, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectNear(out->advantages, {1.0f, 1.0f, 0, 0.6f, -1.6f, -1.6f, -1.6f, 0, 0, 0, 0, 0});
  o.estimator = AdvEstimator::kGae;
  EXPECT_FALSE(ComputeAdvantages(o, in).ok()) << "step-level scores need an outcome estimator";
}

TEST(AdvantagesTest, BadOptionsNameTheirKey) {
  AdvantageOptions o;
  o.lambd = 1.5;
  EXPECT_NE(o.Validate().message().find("lambd"), std::string::npos);
  o = AdvantageOptions();
  EXPECT_FALSE(OutcomeAdvantages(o, F({1, 0}), I({0})).ok()) << "mismatched shapes";
}

}  // namespace
}  // namespace roll
