#include "roll/algorithms/eval_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace roll {
namespace {

// pass@k by brute force: the share of k-subsets of n samples (the first c
// correct) that hold at least one correct sample.
double BruteForcePassAtK(int n, int c, int k) {
  int64_t subsets = 0, hits = 0;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    ++subsets;
    hits += (mask & ((1u << c) - 1)) != 0;
  }
  return static_cast<double>(hits) / static_cast<double>(subsets);
}

TEST(EvalMetricsTest, PassAtKIsTheShareOfKSubsetsWithACorrectSample) {
  for (int n = 1; n <= 10; ++n) {
    for (int c = 0; c <= n; ++c) {
      for (int k = 1; k <= n; ++k) {
        auto p = PassAtK(n, c, k);
        ASSERT_TRUE(p.ok()) << p.status();
        EXPECT_NEAR(*p, BruteForcePassAtK(n, c, k), 1e-12) << "n=" << n << " c=" << c << " k=" << k;
      }
    }
  }
  // pass@1 is the mean accuracy; large n neither overflows nor loses it.
  EXPECT_NEAR(*PassAtK(1000, 250, 1), 0.25, 1e-12);
  EXPECT_NEAR(*PassAtK(1000, 1, 500), 0.5, 1e-12);
  EXPECT_FALSE(PassAtK(4, 5, 1).ok());
  EXPECT_FALSE(PassAtK(4, 2, 5).ok());
  EXPECT_FALSE(PassAtK(4, 2, 0).ok());
}

TEST(EvalMetricsTest, SupportChangeCountsAndRatiosOnAConstructedCase) {
  // 10 prompts: both solve 4, only the first 2, only the second 1, neither 3.
  std::vector<bool> a = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<bool> b = {1, 1, 1, 1, 0, 0, 1, 0, 0, 0};
  auto s = CompareSupport(a, b);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->preserved, 4);
  EXPECT_EQ(s->shrunk, 2);
  EXPECT_EQ(s->expanded, 1);
  EXPECT_EQ(s->neither, 3);
  EXPECT_DOUBLE_EQ(s->srr, 4.0 / 6);
  EXPECT_DOUBLE_EQ(s->ndr, 1.0 / 5);
  EXPECT_DOUBLE_EQ(s->sds, 2 * (4.0 / 6) * (1.0 / 5) / (4.0 / 6 + 1.0 / 5));
  EXPECT_DOUBLE_EQ(s->nscr, (1.0 - 2.0) / 7);
  auto none = CompareSupport({0, 0}, {0, 0});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->srr, 0.0) << "0/0 is 0";
  EXPECT_FALSE(CompareSupport({1}, {1, 0}).ok());
}

TEST(EvalMetricsTest, AnswerEntropyOfTheEmpiricalDistribution) {
  EXPECT_DOUBLE_EQ(AnswerEntropy({}), 0.0);
  EXPECT_DOUBLE_EQ(AnswerEntropy({"7", "7", "7"}), 0.0);
  EXPECT_NEAR(AnswerEntropy({"1", "2", "3", "4"}), std::log(4.0), 1e-12);
  // {a: 1/2, b: 1/4, c: 1/4}: 1.5 bits.
  EXPECT_NEAR(AnswerEntropy({"a", "b", "a", "c"}), 1.5 * std::log(2.0), 1e-12);
}

TEST(EvalMetricsTest, CollapseStepIsTheFirstWindowWhoseMeanStaysBelowTheThreshold) {
  CollapseDetector d(0.01, 3);
  const std::vector<double> acc = {0.6, 0.7, 0.005, 0.002, 0.5, 0.3, 0.009, 0.015, 0.001, 0.0, 0.4};
  std::vector<int64_t> seen;
  for (size_t s = 0; s < acc.size(); ++s) {
    d.Observe(static_cast<int64_t>(s + 1), acc[s]);
    seen.push_back(d.collapse_step());
  }
  // Steps 3-4 dip for two steps only (patience 3). Steps 7-9 average
  // 0.0083 though step 8 lies above the threshold: the collapse step is 7,
  // known once step 9 is in, and it stays after the recovery at step 11.
  EXPECT_EQ(seen, (std::vector<int64_t>{-1, -1, -1, -1, -1, -1, -1, -1, 7, 7, 7}));

  // A resumed detector continues the open window.
  CollapseDetector a(0.01, 3), b(0.01, 3);
  a.Observe(1, 0.5);
  a.Observe(2, 0.0);
  a.Observe(3, 0.0);
  b.Restore(a.collapse_step(), a.window());
  a.Observe(4, 0.0);
  b.Observe(4, 0.0);
  EXPECT_EQ(a.collapse_step(), 2);
  EXPECT_EQ(b.collapse_step(), 2);
}

}  // namespace
}  // namespace roll
