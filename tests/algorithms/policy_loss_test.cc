#include "roll/algorithms/policy_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace roll {
namespace {

at::Tensor Row(std::vector<float> v) { return torch::tensor(v).unsqueeze(0); }

// Loss value and d loss / d log_prob for one token whose ratio to the old
// policy is `ratio` and whose advantage is `adv`.
struct TokenResult {
  float loss = 0, grad = 0, clipped = 0;
};
TokenResult OneToken(const PolicyLossOptions& o, float ratio, float adv) {
  at::Tensor logp = torch::tensor({std::log(ratio)}).unsqueeze(0).requires_grad_(true);
  at::Tensor old = torch::zeros({1, 1});
  auto out = PolicyLoss(logp, old, torch::tensor({adv}).unsqueeze(0), torch::ones({1, 1}), o);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  out->per_token.sum().backward();
  return {out->per_token.item<float>(), logp.grad().item<float>(), out->clipped.item<float>()};
}

PolicyLossOptions Variant(PgVariant v) {
  PolicyLossOptions o;
  o.variant = v;
  return o;
}

TEST(PolicyLossTest, PpoClipMatchesTheSurrogateByHand) {
  const PolicyLossOptions o = Variant(PgVariant::kPpo);
  // Ratio 1.5, A = +1: clipped at 1.2, value -1.2, no gradient.
  TokenResult t = OneToken(o, 1.5f, 1.0f);
  EXPECT_NEAR(t.loss, -1.2f, 1e-5);
  EXPECT_EQ(t.grad, 0.0f);
  EXPECT_EQ(t.clipped, 1.0f);
  // Ratio 0.5, A = +1: unclipped, value -0.5, d/dlogp = -A * ratio.
  t = OneToken(o, 0.5f, 1.0f);
  EXPECT_NEAR(t.loss, -0.5f, 1e-5);
  EXPECT_NEAR(t.grad, -0.5f, 1e-5);
  EXPECT_EQ(t.clipped, 0.0f);
  // Ratio 0.5, A = -1: clipped at 0.8.
  t = OneToken(o, 0.5f, -1.0f);
  EXPECT_NEAR(t.loss, 0.8f, 1e-5);
  EXPECT_EQ(t.grad, 0.0f);
  // Ratio 1.5, A = -1: the pessimistic unclipped term.
  t = OneToken(o, 1.5f, -1.0f);
  EXPECT_NEAR(t.loss, 1.5f, 1e-5);
  EXPECT_NEAR(t.grad, 1.5f, 1e-5);
}

TEST(PolicyLossTest, ClipHigherWidensOnlyTheUpperBound) {
  PolicyLossOptions o = Variant(PgVariant::kPpo);
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  TokenResult t = OneToken(o, 1.25f, 1.0f);
  EXPECT_NEAR(t.loss, -1.25f, 1e-5);
  EXPECT_NEAR(t.grad, -1.25f, 1e-5);
  t = OneToken(o, 1.5f, 1.0f);
  EXPECT_NEAR(t.loss, -1.28f, 1e-5);
  EXPECT_EQ(t.grad, 0.0f);
  t = OneToken(o, 0.7f, -1.0f);
  EXPECT_NEAR(t.loss, 0.8f, 1e-5);
  EXPECT_EQ(t.grad, 0.0f);
}

TEST(PolicyLossTest, DualClipBoundsTheLossOfNegativeAdvantages) {
  PolicyLossOptions o = Variant(PgVariant::kPpo);
  o.dual_clip = true;
  o.dual_clip_c = 3.0;
  TokenResult t = OneToken(o, 4.0f, -1.0f);
  EXPECT_NEAR(t.loss, 3.0f, 1e-5);
  EXPECT_EQ(t.grad, 0.0f);
  EXPECT_EQ(t.clipped, 1.0f);
  // Below c the dual clip is inactive.
  t = OneToken(o, 2.0f, -1.0f);
  EXPECT_NEAR(t.loss, 2.0f, 1e-5);
  EXPECT_NEAR(t.grad, 2.0f, 1e-5);
  // Positive advantages are never dual-clipped.
  t = OneToken(o, 4.0f, 1.0f);
  EXPECT_NEAR(t.loss, -1.2f, 1e-5);
  o.dual_clip_c = 1.0;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(PolicyLossTest, UpKeepsTheGradientWherePpoClipsItAway) {
  // Ratio above 1 + eps with a positive advantage: PPO's gradient is zero,
  // UP's value is the advantage and its gradient A * grad log p.
  const TokenResult ppo = OneToken(Variant(PgVariant::kPpo), 1.5f, 2.0f);
  const TokenResult up = OneToken(Variant(PgVariant::kUp), 1.5f, 2.0f);
  EXPECT_EQ(ppo.grad, 0.0f);
  EXPECT_NEAR(up.loss, -2.0f, 1e-5);
  EXPECT_NEAR(up.grad, -2.0f, 1e-5);
  EXPECT_EQ(up.clipped, 0.0f);
  // The same holds below the ratio bound: the positive term is unbounded.
  EXPECT_NEAR(OneToken(Variant(PgVariant::kUp), 0.5f, 2.0f).grad, -2.0f, 1e-5);
  // Negative advantages keep PPO's clipped term.
  for (float r : {0.5f, 1.5f}) {
    const TokenResult a = OneToken(Variant(PgVariant::kPpo), r, -1.0f);
    const TokenResult b = OneToken(Variant(PgVariant::kUp), r, -1.0f);
    EXPECT_NEAR(a.loss, b.loss, 1e-6) << r;
    EXPECT_NEAR(a.grad, b.grad, 1e-6) << r;
  }
}

TEST(PolicyLossTest, GspoUsesTheLengthNormalizedSequenceRatio) {
  // Token ratios 1.2 and 0.9 (a masked third token is ignored): s = sqrt(1.08).
  at::Tensor logp = Row({std::log(1.2f), std::log(0.9f), 5.0f}).requires_grad_(true);
  at::Tensor old = torch::zeros({1, 3});
  at::Tensor mask = Row({1, 1, 0});
  auto out = PolicyLoss(logp, old, Row({1, 1, 1}), mask, Variant(PgVariant::kGspo));
  ASSERT_TRUE(out.ok()) << out.status();
  const float s = std::sqrt(1.08f);
  EXPECT_NEAR(out->ratio[0][0].item<float>(), s, 1e-5);
  EXPECT_NEAR(out->per_token[0][0].item<float>(), -s, 1e-5);
  EXPECT_NEAR(out->per_token[0][1].item<float>(), -s, 1e-5);
  EXPECT_EQ(out->per_token[0][2].item<float>(), 0.0f);
  out->per_token.sum().backward();
  // Each token carries the sequence ratio and its own gradient.
  EXPECT_NEAR(logp.grad()[0][0].item<float>(), -s, 1e-5);
  EXPECT_NEAR(logp.grad()[0][1].item<float>(), -s, 1e-5);
  EXPECT_EQ(logp.grad()[0][2].item<float>(), 0.0f);

  // Both tokens at 1.5: the sequence ratio is clipped as a whole.
  at::Tensor hi = Row({std::log(1.5f), std::log(1.5f)}).requires_grad_(true);
  out = PolicyLoss(hi, torch::zeros({1, 2}), Row({1, 1}), Row({1, 1}), Variant(PgVariant::kGspo));
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->per_token[0][0].item<float>(), -1.2f, 1e-5);
  out->per_token.sum().backward();
  EXPECT_EQ(hi.grad().abs().sum().item<float>(), 0.0f);

  // UP at sequence level keeps that gradient for the positive advantage.
  at::Tensor hi2 = Row({std::log(1.5f), std::log(1.5f)}).requires_grad_(true);
  out = PolicyLoss(hi2, torch::zeros({1, 2}), Row({1, 1}), Row({1, 1}), Variant(PgVariant::kUpSeq));
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->per_token[0][0].item<float>(), -1.0f, 1e-5);
  out->per_token.sum().backward();
  EXPECT_NEAR(hi2.grad()[0][0].item<float>(), -1.0f, 1e-5);
}

