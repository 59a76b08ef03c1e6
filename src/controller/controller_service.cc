#include "controller/controller_service.h"

#include <chrono>

#include "rpc/rpc_util.h"

namespace roll {

grpc::ServerUnaryReactor* ControllerService::Register(grpc::CallbackServerContext* ctx,
                                                      const rpc::RegisterRequest* req, rpc::RegisterReply*) {
  auto* reactor = ctx->DefaultReactor();
  if (!rpc::HasToken(ctx, token_)) {
    reactor->Finish(rpc::TokenRefused());
    return reactor;
  }
  if (req->cluster().empty() || req->rank() < 0 || req->address().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "register: cluster, rank >= 0 and address are required"));
    return reactor;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    registered_[req->cluster()][req->rank()] =
        Registration{req->address(), static_cast<pid_t>(req->pid()), req->worker_type()};
  }
  cv_.notify_all();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::Ping(grpc::CallbackServerContext* ctx, const rpc::PingRequest*,
                                                  rpc::PingReply*) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(rpc::HasToken(ctx, token_) ? grpc::Status::OK : rpc::TokenRefused());
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::RegisterNode(grpc::CallbackServerContext* ctx,
                                                          const rpc::RegisterNodeRequest* req,
                                                          rpc::RegisterNodeReply* reply) {
  auto* reactor = ctx->DefaultReactor();
  if (!rpc::HasToken(ctx, token_)) {
    reactor->Finish(rpc::TokenRefused());
    return reactor;
  }
  auto refuse = [&](grpc::StatusCode code, const std::string& why) {
    reactor->Finish(grpc::Status(code, absl::StrCat("register node: ", why)));
    return reactor;
  };
  if (req->agent_address().empty() || req->node_address().empty()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, "agent_address and node_address are required");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (num_nodes_ < 2) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  "this job runs on one node (num_nodes=1) and starts no workers through agents");
  }
  int node = req->node_rank();
  if (node < 0) {
    // The lowest free rank; an agent registering again keeps its own.
    for (int n = 1; n < num_nodes_ && node < 0; ++n) {
      auto it = nodes_.find(n);
      if (it == nodes_.end() || it->second.agent_address == req->agent_address()) node = n;
    }
    if (node < 0) {
      return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED,
                    absl::StrCat("all ", num_nodes_ - 1, " agent nodes of this job (num_nodes=", num_nodes_,
                                 ") are registered already"));
    }
  } else if (node == 0 || node >= num_nodes_) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("node rank ", node, " is not an agent node of this job: num_nodes=", num_nodes_,
                               ", node 0 is the controller's own, agents take 1..", num_nodes_ - 1));
  } else if (auto it = nodes_.find(node); it != nodes_.end() && it->second.agent_address != req->agent_address()) {
    return refuse(grpc::StatusCode::ALREADY_EXISTS,
                  absl::StrCat("node ", node, " is registered already by the agent at ", it->second.agent_address));
  }
  nodes_[node] = NodeRegistration{node,
                                  req->agent_address(),
                                  req->node_address(),
                                  req->hostname(),
                                  req->cpu_cores(),
                                  req->cuda_devices(),
                                  static_cast<pid_t>(req->pid())};
  reply->set_node_rank(node);
  cv_.notify_all();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void ControllerService::ExpectNodes(int num_nodes) {
  std::lock_guard<std::mutex> lock(mu_);
  num_nodes_ = num_nodes;
}

absl::StatusOr<std::map<int, NodeRegistration>> ControllerService::WaitForNodes(
    absl::Duration timeout, const std::string& key, const std::function<absl::Status()>& check) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  auto all = [&] { return static_cast<int>(nodes_.size()) >= num_nodes_ - 1; };
  while (!all() && absl::Now() < deadline) {
    const absl::Duration wait = std::min(deadline - absl::Now(), absl::Milliseconds(200));
    cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), all);
    if (all() || !check) continue;
    lock.unlock();
    absl::Status s = check();
    lock.lock();
    if (!s.ok()) return s;
  }
  if (all()) return nodes_;
  std::string missing;
  for (int n = 1; n < num_nodes_; ++n) {
    if (!nodes_.count(n)) absl::StrAppend(&missing, missing.empty() ? "" : ", ", n);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "nodes ", missing, " of num_nodes=", num_nodes_, " did not register within ", absl::FormatDuration(timeout),
      " (", key, "): start `roll agent --controller HOST:PORT --token-file FILE` on each of them"));
}

void ControllerService::Reset(const std::string& cluster) {
  std::lock_guard<std::mutex> lock(mu_);
  registered_.erase(cluster);
}

void ControllerService::Reset(const std::string& cluster, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = registered_.find(cluster); it != registered_.end()) it->second.erase(rank);
}

absl::StatusOr<std::map<int, Registration>> ControllerService::WaitForCluster(
    const std::string& cluster, const std::vector<int>& ranks, absl::Duration timeout,
    const std::function<absl::Status()>& check) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto& regs = registered_[cluster];
    size_t have = 0;
    for (int r : ranks) have += regs.count(r);
    if (have == ranks.size()) return regs;
    lock.unlock();
    ROLL_RETURN_IF_ERROR(check());
    lock.lock();
    if (absl::Now() >= deadline) {
      std::string missing;
      for (int r : ranks) {
        if (!regs.count(r)) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "cluster '", cluster, "': ranks ", missing, " did not register within ",
          absl::FormatDuration(timeout), " (runtime.startup_timeout_s)"));
    }
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

}  // namespace roll
