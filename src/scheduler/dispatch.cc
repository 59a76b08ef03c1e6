#include "roll/scheduler/dispatch.h"

#include "absl/strings/str_cat.h"

namespace roll {

std::string_view DispatchName(Dispatch d) {
  switch (d) {
    case Dispatch::kOneToAll: return "one_to_all";
    case Dispatch::kAllToAll: return "all_to_all";
    case Dispatch::kDataParallel: return "data_parallel";
  }
  return "unknown";
}

std::string_view ExecuteName(Execute e) {
  return e == Execute::kAll ? "all" : "rank_zero";
}

std::vector<int> ExecutingRanks(Execute execute, int world_size) {
  if (world_size <= 0) return {};
  if (execute == Execute::kRankZero) return {0};
  std::vector<int> ranks(world_size);
  for (int i = 0; i < world_size; ++i) ranks[i] = i;
  return ranks;
}

absl::StatusOr<std::vector<Batch>> SplitForDispatch(const MethodSpec& method, const Batch& input,
                                                    int world_size, bool require_even) {
  const int n = static_cast<int>(ExecutingRanks(method.execute, world_size).size());
  if (n == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("method '", Sv(method.name), "': cluster has no workers"));
  }
  switch (method.dispatch) {
    case Dispatch::kOneToAll:
      return std::vector<Batch>(n, input);
    case Dispatch::kDataParallel: {
      if (require_even && input.size() % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "method '", Sv(method.name), "': batch of ", input.size(),
            " samples does not divide across ", n, " data-parallel ranks"));
      }
      return input.Chunk(n);
    }
    case Dispatch::kAllToAll:
      return absl::InvalidArgumentError(absl::StrCat(
          "method '", Sv(method.name), "' is all_to_all: pass one Batch per rank (CallEach)"));
  }
  return absl::InternalError("unknown dispatch mode");
}

absl::StatusOr<Batch> CollectReplies(const MethodSpec& method, const std::vector<Batch>& replies) {
  if (replies.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("method '", Sv(method.name), "': no replies"));
  }
  if (method.dispatch == Dispatch::kDataParallel) {
    auto merged = Batch::Concat(replies);
    if (!merged.ok()) return Annotate(merged.status(), absl::StrCat("method '", Sv(method.name), "': concat replies"));
    return merged;
  }
  return replies.front();
}

}  // namespace roll
