#include "roll/strategies/generation_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/models/kv_cache.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "strategies/sampling.h"
#include "strategies/slice_threads.h"

namespace roll {

namespace si = strategies_internal;

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

namespace {

struct Request {
  RequestId id = 0;
  std::vector<int64_t> prompt;
  SamplingParams params;
  int64_t n = 1;
  uint64_t seed = 0;
  std::set<int64_t> stop_ids;
  size_t max_stop_string = 0;  // bytes of the longest stop string
  int64_t unfinished = 0;      // samples not yet returned
  int64_t cached = 0;          // prompt tokens reused from a retained prefix
  bool admitted = false;
};

struct Sample {
  Request* request = nullptr;
  int64_t index = 0;
  int64_t slot = -1;
  uint64_t seed = 0;
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> entropies, self_certainties;
  int64_t version_first = -1, version_last = -1;
  std::vector<int64_t> versions;  // per token
  std::vector<uint8_t> forced;    // per token, with length interruption
  int64_t interrupt_at = -1;      // the drawn budget (generated tokens), or -1
  int64_t injected = -1;          // interrupt_ids appended so far; -1: not interrupted
  bool aborted = false;
  size_t text_scanned = 0;  // bytes of decoded text already searched for stop strings
};

}  // namespace


struct GenerationEngine::Impl {
  CausalLM* model = nullptr;
  std::unique_ptr<KvCache> cache;
  // Tensor parallelism: slices 1.. of the model and their caches, kept in
  // step with `cache` (same slots, same lengths).
  std::vector<CausalLM*> peers;
  std::vector<std::unique_ptr<KvCache>> peer_caches;
  std::unique_ptr<si::SliceThreads> slice_threads;  // one per peer

  // Runs `fn(model, cache)` on every slice at once (the slices' collectives
  // need each other); the result is slice 0's, or the first error.
  template <typename Fn>
  absl::StatusOr<at::Tensor> OnAllSlices(Fn&& fn) {
    if (peers.empty()) return fn(*model, *cache);
    std::vector<absl::Status> others(peers.size());
    slice_threads->Start([&](size_t i) {
      auto r = fn(*peers[i], *peer_caches[i]);
      if (!r.ok()) others[i] = r.status();
    });
    absl::StatusOr<at::Tensor> mine;
    try {
      mine = fn(*model, *cache);  // slice 0, here
    } catch (...) {
      slice_threads->Wait();  // the others use this frame's `fn` and `others`
      throw;
    }
    slice_threads->Wait();
    for (const absl::Status& s : others) {
      if (mine.ok() && !s.ok()) mine = s;
    }
    return mine;
  }
  // Applies a cache operation to every slice's cache.
  template <typename Fn>
  absl::Status OnAllCaches(Fn&& fn) {
    absl::Status s = fn(*cache);
    for (auto& c : peer_caches) {
      if (s.ok()) s = fn(*c);
    }
    return s;
  }
  int64_t vocab = 0;
  std::vector<int64_t> eos;
  RequestId next_id = 1;
  std::map<RequestId, std::unique_ptr<Request>> requests;  // unfinished
  std::deque<Request*> waiting;
  std::vector<std::unique_ptr<Sample>> by_slot;  // running samples, by slot
  std::set<int64_t> free_slots;
  std::vector<GenerationResult> ready;  // produced outside Step (aborted waiting requests)
  bool broken = false;
  // Prefix caching: the tokens whose keys and values a free slot still
  // holds (empty: nothing worth reusing), and when the slot was freed.
  std::vector<std::vector<int64_t>> retained;
  std::vector<int64_t> freed_at;
  int64_t clock = 0;

  void DropRetained() {
    for (auto& r : retained) r.clear();
  }

