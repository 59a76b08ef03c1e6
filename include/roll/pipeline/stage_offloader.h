#pragma once
// StageOffloader: offload and onload of colocated model clusters around
// each stage of a step (docs/placement.md). Before a stage the pipeline
// names the roles that stage needs on the device; every other offloadable
// cluster gives its memory up first, then the named ones that had given it
// up take it back. A cluster is offloadable when offload is enabled
// (offload_states: always, or auto on cuda) and it shares a device with
// another cluster.
//
// Not thread-safe. It holds no restart logic: a pipeline that replaces dead
// generators runs the activation again (see BasePipeline::Activate).

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"
#include "roll/pipeline/job_clusters.h"

namespace roll {

// Which clusters an activation offloads and which it loads, from the
// offloadable clusters, those offloaded now, and the roles to activate.
// Pure; the order of `offloadable` is kept.
struct ActivationPlan {
  std::vector<std::string> offload, load;
};
ActivationPlan PlanActivation(const std::vector<std::string>& offloadable,
                              const std::set<std::string, std::less<>>& offloaded,
                              const std::vector<std::string>& active);

class StageOffloader {
 public:
  explicit StageOffloader(JobClusters* clusters) : clusters_(clusters) {}

  // offload_states: always, or auto with device_type cuda.
  bool enabled() const;
  // Makes `active` (roles; absent ones ignored) the clusters that hold
  // device memory. Adds the time to metrics["time/offload_s"] and, per
  // cluster offloaded, its bytes to metrics["offload/<cluster>_mb"]. A
  // no-op when offload is disabled.
  absl::Status Activate(const std::vector<std::string>& active, std::map<std::string, double>* metrics);
  // After the clusters were restarted: they start resident.
  void Reset() { offloaded_.clear(); }
  const std::set<std::string, std::less<>>& offloaded() const { return offloaded_; }

 private:
  struct Offloadable {
    ClusterBase* cluster;
    const MethodSpec* offload;
    const MethodSpec* load;
  };
  std::vector<Offloadable> OffloadableClusters() const;

  JobClusters* clusters_;  // not owned
  std::set<std::string, std::less<>> offloaded_;  // roles whose states are offloaded
};

}  // namespace roll
