// The parts of the train strategy that need the config module's types.

#include "roll/common/config.h"
#include "roll/strategies/train_strategy.h"
#include "strategies/train_internal.h"

namespace roll {

TrainStrategyOptions TrainStrategyOptions::FromTrainingArgs(const TrainingArgs& args,
                                                            int64_t total_steps) {
  TrainStrategyOptions o;
  o.lr.type = args.lr_scheduler_type;
  o.lr.base_lr = args.learning_rate;
  o.lr.warmup_steps = args.warmup_steps;
  o.lr.total_steps = total_steps;
  // A run with no more updates than its warm-up (max_steps 0 included) never
  // leaves the warm-up, as in Hugging Face's schedules: the ramp is all it
  // runs, whatever would follow.
  if (total_steps <= args.warmup_steps) o.lr.type = LrSchedulerType::kConstant;
  o.adam.weight_decay = args.weight_decay;
  o.max_grad_norm = args.max_grad_norm;
  o.micro_batch_size = args.per_device_train_batch_size;
  return o;
}

namespace strategies_internal {

std::string_view LrSchedulerTypeName(LrSchedulerType type) { return ToString(type); }

absl::StatusOr<LrSchedulerType> ParseLrSchedulerType(std::string_view name) {
  for (LrSchedulerType t :
       {LrSchedulerType::kConstant, LrSchedulerType::kCosine, LrSchedulerType::kLinear}) {
    if (ToString(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown lr scheduler type '", Sv(name), "' (constant, cosine, linear)"));
}

}  // namespace strategies_internal
}  // namespace roll
