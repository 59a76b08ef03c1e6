#include "roll/controller/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

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
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos && spec.env.count(std::string(kv.substr(0, eq)))) continue;
    env_strings.emplace_back(kv);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = spec.argv;
  std::vector<char*> argv;
  for (auto& a : argv_copy) argv.push_back(a.data());
  argv.push_back(nullptr);

  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(absl::StrCat("launch: cannot open log '", spec.log_path, "': ", strerror(errno)));
    }
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("launch: fork failed: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
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
