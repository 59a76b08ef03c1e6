#pragma once
// Private to the strategies library.

#include <ATen/Parallel.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace roll::strategies_internal {

// Persistent threads for the tensor-parallel slices 1..n of a model: each
// runs its slice's part of every step (the slices' collectives need each
// other, so they must run at once) with `threads_each` intra-op threads
// (the owner's thread count at creation over the number of slices); slice
// 0 runs on the owner's thread with that thread's own count. Used by the
// generation engine and by tensor-parallel training.
class SliceThreads {
 public:
  SliceThreads(size_t n, int threads_each) : threads_each_(threads_each) {
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { Loop(i); });
  }
  ~SliceThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int threads_each() const { return threads_each_; }
  // Starts fn(i) on thread i for every i; Wait() returns once all finished.
  void Start(std::function<void(size_t)> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = std::move(fn);
      pending_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
  }
  // An exception thrown by fn on a thread is rethrown here (the first).
  void Wait() {
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [this] { return pending_ == 0; });
      std::swap(error, error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  void Loop(size_t i) {
    at::set_num_threads(threads_each_);
    uint64_t seen = 0;
    while (true) {
      std::function<void(size_t)> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      std::exception_ptr error;
      try {
        fn(i);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (error && !error_) error_ = error;
        --pending_;
      }
      done_.notify_all();
    }
  }

  const int threads_each_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::function<void(size_t)> fn_;
  size_t pending_ = 0;
  std::exception_ptr error_;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace roll::strategies_internal
