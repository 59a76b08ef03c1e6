#pragma once
// The RolloutScheduler's clients over Clusters: generation on actor_infer
// (submit / poll / abort, request by request) and rewards routed by domain
// tag to the rewards.<domain> clusters, scored asynchronously.

#include <functional>
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
  // Replaces the cluster of domain `d` after one of its workers died
  // (`why`); returns the new cluster, or an error when no restart is left.
  using Restarter = std::function<absl::StatusOr<Cluster<RewardApi>*>(size_t d, const absl::Status& why)>;
  explicit ClusterRewardClient(std::vector<Domain> domains, Restarter restart = nullptr)
      : domains_(std::move(domains)), restart_(std::move(restart)) {}
  absl::Status Submit(std::vector<SampleResult> samples) override;
  absl::StatusOr<std::vector<SampleResult>> Poll(bool block) override;
  int64_t pending() const override { return static_cast<int64_t>(inflight_.size()); }

 private:
  absl::StatusOr<size_t> Route(const std::string& tag) const;
  struct InFlight {
    size_t domain = 0;
    Batch request;
    CallHandle handle;
    std::vector<SampleResult> samples;
  };
  // A failed call whose cluster lost a worker: restarts that cluster and
  // sends every request in flight to it again (scores are pure functions
  // of the sample, so a retry neither loses nor double-counts a sample).
  absl::Status Recover(InFlight failed, const absl::Status& why);
  std::vector<Domain> domains_;
  Restarter restart_;
  std::vector<InFlight> inflight_;
};

}  // namespace roll
