#include "roll/models/transformer.h"
#include "models/fast_decode.h"

#include <torch/torch.h>

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/transformer_internal.h"
#include "roll/models/kv_cache.h"
#include "roll/models/safetensors.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult HasSub(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// Tiny configs. initializer_range 0.2 spreads the logits so greedy choices
// and dtype differences are meaningful.
std::string BaseJson(const std::string& model_type, const std::string& more = "") {
  return R"({"model_type": ")" + model_type + R"(", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "initializer_range": 0.2)" + more + "}";
}

ModelConfig Config(const std::string& json) {
  auto c = ModelConfig::FromJson(json);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

ModelConfig Qwen2() { return Config(BaseJson("qwen2")); }
ModelConfig Llama3Scaled() {
  return Config(BaseJson("llama", R"(, "rope_theta": 500000.0, "rope_scaling": {
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64})"));
}
ModelConfig Qwen3() {
  return Config(BaseJson("qwen3", R"(, "head_dim": 32, "tie_word_embeddings": true)"));
}

std::unique_ptr<CausalLM> MakeModel(const ModelConfig& c, uint64_t seed = 1,
                                    ModelOptions options = {}) {
  auto m = CausalLM::Random(c, seed, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

at::Tensor Longs(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }

at::Tensor Ids(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kLong).view({1, -1});
}

at::Tensor FullLogits(const CausalLM& m, const std::vector<int64_t>& ids) {
  torch::NoGradGuard g;
  auto out = m.Forward(Ids(ids));
  EXPECT_TRUE(out.ok()) << out.status();
  return out->squeeze(0);  // [T, V]
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}


// ---------------------------------------------------------------------------
// Architecture details against hand computation and an independent
// HF-style eager reference.

TEST(TransformerMathTest, RmsNormAndRotaryMatchHandComputedValues) {
  // RMSNorm([1, 2, 3, 4]) = x / sqrt(mean(x^2) + eps) * w, mean(x^2) = 7.5.
  at::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  at::Tensor w = torch::tensor({1.0f, 0.5f, 2.0f, -1.0f});
  at::Tensor y = models_internal::RmsNorm(x, w, 1e-6f);
  const double r = 1.0 / std::sqrt(7.5 + 1e-6);
  const double expect_norm[] = {1 * r, 2 * r * 0.5, 3 * r * 2, -4 * r};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i].item<double>(), expect_norm[i], 1e-6);

  // inv_freq = 1 / theta^(2i/d): d = 4, theta = 100 -> [1, 0.1].
  ModelConfig c = Config(BaseJson("llama", R"(, "rope_theta": 100.0, "head_dim": 4)"));
  at::Tensor inv = RotaryInvFreq(c);
  ASSERT_EQ(inv.numel(), 2);
  EXPECT_NEAR(inv[0].item<double>(), 1.0, 1e-7);
  EXPECT_NEAR(inv[1].item<double>(), 0.1, 1e-7);

  // Position 3: angles [3, 0.3]. rotate_half convention: the pairs are
  // (x[i], x[i + d/2]), not adjacent elements.
  at::Tensor pos = torch::tensor({3L}).view({1, 1});
  auto [cos, sin] = models_internal::RopeCosSin(pos, inv, torch::kFloat);
  at::Tensor q = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4});
  at::Tensor out = models_internal::ApplyRope(q, cos, sin).flatten();
  const double a0 = 3.0, a1 = 0.3;
  const double expect_rope[] = {1 * std::cos(a0) - 3 * std::sin(a0),
                                2 * std::cos(a1) - 4 * std::sin(a1),
                                3 * std::cos(a0) + 1 * std::sin(a0),
                                4 * std::cos(a1) + 2 * std::sin(a1)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i].item<double>(), expect_rope[i], 1e-5);
}

TEST(TransformerMathTest, Llama3RopeScalingFollowsTheBandFormula) {
  ModelConfig c = Llama3Scaled();  // head_dim 16, theta 5e5, original context 64
  at::Tensor inv = RotaryInvFreq(c);
  const double factor = 8, low = 1, high = 4, old_len = 64;
  int scaled = 0, kept = 0, smoothed = 0;
  for (int i = 0; i < 8; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 16);
    const double wavelen = 2 * M_PI / f;
    double expect;
    if (wavelen < old_len / high) {
      expect = f, ++kept;
    } else if (wavelen > old_len / low) {
      expect = f / factor, ++scaled;
    } else {
      const double s = (old_len / wavelen - low) / (high - low);
      expect = (1 - s) * f / factor + s * f, ++smoothed;
    }
    EXPECT_NEAR(inv[i].item<double>() / expect, 1.0, 1e-5) << "i=" << i;
  }
  // The config exercises all three bands.
  EXPECT_GT(scaled, 0);
  EXPECT_GT(kept, 0);
  EXPECT_GT(smoothed, 0);
}

