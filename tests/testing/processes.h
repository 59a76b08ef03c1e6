#pragma once
// Helpers for tests that start real worker processes.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "roll/common/config.h"
#include "testing/files.h"     // ReadFile
#include "testing/temp_dir.h"  // TempDir

namespace roll::testing {

// Runs `cmd` in a shell; its exit code and its stdout and stderr together.
struct ShellResult {
  int code = -1;
  std::string out;
};

inline ShellResult Shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string RollBinary() { return std::string(ROLL_BINARY_DIR) + "/bin/roll"; }

// True while `pid` exists and is not a zombie.
inline bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = content.rfind(')');
  return close == std::string::npos || content.size() < close + 3 || content[close + 2] != 'Z';
}

inline bool WaitGone(pid_t pid, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!ProcessAlive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !ProcessAlive(pid);
}

}  // namespace roll::testing
