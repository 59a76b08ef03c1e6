#pragma once
// Controller: the single process that drives a job. It holds the resolved
// config and the job token, hosts the registration/heartbeat service that
// workers report to and the rendezvous store of their collectives (both at
// address(), behind the token), and starts Clusters of workers through a
// Launcher.
// Destroying it shuts down every cluster it started that is still alive.
// Thread-safe.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/config.h"
#include "roll/controller/cluster.h"
#include "roll/controller/launcher.h"
#include "roll/scheduler/device_mapping.h"

namespace roll {

struct ControllerOptions {
  // Process launcher; nullptr: a LocalLauncher owned by the controller.
  Launcher* launcher = nullptr;
  // Role sections beyond the built-in ones (passed on to workers).
  LoadOptions load;
  // Token for this job; empty: a fresh random one.
  std::string token;
};

class Controller {
 public:
  class Impl;
  static absl::StatusOr<std::unique_ptr<Controller>> Create(PipelineConfig config,
                                                            ControllerOptions options = {});
  ~Controller();

  const PipelineConfig& config() const;
  const std::string& token() const;
  // host:port of the controller service and of the collectives' store.
  const std::string& address() const;
  Launcher& launcher();
  // Where every worker of the job is placed (AutoDeviceMapping).
  const DeviceMapping& placement() const;

  // Starts the workers of role section `role` (its world_size, or the size
  // of its device_mapping) as `worker_type`, waits until all registered and
  // initialized, and returns the cluster.
  absl::StatusOr<std::unique_ptr<ClusterBase>> StartCluster(std::string_view role,
                                                            std::string_view worker_type);
  template <class Api>
  absl::StatusOr<std::unique_ptr<Cluster<Api>>> StartCluster(std::string_view role) {
    ROLL_ASSIGN_OR_RETURN(std::unique_ptr<ClusterBase> base, StartCluster(role, Api::kType));
    return std::make_unique<Cluster<Api>>(std::move(*base));
  }

  // Replaces one worker of `cluster` (one this controller started), dead or
  // not: kills its process if still there, starts a new one with the same
  // rank, placement and arguments, waits until it registered and
  // initialized, and points the cluster at it. The other ranks keep running
  // and keep their state; whatever the old worker held (collective groups,
  // model state beyond the config's) is the caller's to rebuild.
  absl::Status RestartWorker(ClusterBase& cluster, int rank);
  // RestartWorker for every dead worker of `cluster`; returns their ranks.
  absl::StatusOr<std::vector<int>> RestartDeadWorkers(ClusterBase& cluster);

 private:
  explicit Controller(std::unique_ptr<Impl> impl);
  absl::StatusOr<std::unique_ptr<ClusterBase::Impl>> StartClusterImpl(std::string_view role,
                                                                      std::string_view worker_type);
  // Starts the process of rank `rank` (no registration wait).
  absl::StatusOr<WorkerInfo> LaunchWorker(const std::string& name, const std::string& type, int world, int rank);
  // Waits until the launched workers registered and fills in their addresses.
  absl::Status WaitRegistered(const std::string& name, std::vector<WorkerInfo>* infos);
  std::unique_ptr<Impl> impl_;
};

}  // namespace roll
