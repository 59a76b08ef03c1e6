#include "roll/algorithms/scaling_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace roll {
namespace {

// Points of a known curve over three decades of compute, with noise.
std::vector<std::pair<double, double>> Noisy(const ScalingCurve& c, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, noise);
  std::vector<std::pair<double, double>> pts;
  for (int i = 0; i <= 60; ++i) {
    const double x = std::pow(10.0, 1.0 + 3.0 * i / 60.0);
    pts.emplace_back(x, c.At(x) + n(rng));
  }
  return pts;
}

TEST(ScalingFitTest, CurveHasItsDefiningValues) {
  const ScalingCurve c{0.6, 1.5, 1000, 0.1};
  EXPECT_NEAR(c.At(1000), 0.35, 1e-12) << "half the gain at C_mid";
  EXPECT_NEAR(c.At(1e12), 0.6, 1e-6) << "A is the asymptote";
  EXPECT_NEAR(c.At(1e-3), 0.1, 1e-6) << "R0 at little compute";
  EXPECT_NEAR(c.At(10000), 0.1 + 0.5 / (1 + std::pow(0.1, 1.5)), 1e-12);
}

TEST(ScalingFitTest, RecoversKnownParametersFromNoisyPoints) {
  const ScalingCurve truth{0.62, 1.3, 800, 0.1};
  ScalingFitOptions o;
  o.r0 = 0.1;
  auto fit = FitScalingCurve(Noisy(truth, 0.01, 7), o);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->curve.a, truth.a, 0.02);
  EXPECT_NEAR(fit->curve.b, truth.b, 0.25);
  EXPECT_NEAR(std::log(fit->curve.c_mid), std::log(truth.c_mid), 0.15);
  EXPECT_NEAR(fit->rmse, 0.01, 0.004) << "residuals are the noise";
  EXPECT_GT(fit->a_stderr, 0.0);
  EXPECT_LT(fit->a_stderr, 0.02);
  EXPECT_EQ(fit->points, 61);
  // More noise, a wider bootstrap error.
  auto noisier = FitScalingCurve(Noisy(truth, 0.05, 7), o);
  ASSERT_TRUE(noisier.ok());
  EXPECT_GT(noisier->a_stderr, fit->a_stderr);
}

TEST(ScalingFitTest, MinXLeavesOutEarlyPointsAndR0DefaultsToTheFirstPoint) {
  const ScalingCurve truth{0.5, 2.0, 300, 0.2};
  auto pts = Noisy(truth, 0.0, 1);
  // An outlier before min_x that would pull the fit if it counted.
  pts.insert(pts.begin(), {5.0, 0.2});
  pts.emplace_back(7.0, 0.9);
  ScalingFitOptions o;
  o.min_x = 10;
  o.bootstrap = 0;
  auto fit = FitScalingCurve(pts, o);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_DOUBLE_EQ(fit->curve.r0, 0.2) << "the smallest x's value";
  EXPECT_EQ(fit->points, 61);
  EXPECT_NEAR(fit->curve.a, 0.5, 0.01);
  EXPECT_LT(fit->rmse, 0.005);
  EXPECT_EQ(fit->a_stderr, 0.0);
}

TEST(ScalingFitTest, BadInputIsNamed) {
  EXPECT_FALSE(FitScalingCurve({{1, 0.1}, {2, 0.2}}).ok());
  auto zero = FitScalingCurve({{0, 0.1}, {2, 0.2}, {3, 0.3}, {4, 0.4}});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("min-x"), std::string::npos) << zero.status();
}

}  // namespace
}  // namespace roll
