// BuildTrainingBatch: rollout groups -> the padded training batch.

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
  const int64_t L = cfg.response_length;
  const int64_t buf = cfg.overlong_buffer_len;
  double raw_sum = 0, score_sum = 0, correct = 0, truncated = 0, tokens = 0;
  double interrupted = 0;
  int64_t version_min = INT64_MAX, version_max = INT64_MIN;
  std::map<std::string, std::pair<double, double>> by_tag;  // tag -> (reward sum, samples)
  std::vector<TrainingRow> packed(B);
  for (int64_t i = 0; i < B; ++i) {
    const SampleResult& s = *rows[i];
    const int64_t R = static_cast<int64_t>(s.response_ids.size());
    const bool overlong = s.finish_reason == "length";
    version_min = std::min(version_min, s.weight_version);
    version_max = std::max(version_max, s.weight_version);
    TrainingRow& row = packed[i];
    row.ids = s.prompt_ids;
    row.ids.insert(row.ids.end(), s.response_ids.begin(), s.response_ids.end());
    row.response_mask.assign(s.prompt_ids.size(), 0);
    row.response_mask.resize(row.ids.size(), (overlong && cfg.overlong_mask) ? 0 : 1);
    // Tokens injected by forced length interruption were not sampled: no loss.
    for (size_t j = 0; j < s.forced.size() && j < static_cast<size_t>(R); ++j) {
      if (s.forced[j] != 0) row.response_mask[s.prompt_ids.size() + j] = 0;
    }
    interrupted += std::find(s.forced.begin(), s.forced.end(), 1) != s.forced.end();
    row.logprobs.assign(row.ids.size(), 0.0f);
    std::copy(s.logprobs.begin(), s.logprobs.begin() + std::min<size_t>(s.logprobs.size(), R),
              row.logprobs.begin() + s.prompt_ids.size());
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
    score = ClipReward(cfg, score);
    row.score = static_cast<float>(score);
    row.group = group_of[i];
    score_sum += score;
    truncated += overlong;
    tokens += static_cast<double>(R);
  }
  // PODS down-sampling: each group trains its max-variance subset only (the
  // metrics below the packing still describe every sample generated).
  if (cfg.downsample_samples_per_group > 0) {
    std::map<int64_t, std::vector<int64_t>> members;  // group -> rows, in order
    for (int64_t i = 0; i < B; ++i) members[packed[i].group].push_back(i);
    std::vector<bool> keep(B, false);
    for (const auto& [g, idx] : members) {
      std::vector<float> scores;
      for (int64_t i : idx) scores.push_back(packed[i].score);
      for (size_t k : MaxVarianceSubset(scores, static_cast<size_t>(cfg.downsample_samples_per_group))) {
        keep[idx[k]] = true;
      }
    }
    std::vector<TrainingRow> kept;
    for (int64_t i = 0; i < B; ++i) {
      if (keep[i]) kept.push_back(std::move(packed[i]));
    }
    packed = std::move(kept);
  }
  // ScaleRL's zero-variance filtering: a group whose samples all scored
  // alike carries no signal; its samples stay in the batch (the mini-batch
  // sizes hold) but get no loss, and count in no loss denominator.
  int64_t filtered = 0;
  if (cfg.filter_zero_variance_groups) {
    std::map<int64_t, std::pair<float, float>> range;  // group -> (min, max) score
    for (const TrainingRow& row : packed) {
      auto [it, fresh] = range.try_emplace(row.group, row.score, row.score);
      if (!fresh) it->second = {std::min(it->second.first, row.score), std::max(it->second.second, row.score)};
    }
    for (const auto& [g, mm] : range) filtered += mm.first == mm.second;
    for (TrainingRow& row : packed) {
      const auto& mm = range[row.group];
      if (mm.first == mm.second) std::fill(row.response_mask.begin(), row.response_mask.end(), 0);
    }
  }
  TrainingBatch out;
  out.batch = PackTrainingRows(packed, static_cast<int64_t>(groups.size()));
  if (cfg.filter_zero_variance_groups) {
    out.metrics["train/zero_variance_filtered"] = static_cast<double>(filtered) / static_cast<double>(groups.size());
  }
  if (cfg.downsample_samples_per_group > 0) {
    out.metrics["train/trained_samples"] = static_cast<double>(packed.size());
  }
  out.metrics["train/reward_raw_mean"] = raw_sum / B;
  out.metrics["train/reward_mean"] = score_sum / B;
  out.metrics["train/accuracy"] = correct / B;
  out.metrics["train/response_length"] = tokens / B;
  out.metrics["train/truncated_fraction"] = truncated / B;
  if (cfg.interrupt_min_tokens > 0) out.metrics["train/interrupted_fraction"] = interrupted / B;
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

int64_t TrainedSamplesPerGroup(const PipelineConfig& config) {
  return config.downsample_samples_per_group > 0 ? config.downsample_samples_per_group
                                                 : config.num_return_sequences_in_group;
}

std::vector<size_t> MaxVarianceSubset(const std::vector<float>& scores, size_t m) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (m >= n) return order;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Subset k: the m - k lowest and the k highest. Its variance from running
  // sums over the sorted scores.
  size_t best_k = 0;
  double best = -1.0;
  for (size_t k = 0; k <= m; ++k) {
    double sum = 0, sq = 0;
    for (size_t j = 0; j < m - k; ++j) sum += scores[order[j]], sq += double(scores[order[j]]) * scores[order[j]];
    for (size_t j = n - k; j < n; ++j) sum += scores[order[j]], sq += double(scores[order[j]]) * scores[order[j]];
    const double mean = sum / static_cast<double>(m);
    const double var = sq / static_cast<double>(m) - mean * mean;
    if (var > best + 1e-12) best = var, best_k = k;
  }
  std::vector<size_t> out(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m - best_k));
  out.insert(out.end(), order.end() - static_cast<std::ptrdiff_t>(best_k), order.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace roll
