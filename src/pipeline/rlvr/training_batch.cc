// BuildTrainingBatch: rollout groups -> the padded training batch.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/pipeline/rlvr.h"

namespace roll {

absl::StatusOr<TrainingBatch> BuildTrainingBatch(const PipelineConfig& cfg,
                                                 const std::vector<RolloutGroup>& groups) {
  std::vector<const SampleResult*> rows;
  std::vector<int64_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const SampleResult& s : groups[g].samples) {
      if (s.prompt_ids.empty()) {
        return absl::InternalError(absl::StrCat("sample ", s.request_key, "/", s.sample_index,
                                                " has no prompt ids"));
      }
      rows.push_back(&s);
      group_of.push_back(static_cast<int64_t>(g));
    }
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  if (B == 0) return absl::InvalidArgumentError("empty rollout");
  int64_t T = 2;
  for (const SampleResult* s : rows) {
    T = std::max<int64_t>(T, s->prompt_ids.size() + s->response_ids.size());
  }
  at::Tensor ids = at::zeros({B, T}, at::kLong);
  at::Tensor attn = at::zeros({B, T}, at::kLong);
  at::Tensor resp = at::zeros({B, T}, at::kLong);
  at::Tensor scores = at::zeros({B}, at::kFloat);
  at::Tensor gidx = at::zeros({B}, at::kLong);
  at::Tensor weight = at::zeros({B}, at::kFloat);
  // The generator's log-probs in the [B, T-1] layout: column t scores token t+1.
  at::Tensor infer_lp = at::zeros({B, T - 1}, at::kFloat);
  auto la = infer_lp.accessor<float, 2>();
  auto ia = ids.accessor<int64_t, 2>();
  auto aa = attn.accessor<int64_t, 2>();
  auto ra = resp.accessor<int64_t, 2>();
  const int64_t L = cfg.response_length;
  const int64_t buf = cfg.overlong_buffer_len;
  double raw_sum = 0, score_sum = 0, correct = 0, len_sum = 0, truncated = 0, tokens = 0;
  int64_t version_min = INT64_MAX, version_max = INT64_MIN;
  std::map<std::string, std::pair<double, double>> by_tag;  // tag -> (reward sum, samples)
  std::vector<int64_t> group_tokens(groups.size(), 0);
  for (int64_t i = 0; i < B; ++i) {
    const SampleResult& s = *rows[i];
    const int64_t P = static_cast<int64_t>(s.prompt_ids.size());
    const int64_t R = static_cast<int64_t>(s.response_ids.size());
    for (int64_t j = 0; j < P; ++j) {
      ia[i][j] = s.prompt_ids[j];
      aa[i][j] = 1;
    }
    const bool overlong = s.finish_reason == "length";
    version_min = std::min(version_min, s.weight_version);
    version_max = std::max(version_max, s.weight_version);
    for (int64_t j = 0; j < R; ++j) {
      ia[i][P + j] = s.response_ids[j];
      aa[i][P + j] = 1;
      ra[i][P + j] = (overlong && cfg.overlong_mask) ? 0 : 1;
      if (j < static_cast<int64_t>(s.logprobs.size())) la[i][P + j - 1] = s.logprobs[j];
    }
    double score = s.score;
    raw_sum += score;
    by_tag[s.tag].first += score;
    by_tag[s.tag].second += 1;
    correct += s.score >= 1.0 - 1e-9;
    // DAPO's soft overlong punishment: linear in how far the response
    // reaches into the last `buf` tokens before the limit.
    if (buf > 0 && R > L - buf) {
      score -= std::min(1.0, static_cast<double>(R - (L - buf)) / buf) * cfg.overlong_penalty_factor;
    }
    if (cfg.reward_clip > 0) score = std::clamp(score, -cfg.reward_clip, cfg.reward_clip);
    scores[i] = score;
    score_sum += score;
    gidx[i] = group_of[i];
    len_sum += static_cast<double>(R);
    truncated += overlong;
    tokens += static_cast<double>(R);
    group_tokens[group_of[i]] += (overlong && cfg.overlong_mask) ? 0 : R;
  }
  // prompt-mean aggregation: every prompt weighs the same; within a prompt
  // every token does. The weight of a sample's tokens is 1 / (its group's
  // tokens x number of groups).
  const double G = static_cast<double>(groups.size());
  for (int64_t i = 0; i < B; ++i) {
    const int64_t gt = group_tokens[group_of[i]];
    weight[i] = gt > 0 ? static_cast<float>(1.0 / (static_cast<double>(gt) * G)) : 0.0f;
  }
  TrainingBatch out;
  out.batch.SetTensor("input_ids", ids);
  out.batch.SetTensor("attention_mask", attn);
  out.batch.SetTensor("response_mask", resp);
  out.batch.SetTensor("scores", scores);
  out.batch.SetTensor("group_index", gidx);
  out.batch.SetTensor("sample_weight", weight);
  out.batch.SetTensor("infer_log_probs", infer_lp);
  out.batch.SetMeta("num_groups", absl::StrCat(groups.size()));
  out.metrics["train/reward_raw_mean"] = raw_sum / B;
  out.metrics["train/reward_mean"] = score_sum / B;
  out.metrics["train/accuracy"] = correct / B;
  out.metrics["train/response_length"] = len_sum / B;
  out.metrics["train/truncated_fraction"] = truncated / B;
  out.metrics["train/response_tokens"] = tokens;
  // The model versions the samples were generated with (the trainer's
  // step of the last model update they saw).
  out.metrics["rollout/weight_version_min"] = static_cast<double>(version_min);
  out.metrics["rollout/weight_version_max"] = static_cast<double>(version_max);
  // Raw reward per domain tag (the reward cluster the samples went to).
  for (const auto& [tag, sum_n] : by_tag) {
    const std::string prefix = absl::StrCat("reward/", tag.empty() ? "untagged" : tag);
    out.metrics[prefix + "_mean"] = sum_n.first / sum_n.second;
    out.metrics[prefix + "_samples"] = sum_n.second;
  }
  return out;
}

}  // namespace roll
