#pragma once
// Private helpers shared by the train strategy's translation units.

#include <string>
#include <string_view>

#include "roll/common/status.h"

namespace roll {

enum class LrSchedulerType;

namespace strategies_internal {

// "constant", "cosine", "linear" (the YAML spelling).
std::string_view LrSchedulerTypeName(LrSchedulerType type);
absl::StatusOr<LrSchedulerType> ParseLrSchedulerType(std::string_view name);

}  // namespace strategies_internal
}  // namespace roll