TEST(PolicyLossTest, CispoClipsTheDetachedWeightAndKeepsTheGradient) {
  PolicyLossOptions o = Variant(PgVariant::kCispo);
  // Ratio 1.5, A = +1: weight clipped to 1.2; loss -1.2 * log p; gradient
  // -1.2 (PPO's would be 0).
  TokenResult t = OneToken(o, 1.5f, 1.0f);
  EXPECT_NEAR(t.loss, -1.2f * std::log(1.5f), 1e-5);
  EXPECT_NEAR(t.grad, -1.2f, 1e-5);
  EXPECT_EQ(t.clipped, 1.0f);
  // Ratio 0.5, A = -1: weight 0.8 from below.
  t = OneToken(o, 0.5f, -1.0f);
  EXPECT_NEAR(t.grad, 0.8f, 1e-5);
  // Inside the bounds the weight is the ratio itself.
  t = OneToken(o, 1.1f, 1.0f);
  EXPECT_NEAR(t.grad, -1.1f, 1e-5);
  EXPECT_EQ(t.clipped, 0.0f);
}

TEST(PolicyLossTest, MaskedTokensHaveNoLossAndBadShapesAreErrors) {
  at::Tensor logp = Row({0.3f, 0.3f}).requires_grad_(true);
  auto out = PolicyLoss(logp, torch::zeros({1, 2}), Row({1, 1}), Row({1, 0}), Variant(PgVariant::kPpo));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->per_token[0][1].item<float>(), 0.0f);
  EXPECT_FALSE(PolicyLoss(logp, torch::zeros({1, 3}), Row({1, 1}), Row({1, 0}), Variant(PgVariant::kPpo)).ok());
}

