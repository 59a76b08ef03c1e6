#include "roll/rewards/code_sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "roll/rewards/reward_function.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

// `name` on `path` (the caller's PATH when null).
std::string FindOnPath(const std::string& name, const char* path = nullptr) {
  if (path == nullptr) path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    fs::path p = fs::path(std::string(dir)) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// Child-side failure report: stage and errno through the CLOEXEC pipe.
[[noreturn]] void ChildFail(int fd, int stage) {
  int msg[2] = {stage, errno};
  ssize_t ignored = write(fd, msg, sizeof(msg));
  (void)ignored;
  _exit(127);
}

constexpr int kStageNetns = 1, kStageLimits = 2, kStageExec = 3, kStageSetup = 4, kStageUser = 5;

// The user ("nobody") that programs run as when the caller is root: root
// is exempt from RLIMIT_NPROC and may touch every file.
constexpr uid_t kSandboxUid = 65534;
constexpr gid_t kSandboxGid = 65534;

std::string TrimLines(const std::string& s) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return std::string(absl::StripTrailingAsciiWhitespace(out));
}

std::string Clip(const std::string& s, size_t n = 60) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

}  // namespace

absl::StatusOr<SandboxRun> RunPythonSandboxed(const std::string& program, const std::string& input,
                                              const SandboxLimits& lim) {
  const bool drop_root = geteuid() == 0;
  // Root's PATH may lead to an interpreter only root can reach (under
  // /root); the unprivileged user runs the system's.
  const std::string python = drop_root ? FindOnPath("python3", "/usr/local/bin:/usr/bin:/bin") : FindOnPath("python3");
  if (python.empty()) {
    return absl::FailedPreconditionError(drop_root ? "code sandbox: python3 is not in /usr/local/bin, /usr/bin or /bin"
                                                   : "code sandbox: python3 is not on PATH");
  }
  // In the temporary directory ($TMPDIR); /tmp when the program runs as
  // the unprivileged user, who must reach the directory (a TMPDIR may be
  // private to root).
  std::error_code tmp_ec;
  const fs::path base = drop_root ? fs::path("/tmp") : fs::temp_directory_path(tmp_ec);
  std::string tmpl = ((tmp_ec ? fs::path("/tmp") : base) / "roll-sandbox-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("code sandbox: cannot create a directory in ", base.string(), ": ",
                                            std::strerror(errno)));
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  {
    std::ofstream f(dir + "/program.py");
    f << program;
    if (!f) return absl::InternalError("code sandbox: cannot write the program");
  }
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls are made.
  const std::string program_path = dir + "/program.py";
  if (drop_root && (chown(dir.c_str(), kSandboxUid, kSandboxGid) != 0 ||
                    chown(program_path.c_str(), kSandboxUid, kSandboxGid) != 0)) {
    return absl::FailedPreconditionError(absl::StrCat("code sandbox: cannot hand ", dir, " to uid ", kSandboxUid,
                                                      " (is it mapped in this user namespace?): ",
                                                      std::strerror(errno)));
  }
  // Unprivileged, the child cannot raise the hard limit on processes above
  // the one it inherits.
  struct rlimit nproc_now;
  rlim_t nproc = static_cast<rlim_t>(lim.processes);
  if (getrlimit(RLIMIT_NPROC, &nproc_now) == 0 && nproc_now.rlim_max != RLIM_INFINITY) {
    nproc = std::min(nproc, nproc_now.rlim_max);
  }
  const char* argv[] = {python.c_str(), "-I", "-S", program_path.c_str(), nullptr};
  const char* envp[] = {"PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1", "HOME=/nonexistent", nullptr};
  int in_pipe[2], out_pipe[2], err_pipe[2], status_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) || pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) ||
      pipe2(status_pipe, O_CLOEXEC)) {
    return absl::InternalError(absl::StrCat("code sandbox: pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("code sandbox: fork: ", std::strerror(errno)));
  if (pid == 0) {
    sigset_t none;  // no signal blocked, whatever the worker blocks
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);
    if (unshare(CLONE_NEWNET) != 0 && !lim.allow_network_fallback) ChildFail(status_pipe[1], kStageNetns);
    struct rlimit r;
    auto set_limit = [&](int res, rlim_t soft, rlim_t hard) {
      r.rlim_cur = soft;
      r.rlim_max = hard;
      if (setrlimit(res, &r) != 0) ChildFail(status_pipe[1], kStageLimits);
    };
    auto set = [&](int res, rlim_t v) { set_limit(res, v, v); };
    // At the soft limit SIGXCPU (reported as the CPU limit); a hard limit
    // equal to it would SIGKILL at the same tick instead.
    set_limit(RLIMIT_CPU, static_cast<rlim_t>(lim.cpu_s), static_cast<rlim_t>(lim.cpu_s) + 1);
    set(RLIMIT_AS, static_cast<rlim_t>(lim.memory_bytes));
    set(RLIMIT_FSIZE, static_cast<rlim_t>(lim.file_bytes));
    set(RLIMIT_NOFILE, static_cast<rlim_t>(lim.open_files));
    set(RLIMIT_CORE, 0);
    if (chdir(dir.c_str()) != 0) ChildFail(status_pipe[1], kStageSetup);
    if (dup2(in_pipe[0], 0) < 0 || dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0) {
      ChildFail(status_pipe[1], kStageSetup);
    }
    // Raw system calls: they change this (the only) thread, with no libc
    // machinery after fork.
    if (drop_root && (syscall(SYS_setgroups, 0, nullptr) != 0 ||
                      syscall(SYS_setresgid, kSandboxGid, kSandboxGid, kSandboxGid) != 0 ||
                      syscall(SYS_setresuid, kSandboxUid, kSandboxUid, kSandboxUid) != 0)) {
      ChildFail(status_pipe[1], kStageUser);
    }
    // Last, so the limit on processes does not stop the set-up above; it
    // counts the processes of the (now unprivileged) user.
    set(RLIMIT_NPROC, nproc);
    execve(argv[0], const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ChildFail(status_pipe[1], kStageExec);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(status_pipe[1]);
  setpgid(pid, pid);  // also from here, so the kill below never misses

  SandboxRun run;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lim.timeout_s);
  size_t written = 0;
  int in_fd = in_pipe[1];
  fcntl(in_fd, F_SETFL, O_NONBLOCK);
  if (input.empty()) {
    close(in_fd);
    in_fd = -1;
  }
  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* bufs[2] = {&run.stdout_text, &run.stderr_text};
  bool open[2] = {true, true};
  char chunk[65536];
  while (open[0] || open[1]) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      run.timed_out = true;
      break;
    }
    struct pollfd p[3];
    int n = 0;
    int idx[3];
    for (int i = 0; i < 2; ++i) {
      if (open[i]) {
        p[n] = {fds[i], POLLIN, 0};
        idx[n++] = i;
      }
    }
    if (in_fd >= 0) {
      p[n] = {in_fd, POLLOUT, 0};
      idx[n++] = 2;
    }
    const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    if (poll(p, n, ms) < 0 && errno != EINTR) break;
    for (int k = 0; k < n; ++k) {
      if (!p[k].revents) continue;
      if (idx[k] == 2) {
        ssize_t w = write(in_fd, input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN) written = input.size();
        if (written >= input.size()) {
          close(in_fd);
          in_fd = -1;
        }
        continue;
      }
      const int i = idx[k];
      ssize_t r = read(fds[i], chunk, sizeof(chunk));
      if (r <= 0) {
        open[i] = false;
        continue;
      }
      const size_t room = static_cast<size_t>(lim.output_bytes) - std::min<size_t>(bufs[i]->size(), lim.output_bytes);
      bufs[i]->append(chunk, std::min<size_t>(room, static_cast<size_t>(r)));
      if (static_cast<size_t>(r) > room) {
        run.output_truncated = true;
        open[0] = open[1] = false;  // stop reading; the process is killed below
      }
    }
  }
  if (in_fd >= 0) close(in_fd);
  kill(-pid, SIGKILL);  // the whole group: forks of the program included
  int status = 0;
  waitpid(pid, &status, 0);
  close(out_pipe[0]);
  close(err_pipe[0]);
  int msg[2] = {0, 0};
  const ssize_t got = read(status_pipe[0], msg, sizeof(msg));
  close(status_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(msg))) {
    const char* stage = msg[0] == kStageNetns    ? "creating its network namespace (needs root)"
                        : msg[0] == kStageLimits ? "setting resource limits"
                        : msg[0] == kStageExec   ? "starting python3"
                        : msg[0] == kStageUser   ? "dropping to an unprivileged user"
                                                 : "setting up the child";
    return absl::FailedPreconditionError(
        absl::StrCat("code sandbox: failed ", stage, ": ", std::strerror(msg[1])));
  }
  if (WIFEXITED(status) && !run.timed_out && !run.output_truncated) {
    run.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    run.signal = WTERMSIG(status);
  }
  return run;
}

