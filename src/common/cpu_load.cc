#include "roll/common/cpu_load.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "roll/common/stopwatch.h"

namespace roll {
namespace {

// Seconds on one steady clock for every LoadAwareThreads of the process.
double Now() {
  static const Stopwatch* clock = new Stopwatch();
  return clock->Seconds();
}

std::vector<int> AllowedCores() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
  }
  return out;
}

// Threads runnable on the whole machine right now (/proc/stat's
// procs_running).
int64_t RunnableNow() {
  std::ifstream stat("/proc/stat");
  std::string key;
  int64_t value = 0;
  while (stat >> key) {
    if (key == "procs_running" && stat >> value) return value;
    stat.ignore(1 << 20, '\n');
  }
  return 0;
}

// This process's threads that are runnable right now (state R), at least
// the caller.
int64_t OwnRunnableNow() {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(task.path() / "stat");
    std::string all((std::istreambuf_iterator<char>(f)), {});
    const size_t close = all.rfind(')');
    if (close != std::string::npos && close + 2 < all.size() && all[close + 2] == 'R') ++n;
  }
  return std::max<int64_t>(n, 1);
}

// Other processes' runnable threads right now, at most `cores`.
double OthersRunnableNow(int cores) {
  return static_cast<double>(std::clamp<int64_t>(RunnableNow() - OwnRunnableNow(), 0, cores));
}

}  // namespace

LoadAwareThreads::LoadAwareThreads(int wanted, bool follow_load)
    : wanted_(std::max(1, wanted)), follow_(follow_load), cores_(AllowedCores()), threads_(wanted_) {
  for (int c : cores_) {
    if (c >= static_cast<int>(allowed_.size())) allowed_.resize(c + 1, false);
    allowed_[c] = true;
  }
  why_ = absl::StrFormat("%d thread(s) as configured", wanted_);
  if (!follow_ || wanted_ == 1) return;
  last_ = Take();
  // Until a first interval is measured: what other processes have runnable
  // right now.
  const int cores = static_cast<int>(cores_.size());
  const double others = OthersRunnableNow(cores);
  if (others >= 1 && cores > 0) {
    threads_ = std::clamp(cores - static_cast<int>(others), 1, wanted_);
    why_ = absl::StrFormat("other processes have %d thread(s) running on %d cores", static_cast<int>(others), cores);
  }
}

// /proc/stat's "cpuN user nice system idle iowait irq softirq steal ..."
// lines of the allowed cores, and /proc/self/stat's utime + stime.
LoadAwareThreads::Sample LoadAwareThreads::Take() const {
  Sample s;
  s.seconds = Now();
  std::ifstream stat("/proc/stat");
  std::string line;
  int seen = 0;
  while (std::getline(stat, line)) {
    if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream in(line.substr(3));
    int cpu = -1;
    uint64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    in >> cpu;
    for (uint64_t& x : v) in >> x;
    if (cpu < 0 || cpu >= static_cast<int>(allowed_.size()) || !allowed_[cpu]) continue;
    const uint64_t idle = v[3] + v[4];
    uint64_t total = 0;
    for (uint64_t x : v) total += x;
    s.busy += total - idle;
    s.total += total;
    ++seen;
  }
  // Fields 14 and 15 of /proc/self/stat, after the ")" that ends the name.
  std::ifstream self("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(self)), {});
  const size_t close = all.rfind(')');
  if (close != std::string::npos) {
    std::istringstream in(all.substr(close + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    s.own = utime + stime;
  }
  s.ok = seen > 0 && seen == static_cast<int>(cores_.size());
  return s;
}

int LoadAwareThreads::Threads(double interval_s) {
  if (!follow_ || wanted_ == 1) return wanted_;
  const double now = Now();
  if (now - last_.seconds < interval_s) return threads_;
  const Sample s = Take();
  if (!s.ok || !last_.ok || s.total <= last_.total) {
    last_ = s;
    return threads_;
  }
  const double cores = static_cast<double>(cores_.size());
  // Jiffies per core over the interval, the busy ones of all allowed cores,
  // and this process's share of them.
  const double per_core = static_cast<double>(s.total - last_.total) / cores;
  const double busy = static_cast<double>(s.busy - last_.busy);
  const double own = static_cast<double>(s.own - last_.own);
  // Busy over the interval and still runnable now: a colocated worker of
  // this job that trained while this one waited is done by the time this
  // one starts, and does not count.
  const double others =
      std::min(std::clamp((busy - own) / per_core, 0.0, cores), OthersRunnableNow(static_cast<int>(cores)));
  last_ = s;
  // Idle: as configured (which may ask for more threads than cores).
  const int free_cores = static_cast<int>(std::lround(cores - others));
  threads_ = others < 0.5 ? wanted_ : std::clamp(free_cores, 1, wanted_);
  why_ = others < 0.25 ? absl::StrFormat("%d of %d cores free", static_cast<int>(cores), static_cast<int>(cores))
                       : absl::StrFormat("other processes keep %.1f of %d cores busy", others, static_cast<int>(cores));
  return threads_;
}

}  // namespace roll