  // The free slot whose retained tokens share the longest prefix with
  // `prompt`, leaving at least the prompt's last token to prefill (its
  // logits are needed): {slot, length}, or {-1, 0}. A slot whose tokens the
  // prompt continues whole (the same episode's next turn) wins over one
  // that only shares a beginning with it, so an episode's history is not
  // cut short for another's.
  std::pair<int64_t, int64_t> BestPrefix(const std::vector<int64_t>& prompt) const {
    std::pair<int64_t, int64_t> best{-1, 0};
    bool best_whole = false;
    for (int64_t slot : free_slots) {
      const std::vector<int64_t>& held = retained[slot];
      const size_t cap = std::min(held.size(), prompt.size() - 1);
      size_t k = 0;
      while (k < cap && held[k] == prompt[k]) ++k;
      const bool whole = k > 0 && k == held.size();
      const int64_t len = static_cast<int64_t>(k);
      if (len > 0 && (whole > best_whole || (whole == best_whole && len > best.second))) {
        best = {slot, len};
        best_whole = whole;
      }
    }
    return best;
  }

  // A free slot for a sample that reuses nothing: one that holds nothing,
  // else the one freed longest ago.
  int64_t Spare() const {
    int64_t best = -1;
    for (int64_t slot : free_slots) {
      if (retained[slot].empty()) return slot;
      if (best < 0 || freed_at[slot] < freed_at[best]) best = slot;
    }
    return best;
  }

  // Takes `slot` out of the free set with its first `keep` positions.
  void Take(int64_t slot, int64_t keep) {
    free_slots.erase(slot);
    retained[slot].clear();
    // Neither can fail: the slot is the cache's own and keep <= its length.
    (void)OnAllCaches([&](KvCache& c) { return keep > 0 ? c.Truncate(slot, keep) : c.Reset(slot); });
  }

  // Decoded generated text, special tokens skipped.
  std::string Text(const EngineOptions& o, const std::vector<int64_t>& tokens) const {
    if (o.tokenizer == nullptr) return "";
    std::vector<int32_t> ids(tokens.begin(), tokens.end());
    auto text = o.tokenizer->Decode(ids, /*skip_special_tokens=*/true);
    return text.ok() ? *text : std::string();
  }
};

GenerationEngine::GenerationEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GenerationEngine::~GenerationEngine() = default;

absl::StatusOr<std::unique_ptr<GenerationEngine>> GenerationEngine::Create(
    CausalLM* model, const EngineOptions& options) {
  return Create(std::vector<CausalLM*>{model}, options);
}

absl::StatusOr<std::unique_ptr<GenerationEngine>> GenerationEngine::Create(
    const std::vector<CausalLM*>& slices, const EngineOptions& options) {
  CausalLM* model = slices.empty() ? nullptr : slices[0];
  if (model == nullptr) return absl::InvalidArgumentError("GenerationEngine: model is null");
  for (size_t r = 0; r < slices.size(); ++r) {
    if (slices[r] == nullptr || slices[r]->options().tp_size != static_cast<int>(slices.size()) ||
        slices[r]->options().tp_rank != static_cast<int>(r)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GenerationEngine: ", slices.size(), " model(s) given; slice ", r,
          " must be tensor-parallel rank ", r, " of ", slices.size()));
    }
  }
  if (options.max_batch <= 0 || options.max_len <= 0 || options.max_prefill_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GenerationEngine: max_batch (", options.max_batch, "), max_len (", options.max_len,
        ") and max_prefill_tokens (", options.max_prefill_tokens, ") must be positive"));
  }
  if (!model->options().lm_head) {
    return absl::InvalidArgumentError("GenerationEngine: the model has no LM head");
  }
  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->vocab = model->config().vocab_size;
  ROLL_ASSIGN_OR_RETURN(impl->cache, model->NewKvCache(options.max_batch, options.max_len));
  for (size_t r = 1; r < slices.size(); ++r) {
    impl->peers.push_back(slices[r]);
    ROLL_ASSIGN_OR_RETURN(auto c, slices[r]->NewKvCache(options.max_batch, options.max_len));
    impl->peer_caches.push_back(std::move(c));
  }
  if (!impl->peers.empty()) {
    const int each = std::max<int>(1, at::get_num_threads() / static_cast<int>(slices.size()));
    impl->slice_threads = std::make_unique<si::SliceThreads>(impl->peers.size(), each);
  }
  impl->eos = options.eos_token_ids ? *options.eos_token_ids : model->config().eos_token_ids;
  impl->by_slot.resize(options.max_batch);
  impl->retained.resize(options.max_batch);
  impl->freed_at.assign(options.max_batch, 0);
  for (int64_t s = 0; s < options.max_batch; ++s) impl->free_slots.insert(s);
  std::unique_ptr<GenerationEngine> engine(new GenerationEngine(std::move(impl)));
  engine->options_ = options;
  return engine;
}

