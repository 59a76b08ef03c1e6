// Tensor-parallel CausalLM slices over Gloo (roll/models/tensor_parallel.h):
// slices of 2 and 4 ranks compute the whole model's logits, greedy
// generation through the engine equals the unsplit model's token for
// token, slices load from a checkpoint, and impossible splits are refused
// naming the numbers.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/generation_engine.h"
#include "roll/strategies/tensor_parallel.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

// 4 heads, 4 KV heads, vocabulary 52: splits 2 and 4 ways.
ModelConfig Config(int kv_heads = 4, int vocab = 52) {
  auto c = ModelConfig::FromJson(absl::StrCat(R"({"model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": )", kv_heads, R"(, "vocab_size": )", vocab,
                                              R"(, "max_position_embeddings": 128,
    "initializer_range": 0.2})"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::unique_ptr<CausalLM> Whole(ModelOptions o = {}) {
  o.requires_grad = false;
  auto m = CausalLM::Random(Config(), 11, o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// The slices of `whole` over `tp` in-process Gloo ranks.
struct Group {
  std::unique_ptr<StoreServer> store;
  std::unique_ptr<TensorParallelGroup> tp;
  std::vector<CausalLM*> slices;
};

Group MakeGroup(const CausalLM& whole, int tp, const std::string& name) {
  Group g;
  auto store = StoreServer::Start("127.0.0.1", 0);
  EXPECT_TRUE(store.ok()) << store.status();
  g.store = std::move(*store);
  CommunicatorOptions base;
  base.store_port = g.store->port();
  base.store_token = g.store->token();
  base.group_name = name;
  auto group = TensorParallelGroup::Create(whole, tp, base);
  EXPECT_TRUE(group.ok()) << group.status();
  g.tp = std::move(*group);
  g.slices = g.tp->slices();
  return g;
}

// Runs fn(slice r) on every slice at once; returns slice 0's result.
template <typename Fn>
auto OnAll(const Group& g, Fn fn) {
  using R = decltype(fn(*g.slices[0]));
  std::vector<R> results(g.slices.size());
  std::vector<std::thread> threads;
  for (size_t r = 1; r < g.slices.size(); ++r) {
    threads.emplace_back([&, r] {
      c10::InferenceMode guard;
      results[r] = fn(*g.slices[r]);
    });
  }
  {
    c10::InferenceMode guard;
    results[0] = fn(*g.slices[0]);
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(TensorParallelTest, SlicesHoldTheirPartAndComputeTheWholeModelsLogits) {
  auto whole = Whole();
  at::Tensor ids = at::randint(0, 52, {3, 9}, at::kLong);
  at::Tensor want;
  {
    c10::InferenceMode guard;
    want = *whole->Forward(ids);
  }
  for (int tp : {2, 4}) {
    Group g = MakeGroup(*whole, tp, absl::StrCat("forward", tp));
    // Column-parallel weights hold 1/tp of the rows, row-parallel ones 1/tp
    // of the columns; norms are whole.
    const auto named = g.slices[1]->NamedParameters();
    EXPECT_EQ(named.at("model.layers.0.self_attn.q_proj.weight").size(0), 32 / tp);
    EXPECT_EQ(named.at("model.layers.0.self_attn.o_proj.weight").size(1), 32 / tp);
    EXPECT_EQ(named.at("model.layers.0.mlp.down_proj.weight").size(1), 64 / tp);
    EXPECT_EQ(named.at("model.embed_tokens.weight").size(0), 52 / tp);
    EXPECT_EQ(named.at("model.norm.weight").size(0), 32);
    EXPECT_TRUE(torch::equal(named.at("model.layers.1.mlp.up_proj.weight"),
                             whole->NamedParameters().at("model.layers.1.mlp.up_proj.weight")
                                 .narrow(0, 64 / tp, 64 / tp)));
    auto got = OnAll(g, [&](CausalLM& m) { return m.Forward(ids); });
    for (int r = 0; r < tp; ++r) {
      ASSERT_TRUE(got[r].ok()) << got[r].status();
      EXPECT_TRUE(torch::allclose(*got[r], want, 1e-4, 1e-5))
          << "tp " << tp << " rank " << r << ": max diff " << (*got[r] - want).abs().max().item<double>();
    }
  }
}

std::vector<GenerationResult> Generate(GenerationEngine& engine) {
  std::vector<GenerationResult> out;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest req;
    for (int t = 0; t < 3 + 2 * i; ++t) req.prompt_ids.push_back((7 * i + 3 * t + 1) % 52);
    req.params.max_new_tokens = 12;
    req.params.temperature = 0;  // greedy
    req.n = i % 2 == 0 ? 1 : 2;
    req.params.ignore_eos = true;
    EXPECT_TRUE(engine.Submit(std::move(req)).ok());
  }
  while (engine.HasPending()) {
    auto step = engine.Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (auto& r : *step) out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.request_id, a.sample_index) < std::make_pair(b.request_id, b.sample_index);
  });
  return out;
}

TEST(TensorParallelTest, GreedyGenerationEqualsTheWholeModelTokenForToken) {
  auto whole = Whole();
  EngineOptions eo;
  eo.max_batch = 8;
  eo.max_len = 64;
  auto ref_engine = GenerationEngine::Create(whole.get(), eo);
  ASSERT_TRUE(ref_engine.ok()) << ref_engine.status();
  const auto want = Generate(**ref_engine);
  ASSERT_EQ(want.size(), 6u);
  for (int tp : {2, 4}) {
    Group g = MakeGroup(*whole, tp, absl::StrCat("generate", tp));
    auto engine = GenerationEngine::Create(g.slices, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto got = Generate(**engine);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token_ids, want[i].token_ids) << "tp " << tp << " sample " << i;
      for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
        EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4) << "tp " << tp << " sample " << i;
      }
    }
    // Each slice caches only its own key-value heads.
    EXPECT_EQ((*engine)->kv_cache_bytes(), (*ref_engine)->kv_cache_bytes());
  }
}

