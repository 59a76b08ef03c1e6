#include "roll/controller/launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/spawn.h"

namespace roll {
namespace {

std::string Describe(int wstatus) {
  if (WIFEXITED(wstatus)) return absl::StrCat("exited with code ", WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wstatus), " (", strsignal(WTERMSIG(wstatus)), ")");
  }
  return "ended";
}

}  // namespace

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "roll";
  buf[n] = '\0';
  return buf;
}

absl::StatusOr<pid_t> LocalLauncher::Launch(const LaunchSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("launch: empty argv");
  common_internal::SpawnOptions o;
  o.argv = spec.argv;
  o.env = spec.env;
  o.log_path = spec.log_path;
  // A worker whose controller dies gets SIGTERM: it stops what it started
  // and removes its temporary files (exit hooks), then exits.
  o.death_signal = SIGTERM;
  auto pid = common_internal::SpawnProcess(o);
  if (!pid.ok()) return absl::InternalError(absl::StrCat("launch: ", pid.status().message()));
  return pid;
}

std::optional<std::string> LocalLauncher::ExitStatus(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = exited_.find(pid); it != exited_.end()) return it->second;
  int wstatus = 0;
  pid_t r = waitpid(pid, &wstatus, WNOHANG);
  if (r == 0) return std::nullopt;
  std::string how = r == pid ? Describe(wstatus) : "is not a child of this process";
  exited_[pid] = how;
  return how;
}

void LocalLauncher::Signal(pid_t pid, int signal) {
  if (!ExitStatus(pid)) kill(pid, signal);
}

bool LocalLauncher::WaitExit(pid_t pid, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (ExitStatus(pid)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace roll
