// The "gloo" backend: c10d's ProcessGroupGloo, which Debian's LibTorch
// ships compiled in. c10d runs each collective on its own worker threads and
// hands back a c10d::Work; this file only validates inputs, converts
// exceptions at the boundary, and tracks the broken state.

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "roll/common/status.h"
#include "strategies/communicator_internal.h"

namespace roll::internal {
namespace {

// State a communicator shares with the work handles it issued.
struct GlooShared {
  CommunicatorOptions options;
  std::string label;
  BrokenState broken;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

class GlooWork final : public CollectiveWork {
 public:
  GlooWork(std::shared_ptr<GlooShared> shared, c10::intrusive_ptr<c10d::Work> work,
           std::string what, std::function<void()> on_success)
      : shared_(std::move(shared)),
        work_(std::move(work)),
        what_(std::move(what)),
        on_success_(std::move(on_success)) {}

  bool IsCompleted() override {
    if (done_) return true;
    try {
      return work_->isCompleted();
    } catch (...) {
      return true;  // Failed: Wait reports how.
    }
  }

  absl::Status Wait(std::chrono::milliseconds timeout) override {
    if (done_) return status_;
    const auto limit = ResolveTimeout(timeout, shared_->options);
    done_ = true;
    try {
      work_->wait(limit);
      if (on_success_) on_success_();
      status_ = absl::OkStatus();
    } catch (...) {
      absl::Status cause = StatusFromException(std::current_exception(), "");
      absl::string_view detail = cause.message();
      if (absl::StartsWith(detail, ": ")) detail.remove_prefix(2);
      if (absl::IsDeadlineExceeded(cause)) {
        status_ = absl::DeadlineExceededError(absl::StrCat(
            shared_->label, ": ", what_, " did not complete within ", limit.count(),
            " ms -- a peer never issued it or stalled (", detail, ")"));
      } else {
        status_ = absl::Status(cause.code(),
                               absl::StrCat(shared_->label, ": ", what_, " failed: ", detail));
      }
      shared_->broken.Break(status_);
    }
    return status_;
  }

 private:
  std::shared_ptr<GlooShared> shared_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::function<void()> on_success_;
  bool done_ = false;
  absl::Status status_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<GlooShared> shared) : shared_(std::move(shared)) {}

  ~GlooCommunicator() override {
    // ProcessGroupGloo's destructor drains its queue and joins its threads;
    // it must not throw out of ours.
    try {
      shared_->pg.reset();
    } catch (...) {
    }
  }

