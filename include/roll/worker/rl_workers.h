#pragma once
// The worker types of the RL pipelines: "actor" (the policy: training,
// generation or reference scoring, depending on the role section it serves),
// "critic" (a value model), "reward" (verifiable rewards) and "environment"
// (episodes of a multi-turn environment). Registered by
// RegisterBuiltinWorkers(); a pipeline reaches them through Cluster<ActorApi>
// and friends with the method constants below.
//
// Batch keys (see include/roll/strategies/train_strategy.h for the tensor
// layout; [B, T-1] tensors line up with the shifted model outputs):
//
//   training batch  input_ids [B,T] int64, attention_mask [B,T], response_mask
//                   [B,T]; old_log_probs, advantages [B,T-1] float32;
//                   optional ref_log_probs, returns, values [B,T-1];
//                   sample_weight [B] (prompt-mean aggregation).
//   submit (actor_infer)  columns request_key, prompt; meta n, temperature,
//                   top_p, top_k, max_new_tokens, seed (per request in the
//                   tensor "seed" [B] int64); token in (multi-turn
//                   histories): prompt_token_ids [B,P] int64 and
//                   prompt_token_len [B] (rows with a length use these ids,
//                   up to the engine's max_len, instead of their prompt);
//                   forced length interruption: meta interrupt_text (the
//                   phrase, tokenized here), interrupt_min, interrupt_max,
//                   answer_budget (SamplingParams).
//   poll reply      columns request_key, finish_reason, response_text;
//                   tensors sample_index [M] int64, prompt_ids [M,P] and
//                   prompt_len [M], response_ids [M,R] and response_len [M]
//                   (padded with 0), response_logprobs [M,R] float32,
//                   response_entropy and response_self_certainty [M,R]
//                   float32 (GenerationResult::entropies, self_certainties),
//                   weight_version [M] int64 (of the first token),
//                   response_versions [M,R] int64 (per token, the weight
//                   version it was sampled under), response_forced [M,R]
//                   int64 (1 for tokens injected by length interruption;
//                   only when a sample of the reply was interrupted),
//                   cached_tokens [M] int64
//                   (prompt tokens served by the prefix cache).
//   reward input    columns response_text, ground_truth, tag; reply tensor
//                   scores [B] float32 and columns reward_reason,
//                   extracted_answer (the final answer compared; may be empty).
//   env reset       column episode_key, tensor seed [B] int64; reply columns
//                   observation, instructions.
//   env step        columns episode_key, action; reply column observation,
//                   tensors reward [B] float64, done, success, truncated,
//                   action_valid [B] bool, step_index [B] int64 (the
//                   episode's steps so far, this one included).

#include <string_view>

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
