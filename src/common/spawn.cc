#include "common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace roll {
namespace common_internal {

absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("spawn: empty argv");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos && o.env.count(std::string(kv.substr(0, eq)))) continue;
    env_strings.emplace_back(kv);
  }
  for (const auto& [k, v] : o.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = o.argv;
  std::vector<char*> argv;
  for (auto& a : argv_copy) argv.push_back(a.data());
  argv.push_back(nullptr);

  int log_fd = -1;
  if (!o.log_path.empty()) {
    log_fd = open(o.log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (o.truncate_log ? O_TRUNC : O_APPEND), 0644);
    if (log_fd < 0) {
      return absl::InternalError(absl::StrCat("cannot open log '", o.log_path, "': ", std::strerror(errno)));
    }
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The child starts with no signal blocked, whatever its parent blocks
    // (a worker waits for SIGTERM on a thread of its own).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (o.new_process_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, o.death_signal);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  return pid;
}

}  // namespace common_internal
}  // namespace roll