absl::StatusOr<RequestId> GenerationEngine::Submit(GenerationRequest request) {
  Impl& m = *impl_;
  const SamplingParams& p = request.params;
  const int64_t len = static_cast<int64_t>(request.prompt_ids.size());
  if (len == 0) return absl::InvalidArgumentError("GenerationEngine::Submit: empty prompt_ids");
  for (int64_t i = 0; i < len; ++i) {
    const int64_t id = request.prompt_ids[i];
    if (id < 0 || id >= m.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("GenerationEngine::Submit: prompt_ids[", i,
                                                     "] = ", id, " outside the vocabulary [0, ",
                                                     m.vocab, ")"));
    }
  }
  if (len > options_.max_len) {
    return absl::OutOfRangeError(absl::StrCat("GenerationEngine::Submit: prompt of ", len,
                                              " tokens exceeds max_len ", options_.max_len));
  }
  if (request.n < 1 || request.n > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerationEngine::Submit: n = ", request.n,
                     " must be in [1, max_batch = ", options_.max_batch, "]"));
  }
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerationEngine::Submit: temperature ", p.temperature, " must be >= 0"));
  }
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerationEngine::Submit: top_p ", p.top_p, " must be in (0, 1]"));
  }
  if (p.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GenerationEngine::Submit: max_new_tokens ",
                                                   p.max_new_tokens, " must be positive"));
  }
  for (const std::string& s : p.stop_strings) {
    if (s.empty()) {
      return absl::InvalidArgumentError("GenerationEngine::Submit: empty stop string");
    }
  }
  if (!p.interrupt_ids.empty() &&
      (p.interrupt_min <= 0 || p.interrupt_max < p.interrupt_min || p.answer_budget <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GenerationEngine::Submit: length interruption needs 0 < interrupt_min (", p.interrupt_min,
        ") <= interrupt_max (", p.interrupt_max, ") and answer_budget (", p.answer_budget, ") > 0"));
  }
  for (int64_t id : p.interrupt_ids) {
    if (id < 0 || id >= m.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("GenerationEngine::Submit: interrupt id ", id,
                                                     " outside the vocabulary [0, ", m.vocab, ")"));
    }
  }
  if (!p.stop_strings.empty() && options_.tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "GenerationEngine::Submit: stop_strings need EngineOptions::tokenizer");
  }
  auto r = std::make_unique<Request>();
  r->id = m.next_id++;
  r->prompt = std::move(request.prompt_ids);
  r->params = std::move(request.params);
  r->n = request.n;
  r->unfinished = request.n;
  r->seed =
      r->params.seed ? *r->params.seed : si::MixSeed(options_.seed, static_cast<uint64_t>(r->id));
  r->stop_ids.insert(r->params.stop_token_ids.begin(), r->params.stop_token_ids.end());
  if (!r->params.ignore_eos) r->stop_ids.insert(m.eos.begin(), m.eos.end());
  for (const std::string& s : r->params.stop_strings) {
    r->max_stop_string = std::max(r->max_stop_string, s.size());
  }
  m.waiting.push_back(r.get());
  const RequestId id = r->id;
  m.requests.emplace(id, std::move(r));
  return id;
}

absl::Status GenerationEngine::Abort(RequestId id) {
  Impl& m = *impl_;
  auto it = m.requests.find(id);
  if (it == m.requests.end()) {
    return absl::NotFoundError(
        absl::StrCat("GenerationEngine::Abort: request ", id, " is unknown or finished"));
  }
  Request* r = it->second.get();
  if (!r->admitted) {
    m.waiting.erase(std::find(m.waiting.begin(), m.waiting.end(), r));
    for (int64_t i = 0; i < r->n; ++i) {
      GenerationResult res;
      res.request_id = id;
      res.sample_index = i;
      res.finish_reason = FinishReason::kAbort;
      m.ready.push_back(std::move(res));
    }
    m.requests.erase(it);
    return absl::OkStatus();
  }
  for (auto& s : m.by_slot) {
    if (s && s->request == r) s->aborted = true;
  }
  return absl::OkStatus();
}

