#include "roll/strategies/generation_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "roll/models/hf_config.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"

namespace roll {
namespace {

// A tiny Qwen2-shaped model. initializer_range 0.2 spreads the logits, so
// greedy choices are far from ties and sampled tokens vary.
std::unique_ptr<CausalLM> TinyModel(uint64_t seed = 3) {
  auto config = ModelConfig::FromJson(R"({"model_type": "qwen2", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "initializer_range": 0.2})");
  EXPECT_TRUE(config.ok()) << config.status();
  ModelOptions options;
  options.requires_grad = false;
  auto m = CausalLM::Random(*config, seed, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

std::unique_ptr<GenerationEngine> MakeEngine(CausalLM* model, int64_t max_batch = 4,
                                             int64_t max_len = 128,
                                             const Tokenizer* tokenizer = nullptr,
                                             bool prefix_caching = false) {
  EngineOptions o;
  o.max_batch = max_batch;
  o.max_len = max_len;
  o.tokenizer = tokenizer;
  o.enable_prefix_caching = prefix_caching;
  auto e = GenerationEngine::Create(model, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

GenerationRequest Greedy(std::vector<int64_t> prompt, int64_t max_new) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_new_tokens = max_new;
  return r;
}

GenerationRequest Sampled(std::vector<int64_t> prompt, int64_t max_new, uint64_t seed,
                          int64_t n = 1) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 1.0;
  r.params.max_new_tokens = max_new;
  r.params.seed = seed;
  r.n = n;
  return r;
}

RequestId MustSubmit(GenerationEngine& e, GenerationRequest r) {
  auto id = e.Submit(std::move(r));
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : -1;
}

std::vector<GenerationResult> MustRun(GenerationEngine& e) {
  auto out = e.RunToCompletion();
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<GenerationResult>{};
}

// (request, sample) -> result.
std::map<std::pair<RequestId, int64_t>, GenerationResult> ByKey(
    const std::vector<GenerationResult>& results) {
  std::map<std::pair<RequestId, int64_t>, GenerationResult> out;
  for (const auto& r : results) out[{r.request_id, r.sample_index}] = r;
  return out;
}

using ResultMap = std::map<std::pair<RequestId, int64_t>, GenerationResult>;

// The result of sample `index` of `id`; an empty result when missing.
GenerationResult At(const ResultMap& m, RequestId id, int64_t index) {
  auto it = m.find({id, index});
  EXPECT_NE(it, m.end()) << "no result for request " << id << " sample " << index;
  return it == m.end() ? GenerationResult{} : it->second;
}

std::vector<int64_t> RunAlone(CausalLM* model, GenerationRequest r) {
  auto e = MakeEngine(model);
  MustSubmit(*e, std::move(r));
  auto out = MustRun(*e);
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? std::vector<int64_t>{} : out[0].token_ids;
}

// Full-sequence logits [T, V] of `ids`.
at::Tensor FullLogits(const CausalLM& m, const std::vector<int64_t>& ids) {
  torch::NoGradGuard g;
  auto out = m.Forward(torch::tensor(ids, torch::kLong).view({1, -1}));
  EXPECT_TRUE(out.ok()) << out.status();
  return (*out)[0];
}

// Copies `from`'s weights into `to` in place, as a weight sync does.
void CopyWeights(const CausalLM& from, CausalLM* to) {
  torch::NoGradGuard g;
  auto dst = to->NamedParameters();
  for (const auto& [name, t] : from.NamedParameters()) dst.at(name).copy_(t);
}

// The reference: re-run the whole sequence through Forward for every token.
std::vector<int64_t> NaiveGreedy(const CausalLM& m, std::vector<int64_t> ids, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t next = FullLogits(m, ids)[-1].argmax().item<int64_t>();
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

TEST(GenerationEngineTest, GreedyMatchesNaiveFullSequenceLoop) {
  auto model = TinyModel();
  auto e = MakeEngine(model.get());
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}, {10, 20, 30, 40, 50, 60}};
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(MustSubmit(*e, Greedy(p, 12)));
  auto results = ByKey(MustRun(*e));
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult& r = results[{ids[i], 0}];
    EXPECT_EQ(r.token_ids, NaiveGreedy(*model, prompts[i], 12)) << "prompt " << i;
    EXPECT_EQ(r.finish_reason, FinishReason::kLength);
    EXPECT_EQ(r.logprobs.size(), 12u);
  }
}

TEST(GenerationEngineTest, RequestsJoiningAndLeavingDoNotChangeGreedyOutput) {
  auto model = TinyModel();
  const std::vector<int64_t> pa = {5, 6, 7, 8}, pb = {9, 1}, pc = {3, 3, 3, 3, 3, 3, 3};
  const std::vector<int64_t> alone_a = RunAlone(model.get(), Greedy(pa, 20));
  const std::vector<int64_t> alone_b = RunAlone(model.get(), Greedy(pb, 4));
  ASSERT_EQ(alone_a.size(), 20u);

  auto e = MakeEngine(model.get(), /*max_batch=*/3);
  const RequestId a = MustSubmit(*e, Greedy(pa, 20));
  std::vector<GenerationResult> results;
  auto step = [&] {
    auto r = e->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    results.insert(results.end(), r->begin(), r->end());
  };
  for (int i = 0; i < 3; ++i) step();
  const RequestId b = MustSubmit(*e, Greedy(pb, 4));  // joins, leaves after 4 tokens
  step();
  const RequestId c = MustSubmit(*e, Greedy(pc, 30));  // joins, aborted mid-way
  for (int i = 0; i < 6; ++i) step();
  EXPECT_EQ(e->num_running(), 2);  // b has left, a and c run
  ASSERT_TRUE(e->Abort(c).ok());
  step();
  EXPECT_EQ(e->num_running(), 1);
  const RequestId d = MustSubmit(*e, Greedy(pb, 4));  // reuses a freed slot
  while (e->HasPending()) step();

  auto by = ByKey(results);
  EXPECT_EQ(At(by, a, 0).token_ids, alone_a);
  EXPECT_EQ(At(by, b, 0).token_ids, alone_b);
  EXPECT_EQ(At(by, d, 0).token_ids, alone_b);
  EXPECT_EQ(At(by, c, 0).finish_reason, FinishReason::kAbort);
  EXPECT_EQ(At(by, c, 0).token_ids.size(), 6u);
  // Even the aborted request's partial output is its greedy continuation.
  EXPECT_EQ(At(by, c, 0).token_ids, NaiveGreedy(*model, pc, 6));
}

TEST(GenerationEngineTest, SamplesOfOnePromptSharePrefillAndFollowTheirSeeds) {
  auto model = TinyModel();
  const std::vector<int64_t> prompt = {4, 8, 15, 16, 23, 42};
  auto e = MakeEngine(model.get(), /*max_batch=*/4);
  const RequestId id = MustSubmit(*e, Sampled(prompt, 10, /*seed=*/7, /*n=*/4));
  auto results = ByKey(MustRun(*e));
  ASSERT_EQ(results.size(), 4u);
  // One prefill of the prompt, not four.
  EXPECT_EQ(e->stats().prefill_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(e->stats().prefill_calls, 1);
  EXPECT_EQ(e->stats().generated_tokens, 40);
  std::set<std::vector<int64_t>> distinct;
  for (int64_t i = 0; i < 4; ++i) distinct.insert(At(results, id, i).token_ids);
  EXPECT_GE(distinct.size(), 3u) << "samples of one prompt should differ";

  // The same seed reproduces each sample, with other requests in the batch
  // and the request arriving later; another seed gives other tokens.
  auto e2 = MakeEngine(model.get(), /*max_batch=*/4);
  MustSubmit(*e2, Greedy({1, 2}, 3));
  MustSubmit(*e2, Sampled({9, 9, 9}, 15, /*seed=*/1));
  ASSERT_TRUE(e2->Step().ok());
  const RequestId id2 = MustSubmit(*e2, Sampled(prompt, 10, /*seed=*/7, /*n=*/2));
  const RequestId id3 = MustSubmit(*e2, Sampled(prompt, 10, /*seed=*/8, /*n=*/1));
  auto results2 = ByKey(MustRun(*e2));
  EXPECT_EQ(At(results2, id2, 0).token_ids, At(results, id, 0).token_ids);
  EXPECT_EQ(At(results2, id2, 1).token_ids, At(results, id, 1).token_ids);
  for (size_t k = 0; k < 10; ++k) {
    // Batched matrix products may round differently with another batch
    // composition: equal up to float noise, not bit for bit.
    EXPECT_NEAR(At(results2, id2, 0).logprobs[k], At(results, id, 0).logprobs[k], 1e-4);
  }
  EXPECT_NE(At(results2, id3, 0).token_ids, At(results, id, 0).token_ids);
}

TEST(GenerationEngineTest, LogProbsAreThoseOfTheProcessedDistribution) {
  auto model = TinyModel();
  const std::vector<int64_t> prompt = {11, 12, 13};
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  for (const Case& c : {Case{0.0, 0, 1.0}, Case{1.0, 0, 1.0}, Case{0.7, 0, 1.0}, Case{0.8, 10, 1.0},
                        Case{1.3, 0, 0.8}, Case{0.9, 20, 0.7}}) {
    SCOPED_TRACE(testing::Message()
                 << "T=" << c.temperature << " k=" << c.top_k << " p=" << c.top_p);
    GenerationRequest req = Sampled(prompt, 12, /*seed=*/5);
    req.params.temperature = c.temperature;
    req.params.top_k = c.top_k;
    req.params.top_p = c.top_p;
    auto e = MakeEngine(model.get());
    MustSubmit(*e, req);
    auto out = MustRun(*e);
    ASSERT_EQ(out.size(), 1u);
    const GenerationResult& r = out[0];
    ASSERT_EQ(r.token_ids.size(), 12u);
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), r.token_ids.begin(), r.token_ids.end());
    const at::Tensor logits = FullLogits(*model, seq);
    for (size_t j = 0; j < r.token_ids.size(); ++j) {
      // Processed logits computed here independently: temperature, then the
      // k largest, then the shortest descending prefix reaching top_p.
      at::Tensor x = logits[prompt.size() - 1 + j];
      if (c.temperature > 0) x = x / c.temperature;
      auto [sorted, order] = x.sort(0, /*descending=*/true);
      const int64_t V = x.size(0);
      const int64_t k = c.top_k > 0 ? c.top_k : V;
      at::Tensor keep = torch::arange(V) < k;
      if (c.top_p < 1.0) {
        at::Tensor p = torch::softmax(sorted.masked_fill(~keep, -INFINITY), 0);
        keep = keep & ((p.cumsum(0) - p) < c.top_p);
      }
      at::Tensor processed =
          torch::full({V}, -INFINITY).scatter(0, order, sorted.masked_fill(~keep, -INFINITY));
      const int64_t tok = r.token_ids[j];
      const float expect = torch::log_softmax(processed, 0)[tok].item<float>();
      ASSERT_TRUE(std::isfinite(expect)) << "token " << j << " outside the kept set";
      EXPECT_NEAR(r.logprobs[j], expect, 2e-4) << "token " << j;
      if (c.temperature == 0) EXPECT_EQ(tok, x.argmax().item<int64_t>());
      // Entropy and self-certainty of the model's own distribution
      // (temperature 1, untruncated), whatever the sampling settings.
      const at::Tensor lsm = torch::log_softmax(logits[prompt.size() - 1 + j], 0);
      ASSERT_EQ(r.entropies.size(), r.token_ids.size());
      ASSERT_EQ(r.self_certainties.size(), r.token_ids.size());
      EXPECT_NEAR(r.entropies[j], -(lsm.exp() * lsm).sum().item<float>(), 2e-4) << "token " << j;
      EXPECT_NEAR(r.self_certainties[j], -lsm.mean().item<float>() - std::log(static_cast<double>(V)), 2e-4)
          << "token " << j;
    }
  }
}

TEST(GenerationEngineTest, TopKOneAndTinyTopPEqualGreedy) {
  auto model = TinyModel();
  const std::vector<int64_t> prompt = {30, 31, 32};
  const std::vector<int64_t> greedy = RunAlone(model.get(), Greedy(prompt, 15));
  GenerationRequest k1 = Sampled(prompt, 15, 99);
  k1.params.top_k = 1;
  EXPECT_EQ(RunAlone(model.get(), k1), greedy);
  GenerationRequest p0 = Sampled(prompt, 15, 99);
  p0.params.top_p = 1e-6;
  EXPECT_EQ(RunAlone(model.get(), p0), greedy);
  // Plain sampling at temperature 1 does not follow the greedy path.
  EXPECT_NE(RunAlone(model.get(), Sampled(prompt, 15, 99)), greedy);
}

TEST(GenerationEngineTest, StopTokenAndLengthFinishReasons) {
  auto model = TinyModel();
  const std::vector<int64_t> prompt = {2, 4, 6};
  const std::vector<int64_t> full = RunAlone(model.get(), Greedy(prompt, 12));
  ASSERT_EQ(full.size(), 12u);

  // The third generated token as stop token: generation ends at its first
  // occurrence, and the stop token is part of the output.
  const int64_t stop = full[2];
  const size_t first = std::find(full.begin(), full.end(), stop) - full.begin();
  GenerationRequest req = Greedy(prompt, 12);
  req.params.stop_token_ids = {stop};
  auto e = MakeEngine(model.get());
  MustSubmit(*e, req);
  auto out = MustRun(*e);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(out[0].token_ids, std::vector<int64_t>(full.begin(), full.begin() + first + 1));

  // EOS ids from the engine options stop too, unless the request ignores EOS.
  EngineOptions o;
  o.max_batch = 2;
  o.max_len = 64;
  o.eos_token_ids = std::vector<int64_t>{stop};
  auto e2 = *GenerationEngine::Create(model.get(), o);
  const RequestId with_eos = MustSubmit(*e2, Greedy(prompt, 12));
  GenerationRequest ignoring = Greedy(prompt, 12);
  ignoring.params.ignore_eos = true;
  const RequestId without = MustSubmit(*e2, ignoring);
  auto by = ByKey(MustRun(*e2));
  EXPECT_EQ(At(by, with_eos, 0).finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(At(by, with_eos, 0).token_ids.size(), first + 1);
  EXPECT_EQ(At(by, without, 0).finish_reason, FinishReason::kLength);
  EXPECT_EQ(At(by, without, 0).token_ids, full);

  // max_new_tokens.
  auto short_run = RunAlone(model.get(), Greedy(prompt, 5));
  EXPECT_EQ(short_run, std::vector<int64_t>(full.begin(), full.begin() + 5));

  // A full slot ends with kLength too: max_len 8 holds the 3 prompt tokens
  // and 5 fed-back tokens, so 6 tokens can be sampled.
  auto e3 = MakeEngine(model.get(), 1, /*max_len=*/8);
  MustSubmit(*e3, Greedy(prompt, 100));
  auto out3 = MustRun(*e3);
  ASSERT_EQ(out3.size(), 1u);
  EXPECT_EQ(out3[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(out3[0].token_ids, NaiveGreedy(*model, prompt, 6));
}

TEST(GenerationEngineTest, StopStringCutsTheTextBeforeIt) {
  auto model = TinyModel();
  // 3 special tokens + 97 characters = the model's 100 ids.
  std::string alphabet = "\n\t";
  for (char ch = 32; ch < 127; ++ch) alphabet.push_back(ch);
  CharTokenizerOptions to;
  to.alphabet = alphabet;
  auto tok = MakeCharTokenizer(to);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ(tok->vocab_size(), 100);

  const std::vector<int64_t> prompt = {40, 50, 60};
  auto e = MakeEngine(model.get(), 2, 128, &*tok);
  MustSubmit(*e, Greedy(prompt, 20));
  auto full = MustRun(*e);
  ASSERT_EQ(full.size(), 1u);
  const std::string text = full[0].text;
  ASSERT_GE(text.size(), 10u);
  // A two-character stop string taken from the middle of the text; the
  // output text ends right before its first occurrence.
  const std::string stop = text.substr(6, 2);
  const size_t cut = text.find(stop);
  // The tokens end with the one that completed the match.
  size_t tokens_needed = 0;
  for (size_t t = 1; t <= full[0].token_ids.size(); ++t) {
    std::vector<int32_t> ids(full[0].token_ids.begin(), full[0].token_ids.begin() + t);
    if (tok->Decode(ids, true)->find(stop) != std::string::npos) {
      tokens_needed = t;
      break;
    }
  }
  ASSERT_GT(tokens_needed, 0u);

  GenerationRequest req = Greedy(prompt, 20);
  req.params.stop_strings = {"this string never appears \x01", stop};
  auto e2 = MakeEngine(model.get(), 2, 128, &*tok);
  MustSubmit(*e2, req);
  auto out = MustRun(*e2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].finish_reason, FinishReason::kStopString);
  EXPECT_EQ(out[0].stop_string, stop);
  EXPECT_EQ(out[0].text, text.substr(0, cut));
  EXPECT_EQ(out[0].token_ids, std::vector<int64_t>(full[0].token_ids.begin(),
                                                   full[0].token_ids.begin() + tokens_needed));
  EXPECT_EQ(out[0].logprobs.size(), tokens_needed);

  // Stop strings need a tokenizer.
  auto no_tok = MakeEngine(model.get());
  auto st = no_tok->Submit(req);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GenerationEngineTest, AbortReturnsPartialOutputAndFreesTheSlot) {
  auto model = TinyModel();
  auto e = MakeEngine(model.get(), /*max_batch=*/2);
  const RequestId a = MustSubmit(*e, Sampled({1, 2, 3}, 50, 1, /*n=*/2));
  const RequestId queued = MustSubmit(*e, Greedy({4, 5}, 5));  // waits: no free slot
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->Step().ok());
  EXPECT_EQ(e->num_running(), 2);
  EXPECT_EQ(e->num_waiting(), 1);
  ASSERT_TRUE(e->Abort(a).ok());
  auto step = e->Step();
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->size(), 2u);
  for (const GenerationResult& r : *step) {
    EXPECT_EQ(r.request_id, a);
    EXPECT_EQ(r.finish_reason, FinishReason::kAbort);
    EXPECT_EQ(r.token_ids.size(), 4u);
    EXPECT_EQ(r.logprobs.size(), 4u);
  }
  // The freed slots went to the queued request in the same step.
  EXPECT_EQ(e->num_waiting(), 0);
  EXPECT_EQ(e->num_running(), 1);
  EXPECT_EQ(e->Abort(a).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e->Abort(12345).code(), absl::StatusCode::kNotFound);

  // Aborting a request that never started returns it without tokens.
  auto e2 = MakeEngine(model.get(), /*max_batch=*/1);
  MustSubmit(*e2, Greedy({1}, 5));
  const RequestId never = MustSubmit(*e2, Greedy({2}, 5));
  ASSERT_TRUE(e2->Step().ok());
  ASSERT_TRUE(e2->Abort(never).ok());
  auto rest = ByKey(MustRun(*e2));
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(At(rest, never, 0).finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(At(rest, never, 0).token_ids.empty());
  EXPECT_EQ(At(rest, never, 0).weight_version_first, -1);
  auto queued_result = ByKey(MustRun(*e));
  EXPECT_EQ(At(queued_result, queued, 0).token_ids, NaiveGreedy(*model, {4, 5}, 5));
}

TEST(GenerationEngineTest, MoreRequestsThanSlotsQueueAndComplete) {
  auto model = TinyModel();
  auto e = MakeEngine(model.get(), /*max_batch=*/2);
  std::vector<std::vector<int64_t>> prompts = {{1}, {2, 3}, {4, 5, 6}, {7, 8}, {9}};
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(MustSubmit(*e, Greedy(p, 6)));
  const RequestId pair = MustSubmit(*e, Sampled({10, 11}, 6, 3, /*n=*/2));
  EXPECT_EQ(e->num_waiting(), 6);
  auto by = ByKey(MustRun(*e));
  ASSERT_EQ(by.size(), 7u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(At(by, ids[i], 0).token_ids, NaiveGreedy(*model, prompts[i], 6)) << i;
  }
  EXPECT_EQ(At(by, pair, 0).token_ids.size(), 6u);
  EXPECT_EQ(At(by, pair, 1).token_ids.size(), 6u);
  EXPECT_FALSE(e->HasPending());
  EXPECT_EQ(e->num_running(), 0);
}

TEST(GenerationEngineTest, BadRequestsAreClearErrors) {
  auto model = TinyModel();
  auto e = MakeEngine(model.get(), /*max_batch=*/2, /*max_len=*/16);
  auto too_long = e->Submit(Greedy(std::vector<int64_t>(17, 1), 4));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(too_long.status().message()).find("exceeds max_len 16"), std::string::npos)
      << too_long.status();
  auto bad_id = e->Submit(Greedy({1, 100}, 4));
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad_id.status().message()).find("prompt_ids[1] = 100"), std::string::npos)
      << bad_id.status();
  EXPECT_FALSE(e->Submit(Greedy({}, 4)).ok());
  EXPECT_FALSE(e->Submit(Sampled({1}, 4, 1, /*n=*/3)).ok());  // n > max_batch
  EXPECT_FALSE(e->Submit(Greedy({1}, 0)).ok());
  GenerationRequest bad_p = Sampled({1}, 4, 1);
  bad_p.params.top_p = 0;
  EXPECT_FALSE(e->Submit(bad_p).ok());
  GenerationRequest bad_t = Sampled({1}, 4, 1);
  bad_t.params.temperature = -0.5;
  EXPECT_FALSE(e->Submit(bad_t).ok());
  EXPECT_FALSE(e->HasPending());
  // A prompt of exactly max_len positions still yields one token.
  MustSubmit(*e, Greedy(std::vector<int64_t>(16, 1), 4));
  auto out = MustRun(*e);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token_ids.size(), 1u);
  EXPECT_EQ(out[0].finish_reason, FinishReason::kLength);

  EngineOptions o;
  o.max_batch = 0;
  EXPECT_EQ(GenerationEngine::Create(model.get(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GenerationEngineTest, ResultsReportWeightVersions) {
  auto model = TinyModel();
  auto e = MakeEngine(model.get());
  e->set_weight_version(3);
  const RequestId id = MustSubmit(*e, Greedy({1, 2}, 6));
  ASSERT_TRUE(e->Step().ok());
  ASSERT_TRUE(e->Step().ok());
  e->set_weight_version(4);  // between steps: the swap point
  auto out = MustRun(*e);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].request_id, id);
  EXPECT_EQ(out[0].weight_version_first, 3);
  EXPECT_EQ(out[0].weight_version_last, 4);
  // Per token: the prefill step and one decode step sampled under 3, the
  // rest under 4 (asynchronous training's per-token versions).
  EXPECT_EQ(out[0].token_versions, (std::vector<int64_t>{3, 3, 4, 4, 4, 4}));
}

