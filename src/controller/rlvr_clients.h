#pragma once
// The RolloutScheduler's clients over Clusters: generation on actor_infer
// (submit / poll / abort, request by request) and rewards routed by domain
// tag to the rewards.<domain> clusters, scored asynchronously.

#include <memory>
#include <string>
#include <vector>

#include "roll/common/config.h"
#include "roll/controller/cluster.h"
#include "roll/scheduler/rollout_scheduler.h"
#include "roll/worker/rl_workers.h"

namespace roll {

class ClusterGenerationClient : public GenerationClient {
 public:
  explicit ClusterGenerationClient(Cluster<ActorApi>* infer) : infer_(infer) {}
  int num_workers() const override { return infer_->world_size(); }
  absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker,
                      const GenParams& params) override;
  absl::StatusOr<std::vector<SampleResult>> Poll(absl::Duration wait) override;
  absl::Status Abort(const std::vector<std::string>& keys) override;

 private:
  Cluster<ActorApi>* infer_;  // not owned
};

class ClusterRewardClient : public RewardClient {
 public:
  struct Domain {
    std::string name;
    std::vector<std::string> tags;  // empty: every tag no other domain claims
    Cluster<RewardApi>* cluster = nullptr;
  };
  explicit ClusterRewardClient(std::vector<Domain> domains) : domains_(std::move(domains)) {}
  absl::Status Submit(std::vector<SampleResult> samples) override;
  absl::StatusOr<std::vector<SampleResult>> Poll(bool block) override;
  int64_t pending() const override { return static_cast<int64_t>(inflight_.size()); }

 private:
  absl::StatusOr<size_t> Route(const std::string& tag) const;
  struct InFlight {
    CallHandle handle;
    std::vector<SampleResult> samples;
  };
  std::vector<Domain> domains_;
  std::vector<InFlight> inflight_;
};

}  // namespace roll
