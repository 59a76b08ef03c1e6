#pragma once
// The RLVR pipeline (reinforcement learning with verifiable rewards), ROLL's
// step on the Clusters of a config:
//
//   rollout      RolloutScheduler over actor_infer (per-sample requests) and
//                the rewards.<domain> clusters (scores as samples finish)
//   log-probs    old log-probs from actor_train, reference log-probs from
//                `reference` (when present), values from `critic` (GAE)
//   advantages   the configured estimator (docs/algorithms.md)
//   training     critic then actor updates over mini-batches, ppo_epochs times
//   model update actor_train rank 0 broadcasts the new weights to actor_infer
//
// plus validation (step 0 before any training, then every eval_steps;
// pass@k), metrics (output_dir/metrics.jsonl, optional TensorBoard, one
// progress line per step), and atomic checkpoints every save_steps that
// resume_from_checkpoint restores (model, optimizer, RNG, scheduler, data
// position). Runs in the controller process; it never loads a model itself.

#include <functional>
#include <map>
#include <string>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

struct RlvrRunOptions {
  // Print the progress line to stdout (default true).
  bool progress = true;
  // Called after each step's metrics are logged (tests observe a run).
  std::function<void(int64_t step, const std::map<std::string, double>&)> on_step;
};

// Runs the pipeline to config.max_steps. Errors name the step and the stage.
absl::Status RunRlvrPipeline(const PipelineConfig& config, const RlvrRunOptions& options = {});

}  // namespace roll
