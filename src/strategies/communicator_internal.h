#pragma once
// Pieces shared by the communicator backends: store connection, the
// rendezvous that names missing ranks, exception-to-Status conversion and
// the "broken after an error" state. Private to src/strategies.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "roll/strategies/communicator.h"

namespace roll::internal {

// What the control-plane store throws through c10d (which reports store
// failures as exceptions); StatusFromException returns its status.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// "group 'name' (rank r of n)": the prefix of every error a group reports.
std::string GroupLabel(const CommunicatorOptions& options);

// "Float[1024]": a tensor's dtype and size in an error message.
std::string DescribeTensor(const at::Tensor& t);

// Converts the exception a library threw (c10::Error, gloo::IoException,
// anything else) into a Status prefixed with `context`. Timeouts become
// DeadlineExceeded and lost peer connections Unavailable, so callers can
// tell "slow or missing peer" from a programming error.
absl::Status StatusFromException(std::exception_ptr error, std::string_view context);

// Connects to the store (one round trip, so an unreachable store or a wrong
// token fails here) and wraps it in a PrefixStore holding this group's keys.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectGroupStore(
    const CommunicatorOptions& options);

// Registers this rank in the group and waits until all ranks registered.
// On timeout the error lists the ranks that never arrived.
absl::Status JoinGroup(c10d::Store& group_store, const CommunicatorOptions& options);

// `timeout` with kGroupTimeout replaced by the group's timeout.
inline std::chrono::milliseconds ResolveTimeout(std::chrono::milliseconds timeout,
                                                const CommunicatorOptions& options) {
  return timeout == kGroupTimeout ? options.timeout : timeout;
}

// Remembers the first failed collective. Shared between a communicator and
// its in-flight work handles, which may outlive it.
class BrokenState {
 public:
  // OK while no collective failed; afterwards FailedPrecondition quoting the
  // first failure.
  absl::Status Check(std::string_view label) const;
  void Break(const absl::Status& cause);

 private:
  mutable std::mutex mu_;
  absl::Status cause_;
};

// Checks what every backend requires of a tensor: defined, dense,
// contiguous. `what` names the operation for the message.
absl::Status CheckDenseContiguous(const at::Tensor& tensor, std::string_view what,
                                  std::string_view label);

// Reduce-scatter's shapes: `output` non-null, dtype of `input`, and
// input.numel() == world_size * output->numel(); errors name the group.
absl::Status CheckReduceScatterShapes(const at::Tensor& input, const at::Tensor* output,
                                      int world_size, std::string_view label);

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    const CommunicatorOptions& options, c10::intrusive_ptr<c10d::Store> group_store);

#ifdef ROLL_WITH_NCCL
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const CommunicatorOptions& options, c10::intrusive_ptr<c10d::Store> group_store);
#endif

}  // namespace roll::internal