absl::StatusOr<CodeTestResult> RunCodeTests(const std::string& program, const std::vector<TestCase>& tests,
                                            const SandboxLimits& limits, bool all_or_nothing) {
  CodeTestResult r;
  r.total = static_cast<int>(tests.size());
  if (tests.empty()) return absl::InvalidArgumentError("code sandbox: no test cases");
  for (size_t i = 0; i < tests.size(); ++i) {
    ROLL_ASSIGN_OR_RETURN(SandboxRun run, RunPythonSandboxed(program, tests[i].input, limits));
    std::string why;
    const std::string test = absl::StrCat("test ", i + 1);
    if (run.timed_out) {
      why = absl::StrCat("timeout after ", limits.timeout_s, "s on ", test);
    } else if (run.output_truncated) {
      why = absl::StrCat("output limit exceeded on ", test);
    } else if (run.signal == SIGXCPU) {
      why = absl::StrCat("CPU time limit on ", test);
    } else if (run.signal == SIGXFSZ) {
      why = absl::StrCat("file size limit on ", test);
    } else if (run.signal != 0) {
      why = absl::StrCat("killed by signal ", run.signal, " (", strsignal(run.signal), ") on ", test);
    } else if (run.exit_code != 0) {
      std::string last = std::string(absl::StripTrailingAsciiWhitespace(run.stderr_text));
      if (size_t nl = last.rfind('\n'); nl != std::string::npos) last = last.substr(nl + 1);
      const bool memory = last.find("MemoryError") != std::string::npos;
      // Python ignores SIGXFSZ, so RLIMIT_FSIZE shows up as EFBIG.
      const bool file_size = last.find("File too large") != std::string::npos;
      const bool syntax = last.find("SyntaxError") != std::string::npos ||
                          last.find("IndentationError") != std::string::npos;
      why = absl::StrCat(memory      ? "memory limit"
                         : file_size ? "file size limit"
                         : syntax    ? "syntax error"
                                     : "runtime error",
                         " on ", test,
                         ": exit code ", run.exit_code, ": ", Clip(last, 120));
    } else if (TrimLines(run.stdout_text) != TrimLines(tests[i].expected_output)) {
      why = absl::StrCat("wrong answer on ", test, ": expected '", Clip(TrimLines(tests[i].expected_output)),
                         "' got '", Clip(TrimLines(run.stdout_text)), "'");
    }
    if (why.empty()) {
      ++r.passed;
    } else if (r.reason.empty()) {
      r.reason = why;
      if (all_or_nothing) break;
    }
  }
  if (r.reason.empty()) r.reason = "all tests passed";
  r.score = all_or_nothing ? (r.passed == r.total ? 1.0 : 0.0) : static_cast<double>(r.passed) / r.total;
  return r;
}

