#pragma once
// The built-in "debug" worker type: small methods with observable effects,
// used by `roll bench dispatch`, the runtime's integration tests and as a
// smoke test of a deployment. Every method is cheap unless asked otherwise.

#include "roll/worker/worker.h"

namespace roll {

struct DebugApi {
  static constexpr std::string_view kType = "debug";
};

namespace debug {
// Returns an empty Batch.
inline constexpr Method<DebugApi> kNoop{"noop", Dispatch::kOneToAll};
// Returns its input unchanged.
inline constexpr Method<DebugApi> kEcho{"echo", Dispatch::kOneToAll};
// Returns its input with column "rank" and tensor "rank" (int64) set to this rank.
inline constexpr Method<DebugApi> kWhoAmI{"whoami", Dispatch::kAllToAll};
// Tensor "x" times 2 plus column "rank"; the input is chunked over ranks.
inline constexpr Method<DebugApi> kDouble{"double", Dispatch::kDataParallel};
// Runs on rank 0 only; returns meta "rank".
inline constexpr Method<DebugApi> kLeader{"leader", Dispatch::kOneToAll, Execute::kRankZero};
// Sleeps meta "ms" milliseconds (default 1000), then echoes. For fault tests.
inline constexpr Method<DebugApi> kSleep{"sleep", Dispatch::kOneToAll};
// Fails with meta "message" (InvalidArgument) on the ranks listed in meta "ranks" ("all" by default).
inline constexpr Method<DebugApi> kFail{"fail", Dispatch::kOneToAll};
}  // namespace debug

// Registers the types that ship with the library ("debug", ...). Called by
// RunWorkerMain; safe to call more than once.
void RegisterBuiltinWorkers();

}  // namespace roll
