// ApplyIntrinsicReward: URLVR's rewards from the generator's own signals.

#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "roll/pipeline/rlvr.h"

namespace roll {
namespace {

double Mean(const std::vector<float>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

absl::Status ApplyIntrinsicReward(IntrinsicReward kind, std::vector<RolloutGroup>* groups,
                                  std::map<std::string, double>* m) {
  if (kind == IntrinsicReward::kNone) {
    return absl::InvalidArgumentError("intrinsic_reward: none gives no reward to apply");
  }
  double sum = 0, samples = 0, verified = 0, agree = 0;
  for (RolloutGroup& g : *groups) {
    std::vector<double> reward(g.samples.size(), 0.0);
    if (kind == IntrinsicReward::kMajorityVote) {
      std::map<std::string, int64_t> votes;
      std::vector<std::string> order;
      for (const SampleResult& s : g.samples) {
        if (s.extracted_answer.empty()) continue;
        if (votes[s.extracted_answer]++ == 0) order.push_back(s.extracted_answer);
      }
      std::string best;
      int64_t most = 0;
      for (const std::string& a : order) {
        if (votes[a] > most) {
          most = votes[a];
          best = a;
        }
      }
      for (size_t i = 0; i < g.samples.size(); ++i) {
        reward[i] = !best.empty() && g.samples[i].extracted_answer == best ? 1.0 : 0.0;
      }
    } else {
      for (size_t i = 0; i < g.samples.size(); ++i) {
        const SampleResult& s = g.samples[i];
        reward[i] = kind == IntrinsicReward::kSelfCertainty ? Mean(s.self_certainties)
                    : kind == IntrinsicReward::kNegEntropy  ? -Mean(s.entropies)
                                                          : Mean(s.logprobs);
      }
    }
    const double group_mean =
        reward.empty() ? 0.0 : std::accumulate(reward.begin(), reward.end(), 0.0) / static_cast<double>(reward.size());
    for (size_t i = 0; i < g.samples.size(); ++i) {
      SampleResult& s = g.samples[i];
      const bool correct = s.score >= 1.0 - 1e-9;
      const bool favours = kind == IntrinsicReward::kMajorityVote ? reward[i] > 0.5 : reward[i] > group_mean + 1e-12;
      verified += correct;
      agree += favours == correct;
      s.score = reward[i];
      sum += reward[i];
      samples += 1;
    }
  }
  const double n = std::max(1.0, samples);
  (*m)["reward/intrinsic_mean"] = sum / n;
  (*m)["reward/verifier_accuracy"] = verified / n;
  // Agreement of the intrinsic reward (favoured or not) with the verifier
  // (correct or not), sample by sample.
  (*m)["reward/accuracy"] = samples > 0 ? agree / samples : 0.0;
  return absl::OkStatus();
}

}  // namespace roll
