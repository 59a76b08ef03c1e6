#pragma once
// Shared fixtures of the train strategy tests: a tiny model and a fixed,
// padded batch with response masks of different lengths.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "roll/common/batch.h"
#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "absl/strings/str_cat.h"
#include "roll/strategies/train_strategy.h"

namespace roll {
namespace train_test {

inline constexpr int64_t kVocab = 50;

inline ModelConfig TinyConfig() {
  auto c = ModelConfig::FromJson(R"({"model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 50, "max_position_embeddings": 64,
    "initializer_range": 0.1})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// 4 heads, 4 key-value heads, vocabulary 52: splits 2 and 4 ways.
inline ModelConfig SplittableConfig(bool tied = false) {
  auto c = ModelConfig::FromJson(absl::StrCat(R"({"model_type": "qwen2", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 52, "max_position_embeddings": 64,
    "initializer_range": 0.1, "tie_word_embeddings": )",
                                              tied ? "true" : "false", "}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

inline std::unique_ptr<CausalLM> TinyModel(uint64_t seed = 7, ModelOptions options = {}) {
  auto m = CausalLM::Random(TinyConfig(), seed, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// Row r: `lengths[r]` real tokens (left-padded when r is odd, right-padded
// otherwise), the last `responses[r]` of them response tokens.
inline Batch MakeBatch(const std::vector<int64_t>& lengths, const std::vector<int64_t>& responses,
                       int64_t cols, uint64_t seed = 3) {
  const int64_t rows = static_cast<int64_t>(lengths.size());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor ids = at::randint(1, kVocab, {rows, cols}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor mask = at::zeros({rows, cols}, at::kLong);
  at::Tensor response = at::zeros({rows, cols}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t begin = (r % 2 == 1) ? cols - lengths[r] : 0;
    const int64_t end = begin + lengths[r];
    mask[r].slice(0, begin, end).fill_(1);
    response[r].slice(0, end - responses[r], end).fill_(1);
    ids[r].slice(0, 0, begin).fill_(0);
    ids[r].slice(0, end, cols).fill_(0);
  }
  Batch b;
  b.SetTensor("input_ids", ids);
  b.SetTensor("attention_mask", mask);
  b.SetTensor("response_mask", response);
  return b;
}

// Eight rows with very different numbers of loss tokens, so a wrong
// normalization (per micro-batch or per rank instead of per step) shows.
inline Batch StandardBatch() {
  return MakeBatch({12, 5, 9, 12, 3, 7, 11, 6}, {8, 2, 6, 3, 1, 5, 10, 4}, 12);
}

// SFT-style token-mean cross entropy over the response tokens.
inline LossFn SftLoss() {
  return [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    LossOutput l;
    l.loss = TokenMeanLoss(-out.log_probs, mb);
    l.metrics["nll_tokens"] = mb.loss_mask.sum().item<double>();
    return l;
  };
}

inline TrainStrategyOptions BaseOptions() {
  TrainStrategyOptions o;
  o.lr.base_lr = 1e-2;
  o.max_grad_norm = 0;
  // A large eps makes AdamW's update depend on the gradient's magnitude,
  // not only its sign, so scaling mistakes change the parameters.
  o.adam.eps = 1e-1;
  o.adam.weight_decay = 0.01;
  o.micro_batch_size = 8;
  return o;
}

inline std::unique_ptr<TrainStrategy> MakeStrategy(const TrainStrategyOptions& o, uint64_t seed = 7,
                                                   Communicator* comm = nullptr,
                                                   ModelOptions model_options = {}) {
  auto s = TrainStrategy::Create(TinyModel(seed, model_options), o, comm);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

inline std::map<std::string, at::Tensor> Snapshot(const CausalLM& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, p] : m.NamedParametersOrdered()) out[name] = p.detach().clone();
  return out;
}

// Largest absolute difference over all parameters.
inline double MaxDiff(const std::map<std::string, at::Tensor>& a,
                      const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

// Three padded batches of eight rows: the steps the multi-rank strategy
// tests train on.
inline const std::vector<Batch>& ThreeSteps() {
  static const auto* steps = new std::vector<Batch>{
      StandardBatch(), MakeBatch({4, 10, 8, 12, 6, 9, 3, 11}, {3, 6, 2, 9, 4, 1, 2, 7}, 12, 11),
      MakeBatch({7, 12, 5, 9, 8, 12, 10, 4}, {5, 2, 4, 8, 3, 11, 6, 3}, 12, 17)};
  return *steps;
}

// Rank r of `world` takes rows r, r + world, ...: uneven loss-token counts.
inline Batch RankRows(const Batch& b, int rank, int world) {
  std::vector<int64_t> rows;
  for (int64_t i = rank; i < b.size(); i += world) rows.push_back(i);
  auto sel = b.Select(rows);
  EXPECT_TRUE(sel.ok()) << sel.status();
  return *sel;
}

// The whole model's parameters as the strategy holds them (gathered or
// joined for the call; with full sharding every rank must call it).
inline std::map<std::string, at::Tensor> WholeParams(TrainStrategy& s) {
  std::map<std::string, at::Tensor> out;
  absl::Status st = s.WithFullModel([&](CausalLM& m) {
    out = Snapshot(m);
    return absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

}  // namespace train_test
}  // namespace roll