TEST(RolloutImportanceTest, TruncatedWeightsAgainstTheGeneratorByHand) {
  // Two rows of three tokens; the last token of row 0 is masked.
  at::Tensor old = torch::tensor({{-1.0f, -0.5f, -2.0f}, {-0.2f, -0.3f, -0.4f}});
  at::Tensor infer = torch::tensor({{-1.5f, -0.1f, -9.0f}, {-1.0f, -0.3f, -0.1f}});
  at::Tensor mask = torch::tensor({{1.0f, 1.0f, 0.0f}, {1.0f, 1.0f, 1.0f}});
  auto tok = RolloutImportanceWeights(old, infer, mask, RolloutIs::kToken, 2.0);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // exp(0.5) = 1.6487, exp(-0.4) = 0.6703, masked 1; exp(0.8) = 2.2255 -> 2,
  // exp(0) = 1, exp(-0.3) = 0.7408.
  const std::vector<float> want = {std::exp(0.5f), std::exp(-0.4f), 1.0f, 2.0f, 1.0f, std::exp(-0.3f)};
  const std::vector<float> want_cut = {0, 0, 0, 1, 0, 0};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(tok->weights.view(-1)[i].item<float>(), want[i], 1e-6) << "token " << i;
    EXPECT_EQ(tok->truncated.view(-1)[i].item<float>(), want_cut[i]) << "token " << i;
  }
  // Sequence level: row 0 sums 0.5 - 0.4 = 0.1 over its masked tokens (the
  // masked token's -7 log-ratio does not count); row 1 sums 0.8 + 0 - 0.3 =
  // 0.5: exp(0.5) = 1.6487, under the cap of 2.
  auto seq = RolloutImportanceWeights(old, infer, mask, RolloutIs::kSequence, 2.0);
  ASSERT_TRUE(seq.ok()) << seq.status();
  const std::vector<float> want_seq = {std::exp(0.1f), std::exp(0.1f), 1.0f,
                                       std::exp(0.5f), std::exp(0.5f), std::exp(0.5f)};
  for (int64_t i = 0; i < 6; ++i) EXPECT_NEAR(seq->weights.view(-1)[i].item<float>(), want_seq[i], 1e-6) << i;
  auto low = RolloutImportanceWeights(old, infer, mask, RolloutIs::kSequence, 1.2);
  ASSERT_TRUE(low.ok());
  EXPECT_NEAR(low->weights[1][0].item<float>(), 1.2f, 1e-6);
  EXPECT_EQ(low->truncated[1].sum().item<float>(), 3.0f);
  EXPECT_EQ(low->truncated[0].sum().item<float>(), 0.0f) << "exp(0.1) is under 1.2";
  // A sequence whose summed log-ratio would overflow exp is capped, not inf.
  auto big = RolloutImportanceWeights(torch::zeros({1, 200}), torch::full({1, 200}, -5.0f), torch::ones({1, 200}),
                                      RolloutIs::kSequence, 2.0);
  ASSERT_TRUE(big.ok());
  EXPECT_NEAR(big->weights.max().item<float>(), 2.0f, 1e-6);
  EXPECT_FALSE(RolloutImportanceWeights(old, infer, mask, RolloutIs::kNone, 2.0).ok());
  EXPECT_FALSE(RolloutImportanceWeights(old, infer, mask, RolloutIs::kToken, 0.0).ok());
  auto shape = RolloutImportanceWeights(old, torch::zeros({2, 2}), mask, RolloutIs::kToken, 2.0);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("[2, 2]"), std::string::npos) << shape.status();
}

