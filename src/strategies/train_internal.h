#pragma once
// Private helpers shared by the train strategy's translation units.

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "roll/common/status.h"

namespace roll {

enum class LrSchedulerType;

namespace strategies_internal {

// "constant", "cosine", "linear" (the YAML spelling).
std::string_view LrSchedulerTypeName(LrSchedulerType type);
absl::StatusOr<LrSchedulerType> ParseLrSchedulerType(std::string_view name);

// "[2, 3]": a tensor shape in an error message.
inline std::string ShapeString(c10::ArrayRef<int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace strategies_internal
}  // namespace roll