// HF's eager formulation written out independently: explicit rotate_half
// with cos/sin repeated to head_dim, repeat_kv, additive causal mask.
at::Tensor ReferenceLogits(const CausalLM& m, const std::vector<int64_t>& ids) {
  torch::NoGradGuard g;
  const ModelConfig& c = m.config();
  auto P = m.NamedParameters();
  auto get = [&](const std::string& n) { return P.count(n) ? P.at(n) : at::Tensor(); };
  const int64_t T = ids.size(), H = c.num_attention_heads, KV = c.num_key_value_heads,
                hd = c.head_dim;
  auto rms = [&](at::Tensor x, at::Tensor w) {
    return w * (x / torch::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
  };
  auto lin = [&](at::Tensor x, const std::string& n) {
    at::Tensor y = torch::matmul(x, get(n + ".weight").t());
    if (get(n + ".bias").defined()) y = y + get(n + ".bias");
    return y;
  };
  auto rotate_half = [](at::Tensor x) {
    int64_t h = x.size(-1) / 2;
    return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
  };
  at::Tensor inv = RotaryInvFreq(c);
  at::Tensor freqs = torch::arange(T, torch::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos(), sin = emb.sin();  // [T, hd]
  at::Tensor mask = torch::full({T, T}, -INFINITY).triu(1);
  at::Tensor x = get("model.embed_tokens.weight").index_select(0, torch::tensor(ids));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    at::Tensor h = rms(x, get(p + "input_layernorm.weight"));
    at::Tensor q = lin(h, p + "self_attn.q_proj").view({T, H, hd}).transpose(0, 1);
    at::Tensor k = lin(h, p + "self_attn.k_proj").view({T, KV, hd}).transpose(0, 1);
    at::Tensor v = lin(h, p + "self_attn.v_proj").view({T, KV, hd}).transpose(0, 1);
    if (c.QkNorm()) {
      q = rms(q, get(p + "self_attn.q_norm.weight"));
      k = rms(k, get(p + "self_attn.k_norm.weight"));
    }
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    k = k.repeat_interleave(H / KV, 0);
    v = v.repeat_interleave(H / KV, 0);
    at::Tensor s = torch::matmul(q, k.transpose(1, 2)) / std::sqrt(double(hd)) + mask;
    at::Tensor o = torch::matmul(torch::softmax(s, -1), v).transpose(0, 1).reshape({T, H * hd});
    x = x + lin(o, p + "self_attn.o_proj");
    h = rms(x, get(p + "post_attention_layernorm.weight"));
    at::Tensor a = torch::silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj");
    x = x + lin(a, p + "mlp.down_proj");
  }
  x = rms(x, get("model.norm.weight"));
  at::Tensor head = c.tie_word_embeddings ? get("model.embed_tokens.weight") : get("lm_head.weight");
  return torch::matmul(x, head.t());
}

class ArchTest : public ::testing::TestWithParam<int> {
 protected:
  ModelConfig Cfg() const {
    switch (GetParam()) {
      case 0:
        return Qwen2();
      case 1:
        return Llama3Scaled();
      default:
        return Qwen3();
    }
  }
};

TEST_P(ArchTest, ForwardMatchesEagerReference) {
  ModelConfig c = Cfg();
  auto m = MakeModel(c, 7);
  if (c.QkvBias()) {
    // Random init zeroes biases; make them matter.
    torch::NoGradGuard g;
    for (auto& [name, t] : m->NamedParameters()) {
      if (name.find("_proj.bias") != std::string::npos) t.normal_(0, 0.5);
    }
  }
  std::vector<int64_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
  EXPECT_LT(MaxDiff(FullLogits(*m, ids), ReferenceLogits(*m, ids)), 1e-4);
}

TEST_P(ArchTest, IncrementalDecodeEqualsFullRecomputation) {
  ModelConfig c = Cfg();
  auto m = MakeModel(c, 3);
  auto cache = m->NewKvCache(4, 32);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<int64_t> seq = {5, 17, 42, 8, 99};
  auto pre = m->Prefill(**cache, 2, seq);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ((*cache)->length(2), 5);
  at::Tensor full = FullLogits(*m, seq);
  EXPECT_LT(MaxDiff(pre->squeeze(0), full[4]), 1e-4);
  at::Tensor logits = pre->squeeze(0);
  for (int step = 0; step < 8; ++step) {
    const int64_t next = logits.argmax().item<int64_t>();
    seq.push_back(next);
    auto out = m->DecodeStep(**cache, {2}, std::vector<int64_t>{next});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->sizes(), (std::vector<int64_t>{1, 100}));
    logits = out->squeeze(0);
    at::Tensor ref = FullLogits(*m, seq);
    EXPECT_LT(MaxDiff(logits, ref[ref.size(0) - 1]), 1e-4) << "step " << step;
  }
  EXPECT_EQ((*cache)->length(2), 13);
  EXPECT_EQ((*cache)->length(0), 0);
}