bool GenerationEngine::HasPending() const {
  return !impl_->requests.empty() || !impl_->ready.empty();
}

int64_t GenerationEngine::num_waiting() const {
  return static_cast<int64_t>(impl_->waiting.size());
}

int64_t GenerationEngine::num_running() const {
  return options_.max_batch - static_cast<int64_t>(impl_->free_slots.size());
}

absl::Status GenerationEngine::ReleaseKvCache() {
  if (HasPending()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GenerationEngine: cannot release the KV cache while ", num_waiting(), " request(s) wait, ",
        num_running(), " sample(s) run and ", impl_->ready.size(),
        " finished result(s) wait to be collected by Step()"));
  }
  impl_->cache.reset();
  for (auto& c : impl_->peer_caches) c.reset();
  impl_->DropRetained();
  return absl::OkStatus();
}

void GenerationEngine::set_weight_version(int64_t version) {
  // Retained keys and values were computed with the old weights.
  if (version != weight_version_) impl_->DropRetained();
  weight_version_ = version;
}

absl::StatusOr<int64_t> GenerationEngine::RecomputeKvCache() {
  Impl& m = *impl_;
  if (m.broken) {
    return absl::FailedPreconditionError("GenerationEngine::RecomputeKvCache: an earlier step failed");
  }
  if (!m.cache) return absl::FailedPreconditionError("GenerationEngine::RecomputeKvCache: the KV cache is released");
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> tokens;
  for (int64_t slot = 0; slot < static_cast<int64_t>(m.by_slot.size()); ++slot) {
    const Sample* s = m.by_slot[slot].get();
    if (s == nullptr || s->tokens.empty()) continue;
    std::vector<int64_t> held = s->request->prompt;
    held.insert(held.end(), s->tokens.begin(), s->tokens.end() - 1);
    slots.push_back(slot);
    tokens.push_back(std::move(held));
  }
  if (slots.empty()) return 0;
  int64_t n = 0;
  for (int64_t slot : slots) ROLL_RETURN_IF_ERROR(m.OnAllCaches([&](KvCache& c) { return c.Reset(slot); }));
  for (const auto& t : tokens) n += static_cast<int64_t>(t.size());
  auto logits = m.OnAllSlices([&](CausalLM& model, KvCache& cache) { return model.Prefill(cache, slots, tokens); });
  if (!logits.ok()) {
    m.broken = true;
    return Annotate(logits.status(), "GenerationEngine::RecomputeKvCache");
  }
  stats_.recomputed_tokens += n;
  return n;
}

absl::Status GenerationEngine::AllocateKvCache() {
  if (impl_->cache) return absl::OkStatus();
  // Every slice's cache or none: the engine counts them allocated by slice 0's.
  ROLL_ASSIGN_OR_RETURN(auto cache, impl_->model->NewKvCache(options_.max_batch, options_.max_len));
  std::vector<std::unique_ptr<KvCache>> peer_caches;
  for (CausalLM* peer : impl_->peers) {
    ROLL_ASSIGN_OR_RETURN(auto c, peer->NewKvCache(options_.max_batch, options_.max_len));
    peer_caches.push_back(std::move(c));
  }
  impl_->cache = std::move(cache);
  impl_->peer_caches = std::move(peer_caches);
  return absl::OkStatus();
}

bool GenerationEngine::kv_cache_allocated() const { return impl_->cache != nullptr; }

