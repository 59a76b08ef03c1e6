#pragma once
// Tensor-parallel training, private to the strategies library: a
// TensorParallelGroup's slices trained together, one thread each (the
// slices' collectives need each other, so their forward and backward run
// at once). TrainStrategy drives it; the layout of the split is
// roll/models/tensor_parallel.h's.
//
// The optimizer updates every slice's parameters; a replicated parameter
// (the norms) gets the same gradient and so the same update on every slice.
// Checkpoints hold whole tensors: the optimizer state is converted to the
// whole model's names and shapes on save and cut into slices on load, so a
// trainer state resumes with any tensor-parallel size, or none.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/status.h"
#include "roll/strategies/tensor_parallel.h"
#include "strategies/slice_threads.h"

namespace roll {
class CausalLM;
}

namespace roll::strategies_internal {

class TensorParallelTrainer {
 public:
  // Takes the group made from `whole` and frees `whole`'s parameter storage
  // (Materialize brings it back when the whole model is needed).
  static absl::StatusOr<std::unique_ptr<TensorParallelTrainer>> Create(
      CausalLM& whole, std::unique_ptr<TensorParallelGroup> group);
  ~TensorParallelTrainer();

  int size() const { return static_cast<int>(slices_.size()); }
  // Bytes slice 0 has handed to the group's collectives so far.
  int64_t comm_bytes() const { return group_->comm_bytes(); }
  CausalLM& slice(int rank) { return *slices_[rank]; }

  // Runs fn(rank) for every slice at once: slice 0 on this thread, the
  // others on the slice threads, each with this thread's grad mode. The
  // first error by rank (an exception becomes an Internal error).
  absl::Status RunOnSlices(const std::function<absl::Status(int rank)>& fn);

  // Every slice's trainable parameters, named "tp<r>/<name>" (for the
  // optimizer), slice by slice.
  std::vector<std::pair<std::string, at::Tensor>> OptimizerParams() const;
  // The parameters that hold each element of the model once: the split
  // ones of every slice and the replicated ones of slice 0 (for the
  // gradient norm).
  std::vector<at::Tensor> DistinctParams() const;
  // Every slice's replicated parameters take slice 0's gradients, so their
  // copies stay bit-equal whatever the slices' thread counts did to the
  // rounding.
  void ShareReplicatedGradients() const;

  // `whole`'s parameters take the slices' values (concatenated along their
  // split dimension); Release frees them again.
  absl::Status Materialize(CausalLM& whole) const;
  void Release(CausalLM& whole) const;
  // Every slice copies its part of `whole` (materialized) in.
  absl::Status CopyFrom(const CausalLM& whole);

  // Optimizer state by slice ("exp_avg/tp<r>/<name>") <-> by whole
  // parameter ("exp_avg/<name>"), tensors cut or joined along the
  // parameter's split dimension. Errors name `source` and the tensor.
  std::map<std::string, at::Tensor> WholeState(const std::map<std::string, at::Tensor>& by_slice) const;
  absl::StatusOr<std::map<std::string, at::Tensor>> SliceState(
      const std::map<std::string, at::Tensor>& whole, const std::string& source) const;

 private:
  TensorParallelTrainer() = default;
  std::unique_ptr<TensorParallelGroup> group_;
  std::vector<CausalLM*> slices_;
  std::unique_ptr<SliceThreads> threads_;  // slices 1..
};

}  // namespace roll::strategies_internal