std::vector<int64_t> Greedy(const at::Tensor& logits);

// The hand-written decode kernels (ModelOptions::fast_decode, the default
// on CPUs with AVX2/FMA) against the LibTorch decode path on the same model:
// batches the small-batch kernel takes (1, 3, 8) and one it hands to the
// GEMM (12), slots scattered, prompts of different lengths, biases that
// matter. Logits and the cached keys and values agree to float32 rounding.
void ExpectFastDecodeMatchesTheLibTorchDecode(const ModelConfig& c) {
  auto m = MakeModel(c, 5);
  {
    torch::NoGradGuard g;
    for (auto& [name, t] : m->NamedParameters()) {
      if (name.find("_proj.bias") != std::string::npos) t.normal_(0, 0.5);
    }
  }
  for (int64_t B : {1, 3, 8, 12}) {
    std::vector<int64_t> slots;
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t b = 0; b < B; ++b) {
      slots.push_back((b * 5 + 3) % 16);  // distinct, out of order
      std::vector<int64_t> p;
      for (int64_t t = 0; t < 1 + (b * 7) % 9; ++t) p.push_back((b * 31 + t * 17) % c.vocab_size);
      prompts.push_back(p);
    }
    auto fast = *m->NewKvCache(16, 40);
    auto slow = *m->NewKvCache(16, 40);
    ASSERT_TRUE(m->Prefill(*fast, slots, prompts).ok());
    at::Tensor ls = *m->Prefill(*slow, slots, prompts);
    for (int step = 0; step < 6; ++step) {
      std::vector<int64_t> next = Greedy(ls);
      m->set_fast_decode(true);
      const int64_t ran = models_internal::FastDecodeSteps();
      auto of = m->DecodeStep(*fast, slots, next);
      EXPECT_EQ(models_internal::FastDecodeSteps(), ran + 1) << "the hand-written path did not run";
      m->set_fast_decode(false);
      auto os = m->DecodeStep(*slow, slots, next);
      EXPECT_EQ(models_internal::FastDecodeSteps(), ran + 1) << "fast_decode=false still ran it";
      m->set_fast_decode(true);
      ASSERT_TRUE(of.ok() && os.ok()) << of.status() << os.status();
      EXPECT_LT(MaxDiff(*of, *os), 1e-4) << "batch " << B << " step " << step;
      ls = *os;
    }
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      EXPECT_LT(MaxDiff(fast->keys(layer), slow->keys(layer)), 1e-4) << "batch " << B << " layer " << layer;
      EXPECT_LT(MaxDiff(fast->values(layer), slow->values(layer)), 1e-4) << "batch " << B << " layer " << layer;
    }
    for (int64_t s : slots) EXPECT_EQ(fast->length(s), slow->length(s));
  }
}

TEST_P(ArchTest, FastDecodeMatchesTheLibTorchDecode) {
  if (!models_internal::FastDecodeAvailable()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  // The architecture's head width (16 or 32), then 64 and 96: each takes
  // other branches of the attention kernels (32- and 64-float chunks); and
  // a vocabulary of 2100, whose LM-head rows are enough for the small-batch
  // products to split over two threads (at rows that are not a multiple of
  // the kernel's block of 4). One and two intra-op threads (attention split
  // over sequences, small-batch products over output rows).
  struct Variant {
    int64_t head_dim = 0, vocab = 0;  // 0: the architecture's own
  };
  const int threads_before = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (Variant v : {Variant{0, 0}, Variant{64, 0}, Variant{96, 0}, Variant{0, 2100}}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << v.head_dim << ", vocab " << v.vocab << ", "
                                        << threads << " threads");
      ModelConfig c = Cfg();
      if (v.head_dim > 0) c.head_dim = v.head_dim;
      if (v.vocab > 0) c.vocab_size = v.vocab;
      ExpectFastDecodeMatchesTheLibTorchDecode(c);
    }
  }
  at::set_num_threads(threads_before);
}