TEST(GenerationEngineTest, WeightsUpdatedBetweenStepsAreUsedByLaterTokens) {
  auto model = TinyModel(3);
  auto other = TinyModel(4);
  const std::vector<int64_t> prompt = {6, 7};
  auto e = MakeEngine(model.get());
  MustSubmit(*e, Greedy(prompt, 1));
  auto first = MustRun(*e);
  CopyWeights(*other, model.get());
  MustSubmit(*e, Greedy(prompt, 8));
  auto after = MustRun(*e);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].token_ids, NaiveGreedy(*other, prompt, 8));
}

// Asynchronous training's recompute option: after an update under a
// running sample, RecomputeKvCache makes it continue exactly as the new
// weights would from its prefix; without it the old keys and values stay.
TEST(GenerationEngineTest, RecomputeKvCacheContinuesWithTheNewWeightsWholePrefix) {
  const std::vector<int64_t> prompt = {6, 7, 3};
  auto other = TinyModel(4);
  for (bool recompute : {true, false}) {
    auto model = TinyModel(3);
    auto e = MakeEngine(model.get());
    MustSubmit(*e, Greedy(prompt, 8));
    ASSERT_TRUE(e->Step().ok());  // prefill + token 0
    ASSERT_TRUE(e->Step().ok());  // token 1
    ASSERT_TRUE(e->Step().ok());  // token 2
    CopyWeights(*other, model.get());
    e->set_weight_version(1);
    if (recompute) {
      auto n = e->RecomputeKvCache();
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(*n, 3 + 2) << "the prompt and the tokens the cache held";
    }
    auto out = MustRun(*e);
    ASSERT_EQ(out.size(), 1u);
    const std::vector<int64_t>& t = out[0].token_ids;
    std::vector<int64_t> prefix = prompt;
    prefix.insert(prefix.end(), t.begin(), t.begin() + 3);
    const std::vector<int64_t> expected = NaiveGreedy(*other, prefix, 5);
    if (recompute) {
      EXPECT_EQ(std::vector<int64_t>(t.begin() + 3, t.end()), expected);
    } else {
      EXPECT_NE(std::vector<int64_t>(t.begin() + 3, t.end()), expected) << "the old keys and values stay";
    }
    EXPECT_EQ(out[0].token_versions, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1}));
  }
}

