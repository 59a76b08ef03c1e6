#include "strategies/sampling.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

namespace roll::strategies_internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

at::Tensor Row(const std::vector<float>& v) { return torch::tensor(v).view({1, -1}); }

at::Tensor LogProbs(const std::vector<float>& p) { return torch::tensor(p).log().view({1, -1}); }

RowSampling Params(double temperature, int64_t top_k = 0, double top_p = 1.0,
                   double uniform = 0.0) {
  RowSampling r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.uniform = uniform;
  return r;
}

std::vector<float> Processed(const at::Tensor& logits, const RowSampling& r) {
  auto out = ProcessedLogits(logits, {r});
  EXPECT_TRUE(out.ok()) << out.status();
  at::Tensor t = out->contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

// Which tokens survive truncation.
std::vector<bool> Kept(const at::Tensor& logits, const RowSampling& r) {
  std::vector<bool> kept;
  for (float v : Processed(logits, r)) kept.push_back(v != -kInf);
  return kept;
}

std::pair<int64_t, float> SampleOne(const at::Tensor& logits, const RowSampling& r) {
  auto out = SampleTokens(logits, {r});
  EXPECT_TRUE(out.ok()) << out.status();
  return {out->ids[0].item<int64_t>(), out->logprobs[0].item<float>()};
}

TEST(SamplingTest, TopKKeepsTheKLargest) {
  const at::Tensor logits = Row({1, 4, 2, 3, 0});
  EXPECT_EQ(Kept(logits, Params(1.0, 2)), (std::vector<bool>{false, true, false, true, false}));
  EXPECT_EQ(Kept(logits, Params(1.0, 1)), (std::vector<bool>{false, true, false, false, false}));
  // Off: 0, a negative k, and k >= vocab.
  for (int64_t k : {0, -1, 5, 9}) {
    EXPECT_EQ(Kept(logits, Params(1.0, k)), std::vector<bool>(5, true)) << "k=" << k;
  }
  // Survivors keep their (temperature-scaled) values.
  const std::vector<float> p = Processed(logits, Params(2.0, 2));
  EXPECT_FLOAT_EQ(p[1], 2.0f);
  EXPECT_FLOAT_EQ(p[3], 1.5f);
}

TEST(SamplingTest, TopPKeepsTheShortestPrefixReachingP) {
  // Probabilities 0.1, 0.2, 0.3, 0.4 (descending: tokens 3, 2, 1, 0).
  const at::Tensor logits = LogProbs({0.1f, 0.2f, 0.3f, 0.4f});
  // Mass before each token in descending order: 0, 0.4, 0.7, 0.9.
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 0.35)), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 0.5)), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 0.75)), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 0.95)), (std::vector<bool>{true, true, true, true}));
  // A tiny p still keeps the most likely token.
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 1e-9)), (std::vector<bool>{false, false, false, true}));
}

