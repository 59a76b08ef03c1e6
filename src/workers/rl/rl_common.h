#pragma once
// Pieces shared by the RL worker types (actor, critic): model loading from a
// role section, meta parsing, forward passes without gradients, trainer
// set-up and the bucketed weight broadcast.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/time/time.h"
#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/offload.h"
#include "roll/strategies/sharding.h"
#include "roll/worker/worker.h"

namespace roll {

class CausalLM;
class Communicator;
class StoreServer;
class TensorParallelGroup;
class Tokenizer;
class TrainStrategy;

namespace rl_internal {

c10::ScalarType ToScalarType(DType dtype);

// Loads role.model_args.model_name_or_path, its parameters flattened
// (FlattenParameters), on the CPU or -- device_type "cuda" -- on the first
// GPU the worker sees (FailedPrecondition when it sees none). Errors name
// the role.
absl::StatusOr<std::unique_ptr<CausalLM>> LoadRoleModel(const WorkerConfig& role, const std::string& device_type,
                                                        bool trainable, bool value_head, uint64_t seed);

// Moves the parameters (same tensor objects, same values) into one
// contiguous buffer in the order given, so that consecutive parameters lie
// back to back and ParameterBroadcaster sends them in one transfer. Mixed
// dtypes share the buffer too (each parameter aligned to its element size:
// a narrower dtype followed by a wider one may leave a gap of a few bytes,
// where the transfer splits). Does nothing unless all are contiguous on one
// device, and nothing when they already lie so (a CausalLM allocates its
// parameters that way, so a loaded model is never copied). Call before anything keeps pointers into them (optimizer state is
// keyed by the tensor objects, which stay the same).
void FlattenParameters(const std::vector<at::Tensor>& params);

// `dir`/tokenizer.json, or nullopt when the directory has none.
absl::StatusOr<std::optional<Tokenizer>> LoadDirTokenizer(const std::string& dir);

// Integer / float meta values; InvalidArgument naming the key when absent
// (without a fallback) or malformed.
absl::StatusOr<int64_t> MetaInt(const Batch& b, const std::string& key,
                                std::optional<int64_t> fallback = std::nullopt);
absl::StatusOr<double> MetaDouble(const Batch& b, const std::string& key,
                                  std::optional<double> fallback = std::nullopt);

// The communicators a worker joins (setup_collectives).
struct Collectives {
  std::unique_ptr<Communicator> dp;    // data-parallel group (trainers), may be null
  std::unique_ptr<Communicator> sync;  // weight-sync group, may be null
  // A generator's weight-sync groups from a fully sharded trainer: group r
  // is trainer rank r (its rank 0) and the generators; empty otherwise.
  std::vector<std::unique_ptr<Communicator>> sync_shards;
  int sync_rank = -1;
};
absl::Status JoinCollectives(const Batch& in, const WorkerContext& ctx, Collectives* out);
// Communicator options reaching the controller's store (its address, the
// job token), with this worker's node address for Gloo and `timeout_s`.
absl::StatusOr<CommunicatorOptions> ControllerStoreOptions(const WorkerContext& ctx, int64_t timeout_s);

// The worker's `tp` tensor-parallel slices of `whole`, each with a Gloo rank
// of a group that lives in this process (rendezvous at the controller's
// store).
absl::StatusOr<std::unique_ptr<TensorParallelGroup>> MakeTensorParallelGroup(const WorkerContext& ctx,
                                                                             const CausalLM& whole, int tp);

// A training role's strategy (actor_train, critic) over `model`:
// training_args with `total_updates` for the schedule, fully sharded or
// tensor parallel as strategy_args say, data parallel over `dp`.
absl::StatusOr<std::unique_ptr<TrainStrategy>> CreateTrainStrategy(const WorkerContext& ctx,
                                                                   std::unique_ptr<CausalLM> model,
                                                                   int64_t total_updates, Communicator* dp);

// Streams `params` (in order, same shapes and dtypes on every member) from
// sync rank 0 to every other member of `comm`; receivers get the values
// written into theirs in place. Parameters back to back in one storage
// (FlattenParameters) count as one. A large parameter (at least a quarter of a
// chunk) travels in its own broadcast, straight from the sender's storage
// into the receivers'; runs of small ones (norms, biases) are packed into
// one of `kSlots` staging buffers that together hold `buffer_bytes`
// (model_update_buffer_size_mb). Up to kSlots broadcasts are in flight, so
// packing and unpacking overlap the transfers. The staging buffers are
// allocated once and reused by every later update (fresh memory costs page
// faults that dominate a transfer on small hosts). Not thread-safe: one
// update at a time, on the thread that owns `comm`.
class ParameterBroadcaster {
 public:
  static constexpr int kSlots = 4;
  explicit ParameterBroadcaster(int64_t buffer_bytes);
  // `merge_adjacent`: false keeps every tensor a span of its own (both
  // sides must then pass the same list of sizes, e.g. the pieces of a
  // sharded update, which lie back to back on one side only).
  absl::Status Run(Communicator& comm, const std::vector<at::Tensor>& params,
                   bool merge_adjacent = true);
  int64_t chunk_bytes() const { return chunk_bytes_; }

