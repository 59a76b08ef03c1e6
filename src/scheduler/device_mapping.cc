#include "roll/scheduler/device_mapping.h"

#include <sched.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace roll {

int HostCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::StatusOr<DeviceMapping> DeviceMapping::Build(const PipelineConfig& cfg, int host_cores) {
  DeviceMapping m;
  m.num_nodes_ = cfg.num_nodes;
  m.device_type_ = cfg.device_type;
  m.threads_per_slot_ = std::max(1, cfg.cpu_threads_per_slot);
  if (m.num_nodes_ < 1) return absl::InvalidArgumentError("num_nodes must be >= 1");
  if (cfg.num_gpus_per_node > 0) {
    m.devices_per_node_ = cfg.num_gpus_per_node;
  } else if (cfg.device_type == DeviceType::kCuda) {
    return absl::InvalidArgumentError("device_type cuda needs num_gpus_per_node (the GPUs of each node)");
  } else {
    m.devices_per_node_ = std::max(1, host_cores / m.threads_per_slot_);
  }
  const int total = m.num_nodes_ * m.devices_per_node_;
  const std::string resources =
      absl::StrCat(total, " devices (num_nodes=", m.num_nodes_, " x num_gpus_per_node=", m.devices_per_node_,
                   cfg.num_gpus_per_node > 0 ? "" : absl::StrCat(", derived from ", host_cores, " cores"), ")");

  int deviceless = 0;  // spreads clusters without devices over the nodes
  for (const WorkerConfig* role : cfg.PresentRoles()) {
    const int g = role->num_gpus_per_worker;
    const bool has_devices = !role->device_mapping.empty();
    for (int idx : role->device_mapping) {
      if (idx < 0 || idx >= total) {
        return absl::InvalidArgumentError(absl::StrCat(role->name, ".device_mapping: device ", idx,
                                                       " is beyond the job's ", resources));
      }
    }
    for (int r = 0; r < role->world_size; ++r) {
      WorkerPlacement w;
      w.cluster = role->name;
      w.rank = r;
      if (has_devices) {
        w.devices.assign(role->device_mapping.begin() + r * g, role->device_mapping.begin() + (r + 1) * g);
        std::set<int> nodes;
        for (int d : w.devices) nodes.insert(d / m.devices_per_node_);
        if (nodes.size() > 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              role->name, " rank ", r, ": devices [", absl::StrJoin(w.devices, ", "), "] span nodes ",
              absl::StrJoin(nodes, " and "), "; a worker must sit on one node (num_gpus_per_worker=", g,
              ", num_gpus_per_node=", m.devices_per_node_, ")"));
        }
        w.node = *nodes.begin();
        for (int d : w.devices) w.local_devices.push_back(d % m.devices_per_node_);
        w.threads = m.device_type_ == DeviceType::kCpu ? g * m.threads_per_slot_ : std::max(1, cfg.runtime.threads_per_worker);
      } else {
        w.node = deviceless++ % m.num_nodes_;
        // No device: runtime.threads_per_worker, or the host's cores shared
        // by the cluster's workers.
        w.threads = cfg.runtime.threads_per_worker > 0 ? cfg.runtime.threads_per_worker
                                                       : std::max(1, host_cores / std::max(1, role->world_size));
      }
      m.workers_.push_back(std::move(w));
    }
  }
  // Colocation: workers sharing a device.
  std::map<int, std::vector<size_t>> by_device;
  for (size_t i = 0; i < m.workers_.size(); ++i) {
    for (int d : m.workers_[i].devices) by_device[d].push_back(i);
  }
  for (size_t i = 0; i < m.workers_.size(); ++i) {
    std::set<size_t> others;
    for (int d : m.workers_[i].devices) {
      for (size_t j : by_device[d]) {
        if (j != i) others.insert(j);
      }
    }
    for (size_t j : others) {
      m.workers_[i].colocated_with.push_back(absl::StrCat(m.workers_[j].cluster, ":", m.workers_[j].rank));
    }
  }
  return m;
}

const WorkerPlacement* DeviceMapping::Find(std::string_view cluster, int rank) const {
  for (const WorkerPlacement& w : workers_) {
    if (w.cluster == cluster && w.rank == rank) return &w;
  }
  return nullptr;
}

std::vector<std::string> DeviceMapping::ColocatedClusters(std::string_view cluster) const {
  std::set<std::string> out;
  for (const WorkerPlacement& w : workers_) {
    if (w.cluster != cluster) continue;
    for (const std::string& other : w.colocated_with) {
      std::string name = other.substr(0, other.rfind(':'));
      if (name != cluster) out.insert(name);
    }
  }
  return {out.begin(), out.end()};
}

std::string DeviceMapping::Table() const {
  std::string out = absl::StrFormat("# %d node(s) x %d %s device(s)%s\n", num_nodes_, devices_per_node_,
                                    std::string(ToString(device_type_)),
                                    device_type_ == DeviceType::kCpu ? absl::StrCat(", ", threads_per_slot_, " thread(s) per slot")
                                                          : std::string());
  size_t width = 7;
  for (const WorkerPlacement& w : workers_) width = std::max(width, w.cluster.size());
  out += absl::StrFormat("%-*s  %4s  %4s  %-12s  %7s  %s\n", static_cast<int>(width), "cluster", "rank", "node",
                         "devices", "threads", "colocated with");
  for (const WorkerPlacement& w : workers_) {
    const std::string devices = w.devices.empty() ? "-" : absl::StrJoin(w.devices, ",");
    const std::string colo = w.colocated_with.empty() ? "-" : absl::StrJoin(w.colocated_with, " ");
    out += absl::StrFormat("%-*s  %4d  %4d  %-12s  %7d  %s\n", static_cast<int>(width), w.cluster, w.rank, w.node,
                           devices, w.threads, colo);
  }
  return out;
}

}  // namespace roll