int64_t GenerationEngine::kv_cache_bytes() const {
  if (!impl_->cache) return 0;
  int64_t n = impl_->cache->nbytes();
  for (const auto& c : impl_->peer_caches) n += c->nbytes();
  return n;
}

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::Step() {
  Impl& m = *impl_;
  if (m.broken) {
    return absl::FailedPreconditionError(
        "GenerationEngine::Step: an earlier step failed; recreate the engine");
  }
  if (!m.cache) {
    return absl::FailedPreconditionError(
        "GenerationEngine::Step: the KV cache is released (offloaded); call AllocateKvCache first");
  }
  std::vector<GenerationResult> results = std::move(m.ready);
  m.ready.clear();

  auto finish = [&](int64_t slot, FinishReason reason, std::string stop_string, size_t text_cut) {
    std::unique_ptr<Sample> s = std::move(m.by_slot[slot]);
    GenerationResult res;
    res.request_id = s->request->id;
    res.sample_index = s->index;
    res.finish_reason = reason;
    res.stop_string = std::move(stop_string);
    res.weight_version_first = s->version_first;
    res.weight_version_last = s->version_last;
    res.token_versions = std::move(s->versions);
    res.forced = std::move(s->forced);
    res.cached_prompt_tokens = s->request->cached;
    if (options_.tokenizer != nullptr) {
      res.text = m.Text(options_, s->tokens);
      if (reason == FinishReason::kStopString) res.text.resize(text_cut);
    }
    // The slot holds the prompt and every generated token but the last one
    // (sampled, never fed). It is kept for reuse when all of it was computed
    // with the current weights.
    const Request& r = *s->request;
    const int64_t held = static_cast<int64_t>(r.prompt.size() + s->tokens.size()) - 1;
    if (options_.enable_prefix_caching && s->version_first == weight_version_ &&
        s->version_last == weight_version_ && m.cache->length(slot) == held) {
      std::vector<int64_t>& keep = m.retained[slot];
      keep = r.prompt;
      keep.insert(keep.end(), s->tokens.begin(), s->tokens.end() - 1);
    } else {
      // Reset cannot fail: the slot came from the cache's own range.
      (void)m.OnAllCaches([&](KvCache& c) { return c.Reset(slot); });
    }
    res.token_ids = std::move(s->tokens);
    res.logprobs = std::move(s->logprobs);
    res.entropies = std::move(s->entropies);
    res.self_certainties = std::move(s->self_certainties);
    results.push_back(std::move(res));
    m.freed_at[slot] = ++m.clock;
    m.free_slots.insert(slot);
    ++stats_.samples_finished;
    if (--s->request->unfinished == 0) m.requests.erase(s->request->id);
  };

  // 1. Aborted samples leave before any compute is spent on them.
  for (int64_t slot = 0; slot < options_.max_batch; ++slot) {
    if (m.by_slot[slot] && m.by_slot[slot]->aborted) finish(slot, FinishReason::kAbort, "", 0);
  }

  // 2. One decode step for every running sample, in ascending slot order (a
  // contiguous run of slots lets attention read the cache without copying).
  std::vector<int64_t> decode_slots, last_tokens;
  for (int64_t slot = 0; slot < options_.max_batch; ++slot) {
    if (m.by_slot[slot]) {
      decode_slots.push_back(slot);
      last_tokens.push_back(m.by_slot[slot]->tokens.back());
    }
  }
  at::Tensor decode_logits;
  if (!decode_slots.empty()) {
    auto logits = m.OnAllSlices([&](CausalLM& model, KvCache& cache) {
      return model.DecodeStep(cache, decode_slots, last_tokens);
    });
    if (!logits.ok()) {
      m.broken = true;
      return Annotate(logits.status(), "GenerationEngine::Step");
    }
    decode_logits = *std::move(logits);
    ++stats_.decode_steps;
    stats_.decode_tokens += static_cast<int64_t>(decode_slots.size());
  }

  // 3. Admission, first come first served. One prefill slot per request; its
  // other samples get a copy of the prompt's cache.
  std::vector<Request*> admitted;
  std::vector<std::vector<int64_t>> admitted_slots;
  int64_t prefill_budget = options_.max_prefill_tokens;
  while (!m.waiting.empty()) {
    Request* r = m.waiting.front();
    if (static_cast<int64_t>(m.free_slots.size()) < r->n) break;
    const auto [reuse_slot, reuse] =
        options_.enable_prefix_caching ? m.BestPrefix(r->prompt) : std::pair<int64_t, int64_t>{-1, 0};
    const int64_t len = static_cast<int64_t>(r->prompt.size()) - reuse;
    if (!admitted.empty() && len > prefill_budget) break;
    prefill_budget -= len;
    r->cached = reuse;
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < r->n; ++i) {
      const int64_t slot = i == 0 && reuse > 0 ? reuse_slot : m.Spare();
      m.Take(slot, i == 0 ? reuse : 0);
      slots.push_back(slot);
      auto s = std::make_unique<Sample>();
      s->request = r;
      s->index = i;
      s->slot = slot;
      s->seed = si::MixSeed(r->seed, static_cast<uint64_t>(i));
      m.by_slot[slot] = std::move(s);
    }
    r->admitted = true;
    m.waiting.pop_front();
    admitted.push_back(r);
    admitted_slots.push_back(std::move(slots));
  }
  at::Tensor prefill_logits;
  std::vector<int64_t> prefill_rows;  // per admitted sample: its request's row
  if (!admitted.empty()) {
    std::vector<int64_t> first_slots;
    std::vector<std::vector<int64_t>> prompts;
    bool shared = false;
    for (size_t a = 0; a < admitted.size(); ++a) {
      const Request& r = *admitted[a];
      first_slots.push_back(admitted_slots[a][0]);
      prompts.emplace_back(r.prompt.begin() + r.cached, r.prompt.end());
      stats_.prefill_tokens += static_cast<int64_t>(prompts.back().size());
      stats_.cached_prompt_tokens += r.cached;
      for (size_t i = 0; i < admitted_slots[a].size(); ++i) {
        prefill_rows.push_back(static_cast<int64_t>(a));
      }
      shared = shared || admitted_slots[a].size() > 1;
    }
    auto logits = m.OnAllSlices([&](CausalLM& model, KvCache& cache) {
      return model.Prefill(cache, first_slots, prompts);
    });
    if (!logits.ok()) {
      m.broken = true;
      return Annotate(logits.status(), "GenerationEngine::Step");
    }
    ++stats_.prefill_calls;
    for (size_t a = 0; a < admitted.size(); ++a) {
      const std::vector<int64_t>& slots = admitted_slots[a];
      if (slots.size() < 2) continue;
      absl::Status st = m.OnAllCaches(
          [&](KvCache& c) { return c.CopyPrefix(slots[0], {slots.begin() + 1, slots.end()}); });
      if (!st.ok()) {
        m.broken = true;
        return Annotate(st, "GenerationEngine::Step");
      }
    }
    prefill_logits = *std::move(logits);
    if (shared) {
      at::Tensor rows = at::empty({static_cast<int64_t>(prefill_rows.size())}, at::kLong);
      std::copy(prefill_rows.begin(), prefill_rows.end(), rows.data_ptr<int64_t>());
      c10::InferenceMode guard;
      prefill_logits = prefill_logits.index_select(0, rows.to(prefill_logits.device()));
    }
  }

  // 4. Sample every running sample's next token at once.
  std::vector<int64_t> row_slots = decode_slots;
  for (const auto& slots : admitted_slots)
    row_slots.insert(row_slots.end(), slots.begin(), slots.end());
  if (row_slots.empty()) {
    if (!results.empty()) ++stats_.steps;
    return results;
  }
  ++stats_.steps;
  std::vector<si::RowSampling> rows;
  rows.reserve(row_slots.size());
  for (int64_t slot : row_slots) {
    const Sample& s = *m.by_slot[slot];
    const SamplingParams& p = s.request->params;
    si::RowSampling r;
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    if (p.temperature > 0) r.uniform = si::CounterUniform(s.seed, s.tokens.size());
    rows.push_back(r);
  }
  // [4, rows] float64: ids (exact below 2^53), log-probs, entropies and
  // self-certainties.
  at::Tensor host;
  try {
    c10::InferenceMode guard;
    at::Tensor logits = !decode_logits.defined()    ? prefill_logits
                        : !prefill_logits.defined() ? decode_logits
                                                    : at::cat({decode_logits, prefill_logits}, 0);
    auto sampled = si::SampleTokens(logits, rows);
    if (!sampled.ok()) {
      m.broken = true;
      return Annotate(sampled.status(), "GenerationEngine::Step");
    }
    const at::Tensor lsm = logits.to(at::kFloat).log_softmax(-1);
    const at::Tensor entropy = -(lsm.exp() * lsm).sum(-1);
    const at::Tensor certainty = -lsm.mean(-1) - std::log(static_cast<double>(lsm.size(-1)));
    host = at::stack({sampled->ids.to(at::kDouble), sampled->logprobs.to(at::kDouble), entropy.to(at::kDouble),
                      certainty.to(at::kDouble)})
               .cpu()
               .contiguous();
  } catch (const c10::Error& e) {
    m.broken = true;
    return absl::InternalError(
        absl::StrCat("GenerationEngine::Step: sampling: ", e.what_without_backtrace()));
  }
  const int64_t R = static_cast<int64_t>(row_slots.size());
  const double* ids = host.data_ptr<double>();
  const double* lps = ids + R;
  const double* ents = ids + 2 * R;
  const double* certs = ids + 3 * R;
  stats_.generated_tokens += R;

  for (int64_t i = 0; i < R; ++i) {
    const int64_t slot = row_slots[i];
    Sample& s = *m.by_slot[slot];
    const Request& r = *s.request;
    const std::vector<int64_t>& interrupt = r.params.interrupt_ids;
    // Length interruption: while the phrase is being injected, its next
    // token replaces the sampled one (fed at the next step like any token).
    const bool forcing = s.injected >= 0 && s.injected < static_cast<int64_t>(interrupt.size());
    const int64_t token = forcing ? interrupt[s.injected++] : static_cast<int64_t>(ids[i]);
    s.tokens.push_back(token);
    s.logprobs.push_back(forcing ? 0.0f : static_cast<float>(lps[i]));
    if (!interrupt.empty()) s.forced.push_back(forcing ? 1 : 0);
    s.entropies.push_back(static_cast<float>(ents[i]));
    s.self_certainties.push_back(static_cast<float>(certs[i]));
    if (s.version_first < 0) s.version_first = weight_version_;
    s.version_last = weight_version_;
    s.versions.push_back(weight_version_);
    const int64_t n_tokens = static_cast<int64_t>(s.tokens.size());
    if (!interrupt.empty() && s.interrupt_at < 0) {
      const double u = si::CounterUniform(s.seed, uint64_t{1} << 62);
      s.interrupt_at = r.params.interrupt_min +
                       std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(r.params.interrupt_max -
                                                                                       r.params.interrupt_min + 1)),
                                         r.params.interrupt_max - r.params.interrupt_min);
    }
    if (forcing) {
      // An injected token stops nothing; only the limits apply.
      if (n_tokens >= r.params.max_new_tokens || m.cache->length(slot) >= options_.max_len) {
        finish(slot, FinishReason::kLength, "", 0);
      }
      continue;
    }
    if (r.stop_ids.count(token) > 0) {
      finish(slot, FinishReason::kStopToken, "", 0);
      continue;
    }
    if (!r.params.stop_strings.empty()) {
      const std::string text = m.Text(options_, s.tokens);
      // Earlier bytes may change as a multi-byte character completes, so the
      // search restarts a little before the previous end.
      const size_t back = r.max_stop_string + 8;
      const size_t from = s.text_scanned > back ? s.text_scanned - back : 0;
      size_t best = std::string::npos;
      const std::string* match = nullptr;
      for (const std::string& stop : r.params.stop_strings) {
        const size_t at = text.find(stop, from);
        if (at < best) {
          best = at;
          match = &stop;
        }
      }
      s.text_scanned = text.size();
      if (match != nullptr) {
        finish(slot, FinishReason::kStopString, *match, best);
        continue;
      }
    }
    const bool answer_spent =
        s.injected >= 0 && n_tokens >= s.interrupt_at + static_cast<int64_t>(interrupt.size()) + r.params.answer_budget;
    if (n_tokens >= r.params.max_new_tokens || m.cache->length(slot) >= options_.max_len || answer_spent) {
      finish(slot, FinishReason::kLength, "", 0);
      continue;
    }
    // The thinking budget is spent: the phrase goes in from the next step.
    if (!interrupt.empty() && s.injected < 0 && n_tokens >= s.interrupt_at) s.injected = 0;
  }
  return results;
}

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::RunToCompletion() {
  std::vector<GenerationResult> all;
  while (HasPending()) {
    ROLL_ASSIGN_OR_RETURN(std::vector<GenerationResult> step, Step());
    for (auto& r : step) all.push_back(std::move(r));
  }
  return all;
}

}  // namespace roll