  int rank() const override { return shared_->options.rank; }
  int world_size() const override { return shared_->options.world_size; }
  const std::string& group_name() const override { return shared_->options.group_name; }
  std::string_view backend() const override { return "gloo"; }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> AllReduceAsync(at::Tensor& tensor,
                                                                 ReduceOp op) override {
    const std::string what = "allreduce(" + std::string(ReduceOpName(op)) + ")";
    ROLL_RETURN_IF_ERROR(CheckTensor(tensor, what));
    if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          shared_->label, ": ", what, ": avg needs a floating-point tensor, got ", internal::DescribeTensor(tensor)));
    }
    c10d::AllreduceOptions opts;
    // Gloo has no average: sum, then divide once the sum arrived.
    opts.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    opts.timeout = shared_->options.timeout;
    std::function<void()> on_success;
    if (op == ReduceOp::kAvg && world_size() > 1) {
      on_success = [tensor, n = world_size()]() mutable { tensor.div_(n); };
    }
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(tensor)), std::move(on_success),
                 [&](c10d::ProcessGroupGloo& pg) {
                   std::vector<at::Tensor> tensors{tensor};
                   return pg.allreduce(tensors, opts);
                 });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> BroadcastAsync(at::Tensor& tensor,
                                                                 int root) override {
    const std::string what = absl::StrCat("broadcast(root ", root, ")");
    ROLL_RETURN_IF_ERROR(CheckTensor(tensor, what));
    if (root < 0 || root >= world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->label, ": ", what,
                                                     ": root is outside [0, ", world_size(), ")"));
    }
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = shared_->options.timeout;
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(tensor)), nullptr,
                 [&](c10d::ProcessGroupGloo& pg) {
                   std::vector<at::Tensor> tensors{tensor};
                   return pg.broadcast(tensors, opts);
                 });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> AllGatherAsync(
      const at::Tensor& input, std::vector<at::Tensor>* outputs) override {
    if (outputs == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->label, ": allgather: outputs is null"));
    }
    outputs->clear();
    ROLL_RETURN_IF_ERROR(CheckTensor(input, "allgather"));
    std::vector<std::vector<at::Tensor>> gathered(1);
    {
      // Gloo's threads fill the outputs with tensor ops, outside the
      // caller's InferenceMode: they must be normal tensors even when the
      // caller runs under InferenceMode (generation).
      c10::InferenceMode normal_tensors(false);
      for (int r = 0; r < world_size(); ++r) gathered[0].push_back(at::empty_like(input));
    }
    *outputs = gathered[0];  // Same storages: filled in place by the work.
    c10d::AllgatherOptions opts;
    opts.timeout = shared_->options.timeout;
    return Issue(absl::StrCat("allgather of ", internal::DescribeTensor(input)), nullptr,
                 [&](c10d::ProcessGroupGloo& pg) {
                   std::vector<at::Tensor> inputs{input};
                   return pg.allgather(gathered, inputs, opts);
                 });
  }

  // This LibTorch's gloo has no reduce-scatter; an all-to-all of the equal
  // chunks moves the same bytes as a ring reduce-scatter ((N-1)/N of the
  // input per rank), and the sum over received chunks runs in rank order,
  // so every run reduces the same way.
  absl::StatusOr<std::unique_ptr<CollectiveWork>> ReduceScatterAsync(const at::Tensor& input,
                                                                     at::Tensor* output,
                                                                     ReduceOp op) override {
    const std::string what = "reducescatter(" + std::string(ReduceOpName(op)) + ")";
    ROLL_RETURN_IF_ERROR(CheckTensor(input, what));
    ROLL_RETURN_IF_ERROR(CheckReduceScatterShapes(input, output, world_size(), shared_->label));
    ROLL_RETURN_IF_ERROR(CheckTensor(*output, what));
    if (op == ReduceOp::kAvg && !at::isFloatingType(input.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          shared_->label, ": ", what, ": avg needs a floating-point tensor, got ", internal::DescribeTensor(input)));
    }
    at::Tensor received;
    {
      c10::InferenceMode normal_tensors(false);  // as in AllGatherAsync
      received = at::empty_like(input);
    }
    at::Tensor out = *output;
    const int n = world_size();
    auto reduce = [received, out, op, n]() mutable {
      at::NoGradGuard no_grad;
      at::Tensor chunks = received.view({n, -1});
      at::Tensor acc = chunks[0].clone();
      for (int r = 1; r < n; ++r) {
        if (op == ReduceOp::kMax) {
          acc = at::maximum(acc, chunks[r]);
        } else {
          acc.add_(chunks[r]);
        }
      }
      if (op == ReduceOp::kAvg) acc.div_(n);
      out.view({-1}).copy_(acc);
    };
    c10d::AllToAllOptions opts;
    opts.timeout = shared_->options.timeout;
    at::Tensor send = input;
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(input)), std::move(reduce),
                 [&](c10d::ProcessGroupGloo& pg) {
                   std::vector<int64_t> equal;  // empty: equal splits
                   return pg.alltoall_base(received, send, equal, equal, opts);
                 });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> BarrierAsync() override {
    c10d::BarrierOptions opts;
    opts.timeout = shared_->options.timeout;
    return Issue("barrier", nullptr,
                 [&](c10d::ProcessGroupGloo& pg) { return pg.barrier(opts); });
  }

 private:
  absl::Status CheckTensor(const at::Tensor& tensor, std::string_view what) const {
    ROLL_RETURN_IF_ERROR(shared_->broken.Check(shared_->label));
    ROLL_RETURN_IF_ERROR(CheckDenseContiguous(tensor, what, shared_->label));
    if (!tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->label, ": ", Sv(what),
                                                     ": the gloo backend needs a CPU tensor, got "
                                                     "one on ",
                                                     tensor.device().str()));
    }
    switch (tensor.scalar_type()) {
      case at::kFloat:
      case at::kDouble:
      case at::kHalf:
      case at::kChar:
      case at::kByte:
      case at::kInt:
      case at::kLong:
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            shared_->label, ": ", Sv(what), ": dtype ", internal::DescribeTensor(tensor),
            " is not supported by this LibTorch's gloo backend (use float32/64, float16, "
            "int8/uint8/int32/int64; cast bfloat16 and bool first)"));
    }
  }

  template <typename Start>
  absl::StatusOr<std::unique_ptr<CollectiveWork>> Issue(std::string what,
                                                        std::function<void()> on_success,
                                                        Start&& start) {
    ROLL_RETURN_IF_ERROR(shared_->broken.Check(shared_->label));
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start(*shared_->pg);
    } catch (...) {
      absl::Status s = StatusFromException(std::current_exception(),
                                           absl::StrCat(shared_->label, ": ", what));
      shared_->broken.Break(s);
      return s;
    }
    return std::unique_ptr<CollectiveWork>(
        new GlooWork(shared_, std::move(work), std::move(what), std::move(on_success)));
  }

  std::shared_ptr<GlooShared> shared_;
};

// LibTorch 2.x records every collective in c10d's process-wide flight
// recorder (2000 entries unless TORCH_FR_BUFFER_SIZE says otherwise). Its
// recording is not safe for groups of one process that issue collectives
// from several threads at once, as tensor-parallel slices do: it crashed
// in about 1 of 30 runs of the tensor-parallel tests on two busy cores.
// Nothing here reads the recorder, so it is off unless the user set it.
void DisableFlightRecorderByDefault() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    const CommunicatorOptions& options, c10::intrusive_ptr<c10d::Store> group_store) {
  DisableFlightRecorderByDefault();
  auto shared = std::make_shared<GlooShared>();
  shared->options = options;
  shared->label = GroupLabel(options);
  auto pg_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  try {
    pg_options->devices.push_back(
        options.gloo_interface.empty()
            ? c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname)
            : c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface));
  } catch (...) {
    absl::Status s = StatusFromException(
        std::current_exception(),
        options.gloo_interface.empty()
            ? absl::StrCat(shared->label, ": gloo transport on host '", options.gloo_hostname, "'")
            : absl::StrCat(shared->label, ": gloo transport on interface '",
                           options.gloo_interface, "'"));
    return absl::InvalidArgumentError(s.message());
  }
  // Two threads let a broadcast of one bucket overlap the next one.
  pg_options->threads = 2;
  try {
    shared->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(group_store, options.rank,
                                                             options.world_size, pg_options);
  } catch (...) {
    return StatusFromException(std::current_exception(),
                               absl::StrCat(shared->label, ": connecting gloo peers"));
  }
  return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(shared)));
}

}  // namespace roll::internal