TEST(SamplingTest, TopPActsOnTheRenormalizedTopKSurvivors) {
  const at::Tensor logits = LogProbs({0.1f, 0.2f, 0.3f, 0.4f});
  // After top-2 the survivors weigh 4/7 and 3/7: the mass before token 2 is
  // 0.571 >= 0.5, so only token 3 is left (top-p alone at 0.5 keeps two).
  EXPECT_EQ(Kept(logits, Params(1.0, 2, 0.5)), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(Kept(logits, Params(1.0, 2, 0.6)), (std::vector<bool>{false, false, true, true}));
}

TEST(SamplingTest, TemperatureIsAppliedBeforeTopP) {
  // Logits log 0.3, log 0.7. At temperature 0.5 the probabilities become
  // 0.09/0.58 and 0.49/0.58 = 0.155, 0.845: top-p 0.8 keeps one token; at
  // temperature 1 the same top-p keeps both (mass before 0.3 is 0.7 < 0.8).
  const at::Tensor logits = LogProbs({0.3f, 0.7f});
  EXPECT_EQ(Kept(logits, Params(0.5, 0, 0.8)), (std::vector<bool>{false, true}));
  EXPECT_EQ(Kept(logits, Params(1.0, 0, 0.8)), (std::vector<bool>{true, true}));
}

TEST(SamplingTest, InverseCdfDrawAndLogProb) {
  const at::Tensor logits = LogProbs({0.1f, 0.2f, 0.3f, 0.4f});
  // Untruncated rows walk the vocabulary in order: CDF 0.1, 0.3, 0.6, 1.0.
  EXPECT_EQ(SampleOne(logits, Params(1.0, 0, 1.0, 0.05)).first, 0);
  EXPECT_EQ(SampleOne(logits, Params(1.0, 0, 1.0, 0.15)).first, 1);
  EXPECT_EQ(SampleOne(logits, Params(1.0, 0, 1.0, 0.65)).first, 3);
  auto [tok, lp] = SampleOne(logits, Params(1.0, 0, 1.0, 0.45));
  EXPECT_EQ(tok, 2);
  EXPECT_NEAR(lp, std::log(0.3), 1e-5);
  // Truncated rows walk the survivors in descending order: after top-2 the
  // CDF is 4/7, 1.
  auto [t1, lp1] = SampleOne(logits, Params(1.0, 2, 1.0, 0.5));
  EXPECT_EQ(t1, 3);
  EXPECT_NEAR(lp1, std::log(4.0 / 7.0), 1e-5);
  auto [t2, lp2] = SampleOne(logits, Params(1.0, 2, 1.0, 0.6));
  EXPECT_EQ(t2, 2);
  EXPECT_NEAR(lp2, std::log(3.0 / 7.0), 1e-5);
}

TEST(SamplingTest, GreedyTakesArgmaxWithRawLogProb) {
  const at::Tensor logits = Row({0.5f, 2.0f, -1.0f});
  auto [tok, lp] = SampleOne(logits, Params(0.0));
  EXPECT_EQ(tok, 1);
  EXPECT_NEAR(lp, torch::log_softmax(logits, 1)[0][1].item<float>(), 1e-6);
  // top-k 1 at a positive temperature also takes the argmax; its sampling
  // distribution is a point mass.
  auto [tok1, lp1] = SampleOne(logits, Params(0.7, 1, 1.0, 0.9));
  EXPECT_EQ(tok1, 1);
  EXPECT_NEAR(lp1, 0.0f, 1e-6);
}

TEST(SamplingTest, ZeroProbabilityTokensAreNeverDrawn) {
  // exp underflows to exactly 0 for the last two tokens.
  const at::Tensor logits = Row({0.0f, -1000.0f, -1000.0f});
  for (double u : {0.0, 0.5, 0.999999}) {
    auto [tok, lp] = SampleOne(logits, Params(1.0, 0, 1.0, u));
    EXPECT_EQ(tok, 0);
    EXPECT_TRUE(std::isfinite(lp));
  }
}

TEST(SamplingTest, MixedBatchMatchesRowsAlone) {
  at::Tensor logits = torch::randn({5, 50}, torch::TensorOptions().dtype(torch::kFloat));
  const std::vector<RowSampling> rows = {Params(0.0), Params(1.0, 0, 1.0, 0.3),
                                         Params(0.8, 5, 1.0, 0.7), Params(1.2, 0, 0.6, 0.2),
                                         Params(0.5, 20, 0.9, 0.99)};
  auto batch = SampleTokens(logits, rows);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int64_t i = 0; i < 5; ++i) {
    auto [tok, lp] = SampleOne(logits.narrow(0, i, 1), rows[i]);
    EXPECT_EQ(batch->ids[i].item<int64_t>(), tok) << "row " << i;
    EXPECT_NEAR(batch->logprobs[i].item<float>(), lp, 1e-5) << "row " << i;
    // The log-prob is log_softmax of the processed logits at the token.
    auto processed = ProcessedLogits(logits.narrow(0, i, 1), {rows[i]});
    ASSERT_TRUE(processed.ok());
    EXPECT_NEAR(torch::log_softmax(*processed, 1)[0][tok].item<float>(), lp, 1e-5);
  }
}

TEST(SamplingTest, SampledFrequenciesFollowTheDistribution) {
  const at::Tensor logits = LogProbs({0.1f, 0.2f, 0.3f, 0.4f}).expand({4000, 4}).contiguous();
  std::vector<RowSampling> rows;
  for (int i = 0; i < 4000; ++i) rows.push_back(Params(1.0, 0, 1.0, CounterUniform(42, i)));
  auto out = SampleTokens(logits, rows);
  ASSERT_TRUE(out.ok());
  at::Tensor counts = torch::bincount(out->ids, {}, 4).to(torch::kDouble) / 4000.0;
  const double expect[] = {0.1, 0.2, 0.3, 0.4};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(counts[k].item<double>(), expect[k], 0.03) << k;
}

TEST(SamplingTest, CounterUniformIsDeterministicAndSpread) {
  EXPECT_EQ(CounterUniform(1, 2), CounterUniform(1, 2));
  EXPECT_NE(CounterUniform(1, 2), CounterUniform(1, 3));
  EXPECT_NE(CounterUniform(1, 2), CounterUniform(2, 2));
  EXPECT_NE(MixSeed(1, 0), MixSeed(1, 1));
  double sum = 0;
  std::set<double> distinct;
  for (int i = 0; i < 10000; ++i) {
    const double u = CounterUniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    distinct.insert(u);
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_GT(distinct.size(), 9900u);
}

TEST(SamplingTest, BadParametersAreErrors) {
  const at::Tensor logits = Row({1, 2, 3});
  EXPECT_EQ(SampleTokens(logits, {Params(-1.0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTokens(logits, {Params(1.0, 0, 0.0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTokens(logits, {Params(1.0, 0, 1.5)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTokens(logits, {Params(1.0, 0, 1.0, 1.0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto mismatch = SampleTokens(logits, {Params(1.0), Params(1.0)});
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(mismatch.status().message()).find("2 sampling parameter sets"),
            std::string::npos);
}

}  // namespace
}  // namespace roll::strategies_internal
