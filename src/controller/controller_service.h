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

#include "absl/time/time.h"
#include "roll/common/status.h"
#include "worker.grpc.pb.h"

namespace roll {

struct Registration {
  std::string address;
  pid_t pid = 0;
  std::string worker_type;
};

class ControllerService final : public rpc::Controller::CallbackService {
 public:
  explicit ControllerService(std::string token) : token_(std::move(token)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const rpc::RegisterRequest* req,
                                     rpc::RegisterReply* reply) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const rpc::PingRequest* req,
                                 rpc::PingReply* reply) override;

  // Forgets earlier registrations of `cluster` (before a (re)start).
  void Reset(const std::string& cluster);
  // Waits until ranks 0..world_size-1 of `cluster` registered. `check` is
  // called every few milliseconds and may abort the wait with an error (for
  // example when a launched worker already exited).
  absl::StatusOr<std::map<int, Registration>> WaitForCluster(const std::string& cluster, int world_size,
                                                             absl::Duration timeout,
                                                             const std::function<absl::Status()>& check);

 private:
  const std::string token_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::map<int, Registration>> registered_;
};

}  // namespace roll
