#pragma once
// ForkThread: one long-lived thread that runs every fork of its owner.
//
// A child started with PR_SET_PDEATHSIG is signalled when the *thread* that
// forked it ends, not the process. Callers that fork from short-lived
// threads (gRPC handler threads, the threads that call into environments)
// hand the fork to this thread instead, so their children live exactly as
// long as the ForkThread. Run() blocks until the task has run and returns
// its result; tasks run one at a time, in order.
//
// Thread-safe. The destructor finishes the queued tasks and joins; an owner
// whose children must live until the process exits keeps its ForkThread
// for the life of the process (never destroys it).

#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "roll/common/status.h"

namespace roll {
namespace common_internal {

class ForkThread {
 public:
  ForkThread();
  ~ForkThread();
  ForkThread(const ForkThread&) = delete;
  ForkThread& operator=(const ForkThread&) = delete;

  // Runs `fork_child` (which forks and returns the child's pid) on the
  // thread and returns what it returned.
  absl::StatusOr<pid_t> Run(std::function<absl::StatusOr<pid_t>()> fork_child);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::packaged_task<absl::StatusOr<pid_t>()>> tasks_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace common_internal
}  // namespace roll
