#pragma once
// TrainPhase: what every RL pipeline does with a batch of scored samples,
// from log-probs to updates:
//
//   log-probs    old log-probs from actor_train, reference log-probs from
//                `reference` (when the job has it), values from `critic`
//   advantages   the configured estimator (docs/algorithms.md)
//   updates      critic then actor train steps over mini-batches,
//                ppo_epochs times
//
// The batch is the one the workers read (include/roll/worker/rl_workers.h):
// input_ids, attention_mask, response_mask, scores [B], group_index [B],
// infer_log_probs, and optionally sample_weight [B]. RLVR builds it from
// prompt groups, the agentic pipeline from trajectories; the phase does not
// care which. Not thread-safe.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/models/hf_config.h"
#include "roll/pipeline/job_clusters.h"

namespace roll {

using Metrics = std::map<std::string, double>;

// A step's training batch (the layout above) and the metrics of building it
// (train/...), as a pipeline's rollout produces it.
struct TrainingBatch {
  Batch batch;
  Metrics metrics;
};

// One sample of a training batch: its tokens, which of them the loss
// covers, the generator's log-prob of each token (0 where it generated
// none), its score and its group.
struct TrainingRow {
  std::vector<int64_t> ids;
  std::vector<uint8_t> response_mask;  // per id
  std::vector<float> logprobs;         // per id
  float score = 0.0f;
  int64_t group = 0;
  // Step-level rewards (agentic reward_level step), per id or both empty:
  // the turn each id belongs to (0, 1, ... within the row; -1 for none)
  // and that turn's score.
  std::vector<int32_t> turn;
  std::vector<float> turn_score;
};

// The training batch of `rows` (`num_groups` groups): input_ids,
// attention_mask, response_mask [B, T] right-padded; infer_log_probs
// [B, T-1] (column t scores token t+1); scores, group_index [B];
// sample_weight [B] for prompt-mean aggregation, 1 / (the group's loss
// tokens x num_groups); meta num_groups; with step-level rows also
// token_turn [B, T-1] (turn ids unique in the batch, -1 for none) and
// turn_scores [B, T-1] (AdvantageInputs). Every pipeline's rollout packs
// its samples through it.
Batch PackTrainingRows(const std::vector<TrainingRow>& rows, int64_t num_groups);

// The mini-batch of one update: per_device_train_batch_size x
// gradient_accumulation_steps x actor_train.world_size samples. An error,
// with the numbers, when `samples` (a step's samples, described by
// `samples_what`, e.g. "rollout_batch_size x num_return_sequences_in_group
// = 4 x 8 = 32") is not a multiple of it.
absl::StatusOr<int64_t> MiniBatchSize(const PipelineConfig& config, int64_t samples,
                                      const std::string& samples_what);

// [begin, end) of each update's slice of a `batch`-sample step: `epochs`
// passes of consecutive `mini`-sample slices (the last one may be short).
std::vector<std::pair<int64_t, int64_t>> MiniBatchRanges(int64_t batch, int64_t mini, int epochs);

// Token rewards (score at the last response token, minus the KL penalty
// when add_token_level_kl) and advantages/returns [B, T-1] by the
// configured estimator; adds "advantages" and "returns" to the batch and
// train/advantage_* (and actor/reward_kl) to `metrics`.
absl::Status ComputeAdvantagesInto(const PipelineConfig& config, Batch* batch, Metrics* metrics);

// The checks every training pipeline shares, before anything starts: the
// actor_train and actor_infer sections, a critic for adv_estimator gae, a
// reference for use_kl_loss / add_token_level_kl, and rollout_is only with
// use_decoupled_loss (without it the old policy is the generator's own, and
// there is no mismatch to correct).
absl::Status CheckTrainPhaseConfig(const PipelineConfig& config);

// A sample's (or turn's) reward bounded to [-reward_clip, reward_clip];
// unchanged when reward_clip is 0 (off).
double ClipReward(const PipelineConfig& config, double reward);

// Compute accounting (ScaleRL's x axis; docs/recipes.md): FLOPs by
// ForwardFlops of each model's config.json, backward = 2 x forward.
class ComputeCounter {
 public:
  // Reads the config.json of actor_train's, the critic's and the
  // reference's model_name_or_path; an error names the file.
  static absl::StatusOr<ComputeCounter> FromConfig(const PipelineConfig& config);
  // The train phase over `batch` (sequence lengths from attention_mask), as
  // TrainPhase runs it: old log-probs (a forward of actor_train, with
  // use_decoupled_loss), reference log-probs, critic values (forwards), and
  // ppo_epochs x (forward + backward) of the actor and the critic.
  double TrainFlops(const Batch& batch) const;
  // Generating samples of these (prompt, response) token counts: a forward
  // over prompt + response - 1 positions each (the last token is sampled,
  // never fed), as a KV-cached engine runs it.
  double GenerationFlops(const std::vector<std::pair<int64_t, int64_t>>& samples) const;

 private:
  ModelConfig actor_;
  std::optional<ModelConfig> critic_, reference_;  // when the job has them
  bool recompute_old_ = true;                      // use_decoupled_loss
  double epochs_ = 1;                              // ppo_epochs
};

class TrainPhase {
 public:
  // Makes the named roles resident on their devices (StageOffloader,
  // through the pipeline's generator recovery); adds to `metrics`.
  using Activate = std::function<absl::Status(const std::vector<std::string>& roles, Metrics* metrics)>;

  // `mini_batch` from MiniBatchSize. The clusters must outlive the phase.
  TrainPhase(const PipelineConfig& config, JobClusters* clusters, int64_t mini_batch, Activate activate);

  // The compute counter of the job's models, or null (with a warning, once)
  // when their configs cannot be read.
  const ComputeCounter* Compute();

  // Optimizer steps of actor_train per training step of `samples` samples.
  int64_t UpdatesPerStep(int64_t samples) const;

  // The whole phase on `batch`: ComputeLogProbs, ComputeAdvantagesInto,
  // Update. Errors name the step and the stage. Adds compute/train_flops
  // (this step's, ComputeCounter::TrainFlops) unless the model configs
  // cannot be read (a warning, once).
  absl::Status Run(int64_t step, Batch* batch, Metrics* metrics);

  // Adds old_log_probs (and ref_log_probs, values) to the batch;
  // time/logprobs_s, actor/infer_logprob_abs_diff (how far the generators'
  // log-probs are from the trainer's on the same tokens). old_log_probs
  // are actor_train's, or with use_decoupled_loss off the generator's
  // (infer_log_probs; no actor_train pass).
  absl::Status ComputeLogProbs(int64_t step, Batch* batch, Metrics* metrics);
  // The mini-batch updates; the mean of each worker metric over them, and
  // time/train_s.
  absl::Status Update(int64_t step, const Batch& batch, Metrics* metrics);

 private:
  PipelineConfig config_;
  JobClusters* clusters_;  // not owned
  int64_t mini_batch_;
  Activate activate_;
  std::optional<absl::StatusOr<ComputeCounter>> compute_;  // read on first use
};

}  // namespace roll
