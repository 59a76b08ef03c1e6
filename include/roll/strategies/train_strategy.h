#pragma once
// TrainStrategy: trains a CausalLM with a caller-supplied loss -- micro-
// batching (by sequence count or by a token budget), gradient accumulation,
// data parallelism over a Communicator, gradient clipping, AdamW and a
// learning-rate schedule -- and saves/restores the complete trainer state.
// The RL algorithms (policy losses, value losses, KL) are loss callbacks
// written elsewhere; this class knows nothing about them.
//
// Tensor conventions (every worker and loss relies on these):
//   A step's batch holds, per sample (dim 0 = sample):
//     "input_ids"      [B, T] integer, T >= 2.
//     "attention_mask" [B, T] 1 = real token, 0 = padding (left or right).
//                      Optional: absent means no padding.
//     "response_mask"  [B, T] aligned with input_ids: 1 where the token at
//                      that position is one the loss is about (the
//                      response). Optional: absent means every real token.
//     "position_ids"   [B, T] optional (default: derived from the mask).
//     any other tensors (advantages, old log-probs, ...) travel along and
//     are sliced into micro-batches with the same rows.
//   Model outputs are shifted by one and have T - 1 columns: column t is
//   about the token at position t + 1, predicted from positions <= t:
//     log_probs [b, T-1] float32: log p(input_ids[t+1] | input_ids[<= t])
//     entropy   [b, T-1] float32: entropy of the full-vocabulary
//                                 distribution at position t
//     values    [b, T-1] float32: the value head at position t (the state
//                                 the token t+1 is chosen from)
//     loss_mask [b, T-1] float32: response_mask[:, 1:] * attention_mask[:, 1:]
//   Entries where loss_mask is 0 are 0. Per-token tensors that a loss
//   consumes (advantages, old log-probs, rewards) should use the same
//   [B, T-1] layout so they line up column for column.
//   Log-softmax runs in float32 whatever the parameter dtype.
//
// Loss normalization. The loss of a step is the SUM of what the callback
// returns over every micro-batch on every rank, and gradients are summed
// across micro-batches and ranks (never averaged). So a callback must
// return its micro-batch's share of the step loss, normalizing by the
// step-wide counts that MicroBatch carries: for a token-mean loss divide the
// micro-batch's masked sum by global_loss_tokens (TokenMeanLoss does this);
// for a sequence mean divide by global_sequences. Then the update is exactly
// the one a single process would make on the whole step's batch, however it
// is split into micro-batches and ranks.
//
// Data parallel: with a communicator of world_size > 1, Create broadcasts
// rank 0's parameters, every rank passes its own share of the step's batch
// to TrainStep, the step-wide counts and the gradients are all-reduced
// (gradients in flat buckets of bucket_bytes, all issued before any is
// waited on), and every rank applies the same update. Every rank must call
// the same methods in the same order (they issue collectives).
// Fully sharded (options.fully_sharded): the same contract, with each rank
// holding 1/world_size of the parameters, gradients and optimizer state;
// gradients are reduce-scattered per layer instead of all-reduced, and
// checkpoints hold the gathered model plus one optimizer file per rank.
// Tensor parallel (a TensorParallelGroup passed to Create): the model is
// split Megatron-style into the group's slices, which run every forward
// and backward together, one thread each; the data-parallel communicator
// (if any) then all-reduces every slice's gradients with the other
// workers'. Same updates as one process up to float rounding; checkpoints
// are the unsplit ones (whole tensors), so they resume with any split.
// Each of the three layouts is one implementation of a private interface
// (src/strategies/parallel_mode.h); tests/strategies/
// train_strategy_contract_test.cc holds all of them to the same contract.
//
// Ownership: the strategy owns the model (model() exposes it, e.g. for
// weight sync) and its optimizer state; the communicator is borrowed and
// must outlive the strategy. Thread-safety: none; use from one thread (the
// worker's executor). The strategy never changes LibTorch's thread count.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/batch.h"
#include "roll/common/status.h"
#include "roll/strategies/lr_schedule.h"
#include "roll/strategies/optimizer.h"

