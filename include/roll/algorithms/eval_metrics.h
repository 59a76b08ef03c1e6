#pragma once
// What `roll eval` and validation report about a model's samples
// (docs/diagnostics.md has the equations): pass@k, the support change of one model
// against another, answer-level entropy, and the model collapse step of a
// run trained on intrinsic rewards. Pure functions; no LibTorch.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll {

// pass@k of a prompt with c correct among n samples, by the unbiased
// estimator 1 - C(n-c, k) / C(n, k) (HumanEval's), computed as a product so
// that large n does not overflow. InvalidArgument unless 0 <= c <= n and
// 1 <= k <= n.
absl::StatusOr<double> PassAtK(int64_t n, int64_t c, int64_t k);

// How the prompts one model solves (at least one correct sample) relate to
// another's: preserved P (both), shrunk S (only the first), expanded E (only
// the second), neither.
struct SupportChange {
  int64_t preserved = 0, shrunk = 0, expanded = 0, neither = 0;
  double srr = 0;   // support retention rate P / (P + S)
  double ndr = 0;   // net discovery rate E / (P + E)
  double sds = 0;   // harmonic mean of SRR and NDR
  double nscr = 0;  // net support change rate (E - S) / (P + E + S)
};
// InvalidArgument when the two lists differ in length. Ratios whose
// denominator is 0 are 0.
absl::StatusOr<SupportChange> CompareSupport(const std::vector<bool>& first_solved,
                                             const std::vector<bool>& second_solved);

// Entropy (nats) of the empirical distribution of `answers` (one per
// sample; equal strings are one answer). 0 for no answers.
double AnswerEntropy(const std::vector<std::string>& answers);

// The model collapse step (URLVR): the first step s from which reward
// accuracy stays below `threshold` over `patience` steps, i.e. whose mean
// over steps s .. s + patience - 1 lies below it (a mean, so that one
// noisy step above the threshold in a collapsed run does not reset it);
// -1 until such a window has closed. Once found it stays: a run that
// recovers later shows it in reward accuracy itself.
class CollapseDetector {
 public:
  CollapseDetector(double threshold, int64_t patience) : threshold_(threshold), patience_(patience) {}
  void Observe(int64_t step, double reward_accuracy);
  int64_t collapse_step() const { return collapse_step_; }
  // The state a resumed run restores: the steps of the open window.
  const std::vector<std::pair<int64_t, double>>& window() const { return window_; }
  void Restore(int64_t collapse_step, std::vector<std::pair<int64_t, double>> window) {
    collapse_step_ = collapse_step;
    window_ = std::move(window);
  }

 private:
  double threshold_;
  int64_t patience_;
  int64_t collapse_step_ = -1;
  std::vector<std::pair<int64_t, double>> window_;  // the last patience steps at most
};

}  // namespace roll
