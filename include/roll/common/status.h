#pragma once
// Errors are values: every fallible function returns absl::Status or
// absl::StatusOr<T>. These macros keep the happy path readable.

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define ROLL_CONCAT_INNER_(a, b) a##b
#define ROLL_CONCAT_(a, b) ROLL_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define ROLL_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::absl::Status roll_status_ = (expr);          \
    if (!roll_status_.ok()) return roll_status_;   \
  } while (0)

// `ROLL_ASSIGN_OR_RETURN(auto x, Foo());` binds the value or returns the error.
#define ROLL_ASSIGN_OR_RETURN(lhs, expr) \
  ROLL_ASSIGN_OR_RETURN_IMPL_(ROLL_CONCAT_(roll_statusor_, __LINE__), lhs, expr)
#define ROLL_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                \
  if (!var.ok()) return std::move(var).status();    \
  lhs = std::move(var).value()

namespace roll {

// Debian's Abseil has its own string_view type (not std::string_view);
// this bridges std::string_view values into StrCat and friends.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Prefixes the message of a non-OK status with context, keeping its code.
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace roll
