#include "roll/pipeline/stage_offloader.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#include "roll/worker/batch_keys.h"

namespace roll {

ActivationPlan PlanActivation(const std::vector<std::string>& offloadable,
                              const std::set<std::string, std::less<>>& offloaded,
                              const std::vector<std::string>& active) {
  ActivationPlan plan;
  for (const std::string& c : offloadable) {
    const bool wanted = std::find(active.begin(), active.end(), c) != active.end();
    if (!wanted && !offloaded.count(c)) plan.offload.push_back(c);
    if (wanted && offloaded.count(c)) plan.load.push_back(c);
  }
  return plan;
}

bool StageOffloader::enabled() const {
  const PipelineConfig& cfg = clusters_->config();
  if (cfg.offload_states == OffloadStates::kAuto) return clusters_->placement().device_type() == DeviceType::kCuda;
  return cfg.offload_states == OffloadStates::kAlways;
}

std::vector<StageOffloader::Offloadable> StageOffloader::OffloadableClusters() const {
  std::vector<Offloadable> out;
  if (!enabled()) return out;
  const DeviceMapping& m = clusters_->placement();
  for (ClusterBase* c : clusters_->ModelClusters()) {
    if (m.ColocatedClusters(c->name()).empty()) continue;
    if (c == clusters_->critic()) {
      out.push_back({c, &critic::kOffloadStates, &critic::kLoadStates});
    } else {
      out.push_back({c, &actor::kOffloadStates, &actor::kLoadStates});
    }
  }
  return out;
}

absl::Status StageOffloader::Activate(const std::vector<std::string>& active, std::map<std::string, double>* m) {
  const std::vector<Offloadable> all = OffloadableClusters();
  if (all.empty()) return absl::OkStatus();
  const auto t = std::chrono::steady_clock::now();
  std::vector<std::string> names;
  for (const Offloadable& o : all) names.push_back(o.cluster->name());
  const ActivationPlan plan = PlanActivation(names, offloaded_, active);
  auto find = [&](const std::string& name) {
    return &*std::find_if(all.begin(), all.end(), [&](const Offloadable& o) { return o.cluster->name() == name; });
  };
  std::vector<std::pair<const Offloadable*, CallHandle>> calls;
  for (const std::string& name : plan.offload) {
    const Offloadable* o = find(name);
    // Counted as offloaded before the call: whatever part of it succeeds,
    // the next activation sends load_states (a no-op where nothing went).
    offloaded_.insert(name);
    calls.emplace_back(o, o->cluster->Call(*o->offload, Batch()));
  }
  absl::Status first;
  for (auto& [o, h] : calls) {
    if (absl::Status s = h.WaitAll(); !s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    ROLL_ASSIGN_OR_RETURN(std::vector<Batch> replies, h.Replies());
    double bytes = 0;
    for (const Batch& r : replies) {
      double b = 0;
      if (absl::SimpleAtod(r.MetaOr(keys::kOffloadedBytes, "0"), &b)) bytes += b;
    }
    (*m)[absl::StrCat("offload/", o->cluster->name(), "_mb")] = bytes / (1 << 20);
  }
  ROLL_RETURN_IF_ERROR(first);
  calls.clear();
  for (const std::string& name : plan.load) {
    const Offloadable* o = find(name);
    calls.emplace_back(o, o->cluster->Call(*o->load, Batch()));
  }
  for (auto& [o, h] : calls) {
    ROLL_RETURN_IF_ERROR(h.Wait());
    offloaded_.erase(o->cluster->name());
  }
  (*m)["time/offload_s"] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return absl::OkStatus();
}

}  // namespace roll
