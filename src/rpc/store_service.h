#pragma once
// The rendezvous store of the job's collectives over the control plane:
// the server half (StoreService, hosted by the controller's gRPC server or a
// StoreHost); the client half is RemoteStore (store_client.h). Ranks find one
// another through it (c10d's Gloo rendezvous, the NCCL unique id, the
// "every rank joined" check). Being an ordinary control-plane service, it
// carries the job token on every call, listens only where its server binds
// and runs over TLS when the control plane does. Private to the library.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rpc/store_client.h"
#include "worker.grpc.pb.h"

namespace roll::rpc {

// Thread-safe; handlers never block a gRPC thread (waiting calls are parked
// and finished by the write that completes them or by a timer thread).
class StoreService final : public rpc::Store::CallbackService {
 public:
  explicit StoreService(std::string token);
  // Close()s.
  ~StoreService() override;
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;

  // Finishes every parked call with UNAVAILABLE and refuses later ones.
  // Call before shutting the hosting server down (a parked call would
  // otherwise hold the shutdown until its deadline).
  void Close();

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const rpc::StoreSetRequest* req,
                                rpc::StoreSetReply* reply) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx, const rpc::StoreCompareSetRequest* req,
                                       rpc::StoreValueReply* reply) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const rpc::StoreGetRequest* req,
                                rpc::StoreValueReply* reply) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const rpc::StoreAddRequest* req,
                                rpc::StoreCountReply* reply) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const rpc::StoreWaitRequest* req,
                                 rpc::StoreBoolReply* reply) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const rpc::StoreDeleteRequest* req,
                                   rpc::StoreBoolReply* reply) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx, const rpc::StoreNumKeysRequest* req,
                                    rpc::StoreCountReply* reply) override;

 private:
  using Clock = std::chrono::steady_clock;
  // A Get (one key, `value` filled) or a Wait (all keys) waiting for writes.
  struct Parked {
    std::vector<std::string> keys;
    Clock::time_point deadline;
    grpc::ServerUnaryReactor* reactor = nullptr;
    rpc::StoreValueReply* value = nullptr;  // Get
    rpc::StoreBoolReply* present = nullptr;  // Wait
  };
  struct Finished {
    grpc::ServerUnaryReactor* reactor;
    grpc::Status status;
  };

  // OK, or the status to finish the call with (token, closed).
  grpc::Status Admit(grpc::CallbackServerContext* ctx) const;
  bool HasAllLocked(const std::vector<std::string>& keys) const;
  // Fills the replies of parked calls whose keys now exist and moves them
  // to `done`.
  void WakeLocked(std::vector<Finished>* done);
  // Parks `p` until its keys exist or `wait_s` passes; finishes it now when
  // they exist already or wait_s is 0.
  grpc::ServerUnaryReactor* ParkOrFinish(Parked p, double wait_s);
  static void FinishAll(std::vector<Finished>& done);
  void TimerLoop();

  const std::string token_;
  mutable std::mutex mu_;
  std::condition_variable timer_cv_;
  bool closed_ = false;
  std::map<std::string, std::string> data_;
  std::vector<Parked> parked_;
  std::thread timer_;
};

}  // namespace roll::rpc
