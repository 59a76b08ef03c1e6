#pragma once
// The keys of the Batches that the RL workers' methods take and return,
// declared once. ROLL_RL_BATCH_KEYS lists each with where it lives (tensor,
// column or meta), its type and shape, the methods that carry it and what it
// holds; from that one list come
//
//   keys::kInputIds, ...    the constants both sides use: a misspelt key is a
//                           compile error, not a runtime one
//   kRlBatchKeys            the schema table (docs/worker-api.md lists it,
//                           and a test checks that it does)
//
// Shapes: B samples (rows), T tokens, M finished samples of a poll, P and R
// the longest prompt and response of the reply. Tensor layout of training
// batches: include/roll/strategies/train_strategy.h ([B, T-1] tensors line up
// with the shifted model outputs).

#include <string_view>

namespace roll {

// X(constant, name, where, type, methods, what)
#define ROLL_RL_BATCH_KEYS(X)                                                                                        \
  /* training batch: train_step, compute_log_probs, compute_values */                                                \
  X(kInputIds, "input_ids", "tensor", "[B,T] int64", "training", "prompt + response tokens, right-padded")           \
  X(kAttentionMask, "attention_mask", "tensor", "[B,T] int64", "training", "1 on real tokens, 0 on padding")          \
  X(kResponseMask, "response_mask", "tensor", "[B,T] int64", "training",                                            \
    "1 on the response tokens the loss covers (0 on prompts, forced tokens, filtered groups)")                       \
  X(kOldLogProbs, "old_log_probs", "tensor", "[B,T-1] float32", "training", "the old policy's token log-probs")        \
  X(kInferLogProbs, "infer_log_probs", "tensor", "[B,T-1] float32", "training",                                     \
    "the generator's token log-probs (rollout importance sampling, the decoupled loss)")                            \
  X(kRefLogProbs, "ref_log_probs", "tensor", "[B,T-1] float32", "training", "the reference model's (KL)")             \
  X(kAdvantages, "advantages", "tensor", "[B,T-1] float32", "training", "per-token advantages")                      \
  X(kReturns, "returns", "tensor", "[B,T-1] float32", "training", "value targets (critic)")                           \
  X(kValues, "values", "tensor", "[B,T-1] float32", "training, compute_values reply", "the critic's values")         \
  X(kScores, "scores", "tensor", "[B] float32", "training, compute_rewards reply", "each sample's reward")            \
  X(kSampleWeight, "sample_weight", "tensor", "[B] float32", "training", "prompt-mean loss aggregation weight")       \
  X(kGroupIndex, "group_index", "tensor", "[B] int64", "training", "the prompt group (GRPO, RLOO)")                   \
  X(kNumGroups, "num_groups", "meta", "int", "training", "groups in the batch")                                     \
  X(kTokenTurn, "token_turn", "tensor", "[B,T] int32", "training", "the turn each token belongs to, -1 for none")     \
  X(kTurnScores, "turn_scores", "tensor", "[B,T] float32", "training", "the discounted return of the token's turn")   \
  X(kLogProbs, "log_probs", "tensor", "[B,T-1] float32", "compute_log_probs reply", "token log-probs")               \
  X(kEntropy, "entropy", "meta, tensor", "flag; [B,T-1] float32", "compute_log_probs",                             \
    "meta 1 asks for token entropies, the reply's tensor holds them")                                               \
  X(kTotalUpdates, "total_updates", "meta", "int", "setup_collectives", "optimizer updates of the run (LR schedule)")  \
  /* collectives and the model update: setup_collectives, share_weights, send/receive_weights */                     \
  X(kGroup, "group", "meta", "string", "setup_collectives", "the data-parallel group's name (trainers)")             \
  X(kSyncGroup, "sync_group", "meta", "string", "setup_collectives", "the weight-sync group's name")                  \
  X(kSyncRank, "sync_rank", "meta", "int", "setup_collectives", "this rank's place in it, -1 for not a member")       \
  X(kSyncWorld, "sync_world", "meta", "int", "setup_collectives", "its size")                                       \
  X(kSyncShards, "sync_shards", "meta", "int", "setup_collectives",                                                 \
    "a generator's groups from a fully sharded trainer (one per trainer rank)")                                      \
  X(kSyncSharded, "sync_sharded", "meta", "0/1", "setup_collectives", "the trainer is fully sharded")                \
  X(kSharedUpdate, "shared_update", "meta", "0/1", "setup_collectives", "colocated generators read shared memory")     \
  X(kWeightsPath, "weights_path", "meta", "path", "share_weights reply, setup_collectives",                          \
    "the shared-memory region of the colocated update")                                                             \
  X(kTimeoutS, "timeout_s", "meta", "int", "setup_collectives, receive_weights", "seconds a collective may take")     \
  X(kVersion, "version", "meta", "int", "send_weights, receive_weights", "the weight version")                      \
  X(kDir, "dir", "meta", "path", "save_checkpoint, load_checkpoint", "the checkpoint directory")                      \
  X(kOffloadedBytes, "offloaded_bytes", "meta", "int", "offload_states reply", "bytes moved off the device")         \
  X(kResidentBytes, "resident_bytes", "meta", "int", "offload_states, load_states reply",                            \
    "the process's resident memory afterwards")                                                                     \
  /* generation: submit, poll, abort (actor_infer) */                                                                \
  X(kRequestKey, "request_key", "column", "string", "submit, poll reply, abort", "the request a sample belongs to")   \
  X(kPrompt, "prompt", "column", "string", "submit", "the prompt text")                                            \
  X(kPromptTokenIds, "prompt_token_ids", "tensor", "[B,P] int64", "submit",                                         \
    "token in: the prompt as ids (multi-turn histories)")                                                           \
  X(kPromptTokenLen, "prompt_token_len", "tensor", "[B] int64", "submit", "their lengths; rows with one use the ids")  \
  X(kSeed, "seed", "tensor", "[B] int64", "submit, env reset", "per request or episode")                             \
  X(kN, "n", "meta", "int", "submit", "samples per request")                                                        \
  X(kTemperature, "temperature", "meta", "float", "submit", "0: greedy")                                            \
  X(kTopP, "top_p", "meta", "float", "submit", "nucleus sampling")                                                  \
  X(kTopK, "top_k", "meta", "int", "submit", "0: off")                                                              \
  X(kMaxNewTokens, "max_new_tokens", "meta", "int", "submit", "the response budget")                                \
  X(kInterruptText, "interrupt_text", "meta", "string", "submit", "forced length interruption: the phrase")           \
  X(kInterruptMin, "interrupt_min", "meta", "int", "submit", "the drawn budget's lower bound")                        \
  X(kInterruptMax, "interrupt_max", "meta", "int", "submit", "its upper bound")                                     \
  X(kAnswerBudget, "answer_budget", "meta", "int", "submit", "tokens after the phrase")                              \
  X(kWaitMs, "wait_ms", "meta", "int", "poll", "how long the engine runs before the reply")                          \
  X(kRunning, "running", "meta", "int", "poll reply", "requests still running or waiting")                           \
  X(kSampleIndex, "sample_index", "tensor", "[M] int64", "poll reply", "the sample's index within its request")       \
  X(kFinishReason, "finish_reason", "column", "string", "poll reply", "stop_token, stop_string, length or abort")     \
  X(kResponseText, "response_text", "column", "string", "poll reply, compute_rewards", "the decoded response")         \
  X(kPromptIds, "prompt_ids", "tensor", "[M,P] int64", "poll reply", "the prompt's ids, padded with 0")                \
  X(kPromptLen, "prompt_len", "tensor", "[M] int64", "poll reply", "their lengths")                                  \
  X(kResponseIds, "response_ids", "tensor", "[M,R] int64", "poll reply", "the response's ids, padded with 0")          \
  X(kResponseLen, "response_len", "tensor", "[M] int64", "poll reply", "their lengths")                              \
  X(kResponseLogprobs, "response_logprobs", "tensor", "[M,R] float32", "poll reply", "each token's log-prob")          \
  X(kResponseEntropy, "response_entropy", "tensor", "[M,R] float32", "poll reply", "each token's entropy")            \
  X(kResponseSelfCertainty, "response_self_certainty", "tensor", "[M,R] float32", "poll reply",                      \
    "each token's self-certainty")                                                                                  \
  X(kWeightVersion, "weight_version", "tensor", "[M] int64", "poll reply", "the weight version of the first token")   \
  X(kResponseVersions, "response_versions", "tensor", "[M,R] int64", "poll reply",                                  \
    "per token, the weight version it was sampled under")                                                           \
  X(kResponseForced, "response_forced", "tensor", "[M,R] int64", "poll reply",                                      \
    "1 on tokens length interruption injected (only when a sample was interrupted)")                                 \
  X(kCachedTokens, "cached_tokens", "tensor", "[M] int64", "poll reply", "prompt tokens the prefix cache served")      \
  /* rewards: compute_rewards */                                                                                    \
  X(kGroundTruth, "ground_truth", "column", "string", "compute_rewards", "the reference answer")                      \
  X(kTag, "tag", "column", "string", "compute_rewards", "the sample's domain tag")                                   \
  X(kRewardReason, "reward_reason", "column", "string", "compute_rewards reply", "why the score")                    \
  X(kExtractedAnswer, "extracted_answer", "column", "string", "compute_rewards reply",                               \
    "the final answer compared (may be empty)")                                                                      \
  /* environments: reset, step, close */                                                                            \
  X(kEpisodeKey, "episode_key", "column", "string", "reset, step, close", "the episode")                              \
  X(kAction, "action", "column", "string", "step", "the agent's text")                                              \
  X(kObservation, "observation", "column", "string", "reset, step reply", "what the agent sees next")                \
  X(kInstructions, "instructions", "column", "string", "reset reply", "the episode's instructions")                 \
  X(kReward, "reward", "tensor", "[B] float64", "step reply", "the step's reward")                                  \
  X(kDone, "done", "tensor", "[B] bool", "step reply", "the episode ended")                                         \
  X(kSuccess, "success", "tensor", "[B] bool", "step reply", "it ended in success")                                 \
  X(kTruncated, "truncated", "tensor", "[B] bool", "step reply", "it ran out of steps")                             \
  X(kActionValid, "action_valid", "tensor", "[B] bool", "step reply", "the action parsed")                           \
  X(kStepIndex, "step_index", "tensor", "[B] int64", "step reply", "the episode's steps so far, this one included")

namespace keys {
#define ROLL_BATCH_KEY_CONSTANT_(id, name, where, type, methods, what) inline constexpr char id[] = name;
ROLL_RL_BATCH_KEYS(ROLL_BATCH_KEY_CONSTANT_)
#undef ROLL_BATCH_KEY_CONSTANT_
}  // namespace keys

struct BatchKeySpec {
  std::string_view name, where, type, methods, what;
};

inline constexpr BatchKeySpec kRlBatchKeys[] = {
#define ROLL_BATCH_KEY_SPEC_(id, name, where, type, methods, what) {name, where, type, methods, what},
    ROLL_RL_BATCH_KEYS(ROLL_BATCH_KEY_SPEC_)
#undef ROLL_BATCH_KEY_SPEC_
};

}  // namespace roll
