#include "roll/pipeline/validation.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/algorithms/eval_metrics.h"

namespace roll {

absl::StatusOr<std::vector<int64_t>> ParsePassK(const PipelineConfig& config) {
  std::vector<int64_t> out;
  for (const std::string& k : config.val_pass_k) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(k, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("val_pass_k: '", k, "' is not a positive integer"));
    }
    if (v > config.val_num_return_sequences) {
      return absl::InvalidArgumentError(absl::StrCat("val_pass_k: pass@", v, " needs val_num_return_sequences >= ",
                                                     v, ", got ", config.val_num_return_sequences));
    }
    out.push_back(v);
  }
  return out;
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

void ValidationStats::AddGroup(const std::vector<double>& scores, const std::vector<int64_t>& response_lengths) {
  int64_t correct = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    correct += scores[i] >= 1.0 - 1e-9;
    reward_sum_ += scores[i];
    length_sum_ += i < response_lengths.size() ? static_cast<double>(response_lengths[i]) : 0.0;
    ++samples_;
  }
  counts_.emplace_back(static_cast<int64_t>(scores.size()), correct);
}

absl::Status SamplePrompts(RolloutScheduler* scheduler, const std::vector<PromptItem>& prompts, int64_t batch_size,
                           const GenParams& params, uint64_t seed, ValidationStats* stats,
                           const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t total = static_cast<int64_t>(prompts.size());
  for (int64_t begin = 0; begin < total; begin += batch_size) {
    RolloutOptions ro;
    ro.groups = std::min<int64_t>(batch_size, total - begin);
    ro.params = params;
    ro.seed = seed ^ 0x5a5a5a5aull;
    int64_t next = begin;
    auto batch = scheduler->Collect(
        ro, [&]() -> absl::StatusOr<PromptItem> { return prompts[next++]; }, -1 - begin);
    ROLL_RETURN_IF_ERROR(batch.status());
    for (const RolloutGroup& g : batch->groups) stats->AddGroup(g.samples);
    if (progress) progress(begin + ro.groups, total);
  }
  return absl::OkStatus();
}

void ValidationStats::AddGroup(const std::vector<SampleResult>& samples) {
  std::vector<double> scores;
  std::vector<int64_t> lengths;
  std::vector<std::string> answers;
  for (const SampleResult& s : samples) {
    scores.push_back(s.score);
    lengths.push_back(static_cast<int64_t>(s.response_ids.size()));
    answers.push_back(s.extracted_answer);
    for (float e : s.entropies) entropy_sum_ += e;
    entropy_tokens_ += static_cast<int64_t>(s.entropies.size());
  }
  AddGroup(scores, lengths);
  answer_entropy_sum_ += AnswerEntropy(answers);
  ++answer_groups_;
}

std::vector<bool> ValidationStats::solved() const {
  std::vector<bool> out;
  for (const auto& [n, c] : counts_) out.push_back(c > 0);
  return out;
}

void ValidationStats::WriteTo(const std::vector<int64_t>& pass_k, std::map<std::string, double>* m,
                              const std::string& prefix) const {
  double acc = 0;
  for (const auto& [n, c] : counts_) acc += n ? static_cast<double>(c) / n : 0.0;
  (*m)[prefix + "accuracy"] = counts_.empty() ? 0.0 : acc / counts_.size();
  (*m)[prefix + "reward_mean"] = samples_ ? reward_sum_ / samples_ : 0.0;
  (*m)[prefix + "response_length"] = samples_ ? length_sum_ / samples_ : 0.0;
  for (int64_t k : pass_k) (*m)[absl::StrCat(prefix, "pass@", k)] = MeanPassAtK(counts_, k);
  if (answer_groups_ > 0) {
    (*m)[prefix + "token_entropy"] = entropy_tokens_ ? entropy_sum_ / static_cast<double>(entropy_tokens_) : 0.0;
    (*m)[prefix + "answer_entropy"] = answer_entropy_sum_ / static_cast<double>(answer_groups_);
  }
}

}  // namespace roll
