#pragma once
// LrSchedule: the learning rate of each optimizer update, with linear warmup
// followed by a constant, cosine or linear phase -- the schedules Hugging
// Face's get_scheduler builds ("constant_with_warmup", "cosine", "linear").
//
// Update k (0-based: k optimizer steps were taken before it) uses LrAt(k):
//   warmup (k < warmup_steps):  base_lr * k / warmup_steps
//   constant:                   base_lr
//   cosine:  base_lr * 0.5 * (1 + cos(pi * p)),  p = (k - W) / (N - W)
//   linear:  base_lr * (N - k) / (N - W)
// with W = warmup_steps and N = total_steps; p is clamped to [0, 1], so after
// total_steps cosine and linear stay at 0. As in Hugging Face, the very first
// update of a warmup schedule has learning rate 0.
//
// The schedule is a pure function of the step: its only state is the step
// counter the strategy keeps (and checkpoints). A plain value; thread-safe
// for concurrent const use.

#include <cstdint>

#include "roll/common/status.h"

namespace roll {

// Defined in roll/common/config.h (kConstant, kCosine, kLinear). Declared
// here so that this header does not pull in the config module's names.
enum class LrSchedulerType;

struct LrScheduleOptions {
  LrSchedulerType type{};  // default: kConstant (the enum's zero value)
  double base_lr = 1e-6;                              // default: 1e-6, must be >= 0
  int64_t warmup_steps = 0;                           // default: 0, must be >= 0
  // Total number of updates. Required (> warmup_steps) for cosine and
  // linear; ignored by constant. Default 0.
  int64_t total_steps = 0;
};

class LrSchedule {
 public:
  // InvalidArgument naming the field for negative values or a cosine/linear
  // schedule whose total_steps does not exceed warmup_steps.
  static absl::StatusOr<LrSchedule> Create(const LrScheduleOptions& options);

  // Learning rate of update `step` (0-based). Negative steps are treated as 0.
  double LrAt(int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  explicit LrSchedule(const LrScheduleOptions& options) : options_(options) {}
  LrScheduleOptions options_;
};

}  // namespace roll
