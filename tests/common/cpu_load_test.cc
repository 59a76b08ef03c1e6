// LoadAwareThreads: fewer threads while other processes keep the cores
// busy; the configured count when told not to follow the load.

#include "roll/common/cpu_load.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace roll {
namespace {

int AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

TEST(LoadAwareThreadsTest, NotFollowingTheLoadKeepsTheConfiguredCount) {
  LoadAwareThreads t(3, /*follow_load=*/false);
  EXPECT_EQ(t.Threads(0.0), 3);
  EXPECT_EQ(t.why(), "3 thread(s) as configured");
  EXPECT_EQ(LoadAwareThreads(0, true).Threads(0.0), 1);  // at least one
}

TEST(LoadAwareThreadsTest, OneThreadWhileOtherProcessesKeepEveryCoreBusy) {
  const int cores = AllowedCores();
  std::vector<pid_t> busy;
  for (int i = 0; i < cores; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (volatile uint64_t x = 0;; x = x + 1) {
      }
    }
    ASSERT_GT(pid, 0);
    busy.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the loops are running
  LoadAwareThreads t(std::max(2, cores), /*follow_load=*/true);
  // At once, from the threads running now, and again over a measured interval.
  EXPECT_EQ(t.Threads(), 1) << t.why();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const int measured = t.Threads(0.5);
  const std::string why = t.why();
  for (pid_t pid : busy) kill(pid, SIGKILL);
  for (pid_t pid : busy) waitpid(pid, nullptr, 0);
  EXPECT_EQ(measured, 1) << why;
  EXPECT_NE(why.find("other processes keep"), std::string::npos) << why;
}

}  // namespace
}  // namespace roll
