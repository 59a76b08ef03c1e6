#pragma once
// The agentic pipeline (`pipeline: agentic`, docs/agentic.md) and its own
// pieces: multi-turn episodes of the train_env_manager / val_env_manager
// environments driven by the policy on actor_infer, token in and token out.
//
//   TurnTemplate       how an observation becomes the text of a user turn
//                      (data.chat_template: none or chatml)
//   EpisodeHost        what the rollout needs of environments: the
//                      environment workers (EnvironmentClient) or
//                      environments in this process (tests, `roll sft`)
//   AgenticRollout     runs env groups to the end: each episode's next turn
//                      goes to the generation engine as soon as its
//                      environment answered (no lock-step over episodes)
//   BuildTrajectoryBatch  trajectories -> the training batch, response_mask
//                      1 on generated tokens only
//
// Token in, token out: an episode's token history is the first prompt's
// ids, then for each turn the ids the policy generated (as generated, never
// re-tokenized) and the ids of the next observation's turn text. The
// training sample is the whole history.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/controller/environment_client.h"
#include "roll/pipeline/pipeline.h"
#include "roll/pipeline/train_phase.h"
#include "roll/scheduler/rollout_scheduler.h"

namespace roll {

class Tokenizer;

// The text of an episode's turns. data.chat_template none:
//   first  "{instructions}\n\n{observation}\n"
//   next   "\n{observation}\n"
// chatml: the instructions as the system turn, each observation a user
// turn, each followed by the opening of an assistant turn; a response cut by
// the token budget (not closed by its EOS, <|im_end|>) is closed first.
class TurnTemplate {
 public:
  explicit TurnTemplate(ChatTemplate chat_template) : chatml_(chat_template == ChatTemplate::kChatml) {}
  absl::StatusOr<std::string> First(const std::string& instructions, const std::string& observation) const;
  // `closed`: the previous response ended with the EOS token.
  std::string Next(const std::string& observation, bool closed) const;

 private:
  bool chatml_ = false;
};

// What the rollout needs of environments (EnvironmentClient's contract:
// results in input order; a failed call leaves its episodes unusable).
class EpisodeHost {
 public:
  virtual ~EpisodeHost() = default;
  virtual absl::StatusOr<std::vector<EnvObservation>> Reset(const std::vector<EpisodeStart>& episodes) = 0;
  virtual absl::StatusOr<std::vector<EnvTransition>> Step(const std::vector<EnvAction>& actions) = 0;
  virtual absl::Status Close(const std::vector<std::string>& keys) = 0;
};

// Episodes on environment workers. The client must outlive it.
class ClusterEpisodeHost : public EpisodeHost {
 public:
  explicit ClusterEpisodeHost(EnvironmentClient* client) : client_(client) {}
  absl::StatusOr<std::vector<EnvObservation>> Reset(const std::vector<EpisodeStart>& episodes) override {
    return client_->Reset(episodes);
  }
  absl::StatusOr<std::vector<EnvTransition>> Step(const std::vector<EnvAction>& actions) override {
    return client_->Step(actions);
  }
  absl::Status Close(const std::vector<std::string>& keys) override { return client_->Close(keys); }

 private:
  EnvironmentClient* client_;  // not owned
};

// Episodes in this process, one Environment each (MakeEnvironment).
class LocalEpisodeHost : public EpisodeHost {
 public:
  LocalEpisodeHost(std::string env_type, std::vector<std::string> env_options)
      : env_type_(std::move(env_type)), env_options_(std::move(env_options)) {}
  absl::StatusOr<std::vector<EnvObservation>> Reset(const std::vector<EpisodeStart>& episodes) override;
  absl::StatusOr<std::vector<EnvTransition>> Step(const std::vector<EnvAction>& actions) override;
  absl::Status Close(const std::vector<std::string>& keys) override;

