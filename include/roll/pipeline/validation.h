#pragma once
// Validation metrics over groups of samples (an RLVR prompt's responses, an
// agentic env group's episodes): accuracy, mean reward, response length,
// pass@k by the unbiased estimator, and for generated samples the token-
// and answer-level entropies (docs/diagnostics.md). Pure; not thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/scheduler/rollout_scheduler.h"

namespace roll {

// val_pass_k as integers: each a positive integer no larger than
// val_num_return_sequences. Errors name the entry.
absl::StatusOr<std::vector<int64_t>> ParsePassK(const PipelineConfig& config);

// Mean over groups of the unbiased pass@k from (samples, correct) counts;
// groups with fewer than k samples are left out.
double MeanPassAtK(const std::vector<std::pair<int64_t, int64_t>>& counts, int64_t k);

class ValidationStats;

// Samples every prompt of `prompts` with `params` (n samples each), in
// batches of `batch_size` prompts, and adds each prompt's scored samples
// to `stats`. The draws come from the validation's own seeds, derived from
// `seed` and each batch's first index, so training's validation and `roll
// eval` with the same settings sample alike. `progress(done, total)` after
// each batch when set.
absl::Status SamplePrompts(RolloutScheduler* scheduler, const std::vector<PromptItem>& prompts, int64_t batch_size,
                           const GenParams& params, uint64_t seed, ValidationStats* stats,
                           const std::function<void(int64_t, int64_t)>& progress = {});

class ValidationStats {
 public:
  // One group: each sample's score (correct when >= 1) and response length.
  void AddGroup(const std::vector<double>& scores, const std::vector<int64_t>& response_lengths);
  // One prompt's scored samples: the above, plus their per-token entropies
  // and extracted answers.
  void AddGroup(const std::vector<SampleResult>& samples);
  // <prefix>accuracy (mean over groups of the correct fraction),
  // <prefix>reward_mean, <prefix>response_length (means over samples) and
  // <prefix>pass@k for each k; after the SampleResult overload also
  // <prefix>token_entropy (mean over generated tokens of the model's
  // next-token entropy) and <prefix>answer_entropy (mean over groups of the
  // entropy of their extracted answers; a sample without one counts as the
  // answer "").
  void WriteTo(const std::vector<int64_t>& pass_k, std::map<std::string, double>* metrics,
               const std::string& prefix = "val/") const;

  int64_t groups() const { return static_cast<int64_t>(counts_.size()); }
  // (samples, correct) per group, in the order added.
  const std::vector<std::pair<int64_t, int64_t>>& counts() const { return counts_; }
  // Per group: at least one correct sample.
  std::vector<bool> solved() const;

 private:
  std::vector<std::pair<int64_t, int64_t>> counts_;  // (samples, correct) per group
  double entropy_sum_ = 0, answer_entropy_sum_ = 0;
  int64_t entropy_tokens_ = 0, answer_groups_ = 0;
  double reward_sum_ = 0, length_sum_ = 0;
  int64_t samples_ = 0;
};

}  // namespace roll
