#pragma once
// Control-plane benches.
// `roll bench dispatch`: latency of a fan-out no-op round trip through the
// runtime (token, executor, batch codec, dispatch) and throughput of a 1 MB
// Batch fan-out, each next to the same measurement on a plain gRPC
// callback-API service in the same worker processes.

#include <string>

#include "roll/common/status.h"

namespace roll {

struct DispatchBenchOptions {
  int workers = 4;
  int calls = 2000;
  int payload_calls = 200;
  int payload_bytes = 1 << 20;
};

// Returns one JSON object (a single line).
absl::StatusOr<std::string> RunDispatchBench(const DispatchBenchOptions& options);

// `roll bench env-step`: one step of `episodes` FrozenLake episodes spread
// over `workers` environment workers, through the EnvironmentClient, next
// to a no-op fan-out through the runtime and the plain gRPC fan-out to the
// same processes.
struct EnvStepBenchOptions {
  int workers = 4;
  int episodes = 64;
  int rounds = 500;
};
absl::StatusOr<std::string> RunEnvStepBench(const EnvStepBenchOptions& options);

}  // namespace roll