std::string ArchName(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"Qwen2", "Llama3Scaled", "Qwen3Tied"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Architectures, ArchTest, ::testing::Values(0, 1, 2), ArchName);

// ---------------------------------------------------------------------------
// Incremental decoding with many slots

// Greedy decode of `steps` tokens in slot `slot` with other slots busy.
std::vector<int64_t> Greedy(const at::Tensor& logits) {
  auto a = logits.argmax(-1).contiguous();
  return std::vector<int64_t>(a.data_ptr<int64_t>(), a.data_ptr<int64_t>() + a.numel());
}

TEST(DecodeTest, SlotOutputDoesNotDependOnTheRestOfTheBatch) {
  auto m = MakeModel(Qwen2(), 11);
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6};
  // Alone.
  auto alone = *m->NewKvCache(12, 40);
  at::Tensor l = *m->Prefill(*alone, 3, prompt);
  std::vector<int64_t> ref_tokens;
  std::vector<at::Tensor> ref_logits;
  for (int s = 0; s < 10; ++s) {
    ref_logits.push_back(l[0].clone());
    ref_tokens.push_back(Greedy(l)[0]);
    l = *m->DecodeStep(*alone, {3}, std::vector<int64_t>{ref_tokens.back()});
  }
  // Same slot among others of different lengths, batched prefill. The slot
  // sets cover each way attention reaches the cache: an ascending range
  // (view), a narrow scattered set (range) and a wide one (gather).
  for (const std::vector<int64_t>& slots :
       {std::vector<int64_t>{7, 3, 0, 5}, std::vector<int64_t>{2, 3, 4, 5},
        std::vector<int64_t>{11, 3, 0, 5}}) {
    auto cache = *m->NewKvCache(12, 40);
    std::vector<std::vector<int64_t>> prompts = {{9, 9}, prompt, {40, 41, 42, 43, 44, 45, 46, 47, 48},
                                                 {77}};
    auto pre = m->Prefill(*cache, slots, prompts);
    ASSERT_TRUE(pre.ok()) << pre.status();
    at::Tensor logits = *pre;
    for (int s = 0; s < 10; ++s) {
      EXPECT_LT(MaxDiff(logits[1], ref_logits[s]), 1e-4) << "step " << s;
      std::vector<int64_t> next = Greedy(logits);
      EXPECT_EQ(next[1], ref_tokens[s]) << "step " << s;
      auto out = m->DecodeStep(*cache, slots, next);
      ASSERT_TRUE(out.ok()) << out.status();
      logits = *out;
    }
    EXPECT_EQ(cache->length(slots[2]), 9 + 10);
  }
}

TEST(DecodeTest, CopyPrefixSharesOnePrefillAcrossSamples) {
  auto m = MakeModel(Qwen2(), 5);
  const std::vector<int64_t> prompt = {10, 20, 30, 40};
  auto cache = *m->NewKvCache(6, 16);
  at::Tensor first = *m->Prefill(*cache, 0, prompt);
  ASSERT_TRUE(cache->CopyPrefix(0, {2, 4, 5}).ok());
  EXPECT_EQ(cache->length(4), 4);
  EXPECT_FALSE(cache->CopyPrefix(0, {0}).ok());
  EXPECT_FALSE(cache->CopyPrefix(0, {6}).ok());
  // Each sample continues with its own token; compare against recomputation.
  const std::vector<int64_t> slots = {0, 2, 4, 5}, next = {1, 2, 3, 4};
  at::Tensor out = *m->DecodeStep(*cache, slots, next);
  for (size_t i = 0; i < slots.size(); ++i) {
    std::vector<int64_t> seq = prompt;
    seq.push_back(next[i]);
    EXPECT_LT(MaxDiff(out[i], FullLogits(*m, seq)[4]), 1e-4) << "slot " << slots[i];
  }
  // A reset slot starts over: prefilling it again gives the prompt's logits.
  ASSERT_TRUE(cache->Reset(2).ok());
  EXPECT_EQ(cache->length(2), 0);
  EXPECT_LT(MaxDiff(*m->Prefill(*cache, 2, prompt), first), 1e-5);
}

