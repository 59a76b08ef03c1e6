#pragma once
// AutoDeviceMapping: where every worker of every cluster runs. A device is a
// global index: on `device_type: cuda` a GPU, on `cpu` a CPU slot of
// `cpu_threads_per_slot` threads, so every placement and colocation path
// runs on machines without GPUs. Device i lives on node
// i / num_gpus_per_node. A cluster's `device_mapping` lists its devices in
// order and worker r takes `num_gpus_per_worker` of them; clusters whose
// devices overlap are colocated (they time-share those devices), disjoint
// ones run side by side. Clusters without a device_mapping (reward,
// environment workers) need no device and are spread over the nodes.
// docs/placement.md describes the rules and the table.
//
// Immutable once built; thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

// The cores this process may run on (at least 1): its CPU affinity (taskset,
// a cgroup cpuset, a Slurm binding), else the machine's. What a local job's
// CPU slots divide, and the default thread count of a one-process command.
int HostCores();

struct WorkerPlacement {
  std::string cluster;              // role path: "actor_train", "rewards.math"
  int rank = 0;
  int node = 0;
  std::vector<int> devices;         // global device indices; empty: none
  std::vector<int> local_devices;   // the same, numbered within the node
  int threads = 1;                  // LibTorch intra-op threads of the worker
  std::vector<std::string> colocated_with;  // "cluster:rank" sharing a device
};

class DeviceMapping {
 public:
  // Places every present role of `config`. `host_cores` is what
  // num_gpus_per_node 0 derives from on cpu (the controller passes the
  // machine's cores). InvalidArgument naming the cluster, rank, key and
  // numbers for: a device index beyond the job's devices, a worker whose
  // devices span nodes, device_type cuda without num_gpus_per_node.
  static absl::StatusOr<DeviceMapping> Build(const PipelineConfig& config, int host_cores);

  const std::vector<WorkerPlacement>& workers() const { return workers_; }
  // The placement of (cluster, rank), or nullptr.
  const WorkerPlacement* Find(std::string_view cluster, int rank) const;
  // Clusters sharing at least one device with `cluster`, sorted.
  std::vector<std::string> ColocatedClusters(std::string_view cluster) const;

  int num_nodes() const { return num_nodes_; }
  int devices_per_node() const { return devices_per_node_; }
  int threads_per_slot() const { return threads_per_slot_; }
  DeviceType device_type() const { return device_type_; }

  // The placement table (`roll config --placement`): a header line with the
  // resources, then one row per worker: cluster, rank, node, devices,
  // threads, colocated with.
  std::string Table() const;

 private:
  std::vector<WorkerPlacement> workers_;
  int num_nodes_ = 1;
  int devices_per_node_ = 1;
  int threads_per_slot_ = 1;
  DeviceType device_type_ = DeviceType::kCpu;
};

}  // namespace roll
