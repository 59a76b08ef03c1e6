#pragma once
// Stopwatch: seconds since it was started, on the steady clock, for the
// time/... metrics and benchmarks. Not thread-safe (a copy per thread).

#include <chrono>

namespace roll {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  // Seconds since construction or the last Restart.
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void Restart() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace roll
