#include "common/fork_thread.h"

namespace roll {
namespace common_internal {

ForkThread::ForkThread() : thread_([this] { Loop(); }) {}

ForkThread::~ForkThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::StatusOr<pid_t> ForkThread::Run(std::function<absl::StatusOr<pid_t>()> fork_child) {
  std::packaged_task<absl::StatusOr<pid_t>()> task(std::move(fork_child));
  auto result = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return result.get();
}

void ForkThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace common_internal
}  // namespace roll
