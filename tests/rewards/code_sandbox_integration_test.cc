// Runs real python3 programs in the sandbox. The network test needs root
// (a network namespace); the others run as any user.

#include <arpa/inet.h>
#include <dirent.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "roll/rewards/code_sandbox.h"
#include "roll/rewards/reward_function.h"
#include "testing/files.h"

namespace roll {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

SandboxLimits Fast() {
  SandboxLimits l;
  l.timeout_s = 10.0;  // generous: the machine may be busy; tests that want a
                       // timeout lower it
  l.cpu_s = 5;
  return l;
}

std::string FirstLine(const std::string &s) { return s.substr(0, s.find('\n')); }

// Processes whose command line mentions `needle` (e.g. a sandbox directory).
std::vector<int> ProcessesMentioning(const std::string &needle) {
  std::vector<int> pids;
  DIR *d = opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent *e = readdir(d)) {
    const int pid = atoi(e->d_name);
    if (pid <= 0) continue;
    if (testing::ReadFile(absl::StrCat("/proc/", pid, "/cmdline")).find(needle) != std::string::npos) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

TEST(CodeSandboxTest, CorrectProgramPassesAllTests) {
  const std::string program = "a, b = map(int, input().split())\nprint(a + b)\n";
  auto r = RunCodeTests(program, {{"1 2\n", "3\n"}, {"10 20", "30"}, {"-5 5\n", "0"}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->passed, 3);
  EXPECT_EQ(r->total, 3);
  EXPECT_EQ(r->score, 1.0);
  EXPECT_EQ(r->reason, "all tests passed");
}

TEST(CodeSandboxTest, TrailingWhitespaceIsIgnored) {
  auto r = RunCodeTests("print('a  ')\nprint('b')\nprint()\n", {{"", "a\nb"}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 1.0) << r->reason;
}

TEST(CodeSandboxTest, WrongAnswerNamesTheTest) {
  const std::string program = "print(int(input()) * 2)\n";
  auto r = RunCodeTests(program, {{"1\n", "2\n"}, {"3\n", "7\n"}, {"5\n", "10\n"}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->passed, 2);
  EXPECT_DOUBLE_EQ(r->score, 2.0 / 3.0);
  EXPECT_EQ(r->reason, "wrong answer on test 2: expected '7' got '6'");
}

TEST(CodeSandboxTest, AllOrNothingStopsAtTheFirstFailure) {
  auto r = RunCodeTests("print(int(input()) * 2)\n", {{"1", "2"}, {"3", "7"}, {"5", "10"}}, Fast(),
                        /*all_or_nothing=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_EQ(r->passed, 1);
  EXPECT_THAT(r->reason, StartsWith("wrong answer on test 2"));
}

TEST(CodeSandboxTest, RuntimeAndSyntaxErrors) {
  auto r = RunCodeTests("raise ValueError('boom')\n", {{"", "1"}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, StartsWith("runtime error on test 1: exit code 1"));
  EXPECT_THAT(r->reason, HasSubstr("ValueError: boom"));
  r = RunCodeTests("def f(:\n  pass\n", {{"", "1"}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->reason, StartsWith("syntax error on test 1"));
}

TEST(CodeSandboxTest, InfiniteLoopTimesOut) {
  SandboxLimits l = Fast();
  l.timeout_s = 1.0;
  l.cpu_s = 1;
  const auto start = std::chrono::steady_clock::now();
  auto run = RunPythonSandboxed("import time\nwhile True:\n    time.sleep(0.01)\n", "", l);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->timed_out);
  EXPECT_EQ(run->exit_code, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  auto r = RunCodeTests("while True:\n    pass\n", {{"", "1"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  // A busy loop hits whichever comes first: the 1 s wall clock or 1 s of CPU.
  EXPECT_THAT(r->reason, ::testing::AnyOf(StartsWith("timeout after 1s on test 1"),
                                          StartsWith("CPU time limit on test 1")));
}

TEST(CodeSandboxTest, BusyLoopHitsTheCpuLimit) {
  SandboxLimits l = Fast();
  l.cpu_s = 1;
  l.timeout_s = 20.0;
  auto r = RunCodeTests("while True:\n    pass\n", {{"", "1"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_EQ(r->reason, "CPU time limit on test 1");
}

TEST(CodeSandboxTest, MemoryHogHitsTheMemoryLimit) {
  SandboxLimits l = Fast();
  l.memory_bytes = 256 << 20;
  auto r = RunCodeTests("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n", {{"", "1"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, StartsWith("memory limit on test 1"));
  EXPECT_THAT(r->reason, HasSubstr("MemoryError"));
}

TEST(CodeSandboxTest, HugeFileWriteHitsTheFileSizeLimit) {
  SandboxLimits l = Fast();
  l.file_bytes = 1 << 20;
  auto r = RunCodeTests(
      "with open('big.bin', 'wb') as f:\n    f.write(b'x' * "
      "(16 << 20))\nprint('wrote')\n",
      {{"", "wrote"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, StartsWith("file size limit on test 1"));
}

TEST(CodeSandboxTest, OutputIsCapped) {
  SandboxLimits l = Fast();
  l.output_bytes = 4096;
  auto run = RunPythonSandboxed("while True:\n    print('x' * 1000)\n", "", l);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->output_truncated);
  EXPECT_LE(run->stdout_text.size(), 4096u);
  auto r = RunCodeTests("while True:\n    print('x' * 1000)\n", {{"", "1"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reason, "output limit exceeded on test 1");
}

// A fork bomb bounded to 2^7 processes (so a failure here cannot take a
// shared machine down) whose processes all sleep holding the output pipe:
// the run must end at the timeout with every one of them killed.
TEST(CodeSandboxTest, ForkBombIsContained) {
  const std::string program = R"(import os, time
print(os.getcwd(), flush=True)
for _ in range(7):
    try:
        os.fork()
    except OSError:
        pass
time.sleep(120)
)";
  SandboxLimits l = Fast();
  l.timeout_s = 2.0;
  const auto start = std::chrono::steady_clock::now();
  auto run = RunPythonSandboxed(program, "", l);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_TRUE(run->timed_out);
  const std::string dir = FirstLine(run->stdout_text);
  ASSERT_THAT(dir, StartsWith("/"));
  std::vector<int> left;
  for (int i = 0; i < 50; ++i) {  // SIGKILLed processes take a moment to go
    left = ProcessesMentioning(dir);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " sandboxed processes survived";

  auto r = RunCodeTests(program, {{"", "done"}}, l);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, StartsWith("timeout after 2s on test 1"));
}

TEST(CodeSandboxTest, AsRootTheProgramRunsUnprivilegedAndItsForksAreCapped) {
  if (geteuid() != 0) GTEST_SKIP() << "the sandbox drops privileges only when it has them";
  // Children that stay: without the cap (root is exempt from RLIMIT_NPROC)
  // all 100 forks succeed.
  const std::string program = R"(import os, time
print(os.getuid(), os.getgid(), os.getgroups(), flush=True)
try:
    open('/root/.roll-sandbox-probe', 'w')
    print('wrote', flush=True)
except OSError:
    print('refused', flush=True)
n = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n, flush=True)
time.sleep(30)
)";
  SandboxLimits l = Fast();
  l.timeout_s = 3.0;
  l.processes = 8;
  auto run = RunPythonSandboxed(program, "", l);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<std::string> lines = absl::StrSplit(run->stdout_text, '\n');
  ASSERT_GE(lines.size(), 3u) << run->stdout_text << run->stderr_text;
  EXPECT_EQ(lines[0], "65534 65534 []");
  EXPECT_EQ(lines[1], "refused");
  EXPECT_LT(std::stoi(lines[2]), 8) << "forks beyond RLIMIT_NPROC";
  EXPECT_TRUE(run->timed_out);
}

TEST(CodeSandboxTest, TemporaryDirectoryIsRemoved) {
  auto run = RunPythonSandboxed(
      "import os\nopen('scratch.txt', "
      "'w').write('hi')\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n",
      "", Fast());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  const std::string dir = FirstLine(run->stdout_text);
  ASSERT_THAT(dir, StartsWith("/"));
  EXPECT_THAT(run->stdout_text, HasSubstr("['program.py', 'scratch.txt']"));
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

TEST(CodeSandboxTest, EnvironmentIsEmptiedButPath) {
  setenv("ROLL_SANDBOX_SECRET", "hunter2", 1);
  auto run =
      RunPythonSandboxed("import os\nprint(os.environ.get('ROLL_SANDBOX_SECRET', 'absent'))\n", "", Fast());
  unsetenv("ROLL_SANDBOX_SECRET");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(FirstLine(run->stdout_text), "absent");
}

TEST(CodeSandboxTest, LargeInputIsDelivered) {
  std::string input;
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&input, i, "\n");
  auto r = RunCodeTests("import sys\nprint(sum(int(x) for x in sys.stdin))\n",
                        {{input, std::to_string(99999LL * 100000 / 2)}}, Fast());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 1.0) << r->reason;
}

// A TCP listener on 127.0.0.1 of the test process, on a free port.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || listen(fd_, 8) != 0) return;
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) break;
        accepted_++;
        close(c);
      }
    });
  }
  ~Listener() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

bool ConnectFromHere(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

TEST(CodeSandboxTest, NetworkIsBlocked) {
  if (geteuid() != 0) GTEST_SKIP() << "a network namespace needs root";
  Listener listener;
  ASSERT_GT(listener.port(), 0);
  const std::string program = absl::StrCat(R"(import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", )",
                                           listener.port(), R"())
    print("connected")
except OSError:
    print("blocked")
)");
  auto run = RunPythonSandboxed(program, "", Fast());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(FirstLine(run->stdout_text), "blocked") << run->stderr_text;
  EXPECT_EQ(listener.accepted(), 0);
  // The listener itself works: the test process reaches it.
  EXPECT_TRUE(ConnectFromHere(listener.port()));
}

// Without root there is no network namespace: the sandbox refuses unless
// allowed to run with the network. As root, checked in a child that drops to
// an unprivileged user.
void ExpectRefusalWithoutNamespace() {
  SandboxLimits l = Fast();
  auto run = RunPythonSandboxed("print('ran')\n", "", l);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(run.status().message(), HasSubstr("network namespace"));
  l.allow_network_fallback = true;
  run = RunPythonSandboxed("print('ran')\n", "", l);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(FirstLine(run->stdout_text), "ran") << run->stderr_text;
}

TEST(CodeSandboxTest, RefusesWithoutNetworkNamespaceUnlessAllowed) {
  if (geteuid() != 0) {
    ExpectRefusalWithoutNamespace();
    return;
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The unprivileged user cannot reach a per-user python3 install.
    setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    ExpectRefusalWithoutNamespace();
    fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 2) << "cannot drop to an unprivileged user";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's failures above";
}

TEST(CodeSandboxRewardTest, ScoresAFencedProgram) {
  auto f = MakeRewardFunction("code_sandbox", R"({"timeout_s": 10})");
  ASSERT_TRUE(f.ok()) << f.status();
  RewardInput in;
  in.response =
      "Here is my solution:\n```python\nprint(input()[::-1])\n```\nIt reverses "
      "the line.";
  in.ground_truth = R"([{"input": "abc\n", "output": "cba\n"}, {"input": "xy", "output": "yx"}])";
  auto r = (*f)->Score(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 1.0);
  EXPECT_EQ(r->reason, "2/2 passed: all tests passed");
  EXPECT_EQ(r->extracted, "print(input()[::-1])\n");
  in.ground_truth = "not test cases";
  EXPECT_FALSE((*f)->Score(in).ok());
}

TEST(ExtractProgramTest, Fences) {
  EXPECT_EQ(ExtractProgram("```python\nprint(1)\n```"), "print(1)\n");
  EXPECT_EQ(ExtractProgram("Try:\n```\nprint(2)\n```\nDone."), "print(2)\n");
  EXPECT_EQ(ExtractProgram("```python\nA\n```\nthen better:\n```python\nB = 1\nprint(B)\n```\n"),
            "B = 1\nprint(B)\n");
  EXPECT_EQ(ExtractProgram("print(3)"), "print(3)");
}

TEST(ParseTestCasesTest, Parses) {
  auto t = ParseTestCases(R"([{"input": "1 2", "output": "3"}, {"input": "", "output": "x\n"}])");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].input, "1 2");
  EXPECT_EQ((*t)[0].expected_output, "3");
  EXPECT_EQ((*t)[1].expected_output, "x\n");
}

TEST(ParseTestCasesTest, Errors) {
  for (const char *bad : {"", "not json", R"({"input": "1", "output": "2"})", R"([{"input": "1"}])",
                          R"([{"input": 1, "output": "2"}])", R"([["1", "2"]])"}) {
    auto t = ParseTestCases(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(t.status().message(), HasSubstr("code test cases must be JSON")) << bad;
  }
}

TEST(RunCodeTestsTest, NoTestsIsAnError) {
  auto r = RunCodeTests("print(1)", {}, Fast());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace roll
