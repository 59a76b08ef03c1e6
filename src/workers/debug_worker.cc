#include "roll/worker/debug_worker.h"

#include <chrono>
#include <thread>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace roll {
namespace {

class DebugWorker : public Worker {
 public:
  absl::Status Initialize(const WorkerContext& ctx) override {
    rank_ = ctx.rank;
    return absl::OkStatus();
  }

  void RegisterMethods(MethodTable& table) override {
    table.Bind(debug::kNoop, this, &DebugWorker::Noop);
    table.Bind(debug::kEcho, this, &DebugWorker::Echo);
    table.Bind(debug::kWhoAmI, this, &DebugWorker::WhoAmI);
    table.Bind(debug::kDouble, this, &DebugWorker::Double);
    table.Bind(debug::kLeader, this, &DebugWorker::Leader);
    table.Bind(debug::kSleep, this, &DebugWorker::Sleep);
    table.Bind(debug::kFail, this, &DebugWorker::Fail);
  }

 private:
  absl::StatusOr<Batch> Noop(const Batch&) { return Batch(); }
  absl::StatusOr<Batch> Echo(const Batch& in) { return in; }

  absl::StatusOr<Batch> WhoAmI(const Batch& in) {
    Batch out = in;
    const int64_t n = std::max<int64_t>(in.size(), 1);
    out.SetTensor("rank", at::full({n}, rank_, at::kLong));
    out.SetColumn("rank", std::vector<std::string>(n, std::to_string(rank_)));
    return out;
  }

  absl::StatusOr<Batch> Double(const Batch& in) {
    ROLL_ASSIGN_OR_RETURN(at::Tensor x, in.Tensor("x"));
    Batch out = in;
    out.SetTensor("x", x * 2);
    out.SetColumn("rank", std::vector<std::string>(in.size(), std::to_string(rank_)));
    return out;
  }

  absl::StatusOr<Batch> Leader(const Batch&) {
    Batch out;
    out.SetMeta("rank", std::to_string(rank_));
    return out;
  }

  absl::StatusOr<Batch> Sleep(const Batch& in) {
    int64_t ms = 1000;
    if (!absl::SimpleAtoi(in.MetaOr("ms", "1000"), &ms) || ms < 0) {
      return absl::InvalidArgumentError("sleep: meta 'ms' must be a non-negative integer");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return in;
  }

  absl::StatusOr<Batch> Fail(const Batch& in) {
    const std::string ranks = in.MetaOr("ranks", "all");
    bool fail = ranks == "all";
    for (absl::string_view r : absl::StrSplit(ranks, ',')) {
      int v;
      if (absl::SimpleAtoi(r, &v) && v == rank_) fail = true;
    }
    if (!fail) return Batch();
    return absl::InvalidArgumentError(in.MetaOr("message", "requested failure"));
  }

  int rank_ = 0;
};

}  // namespace

void RegisterBuiltinWorkers() { RegisterWorkerType<DebugApi, DebugWorker>(); }

}  // namespace roll
