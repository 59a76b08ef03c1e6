#include "controller/node_launcher.h"

#include <filesystem>
#include <fstream>

#include "rpc/rpc_util.h"

namespace roll {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' holds no token (its first line must have ",
                                                   "at least 16 characters)"));
  }
  return token;
}

AgentLauncher::AgentLauncher(int node, std::string agent_address, std::string token)
    : node_(node),
      address_(std::move(agent_address)),
      token_(std::move(token)),
      stub_(rpc::Agent::NewStub(rpc::MakeChannel(address_))) {}

void AgentLauncher::ShutdownAgent() {
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token_, absl::Seconds(5));
  rpc::ShutdownRequest req;
  rpc::ShutdownReply reply;
  stub_->Shutdown(&ctx, req, &reply);
}

absl::StatusOr<pid_t> AgentLauncher::Launch(const LaunchSpec& spec) {
  rpc::LaunchRequest req;
  for (const auto& a : spec.argv) req.add_argv(a);
  for (const auto& [k, v] : spec.env) (*req.mutable_env())[k] = v;
  req.set_log_name(std::filesystem::path(spec.log_path).filename().string());
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token_, absl::Seconds(30));
  rpc::LaunchReply reply;
  grpc::Status s = stub_->Launch(&ctx, req, &reply);
  if (!s.ok()) {
    return Annotate(rpc::FromGrpc(s), absl::StrCat("launch on node ", node_, " (agent at ", address_, ")"));
  }
  return static_cast<pid_t>(reply.pid());
}

std::optional<std::string> AgentLauncher::ExitStatus(pid_t pid) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = exited_.find(pid); it != exited_.end()) return it->second;
  }
  if (!WaitExit(pid, 0)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  return exited_[pid];
}

bool AgentLauncher::WaitExit(pid_t pid, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exited_.count(pid)) return true;
  }
  rpc::WaitRequest req;
  req.set_pid(pid);
  req.set_timeout_s(timeout_s);
  rpc::WaitReply reply;
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token_, absl::Seconds(timeout_s + 5));
  if (!stub_->Wait(&ctx, req, &reply).ok() || !reply.exited()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  exited_[pid] = absl::StrCat(reply.how(), " on node ", node_);
  return true;
}

void AgentLauncher::Signal(pid_t pid, int signal) {
  rpc::SignalRequest req;
  req.set_pid(pid);
  req.set_signal(signal);
  rpc::SignalReply reply;
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token_, absl::Seconds(5));
  stub_->Signal(&ctx, req, &reply);
}

void NodeLauncher::AddNode(int node, std::unique_ptr<AgentLauncher> launcher) {
  nodes_[node] = std::move(launcher);
}

void NodeLauncher::ShutdownAgents() {
  for (auto& [node, agent] : nodes_) agent->ShutdownAgent();
}

Launcher* NodeLauncher::Route(pid_t id) {
  const int node = NodeOfProcess(id);
  if (node == 0) return local_;
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : it->second.get();
}

absl::StatusOr<pid_t> NodeLauncher::Launch(const LaunchSpec& spec) {
  if (spec.node == 0) return local_->Launch(spec);
  auto it = nodes_.find(spec.node);
  if (it == nodes_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no agent is registered for node ", spec.node));
  }
  ROLL_ASSIGN_OR_RETURN(pid_t pid, it->second->Launch(spec));
  return NodeProcessId(spec.node, pid);
}

// Every launcher below is called with the pid on its own node: PidOnNode(id)
// (on node 0 the id is the pid).
std::optional<std::string> NodeLauncher::ExitStatus(pid_t id) {
  Launcher* l = Route(id);
  if (l == nullptr) return "is not a process of this job";
  return l->ExitStatus(PidOnNode(id));
}

void NodeLauncher::Signal(pid_t id, int signal) {
  if (Launcher* l = Route(id)) l->Signal(PidOnNode(id), signal);
}

bool NodeLauncher::WaitExit(pid_t id, double timeout_s) {
  Launcher* l = Route(id);
  return l == nullptr || l->WaitExit(PidOnNode(id), timeout_s);
}

}  // namespace roll
