#include "roll/strategies/tensor_parallel.h"

#include <torch/torch.h>

#include <atomic>
#include <thread>
#include <vector>

#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"

namespace roll {
namespace {

class CommunicatorOps final : public TensorParallelOps {
 public:
  explicit CommunicatorOps(Communicator* c) : comm_(c) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->world_size(); }
  int64_t comm_bytes() const override { return bytes_.load(); }

  absl::Status AllReduceSum(at::Tensor& tensor) override {
    bytes_ += static_cast<int64_t>(tensor.nbytes());
    const bool widen = comm_->backend() == "gloo" && (tensor.scalar_type() == at::kBFloat16 ||
                                                      tensor.scalar_type() == at::kHalf);
    if (!widen) return comm_->AllReduce(tensor, ReduceOp::kSum);
    at::Tensor wide = tensor.to(at::kFloat);
    ROLL_RETURN_IF_ERROR(comm_->AllReduce(wide, ReduceOp::kSum));
    tensor.copy_(wide);
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> AllGatherLastDim(const at::Tensor& tensor) override {
    bytes_ += static_cast<int64_t>(tensor.nbytes());
    const bool as_half = comm_->backend() == "gloo" && tensor.scalar_type() == at::kBFloat16;
    const at::Tensor send = as_half ? tensor.contiguous().view(at::kHalf) : tensor.contiguous();
    ROLL_ASSIGN_OR_RETURN(std::vector<at::Tensor> parts, comm_->AllGather(send));
    at::Tensor full = at::cat(parts, -1);
    return as_half ? full.view(at::kBFloat16) : full;
  }

 private:
  Communicator* comm_;
  std::atomic<int64_t> bytes_{0};
};

}  // namespace

std::unique_ptr<TensorParallelOps> MakeTensorParallelOps(Communicator* communicator) {
  return std::make_unique<CommunicatorOps>(communicator);
}

TensorParallelGroup::~TensorParallelGroup() {
  slices_.clear();  // before the ops they point to
  ops_.clear();
}

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> TensorParallelGroup::Create(
    const CausalLM& whole, int size, CommunicatorOptions base) {
  if (size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel group: size must be >= 2, got ", size));
  }
  std::unique_ptr<TensorParallelGroup> g(new TensorParallelGroup());
  base.world_size = size;
  g->comms_.resize(size);
  std::vector<absl::Status> status(size);
  std::vector<std::thread> joins;
  for (int r = 0; r < size; ++r) {
    joins.emplace_back([&, r] {
      CommunicatorOptions o = base;
      o.rank = r;
      auto c = CreateCommunicator(o);
      if (c.ok()) {
        g->comms_[r] = std::move(*c);
      } else {
        status[r] = c.status();
      }
    });
  }
  for (auto& t : joins) t.join();
  for (const absl::Status& s : status) ROLL_RETURN_IF_ERROR(Annotate(s, "tensor-parallel group"));
  for (int r = 0; r < size; ++r) {
    g->ops_.push_back(MakeTensorParallelOps(g->comms_[r].get()));
    ROLL_ASSIGN_OR_RETURN(auto slice, whole.TensorParallelSlice(r, size));
    slice->set_tensor_parallel(g->ops_.back().get());
    g->slices_.push_back(std::move(slice));
  }
  return g;
}

int64_t TensorParallelGroup::comm_bytes() const {
  return ops_.empty() ? 0 : ops_[0]->comm_bytes();
}

std::vector<CausalLM*> TensorParallelGroup::slices() const {
  std::vector<CausalLM*> out;
  for (const auto& s : slices_) out.push_back(s.get());
  return out;
}

absl::Status TensorParallelGroup::CopyFrom(const CausalLM& whole) {
  for (auto& s : slices_) ROLL_RETURN_IF_ERROR(s->CopySliceFrom(whole));
  return absl::OkStatus();
}

}  // namespace roll
