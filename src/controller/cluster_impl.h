#pragma once
// Private state of a Cluster: one client per worker (channel and stub made
// once), the health monitor, and the bookkeeping that lets a worker's death
// fail exactly the calls that were waiting on it.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "roll/controller/cluster.h"
#include "roll/controller/launcher.h"
#include "worker.grpc.pb.h"

namespace roll {

struct ClusterSettings {
  std::string name;
  std::string worker_type;
  std::string token;
  absl::Duration call_timeout = absl::Seconds(600);
  absl::Duration health_interval = absl::Seconds(1);
  absl::Duration worker_timeout = absl::Seconds(10);
};

class ClusterBase::Impl {
 public:
  struct Worker {
    WorkerInfo info;
    std::unique_ptr<rpc::Worker::Stub> stub;
    // Guarded by Impl::mu_.
    std::set<grpc::ClientContext*> in_flight;
    absl::Time last_healthy;
    bool health_pending = false;
  };

  Impl(ClusterSettings settings, Launcher* launcher, std::vector<WorkerInfo> workers);
  ~Impl();

  const ClusterSettings& settings() const { return s_; }
  int world_size() const { return static_cast<int>(workers_.size()); }
  std::vector<WorkerInfo> workers() const;

  CallHandle Start(const MethodSpec& method, std::vector<Batch> inputs, absl::Duration timeout);
  // Runs Initialize on `ranks` (every worker after the start, a replaced one
  // later); used by the controller.
  absl::Status Initialize(const std::vector<int>& ranks, const std::string& config_yaml,
                          const std::vector<std::string>& extra_roles, absl::Duration timeout);
  // Puts a new process in the place of dead rank `info.rank`: calls go to it
  // from now on and the monitor watches it. Calls still in flight to the
  // old one keep their bookkeeping until they complete.
  void ReplaceWorker(WorkerInfo info);
  // Marks `rank` dead and cancels its in-flight calls. Idempotent. With
  // `pid`, only while that process is the rank's (not after a replacement).
  void MarkDead(int rank, const std::string& reason, pid_t pid = 0);
  void StartMonitor();
  absl::Status Shutdown();

  // "cluster 'x' rank 1 (pid 42, 127.0.0.1:5000)"
  std::string Describe(int rank) const;

 private:
  std::string DescribeLocked(int rank) const;  // mu_ held
  void MonitorLoop();
  // Error text for a failed RPC, enriched with what is known about the worker.
  // `pid`: the process the call went to (the rank may have a new one since).
  absl::Status AnnotateFailure(int rank, const std::string& method, const grpc::Status& s, pid_t pid);

  const ClusterSettings s_;
  Launcher* const launcher_;
  std::vector<Worker> workers_;
  // Stubs of replaced workers: calls made through them may still complete.
  std::vector<std::unique_ptr<rpc::Worker::Stub>> retired_stubs_;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::thread monitor_;
};

}  // namespace roll