 private:
  struct Open {
    std::unique_ptr<Environment> env;
    int64_t steps = 0;
    bool done = false;
  };
  std::string env_type_;
  std::vector<std::string> env_options_;
  std::map<std::string, Open> open_;
};

// Most tokens of a trajectory: sequence_length, or prompt_length +
// response_length when it is 0.
int64_t SequenceLength(const PipelineConfig& config);
// Most tokens of one response: max_tokens_per_step, or
// actor_infer.generating_args.max_new_tokens when it is 0.
int64_t MaxTokensPerStep(const PipelineConfig& config);

// Environment seed of env group `ordinal` of training step `step`; with
// `validation` the held-out seeds (the two sets never meet: the lowest bit
// tells them apart).
uint64_t EnvGroupSeed(uint64_t seed, int64_t step, int64_t ordinal, bool validation);

struct AgenticRolloutOptions {
  int64_t groups = 1;          // groups in the result; required > 0
  int64_t group_size = 1;      // episodes kept per group
  int64_t group_size_redundancy = 0;  // extra episodes started per group
  int64_t max_groups_in_flight = 0;   // 0: every group at once
  int64_t max_steps = 0;       // turns per episode; 0: the environment's own limit
  int64_t max_tokens_per_step = 16;
  int64_t sequence_length = 1024;  // most tokens of a trajectory
  GenParams params;            // sampling; n and max_new_tokens are set per turn
  uint64_t seed = 0;
  bool validation = false;     // held-out environment seeds
  std::vector<std::string> tags;  // given to groups in turn; empty: "env"
  // Groups dropped (an episode failed beyond the redundancy) are replaced
  // by new ones, at most this many per Collect; then Collect fails.
  int64_t max_replaced_groups = 8;
  // Lock-step: every running episode's turn is generated before any
  // environment steps (the baseline `roll bench agentic` compares with).
  bool lockstep = false;
  absl::Duration poll_wait = absl::Milliseconds(20);
};

// One turn of an episode: the policy's response (ids [begin, end) of the
// trajectory) and what the environment made of it.
struct Turn {
  int64_t begin = 0, end = 0;
  std::string response;
  double reward = 0.0;
  bool action_valid = true;
  bool effective = false;  // the observation changed
};

struct Trajectory {
  std::string key;
  int64_t index = 0;  // within its group
  std::vector<int64_t> ids;
  std::vector<uint8_t> generated;  // 1 where ids[i] was generated by the policy
  std::vector<float> logprobs;     // the generator's log-prob at generated ids, else 0
  std::vector<Turn> turns;
  double episode_return = 0.0;  // sum of step rewards
  bool success = false;
  bool truncated = false;         // the environment's or max_steps' limit
  bool length_truncated = false;  // the next turn would not fit sequence_length
  int64_t weight_version_min = -1, weight_version_max = -1;
};

struct TrajectoryGroup {
  int64_t ordinal = 0;
  std::string tag;
  uint64_t env_seed = 0;
  std::vector<Trajectory> episodes;  // group_size, by index
};

struct AgenticRolloutResult {
  std::vector<TrajectoryGroup> groups;  // by ordinal
  // rollout/env_steps, rollout/env_steps_per_s, rollout/gen_tokens,
  // rollout/gen_tokens_per_s, rollout/gen_in_flight_mean (requests the
  // engines held per poll), rollout/env_time_fraction, rollout/prefill_tokens,
  // rollout/prefix_cache_hit_rate (share of prompt tokens the engines took
  // from their prefix cache),
  // rollout/dropped_episodes, rollout/dropped_groups, rollout/turns.
  Metrics metrics;
};

// Runs env groups to the end on `gen` (actor_infer) and `envs`. Not
// thread-safe; the clients and the tokenizer must outlive it.
class AgenticRollout {
 public:
  AgenticRollout(GenerationClient* gen, EpisodeHost* envs, const Tokenizer* tokenizer, TurnTemplate turns)
      : gen_(gen), envs_(envs), tokenizer_(tokenizer), template_(turns) {}
  absl::StatusOr<AgenticRolloutResult> Collect(const AgenticRolloutOptions& options, int64_t step);

 private:
  GenerationClient* gen_;
  EpisodeHost* envs_;
  const Tokenizer* tokenizer_;
  TurnTemplate template_;
};

// <prefix>success_rate, <prefix>return_mean, <prefix>steps_mean,
// <prefix>valid_action_rate, <prefix>effective_action_rate,
// <prefix>response_length (tokens per turn), <prefix>truncated_rate,
// <prefix>length_truncated_rate, and <prefix><tag>/success_rate per tag.
void TrajectoryMetrics(const std::vector<TrajectoryGroup>& groups, const std::string& prefix, Metrics* metrics);

// Trajectories -> the training batch: input_ids the history, response_mask
// 1 on generated ids, scores the episode return (after reward_clip),
// group_index the env group, sample_weight for prompt-mean aggregation,
// infer_log_probs. Metrics: TrajectoryMetrics under train/, plus
// train/trajectories, train/response_tokens and train/sequence_length.
absl::StatusOr<TrainingBatch> BuildTrajectoryBatch(const PipelineConfig& config,
                                                   const std::vector<TrajectoryGroup>& groups);

// `roll bench agentic`: the job of an agentic `config` (started as `roll
// run` starts it) plays `rounds` rounds without training; each round one
// rollout of rollout_batch_size trajectories with episodes advancing
// independently and one in lock-step, on the same environment seeds. One
// JSON object: per mode the mean over the rounds after the first of
// rollout_s, env_steps_per_s, gen_tokens_per_s, gen_in_flight_mean (the
// requests the engines held per poll: how busy they are kept),
// env_time_fraction, prefix_cache_hit_rate, success_rate and steps_mean;
// speedup is lock-step rollout_s over independent rollout_s.
absl::StatusOr<std::string> RunAgenticRolloutBench(PipelineConfig config, int rounds, RunOptions options);

// Supervised data for the base model of an agentic run (`roll sft` on a
// config whose pipeline is agentic): episodes of train_env_manager's
// env_type on DemonstrationEnvOptions, each move drawn at random from the
// environment's Actions() or, with probability sft.expert_moves,
// ShortestSolution's next move (roll/envs/solver.h); rendered with the turn template. Each
// episode alternates text the model reads and answers it must learn
// ("<answer>Move</answer>").
struct PlayedEpisode {
  struct Segment {
    std::string text;
    bool answer = false;
  };
  uint64_t env_seed = 0;  // the episode replays from it
  std::vector<Segment> segments;
};

absl::StatusOr<std::vector<PlayedEpisode>> PlayEpisodes(const PipelineConfig& config, int64_t episodes,
                                                        uint64_t seed, bool validation);
// The environment options of the demonstrations: sft.env_options, or
// train_env_manager.env_options where that is empty.
const std::vector<std::string>& DemonstrationEnvOptions(const PipelineConfig& config);

}  // namespace roll
