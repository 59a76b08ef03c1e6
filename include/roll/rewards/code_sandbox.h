#pragma once
// The code sandbox reward: runs a sample's program against test cases in a
// child process that has
//   - its own empty network namespace (no network, not even the host's
//     loopback); where that cannot be made (not root) the sandbox refuses
//     to run unless allow_network_fallback is set,
//   - limits on CPU time, address space, file size, processes and open files,
//   - when the caller is root, an unprivileged user (uid and gid 65534,
//     "nobody"): root is exempt from the limit on processes and may read
//     and write every file,
//   - a wall-clock timeout after which its whole process group is killed,
//   - a fresh temporary working directory, removed afterwards,
//   - an empty environment but PATH, and pipes for stdin/stdout/stderr whose
//     output is capped.
// Thread-safe: each Run uses its own directory and processes.

#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct SandboxLimits {
  double timeout_s = 5.0;            // wall clock per test
  int cpu_s = 4;                     // RLIMIT_CPU
  int64_t memory_bytes = 512 << 20;  // RLIMIT_AS
  int64_t file_bytes = 1 << 20;      // RLIMIT_FSIZE
  int processes = 32;                // RLIMIT_NPROC (counts every process of the sandbox's user)
  int open_files = 64;               // RLIMIT_NOFILE
  int64_t output_bytes = 1 << 20;    // stdout/stderr kept at most
  bool allow_network_fallback = false;
};

struct TestCase {
  std::string input;
  std::string expected_output;
};

struct SandboxRun {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  bool output_truncated = false;
  std::string stdout_text, stderr_text;
};

// Runs `python3 program.py` with `input` on stdin.
absl::StatusOr<SandboxRun> RunPythonSandboxed(const std::string& program, const std::string& input,
                                              const SandboxLimits& limits);

struct CodeTestResult {
  int passed = 0;
  int total = 0;
  double score = 0;    // passed / total, or all-or-nothing
  std::string reason;  // why the first failing test failed, or "all tests passed"
};
absl::StatusOr<CodeTestResult> RunCodeTests(const std::string& program, const std::vector<TestCase>& tests,
                                            const SandboxLimits& limits, bool all_or_nothing = false);

// The last ```python (or plain ```) fenced block of a response, else the text.
std::string ExtractProgram(const std::string& response);

// Test cases from JSON [{"input": "...", "output": "..."}, ...].
absl::StatusOr<std::vector<TestCase>> ParseTestCases(const std::string& json);

}  // namespace roll
