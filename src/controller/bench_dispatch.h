#pragma once
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

}  // namespace roll
