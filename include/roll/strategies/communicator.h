#pragma once
// Collective communication between the ranks of a worker group: the data
// plane that data-parallel training (gradient allreduce) and weight sync
// (bucketed broadcast) run on. Ranks find each other through a key-value
// store served over the control plane: in a job the controller hosts it at
// its own address, behind the job token (over TLS when the control plane
// uses it); a StoreServer hosts one for benches and tests. Every group
// namespaces its keys with its name, so many groups share one store.
//
// Backends:
//   "gloo" -- CPU tensors, LibTorch's c10d ProcessGroupGloo over TCP.
//   "nccl" -- CUDA tensors, NCCL's own C API; only in builds configured with
//             ROLL_WITH_NCCL (otherwise CreateCommunicator returns
//             Unimplemented).
//
// Every collective is bounded by a timeout: a peer that never joins or stops
// participating turns into a DeadlineExceeded (or Unavailable when its
// connection drops) status naming the group and the ranks -- never a hang.
// After any failed collective the communicator is broken: the ranks no
// longer agree on which operation comes next, so every later call fails
// fast with FailedPrecondition and the group must be created again under a
// new name.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace roll {

enum class ReduceOp { kSum, kAvg, kMax };

// "sum", "avg", "max": for error messages and logs.
std::string_view ReduceOpName(ReduceOp op);

// Passed as a timeout: use the group's CommunicatorOptions::timeout.
inline constexpr std::chrono::milliseconds kGroupTimeout{0};

// A standalone rendezvous store: a gRPC server with only the store service,
// listening on `host` (an address of this machine; only there) and guarded
// by a token. Workers reach it with CreateCommunicator through host(),
// port() and token(). In a job the controller's own server hosts the store
// instead.
//
// Owns the server; destroying it closes the store for every group on it.
// Thread-safe: the object itself has no mutable API.
class StoreServer {
 public:
  // Starts listening on host:`port` (0 = pick a free port, see port()); a
  // port in use is an error. `token`: what clients must present; empty = a
  // fresh random one.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port,
                                                            std::string token = "");

  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& host() const;
  int port() const;
  const std::string& token() const;

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct CommunicatorOptions {
  // "gloo" or "nccl".
  std::string backend = "gloo";
  // Where the store listens (the controller's address in a job) and the
  // token it wants. Required: store_port and store_token (no defaults).
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  std::string store_token;
  // Namespaces this group's keys in the store. Required, unique per store:
  // re-creating a group after a failure needs a new name (e.g. append an
  // epoch), because the old rendezvous keys stay in the store.
  std::string group_name;
  // 0 <= rank < world_size. Required.
  int rank = -1;
  int world_size = 0;
  // Bounds the rendezvous (all ranks joining) and is the default timeout of
  // every collective (kGroupTimeout). Default 30 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Gloo: the network interface ("eth0") whose address this rank's
  // transport binds to and announces to its peers. When empty,
  // gloo_hostname (a host name or address) is used instead; the default is
  // loopback, which only works when every rank is on one machine.
  std::string gloo_interface;
  std::string gloo_hostname = "127.0.0.1";
  // NCCL: the CUDA device this rank drives. Default 0.
  int cuda_device = 0;
};

// An in-flight collective, the handle an async call returns. Completion
// happens on the backend's threads; the handle itself, like its
// communicator, is used from one thread. It keeps what the operation needs
// alive, so it may outlive the communicator that issued it.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;

  // Non-blocking: true once the operation finished (successfully or not).
  virtual bool IsCompleted() = 0;

  // Blocks until the operation finishes or `timeout` passes (kGroupTimeout:
  // the group's timeout). Returns the same status when called again. A
  // timeout or failure breaks the communicator (see the file comment). The
  // tensors the operation writes are valid only after Wait returned OK.
  // The gloo transport itself gives up after the group's timeout, so a
  // longer `timeout` does not extend it.
  virtual absl::Status Wait(std::chrono::milliseconds timeout = kGroupTimeout) = 0;
};

// One rank's membership in a group of world_size() ranks.
//
// Thread-safety: not thread-safe. A communicator is used from one thread --
// the worker's executor -- because every rank must issue the same
// collectives in the same order; issuing from several threads would make
// that order nondeterministic.
//
// Tensors: every rank passes a tensor of the same shape and dtype, dense
// and contiguous, on the backend's device (CPU for gloo; the communicator's
// CUDA device for nccl). A tensor passed to an async call must not be
// touched until its handle's Wait returned.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const std::string& group_name() const = 0;
  virtual std::string_view backend() const = 0;

  // Reduces `tensor` in place across all ranks; every rank ends with the
  // result. kAvg needs a floating-point tensor.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> AllReduceAsync(at::Tensor& tensor,
                                                                         ReduceOp op) = 0;
  // Copies `root`'s tensor into `tensor` on every other rank.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> BroadcastAsync(at::Tensor& tensor,
                                                                         int root) = 0;
  // Fills `*outputs` with world_size() tensors shaped like `input`; entry r
  // holds rank r's input once Wait returned OK.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> AllGatherAsync(
      const at::Tensor& input, std::vector<at::Tensor>* outputs) = 0;
  // `input` holds world_size() equal chunks (input.numel() ==
  // world_size() * output->numel(), same dtype); `*output` ends with the
  // reduction over ranks of chunk rank() -- what sharded training needs for
  // gradients: each rank keeps the summed gradient of its own shard.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> ReduceScatterAsync(
      const at::Tensor& input, at::Tensor* output, ReduceOp op) = 0;
  // Completes once every rank issued it.
  virtual absl::StatusOr<std::unique_ptr<CollectiveWork>> BarrierAsync() = 0;

  // Blocking forms: issue, then Wait(timeout).
  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op,
                         std::chrono::milliseconds timeout = kGroupTimeout);
  absl::Status Broadcast(at::Tensor& tensor, int root,
                         std::chrono::milliseconds timeout = kGroupTimeout);
  absl::StatusOr<std::vector<at::Tensor>> AllGather(
      const at::Tensor& input, std::chrono::milliseconds timeout = kGroupTimeout);
  absl::Status ReduceScatter(const at::Tensor& input, at::Tensor* output, ReduceOp op,
                             std::chrono::milliseconds timeout = kGroupTimeout);
  absl::Status Barrier(std::chrono::milliseconds timeout = kGroupTimeout);
};

// Joins the group described by `options`: connects to the store, waits
// until all world_size ranks arrived (at most options.timeout) and sets up
// the backend's connections. Blocks; every rank of the group must call it.
// Errors: InvalidArgument for bad options, DeadlineExceeded naming the ranks
// that did not arrive, FailedPrecondition when this rank already joined a
// group of that name on this store, Unimplemented for "nccl" in a build
// without ROLL_WITH_NCCL.
// A peer that dies closes its connections: so that a write to one fails the
// collective with an error instead of killing this process, the first call
// sets SIGPIPE to ignored when it still has its default action.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options);

}  // namespace roll
