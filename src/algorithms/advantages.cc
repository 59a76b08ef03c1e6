#include "roll/algorithms/advantages.h"

#include <torch/torch.h>

#include <map>

#include "absl/strings/str_cat.h"

namespace roll {
namespace {

bool OneOf(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (v == n) return true;
  }
  return false;
}

// Mean and unbiased std of `x` [B] within each group (index in `group`).
void GroupStats(const at::Tensor& x, const at::Tensor& group, at::Tensor* mean, at::Tensor* std,
                at::Tensor* count) {
  const int64_t G = group.max().item<int64_t>() + 1;
  at::Tensor sum = at::zeros({G}, x.options()).index_add_(0, group, x);
  at::Tensor cnt = at::zeros({G}, x.options()).index_add_(0, group, at::ones_like(x));
  at::Tensor m = sum / cnt.clamp_min(1);
  at::Tensor dev = (x - m.index_select(0, group)).pow(2);
  at::Tensor ss = at::zeros({G}, x.options()).index_add_(0, group, dev);
  at::Tensor var = ss / (cnt - 1).clamp_min(1);
  *mean = m.index_select(0, group);
  *std = var.sqrt().index_select(0, group);
  *count = cnt.index_select(0, group);
}

}  // namespace

absl::Status AdvantageOptions::Validate() const {
  if (gamma < 0 || gamma > 1) return absl::InvalidArgumentError("gamma must be in [0, 1]");
  if (lambd < 0 || lambd > 1) return absl::InvalidArgumentError("lambd must be in [0, 1]");
  if (advantage_clip < 0) return absl::InvalidArgumentError("advantage_clip must be >= 0");
  return absl::OkStatus();
}

at::Tensor MaskedWhiten(const at::Tensor& x, const at::Tensor& mask, double eps) {
  const at::Tensor n = mask.sum();
  const at::Tensor mean = (x * mask).sum() / n.clamp_min(1);
  const at::Tensor var = ((x - mean).pow(2) * mask).sum() / (n - 1).clamp_min(1);
  return (x - mean) / (var.sqrt() + eps) * mask;
}

void Gae(const at::Tensor& token_rewards, const at::Tensor& values, const at::Tensor& mask,
         double gamma, double lambd, at::Tensor* advantages, at::Tensor* returns) {
  at::Tensor r = token_rewards.to(at::kDouble).contiguous();
  at::Tensor v = values.to(at::kDouble).contiguous();
  at::Tensor m = mask.to(at::kDouble).contiguous();
  const int64_t B = r.size(0), L = r.size(1);
  at::Tensor adv = at::zeros({B, L}, at::kDouble);
  auto ra = r.accessor<double, 2>();
  auto va = v.accessor<double, 2>();
  auto ma = m.accessor<double, 2>();
  auto aa = adv.accessor<double, 2>();
  for (int64_t b = 0; b < B; ++b) {
    double next_value = 0, running = 0;
    for (int64_t t = L - 1; t >= 0; --t) {
      if (ma[b][t] == 0) continue;
      const double delta = ra[b][t] + gamma * next_value - va[b][t];
      running = delta + gamma * lambd * running;
      aa[b][t] = running;
      next_value = va[b][t];
    }
  }
  *advantages = adv.to(at::kFloat);
  *returns = ((adv + v) * m).to(at::kFloat);
}

absl::StatusOr<at::Tensor> OutcomeAdvantages(const AdvantageOptions& o, const at::Tensor& scores_in,
                                             const at::Tensor& group_index) {
  ROLL_RETURN_IF_ERROR(o.Validate());
  at::Tensor r = scores_in.to(at::kFloat);
  at::Tensor g = group_index.to(at::kLong);
  if (r.dim() != 1 || g.sizes() != r.sizes()) {
    return absl::InvalidArgumentError("scores and group_index must both be [B]");
  }
  at::Tensor gmean, gstd, gcount;
  GroupStats(r, g, &gmean, &gstd, &gcount);
  if (o.estimator == AdvEstimator::kRloo) {
    // r_i - (sum_group - r_i) / (n - 1) = n / (n - 1) * (r_i - mean).
    at::Tensor n = gcount;
    return at::where(n > 1, (r - gmean) * n / (n - 1).clamp_min(1), at::zeros_like(r));
  }
  at::Tensor baseline = o.norm_mean_type == NormType::kGroup   ? gmean
                        : o.norm_mean_type == NormType::kBatch ? r.mean().expand_as(r)
                                                               : at::zeros_like(r);
  at::Tensor adv = r - baseline;
  if (o.estimator == AdvEstimator::kGrpo && o.norm_std_type != NormType::kNone) {
    at::Tensor std = o.norm_std_type == NormType::kGroup ? gstd : r.std().expand_as(r);
    adv = adv / (std + o.eps);
  }
  return adv;
}

