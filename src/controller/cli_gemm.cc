#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "controller/cli.h"

namespace roll {

double MeasureGemmGflops() {
  using Clock = std::chrono::steady_clock;
  c10::InferenceMode guard;
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
  for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    int reps = 0;
    const auto start = Clock::now();
    double s = 0;
    do {
      at::mm_out(c, a, b);
      ++reps;
      s = std::chrono::duration<double>(Clock::now() - start).count();
    } while (s < 0.2);
    best = std::max(best, 2.0 * n * n * n * reps / s / 1e9);
  }
  return best;
}

}  // namespace roll
