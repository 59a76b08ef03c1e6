#pragma once
// The loss callbacks the actor and critic trainers run, built once from the
// pipeline config (docs/algorithms.md gives the equations and keys).
//
// Actor: the configured policy loss on advantages and old log-probs,
// aggregated by loss_agg_mode over the step (exact across micro-batches and
// data-parallel ranks), plus kl_loss_coef x KL to ref_log_probs when
// use_kl_loss, minus entropy_loss_coef x entropy. Critic: the clipped value
// loss against returns.

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/strategies/train_strategy.h"

namespace roll {

absl::StatusOr<LossFn> MakeActorLoss(const PipelineConfig& config);
absl::StatusOr<LossFn> MakeCriticLoss(const PipelineConfig& config);

}  // namespace roll
