#pragma once
// Intra-op threads that follow the machine's load. A LibTorch process with
// as many threads as its cores slows down several times over when another
// process keeps one of those cores busy: every parallel region waits for
// the thread that shares its core (on 2 cores, `roll sft` 3.7 s idle, 12 s
// next to one busy loop, 5 s with one thread). LoadAwareThreads measures,
// about once a second from /proc/stat, how much of the cores this process
// may run on (its affinity) other processes keep busy, and answers how
// many threads are worth running now: the wanted count on an idle machine,
// fewer while others hold cores, never below 1. Others count when they
// kept cores busy over the last interval and still have threads runnable
// now (/proc/stat's procs_running, less this process's own): a colocated
// worker of the same job that trained while this one waited is done when
// this one starts and does not count; two that are busy at the same time
// share the cores instead of oversubscribing them.
//
// Not thread-safe: one per thread that sets the thread count.

#include <cstdint>
#include <string>
#include <vector>

namespace roll {

class LoadAwareThreads {
 public:
  // `wanted`: the threads for an idle machine (>= 1). `follow_load` false:
  // always `wanted` (reproducible runs: the thread count changes the last
  // bits of reductions).
  LoadAwareThreads(int wanted, bool follow_load);

  // The threads to run the next piece of work with. Re-measures when the
  // last measurement is older than `interval_s`.
  int Threads(double interval_s = 1.0);
  int wanted() const { return wanted_; }
  // Why the last answer is what it is, for the log: "2 of 2 cores free" or
  // "other processes keep 1.0 of 2 cores busy".
  const std::string& why() const { return why_; }

 private:
  struct Sample {
    double seconds = 0;           // steady clock
    uint64_t busy = 0, total = 0;  // jiffies over the allowed cores
    uint64_t own = 0;              // this process's jiffies
    bool ok = false;
  };
  Sample Take() const;

  const int wanted_;
  const bool follow_;
  std::vector<int> cores_;     // the cores this process may run on
  std::vector<bool> allowed_;  // allowed_[c]: core c is one of them
  Sample last_;
  int threads_;
  std::string why_;
};

}  // namespace roll
