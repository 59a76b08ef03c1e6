#pragma once
// Fully sharded data parallelism (FSDP / ZeRO-3) for TrainStrategy: the
// model's parameters are grouped into units -- the embeddings, each decoder
// layer, and the head (final norm, LM head, value head) -- and each unit is
// flattened in model order, padded to a multiple of the world size and cut
// into equal shards, one per rank. A rank keeps only its shards; the
// optimizer updates them (gradients and AdamW moments are shard-sized too).
//
// A unit's full parameters exist only while it runs: its forward all-gathers
// the shards, binds the model's parameter tensors to the gathered buffer,
// runs the unit without recording autograd history and frees the buffer.
// Its backward gathers again, recomputes the unit with history (activation
// checkpointing at unit boundaries: only unit inputs are kept between
// forward and backward), back-propagates, and reduce-scatters the unit's
// flat gradient so each rank receives the summed gradient of its shard.
// Outside a unit call the model's parameter tensors are empty.
//
// Every rank must make the same calls in the same order (they issue
// collectives). Not thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/status.h"
#include "roll/models/transformer.h"
#include "roll/strategies/optimizer.h"
#include "roll/strategies/sharding.h"

namespace roll {

class Communicator;

namespace strategies_internal {

struct ShardUnit {
  std::string name;  // "embed", "layers.<i>", "head"
  std::vector<std::string> param_names;
  std::vector<at::Tensor> params;  // the model's tensors (empty while not bound)
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;  // element offset of each parameter in the unit's flat
  int64_t numel = 0;             // real elements (without padding)
  int64_t shard_numel = 0;       // ceil(numel / world_size)
  at::Tensor local;              // this rank's shard, a leaf that requires grad
  int bound = 0;                 // nesting count of Bind
  // This rank's first element in the unit's flat.
  int64_t begin(int rank) const { return rank * shard_numel; }
};

class ShardedModel {
 public:
  // Splits `model`'s parameters (every one must require grad) into units and
  // keeps this rank's shards, starting from rank 0's weights; then frees the
  // model's full parameters. `communicator` may be null (one rank).
  static absl::StatusOr<std::unique_ptr<ShardedModel>> Create(CausalLM& model,
                                                              Communicator* communicator);
  ~ShardedModel();

  // The shards as the optimizer's parameters (named "<unit>"), with the
  // element ranges of weight matrices as decay ranges.
  std::vector<AdamW::Param> OptimizerParams() const;
  std::vector<at::Tensor> Shards() const;
  const std::vector<std::unique_ptr<ShardUnit>>& units() const { return units_; }
  const ShardLayout& layout() const { return layout_; }
  // This rank's real elements, one view per unit shard (units without any
  // on this rank left out): what a sharded model update sends.
  std::vector<at::Tensor> Pieces() const;
  int rank() const;
  int world_size() const;

  // Starts a step (TrainStep or Forward): forgets the previous step's unit
  // calls and communication count. A graph from an earlier step must not
  // be back-propagated after this.
  void BeginStep();

  // The model's logits [B, T, V] (when `logits`) and values [B, T-1] (when
  // `values`) for one micro-batch, with autograd through the shards when
  // grad mode is on.
  struct Outputs {
    at::Tensor logits, values;
  };
  absl::StatusOr<Outputs> Forward(const at::Tensor& ids, const at::Tensor& mask,
                                  const at::Tensor& pos, bool logits, bool values);

  // The global L2 norm of the shards' gradients (summed over ranks), then
  // the same clipping as ClipGradNorm.
  absl::StatusOr<double> ClipGradNorm(double max_norm);

  // Binds every parameter of the model to its full value (gathered into one
  // buffer in model order, the layout the weight update sends) on every
  // rank; Release frees it again.
  absl::Status Materialize();
  void Release();

  // Sets the shards from full parameter values (name -> tensor, e.g. from a
  // checkpoint); every parameter must be present with its shape.
  absl::Status LoadFull(const std::function<absl::StatusOr<at::Tensor>(const std::string& name)>& read);

  // Bytes of the tensors this rank handed to collectives (gathers,
  // reduce-scatters, the norm's all-reduce) since the last call.
  int64_t TakeCommBytes();

  // Set when a collective inside autograd failed (autograd only carries
  // exceptions): the status to report instead of the exception's text.
  absl::Status TakeError();

  struct Call;  // one unit call kept for its backward (private)

 private:
  ShardedModel(CausalLM& model, Communicator* communicator);
  absl::StatusOr<at::Tensor> Gather(const ShardUnit& unit);
  absl::Status Bind(ShardUnit& unit);
  void Unbind(ShardUnit& unit);
  absl::StatusOr<at::Tensor> ReduceScatter(const ShardUnit& unit, const at::Tensor& full_grad);
  std::vector<at::Tensor> Apply(std::vector<ShardUnit*> units,
                                std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn,
                                std::vector<at::Tensor> inputs);

  friend struct UnitFunction;

  CausalLM& model_;
  Communicator* communicator_;
  ShardLayout layout_;
  std::vector<std::unique_ptr<ShardUnit>> units_;
  ShardUnit* embed_ = nullptr;
  std::vector<ShardUnit*> layers_;
  ShardUnit* head_ = nullptr;  // null when the model has no head parameters
  std::vector<std::unique_ptr<Call>> calls_;
  absl::Status error_;
  int64_t comm_bytes_ = 0;
  at::Tensor materialized_;  // the full buffer while materialized
};

}  // namespace strategies_internal
}  // namespace roll
