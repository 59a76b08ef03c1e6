// The "nccl" backend, written against NCCL's and the CUDA runtime's C APIs
// so that it builds against a LibTorch without CUDA (Debian's): tensors are
// only inspected for their device, dtype, size and data pointer, never
// handed to a CUDA kernel of LibTorch.
//
// The communicator is created non-blocking (ncclConfig_t::blocking = 0):
// initialization and every enqueue are polled against a deadline, and a
// collective that does not finish in time aborts the communicator instead
// of hanging the caller.
//
// Ordering: collectives run on a stream created with cudaStreamCreate,
// which synchronizes with the legacy default stream, so work LibTorch (or
// the caller) queued on the default stream before the call finishes before
// the collective reads the tensor. Wait() returns once the collective
// finished on the device.

#include <cuda_runtime.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/common/status.h"
#include "strategies/communicator_internal.h"

namespace roll::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUniqueIdKey[] = "roll/nccl_unique_id";

absl::Status CudaError(cudaError_t err, std::string_view label, std::string_view what) {
  return absl::InternalError(absl::StrCat(Sv(label), ": ", Sv(what), ": CUDA error ",
                                          cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                          ")"));
}

absl::Status NcclError(ncclResult_t res, ncclComm_t comm, std::string_view label,
                       std::string_view what) {
  const char* last = ncclGetLastError(comm);
  std::string text = absl::StrCat(Sv(label), ": ", Sv(what), ": NCCL error ",
                                  ncclGetErrorString(res),
                                  last != nullptr && *last ? absl::StrCat(" (", last, ")") : "");
  // A peer that disappeared surfaces as a remote/system error.
  if (res == ncclRemoteError || res == ncclSystemError) return absl::UnavailableError(text);
  if (res == ncclInvalidArgument || res == ncclInvalidUsage) return absl::InvalidArgumentError(text);
  return absl::InternalError(text);
}

// State a communicator shares with the work handles it issued.
struct NcclShared {
  CommunicatorOptions options;
  std::string label;
  BrokenState broken;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* barrier_buffer = nullptr;  // One float, for Barrier.

  ~NcclShared() {
    cudaSetDevice(options.cuda_device);
    if (comm != nullptr) {
      // A broken communicator may have operations stuck in flight:
      // destroying it would wait for them.
      if (!broken.Check(label).ok()) {
        ncclCommAbort(comm);
      } else {
        ncclCommDestroy(comm);
      }
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (barrier_buffer != nullptr) cudaFree(barrier_buffer);
  }

  // Polls the communicator's asynchronous state until it leaves
  // ncclInProgress or `deadline` passes; aborts on timeout.
  absl::Status AwaitReady(Clock::time_point deadline, std::string_view what) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t res = ncclCommGetAsyncError(comm, &state);
      if (res != ncclSuccess) return Fail(NcclError(res, comm, label, what));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Fail(NcclError(state, comm, label, what));
      if (Clock::now() >= deadline) return Fail(TimedOut(what));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  absl::Status TimedOut(std::string_view what) const {
    return absl::DeadlineExceededError(
        absl::StrCat(label, ": ", Sv(what), " did not complete within ", options.timeout.count(),
                     " ms -- a peer never issued it or stalled"));
  }

  // Marks the group broken and aborts NCCL so no call can hang on it.
  absl::Status Fail(absl::Status cause) {
    broken.Break(cause);
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    return cause;
  }
};

class NcclWork final : public CollectiveWork {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, cudaEvent_t done, std::string what)
      : shared_(std::move(shared)), done_event_(done), what_(std::move(what)) {}

  ~NcclWork() override {
    if (done_event_ != nullptr) cudaEventDestroy(done_event_);
  }

  bool IsCompleted() override {
    if (finished_) return true;
    return cudaEventQuery(done_event_) != cudaErrorNotReady;
  }

