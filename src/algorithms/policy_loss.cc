#include "roll/algorithms/policy_loss.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace roll {
namespace {

// PPO's clipped surrogate per token: max(-A r, -A clip(r, 1-lo, 1+hi)),
// with the dual clip min(., -c A) for A < 0.
at::Tensor ClippedSurrogate(const at::Tensor& ratio, const at::Tensor& adv, const PolicyLossOptions& o,
                            at::Tensor* clipped) {
  at::Tensor l1 = -adv * ratio;
  at::Tensor l2 = -adv * ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high);
  at::Tensor loss = at::maximum(l1, l2);
  *clipped = (l2 > l1).to(at::kFloat);
  if (o.dual_clip) {
    at::Tensor l3 = -adv * o.dual_clip_c;
    at::Tensor dual = (adv < 0) & (loss > l3);
    loss = at::where(adv < 0, at::minimum(loss, l3), loss);
    *clipped = at::maximum(*clipped, dual.to(at::kFloat));
  }
  return loss;
}

std::string ShapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

// exp(x - sg(x)): value 1, gradient that of x.
at::Tensor SelfAnchored(const at::Tensor& x) { return at::exp(x - x.detach()); }

}  // namespace

absl::Status PolicyLossOptions::Validate() const {
  if (clip_low < 0 || clip_high < 0) return absl::InvalidArgumentError("pg_clip_low/high must be >= 0");
  if (dual_clip && dual_clip_c <= 1) return absl::InvalidArgumentError("dual_clip_c must be > 1");
  return absl::OkStatus();
}

absl::StatusOr<PolicyLossOutput> PolicyLoss(const at::Tensor& log_probs, const at::Tensor& old_log_probs,
                                            const at::Tensor& advantages, const at::Tensor& mask_in,
                                            const PolicyLossOptions& o) {
  ROLL_RETURN_IF_ERROR(o.Validate());
  if (log_probs.sizes() != old_log_probs.sizes() || log_probs.sizes() != advantages.sizes() ||
      log_probs.sizes() != mask_in.sizes() || log_probs.dim() != 2) {
    return absl::InvalidArgumentError("policy loss: log_probs, old_log_probs, advantages and mask must be [B, L]");
  }
  const at::Tensor mask = mask_in.to(at::kFloat);
  const at::Tensor adv = advantages.to(at::kFloat).detach();
  const at::Tensor old = old_log_probs.to(at::kFloat).detach();
  const at::Tensor log_ratio = (log_probs - old) * mask;
  PolicyLossOutput out;
  at::Tensor loss;
  if (o.variant == PgVariant::kPpo || o.variant == PgVariant::kUp) {
    at::Tensor ratio = at::exp(log_ratio);
    loss = ClippedSurrogate(ratio, adv, o, &out.clipped);
    if (o.variant == PgVariant::kUp) {
      // Positive advantages: unclipped, anchored to the current policy, so
      // the value is -A and the gradient -A grad log p, however far the
      // ratio has moved.
      at::Tensor pos = -adv * SelfAnchored(log_probs);
      loss = at::where(adv > 0, pos, loss);
      out.clipped = at::where(adv > 0, at::zeros_like(out.clipped), out.clipped);
    }
    out.ratio = ratio.detach();
  } else if (o.variant == PgVariant::kGspo || o.variant == PgVariant::kUpSeq) {
    // Sequence ratio s_i = exp(mean_t log(pi/pi_old)); per token
    // sg(s_i) * pi_t / sg(pi_t), so each token carries the sequence's ratio
    // and its own gradient (GSPO's token form).
    at::Tensor len = mask.sum(1, /*keepdim=*/true).clamp_min(1);
    at::Tensor seq_log_ratio = log_ratio.sum(1, true) / len;
    at::Tensor s = at::exp(seq_log_ratio.detach() + log_probs - log_probs.detach());
    loss = ClippedSurrogate(s, adv, o, &out.clipped);
    if (o.variant == PgVariant::kUpSeq) {
      at::Tensor pos = -adv * SelfAnchored(log_probs);
      loss = at::where(adv > 0, pos, loss);
      out.clipped = at::where(adv > 0, at::zeros_like(out.clipped), out.clipped);
    }
    out.ratio = s.detach();
  } else {  // cispo
    at::Tensor ratio = at::exp(log_ratio).detach();
    const double lo = o.clip_low > 0 && o.clip_low < 1 ? 1.0 - o.clip_low : 0.0;
    at::Tensor w = ratio.clamp(lo, 1.0 + o.clip_high);
    out.clipped = (w != ratio).to(at::kFloat);
    loss = -(w * adv) * log_probs;
    out.ratio = ratio;
  }
  out.per_token = loss * mask;
  out.clipped = out.clipped * mask;
  return out;
}

