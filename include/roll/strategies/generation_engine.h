#pragma once
// GenerationEngine: batched autoregressive generation over a CausalLM with a
// preallocated KV cache and continuous batching -- the inference strategy an
// actor_infer worker runs, and the engine behind `roll generate`.
//
// A request is a prompt plus sampling parameters and a sample count n. Its n
// samples each occupy one cache slot while they run. Each Step():
//   1. releases the slots of aborted samples (their partial outputs are
//      returned by this Step, marked kAbort);
//   2. runs one decode step for every running sample (one batched
//      CausalLM::DecodeStep over their slots);
//   3. admits waiting requests, first come first served, while enough slots
//      are free for all n samples of the next one: their prompts are
//      prefilled together (one CausalLM::Prefill call, one slot per
//      request) and each prompt's cache is copied into the slots of its
//      other n - 1 samples (KvCache::CopyPrefix), so a prompt is prefilled
//      once however many samples it has;
//   4. samples the next token of every running and newly admitted sample in
//      one batched call, copies the sampled ids and log-probs to the host
//      once, and checks stop conditions; finished samples free their slots
//      and are returned.
// A request waits (in order) until enough slots are free; requests later in
// the queue do not overtake it.
//
// Sampling and log-probs. Each sample draws from the processed distribution
// of its logits: greedy (temperature 0) takes the argmax; otherwise logits /
// temperature, then top-k, then top-p over the renormalized survivors. The
// returned log-prob of a token is log_softmax of those processed logits at
// it (for greedy: log_softmax of the raw logits). This is the distribution
// the token was actually sampled from -- what vLLM reports as processed
// log-probs -- so an RL trainer recomputing log-probs at temperature T with
// the same truncation sees the same values up to numerics. See
// src/strategies/sampling.h for the exact truncation rules.
//
// Determinism: randomness comes from a counter-based generator keyed by
// (request seed, sample index, token position), so a request with a given
// seed yields the same tokens whatever else is in the batch, up to
// floating-point differences between batched and unbatched kernels (which
// can only matter at near-ties).
//
// Stop conditions, checked after every sampled token, in this order:
//   kStopToken  the token is one of the stop token ids (the engine's EOS ids
//               unless ignore_eos, plus SamplingParams::stop_token_ids); the
//               stop token is included in token_ids.
//   kStopString the decoded text of the generated tokens contains a stop
//               string. token_ids keep every token up to and including the
//               one that completed the match (they were sampled and carry
//               log-probs); `text` is cut right before the stop string.
//               Needs EngineOptions::tokenizer.
//   kLength     max_new_tokens tokens were generated, or the slot is full
//               (prompt + generated reached max_len).
//   kAbort      Abort() was called; the tokens generated so far are returned.
//
// Prefix caching (EngineOptions::enable_prefix_caching, off by default):
// a finished sample's slot keeps the keys and values of its prompt and
// generated tokens until the slot is needed again. A request whose prompt
// starts with the tokens a free slot holds is admitted into that slot and
// prefills only the rest (at least its last token, whose logits it needs);
// the matched length is GenerationResult::cached_prompt_tokens. This is
// what a multi-turn episode gains: its next prompt is its previous prompt,
// the response and the next observation. Slots that hold nothing, then the
// ones freed longest ago, are taken first for other requests. A retained
// prefix was computed with the weights of one version: set_weight_version()
// with a new version (and ReleaseKvCache) drops them all, so with caching on
// the caller must announce every weight change that way.
//
// Weight updates: the engine keeps no tensor across steps other than the KV
// cache, so between two Step() calls the caller may update the model's
// parameters in place (the model rebuilds its fused decode weights when it
// sees changed parameters). Samples already running keep the KV cache
// computed with the old weights. set_weight_version() records which weights
// are in use; each result reports the version its first and last tokens were
// sampled under.
//
// Ownership: the engine does not own the model (or the tokenizer), which
// must outlive it; it owns its KV cache (max_batch x max_len positions).
// Thread-safety: none. The engine is single-threaded by design: call every
// method from one thread (a worker's executor). The model must not be used
// by anyone else while Step() runs.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"

