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

void ControllerService::Reset(const std::string& cluster) {
  std::lock_guard<std::mutex> lock(mu_);
  registered_.erase(cluster);
}

absl::StatusOr<std::map<int, Registration>> ControllerService::WaitForCluster(
    const std::string& cluster, int world_size, absl::Duration timeout,
    const std::function<absl::Status()>& check) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto& regs = registered_[cluster];
    int have = 0;
    for (int r = 0; r < world_size; ++r) have += regs.count(r);
    if (have == world_size) return regs;
    lock.unlock();
    ROLL_RETURN_IF_ERROR(check());
    lock.lock();
    if (absl::Now() >= deadline) {
      std::string missing;
      for (int r = 0; r < world_size; ++r) {
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
