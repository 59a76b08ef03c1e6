#include "roll/strategies/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "roll/common/config.h"

namespace roll {

absl::StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleOptions& o) {
  if (o.type != LrSchedulerType::kConstant && o.type != LrSchedulerType::kCosine &&
      o.type != LrSchedulerType::kLinear) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: unknown type ", static_cast<int>(o.type)));
  }
  if (!(o.base_lr >= 0) || !std::isfinite(o.base_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: learning_rate must be a finite value >= 0, got ", o.base_lr));
  }
  if (o.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: warmup_steps must be >= 0, got ", o.warmup_steps));
  }
  if (o.type != LrSchedulerType::kConstant && o.total_steps <= o.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr schedule: a ", Sv(ToString(o.type)), " schedule needs total_steps (", o.total_steps,
        ") greater than warmup_steps (", o.warmup_steps, ")"));
  }
  return LrSchedule(o);
}

double LrSchedule::LrAt(int64_t step) const {
  const LrScheduleOptions& o = options_;
  step = std::max<int64_t>(step, 0);
  if (step < o.warmup_steps) {
    return o.base_lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  }
  if (o.type == LrSchedulerType::kConstant) return o.base_lr;
  const double span = static_cast<double>(o.total_steps - o.warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - o.warmup_steps) / span, 0.0, 1.0);
  if (o.type == LrSchedulerType::kLinear) return o.base_lr * (1.0 - progress);
  return o.base_lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace roll