namespace roll {

class CausalLM;
class Tokenizer;

struct SamplingParams {
  double temperature = 1.0;  // default 1; 0 = greedy; must be >= 0
  int64_t top_k = 0;         // default 0 = off (so is -1 or any k >= vocab)
  double top_p = 1.0;        // default 1 = off; must be in (0, 1]
  // Seed of this request's random draws (sample i uses a seed derived from
  // it and i). Default: derived from EngineOptions::seed and the request id.
  std::optional<uint64_t> seed;
  int64_t max_new_tokens = 16;            // default 16; must be > 0
  std::vector<int64_t> stop_token_ids;    // default none; in addition to EOS
  std::vector<std::string> stop_strings;  // default none; needs a tokenizer
  bool ignore_eos = false;                // default false: EOS ids (EngineOptions) stop
  // Forced length interruption (ScaleRL): a sample still running after its
  // budget -- drawn per sample from its seed, uniformly in [interrupt_min,
  // interrupt_max] generated tokens -- gets `interrupt_ids` appended, fed
  // one per step and not sampled (GenerationResult::forced marks them, their
  // log-probs are 0, no stop condition applies to them), and may then
  // generate up to `answer_budget` more tokens (max_new_tokens still caps
  // the whole response). Off while interrupt_ids is empty.
  std::vector<int64_t> interrupt_ids;
  int64_t interrupt_min = 0;
  int64_t interrupt_max = 0;
  int64_t answer_budget = 0;
};

struct GenerationRequest {
  std::vector<int64_t> prompt_ids;  // required, non-empty, ids in the vocabulary
  SamplingParams params;
  int64_t n = 1;  // samples of this prompt; default 1; 1 <= n <= max_batch
};

using RequestId = int64_t;

enum class FinishReason { kStopToken, kStopString, kLength, kAbort };
// "stop_token", "stop_string", "length", "abort".
std::string_view FinishReasonName(FinishReason reason);

struct GenerationResult {
  RequestId request_id = 0;
  int64_t sample_index = 0;        // 0 .. n - 1
  std::vector<int64_t> token_ids;  // the generated tokens (no prompt)
  std::vector<float> logprobs;     // one per token, see the header comment
  // Per token, of the model's next-token distribution p = softmax(logits)
  // at the step that sampled it (temperature 1, before top-k/top-p): its
  // entropy -sum p log p, and its self-certainty KL(uniform || p) =
  // -log V - mean_v log p_v (nats). Intrinsic rewards and `roll eval` read
  // them; no second forward pass.
  std::vector<float> entropies;
  std::vector<float> self_certainties;
  FinishReason finish_reason = FinishReason::kLength;
  std::string stop_string;  // the matched one, for kStopString
  // Decoded generated text (special tokens skipped) when the engine has a
  // tokenizer; cut before the stop string for kStopString. Else empty.
  std::string text;
  // Weight versions the first and the last token were sampled under (-1 for
  // a sample aborted before its first token).
  int64_t weight_version_first = -1;
  int64_t weight_version_last = -1;
  // Per token, the weight version it was sampled under (asynchronous
  // training: an update between two steps changes it mid-sample).
  std::vector<int64_t> token_versions;
  // Per token with length interruption on: 1 for the injected tokens
  // (SamplingParams::interrupt_ids), 0 for sampled ones; else empty.
  std::vector<uint8_t> forced;
  // Prompt tokens whose keys and values came from a retained prefix instead
  // of being prefilled (prefix caching; 0 without it).
  int64_t cached_prompt_tokens = 0;
};

struct EngineOptions {
  int64_t max_batch = 8;   // default 8: cache slots = samples running at once
  int64_t max_len = 2048;  // default 2048: positions per slot (prompt + generated)
  // Prompt tokens prefilled per Step, across the requests admitted in it;
  // at least one request is admitted whenever slots allow. Default 8192.
  int64_t max_prefill_tokens = 8192;
  uint64_t seed = 0;  // default 0: seeds requests that have none
  // EOS ids that stop a sample (unless ignore_eos). Default: the model
  // config's eos_token_ids.
  std::optional<std::vector<int64_t>> eos_token_ids;
  // Not owned. Needed for stop strings and GenerationResult::text.
  const Tokenizer* tokenizer = nullptr;
  // Reuse the cached prefix of finished samples (see the header comment).
  // Default false.
  bool enable_prefix_caching = false;
};

struct EngineStats {
  int64_t steps = 0;             // Step() calls that did work
  int64_t prefill_calls = 0;     // CausalLM::Prefill calls
  int64_t prefill_tokens = 0;    // prompt tokens run through the model
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from retained prefixes
  int64_t decode_steps = 0;      // CausalLM::DecodeStep calls
  int64_t decode_tokens = 0;     // tokens fed by decode steps (sum of batch sizes)
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t samples_finished = 0;  // results returned, aborted ones included
  int64_t recomputed_tokens = 0;  // positions re-run by RecomputeKvCache
};

class GenerationEngine {
 public:
  // Allocates the KV cache. InvalidArgument for non-positive sizes or a
  // model without an LM head.
  static absl::StatusOr<std::unique_ptr<GenerationEngine>> Create(CausalLM* model,
                                                                  const EngineOptions& options);
  // Tensor-parallel generation: `slices` are the tp_size slices of one
  // model (slice r has tp_rank r and its group set, roll/models/
  // tensor_parallel.h). Each gets a KV cache of its own heads; every
  // prefill and decode step runs all slices at once, slice 0 on the calling
  // thread and the others on threads of their own, and samples from slice
  // 0's logits (every slice computes the full vocabulary's). Scheduling,
  // sampling and results are those of one model.
  static absl::StatusOr<std::unique_ptr<GenerationEngine>> Create(const std::vector<CausalLM*>& slices,
                                                                  const EngineOptions& options);
  ~GenerationEngine();
  GenerationEngine(const GenerationEngine&) = delete;
  GenerationEngine& operator=(const GenerationEngine&) = delete;