  absl::Status Wait(std::chrono::milliseconds timeout) override {
    if (finished_) return status_;
    finished_ = true;
    const auto limit = ResolveTimeout(timeout, shared_->options);
    const auto deadline = Clock::now() + limit;
    for (;;) {
      cudaError_t q = cudaEventQuery(done_event_);
      if (q == cudaSuccess) return status_ = absl::OkStatus();
      if (q != cudaErrorNotReady) {
        return status_ = shared_->Fail(CudaError(q, shared_->label, what_));
      }
      if (shared_->comm == nullptr) {
        return status_ = shared_->broken.Check(shared_->label);
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(shared_->comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return status_ = shared_->Fail(NcclError(state, shared_->comm, shared_->label, what_));
      }
      if (Clock::now() >= deadline) {
        return status_ = shared_->Fail(absl::DeadlineExceededError(absl::StrCat(
                   shared_->label, ": ", what_, " did not complete within ", limit.count(),
                   " ms -- a peer never issued it or stalled")));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t done_event_;
  std::string what_;
  bool finished_ = false;
  absl::Status status_;
};

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
      return ncclUint8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", Sv(std::string_view(c10::toString(t))), " has no NCCL type"));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<NcclShared> shared) : shared_(std::move(shared)) {}

  int rank() const override { return shared_->options.rank; }
  int world_size() const override { return shared_->options.world_size; }
  const std::string& group_name() const override { return shared_->options.group_name; }
  std::string_view backend() const override { return "nccl"; }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> AllReduceAsync(at::Tensor& tensor,
                                                                 ReduceOp op) override {
    const std::string what = absl::StrCat("allreduce(", Sv(ReduceOpName(op)), ")");
    ROLL_ASSIGN_OR_RETURN(ncclDataType_t type, CheckTensor(tensor, what));
    if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          shared_->label, ": ", what, ": avg needs a floating-point tensor, got ", internal::DescribeTensor(tensor)));
    }
    const ncclRedOp_t red = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kAvg ? ncclAvg : ncclMax;
    void* data = tensor.data_ptr();
    const size_t count = tensor.numel();
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(tensor)), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(data, data, count, type, red, comm, s);
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> BroadcastAsync(at::Tensor& tensor,
                                                                 int root) override {
    const std::string what = absl::StrCat("broadcast(root ", root, ")");
    ROLL_ASSIGN_OR_RETURN(ncclDataType_t type, CheckTensor(tensor, what));
    if (root < 0 || root >= world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->label, ": ", what,
                                                     ": root is outside [0, ", world_size(), ")"));
    }
    void* data = tensor.data_ptr();
    const size_t count = tensor.numel();
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(tensor)), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(data, data, count, type, root, comm, s);
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> AllGatherAsync(
      const at::Tensor& input, std::vector<at::Tensor>* outputs) override {
    if (outputs == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->label, ": allgather: outputs is null"));
    }
    outputs->clear();
    ROLL_ASSIGN_OR_RETURN(ncclDataType_t type, CheckTensor(input, "allgather"));
    const size_t count = input.numel();
    const size_t bytes = count * input.element_size();
    // Separate buffers (not views of one): a LibTorch without CUDA cannot
    // run even view kernels on CUDA tensors. One broadcast per rank, fused
    // in a group, is NCCL's allgather into scattered outputs.
    std::vector<at::Tensor> gathered;
    for (int r = 0; r < world_size(); ++r) {
      void* ptr = nullptr;
      if (cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes); err != cudaSuccess) {
        return CudaError(err, shared_->label, "allgather: allocating the output");
      }
      gathered.push_back(at::for_blob(ptr, input.sizes())
                             .deleter([](void* p) { cudaFree(p); })
                             .options(input.options())
                             .target_device(input.device())
                             .make_tensor());
    }
    *outputs = gathered;
    const void* send = input.data_ptr();
    return Issue(absl::StrCat("allgather of ", internal::DescribeTensor(input)), [&](ncclComm_t comm,
                                                                     cudaStream_t s) {
      ncclResult_t res = ncclGroupStart();
      for (int r = 0; r < world_size() && (res == ncclSuccess || res == ncclInProgress); ++r) {
        res = ncclBroadcast(send, gathered[r].data_ptr(), count, type, r, comm, s);
      }
      ncclResult_t end = ncclGroupEnd();
      return res == ncclSuccess || res == ncclInProgress ? end : res;
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> ReduceScatterAsync(const at::Tensor& input,
                                                                     at::Tensor* output,
                                                                     ReduceOp op) override {
    const std::string what = absl::StrCat("reducescatter(", Sv(ReduceOpName(op)), ")");
    ROLL_ASSIGN_OR_RETURN(ncclDataType_t type, CheckTensor(input, what));
    ROLL_RETURN_IF_ERROR(CheckReduceScatterShapes(input, output, world_size(), shared_->label));
    ROLL_RETURN_IF_ERROR(CheckTensor(*output, what).status());
    if (op == ReduceOp::kAvg && !at::isFloatingType(input.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          shared_->label, ": ", what, ": avg needs a floating-point tensor, got ", internal::DescribeTensor(input)));
    }
    const ncclRedOp_t red = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kAvg ? ncclAvg : ncclMax;
    const void* send = input.data_ptr();
    void* recv = output->data_ptr();
    const size_t count = output->numel();
    return Issue(absl::StrCat(what, " of ", internal::DescribeTensor(input)), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(send, recv, count, type, red, comm, s);
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> BarrierAsync() override {
    ROLL_RETURN_IF_ERROR(shared_->broken.Check(shared_->label));
    void* buf = shared_->barrier_buffer;
    return Issue("barrier", [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s);
    });
  }

 private:
  absl::StatusOr<ncclDataType_t> CheckTensor(const at::Tensor& tensor, std::string_view what) const {
    ROLL_RETURN_IF_ERROR(shared_->broken.Check(shared_->label));
    ROLL_RETURN_IF_ERROR(CheckDenseContiguous(tensor, what, shared_->label));
    const int device = shared_->options.cuda_device;
    if (!tensor.device().is_cuda() || tensor.device().index() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          shared_->label, ": ", Sv(what), ": the nccl backend needs a tensor on cuda:", device,
          ", got one on ", tensor.device().str()));
    }
    auto type = NcclType(tensor.scalar_type());
    if (!type.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(shared_->label, ": ", Sv(what), ": ", type.status().message()));
    }
    return type;
  }

  template <typename Enqueue>
  absl::StatusOr<std::unique_ptr<CollectiveWork>> Issue(std::string what, Enqueue&& enqueue) {
    ROLL_RETURN_IF_ERROR(shared_->broken.Check(shared_->label));
    const auto deadline = Clock::now() + shared_->options.timeout;
    if (cudaError_t err = cudaSetDevice(shared_->options.cuda_device); err != cudaSuccess) {
      return shared_->Fail(CudaError(err, shared_->label, what));
    }
    ncclResult_t res = enqueue(shared_->comm, shared_->stream);
    if (res != ncclSuccess && res != ncclInProgress) {
      return shared_->Fail(NcclError(res, shared_->comm, shared_->label, what));
    }
    if (res == ncclInProgress) ROLL_RETURN_IF_ERROR(shared_->AwaitReady(deadline, what));
    cudaEvent_t done = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
        err != cudaSuccess) {
      return shared_->Fail(CudaError(err, shared_->label, what));
    }
    if (cudaError_t err = cudaEventRecord(done, shared_->stream); err != cudaSuccess) {
      cudaEventDestroy(done);
      return shared_->Fail(CudaError(err, shared_->label, what));
    }
    return std::unique_ptr<CollectiveWork>(new NcclWork(shared_, done, std::move(what)));
  }

  std::shared_ptr<NcclShared> shared_;
};