TEST(DecodeTest, PrefillContinuesAfterCachedPositions) {
  auto m = MakeModel(Llama3Scaled(), 2);
  auto cache = *m->NewKvCache(2, 32);
  const std::vector<int64_t> all = {4, 8, 15, 16, 23, 42, 7, 1};
  ASSERT_TRUE(m->Prefill(*cache, 1, {4, 8, 15}).ok());
  at::Tensor out = *m->Prefill(*cache, 1, {16, 23, 42, 7, 1});
  EXPECT_LT(MaxDiff(out[0], FullLogits(*m, all)[7]), 1e-4);
}

TEST(DecodeTest, RejectsBadRequests) {
  auto m = MakeModel(Qwen2(), 2);
  auto cache = *m->NewKvCache(2, 4);
  EXPECT_TRUE(HasSub(std::string(m->Prefill(*cache, 2, {1}).status().message()), "slot 2"));
  EXPECT_EQ(m->Prefill(*cache, 0, {1, 2, 3, 4, 5}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Prefill(*cache, 0, {100}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(m->Prefill(*cache, 0, {}).ok());
  EXPECT_FALSE(m->DecodeStep(*cache, {0, 0}, std::vector<int64_t>{1, 2}).ok());
  EXPECT_FALSE(m->DecodeStep(*cache, {0}, std::vector<int64_t>{1, 2}).ok());
  ASSERT_TRUE(m->Prefill(*cache, 0, {1, 2, 3, 4}).ok());
  EXPECT_EQ(m->DecodeStep(*cache, {0}, std::vector<int64_t>{1}).status().code(),
            absl::StatusCode::kOutOfRange);  // slot full
  auto other = *MakeModel(Qwen3(), 1)->NewKvCache(2, 4);
  EXPECT_FALSE(m->DecodeStep(*other, {0}, std::vector<int64_t>{1}).ok());
  EXPECT_FALSE(KvCache::Create(KvCacheOptions{}).ok());
}

TEST(DecodeTest, InPlaceWeightUpdatesReachTheFusedDecodeWeights) {
  auto m = MakeModel(Qwen2(), 4);
  auto cache = *m->NewKvCache(1, 16);
  ASSERT_TRUE(m->Prefill(*cache, 0, {1, 2, 3}).ok());  // builds the fused weights
  {
    torch::NoGradGuard g;
    m->NamedParameters().at("model.layers.1.mlp.up_proj.weight").mul_(-1.5);
    m->NamedParameters().at("model.layers.0.self_attn.k_proj.bias").add_(0.3);
  }
  cache->ResetAll();
  at::Tensor out = *m->Prefill(*cache, 0, {1, 2, 3});
  EXPECT_LT(MaxDiff(out[0], FullLogits(*m, {1, 2, 3})[2]), 1e-4);
}

// ---------------------------------------------------------------------------
// Full-sequence path

TEST(ForwardTest, LeftPaddingWithMaskMatchesUnpadded) {
  auto m = MakeModel(Qwen2(), 9);
  const std::vector<int64_t> a = {11, 12, 13, 14, 15, 16}, b = {21, 22, 23};
  at::Tensor ids = Longs({11, 12, 13, 14, 15, 16, 0, 0, 0, 21, 22, 23}).view({2, 6});
  at::Tensor mask = Longs({1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1}).view({2, 6});
  torch::NoGradGuard g;
  at::Tensor out = *m->Forward(ids, mask);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 6, 100}));
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_LT(MaxDiff(out[0], FullLogits(*m, a)), 1e-4);
  EXPECT_LT(MaxDiff(out[1].narrow(0, 3, 3), FullLogits(*m, b)), 1e-4);
  // Right padding too.
  at::Tensor rids = Longs({21, 22, 23, 0, 0, 0}).view({1, 6});
  at::Tensor rmask = Longs({1, 1, 1, 0, 0, 0}).view({1, 6});
  EXPECT_LT(MaxDiff((*m->Forward(rids, rmask))[0].narrow(0, 0, 3), FullLogits(*m, b)), 1e-4);
  // Explicit position ids give the same as derived ones.
  at::Tensor pos = Longs({0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 1, 2}).view({2, 6});
  EXPECT_LT(MaxDiff(*m->Forward(ids, mask, pos), out), 1e-6);
  // Bad shapes are errors.
  EXPECT_FALSE(m->Forward(ids, mask.narrow(1, 0, 3)).ok());
  EXPECT_FALSE(m->Forward(Longs({1, 200}).view({1, 2})).ok());
}

