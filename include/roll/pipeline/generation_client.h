#pragma once
// ClusterGenerationClient: the RolloutScheduler's generation client over
// actor_infer (submit / poll / abort, request by request), for every
// pipeline that generates on the generation engine. When generators die it
// has them replaced (the restarter) and sends what they owed again, so no
// sample is lost or counted twice. Not thread-safe; the cluster must
// outlive it.

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "roll/common/config.h"
#include "roll/controller/cluster.h"
#include "roll/scheduler/rollout_scheduler.h"
#include "roll/worker/rl_workers.h"

namespace roll {

// actor_infer's generating_args as sampling parameters, for every pipeline
// that samples from the generators: temperature (0 when do_sample is off),
// top_p, top_k, max_new_tokens up to response_length, n =
// num_return_sequences_in_group. A pipeline sets what its rollout differs
// in (the agentic turn budget, validation's temperature).
GenParams RolloutGenParams(const PipelineConfig& config);

class ClusterGenerationClient : public GenerationClient {
 public:
  // `restart` replaces dead generators in place (new processes in their
  // ranks that generate with the current weights) while the other ranks keep
  // their requests; none: a death fails the call.
  explicit ClusterGenerationClient(Cluster<ActorApi>* infer, WorkerRestarter restart = nullptr)
      : infer_(infer), restart_(std::move(restart)) {}
  int num_workers() const override { return infer_->world_size(); }
  absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker,
                      const GenParams& params) override;
  // Samples of requests this client submitted, each (request, sample index)
  // at most once.
  absl::StatusOr<std::vector<SampleResult>> Poll(absl::Duration wait) override;
  absl::Status Abort(const std::vector<std::string>& keys) override;
  // Requests with samples still to come.
  int64_t in_flight() const { return static_cast<int64_t>(pending_.size()); }

 private:
  struct Pending {
    GenRequest request;
    GenParams params;
    int worker = 0;
    std::set<int64_t> returned;  // sample indices already handed out
    bool aborted = false;
  };
  // OK, the error, or Recover's result when only dead ranks failed.
  absl::Status Handle(const CallOutcome& outcome);
  CallHandle StartSubmit(const std::vector<std::vector<GenRequest>>& per_worker, const GenParams& params);
  // A call failed only on dead ranks: replaces them and submits their
  // unfinished requests to the new ones again (aborted ones are aborted
  // again); the other ranks keep theirs. A rank that dies meanwhile is
  // replaced too and what it owed is sent again, until everything owed was
  // accepted. Samples already returned are dropped when they come back a
  // second time, so none is lost or counted twice; sampling is seeded per
  // request and sample, so a retried sample draws what it would have.
  absl::Status Recover(absl::Status why);
  // Submits `owed` (request keys), one call per sampling setting; a key
  // leaves the set once its rank accepted it.
  CallOutcome ResubmitOwed(std::set<std::string>* owed);

  Cluster<ActorApi>* infer_;  // not owned
  WorkerRestarter restart_;
  std::map<std::string, Pending> pending_;  // by request key
};

}  // namespace roll