namespace roll {

// Declared, not included, to keep this header light.
class CausalLM;
class Communicator;
struct SaveOptions;
struct TrainingArgs;
class ShardLayout;
class TensorParallelGroup;
namespace strategies_internal {
class ParallelMode;
}

// Which model outputs a step needs.
struct ForwardSpec {
  bool log_probs = true;  // default: true (needs an LM head)
  bool entropy = false;   // default: false (needs an LM head)
  bool values = false;    // default: false (needs the value head)
};

struct ModelOutputs {
  // Shapes as in the file comment; undefined when not requested.
  at::Tensor log_probs, entropy, values;
};

// What a loss callback sees of one micro-batch.
struct MicroBatch {
  Batch data;                  // the micro-batch's rows of every tensor of the step's batch
  at::Tensor loss_mask;        // [b, T-1] float32
  int64_t global_loss_tokens;  // loss_mask summed over the whole step: all micro-batches, all ranks
  int64_t global_sequences;    // samples in the whole step, all ranks
  int index = 0;               // micro-batch number on this rank, 0-based
  int count = 0;               // micro-batches on this rank in this step
};

struct LossOutput {
  at::Tensor loss;  // scalar; this micro-batch's share of the step loss
  // Additive metrics: like the loss, each micro-batch returns its share and
  // the step reports the sum over micro-batches and ranks. Every call must
  // return the same keys on every rank.
  std::map<std::string, double> metrics;
};

// With tensor parallelism the callback runs once per slice for each
// micro-batch, on the slices' threads at once: it must not keep state
// between calls (the RL losses are pure functions of their arguments).
using LossFn = std::function<absl::StatusOr<LossOutput>(const ModelOutputs&, const MicroBatch&)>;

// sum(per_token * loss_mask) / global_loss_tokens: the micro-batch's share of
// a token-mean over the step. per_token: [b, T-1].
at::Tensor TokenMeanLoss(const at::Tensor& per_token, const MicroBatch& mb);

// Per-token log-probs (and optionally entropies) from logits: logits
// [B, T, V] of any floating dtype, input_ids [B, T] -> [B, T-1] float32
// tensors, column t scoring input_ids[:, t+1] under logits[:, t]. Keeps
// autograd history. Costs about three float32 copies of logits[:, :-1].
struct TokenLogProbs {
  at::Tensor log_probs, entropy;  // entropy undefined unless requested
};
absl::StatusOr<TokenLogProbs> LogProbsFromLogits(const at::Tensor& logits,
                                                 const at::Tensor& input_ids, bool with_entropy);

// strategy_args.strategy_name of a training role (actor_train, critic):
// replicated data parallelism (the default, also when empty) or fully
// sharded data parallelism (TrainStrategyOptions::fully_sharded).
inline constexpr char kReplicatedStrategyName[] = "ddp_train";
inline constexpr char kFullyShardedStrategyName[] = "fsdp2_train";

struct TrainStrategyOptions {
  LrScheduleOptions lr;  // default: constant 1e-6, no warmup
  AdamWOptions adam;     // default: betas (0.9, 0.999), eps 1e-8, no weight decay
  // Clip the global gradient norm to this; 0 disables clipping (the norm is
  // still measured and reported). Default 1.0.
  double max_grad_norm = 1.0;
  // Micro-batching. With max_tokens_per_micro_batch > 0 the samples are
  // packed (first-fit by decreasing length) into micro-batches whose real
  // tokens (attention_mask sums) stay within the budget; a single sample
  // longer than the budget gets a micro-batch of its own. Otherwise the
  // batch is cut into consecutive micro-batches of micro_batch_size samples.
  // Defaults: 1 sample, no token budget.
  int64_t micro_batch_size = 1;
  int64_t max_tokens_per_micro_batch = 0;
  // Data-parallel gradient buckets. Default 32 MiB.
  int64_t bucket_bytes = 32ll << 20;
  // Fully sharded data parallelism (FSDP / ZeRO-3) instead of replicated
  // parameters: each rank keeps 1/world_size of the parameters, gradients
  // and optimizer state, and a layer's parameters are gathered only while
  // it runs (docs/parallelism.md). Updates equal the replicated ones up to
  // float rounding. Default: false.
  bool fully_sharded = false;

