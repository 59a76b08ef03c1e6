// Trajectories -> metrics and the training batch.

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/pipeline/agentic.h"

namespace roll {

void TrajectoryMetrics(const std::vector<TrajectoryGroup>& groups, const std::string& prefix, Metrics* m) {
  double episodes = 0, success = 0, ret = 0, steps = 0, valid = 0, effective = 0, turns = 0, resp_tokens = 0;
  double truncated = 0, length_truncated = 0;
  std::map<std::string, std::pair<double, double>> by_tag;  // tag -> (successes, episodes)
  for (const TrajectoryGroup& g : groups) {
    for (const Trajectory& t : g.episodes) {
      episodes += 1;
      success += t.success;
      ret += t.episode_return;
      steps += static_cast<double>(t.turns.size());
      truncated += t.truncated;
      length_truncated += t.length_truncated;
      for (const Turn& turn : t.turns) {
        turns += 1;
        valid += turn.action_valid;
        effective += turn.effective;
        resp_tokens += static_cast<double>(turn.end - turn.begin);
      }
      by_tag[g.tag].first += t.success;
      by_tag[g.tag].second += 1;
    }
  }
  const double e = std::max(1.0, episodes), n = std::max(1.0, turns);
  (*m)[prefix + "success_rate"] = success / e;
  (*m)[prefix + "return_mean"] = ret / e;
  (*m)[prefix + "steps_mean"] = steps / e;
  (*m)[prefix + "valid_action_rate"] = valid / n;
  (*m)[prefix + "effective_action_rate"] = effective / n;
  (*m)[prefix + "response_length"] = resp_tokens / n;
  (*m)[prefix + "truncated_rate"] = truncated / e;
  (*m)[prefix + "length_truncated_rate"] = length_truncated / e;
  if (by_tag.size() > 1 || (by_tag.size() == 1 && by_tag.begin()->first != "env")) {
    for (const auto& [tag, sn] : by_tag) (*m)[absl::StrCat(prefix, tag, "/success_rate")] = sn.first / sn.second;
  }
}

absl::StatusOr<TrainingBatch> BuildTrajectoryBatch(const PipelineConfig& cfg,
                                                   const std::vector<TrajectoryGroup>& groups) {
  std::vector<const Trajectory*> rows;
  std::vector<int64_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const Trajectory& t : groups[g].episodes) {
      if (t.ids.empty() || t.generated.size() != t.ids.size() || t.logprobs.size() != t.ids.size()) {
        return absl::InternalError(absl::StrCat("trajectory ", t.key, " has inconsistent token records"));
      }
      rows.push_back(&t);
      group_of.push_back(static_cast<int64_t>(g));
    }
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  if (B == 0) return absl::InvalidArgumentError("empty agentic rollout");
  int64_t T = 2;
  for (const Trajectory* t : rows) T = std::max<int64_t>(T, static_cast<int64_t>(t->ids.size()));
  at::Tensor ids = at::zeros({B, T}, at::kLong), attn = at::zeros({B, T}, at::kLong);
  at::Tensor resp = at::zeros({B, T}, at::kLong);
  at::Tensor scores = at::zeros({B}, at::kFloat), gidx = at::zeros({B}, at::kLong);
  at::Tensor weight = at::zeros({B}, at::kFloat);
  // [B, T-1]: column t scores token t+1.
  at::Tensor infer_lp = at::zeros({B, T - 1}, at::kFloat);
  int64_t* pi = ids.data_ptr<int64_t>();
  int64_t* pa = attn.data_ptr<int64_t>();
  int64_t* pr = resp.data_ptr<int64_t>();
  float* pl = infer_lp.data_ptr<float>();
  std::vector<double> group_tokens(groups.size(), 0.0);
  double tokens = 0, length = 0;
  for (int64_t i = 0; i < B; ++i) {
    const Trajectory& t = *rows[i];
    const int64_t L = static_cast<int64_t>(t.ids.size());
    for (int64_t j = 0; j < L; ++j) {
      pi[i * T + j] = t.ids[j];
      pa[i * T + j] = 1;
      pr[i * T + j] = t.generated[j];
      if (j > 0 && t.generated[j]) pl[i * (T - 1) + j - 1] = t.logprobs[j];
      tokens += t.generated[j];
      group_tokens[group_of[i]] += t.generated[j];
    }
    length += static_cast<double>(L);
    double score = t.episode_return;
    if (cfg.reward_clip > 0) score = std::clamp(score, -cfg.reward_clip, cfg.reward_clip);
    scores[i] = score;
    gidx[i] = group_of[i];
  }
  const double G = static_cast<double>(groups.size());
  for (int64_t i = 0; i < B; ++i) {
    const double gt = group_tokens[group_of[i]];
    weight[i] = gt > 0 ? static_cast<float>(1.0 / (gt * G)) : 0.0f;
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
  TrajectoryMetrics(groups, "train/", &out.metrics);
  out.metrics["train/trajectories"] = static_cast<double>(B);
  out.metrics["train/response_tokens"] = tokens;
  out.metrics["train/sequence_length"] = length / static_cast<double>(B);
  return out;
}

}  // namespace roll
