#pragma once
// The worker types of the RL pipelines: "actor" (the policy: training,
// generation or reference scoring, depending on the role section it serves),
// "critic" (a value model), "reward" (verifiable rewards) and "environment"
// (episodes of a multi-turn environment). Registered by
// RegisterBuiltinWorkers(); a pipeline reaches them through Cluster<ActorApi>
// and friends with the method constants below.
//
// The keys of their requests and replies (tensors, columns, meta) are
// declared once in roll/worker/batch_keys.h, with their types and shapes.

#include <string_view>

#include "roll/worker/batch_keys.h"
#include "roll/worker/worker.h"

namespace roll {

struct ActorApi {
  static constexpr std::string_view kType = "actor";
};
struct CriticApi {
  static constexpr std::string_view kType = "critic";
};
struct RewardApi {
  static constexpr std::string_view kType = "reward";
};
struct EnvironmentApi {
  static constexpr std::string_view kType = "environment";
};

namespace actor {
// Joins the collectives through the rendezvous store the controller hosts.
// meta: group (data-parallel group name, trainers), sync_group, sync_rank,
// sync_world (weight-sync group: trainer rank 0 is sync rank 0, the
// inference ranks that do not share its CPU slot follow; sync_rank -1: not a
// member), weights_path (colocated generators: the shared-memory region of
// share_weights); each rank's collectives listen on its node's address. A
// trainer then builds its TrainStrategy.
// share_weights (rank 0 of actor_train) creates the shared-memory region
// that colocated generators read model updates from; reply meta
// weights_path.
inline constexpr Method<ActorApi> kShareWeights{"share_weights", Dispatch::kOneToAll, Execute::kRankZero};
inline constexpr Method<ActorApi> kSetupCollectives{"setup_collectives", Dispatch::kAllToAll};
// One optimizer update of the policy loss over this rank's share of the
// mini-batch. Reply meta: the step's metrics ("actor/pg_loss", ...).
inline constexpr Method<ActorApi> kTrainStep{"train_step", Dispatch::kDataParallel};
// log_probs [B,T-1] (and entropy with meta entropy=1) without gradients.
inline constexpr Method<ActorApi> kComputeLogProbs{"compute_log_probs", Dispatch::kDataParallel};
// Trainer checkpoint into meta dir (rank 0 writes; every rank returns when
// it is complete) / restore from meta dir.
inline constexpr Method<ActorApi> kSaveCheckpoint{"save_checkpoint", Dispatch::kOneToAll};
inline constexpr Method<ActorApi> kLoadCheckpoint{"load_checkpoint", Dispatch::kOneToAll};
// Weight sync: trainer rank 0 streams every parameter in buckets over the
// sync group; inference ranks receive them and apply the complete version
// between decode steps. meta version.
inline constexpr Method<ActorApi> kSendWeights{"send_weights", Dispatch::kOneToAll};
inline constexpr Method<ActorApi> kReceiveWeights{"receive_weights", Dispatch::kOneToAll};
// Request-level generation (actor_infer): queue requests, run the engine for
// up to meta wait_ms and return the samples that finished, abort requests.
inline constexpr Method<ActorApi> kSubmit{"submit", Dispatch::kAllToAll};
inline constexpr Method<ActorApi> kPoll{"poll", Dispatch::kAllToAll};
inline constexpr Method<ActorApi> kAbort{"abort", Dispatch::kOneToAll};
// Offload (docs/placement.md): offload_states moves what the worker keeps
// between calls off its device -- parameters, and the optimizer state of a
// trainer; a generator also frees its KV cache (nothing may be pending) --
// and load_states brings it back. While offloaded, methods that need the
// model fail with FailedPrecondition. Reply meta: offloaded_bytes (offload),
// resident_bytes (the process's resident memory afterwards).
inline constexpr Method<ActorApi> kOffloadStates{"offload_states", Dispatch::kOneToAll};
inline constexpr Method<ActorApi> kLoadStates{"load_states", Dispatch::kOneToAll};
}  // namespace actor

namespace critic {
inline constexpr Method<CriticApi> kSetupCollectives{"setup_collectives", Dispatch::kAllToAll};
// values [B,T-1].
inline constexpr Method<CriticApi> kComputeValues{"compute_values", Dispatch::kDataParallel};
// One update of the (clipped) value loss; needs values (old), returns.
inline constexpr Method<CriticApi> kTrainStep{"train_step", Dispatch::kDataParallel};
inline constexpr Method<CriticApi> kSaveCheckpoint{"save_checkpoint", Dispatch::kOneToAll};
inline constexpr Method<CriticApi> kLoadCheckpoint{"load_checkpoint", Dispatch::kOneToAll};
// As actor::kOffloadStates / kLoadStates (parameters and optimizer state).
inline constexpr Method<CriticApi> kOffloadStates{"offload_states", Dispatch::kOneToAll};
inline constexpr Method<CriticApi> kLoadStates{"load_states", Dispatch::kOneToAll};
}  // namespace critic

namespace reward {
// Scores every sample: tensor scores [B] float32, column reward_reason.
inline constexpr Method<RewardApi> kComputeRewards{"compute_rewards", Dispatch::kDataParallel};
}  // namespace reward

namespace environment {
// Every rank hosts the episodes the controller placed there, by key, up to
// its section's max_env_num_per_worker. A request is checked whole before
// any episode changes: an unknown or finished episode, a key given twice or
// a missing column fails the call and leaves every episode as it was. (An
// error of the environment itself in the middle of a step may leave the
// episodes before it stepped; the client then has them reset.)
// reset starts (or restarts) each episode from its seed.
inline constexpr Method<EnvironmentApi> kReset{"reset", Dispatch::kAllToAll};
// Applies one action to each episode.
inline constexpr Method<EnvironmentApi> kStep{"step", Dispatch::kAllToAll};
// Drops the episodes (keys not open are ignored).
inline constexpr Method<EnvironmentApi> kClose{"close", Dispatch::kAllToAll};
}  // namespace environment

// Registers "actor", "critic", "reward" and "environment" (library roll::rl_workers). A
// binary that starts RL pipelines calls it before RunWorkerMain.
void RegisterRlWorkers();

}  // namespace roll
