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

// The model collapse step (URLVR): the first step of the run's final
// stretch of steps whose reward accuracy lies below `threshold`, once that
// stretch holds at least `patience` steps; -1 while there is none. A step
// back at or above the threshold ends the stretch.
class CollapseDetector {
 public:
  CollapseDetector(double threshold, int64_t patience) : threshold_(threshold), patience_(patience) {}
  void Observe(int64_t step, double reward_accuracy);
  int64_t collapse_step() const { return below_ >= patience_ ? start_ : -1; }
  // The state a resumed run restores: (start of the stretch, its length).
  std::pair<int64_t, int64_t> state() const { return {start_, below_}; }
  void Restore(int64_t start, int64_t below) {
    start_ = start;
    below_ = below;
  }

 private:
  double threshold_;
  int64_t patience_;
  int64_t start_ = -1, below_ = 0;
};

}  // namespace roll
