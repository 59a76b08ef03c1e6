#pragma once
// Dispatch modes: how a Cluster call spreads its input over ranks and how it
// gathers the replies. Shared by the controller (split, collect) and workers
// (method declarations).

#include <string_view>
#include <vector>

#include "roll/common/batch.h"
#include "roll/common/status.h"

namespace roll {

enum class Dispatch {
  kOneToAll,      // the same Batch goes to every rank; replies are kept per rank
  kAllToAll,      // the caller gives one Batch per rank; replies are kept per rank
  kDataParallel,  // the Batch is chunked over ranks; replies are concatenated in rank order
};

enum class Execute {
  kAll,       // every rank runs the method
  kRankZero,  // only rank 0 runs it (e.g. saving a checkpoint of replicated state)
};

std::string_view DispatchName(Dispatch d);
std::string_view ExecuteName(Execute e);

// A worker method as both sides know it. Declared once per worker API as a
// constant, e.g. `inline constexpr Method<EchoApi> kEcho{"echo", Dispatch::kOneToAll};`
// The Api type parameter lets Cluster<Api> refuse methods of another worker type
// at compile time.
struct MethodSpec {
  std::string_view name;
  Dispatch dispatch = Dispatch::kOneToAll;
  Execute execute = Execute::kAll;
};

template <class Api>
struct Method : MethodSpec {
  constexpr Method(std::string_view n, Dispatch d = Dispatch::kOneToAll, Execute e = Execute::kAll)
      : MethodSpec{n, d, e} {}
};

// The ranks a call with `execute` runs on, for a cluster of `world_size`.
std::vector<int> ExecutingRanks(Execute execute, int world_size);

// Inputs per executing rank (in ExecutingRanks order).
//   kOneToAll: `input` for each rank (shared, not copied);
//   kDataParallel: Chunk(n) of `input`; InvalidArgument when the batch does
//   not divide evenly and `require_even` is set.
absl::StatusOr<std::vector<Batch>> SplitForDispatch(const MethodSpec& method, const Batch& input,
                                                    int world_size, bool require_even = false);

// Gathers replies for the caller: kDataParallel concatenates in rank order;
// the other modes return rank 0's reply when `single` is requested.
absl::StatusOr<Batch> CollectReplies(const MethodSpec& method, const std::vector<Batch>& replies);

}  // namespace roll