 private:
  int64_t chunk_bytes_;
  std::vector<at::Tensor> slots_;  // kSlots uint8 buffers of chunk_bytes_
};

// A generator's side of the model update from a fully sharded trainer:
// trainer rank r's shard pieces (ShardLayout::Pieces(r), which *layout
// caches for the number of groups) arrive over groups[r], each straight
// into the part of `model`'s parameter it belongs to. No staging copy of
// the model.
absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const CausalLM& model, std::optional<ShardLayout>* layout);
// The same into `params` (name, tensor) in the model's order.
absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const std::vector<std::pair<std::string, at::Tensor>>& params,
                                  std::optional<ShardLayout>* layout);
// The same received straight into a tensor-parallel generator's slices
// (`slices` in rank order; `whole` names the unsplit model's parameters and
// shapes in order): each unit shard lands in a staging tensor of its size
// and every element goes to the slice that holds it (a replicated
// parameter to each), so the receiving side keeps no whole copy of the
// model.
absl::Status ReceiveShardedUpdateIntoSlices(
    ParameterBroadcaster& broadcaster, const std::vector<std::unique_ptr<Communicator>>& groups,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& whole, const std::vector<CausalLM*>& slices,
    std::optional<ShardLayout>* layout);

// The model update between colocated processes (the same device of one
// node: a CPU slot, or a GPU, which NCCL cannot give two ranks of one
// group): no network and no collective. Parameters on a GPU are staged
// through the region in host memory. The sender copies every parameter
// into one shared-memory region (a memfd, gone once the last process that
// maps it ends) and then publishes the version in its header; receivers
// open the region through the sender's /proc/<pid>/fd entry, wait for the
// version and copy the parameters out. The caller orders updates: a new
// Publish starts only after every receiver read the previous version.
class SharedWeights {
 public:
  // Sender side: a region sized for `params`.
  static absl::StatusOr<std::unique_ptr<SharedWeights>> Create(const std::vector<at::Tensor>& params);
  // Receiver side: the region at `path` (the sender's path()).
  static absl::StatusOr<std::unique_ptr<SharedWeights>> Open(const std::string& path);
  ~SharedWeights();
  SharedWeights(const SharedWeights&) = delete;
  SharedWeights& operator=(const SharedWeights&) = delete;

  const std::string& path() const { return path_; }
  int64_t bytes() const { return bytes_; }
  // Sender: copies `params` in and publishes `version` (>= 0).
  absl::Status Publish(const std::vector<at::Tensor>& params, int64_t version);
  // Receiver: waits up to `timeout` for `version`, then copies it into
  // `params` (same shapes and dtypes as the sender's, in order).
  absl::Status Read(const std::vector<at::Tensor>& params, int64_t version, absl::Duration timeout);

 private:
  SharedWeights(int fd, void* base, int64_t bytes, std::string path);
  int fd_;
  void* base_;        // header, then the data
  int64_t bytes_;     // data bytes
  std::string path_;
};

// offload_states / load_states of a model worker (docs/placement.md,
// "Offload"): the tensors the worker keeps between calls move off its
// device and back. While offloaded, the worker's other methods that need
// them fail with Check()'s error.
class StateOffload {
 public:
  // `who`: "actor_train rank 0" for messages; `spill_dir` as TensorOffloader.
  StateOffload(std::string who, std::string spill_dir);
  // Offloads `tensors`; `also_freed`: bytes the caller released itself
  // (a KV cache). Reply meta: offloaded_bytes, resident_bytes (VmRSS of the
  // process afterwards). Offloading twice is a no-op.
  absl::StatusOr<Batch> Offload(const std::vector<at::Tensor>& tensors, int64_t also_freed = 0);
  // Brings the tensors back; reply meta resident_bytes. A no-op when not offloaded.
  absl::StatusOr<Batch> Onload();
  bool offloaded() const { return offloaded_; }
  // FailedPrecondition naming the worker and `method` while offloaded.
  absl::Status Check(std::string_view method) const;

 private:
  std::string who_;
  TensorOffloader offloader_;
  bool offloaded_ = false;
  bool warned_in_memory_ = false;
};

// Log-probs (and entropies) of a training-layout batch without gradients,
// in micro-batches of `micro` rows: [B, T-1] float32, 0 outside loss_mask.
struct ScoredTokens {
  at::Tensor log_probs, entropy;
};
absl::StatusOr<ScoredTokens> ScoreTokens(const CausalLM& model, const Batch& batch, int64_t micro,
                                         bool with_entropy);

// response_mask[:,1:] * attention_mask[:,1:] as float32 [B, T-1].
absl::StatusOr<at::Tensor> LossMask(const Batch& batch);

}  // namespace rl_internal
}  // namespace roll
