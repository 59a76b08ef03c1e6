#pragma once
// Launchers of a multi-node job. AgentLauncher starts and watches the
// workers of one remote node through that node's `roll agent`;
// NodeLauncher routes each launch to the launcher of the node it is placed
// on (node 0: the controller's own launcher). Private to the controller.

#include <map>
#include <memory>
#include <string>

#include "roll/controller/launcher.h"
#include "worker.grpc.pb.h"

namespace roll {

// The job token in the first line of `path` (at least 16 characters);
// InvalidArgument naming `what` and the file otherwise.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what);

class AgentLauncher : public Launcher {
 public:
  AgentLauncher(int node, std::string agent_address, std::string token);

  // Asks the agent to end its workers and exit; best effort.
  void ShutdownAgent();

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override;
  // nullopt also while the agent cannot be reached: the cluster's health
  // checks of the worker itself decide whether it is dead.
  std::optional<std::string> ExitStatus(pid_t pid) override;
  void Signal(pid_t pid, int signal) override;
  bool WaitExit(pid_t pid, double timeout_s) override;

 private:
  const int node_;
  const std::string address_;
  const std::string token_;
  std::unique_ptr<rpc::Agent::Stub> stub_;
  std::mutex mu_;
  std::map<pid_t, std::string> exited_;
};

class NodeLauncher : public Launcher {
 public:
  // `local` (not owned) starts the workers of node 0.
  explicit NodeLauncher(Launcher* local) : local_(local) {}
  void AddNode(int node, std::unique_ptr<AgentLauncher> launcher);
  // Shuts every agent down.
  void ShutdownAgents();

  // Ids of remote workers are NodeProcessId(node, pid).
  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override;
  std::optional<std::string> ExitStatus(pid_t id) override;
  void Signal(pid_t id, int signal) override;
  bool WaitExit(pid_t id, double timeout_s) override;

 private:
  Launcher* Route(pid_t id);
  Launcher* const local_;
  std::map<int, std::unique_ptr<AgentLauncher>> nodes_;  // filled before the first launch
};

}  // namespace roll
