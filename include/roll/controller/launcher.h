#pragma once
// Launcher: starts and watches worker processes. The controller talks to it
// through this interface only, so tests can wrap it (LauncherWrapper) to
// inject faults without sleeps, and multi-node agents can implement it.
// Implementations are thread-safe.

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct LaunchSpec {
  std::vector<std::string> argv;            // argv[0] is the executable path
  std::map<std::string, std::string> env;   // added to the launcher's environment
  std::string log_path;                     // stdout and stderr go here (appended)
  int node = 0;                             // placement node; 0: the controller's own
};

// Process ids of a multi-node job: a worker on node 0 is known by its pid,
// one on node n > 0 by n * 2^22 + its pid there (Linux pids stay below
// 2^22), so ids of different nodes never collide and are never a local pid.
inline constexpr int kNodePidBits = 22;
inline pid_t NodeProcessId(int node, pid_t pid) { return static_cast<pid_t>((node << kNodePidBits) | pid); }
inline int NodeOfProcess(pid_t id) { return static_cast<int>(id >> kNodePidBits); }
inline pid_t PidOnNode(pid_t id) { return id & ((pid_t{1} << kNodePidBits) - 1); }

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts the process; returns its pid.
  virtual absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) = 0;
  // nullopt while the process runs; otherwise how it ended ("exited with
  // code 1", "killed by signal 9").
  virtual std::optional<std::string> ExitStatus(pid_t pid) = 0;
  virtual void Signal(pid_t pid, int signal) = 0;
  // Waits up to `timeout_s` for the process to end; true when it has.
  virtual bool WaitExit(pid_t pid, double timeout_s) = 0;
};

// Starts workers as child processes of this one. Each child gets
// PR_SET_PDEATHSIG so it dies with the controller even before its own
// watchdog notices. Reaps its children.
class LocalLauncher : public Launcher {
 public:
  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override;
  std::optional<std::string> ExitStatus(pid_t pid) override;
  void Signal(pid_t pid, int signal) override;
  bool WaitExit(pid_t pid, double timeout_s) override;

 private:
  std::mutex mu_;
  std::map<pid_t, std::string> exited_;  // reaped pids and how they ended
};

// Forwards every call to `target` (not owned); override one method to inject a fault.
class LauncherWrapper : public Launcher {
 public:
  explicit LauncherWrapper(Launcher* target) : target_(target) {}
  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override { return target_->Launch(spec); }
  std::optional<std::string> ExitStatus(pid_t pid) override { return target_->ExitStatus(pid); }
  void Signal(pid_t pid, int signal) override { target_->Signal(pid, signal); }
  bool WaitExit(pid_t pid, double timeout_s) override { return target_->WaitExit(pid, timeout_s); }

 protected:
  Launcher* target() { return target_; }

 private:
  Launcher* target_;
};

// Path of the running executable (/proc/self/exe).
std::string SelfExecutable();

}  // namespace roll
