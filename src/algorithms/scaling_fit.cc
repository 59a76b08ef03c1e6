// FitScalingCurve: grid over (A, C_mid), least-squares B, refine, bootstrap.

#include "roll/algorithms/scaling_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"

namespace roll {
namespace {

struct Points {
  std::vector<double> log_x, y;
};

double Sse(const Points& d, double r0, double a, double log_c_mid, double b) {
  double s = 0;
  for (size_t i = 0; i < d.y.size(); ++i) {
    const double z = std::exp(b * (log_c_mid - d.log_x[i]));  // (C_mid / C)^B; inf -> R0
    const double r = r0 + (a - r0) / (1.0 + z);
    s += (d.y[i] - r) * (d.y[i] - r);
  }
  return s;
}

struct Best {
  double sse = std::numeric_limits<double>::infinity();
  double a = 0, log_c_mid = 0, b = 1;
};

// The least-squares B in [0.02, 50] for fixed A and C_mid: a coarse scan
// in log B, then golden-section search in the bracket of the best.
std::pair<double, double> BestB(const Points& d, double r0, double a, double log_c_mid) {
  constexpr int kScan = 12;
  const double lo = std::log(0.02), hi = std::log(50.0), step = (hi - lo) / (kScan - 1);
  int best = 0;
  double best_sse = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kScan; ++i) {
    const double sse = Sse(d, r0, a, log_c_mid, std::exp(lo + step * i));
    if (sse < best_sse) {
      best_sse = sse;
      best = i;
    }
  }
  double l = lo + step * std::max(0, best - 1), r = lo + step * std::min(kScan - 1, best + 1);
  constexpr double kPhi = 0.6180339887498949;
  double m1 = r - kPhi * (r - l), m2 = l + kPhi * (r - l);
  double f1 = Sse(d, r0, a, log_c_mid, std::exp(m1)), f2 = Sse(d, r0, a, log_c_mid, std::exp(m2));
  for (int it = 0; it < 14; ++it) {
    if (f1 < f2) {
      r = m2;
      m2 = m1;
      f2 = f1;
      m1 = r - kPhi * (r - l);
      f1 = Sse(d, r0, a, log_c_mid, std::exp(m1));
    } else {
      l = m1;
      m1 = m2;
      f1 = f2;
      m2 = l + kPhi * (r - l);
      f2 = Sse(d, r0, a, log_c_mid, std::exp(m2));
    }
  }
  const double b_log = f1 < f2 ? m1 : m2, sse = std::min(f1, f2);
  return sse < best_sse ? std::make_pair(std::exp(b_log), sse)
                        : std::make_pair(std::exp(lo + step * best), best_sse);
}

// The best (A, C_mid, B) over an n x n grid of [a_lo, a_hi] x [c_lo, c_hi]
// (C_mid in log space).
Best Grid(const Points& d, double r0, double a_lo, double a_hi, double c_lo, double c_hi, int n) {
  Best best;
  for (int i = 0; i < n; ++i) {
    const double a = a_lo + (a_hi - a_lo) * i / (n - 1);
    for (int j = 0; j < n; ++j) {
      const double c = c_lo + (c_hi - c_lo) * j / (n - 1);
      const auto [b, sse] = BestB(d, r0, a, c);
      if (sse < best.sse) best = {sse, a, c, b};
    }
  }
  return best;
}

Best Fit(const Points& d, double r0, double a_lo, double a_hi, double c_lo, double c_hi) {
  constexpr int kCoarse = 32, kFine = 16;
  const Best coarse = Grid(d, r0, a_lo, a_hi, c_lo, c_hi, kCoarse);
  const double da = (a_hi - a_lo) / (kCoarse - 1), dc = (c_hi - c_lo) / (kCoarse - 1);
  const Best fine = Grid(d, r0, std::max(a_lo, coarse.a - da), std::min(a_hi, coarse.a + da),
                         std::max(c_lo, coarse.log_c_mid - dc), std::min(c_hi, coarse.log_c_mid + dc), kFine);
  return fine.sse < coarse.sse ? fine : coarse;
}

}  // namespace

double ScalingCurve::At(double c) const { return r0 + (a - r0) / (1.0 + std::pow(c_mid / c, b)); }

absl::StatusOr<ScalingFit> FitScalingCurve(const std::vector<std::pair<double, double>>& points,
                                           const ScalingFitOptions& o) {
  Points d;
  double first_x = std::numeric_limits<double>::infinity(), first_y = 0;
  for (const auto& [x, y] : points) {
    if (x < first_x) {
      first_x = x;
      first_y = y;
    }
    if (x < o.min_x) continue;
    if (!(x > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fit-curve: x must be > 0 for the fitted points (got ", x, "); leave it out with --min-x"));
    }
    d.log_x.push_back(std::log(x));
    d.y.push_back(y);
  }
  if (d.y.size() < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("fit-curve: ", d.y.size(), " point(s) at or after min_x ", o.min_x, "; the fit needs 3"));
  }
  const double r0 = o.r0.value_or(first_y);
  const auto [y_lo, y_hi] = std::minmax_element(d.y.begin(), d.y.end());
  bool rate = r0 >= 0 && r0 <= 1;
  for (double y : d.y) rate = rate && y >= 0 && y <= 1;
  const double span = std::max(*y_hi - *y_lo, 1e-6);
  double a_lo = *y_lo - span, a_hi = *y_hi + span;
  if (rate) {
    a_lo = std::max(0.0, a_lo);
    a_hi = std::min(1.0, a_hi);
  }
  if (o.a_range) std::tie(a_lo, a_hi) = *o.a_range;
  const auto [lx_lo, lx_hi] = std::minmax_element(d.log_x.begin(), d.log_x.end());
  const double c_lo = *lx_lo - std::log(10.0), c_hi = *lx_hi + std::log(100.0);

  const Best best = Fit(d, r0, a_lo, a_hi, c_lo, c_hi);
  ScalingFit out;
  out.curve = {best.a, best.b, std::exp(best.log_c_mid), r0};
  out.points = static_cast<int64_t>(d.y.size());
  out.rmse = std::sqrt(best.sse / static_cast<double>(d.y.size()));
  if (o.bootstrap > 0) {
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<size_t> pick(0, d.y.size() - 1);
    double sum = 0, sum2 = 0;
    for (int k = 0; k < o.bootstrap; ++k) {
      Points s;
      for (size_t i = 0; i < d.y.size(); ++i) {
        const size_t j = pick(rng);
        s.log_x.push_back(d.log_x[j]);
        s.y.push_back(d.y[j]);
      }
      const double a = Fit(s, r0, a_lo, a_hi, c_lo, c_hi).a;
      sum += a;
      sum2 += a * a;
    }
    const double mean = sum / o.bootstrap;
    out.a_stderr = std::sqrt(std::max(0.0, sum2 / o.bootstrap - mean * mean));
  }
  return out;
}

}  // namespace roll
