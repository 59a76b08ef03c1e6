#include "workers/rl/rl_loss.h"

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "roll/algorithms/policy_loss.h"
#include "roll/models/transformer.h"
#include "roll/worker/batch_keys.h"

namespace roll {
namespace {

double Share(const at::Tensor& t) { return t.detach().item<double>(); }

}  // namespace

absl::StatusOr<LossFn> MakeActorLoss(const PipelineConfig& cfg) {
  PolicyLossOptions po;
  po.variant = cfg.pg_variant;
  po.clip_low = cfg.pg_clip_low > 0 ? cfg.pg_clip_low : cfg.pg_clip;
  po.clip_high = cfg.pg_clip_high > 0 ? cfg.pg_clip_high : cfg.pg_clip;
  po.dual_clip = cfg.dual_clip_loss;
  po.dual_clip_c = cfg.dual_clip_c;
  ROLL_RETURN_IF_ERROR(po.Validate());
  const LossAggMode agg = cfg.loss_agg_mode;
  const bool kl_loss = cfg.use_kl_loss;
  const double kl_coef = cfg.kl_loss_coef;
  const KlPenalty kl_kind = cfg.kl_penalty;
  const double ent_coef = cfg.entropy_loss_coef;
  const int64_t max_len = cfg.response_length;
  const RolloutIs rollout_is = cfg.rollout_is;
  const double rollout_is_cap = cfg.rollout_is_cap;
  if (rollout_is != RolloutIs::kNone) {
    ROLL_RETURN_IF_ERROR(
        RolloutImportanceWeights(at::zeros({1, 1}), at::zeros({1, 1}), at::ones({1, 1}), rollout_is, rollout_is_cap)
            .status());
  }
  return LossFn([=](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    ROLL_ASSIGN_OR_RETURN(at::Tensor old, mb.data.Tensor(keys::kOldLogProbs));
    ROLL_ASSIGN_OR_RETURN(at::Tensor adv, mb.data.Tensor(keys::kAdvantages));
    const at::Tensor& mask = mb.loss_mask;
    AggregationScale scale{mb.global_loss_tokens, mb.global_sequences, max_len};
    at::Tensor weight;
    if (mb.data.HasTensor(keys::kSampleWeight)) weight = *mb.data.Tensor(keys::kSampleWeight);
    ROLL_ASSIGN_OR_RETURN(PolicyLossOutput pl, PolicyLoss(out.log_probs, old, adv, mask, po));
    LossOutput r;
    // Token-mean shares of the diagnostics, whatever the loss aggregation.
    auto token_mean = [&](const at::Tensor& t) {
      return Share((t.detach() * mask).sum()) / static_cast<double>(std::max<int64_t>(1, mb.global_loss_tokens));
    };
    at::Tensor per_token = pl.per_token;
    if (rollout_is != RolloutIs::kNone) {
      // The generator's own log-probs of the sampled tokens.
      ROLL_ASSIGN_OR_RETURN(at::Tensor infer, mb.data.Tensor(keys::kInferLogProbs));
      ROLL_ASSIGN_OR_RETURN(ImportanceWeights iw,
                            RolloutImportanceWeights(old, infer, mask, rollout_is, rollout_is_cap));
      per_token = per_token * iw.weights;
      r.metrics["actor/rollout_is_mean"] = token_mean(iw.weights);
      r.metrics["actor/rollout_is_truncated"] = token_mean(iw.truncated);
    }
    ROLL_ASSIGN_OR_RETURN(at::Tensor pg_loss, AggregateLoss(per_token, mask, agg, scale, weight));
    at::Tensor loss = pg_loss;
    r.metrics["actor/pg_loss"] = Share(pg_loss);
    r.metrics["actor/pg_clipfrac"] = token_mean(pl.clipped);
    r.metrics["actor/ratio_mean"] = token_mean(pl.ratio);
    r.metrics["actor/approx_kl"] = token_mean(0.5 * (out.log_probs.detach() - old).pow(2));
    if (kl_loss) {
      ROLL_ASSIGN_OR_RETURN(at::Tensor ref, mb.data.Tensor(keys::kRefLogProbs));
      const at::Tensor kl = KlEstimate(out.log_probs, ref, kl_kind);
      ROLL_ASSIGN_OR_RETURN(at::Tensor kl_agg, AggregateLoss(kl, mask, agg, scale, weight));
      loss = loss + kl_coef * kl_agg;
      r.metrics["actor/kl_loss"] = Share(kl_agg);
    }
    if (out.entropy.defined()) {
      ROLL_ASSIGN_OR_RETURN(at::Tensor ent, AggregateLoss(out.entropy, mask, agg, scale, weight));
      if (ent_coef != 0) loss = loss - ent_coef * ent;
      r.metrics["actor/entropy"] = token_mean(out.entropy);
    }
    r.loss = loss;
    return r;
  });
}

absl::StatusOr<LossFn> MakeCriticLoss(const PipelineConfig& cfg) {
  const double clip = cfg.value_clip;
  const LossAggMode agg = cfg.loss_agg_mode;
  const int64_t max_len = cfg.response_length;
  return LossFn([=](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    ROLL_ASSIGN_OR_RETURN(at::Tensor old_values, mb.data.Tensor(keys::kValues));
    ROLL_ASSIGN_OR_RETURN(at::Tensor returns, mb.data.Tensor(keys::kReturns));
    const at::Tensor& mask = mb.loss_mask;
    at::Tensor per_token = ValueLoss(out.values, old_values, returns, clip);
    AggregationScale scale{mb.global_loss_tokens, mb.global_sequences, max_len};
    at::Tensor weight;
    if (mb.data.HasTensor(keys::kSampleWeight)) weight = *mb.data.Tensor(keys::kSampleWeight);
    ROLL_ASSIGN_OR_RETURN(at::Tensor loss, AggregateLoss(per_token, mask, agg, scale, weight));
    LossOutput r;
    r.loss = loss;
    const double tokens = static_cast<double>(std::max<int64_t>(1, mb.global_loss_tokens));
    r.metrics["critic/value_loss"] = Share(loss);
    r.metrics["critic/values_mean"] = Share((out.values.detach() * mask).sum()) / tokens;
    return r;
  });
}

absl::StatusOr<at::Tensor> LossMask(const Batch& batch) {
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor(keys::kInputIds));
  at::Tensor mask = batch.HasTensor(keys::kResponseMask) ? *batch.Tensor(keys::kResponseMask)
                                                     : at::ones_like(ids);
  if (batch.HasTensor(keys::kAttentionMask)) mask = mask * *batch.Tensor(keys::kAttentionMask);
  return mask.slice(1, 1).to(at::kFloat);
}

