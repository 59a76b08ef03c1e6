// The advantage stage of the RLVR step and pass@k over validation groups.

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "controller/rlvr_parts.h"
#include "roll/algorithms/advantages.h"
#include "roll/algorithms/policy_loss.h"

namespace roll {

absl::Status ComputeAdvantagesInto(const PipelineConfig& cfg, Batch* batch,
                                   std::map<std::string, double>* m) {
  AdvantageOptions o;
  o.estimator = cfg.adv_estimator;
  o.gamma = cfg.gamma;
  o.lambd = cfg.lambd;
  o.norm_mean_type = cfg.norm_mean_type;
  o.norm_std_type = cfg.norm_std_type;
  o.whiten_advantages = cfg.whiten_advantages;
  o.advantage_clip = cfg.advantage_clip;
  AdvantageInputs in;
  ROLL_ASSIGN_OR_RETURN(in.scores, batch->Tensor("scores"));
  ROLL_ASSIGN_OR_RETURN(in.group_index, batch->Tensor("group_index"));
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch->Tensor("input_ids"));
  ROLL_ASSIGN_OR_RETURN(at::Tensor resp, batch->Tensor("response_mask"));
  ROLL_ASSIGN_OR_RETURN(at::Tensor attn, batch->Tensor("attention_mask"));
  in.mask = (resp * attn).slice(1, 1).to(at::kFloat);
  if (batch->HasTensor("values")) in.values = *batch->Tensor("values");
  if (cfg.add_token_level_kl && batch->HasTensor("ref_log_probs")) {
    ROLL_ASSIGN_OR_RETURN(at::Tensor old, batch->Tensor("old_log_probs"));
    ROLL_ASSIGN_OR_RETURN(in.token_kl, KlEstimate(old, *batch->Tensor("ref_log_probs"), cfg.kl_penalty));
    in.kl_coef = cfg.init_kl_coef;
    (*m)["actor/reward_kl"] = ((in.token_kl * in.mask).sum() / in.mask.sum().clamp_min(1)).item<double>();
  }
  ROLL_ASSIGN_OR_RETURN(AdvantageOutput out, ComputeAdvantages(o, in));
  batch->SetTensor("advantages", out.advantages);
  batch->SetTensor("returns", out.returns);
  const double tokens = std::max(1.0, in.mask.sum().item<double>());
  (*m)["train/advantage_mean"] = (out.advantages * in.mask).sum().item<double>() / tokens;
  (*m)["train/advantage_abs_mean"] = (out.advantages.abs() * in.mask).sum().item<double>() / tokens;
  return absl::OkStatus();
}

double MeanPassAtK(const std::vector<std::pair<int64_t, int64_t>>& counts, int64_t k) {
  double sum = 0;
  int64_t used = 0;
  for (const auto& [n, c] : counts) {
    auto p = PassAtK(n, c, k);
    if (!p.ok()) continue;  // fewer samples than k: not counted
    sum += *p;
    ++used;
  }
  return used ? sum / used : 0.0;
}

}  // namespace roll
