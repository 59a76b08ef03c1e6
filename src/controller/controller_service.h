#pragma once
// The controller's own gRPC service: workers register their address here at
// start-up and ping it as a heartbeat (a worker exits when its pings fail).
// Thread-safe; handlers run on gRPC threads and only touch the registry.

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "roll/common/status.h"
#include "worker.grpc.pb.h"

namespace roll {

struct Registration {
  std::string address;
  pid_t pid = 0;
  std::string worker_type;
};

// What a `roll agent` told the controller about its node.
struct NodeRegistration {
  int node = 0;
  std::string agent_address;  // host:port of its Agent service
  std::string node_address;   // where the node's workers bind
  std::string hostname;
  int cpu_cores = 0;
  int cuda_devices = 0;
  pid_t pid = 0;
};

class ControllerService final : public rpc::Controller::CallbackService {
 public:
  explicit ControllerService(std::string token) : token_(std::move(token)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const rpc::RegisterRequest* req,
                                     rpc::RegisterReply* reply) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const rpc::PingRequest* req,
                                 rpc::PingReply* reply) override;
  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx, const rpc::RegisterNodeRequest* req,
                                         rpc::RegisterNodeReply* reply) override;

  // Accept agents for nodes 1..num_nodes-1 (before: every agent is refused).
  void ExpectNodes(int num_nodes);
  // Waits until every expected node registered; DeadlineExceeded naming the
  // missing nodes and `key` (the config key of the timeout). `check`, when
  // given, is polled while waiting: its error ends the wait (e.g. the job
  // step that starts the agents ended).
  absl::StatusOr<std::map<int, NodeRegistration>> WaitForNodes(absl::Duration timeout, const std::string& key,
                                                               const std::function<absl::Status()>& check = {});

  // Forgets earlier registrations of `cluster` (before a (re)start), or of
  // its rank `rank` only (before that worker is replaced).
  void Reset(const std::string& cluster);
  void Reset(const std::string& cluster, int rank);
  // Waits until `ranks` of `cluster` registered. `check` is called every few
  // milliseconds and may abort the wait with an error (for example when a
  // launched worker already exited).
  absl::StatusOr<std::map<int, Registration>> WaitForCluster(const std::string& cluster,
                                                             const std::vector<int>& ranks, absl::Duration timeout,
                                                             const std::function<absl::Status()>& check);

 private:
  const std::string token_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::map<int, Registration>> registered_;
  int num_nodes_ = 1;
  std::map<int, NodeRegistration> nodes_;
};

}  // namespace roll
