#pragma once
// TensorParallelOps (roll/models/tensor_parallel.h) over a Communicator: the
// collectives a tensor-parallel slice of a CausalLM runs with its group, on
// Gloo or NCCL alike.

#include <memory>
#include <vector>

#include "roll/models/tensor_parallel.h"
#include "roll/strategies/communicator.h"

namespace roll {

class CausalLM;

// Over `communicator` (borrowed; must outlive the result): its rank and
// world size are the slice's tp_rank and tp_size. Gloo sums bfloat16 and
// float16 in float32 (the sum is rounded once, back to the tensor's dtype)
// and moves bfloat16 as 16-bit words.
std::unique_ptr<TensorParallelOps> MakeTensorParallelOps(Communicator* communicator);

// A model split into tensor-parallel slices in this process: slice r
// computes with rank r of a group whose ranks are all created here, at
// once (one thread each, as the rendezvous needs), over the store `base`
// names (base.rank and base.world_size are set here). Owns the group, the
// ops and the slices; destroy it only after whatever runs the slices.
class TensorParallelGroup {
 public:
  static absl::StatusOr<std::unique_ptr<TensorParallelGroup>> Create(const CausalLM& whole, int size,
                                                                     CommunicatorOptions base);
  ~TensorParallelGroup();
  // The slices in rank order, for GenerationEngine::Create.
  std::vector<CausalLM*> slices() const;
  // Bytes slice 0 has handed to the group's collectives so far.
  int64_t comm_bytes() const;
  // Copies every slice's part of `whole` in (after an update into `whole`).
  absl::Status CopyFrom(const CausalLM& whole);

 private:
  TensorParallelGroup() = default;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<TensorParallelOps>> ops_;
  std::vector<std::unique_ptr<CausalLM>> slices_;
};

}  // namespace roll
