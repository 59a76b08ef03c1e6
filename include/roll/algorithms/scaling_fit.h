#pragma once
// The compute-performance curve of ScaleRL (arXiv 2510.13786) and its fit:
//
//   R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
//
// A is the asymptote (the run's predicted ceiling), B the scaling exponent
// (how fast it gets there), C_mid the compute at which half of the gain
// A - R0 is reached, R0 the performance at the start. FitScalingCurve fits
// it as ScaleRL does: R0 fixed (the first point's value unless given), a
// grid over A and C_mid, and for each grid point the least-squares B (a
// one-dimensional search); the best grid point is then refined on a finer
// grid around it. The error of A is the standard deviation of A over
// bootstrap refits (points resampled with replacement). Thread-safe pure
// functions.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct ScalingCurve {
  double a = 0, b = 1, c_mid = 1, r0 = 0;
  double At(double c) const;  // R(c); c > 0
};

struct ScalingFitOptions {
  double min_x = 0;          // points with x < min_x are left out of the fit
  std::optional<double> r0;  // default: the y of the point with the smallest x (before min_x included)
  int bootstrap = 30;        // refits for the error of A; 0: none
  uint64_t seed = 1;         // of the bootstrap's resampling
  // The range searched for A; default: from the largest y fitted to that
  // plus the fitted span of y again, capped at 1 when every y lies in [0, 1]
  // (a rate such as accuracy cannot pass 1).
  std::optional<std::pair<double, double>> a_range;
};

struct ScalingFit {
  ScalingCurve curve;
  double a_stderr = 0;  // standard deviation of A over the bootstrap refits
  double rmse = 0;      // root mean square residual over the fitted points
  int64_t points = 0;   // points fitted (x >= min_x)
};

// InvalidArgument for fewer than 3 points at or after min_x or a point with
// x <= 0 there (the curve needs C > 0).
absl::StatusOr<ScalingFit> FitScalingCurve(const std::vector<std::pair<double, double>>& points,
                                           const ScalingFitOptions& options = {});

}  // namespace roll
