#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "cli/cli.h"

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

BlasInfo LoadedBlas() {
  // OpenBLAS's own entry points, looked up at run time: the process may
  // have loaded another BLAS (or OpenBLAS without them).
  using IntFn = int (*)();
  BlasInfo info;
  auto parallel = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  auto threads = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (parallel == nullptr) {
    // MKL inside LibTorch (PyPI's wheel), threaded with LibTorch's own
    // OpenMP runtime: at::set_num_threads sets its count too.
    auto mkl_threads = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads"));
    if (mkl_threads == nullptr) return info;
    info.library = "mkl";
    info.threading = "openmp";
    info.threads = mkl_threads();
    Dl_info where;
    if (dladdr(reinterpret_cast<void*>(mkl_threads), &where) != 0 && where.dli_fname != nullptr) {
      info.directory = std::filesystem::path(where.dli_fname).parent_path().string();
    }
    return info;
  }
  info.library = "openblas";
  Dl_info where;
  if (dladdr(reinterpret_cast<void*>(parallel), &where) != 0 && where.dli_fname != nullptr) {
    info.directory = std::filesystem::path(where.dli_fname).parent_path().string();
  }
  switch (parallel()) {
    case 0:
      info.threading = "sequential";
      break;
    case 1:
      info.threading = "pthreads";
      break;
    case 2:
      info.threading = "openmp";
      break;
    default:
      info.threading = "other";
  }
  // The OpenMP build runs a product on one thread when the caller's OpenMP
  // team is 1 (and then leaves its own count as it was); above 1 it takes
  // the team's size as its count at each product, up to its own limits.
  if (info.threading == "openmp" && at::get_num_threads() == 1) {
    info.threads = 1;
  } else if (threads != nullptr) {
    info.threads = threads();
  }
  return info;
}

}  // namespace roll
