#pragma once
// Advantage estimators of the RL pipelines (docs/algorithms.md has the
// equations). Per-token tensors are [B, L] float32 with a 0/1 `mask` of the
// response tokens (the [B, T-1] layout of train_strategy.h); masked
// positions of every output are 0. Pure functions of their inputs;
// thread-safe.

#include <string>

#include <ATen/core/Tensor.h>

#include "roll/common/algorithm_options.h"
#include "roll/common/status.h"

namespace roll {

struct AdvantageOptions {
  AdvEstimator estimator = AdvEstimator::kGrpo;
  double gamma = 1.0;   // discount (gae, reinforce_plus_plus)
  double lambd = 0.95;  // GAE lambda
  // Outcome estimators: baseline and scale of the scores. dr_grpo ignores
  // norm_std_type (never divides).
  NormType norm_mean_type = NormType::kGroup;
  NormType norm_std_type = NormType::kGroup;
  bool whiten_advantages = false;  // whiten over the batch's masked tokens
  double advantage_clip = 0.0;     // clip to [-c, c]; 0: off
  double eps = 1e-6;               // added to standard deviations
  // InvalidArgument naming the config key of a bad value.
  absl::Status Validate() const;
};

struct AdvantageInputs {
  at::Tensor scores;       // [B] outcome reward per sample
  at::Tensor group_index;  // [B] int64: samples of one prompt share an index
  at::Tensor mask;         // [B, L] response tokens
  at::Tensor values;       // [B, L] critic values (gae only)
  // [B, L] per-token KL to the reference, subtracted (times kl_coef) from
  // the token rewards when defined (KL in the reward).
  at::Tensor token_kl;
  double kl_coef = 0.0;
  // Step-level outcome rewards (the agentic pipeline's reward_level step),
  // both [B, L]: token_turn names the turn each response token belongs to
  // (ids unique in the batch, -1 for none) and turn_scores holds its
  // turn's score at each of them. When defined, the outcome estimators
  // (grpo, dr_grpo, rloo) treat every turn as a sample of its row's group
  // (group_index) and give each token its turn's advantage; the KL in the
  // reward is summed per turn. `scores` is not used then.
  at::Tensor token_turn;
  at::Tensor turn_scores;
};

struct AdvantageOutput {
  at::Tensor advantages;     // [B, L]
  at::Tensor returns;        // [B, L]: value targets (gae), else = advantages
  at::Tensor token_rewards;  // [B, L]: score at the last response token minus KL
};

absl::StatusOr<AdvantageOutput> ComputeAdvantages(const AdvantageOptions& options,
                                                  const AdvantageInputs& in);

// GAE (Schulman et al. 2016) over the masked tokens of each row, right to
// left; masked positions are skipped, so padding anywhere is harmless.
void Gae(const at::Tensor& token_rewards, const at::Tensor& values, const at::Tensor& mask,
         double gamma, double lambd, at::Tensor* advantages, at::Tensor* returns);

// (x - mean) / (std + eps) over the masked entries (std unbiased), 0 elsewhere.
at::Tensor MaskedWhiten(const at::Tensor& x, const at::Tensor& mask, double eps = 1e-6);

// Per-sample outcome advantages [B] from scores: grpo ((r - mean) / (std +
// eps), std unbiased as torch.std), dr_grpo (r - mean), rloo (r minus the
// mean of the other samples of its group; 0 for a group of one).
absl::StatusOr<at::Tensor> OutcomeAdvantages(const AdvantageOptions& options, const at::Tensor& scores,
                                             const at::Tensor& group_index);

}  // namespace roll
