#pragma once
// SpawnProcess: fork and exec a child with an environment overlay, its
// output in a log file, stdin from /dev/null, and a signal when its parent
// dies (PR_SET_PDEATHSIG; it fires when the *thread* that forked ends, see
// common/fork_thread.h). What the controller's launcher and the external
// environments' server start share.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {
namespace common_internal {

struct SpawnOptions {
  std::vector<std::string> argv;           // argv[0] is the executable path
  std::map<std::string, std::string> env;  // set over this process's environment
  std::string log_path;                    // stdout and stderr; empty: inherited
  bool truncate_log = false;               // default: append
  bool new_process_group = false;          // the child leads a group of its own
  int death_signal = 9;                    // SIGKILL: sent when the parent dies
};

// InternalError naming the step (log file, fork) that failed.
absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options);

}  // namespace common_internal
}  // namespace roll
