#pragma once
// The parallel layouts of a TrainStrategy, one implementation each behind
// ParallelMode: replicated data parallelism (ddp_train), fully sharded data
// parallelism (fsdp2_train) and tensor parallelism (a TensorParallelGroup's
// slices, data parallel over workers or not).
//
// TrainStrategy keeps what every layout shares: the inputs, the micro-batch
// plan, the step-wide counts, the loss checks, AdamW and the schedule, the
// checkpoint's files and their atomic write. It asks its mode for
// everything that depends on where the parameters live: which tensors the
// optimizer updates, how a micro-batch runs, how gradients are reduced and
// clipped, how the whole model is put together, and what the checkpoint's
// optimizer and parameter tensors look like.
// tests/strategies/train_strategy_contract_test.cc runs every layout
// through the same contract. Private to roll::strategies.
//
// A mode borrows the strategy's model and communicator (both outlive it);
// it is used from the strategy's thread, except RunOnCopies' callbacks.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "roll/common/status.h"
#include "roll/strategies/optimizer.h"

namespace roll {

class CausalLM;
class Checkpoint;
class Communicator;
class ShardLayout;
class TensorParallelGroup;

namespace strategies_internal {

// The checkpoint's optimizer file of a replicated or tensor-parallel
// trainer, and rank `rank`'s file of a sharded one.
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
std::string ShardFileName(int rank, int world);

struct RawOutputs {
  at::Tensor logits;  // [B, T, V], when asked for
  at::Tensor values;  // [B, T-1] float32, when asked for
};

struct GradientReduction {
  double grad_norm = 0;    // before clipping
  int64_t comm_bytes = 0;  // bytes this rank handed to the step's gradient collectives
};

// This rank's optimizer state read from a checkpoint, and the path named in
// errors about it.
struct OptimizerFileState {
  std::map<std::string, at::Tensor> tensors;
  std::string path;
};

class ParallelMode {
 public:
  virtual ~ParallelMode() = default;

  // --- What is trained ---
  // AdamW over what this rank updates.
  virtual absl::StatusOr<std::unique_ptr<AdamW>> CreateOptimizer(const AdamWOptions& options) const = 0;
  // The tensors the optimizer updates (gradients are cleared and, where no
  // micro-batch reached them, zero-filled on these).
  virtual const std::vector<at::Tensor>& trained() const = 0;
  // The model tensors this rank keeps between steps (StateTensors without
  // the optimizer's).
  virtual std::vector<at::Tensor> ParameterTensors() const = 0;

  // --- One pass (TrainStep or Forward) ---
  virtual void BeginPass() {}
  // Whether every micro-batch issues collectives, so that the ranks must run
  // as many micro-batches and agree on every loss before any backward.
  virtual bool collective_micro_batches() const { return false; }
  // Copies of the model that run every micro-batch together (the
  // tensor-parallel slices); 1 otherwise.
  virtual int copies() const { return 1; }
  // fn(copy) for every copy at once (copy 0 on this thread); the first error
  // by copy.
  virtual absl::Status RunOnCopies(const std::function<absl::Status(int copy)>& fn) { return fn(0); }
  // The logits and/or values of copy `copy` (autograd as the caller's mode
  // says).
  virtual absl::StatusOr<RawOutputs> Run(int copy, const at::Tensor& ids, const at::Tensor& mask,
                                         const at::Tensor& pos, bool logits, bool values) = 0;
  // Why a backward threw, when a collective inside autograd failed; else OK.
  virtual absl::Status TakeBackwardError() { return absl::OkStatus(); }
  // After the last backward: the gradients summed over the ranks, their
  // global norm measured and clipped to `max_norm` (0: not clipped).
  virtual absl::StatusOr<GradientReduction> ReduceGradients(double max_norm) = 0;
  // The mode's own step metrics (since BeginPass).
  virtual void AddStepMetrics(std::map<std::string, double>* metrics) const {}

  // --- The whole model ---
  // Runs fn with every parameter of the strategy's model holding its full
  // value (with collectives: every rank calls it).
  virtual absl::Status WithFullModel(const std::function<absl::Status(CausalLM& model)>& fn) = 0;
  virtual int tensor_parallel_size() const { return 1; }
  virtual std::vector<CausalLM*> slices() const { return {}; }
  virtual const ShardLayout* shard_layout() const { return nullptr; }
  virtual std::vector<at::Tensor> ShardPieces() const { return {}; }

  // --- Checkpoints ---
  // Whether every rank writes its own optimizer file (ShardFileName) into
  // the checkpoint; otherwise rank 0 writes the whole kOptimizerFile.
  virtual bool sharded_optimizer() const { return false; }
  // The optimizer state as kOptimizerFile holds it.
  virtual std::map<std::string, at::Tensor> OptimizerStateToSave(
      const std::map<std::string, at::Tensor>& state) const {
    return state;
  }
  // trainer_state.json's "sharding" record; null when none.
  virtual nlohmann::json ShardingRecord() const { return nullptr; }
  // Runs `load` (which checks the files, reads the optimizer state and calls
  // LoadParameters) around whatever the layout needs.
  virtual absl::Status AroundLoad(const std::function<absl::Status()>& load) { return load(); }
  // Name and shape of every parameter the checkpoint's model must hold.
  virtual std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes() const;
  // This rank's optimizer state from the checkpoint in `root`, whose
  // trainer state `state` was read from `state_path`.
  virtual absl::StatusOr<OptimizerFileState> ReadOptimizerState(const std::string& root,
                                                                const nlohmann::json& state,
                                                                const std::string& state_path) const;
  // The parameters from the checkpoint's model files.
  virtual absl::Status LoadParameters(Checkpoint& checkpoint);

 protected:
  ParallelMode(CausalLM& model, Communicator* communicator) : model_(model), communicator_(communicator) {}
  bool distributed() const;

  CausalLM& model_;
  Communicator* communicator_;  // may be null
};

// The three layouts. `communicator`: null or the data-parallel group.
// Replicated and tensor parallel broadcast rank 0's parameters on creation.
absl::StatusOr<std::unique_ptr<ParallelMode>> CreateReplicatedMode(CausalLM& model, Communicator* communicator,
                                                                   int64_t bucket_bytes);
absl::StatusOr<std::unique_ptr<ParallelMode>> CreateFullyShardedMode(CausalLM& model,
                                                                     Communicator* communicator);
absl::StatusOr<std::unique_ptr<ParallelMode>> CreateTensorParallelMode(
    CausalLM& model, std::unique_ptr<TensorParallelGroup> group, Communicator* communicator,
    int64_t bucket_bytes);

}  // namespace strategies_internal
}  // namespace roll