  // micro_batch_size = per_device_train_batch_size, lr/warmup/schedule/
  // weight decay/clipping from `args`; total_steps for cosine and linear.
  // The caller passes per_device_train_batch_size * gradient_accumulation_steps
  // samples per TrainStep: that step then accumulates
  // gradient_accumulation_steps micro-batches.
  static TrainStrategyOptions FromTrainingArgs(const TrainingArgs& args, int64_t total_steps);
};

struct TrainStepResult {
  // "loss" (step loss), "grad_norm" (before clipping), "lr" (the rate this
  // update used), "tokens" (global loss tokens), "sequences",
  // "micro_batches" (this rank), "skipped" (1 when a non-finite gradient
  // norm made the step skip the update, which then does not count as a
  // step), "comm_bytes" (bytes of the tensors this rank handed to
  // collectives: the gradient all-reduce, or a sharded step's gathers and
  // reduce-scatters), with tensor parallelism "tp_comm_bytes" (bytes slice
  // 0 handed to its group's collectives, forward and backward), plus the
  // loss callback's metrics summed over the step.
  std::map<std::string, double> metrics;
};

class TrainStrategy {
 public:
  // `communicator`: nullptr (or world_size 1) for a single process.
  // `tensor_parallel`: null, or the slices of `model` (made from it by
  // TensorParallelGroup::Create) to train instead of it; `model` then keeps
  // only its shape (its parameters are empty except inside WithFullModel).
  // Not with fully_sharded. InvalidArgument for bad options; with data
  // parallelism, errors of the initial parameter broadcast.
  static absl::StatusOr<std::unique_ptr<TrainStrategy>> Create(std::unique_ptr<CausalLM> model,
                                                               const TrainStrategyOptions& options,
                                                               Communicator* communicator = nullptr);
  static absl::StatusOr<std::unique_ptr<TrainStrategy>> Create(
      std::unique_ptr<CausalLM> model, const TrainStrategyOptions& options, Communicator* communicator,
      std::unique_ptr<TensorParallelGroup> tensor_parallel);
  ~TrainStrategy();
  TrainStrategy(const TrainStrategy&) = delete;
  TrainStrategy& operator=(const TrainStrategy&) = delete;

  // One optimizer update over all of `batch` (this rank's share): forward
  // and backward micro-batch by micro-batch, then all-reduce, clip, AdamW
  // with the scheduled learning rate. Errors name the batch key or the
  // micro-batch; after an error in the middle of a step the gradients are
  // discarded and no update is made.
  absl::StatusOr<TrainStepResult> TrainStep(const Batch& batch, const LossFn& loss_fn,
                                            const ForwardSpec& spec = {});

  // The outputs of `spec` for every sample, without gradients, computed
  // micro-batch by micro-batch (as TrainStep splits) and put back in the
  // batch's order: [B, T-1] tensors. For reference and old log-probs.
  absl::StatusOr<ModelOutputs> Forward(const Batch& batch, const ForwardSpec& spec = {});

  // Trainer checkpoint in `dir`: the model as a Hugging Face directory
  // (config.json, model.safetensors) plus optimizer.safetensors (AdamW
  // moments), rng_state.safetensors (the CPU generator) and
  // trainer_state.json (step, optimizer and schedule settings). Everything
  // is written into a temporary directory beside `dir` which then replaces
  // `dir` in one rename. With data parallelism every rank calls it; rank 0
  // writes (the state is replicated) and the call returns on every rank
  // once the checkpoint is complete.
  absl::Status Save(const std::string& dir);
  absl::Status Save(const std::string& dir, const SaveOptions& model_options);
  // Restores everything Save wrote into this strategy (every rank reads
  // `dir`). Parameter and optimizer tensors must match this model's names
  // and shapes; errors name the file and the tensor. The learning-rate
  // schedule and optimizer settings stay those of this strategy's options
  // (so a resumed run may change them); the step counter is restored.
  absl::Status Load(const std::string& dir);