TEST(ForwardTest, TiedAndUntiedEmbeddings) {
  ModelConfig tied = Qwen2();
  tied.tie_word_embeddings = true;
  auto mt = MakeModel(tied, 3);
  auto mu = MakeModel(Qwen2(), 3);
  auto pt = mt->NamedParameters(), pu = mu->NamedParameters();
  EXPECT_EQ(pt.count("lm_head.weight"), 0u);
  ASSERT_EQ(pu.count("lm_head.weight"), 1u);
  EXPECT_EQ(pu.size(), pt.size() + 1);
  torch::NoGradGuard g;
  at::Tensor ids = Ids({1, 2, 3, 4});
  at::Tensor h = *mt->ForwardHidden(ids);
  EXPECT_LT(MaxDiff(*mt->Forward(ids), torch::matmul(h, pt.at("model.embed_tokens.weight").t())),
            1e-5);
  at::Tensor hu = *mu->ForwardHidden(ids);
  EXPECT_LT(MaxDiff(*mu->Forward(ids), torch::matmul(hu, pu.at("lm_head.weight").t())), 1e-5);
  EXPECT_GT(MaxDiff(pu.at("lm_head.weight"), pu.at("model.embed_tokens.weight")), 0.1);
  // Updating the embedding moves a tied model's logits.
  at::Tensor before = *mt->Forward(ids);
  pt.at("model.embed_tokens.weight").mul_(2.0);
  at::Tensor hidden = *mt->ForwardHidden(ids);
  EXPECT_LT(MaxDiff(*mt->Forward(ids), torch::matmul(hidden, pt.at("model.embed_tokens.weight").t())),
            1e-4);
  EXPECT_GT(MaxDiff(*mt->Forward(ids), before), 0.1);
}

TEST(ForwardTest, SgdStepsLowerTheLoss) {
  auto m = MakeModel(Qwen2(), 21);
  at::Tensor ids = Longs({5, 6, 7, 8, 9, 10, 11, 12, 50, 51, 52, 53, 54, 55, 56, 57})
                       .view({2, 8});
  auto loss_fn = [&]() {
    at::Tensor logits = *m->Forward(ids);
    return torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, 7).reshape({-1, 100}), ids.narrow(1, 1, 7).reshape({-1}));
  };
  auto params = m->Parameters();
  for (const auto& p : params) ASSERT_TRUE(p.requires_grad());
  double first = 0, last = 0;
  for (int step = 0; step < 15; ++step) {
    at::Tensor loss = loss_fn();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    loss.backward();
    torch::NoGradGuard g;
    for (auto& p : params) {
      ASSERT_TRUE(p.grad().defined());
      p.sub_(p.grad(), 0.05);
    }
  }
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
}

TEST(ForwardTest, Bf16WeightsGiveLogitsCloseToFp32) {
  ModelOptions bf;
  bf.dtype = torch::kBFloat16;
  auto m32 = MakeModel(Qwen2(), 8);
  auto m16 = MakeModel(Qwen2(), 8, bf);
  EXPECT_EQ(m16->NamedParameters().at("model.norm.weight").scalar_type(), torch::kBFloat16);
  const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  at::Tensor l32 = FullLogits(*m32, ids), l16 = FullLogits(*m16, ids);
  EXPECT_EQ(l16.scalar_type(), torch::kBFloat16);
  const double scale = l32.abs().max().item<double>();
  EXPECT_LT(MaxDiff(l16, l32), 0.05 * scale);
  // The bf16 decode path runs and agrees with its own forward.
  auto cache = *m16->NewKvCache(1, 16);
  at::Tensor pre = *m16->Prefill(*cache, 0, ids);
  EXPECT_LT(MaxDiff(pre[0], l16[7]), 0.05 * scale);

  // fp32 logits: float output, equal to the float product of bf16 hidden
  // states with the bf16 head.
  m16->set_fp32_logits(true);
  at::Tensor f = FullLogits(*m16, ids);
  EXPECT_EQ(f.scalar_type(), torch::kFloat);
  torch::NoGradGuard g;
  at::Tensor h = m16->ForwardHidden(Ids(ids))->squeeze(0);
  at::Tensor ref = torch::matmul(h.to(torch::kFloat),
                                 m16->NamedParameters().at("lm_head.weight").to(torch::kFloat).t());
  EXPECT_LT(MaxDiff(f, ref), 1e-5);
  cache->ResetAll();
  at::Tensor dec = *m16->Prefill(*cache, 0, ids);
  EXPECT_EQ(dec.scalar_type(), torch::kFloat);
  EXPECT_LT(MaxDiff(dec[0], f[7]), 0.05 * scale);
}

