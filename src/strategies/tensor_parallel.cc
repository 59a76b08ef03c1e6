#include "roll/strategies/tensor_parallel.h"

#include <torch/torch.h>

#include <vector>

#include "roll/strategies/communicator.h"

namespace roll {
namespace {

class CommunicatorOps final : public TensorParallelOps {
 public:
  explicit CommunicatorOps(Communicator* c) : comm_(c) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->world_size(); }

  absl::Status AllReduceSum(at::Tensor& tensor) override {
    const bool widen = comm_->backend() == "gloo" && (tensor.scalar_type() == at::kBFloat16 ||
                                                      tensor.scalar_type() == at::kHalf);
    if (!widen) return comm_->AllReduce(tensor, ReduceOp::kSum);
    at::Tensor wide = tensor.to(at::kFloat);
    ROLL_RETURN_IF_ERROR(comm_->AllReduce(wide, ReduceOp::kSum));
    tensor.copy_(wide);
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> AllGatherLastDim(const at::Tensor& tensor) override {
    const bool as_half = comm_->backend() == "gloo" && tensor.scalar_type() == at::kBFloat16;
    const at::Tensor send = as_half ? tensor.contiguous().view(at::kHalf) : tensor.contiguous();
    ROLL_ASSIGN_OR_RETURN(std::vector<at::Tensor> parts, comm_->AllGather(send));
    at::Tensor full = at::cat(parts, -1);
    return as_half ? full.view(at::kBFloat16) : full;
  }

 private:
  Communicator* comm_;
};

}  // namespace

std::unique_ptr<TensorParallelOps> MakeTensorParallelOps(Communicator* communicator) {
  return std::make_unique<CommunicatorOps>(communicator);
}

}  // namespace roll
