#pragma once
// Tensor parallelism (Megatron-style) for CausalLM: a model split over the
// ranks of a tensor-parallel group, each rank a CausalLM holding its slice
// (ModelOptions::tp_rank / tp_size):
//   column-parallel (split along dim 0 of the weight, output features):
//     q_proj, k_proj, v_proj (whole attention heads per rank), gate_proj,
//     up_proj, with their biases; the vocabulary of embed_tokens and
//     lm_head;
//   row-parallel (split along dim 1, input features): o_proj, down_proj;
//     each rank computes a partial sum, the group all-reduces it, and a
//     bias is added once after the reduction;
//   replicated: the norms (RMSNorm, per-head q/k norms), row-parallel
//     biases, the value head.
// The embedding looks up the ids in its vocabulary range (zeros elsewhere)
// and all-reduces; the LM head computes its vocabulary range's logits and
// all-gathers them. Every rank then holds the same hidden states and full
// logits, so the layers between need no other communication. Per layer
// and token that is two all-reduces of `hidden` values.
//
// The model reaches its group only through TensorParallelOps, which the
// strategies layer implements over a Communicator (Gloo or NCCL).

#include <cstdint>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "roll/common/status.h"

namespace roll {

class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `tensor` (contiguous) in place over the group; every rank ends
  // with the sum.
  virtual absl::Status AllReduceSum(at::Tensor& tensor) = 0;
  // Every rank's `tensor` (same shape on each) concatenated along the last
  // dimension, in rank order.
  virtual absl::StatusOr<at::Tensor> AllGatherLastDim(const at::Tensor& tensor) = 0;
  // Bytes of the tensors this rank has handed to the group so far.
  virtual int64_t comm_bytes() const { return 0; }
};

// How a parameter (by its Hugging Face name) is split: 0 (column-parallel,
// or the vocabulary), 1 (row-parallel), -1 (replicated).
int TensorParallelDim(std::string_view param_name);

}  // namespace roll