TEST(KlTest, EstimatorsMatchTheirDefinitions) {
  at::Tensor logp = torch::tensor({-1.0f});
  at::Tensor ref = torch::tensor({-1.5f});
  // d = log p - log ref = 0.5.
  EXPECT_NEAR(KlEstimate(logp, ref, KlPenalty::kK1).item<float>(), 0.5f, 1e-6);
  EXPECT_NEAR(KlEstimate(logp, ref, KlPenalty::kK2).item<float>(), 0.125f, 1e-6);
  EXPECT_NEAR(KlEstimate(logp, ref, KlPenalty::kK3).item<float>(), std::exp(-0.5f) + 0.5f - 1, 1e-6);
  EXPECT_NEAR(KlEstimate(ref, logp, KlPenalty::kAbs).item<float>(), 0.5f, 1e-6);
  EXPECT_NEAR(KlEstimate(logp, ref, KlPenalty::kK3).item<float>(), std::exp(-0.5f) - 0.5f, 1e-6);
  // k3 is never negative and is 0 where the policies agree.
  at::Tensor d = torch::linspace(-3, 3, 13);
  EXPECT_GE(KlEstimate(d, torch::zeros({13}), KlPenalty::kK3).min().item<float>(), 0.0f);
  EXPECT_EQ(KlEstimate(logp, logp, KlPenalty::kK3).item<float>(), 0.0f);
}

TEST(ValueLossTest, ClippingTakesThePessimisticTerm) {
  at::Tensor v = torch::tensor({1.0f}), old = torch::tensor({0.5f}), ret = torch::tensor({2.0f});
  // Unclipped (1 - 2)^2 = 1; clipped V = 0.7, (0.7 - 2)^2 = 1.69.
  EXPECT_NEAR(ValueLoss(v, old, ret, 0.2).item<float>(), 0.845f, 1e-5);
  EXPECT_NEAR(ValueLoss(v, old, ret, 0.0).item<float>(), 0.5f, 1e-6);
  // Moving towards the target beyond the clip does not lower the loss.
  at::Tensor v2 = torch::tensor({1.9f});
  EXPECT_NEAR(ValueLoss(v2, old, ret, 0.2).item<float>(), 0.845f, 1e-5);
}

TEST(AggregationTest, ModesMatchTheirDefinitions) {
  at::Tensor per_token = torch::tensor({1.f, 2.f, 3.f, 4.f, 0.f, 0.f}).view({2, 3});
  at::Tensor mask = torch::tensor({1.f, 1.f, 1.f, 1.f, 0.f, 0.f}).view({2, 3});
  AggregationScale s{/*global_tokens=*/4, /*global_sequences=*/2, /*max_response_length=*/3};
  EXPECT_NEAR(AggregateLoss(per_token, mask, LossAggMode::kTokenMean, s)->item<float>(), 2.5f, 1e-6);
  EXPECT_NEAR(AggregateLoss(per_token, mask, LossAggMode::kSeqMeanTokenMean, s)->item<float>(), 3.0f, 1e-6);
  EXPECT_NEAR(AggregateLoss(per_token, mask, LossAggMode::kSeqMeanTokenSum, s)->item<float>(), 5.0f, 1e-6);
  EXPECT_NEAR(AggregateLoss(per_token, mask, LossAggMode::kSeqMeanTokenSumNorm, s)->item<float>(), 10.f / 6, 1e-6);
  // prompt-mean: both samples in one group of 4 tokens, one group.
  at::Tensor w = torch::full({2}, 0.25f);
  EXPECT_NEAR(AggregateLoss(per_token, mask, LossAggMode::kPromptMean, s, w)->item<float>(), 2.5f, 1e-6);
  EXPECT_FALSE(AggregateLoss(per_token, mask, LossAggMode::kPromptMean, s).ok()) << "needs weights";
}

TEST(AggregationTest, SharesOfMicroBatchesSumToTheWholeBatch) {
  // The per-rank/micro-batch shares, normalized by step-wide counts, must
  // add up to the loss of the whole batch in every mode.
  torch::manual_seed(3);
  at::Tensor per_token = torch::randn({6, 5});
  at::Tensor mask = (torch::rand({6, 5}) > 0.3).to(at::kFloat);
  mask.select(1, 0).fill_(1);
  at::Tensor w = torch::rand({6});
  AggregationScale s;
  s.global_tokens = static_cast<int64_t>(mask.sum().item<float>());
  s.global_sequences = 6;
  s.max_response_length = 5;
  for (LossAggMode mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean, LossAggMode::kSeqMeanTokenSum,
                           LossAggMode::kSeqMeanTokenSumNorm, LossAggMode::kPromptMean}) {
    const float whole = AggregateLoss(per_token, mask, mode, s, w)->item<float>();
    float parts = 0;
    for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 1}, {1, 4}, {4, 6}}) {
      parts += AggregateLoss(per_token.slice(0, lo, hi), mask.slice(0, lo, hi), mode, s, w.slice(0, lo, hi))
                   ->item<float>();
    }
    EXPECT_NEAR(parts, whole, 1e-5) << ToString(mode);
  }
}


}  // namespace
}  // namespace roll
