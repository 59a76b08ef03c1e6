#pragma once
// RolloutScheduler: the per-sample lifecycle of a rollout step.
//
// Every prompt becomes one generation request for n samples on the
// generation worker with the fewest samples in flight. Samples come back one
// by one as they finish (Poll), and each is sent for scoring at once, so
// rewards are computed while generation goes on. A group is complete when
// all n samples are scored. With dynamic sampling (DAPO), a complete group
// whose rewards all agree carries no learning signal: it is dropped and
// another prompt takes its place, within a budget of extra rounds. Once the
// batch is full, every request still running is aborted and drained, so no
// stale sample leaks into a later step.
//
// Determinism: the batch is chosen by submission order, not by finishing
// order: group k is kept only once every group submitted before it is
// complete, and the batch is the first `groups` kept groups in submission
// order. Seeds are derived from (seed, step, submission ordinal), so a run
// that repeats the same step gets the same batch whatever the timing.
//
// The scheduler talks to generation and reward workers through the two
// client interfaces below (the RLVR pipeline implements them over Clusters;
// tests use fakes). Thread-safety: none; one Collect at a time.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "roll/common/status.h"

namespace roll {

struct PromptItem {
  std::string id;
  std::string prompt;  // text given to the generation worker
  std::string ground_truth;
  std::string tag;  // reward domain
  // A worked solution ending in the answer, when the data has one: `roll
  // sft` teaches it instead of the bare ground truth.
  std::string solution;
};

struct GenRequest {
  std::string key;  // unique per request in a Collect
  std::string prompt;
  uint64_t seed = 0;
  // Token in: when non-empty, the generator takes these ids as the prompt
  // (and ignores `prompt`), so a multi-turn history is never re-tokenized.
  std::vector<int64_t> prompt_ids;
};

struct GenParams {
  int64_t n = 1;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t max_new_tokens = 16;
  // Forced length interruption (SamplingParams): the phrase appended once a
  // sample's drawn budget in [interrupt_min, interrupt_max] is spent, then
  // answer_budget more tokens. Empty: off.
  std::string interrupt_text;
  int64_t interrupt_min = 0, interrupt_max = 0, answer_budget = 0;

  bool operator==(const GenParams& o) const {
    return n == o.n && temperature == o.temperature && top_p == o.top_p && top_k == o.top_k &&
           max_new_tokens == o.max_new_tokens && interrupt_text == o.interrupt_text &&
           interrupt_min == o.interrupt_min && interrupt_max == o.interrupt_max && answer_budget == o.answer_budget;
  }
};

// One finished (or aborted) response, later scored.
struct SampleResult {
  std::string request_key;
  int64_t sample_index = 0;
  std::vector<int64_t> prompt_ids, response_ids;
  std::vector<float> logprobs;
  // Per token: entropy and self-certainty of the model's distribution
  // (GenerationResult).
  std::vector<float> entropies, self_certainties;
  std::string response_text;
  std::string finish_reason;  // "stop_token", "stop_string", "length", "abort"
  int64_t weight_version = -1;  // of the first token
  // Per response token, the weight version it was sampled under (an
  // in-flight model update changes it mid-sample).
  std::vector<int64_t> token_versions;
  // Per response token, 1 where length interruption injected it (no loss);
  // empty without interruption.
  std::vector<uint8_t> forced;
  int64_t cached_prompt_tokens = 0;  // prompt tokens the engine's prefix cache served
  // Filled by the scheduler from the prompt before scoring.
  std::string ground_truth, tag;
  // Filled by the reward client.
  double score = 0.0;
  std::string reward_reason;
  std::string extracted_answer;  // the final answer the reward compared, when any
};

class GenerationClient {
 public:
  virtual ~GenerationClient() = default;
  virtual int num_workers() const = 0;
  // Queues per_worker[w] on worker w (entries may be empty).
  virtual absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker,
                              const GenParams& params) = 0;
  // Lets the workers generate for up to `wait`; returns the samples that
  // finished, aborted ones included, each exactly once.
  virtual absl::StatusOr<std::vector<SampleResult>> Poll(absl::Duration wait) = 0;
  // Aborts the requests (unknown or finished keys are ignored). Their
  // remaining samples come back from later Polls with finish_reason "abort".
  virtual absl::Status Abort(const std::vector<std::string>& keys) = 0;
};

class RewardClient {
 public:
  virtual ~RewardClient() = default;
  // Starts scoring; does not wait.
  virtual absl::Status Submit(std::vector<SampleResult> samples) = 0;
  // The samples whose scoring finished since the last call, with score and
  // reward_reason set. With `block`, waits until at least one is ready when
  // any is pending.
  virtual absl::StatusOr<std::vector<SampleResult>> Poll(bool block) = 0;
  virtual int64_t pending() const = 0;
};

struct RolloutOptions {
  int64_t groups = 1;  // prompts (groups) in the batch; required > 0
  GenParams params;
  bool dynamic_sampling = false;
  // With dynamic sampling: at most groups * (1 + max_additional_rounds)
  // prompts are tried per Collect.
  int64_t max_additional_rounds = 3;
  // Extra prompts submitted up front, as a fraction of `groups`.
  double redundant_prompts = 0.0;
  uint64_t seed = 0;
  // How long one Poll may let the workers generate.
  absl::Duration poll_wait = absl::Milliseconds(50);
};

struct RolloutGroup {
  PromptItem prompt;
  int64_t ordinal = 0;                // submission order within the Collect
  std::vector<SampleResult> samples;  // n, by sample_index
};

struct RolloutBatch {
  std::vector<RolloutGroup> groups;
  // (prompt tokens, response tokens) of every sample generated in the
  // Collect, kept, dropped or aborted (compute accounting).
  std::vector<std::pair<int64_t, int64_t>> generated;
  // rollout/submitted_prompts, rollout/dropped_groups (zero variance),
  // rollout/aborted_samples, rollout/filled_zero_variance, rollout/rounds.
  std::map<std::string, double> metrics;
};

// Pulls prompts from `next_prompt` (called once per submitted group).
using PromptSource = std::function<absl::StatusOr<PromptItem>()>;

class RolloutScheduler {
 public:
  RolloutScheduler(GenerationClient* gen, RewardClient* reward)
      : gen_(gen), reward_(reward) {}

  // Runs one rollout step (`step` feeds the seeds). Errors of a client abort
  // the step and are returned as they are.
  absl::StatusOr<RolloutBatch> Collect(const RolloutOptions& options, const PromptSource& source,
                                       int64_t step);

 private:
  GenerationClient* gen_;   // not owned
  RewardClient* reward_;    // not owned
};

// Seed of request `ordinal` of rollout step `step` in a run seeded `seed`.
uint64_t RequestSeed(uint64_t seed, int64_t step, int64_t ordinal);

}  // namespace roll