absl::StatusOr<ScoredTokens> ScoreTokens(const CausalLM& model, const Batch& batch, int64_t micro,
                                         bool with_entropy) {
  torch::NoGradGuard no_grad;
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor(keys::kInputIds));
  at::Tensor attn = batch.HasTensor(keys::kAttentionMask) ? *batch.Tensor(keys::kAttentionMask)
                                                      : at::ones_like(ids);
  ROLL_ASSIGN_OR_RETURN(at::Tensor mask, LossMask(batch));
  std::vector<at::Tensor> lps, ents;
  for (int64_t b = 0; b < ids.size(0); b += micro) {
    const int64_t e = std::min<int64_t>(ids.size(0), b + micro);
    at::Tensor mids = ids.slice(0, b, e);
    ROLL_ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(mids, attn.slice(0, b, e)));
    ROLL_ASSIGN_OR_RETURN(TokenLogProbs t, LogProbsFromLogits(logits, mids, with_entropy));
    at::Tensor m = mask.slice(0, b, e);
    lps.push_back(t.log_probs * m);
    if (with_entropy) ents.push_back(t.entropy * m);
  }
  ScoredTokens out;
  out.log_probs = at::cat(lps);
  if (with_entropy) out.entropy = at::cat(ents);
  return out;
}

}  // namespace roll
