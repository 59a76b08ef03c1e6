#pragma once
// What an RL worker sets up from its role section and the controller's
// requests: its model and tokenizer, its training strategy, the
// communicators it joins, and the meta values of a request. Private to the
// RL workers (src/workers/rl/).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/strategies/communicator.h"
#include "roll/worker/worker.h"

namespace roll {

class CausalLM;
class TensorParallelGroup;
class Tokenizer;
class TrainStrategy;

c10::ScalarType ToScalarType(DType dtype);

// Loads role.model_args.model_name_or_path, its parameters flattened
// (FlattenParameters), on the CPU or -- device_type cuda -- on the first
// GPU the worker sees (FailedPrecondition when it sees none). Errors name
// the role.
absl::StatusOr<std::unique_ptr<CausalLM>> LoadRoleModel(const WorkerConfig& role, DeviceType device_type,
                                                        bool trainable, bool value_head, uint64_t seed);

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

}  // namespace roll