// Forced length interruption (ScaleRL): after the budget, the phrase is
// fed token by token (not sampled), then the answer budget runs.
TEST(GenerationEngineTest, LengthInterruptionInjectsThePhraseThenAnswers) {
  auto model = TinyModel(5);
  auto e = MakeEngine(model.get());
  const std::vector<int64_t> prompt = {3, 4};
  GenerationRequest r = Greedy(prompt, 20);
  r.params.ignore_eos = true;
  r.params.interrupt_ids = {5, 6, 7};
  r.params.interrupt_min = r.params.interrupt_max = 3;
  r.params.answer_budget = 2;
  MustSubmit(*e, r);
  auto out = MustRun(*e);
  ASSERT_EQ(out.size(), 1u);
  const GenerationResult& g = out[0];
  ASSERT_EQ(g.token_ids.size(), 8u) << "3 thinking + 3 injected + 2 answer tokens";
  EXPECT_EQ(g.finish_reason, FinishReason::kLength);
  EXPECT_EQ(g.forced, (std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(g.token_ids.begin() + 3, g.token_ids.begin() + 6), (std::vector<int64_t>{5, 6, 7}));
  for (int j = 3; j < 6; ++j) EXPECT_EQ(g.logprobs[j], 0.0f);
  // The phrase was fed: the thinking is the model's greedy continuation, and
  // the answer its greedy continuation of prompt + thinking + phrase.
  std::vector<int64_t> thinking(g.token_ids.begin(), g.token_ids.begin() + 3);
  EXPECT_EQ(thinking, NaiveGreedy(*model, prompt, 3));
  std::vector<int64_t> ctx = prompt;
  ctx.insert(ctx.end(), g.token_ids.begin(), g.token_ids.begin() + 6);
  EXPECT_EQ(std::vector<int64_t>(g.token_ids.begin() + 6, g.token_ids.end()), NaiveGreedy(*model, ctx, 2));
}

TEST(GenerationEngineTest, LengthInterruptionBudgetsAreDrawnInTheRangeFromTheSeed) {
  auto model = TinyModel(5);
  std::map<int64_t, int64_t> points;  // sample -> where the phrase went in
  for (int run = 0; run < 2; ++run) {
    auto e = MakeEngine(model.get());
    GenerationRequest r = Sampled({3, 4}, 30, 77, 4);
    r.params.ignore_eos = true;
    r.params.interrupt_ids = {5};
    r.params.interrupt_min = 2;
    r.params.interrupt_max = 9;
    r.params.answer_budget = 1;
    MustSubmit(*e, r);
    for (const GenerationResult& g : MustRun(*e)) {
      const auto at = std::find(g.forced.begin(), g.forced.end(), 1);
      ASSERT_NE(at, g.forced.end());
      const int64_t k = at - g.forced.begin();
      EXPECT_GE(k, 2);
      EXPECT_LE(k, 9);
      EXPECT_EQ(static_cast<int64_t>(g.token_ids.size()), k + 2) << "the phrase and one answer token";
      if (run == 0) points[g.sample_index] = k;
      else EXPECT_EQ(k, points[g.sample_index]) << "the same seed draws the same budget";
    }
  }
  GenerationRequest bad = Greedy({3}, 8);
  bad.params.interrupt_ids = {5};
  bad.params.interrupt_min = 4;
  bad.params.interrupt_max = 2;
  bad.params.answer_budget = 1;
  auto e = MakeEngine(model.get());
  EXPECT_EQ(e->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Offload of a generator (colocated clusters): the KV cache is freed
// between rollouts and allocated again; generation is unchanged.
TEST(GenerationEngineTest, KvCacheReleasedBetweenRolloutsAndAllocatedAgain) {
  auto model = TinyModel(3);
  const std::vector<int64_t> prompt = {6, 7, 8};
  auto e = MakeEngine(model.get());
  const int64_t bytes = e->kv_cache_bytes();
  EXPECT_GT(bytes, 0);
  MustSubmit(*e, Greedy(prompt, 4));
  EXPECT_EQ(e->ReleaseKvCache().code(), absl::StatusCode::kFailedPrecondition) << "a request is pending";
  auto first = MustRun(*e);
  ASSERT_TRUE(e->ReleaseKvCache().ok());
  EXPECT_FALSE(e->kv_cache_allocated());
  EXPECT_EQ(e->kv_cache_bytes(), 0);
  MustSubmit(*e, Greedy(prompt, 4));  // queued while released
  auto step = e->Step();
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
  ASSERT_TRUE(e->AllocateKvCache().ok());
  EXPECT_EQ(e->kv_cache_bytes(), bytes);
  auto again = MustRun(*e);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].token_ids, first[0].token_ids);
  EXPECT_EQ(again[0].token_ids, NaiveGreedy(*model, prompt, 4));
}

// Prefix caching: a multi-turn episode's next prompt (its previous prompt,
// the response, the next observation) reuses the slot that served the
// previous turn and prefills only what is new; the tokens and log-probs are
// those of an engine without the cache.
std::unique_ptr<GenerationEngine> CachingEngine(CausalLM* model, int64_t max_batch = 4) {
  return MakeEngine(model, max_batch, /*max_len=*/128, /*tokenizer=*/nullptr, /*prefix_caching=*/true);
}

GenerationResult RunOne(GenerationEngine& e, GenerationRequest r) {
  MustSubmit(e, std::move(r));
  auto out = MustRun(e);
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? GenerationResult{} : out[0];
}

TEST(GenerationEngineTest, PrefixCachingServesTheNextTurnFromTheSlot) {
  auto model = TinyModel();
  auto cached = CachingEngine(model.get());
  auto plain = MakeEngine(model.get());
  std::vector<int64_t> history = {5, 6, 7, 8, 9, 10};
  for (int turn = 0; turn < 3; ++turn) {
    const int64_t before = cached->stats().prefill_tokens;
    const GenerationResult a = RunOne(*cached, Sampled(history, 6, 40 + turn));
    const GenerationResult b = RunOne(*plain, Sampled(history, 6, 40 + turn));
    EXPECT_EQ(a.token_ids, b.token_ids) << "turn " << turn;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-4);
    EXPECT_EQ(b.cached_prompt_tokens, 0);
    if (turn == 0) {
      EXPECT_EQ(a.cached_prompt_tokens, 0);
    } else {
      // Everything the previous turn fed: its prompt and its response but
      // the last token (sampled, never fed); that token and the
      // observation (3 tokens) are prefilled.
      EXPECT_EQ(a.cached_prompt_tokens, static_cast<int64_t>(history.size()) - 4);
      EXPECT_EQ(cached->stats().prefill_tokens - before, 4);
    }
    history.insert(history.end(), a.token_ids.begin(), a.token_ids.end());
    for (int64_t obs : {11, 12, 13}) history.push_back(obs + turn);
  }
  EXPECT_GT(cached->stats().cached_prompt_tokens, 0);
  EXPECT_EQ(plain->stats().cached_prompt_tokens, 0);  // off by default
}