  // Validates and queues a request. InvalidArgument (naming the field) for
  // an empty prompt, an id outside the vocabulary, n outside [1, max_batch],
  // bad sampling parameters, or stop strings without a tokenizer;
  // OutOfRange for a prompt longer than max_len.
  absl::StatusOr<RequestId> Submit(GenerationRequest request);

  // Aborts every unfinished sample of `id`; the next Step() frees their slots
  // and returns their partial outputs with kAbort. NotFound when `id` is
  // unknown or already finished.
  absl::Status Abort(RequestId id);

  // One engine iteration (see the header comment); returns the samples that
  // finished in it, possibly none. A failure of the model inside a step
  // leaves the cache in an unknown state: every later Step() then fails with
  // FailedPrecondition, and the engine must be recreated.
  absl::StatusOr<std::vector<GenerationResult>> Step();

  // Whether any request is waiting, running, or has results to return.
  bool HasPending() const;

  // Steps until nothing is pending; returns every result, in finishing order.
  absl::StatusOr<std::vector<GenerationResult>> RunToCompletion();

  // Offload of the KV cache (colocated clusters, docs/placement.md): frees
  // its memory. FailedPrecondition while any request is pending (their
  // cached keys and values would be lost). Until AllocateKvCache(), Submit
  // queues requests but Step() fails with FailedPrecondition.
  absl::Status ReleaseKvCache();
  // Allocates the KV cache again (a no-op when it is allocated).
  absl::Status AllocateKvCache();
  bool kv_cache_allocated() const;
  // Bytes the KV cache holds (0 while released).
  int64_t kv_cache_bytes() const;

  // Records the weights in use; a new version drops retained prefixes.
  void set_weight_version(int64_t version);
  // After the weights changed under running samples: runs each running
  // sample's prompt and tokens so far (all but the last, which the next
  // step feeds) through the model again, so its KV cache is the new
  // weights' and it continues as if they had produced its whole prefix
  // (asynchronous training's recompute option; without it a sample keeps
  // the keys and values of the old weights). Returns the tokens recomputed.
  // A model failure breaks the engine, as in Step().
  absl::StatusOr<int64_t> RecomputeKvCache();
  int64_t weight_version() const { return weight_version_; }

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }
  int64_t num_waiting() const;  // requests not yet admitted
  int64_t num_running() const;  // samples holding a slot

  struct Impl;  // private

 private:
  explicit GenerationEngine(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  EngineOptions options_;
  EngineStats stats_;
  int64_t weight_version_ = 0;
};

}  // namespace roll
