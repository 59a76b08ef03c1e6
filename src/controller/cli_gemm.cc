#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "controller/cli.h"

namespace roll {

double BestSecondsPerCall(const std::function<void()>& fn, int rounds, double round_s) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 3; ++i) fn();
  double best = 1e300;
  for (int round = 0; round < rounds; ++round) {
    int reps = 0;
    const auto start = Clock::now();
    double s = 0;
    do {
      fn();
      ++reps;
      s = std::chrono::duration<double>(Clock::now() - start).count();
    } while (s < round_s);
    best = std::min(best, s / reps);
  }
  return best;
}

double MeasureGemmGflops() {
  c10::InferenceMode guard;
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
  const double s = BestSecondsPerCall([&] { at::mm_out(c, a, b); }, 5, 0.2);
  return 2.0 * n * n * n / s / 1e9;
}

}  // namespace roll