TEST(GenerationEngineTest, PrefixCachingDropsPrefixesOfOldWeights) {
  auto model = TinyModel(3);
  auto other = TinyModel(4);
  auto e = CachingEngine(model.get());
  std::vector<int64_t> history = {6, 7, 8};
  const GenerationResult first = RunOne(*e, Greedy(history, 4));
  history.insert(history.end(), first.token_ids.begin(), first.token_ids.end());
  history.push_back(9);
  CopyWeights(*other, model.get());
  e->set_weight_version(1);  // the update is announced: nothing is reused
  const GenerationResult next = RunOne(*e, Greedy(history, 5));
  EXPECT_EQ(next.cached_prompt_tokens, 0);
  EXPECT_EQ(next.token_ids, NaiveGreedy(*other, history, 5));
}

TEST(GenerationEngineTest, PrefixCachingPrefersTheSlotThePromptContinues) {
  auto model = TinyModel();
  auto e = CachingEngine(model.get(), /*max_batch=*/2);
  // Two finished requests share their first four tokens.
  const std::vector<int64_t> a = {1, 2, 3, 4, 50, 51, 52, 53, 54, 55};
  const std::vector<int64_t> b = {1, 2, 3, 4, 60};
  MustSubmit(*e, Greedy(a, 1));
  MustSubmit(*e, Greedy(b, 1));
  ASSERT_EQ(MustRun(*e).size(), 2u);
  // A prompt that continues b whole takes b's slot although it shares as
  // much with a; a's history stays for a's own next turn.
  const GenerationResult nb = RunOne(*e, Greedy({1, 2, 3, 4, 60, 61}, 1));
  EXPECT_EQ(nb.cached_prompt_tokens, 5);
  std::vector<int64_t> a_next = a;
  a_next.push_back(70);
  const GenerationResult na = RunOne(*e, Greedy(a_next, 1));
  EXPECT_EQ(na.cached_prompt_tokens, static_cast<int64_t>(a.size()));
  EXPECT_EQ(na.token_ids, NaiveGreedy(*model, a_next, 1));
}

}  // namespace
}  // namespace roll
