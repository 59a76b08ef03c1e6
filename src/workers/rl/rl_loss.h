#pragma once
// The loss callbacks the actor and critic trainers run, built once from the
// pipeline config (docs/algorithms.md gives the equations and keys), and
// the token scores and loss mask they and the scoring methods read.
//
// Actor: the configured policy loss on advantages and old log-probs,
// aggregated by loss_agg_mode over the step (exact across micro-batches and
// data-parallel ranks), plus kl_loss_coef x KL to ref_log_probs when
// use_kl_loss, minus entropy_loss_coef x entropy. Critic: the clipped value
// loss against returns.

#include <ATen/core/Tensor.h>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/strategies/train_strategy.h"

namespace roll {

class CausalLM;

absl::StatusOr<LossFn> MakeActorLoss(const PipelineConfig& config);
absl::StatusOr<LossFn> MakeCriticLoss(const PipelineConfig& config);

// Log-probs (and entropies) of a training-layout batch without gradients,
// in micro-batches of `micro` rows: [B, T-1] float32, 0 outside loss_mask.
struct ScoredTokens {
  at::Tensor log_probs, entropy;
};
absl::StatusOr<ScoredTokens> ScoreTokens(const CausalLM& model, const Batch& batch, int64_t micro,
                                         bool with_entropy);

// response_mask[:,1:] * attention_mask[:,1:] as float32 [B, T-1].
absl::StatusOr<at::Tensor> LossMask(const Batch& batch);

}  // namespace roll