namespace {

// Outcome advantages with each turn a sample of its row's group (see
// AdvantageInputs::token_turn), spread back over the turn's tokens.
absl::StatusOr<at::Tensor> TurnAdvantages(const AdvantageOptions& o, const AdvantageInputs& in,
                                          const at::Tensor& mask) {
  if (o.estimator != AdvEstimator::kGrpo && o.estimator != AdvEstimator::kDrGrpo &&
      o.estimator != AdvEstimator::kRloo) {
    return absl::InvalidArgumentError(absl::StrCat("step-level rewards work with adv_estimator grpo, dr_grpo or "
                                                   "rloo, not '", Sv(ToString(o.estimator)), "'"));
  }
  if (!in.turn_scores.defined() || in.token_turn.sizes() != mask.sizes() ||
      in.turn_scores.sizes() != mask.sizes()) {
    return absl::InvalidArgumentError("advantages: token_turn and turn_scores must both be [B, L] like the mask");
  }
  const int64_t B = mask.size(0), L = mask.size(1);
  const at::Tensor turn = in.token_turn.to(at::kLong);
  const at::Tensor on = (turn >= 0).logical_and(mask > 0);
  if (!on.any().item<bool>()) return at::zeros_like(mask);
  // Per turn: its score, its row's group, its summed KL; turns are
  // renumbered 0..N-1 in order of their ids.
  const at::Tensor ids = turn.masked_select(on);
  at::Tensor uniq, dense;
  std::tie(uniq, dense, std::ignore) = at::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true);
  const int64_t N = uniq.size(0);
  const at::Tensor rows = at::arange(B, at::kLong).unsqueeze(1).expand({B, L}).masked_select(on);
  at::Tensor score = at::zeros({N}, at::kFloat).index_put_({dense}, in.turn_scores.to(at::kFloat).masked_select(on));
  const at::Tensor group = at::zeros({N}, at::kLong).index_put_({dense}, in.group_index.to(at::kLong).index_select(0, rows));
  if (in.token_kl.defined() && in.kl_coef != 0) {
    score = score - in.kl_coef * at::zeros({N}, at::kFloat).index_add_(0, dense, in.token_kl.to(at::kFloat).masked_select(on));
  }
  ROLL_ASSIGN_OR_RETURN(at::Tensor adv, OutcomeAdvantages(o, score, group));
  at::Tensor out = at::zeros({B, L}, at::kFloat);
  out.masked_scatter_(on, adv.index_select(0, dense));
  return out;
}

}  // namespace

absl::StatusOr<AdvantageOutput> ComputeAdvantages(const AdvantageOptions& o, const AdvantageInputs& in) {
  ROLL_RETURN_IF_ERROR(o.Validate());
  if (!in.mask.defined() || in.mask.dim() != 2 || !in.scores.defined() ||
      in.scores.size(0) != in.mask.size(0)) {
    return absl::InvalidArgumentError("advantages: scores [B] and mask [B, L] are required");
  }
  torch::NoGradGuard no_grad;
  const at::Tensor mask = in.mask.to(at::kFloat);
  const int64_t B = mask.size(0), L = mask.size(1);
  // The outcome reward sits on each row's last response token.
  at::Tensor positions = at::arange(L, at::kLong).unsqueeze(0).expand({B, L});
  at::Tensor last = at::where(mask > 0, positions, at::full_like(positions, -1)).amax(1);
  at::Tensor token_rewards = at::zeros({B, L}, at::kFloat);
  at::Tensor rows = at::nonzero(last >= 0).squeeze(1);
  token_rewards.index_put_({rows, last.index_select(0, rows)},
                           in.scores.to(at::kFloat).index_select(0, rows));
  at::Tensor kl_sum = at::zeros({B}, at::kFloat);
  if (in.token_kl.defined() && in.kl_coef != 0) {
    at::Tensor kl = in.token_kl.to(at::kFloat) * mask;
    token_rewards = token_rewards - in.kl_coef * kl;
    kl_sum = kl.sum(1);
  }
  AdvantageOutput out;
  out.token_rewards = token_rewards * mask;
  if (o.estimator == AdvEstimator::kGae) {
    if (!in.values.defined()) return absl::InvalidArgumentError("adv_estimator gae needs critic values");
    Gae(out.token_rewards, in.values.to(at::kFloat) * mask, mask, o.gamma, o.lambd, &out.advantages,
        &out.returns);
  } else if (o.estimator == AdvEstimator::kReinforcePlusPlus) {
    // Discounted return-to-go of the token rewards, whitened over the batch.
    at::Tensor zeros = at::zeros_like(out.token_rewards);
    at::Tensor ret;
    Gae(out.token_rewards, zeros, mask, o.gamma, 1.0, &ret, &out.returns);
    out.advantages = MaskedWhiten(out.returns, mask, o.eps);
  } else if (in.token_turn.defined()) {
    if (!in.group_index.defined()) return absl::InvalidArgumentError("advantages: group_index is required");
    ROLL_ASSIGN_OR_RETURN(out.advantages, TurnAdvantages(o, in, mask));
    out.returns = out.advantages;
  } else {
    if (!in.group_index.defined()) return absl::InvalidArgumentError("advantages: group_index is required");
    // KL in the reward: outcome estimators see the score minus the summed KL.
    ROLL_ASSIGN_OR_RETURN(at::Tensor a,
                          OutcomeAdvantages(o, in.scores.to(at::kFloat) - in.kl_coef * kl_sum, in.group_index));
    out.advantages = a.unsqueeze(1) * mask;
    out.returns = out.advantages;
  }
  if (o.whiten_advantages) out.advantages = MaskedWhiten(out.advantages, mask, o.eps);
  if (o.advantage_clip > 0) {
    out.advantages = out.advantages.clamp(-o.advantage_clip, o.advantage_clip) * mask;
  }
  return out;
}

}  // namespace roll
