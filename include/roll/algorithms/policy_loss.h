#pragma once
// Policy losses, KL estimators, the value loss and loss aggregation
// (docs/algorithms.md). Per-token tensors are [B, L] in the layout of
// train_strategy.h; `mask` is the 0/1 loss mask. Losses keep autograd
// history through `log_probs` (or `values`). Thread-safe pure functions.

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "roll/common/algorithm_options.h"
#include "roll/common/status.h"

namespace roll {

struct PolicyLossOptions {
  // ppo (clip; DAPO clip-higher with pg_clip_low/high; optional dual clip),
  // gspo (sequence ratio), cispo (clipped IS weight, stop-grad, times
  // log-prob), up (unbounded positive, token level), up_seq (unbounded
  // positive, sequence level).
  PgVariant variant = PgVariant::kPpo;
  double clip_low = 0.2;   // epsilon below 1
  double clip_high = 0.2;  // epsilon above 1
  bool dual_clip = false;
  double dual_clip_c = 3.0;  // > 1
  absl::Status Validate() const;
};

struct PolicyLossOutput {
  at::Tensor per_token;  // [B, L] loss per token (0 where mask is 0)
  at::Tensor clipped;    // [B, L] float 1 where the clip was active
  at::Tensor ratio;      // [B, L] the importance ratio used (detached)
};

absl::StatusOr<PolicyLossOutput> PolicyLoss(const at::Tensor& log_probs, const at::Tensor& old_log_probs,
                                            const at::Tensor& advantages, const at::Tensor& mask,
                                            const PolicyLossOptions& options);

// Truncated importance sampling against the generator (TIS): the weights,
// detached, that correct a loss computed with the trainer's old log-probs
// for the tokens having been sampled from the generator's distribution
// (which differs by numerics, sampling kernels, or weights that moved while
// the sample was generated). `level` token: w_t = min(exp(old_t -
// infer_t), cap); sequence: every token of a row gets min(exp(sum over the
// row's masked tokens of old_t - infer_t), cap); none is an error. Tokens outside `mask` get
// weight 1. `truncated` is 1 where the cap was applied.
struct ImportanceWeights {
  at::Tensor weights;    // [B, L]
  at::Tensor truncated;  // [B, L] float 0/1
};
absl::StatusOr<ImportanceWeights> RolloutImportanceWeights(const at::Tensor& old_log_probs,
                                                           const at::Tensor& infer_log_probs, const at::Tensor& mask,
                                                           RolloutIs level, double cap);

// Per-token KL estimate of KL(pi || ref) from log-probs of the sampled
// tokens: k1 logp - ref; k2 (logp - ref)^2 / 2; k3 exp(ref - logp) - (ref -
// logp) - 1 (clamped to [-10, 10]); abs |logp - ref|.
at::Tensor KlEstimate(const at::Tensor& log_probs, const at::Tensor& ref_log_probs, KlPenalty kind);

// PPO's value loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2);
// clip 0: 0.5 * (V - R)^2.
at::Tensor ValueLoss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                     double clip);

// How per-token losses become the step loss. Each call returns one
// micro-batch's SHARE, normalized by step-wide counts, so the sum over
// micro-batches and data-parallel ranks equals the whole batch's value.
struct AggregationScale {
  int64_t global_tokens = 1;        // masked tokens in the step
  int64_t global_sequences = 1;     // samples in the step
  int64_t max_response_length = 1;  // seq-mean-token-sum-norm's constant
};
// mode: token-mean, seq-mean-token-mean, seq-mean-token-sum,
// seq-mean-token-sum-norm, prompt-mean (needs sample_weight [B]: each
// sample's weight 1 / (tokens of its group x groups in the step)).
absl::StatusOr<at::Tensor> AggregateLoss(const at::Tensor& per_token, const at::Tensor& mask,
                                         LossAggMode mode, const AggregationScale& scale,
                                         const at::Tensor& sample_weight = {});

}  // namespace roll