TEST(TensorParallelTest, SlicesLoadFromACheckpointAndSliceOfOneSeedIsTheWholeModel) {
  auto whole = Whole();
  const fs::path dir = fs::temp_directory_path() / ("roll_tp_ckpt_" + std::to_string(getpid()));
  ASSERT_TRUE(whole->SavePretrained(dir.string()).ok());
  for (int r = 0; r < 2; ++r) {
    ModelOptions o;
    o.tp_rank = r;
    o.tp_size = 2;
    auto loaded = CausalLM::FromPretrained(dir.string(), o);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    auto cut = whole->TensorParallelSlice(r, 2);
    ASSERT_TRUE(cut.ok()) << cut.status();
    auto random = CausalLM::Random(Config(), 11, o);
    ASSERT_TRUE(random.ok()) << random.status();
    const auto a = (*loaded)->NamedParameters(), b = (*cut)->NamedParameters(),
               c = (*random)->NamedParameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) {
      EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
      EXPECT_TRUE(torch::equal(t, c.at(name))) << name;
    }
    // A slice is not a checkpoint.
    absl::Status saved = (*loaded)->SavePretrained((dir / "slice").string());
    EXPECT_EQ(saved.code(), absl::StatusCode::kFailedPrecondition) << saved;
  }
  fs::remove_all(dir);
}

TEST(TensorParallelTest, ImpossibleSplitsAndMissingGroupsAreNamed) {
  ModelOptions o;
  o.tp_size = 4;
  auto kv = CausalLM::Random(Config(/*kv_heads=*/2), 1, o);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("num_key_value_heads (2) is not a multiple of 4"), std::string::npos)
      << kv.status();
  o.tp_size = 2;
  auto vocab = CausalLM::Random(Config(4, /*vocab=*/51), 1, o);
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.status().message().find("vocab_size (51) is not a multiple of 2"), std::string::npos)
      << vocab.status();
  o.tp_rank = 2;
  EXPECT_FALSE(CausalLM::Random(Config(), 1, o).ok());

  // A slice without its group refuses to compute, by name.
  auto whole = Whole();
  auto slice = whole->TensorParallelSlice(0, 2);
  ASSERT_TRUE(slice.ok()) << slice.status();
  c10::InferenceMode guard;
  auto out = (*slice)->Forward(at::zeros({1, 3}, at::kLong));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("set_tensor_parallel"), std::string::npos) << out.status();
  // The engine checks that the slices are ranks 0..tp-1 of one split.
  EngineOptions eo;
  auto engine = GenerationEngine::Create(std::vector<CausalLM*>{slice->get()}, eo);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("tensor-parallel rank 0 of 1"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace roll
