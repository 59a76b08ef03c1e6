#pragma once
// The pieces of the RLVR pipeline that are plain functions of their inputs
// (and so are unit-tested without processes): prompt sets and their
// resumable iterator, the training batch built from rollout groups, the
// advantage stage, pass@k, and the run's metrics sinks.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/scheduler/rollout_scheduler.h"

namespace roll {

struct PromptSets {
  std::vector<PromptItem> train, val;
};

// data.train_files / val_files, or the generated data.task; prompts go
// through data.prompt_template and data.chat_template.
absl::StatusOr<PromptSets> LoadPromptSets(const PipelineConfig& config);

// Endless seeded shuffled passes over the training prompts, resumable.
class PromptIterator {
 public:
  virtual ~PromptIterator() = default;
  virtual absl::StatusOr<PromptItem> Next() = 0;
  virtual std::string PositionJson() const = 0;
  virtual absl::Status RestorePositionJson(const std::string& json) = 0;
};
absl::StatusOr<std::unique_ptr<PromptIterator>> MakePromptIterator(std::vector<PromptItem> items,
                                                                   int64_t seed);
inline absl::StatusOr<PromptItem> NextPrompt(PromptIterator* it) { return it->Next(); }

// Rollout groups -> the training batch (see include/roll/worker/rl_workers.h):
// input_ids = prompt + response, right-padded; attention_mask;
// response_mask (0 for overlong responses under overlong_mask); scores [B]
// (reward after the soft overlong penalty and reward_clip); group_index [B];
// sample_weight [B] for prompt-mean aggregation. Metrics: train/reward_mean,
// train/accuracy, train/response_length, train/response_tokens, ...
struct TrainingBatch {
  Batch batch;
  std::map<std::string, double> metrics;
};
absl::StatusOr<TrainingBatch> BuildTrainingBatch(const PipelineConfig& config,
                                                 const std::vector<RolloutGroup>& groups);

// Token rewards (score at the last response token, minus the KL penalty
// when add_token_level_kl) and advantages/returns [B, T-1] by the
// configured estimator; adds "advantages" and "returns" to the batch.
absl::Status ComputeAdvantagesInto(const PipelineConfig& config, Batch* batch,
                                   std::map<std::string, double>* metrics);

// Mean over prompts of the unbiased pass@k from (samples, correct) counts.
double MeanPassAtK(const std::vector<std::pair<int64_t, int64_t>>& counts, int64_t k);

// metrics.jsonl (+ TensorBoard) and the progress line.
class RunTracker {
 public:
  virtual ~RunTracker() = default;
  virtual absl::Status Log(int64_t step, const std::map<std::string, double>& metrics) = 0;
  virtual std::string ProgressLine(int64_t step, int64_t max_steps,
                                   const std::map<std::string, double>& metrics) = 0;
};
absl::StatusOr<std::unique_ptr<RunTracker>> MakeTracker(const PipelineConfig& config,
                                                        int64_t resume_step);

}  // namespace roll