// ---------------------------------------------------------------------------
// Checkpoints

TEST(CheckpointTest, SaveLoadRoundTripSingleAndSharded) {
  testing::ScratchDir tmp("transformer");
  for (const ModelConfig& c : {Qwen2(), Qwen3()}) {
    auto m = MakeModel(c, 13);
    const std::vector<int64_t> ids = {1, 5, 9, 13, 17};
    at::Tensor want = FullLogits(*m, ids);
    // Single file.
    const std::string single = (tmp / c.model_type + "_single");
    ASSERT_TRUE(m->SavePretrained(single).ok());
    EXPECT_TRUE(fs::exists(fs::path(single) / "model.safetensors"));
    EXPECT_TRUE(fs::exists(fs::path(single) / "config.json"));
    auto back = CausalLM::FromPretrained(single);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(MaxDiff(FullLogits(**back, ids), want), 0.0);
    EXPECT_EQ((*back)->config().tie_word_embeddings, c.tie_word_embeddings);
    // Sharded, overwriting an existing checkpoint directory.
    SaveOptions so;
    so.max_shard_bytes = 40000;
    so.extra_files["tokenizer.json"] = "{}";
    ASSERT_TRUE(m->SavePretrained(single, so).ok());
    EXPECT_TRUE(fs::exists(fs::path(single) / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(fs::path(single) / "model.safetensors"));
    EXPECT_TRUE(fs::exists(fs::path(single) / "tokenizer.json"));
    auto sharded = CausalLM::FromPretrained(single);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    EXPECT_EQ(MaxDiff(FullLogits(**sharded, ids), want), 0.0);
  }
  // No temporary or old directories stay behind.
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(e.path().filename().string().find('.'), std::string::npos) << e.path();
  }
}

TEST(CheckpointTest, LoadsWithDtypeConversionAndWritesTorchDtype) {
  testing::ScratchDir tmp("transformer");
  auto m = MakeModel(Qwen2(), 13);
  ASSERT_TRUE(m->SavePretrained((tmp / "ck")).ok());
  ModelOptions bf;
  bf.dtype = torch::kBFloat16;
  auto b = CausalLM::FromPretrained((tmp / "ck"), bf);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->NamedParameters().at("model.embed_tokens.weight").scalar_type(),
            torch::kBFloat16);
  ASSERT_TRUE((*b)->SavePretrained((tmp / "ck16")).ok());
  auto cfg = ModelConfig::FromJsonFile((tmp / "ck16") + "/config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");
  auto ck = Checkpoint::Open((tmp / "ck16"));
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ((*ck)->Info("model.norm.weight")->dtype, "BF16");
}

TEST(CheckpointTest, LoadErrorsNameTheTensor) {
  testing::ScratchDir tmp("transformer");
  auto m = MakeModel(Qwen2(), 13);
  const std::string dir = (tmp / "ck");
  ASSERT_TRUE(m->SavePretrained(dir).ok());
  const std::string file = dir + "/model.safetensors";
  auto tensors = m->NamedParameters();

  auto write = [&](std::map<std::string, at::Tensor> t) {
    ASSERT_TRUE(SaveSafetensors(file, t, {{"format", "pt"}}).ok());
  };
  {  // missing tensor
    auto t = tensors;
    t.erase("model.layers.1.self_attn.v_proj.bias");
    write(t);
    auto r = CausalLM::FromPretrained(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "model.layers.1.self_attn.v_proj.bias"));
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "model.safetensors"));
  }
  {  // wrong shape
    auto t = tensors;
    t["model.layers.0.mlp.up_proj.weight"] = torch::zeros({64, 64});
    write(t);
    auto r = CausalLM::FromPretrained(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "model.layers.0.mlp.up_proj.weight"));
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "[64, 64]"));
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "[128, 64]"));
  }
  {  // extra tensor
    auto t = tensors;
    t["model.layers.2.mlp.up_proj.weight"] = torch::zeros({128, 64});
    write(t);
    auto r = CausalLM::FromPretrained(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(HasSub(std::string(r.status().message()), "model.layers.2.mlp.up_proj.weight"));
  }
  {  // known-ignorable extras load
    auto t = tensors;
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch::ones({8});
    write(t);
    auto r = CausalLM::FromPretrained(dir);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(MaxDiff(FullLogits(**r, {1, 2, 3}), FullLogits(*m, {1, 2, 3})), 0.0);
  }
  EXPECT_FALSE(CausalLM::FromPretrained((tmp / "nope")).ok());
}

