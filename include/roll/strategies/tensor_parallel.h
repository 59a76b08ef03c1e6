#pragma once
// TensorParallelOps (roll/models/tensor_parallel.h) over a Communicator: the
// collectives a tensor-parallel slice of a CausalLM runs with its group, on
// Gloo or NCCL alike.

#include <memory>

#include "roll/models/tensor_parallel.h"

namespace roll {

class Communicator;

// Over `communicator` (borrowed; must outlive the result): its rank and
// world size are the slice's tp_rank and tp_size. Gloo sums bfloat16 and
// float16 in float32 (the sum is rounded once, back to the tensor's dtype)
// and moves bfloat16 as 16-bit words.
std::unique_ptr<TensorParallelOps> MakeTensorParallelOps(Communicator* communicator);

}  // namespace roll