std::string ExtractProgram(const std::string& response) {
  size_t end = response.rfind("```");
  if (end == std::string::npos || end == 0) return response;
  size_t start = response.rfind("```", end - 1);
  if (start == std::string::npos) return response;
  size_t body = response.find('\n', start);
  if (body == std::string::npos || body > end) return response;
  return response.substr(body + 1, end - body - 1);
}

absl::StatusOr<std::vector<TestCase>> ParseTestCases(const std::string& text) {
  std::vector<TestCase> out;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_array()) throw std::runtime_error("expected a list");
    for (const auto& t : j) out.push_back({t.at("input").get<std::string>(), t.at("output").get<std::string>()});
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "code test cases must be JSON [{\"input\": str, \"output\": str}, ...]: ", e.what()));
  }
  return out;
}

namespace {

class CodeSandboxReward : public RewardFunction {
 public:
  CodeSandboxReward(SandboxLimits l, bool all) : limits_(l), all_or_nothing_(all) {}
  absl::StatusOr<RewardResult> Score(const RewardInput& in) const override {
    ROLL_ASSIGN_OR_RETURN(std::vector<TestCase> tests, ParseTestCases(in.ground_truth));
    const std::string program = ExtractProgram(in.response);
    ROLL_ASSIGN_OR_RETURN(CodeTestResult r, RunCodeTests(program, tests, limits_, all_or_nothing_));
    return RewardResult{r.score, absl::StrCat(r.passed, "/", r.total, " passed: ", r.reason), program};
  }

 private:
  SandboxLimits limits_;
  bool all_or_nothing_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RewardFunction>> MakeCodeSandboxReward(const std::string& options_json) {
  SandboxLimits l;
  bool all = false;
  if (!options_json.empty()) {
    try {
      nlohmann::json j = nlohmann::json::parse(options_json);
      if (!j.is_object()) return absl::InvalidArgumentError("code_sandbox options: expected an object");
      for (const auto& [k, v] : j.items()) {
        const bool flag = k == "all_or_nothing" || k == "allow_network_fallback";
        const bool number = k == "timeout_s" || k == "cpu_s" || k == "memory_mb" || k == "file_mb" ||
                            k == "processes";
        if ((flag && !v.is_boolean()) || (number && !v.is_number())) {
          return absl::InvalidArgumentError(absl::StrCat("code_sandbox option '", k, "' must be ",
                                                         flag ? "true or false" : "a number", ", got ", v.dump()));
        }
        if (k == "timeout_s") l.timeout_s = v.get<double>();
        else if (k == "cpu_s") l.cpu_s = v.get<int>();
        else if (k == "memory_mb") l.memory_bytes = v.get<int64_t>() << 20;
        else if (k == "file_mb") l.file_bytes = v.get<int64_t>() << 20;
        else if (k == "processes") l.processes = v.get<int>();
        else if (k == "all_or_nothing") all = v.get<bool>();
        else if (k == "allow_network_fallback") l.allow_network_fallback = v.get<bool>();
        else return absl::InvalidArgumentError(absl::StrCat("code_sandbox has no option '", k, "'"));
      }
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("code_sandbox options: ", e.what()));
    }
  }
  return std::unique_ptr<RewardFunction>(new CodeSandboxReward(l, all));
}

}  // namespace roll