TEST(CheckpointTest, CriticValueHeadFromBaseModelAndBack) {
  testing::ScratchDir tmp("transformer");
  auto base = MakeModel(Qwen2(), 13);
  ASSERT_TRUE(base->SavePretrained((tmp / "base")).ok());
  ModelOptions critic_opts;
  critic_opts.lm_head = false;
  critic_opts.value_head = true;
  critic_opts.seed = 99;
  // A base LM checkpoint: lm_head is ignored, the score head starts fresh.
  auto critic = CausalLM::FromPretrained((tmp / "base"), critic_opts);
  ASSERT_TRUE(critic.ok()) << critic.status();
  auto p = (*critic)->NamedParameters();
  EXPECT_EQ(p.count("lm_head.weight"), 0u);
  ASSERT_EQ(p.at("score.weight").sizes(), (std::vector<int64_t>{1, 64}));
  EXPECT_GT(p.at("score.weight").abs().sum().item<double>(), 0.0);
  EXPECT_FALSE((*critic)->Forward(Ids({1, 2})).ok());

  torch::NoGradGuard g;
  at::Tensor ids = Longs({1, 2, 3, 4, 5, 6}).view({2, 3});
  at::Tensor h = *(*critic)->ForwardHidden(ids);
  at::Tensor v = *(*critic)->Values(h);
  ASSERT_EQ(v.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_LT(MaxDiff(v, torch::matmul(h, p.at("score.weight").t()).squeeze(-1) + p.at("score.bias")),
            1e-6);
  // The trunk is the base model's.
  EXPECT_LT(MaxDiff(h, *base->ForwardHidden(ids)), 1e-6);

  ASSERT_TRUE((*critic)->SavePretrained((tmp / "critic")).ok());
  auto cfg = ModelConfig::FromJsonFile((tmp / "critic") + "/config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->architectures, std::vector<std::string>{"Qwen2ForTokenClassification"});
  auto again = CausalLM::FromPretrained((tmp / "critic"), critic_opts);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(MaxDiff(*(*again)->Values(*(*again)->ForwardHidden(ids)), v), 0.0);
  // A policy cannot silently load a critic checkpoint.
  auto as_policy = CausalLM::FromPretrained((tmp / "critic"));
  ASSERT_FALSE(as_policy.ok());
}

TEST(CheckpointTest, RandomIsDeterministicAndDtypeIndependent) {
  auto a = MakeModel(Qwen2(), 5), b = MakeModel(Qwen2(), 5), c = MakeModel(Qwen2(), 6);
  ModelOptions bf;
  bf.dtype = torch::kBFloat16;
  auto d = MakeModel(Qwen2(), 5, bf);
  auto pa = a->NamedParameters(), pb = b->NamedParameters(), pc = c->NamedParameters(),
       pd = d->NamedParameters();
  const std::string n = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_TRUE(pa.at(n).equal(pb.at(n)));
  EXPECT_FALSE(pa.at(n).equal(pc.at(n)));
  EXPECT_TRUE(pa.at(n).to(torch::kBFloat16).equal(pd.at(n)));
  EXPECT_NEAR(pa.at(n).std().item<double>(), 0.2, 0.02);
  EXPECT_TRUE(pa.at("model.norm.weight").eq(1).all().item<bool>());
  EXPECT_TRUE(pa.at("model.layers.0.self_attn.q_proj.bias").eq(0).all().item<bool>());
  EXPECT_EQ(pa.count("model.layers.0.self_attn.o_proj.bias"), 0u);  // qwen2: no o_proj bias
  EXPECT_EQ(a->NumParameters(), [&] {
    int64_t s = 0;
    for (auto& [k, t] : pa) s += t.numel();
    return s;
  }());
}

}  // namespace
}  // namespace roll