// Rank 0 creates the unique id; the others read it from the group's store.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(c10d::Store& store, const CommunicatorOptions& o,
                                              const std::string& label) {
  ncclUniqueId id;
  try {
    if (o.rank == 0) {
      if (ncclResult_t res = ncclGetUniqueId(&id); res != ncclSuccess) {
        return NcclError(res, nullptr, label, "ncclGetUniqueId");
      }
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store.set(kUniqueIdKey, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
      return id;
    }
    store.wait({kUniqueIdKey}, o.timeout);
    std::vector<uint8_t> value = store.get(kUniqueIdKey);
    if (value.size() != sizeof(id)) {
      return absl::InternalError(absl::StrCat(label, ": NCCL unique id in the store has ",
                                              value.size(), " bytes, expected ", sizeof(id)));
    }
    std::memcpy(&id, value.data(), sizeof(id));
    return id;
  } catch (...) {
    return StatusFromException(std::current_exception(),
                               absl::StrCat(label, ": exchanging the NCCL unique id"));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const CommunicatorOptions& options, c10::intrusive_ptr<c10d::Store> group_store) {
  auto shared = std::make_shared<NcclShared>();
  shared->options = options;
  shared->label = GroupLabel(options);
  const std::string& label = shared->label;
  const auto deadline = Clock::now() + options.timeout;

  int devices = 0;
  if (cudaError_t err = cudaGetDeviceCount(&devices); err != cudaSuccess || devices == 0) {
    // No GPU or no driver: a property of the machine, not a failure of NCCL.
    return absl::FailedPreconditionError(absl::StrCat(
        label, ": backend \"nccl\" needs a CUDA device per rank and this process sees none (",
        err == cudaSuccess ? "0 devices" : absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err)),
        "); use backend \"gloo\" on CPUs"));
  }
  if (options.cuda_device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": cuda_device ", options.cuda_device,
                                                   " does not exist (", devices, " visible)"));
  }
  if (cudaError_t err = cudaSetDevice(options.cuda_device); err != cudaSuccess) {
    return CudaError(err, label, "selecting the CUDA device");
  }
  ROLL_ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeUniqueId(*group_store, options, label));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t res =
      ncclCommInitRankConfig(&shared->comm, options.world_size, id, options.rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    absl::Status s = NcclError(res, shared->comm, label, "ncclCommInitRankConfig");
    if (shared->comm != nullptr) {
      ncclCommAbort(shared->comm);
      shared->comm = nullptr;
    }
    return s;
  }
  ROLL_RETURN_IF_ERROR(shared->AwaitReady(deadline, "initializing the NCCL communicator"));
  if (cudaError_t err = cudaStreamCreate(&shared->stream); err != cudaSuccess) {
    return CudaError(err, label, "creating the collective stream");
  }
  if (cudaError_t err = cudaMalloc(&shared->barrier_buffer, sizeof(float)); err != cudaSuccess) {
    return CudaError(err, label, "allocating the barrier buffer");
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(shared)));
}

}  // namespace roll::internal