  // The model. Sharded or tensor-parallel, its parameter tensors are empty
  // except inside WithFullModel.
  CausalLM& model() { return *model_; }
  const CausalLM& model() const { return *model_; }
  // Runs `fn` with every parameter of model() holding its full current
  // value, on every rank (with fully_sharded every rank must call it: the
  // parameters are gathered for it and freed after; tensor-parallel slices
  // are joined for it, in this process); otherwise it just runs `fn`. For
  // weight sync and exports.
  absl::Status WithFullModel(const std::function<absl::Status(CausalLM& model)>& fn);
  bool fully_sharded() const;
  // The tensor-parallel group's size (1 without one).
  int tensor_parallel_size() const;
  // Tensor parallel only (else empty): the slices in rank order, what a
  // model update reads without joining the whole model (SliceStream, weight_sync.h).
  std::vector<CausalLM*> TensorParallelSlices() const;
  // Fully sharded only (else null / empty): how the parameters are cut, and
  // this rank's real elements, one view of each unit shard that has any
  // (ShardLayout::RealElements) -- what a sharded model update sends
  // without gathering the model anywhere.
  const ShardLayout* shard_layout() const;
  std::vector<at::Tensor> ShardPieces() const;
  // Every tensor the strategy keeps between steps: the model's parameters
  // and the optimizer state (what TensorOffloader moves off the device for
  // colocated clusters). Handles of the live tensors.
  std::vector<at::Tensor> StateTensors() const;
  // Updates taken so far (the schedule's position).
  int64_t step() const { return step_; }
  // The learning rate the next update will use.
  double current_lr() const { return schedule_.LrAt(step_); }
  const TrainStrategyOptions& options() const { return options_; }

  // The micro-batches (row indices into `batch`, ascending within each) that
  // TrainStep and Forward use.
  absl::StatusOr<std::vector<std::vector<int64_t>>> PlanMicroBatches(const Batch& batch) const;

 private:
  // The parallel layout (replicated, fully sharded, tensor parallel) is the
  // mode's: strategies/parallel_mode.h.
  TrainStrategy(std::unique_ptr<CausalLM> model, const TrainStrategyOptions& options,
                Communicator* communicator, LrSchedule schedule,
                std::unique_ptr<strategies_internal::ParallelMode> mode, std::unique_ptr<AdamW> optimizer);
  // Model outputs of one micro-batch on the mode's copy `copy`.
  absl::StatusOr<ModelOutputs> RunModel(int copy, const at::Tensor& ids, const at::Tensor& mask,
                                        const at::Tensor& pos, const at::Tensor& loss_mask,
                                        const ForwardSpec& spec);
  absl::Status SaveSharded(const std::string& dir, const SaveOptions& model_options);
  absl::Status FinishCheckpoint(const std::string& tmp_dir, const std::string& target_dir);
  absl::StatusOr<TrainStepResult> TrainStepImpl(const Batch& batch, const LossFn& loss_fn,
                                                const ForwardSpec& spec);
  absl::StatusOr<ModelOutputs> ForwardImpl(const Batch& batch, const ForwardSpec& spec);
  // Forward and loss of one micro-batch on copy `copy`: the loss callback's
  // output, checked (on every rank, when `agree_on_losses`).
  absl::StatusOr<LossOutput> LossOfMicroBatch(int copy, const LossFn& loss_fn, const MicroBatch& mb,
                                              const at::Tensor& ids, const at::Tensor& mask,
                                              const at::Tensor& pos, const ForwardSpec& spec,
                                              const std::string& where, bool agree_on_losses);
  absl::Status Backward(const LossOutput& loss, const std::string& where);
  absl::Status SaveImpl(const std::string& dir, const SaveOptions& model_options);
  absl::Status LoadImpl(const std::string& dir);
  bool distributed() const;

  std::unique_ptr<CausalLM> model_;
  TrainStrategyOptions options_;
  Communicator* communicator_;  // not owned; may be null
  LrSchedule schedule_;
  // Borrows model_ and communicator_ (declared after model_: destroyed first).
  std::unique_ptr<strategies_internal::ParallelMode> mode_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t step_ = 0;
};

}  // namespace roll
