// Trajectories -> metrics and the training batch.

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
  std::vector<TrainingRow> rows;
  double tokens = 0, length = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const Trajectory& t : groups[g].episodes) {
      if (t.ids.empty() || t.generated.size() != t.ids.size() || t.logprobs.size() != t.ids.size()) {
        return absl::InternalError(absl::StrCat("trajectory ", t.key, " has inconsistent token records"));
      }
      TrainingRow r;
      r.ids = t.ids;
      r.response_mask = t.generated;
      r.logprobs = t.logprobs;
      r.score = static_cast<float>(ClipReward(cfg, t.episode_return));
      if (cfg.reward_level == RewardLevel::kStep) {
        // G_k = r_k + gamma * G_{k+1}, from the last turn back.
        r.turn.assign(t.ids.size(), -1);
        r.turn_score.assign(t.ids.size(), 0.0f);
        double ret = 0;
        for (int64_t k = static_cast<int64_t>(t.turns.size()) - 1; k >= 0; --k) {
          const Turn& turn = t.turns[k];
          ret = turn.reward + cfg.step_reward_gamma * ret;
          for (int64_t p = turn.begin; p < turn.end; ++p) {
            r.turn[p] = static_cast<int32_t>(k);
            r.turn_score[p] = static_cast<float>(ClipReward(cfg, ret));
          }
        }
      }
      r.group = static_cast<int64_t>(g);
      tokens += std::count(t.generated.begin(), t.generated.end(), 1);
      length += static_cast<double>(t.ids.size());
      rows.push_back(std::move(r));
    }
  }
  if (rows.empty()) return absl::InvalidArgumentError("empty agentic rollout");
  TrainingBatch out;
  out.batch = PackTrainingRows(rows, static_cast<int64_t>(groups.size()));
  TrajectoryMetrics(groups, "train/", &out.metrics);
  out.metrics["train/trajectories"] = static_cast<double>(rows.size());
  out.metrics["train/response_tokens"] = tokens;
  out.metrics["train/sequence_length"] = length / static_cast<double>(rows.size());
  return out;
}

}  // namespace roll
