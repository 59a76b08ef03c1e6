#pragma once
// ModelUpdate: the versioned model update from the trainers to the
// generators, and the collectives it runs over. Trainer rank 0 broadcasts
// its weights to every generator over a weight-sync group (c10d: NCCL on
// GPUs, Gloo on CPUs); generators that share a device with trainer rank 0
// read them from its shared weights region instead (host shared memory),
// when colocated_weight_update is on. Each update carries a version (the
// step that produced the weights); version() is the one the generators hold.
//
// Not thread-safe. The clusters must outlive it.

#include <cstdint>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/pipeline/job_clusters.h"
#include "roll/scheduler/device_mapping.h"

namespace roll {

// Per actor_infer rank: it shares a device (CPU slot or GPU) with
// actor_train rank 0, and so a node, where processes can map one another's
// memory. With `honor_flag`, false everywhere when colocated_weight_update
// is off.
std::vector<bool> GeneratorsColocatedWithTrainer(const PipelineConfig& config, const DeviceMapping& placement,
                                                 bool honor_flag = true);
// Before any worker starts: generators on trainer rank 0's GPU cannot take
// the update over NCCL (one rank per GPU), so colocated_weight_update must
// be on there. The error names the rank and the fix.
absl::Status CheckWeightSyncPlacement(const PipelineConfig& config, const DeviceMapping& placement);

class ModelUpdate {
 public:
  explicit ModelUpdate(JobClusters* clusters) : clusters_(clusters) {}

  // After the clusters started: the shared weights region (when a generator
  // is colocated), then every cluster joins its collectives: the trainers'
  // and the critic's data-parallel groups and the weight-sync group.
  // `total_updates` (optimizer steps of the whole run) goes to the trainers
  // for their learning-rate schedule.
  absl::Status Setup(int64_t total_updates);
  // After actor_infer ranks were replaced: trainer rank 0 and every
  // generator form a new weight-sync group (the data-parallel groups stay).
  absl::Status Rejoin();
  // Sends the trainers' weights to every generator as `version`. Both sides
  // finish before it returns (a dead receiver fails the sender too), so a
  // retry never meets a transfer still running.
  absl::Status Sync(int64_t version);
  // The version the generators hold (0 before the first Sync).
  int64_t version() const { return version_; }

 private:
  absl::Status Join(bool all);

  JobClusters* clusters_;  // not owned
  std::string weights_path_;  // actor_train rank 0's shared weights region, or ""
  int64_t total_updates_ = 0;
  int formed_ = 0;  // formations so far: each names its groups anew (a name is used once per store)
  int64_t version_ = 0;
};

}  // namespace roll