absl::StatusOr<ImportanceWeights> RolloutImportanceWeights(const at::Tensor& old_log_probs,
                                                           const at::Tensor& infer_log_probs, const at::Tensor& mask,
                                                           RolloutIs level, double cap) {
  if (level == RolloutIs::kNone) return absl::InvalidArgumentError("rollout_is: none has no weights (token, sequence)");
  if (!(cap > 0)) return absl::InvalidArgumentError(absl::StrCat("rollout_is_cap must be > 0, got ", cap));
  if (old_log_probs.sizes() != infer_log_probs.sizes() || old_log_probs.sizes() != mask.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout_is: old_log_probs ", ShapeOf(old_log_probs),
                                                   ", infer_log_probs ", ShapeOf(infer_log_probs), " and mask ",
                                                   ShapeOf(mask), " differ in shape"));
  }
  torch::NoGradGuard no_grad;
  const at::Tensor m = mask.to(at::kFloat);
  at::Tensor log_ratio = (old_log_probs.detach().to(at::kFloat) - infer_log_probs.to(at::kFloat)) * m;
  if (level == RolloutIs::kSequence) log_ratio = log_ratio.sum(1, /*keepdim=*/true).expand_as(m);
  // Capped in log space: a long sequence's summed ratio overflows exp.
  const double log_cap = std::log(cap);
  ImportanceWeights w;
  w.truncated = (log_ratio > log_cap).to(at::kFloat) * m;
  w.weights = log_ratio.clamp_max(log_cap).exp() * m + (1 - m);
  return w;
}

at::Tensor KlEstimate(const at::Tensor& logp, const at::Tensor& ref, KlPenalty kind) {
  const at::Tensor d = logp - ref.to(logp.scalar_type());
  switch (kind) {
    case KlPenalty::kK1:
      return d;
    case KlPenalty::kK2:
      return 0.5 * d.pow(2);
    case KlPenalty::kK3:
      // Clamped as is usual, so one extreme token cannot blow up the loss.
      return (at::exp(-d) + d - 1).clamp(-10, 10);
    case KlPenalty::kAbs:
      break;
  }
  return d.abs();
}

at::Tensor ValueLoss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                     double clip) {
  at::Tensor l1 = (values - returns).pow(2);
  if (clip <= 0) return 0.5 * l1;
  at::Tensor clipped = old_values + (values - old_values).clamp(-clip, clip);
  return 0.5 * at::maximum(l1, (clipped - returns).pow(2));
}

absl::StatusOr<at::Tensor> AggregateLoss(const at::Tensor& per_token, const at::Tensor& mask_in,
                                         LossAggMode mode, const AggregationScale& s,
                                         const at::Tensor& sample_weight) {
  const at::Tensor mask = mask_in.to(per_token.scalar_type());
  const at::Tensor masked = per_token * mask;
  const double seqs = static_cast<double>(std::max<int64_t>(1, s.global_sequences));
  switch (mode) {
    case LossAggMode::kTokenMean:
      return masked.sum() / static_cast<double>(std::max<int64_t>(1, s.global_tokens));
    case LossAggMode::kSeqMeanTokenMean:
      return (masked.sum(1) / mask.sum(1).clamp_min(1)).sum() / seqs;
    case LossAggMode::kSeqMeanTokenSum:
      return masked.sum() / seqs;
    case LossAggMode::kSeqMeanTokenSumNorm:
      return masked.sum() / (seqs * static_cast<double>(std::max<int64_t>(1, s.max_response_length)));
    case LossAggMode::kPromptMean:
      break;
  }
  if (!sample_weight.defined() || sample_weight.dim() != 1 || sample_weight.size(0) != per_token.size(0)) {
    return absl::InvalidArgumentError("loss_agg_mode prompt-mean needs sample_weight [B]");
  }
  return (masked.sum(1) * sample_weight.to(per_token.scalar_type())).sum();
}

}  // namespace roll
