#include "roll/strategies/train_strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "roll/models/safetensors.h"
#include "strategies/train_test_util.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using train_test::BaseOptions;
using train_test::MakeBatch;
using train_test::MakeStrategy;
using train_test::MaxDiff;
using train_test::SftLoss;
using train_test::Snapshot;
using train_test::StandardBatch;

::testing::AssertionResult HasSub(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

using testing::TempDir;

TrainStepResult Step(TrainStrategy& s, const Batch& b, const LossFn& loss = SftLoss()) {
  auto r = s.TrainStep(b, loss);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainStepResult{};
}

// ---------------------------------------------------------------------------
// Log-probs and entropies

TEST(LogProbsTest, MatchNaiveSoftmaxAndShiftByOne) {
  at::Tensor logits = at::randn({2, 5, 7}, at::kDouble).to(at::kFloat) * 3;
  at::Tensor ids = at::randint(0, 7, {2, 5}, at::kLong);
  auto out = LogProbsFromLogits(logits.to(at::kBFloat16).to(at::kFloat), ids, true);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->log_probs.sizes(), (std::vector<int64_t>{2, 4}));
  ASSERT_EQ(out->entropy.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(out->log_probs.scalar_type(), at::kFloat);
  at::Tensor rounded = logits.to(at::kBFloat16).to(at::kDouble);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 4; ++t) {
      double z = 0;
      for (int64_t v = 0; v < 7; ++v) z += std::exp(rounded[b][t][v].item<double>());
      const int64_t target = ids[b][t + 1].item<int64_t>();
      const double expected_lp = rounded[b][t][target].item<double>() - std::log(z);
      double h = 0;
      for (int64_t v = 0; v < 7; ++v) {
        const double p = std::exp(rounded[b][t][v].item<double>()) / z;
        h -= p * std::log(p);
      }
      EXPECT_NEAR(out->log_probs[b][t].item<double>(), expected_lp, 1e-5) << b << "," << t;
      EXPECT_NEAR(out->entropy[b][t].item<double>(), h, 1e-5) << b << "," << t;
    }
  }
  auto no_entropy = LogProbsFromLogits(logits, ids, false);
  ASSERT_TRUE(no_entropy.ok());
  EXPECT_FALSE(no_entropy->entropy.defined());
}

TEST(LogProbsTest, RejectsBadShapesAndIds) {
  at::Tensor logits = at::randn({2, 5, 7});
  auto bad_shape = LogProbsFromLogits(logits, at::zeros({2, 4}, at::kLong), false);
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_TRUE(HasSub(std::string(bad_shape.status().message()), "[2, 5, 7]"));
  at::Tensor ids = at::zeros({2, 5}, at::kLong);
  ids[1][3] = 9;
  auto bad_id = LogProbsFromLogits(logits, ids, false);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_TRUE(HasSub(std::string(bad_id.status().message()), "token id 9"));
}

TEST(TrainStrategyTest, ForwardMatchesModelLogitsAndZeroesOutsideTheMask) {
  TrainStrategyOptions o = BaseOptions();
  o.micro_batch_size = 3;  // chunked: 3 + 3 + 2 rows
  auto s = MakeStrategy(o);
  Batch b = StandardBatch();
  auto out = s->Forward(b, {true, true, false});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->log_probs.sizes(), (std::vector<int64_t>{8, 11}));
  at::Tensor ids = b.tensors().at("input_ids"), mask = b.tensors().at("attention_mask");
  at::Tensor loss_mask = (b.tensors().at("response_mask").slice(1, 1) * mask.slice(1, 1)).to(at::kFloat);
  torch::NoGradGuard no_grad;
  auto logits = s->model().Forward(ids, mask);
  ASSERT_TRUE(logits.ok());
  auto ref = LogProbsFromLogits(*logits, ids, true);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(torch::allclose(out->log_probs, ref->log_probs * loss_mask, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(out->entropy, ref->entropy * loss_mask, 1e-5, 1e-5));
  EXPECT_EQ((out->log_probs.ne(0)).sum().item<int64_t>(), loss_mask.sum().item<int64_t>());
  EXPECT_FALSE(out->values.defined());
}

TEST(TrainStrategyTest, ErrorsNameTheBatchKeyAndChangeNothing) {
  auto s = MakeStrategy(BaseOptions());
  const auto before = Snapshot(s->model());
  Batch no_ids;
  no_ids.SetTensor("attention_mask", at::ones({2, 4}, at::kLong));
  auto r = s->TrainStep(no_ids, SftLoss());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasSub(std::string(r.status().message()), "input_ids"));

  Batch bad_mask = StandardBatch();
  bad_mask.SetTensor("response_mask", at::ones({8, 5}, at::kLong));
  r = s->TrainStep(bad_mask, SftLoss());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasSub(std::string(r.status().message()), "response_mask"));

  LossFn non_scalar = [](const ModelOutputs& out, const MicroBatch&) -> absl::StatusOr<LossOutput> {
    return LossOutput{out.log_probs, {}};
  };
  r = s->TrainStep(StandardBatch(), non_scalar);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasSub(std::string(r.status().message()), "micro-batch 0"));
  LossFn failing = [](const ModelOutputs&, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    return absl::InvalidArgumentError("advantages missing");
  };
  r = s->TrainStep(StandardBatch(), failing);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasSub(std::string(r.status().message()), "advantages missing"));
  auto values = s->TrainStep(StandardBatch(), SftLoss(), {false, false, true});
  ASSERT_FALSE(values.ok());
  EXPECT_TRUE(HasSub(std::string(values.status().message()), "value head"));

  EXPECT_EQ(s->step(), 0);
  EXPECT_EQ(MaxDiff(before, Snapshot(s->model())), 0.0);
}

// ---------------------------------------------------------------------------
// Training

TEST(TrainStrategyTest, TrainingLowersTheLossOnAFixedBatch) {
  auto s = MakeStrategy(BaseOptions());
  Batch b = StandardBatch();
  const TrainStepResult first = Step(*s, b);
  EXPECT_EQ(first.metrics.at("tokens"), 39);  // the response tokens after the first position
  EXPECT_EQ(first.metrics.at("nll_tokens"), 39);
  EXPECT_GT(first.metrics.at("loss"), 3.0);  // about log(50) for a random model
  double last = 0;
  for (int i = 0; i < 30; ++i) last = Step(*s, b).metrics.at("loss");
  EXPECT_LT(last, 0.5 * first.metrics.at("loss"));
  EXPECT_EQ(s->step(), 31);
}

// The reference: one micro-batch holding the whole batch.
struct Reference {
  std::map<std::string, at::Tensor> params;
  TrainStepResult result;
};
Reference WholeBatchStep(const TrainStrategyOptions& base, const Batch& b) {
  TrainStrategyOptions o = base;
  o.micro_batch_size = b.size();
  o.max_tokens_per_micro_batch = 0;
  auto s = MakeStrategy(o);
  Reference ref;
  ref.result = Step(*s, b);
  ref.params = Snapshot(s->model());
  return ref;
}

TEST(TrainStrategyTest, GradientAccumulationEqualsOneBigBatch) {
  const Batch b = StandardBatch();
  const Reference ref = WholeBatchStep(BaseOptions(), b);
  const auto initial = Snapshot(MakeStrategy(BaseOptions())->model());
  ASSERT_GT(MaxDiff(initial, ref.params), 1e-3);  // the step moved the parameters

  TrainStrategyOptions o = BaseOptions();
  o.micro_batch_size = 4;  // 2 micro-batches: 19 and 20 loss tokens
  auto s = MakeStrategy(o);
  const TrainStepResult r = Step(*s, b);
  EXPECT_EQ(r.metrics.at("micro_batches"), 2);
  EXPECT_NEAR(r.metrics.at("loss"), ref.result.metrics.at("loss"), 1e-5);
  EXPECT_NEAR(r.metrics.at("grad_norm"), ref.result.metrics.at("grad_norm"),
              1e-5 * ref.result.metrics.at("grad_norm"));
  EXPECT_LT(MaxDiff(Snapshot(s->model()), ref.params), 1e-6);
}

TEST(TrainStrategyTest, TokenBudgetMicroBatchesEqualOneBigBatch) {
  const Batch b = StandardBatch();  // 65 real tokens in 8 rows, at most 12 per row
  const Reference ref = WholeBatchStep(BaseOptions(), b);
  TrainStrategyOptions o = BaseOptions();
  o.max_tokens_per_micro_batch = 20;
  auto s = MakeStrategy(o);

  auto plan = s->PlanMicroBatches(b);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GE(plan->size(), 4u);  // ceil(65 / 20)
  std::set<int64_t> seen;
  at::Tensor lengths = b.tensors().at("attention_mask").sum(1);
  for (const auto& mb : *plan) {
    int64_t tokens = 0;
    for (int64_t i : mb) {
      EXPECT_TRUE(seen.insert(i).second) << "row " << i << " planned twice";
      tokens += lengths[i].item<int64_t>();
    }
    EXPECT_LE(tokens, 20);
    EXPECT_TRUE(std::is_sorted(mb.begin(), mb.end()));
  }
  EXPECT_EQ(seen.size(), 8u);

  const TrainStepResult r = Step(*s, b);
  EXPECT_EQ(r.metrics.at("micro_batches"), static_cast<double>(plan->size()));
  EXPECT_NEAR(r.metrics.at("loss"), ref.result.metrics.at("loss"), 1e-5);
  EXPECT_NEAR(r.metrics.at("nll_tokens"), 39, 0);
  EXPECT_LT(MaxDiff(Snapshot(s->model()), ref.params), 1e-6);
}

TEST(TrainStrategyTest, OverlongSampleGetsItsOwnMicroBatch) {
  TrainStrategyOptions o = BaseOptions();
  o.max_tokens_per_micro_batch = 8;
  auto s = MakeStrategy(o);
  Batch b = MakeBatch({12, 3, 4}, {5, 1, 2}, 12);
  auto plan = s->PlanMicroBatches(b);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan, (std::vector<std::vector<int64_t>>{{0}, {1, 2}}));
}

TEST(ClipGradNormTest, ReportsThePreClipNormAndScales) {
  at::Tensor a = at::zeros({2}, at::kFloat).requires_grad_(true);
  at::Tensor b = at::zeros({1, 1}, at::kFloat).requires_grad_(true);
  at::Tensor no_grad = at::zeros({3}, at::kFloat).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({12.0f}).view({1, 1});
  std::vector<at::Tensor> params = {a, b, no_grad};
  EXPECT_NEAR(ClipGradNorm(params, 0), 13.0, 1e-5);  // 0: measure only
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 3.0f);
  EXPECT_NEAR(ClipGradNorm(params, 20), 13.0, 1e-5);  // below the limit: untouched
  EXPECT_FLOAT_EQ(b.grad()[0][0].item<float>(), 12.0f);
  EXPECT_NEAR(ClipGradNorm(params, 1.3), 13.0, 1e-5);
  const double coef = 1.3 / (13.0 + 1e-6);
  EXPECT_NEAR(a.grad()[1].item<double>(), 4.0 * coef, 1e-6);
  EXPECT_NEAR(b.grad()[0][0].item<double>(), 12.0 * coef, 1e-6);
  EXPECT_NEAR(ClipGradNorm(params, 0), 1.3, 1e-5);
}

TEST(TrainStrategyTest, ClippingReportsTheNormAndScalesTheUpdate) {
  const Batch b = StandardBatch();
  const Reference ref = WholeBatchStep(BaseOptions(), b);
  const double norm = ref.result.metrics.at("grad_norm");
  ASSERT_GT(norm, 0.1);
  TrainStrategyOptions o = BaseOptions();
  o.max_grad_norm = norm / 4;
  auto clipped = MakeStrategy(o);
  const TrainStepResult r = Step(*clipped, b);
  EXPECT_NEAR(r.metrics.at("grad_norm"), norm, 1e-5 * norm);  // reported before clipping
  EXPECT_GT(MaxDiff(Snapshot(clipped->model()), ref.params), 1e-4);

  // Clipping to norm/4 is the same as a loss a quarter the size.
  TrainStrategyOptions plain = BaseOptions();
  auto scaled = MakeStrategy(plain);
  LossFn quarter = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    return LossOutput{TokenMeanLoss(-out.log_probs, mb) * 0.25, {}};
  };
  Step(*scaled, b, quarter);
  EXPECT_LT(MaxDiff(Snapshot(clipped->model()), Snapshot(scaled->model())), 1e-6);
}

// ---------------------------------------------------------------------------
// AdamW

TEST(AdamWTest, MatchesHandComputedUpdates) {
  at::Tensor w = torch::tensor({1.0f, -2.0f}).view({1, 2}).requires_grad_(true);
  at::Tensor bias = torch::tensor({0.5f}).requires_grad_(true);
  AdamWOptions o;
  o.beta1 = 0.8;
  o.beta2 = 0.9;
  o.eps = 1e-3;
  o.weight_decay = 0.1;
  auto opt = AdamW::Create({{"w", w}, {"bias", bias}}, o);
  ASSERT_TRUE(opt.ok()) << opt.status();
  const double grads[2][3] = {{0.5, -1.0, 2.0}, {-0.25, 0.75, 1.0}};  // step x (w0, w1, bias)
  const double lrs[2] = {0.1, 0.05};
  double p[3] = {1.0, -2.0, 0.5}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  for (int t = 0; t < 2; ++t) {
    w.mutable_grad() = torch::tensor({static_cast<float>(grads[t][0]), static_cast<float>(grads[t][1])}).view({1, 2});
    bias.mutable_grad() = torch::tensor({static_cast<float>(grads[t][2])});
    ASSERT_TRUE((*opt)->Step(lrs[t]).ok());
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t][i];
      if (i < 2) p[i] *= 1 - lrs[t] * o.weight_decay;  // the 1-D bias is not decayed
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(o.beta1, t + 1));
      const double vhat = v[i] / (1 - std::pow(o.beta2, t + 1));
      p[i] -= lrs[t] * mhat / (std::sqrt(vhat) + o.eps);
    }
  }
  EXPECT_EQ((*opt)->step(), 2);
  EXPECT_NEAR(w[0][0].item<double>(), p[0], 1e-6);
  EXPECT_NEAR(w[0][1].item<double>(), p[1], 1e-6);
  EXPECT_NEAR(bias[0].item<double>(), p[2], 1e-6);
  EXPECT_NEAR((*opt)->StateDict().at("exp_avg/w")[0][1].item<double>(), m[1], 1e-7);
  EXPECT_NEAR((*opt)->StateDict().at("exp_avg_sq/bias")[0].item<double>(), v[2], 1e-7);
}

TEST(AdamWTest, BFloat16ParametersUpdateThroughAFloat32Master) {
  at::Tensor w = at::ones({4, 4}, at::kBFloat16).requires_grad_(true);
  auto opt = AdamW::Create({{"w", w}}, {});
  ASSERT_TRUE(opt.ok());
  for (int i = 0; i < 10; ++i) {
    w.mutable_grad() = at::ones({4, 4}, at::kBFloat16);
    ASSERT_TRUE((*opt)->Step(1e-4).ok());
  }
  // Each update (1e-4) is below bf16's resolution at 1.0 (2^-7), but they add up in the master.
  const auto state = (*opt)->StateDict();
  ASSERT_TRUE(state.count("master/w"));
  EXPECT_NEAR(state.at("master/w")[0][0].item<double>(), 1.0 - 1e-3, 1e-6);
  EXPECT_EQ(w.scalar_type(), at::kBFloat16);
}

TEST(AdamWTest, LoadStateDictValidatesNamesAndShapes) {
  at::Tensor w = at::zeros({2, 3}).requires_grad_(true);
  auto opt = AdamW::Create({{"w", w}}, {});
  ASSERT_TRUE(opt.ok());
  std::map<std::string, at::Tensor> good = {{"exp_avg/w", at::full({2, 3}, 0.5)},
                                            {"exp_avg_sq/w", at::full({2, 3}, 0.25)}};
  ASSERT_TRUE((*opt)->LoadStateDict(good, 7, "opt.safetensors").ok());
  EXPECT_EQ((*opt)->step(), 7);
  EXPECT_EQ((*opt)->StateDict().at("exp_avg/w")[1][2].item<float>(), 0.5f);

  auto bad = good;
  bad["exp_avg_sq/w"] = at::zeros({3, 2});
  absl::Status s = (*opt)->LoadStateDict(bad, 8, "opt.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasSub(std::string(s.message()), "opt.safetensors: tensor 'exp_avg_sq/w' has shape [3, 2], expected [2, 3]"));
  EXPECT_EQ((*opt)->step(), 7);  // unchanged
  bad = good;
  bad.erase("exp_avg/w");
  EXPECT_TRUE(HasSub(std::string((*opt)->LoadStateDict(bad, 8, "f").message()), "missing tensor 'exp_avg/w'"));
  bad = good;
  bad["exp_avg/v"] = at::zeros({1});
  EXPECT_TRUE(HasSub(std::string((*opt)->LoadStateDict(bad, 8, "f").message()), "unexpected tensor 'exp_avg/v'"));
}

TEST(AdamWTest, RejectsBadOptions) {
  at::Tensor w = at::zeros({2}).requires_grad_(true);
  AdamWOptions o;
  o.beta2 = 1.0;
  EXPECT_FALSE(AdamW::Create({{"w", w}}, o).ok());
  o = {};
  o.eps = 0;
  EXPECT_FALSE(AdamW::Create({{"w", w}}, o).ok());
  EXPECT_FALSE(AdamW::Create({{"w", w}, {"w", w}}, {}).ok());
}

// ---------------------------------------------------------------------------
// Critic

TEST(TrainStrategyTest, ValueHeadTrainsOnValuesOnly) {
  ModelOptions mo;
  mo.lm_head = false;
  mo.value_head = true;
  auto s = MakeStrategy(BaseOptions(), 7, nullptr, mo);
  Batch b = StandardBatch();
  b.SetTensor("returns", at::full({8, 11}, 0.7f));
  LossFn mse = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    EXPECT_FALSE(out.log_probs.defined());
    EXPECT_EQ(out.values.sizes(), mb.loss_mask.sizes());
    at::Tensor err = out.values - mb.data.tensors().at("returns");
    return LossOutput{TokenMeanLoss(err * err, mb), {}};
  };
  const ForwardSpec values_only{false, false, true};
  auto first = s->TrainStep(b, mse, values_only);
  ASSERT_TRUE(first.ok()) << first.status();
  double last = 0;
  for (int i = 0; i < 20; ++i) last = s->TrainStep(b, mse, values_only)->metrics.at("loss");
  EXPECT_LT(last, 0.1 * first->metrics.at("loss"));
  auto logp = s->Forward(b, {});
  ASSERT_FALSE(logp.ok());
  EXPECT_TRUE(HasSub(std::string(logp.status().message()), "no LM head"));
}

// ---------------------------------------------------------------------------
// Checkpoints

TrainStrategyOptions ResumeOptions() {
  TrainStrategyOptions o = BaseOptions();
  o.adam.eps = 1e-8;
  o.lr.type = static_cast<LrSchedulerType>(1);  // cosine
  o.lr.warmup_steps = 1;
  o.lr.total_steps = 6;
  o.max_grad_norm = 1.0;
  o.micro_batch_size = 3;
  return o;
}

TEST(TrainStrategyTest, ResumeFromCheckpointIsBitwiseIdentical) {
  const std::string root = TempDir("resume");
  const std::string ckpt = root + "/checkpoint";
  const Batch b = StandardBatch();
  const Batch b2 = MakeBatch({4, 10, 8}, {3, 6, 2}, 10, 11);

  auto run = MakeStrategy(ResumeOptions());
  Step(*run, b);
  Step(*run, b2);
  ASSERT_TRUE(run->Save(ckpt).ok());
  const auto at_save = Snapshot(run->model());
  const at::Tensor draws_after_save = at::rand({4});
  const TrainStepResult uninterrupted = Step(*run, b);
  EXPECT_GT(uninterrupted.metrics.at("lr"), 0.0);

  auto resumed = MakeStrategy(ResumeOptions(), /*seed=*/99);
  ASSERT_GT(MaxDiff(Snapshot(resumed->model()), at_save), 1e-3);
  at::rand({17});  // disturb the generator; Load must restore it
  ASSERT_TRUE(resumed->Load(ckpt).ok());
  EXPECT_TRUE(torch::equal(at::rand({4}), draws_after_save));
  EXPECT_EQ(resumed->step(), 2);
  EXPECT_EQ(resumed->current_lr(), uninterrupted.metrics.at("lr"));
  EXPECT_EQ(MaxDiff(Snapshot(resumed->model()), at_save), 0.0);
  const TrainStepResult after = Step(*resumed, b);
  EXPECT_EQ(after.metrics.at("loss"), uninterrupted.metrics.at("loss"));
  for (const auto& [name, t] : Snapshot(run->model())) {
    EXPECT_TRUE(torch::equal(t, Snapshot(resumed->model()).at(name))) << name;
  }

  // The checkpoint is a Hugging Face directory plus trainer state, and
  // nothing temporary is left beside it.
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors",
                        "rng_state.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / f)) << f;
  }
  auto hf = CausalLM::FromPretrained(ckpt);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(MaxDiff(Snapshot(**hf), at_save), 0.0);
  // Saving again replaces the checkpoint as a whole.
  ASSERT_TRUE(run->Save(ckpt).ok());
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(root)) entries.push_back(e.path().filename().string());
  EXPECT_EQ(entries, std::vector<std::string>{"checkpoint"});
  auto reloaded = MakeStrategy(ResumeOptions(), 5);
  ASSERT_TRUE(reloaded->Load(ckpt).ok());
  EXPECT_EQ(reloaded->step(), 3);
  EXPECT_EQ(MaxDiff(Snapshot(reloaded->model()), Snapshot(run->model())), 0.0);
  fs::remove_all(root);
}

TEST(TrainStrategyTest, LoadRejectsMismatchedOrBrokenCheckpoints) {
  const std::string root = TempDir("badload");
  auto s = MakeStrategy(BaseOptions());
  Step(*s, StandardBatch());
  ASSERT_TRUE(s->Save(root + "/ok").ok());

  absl::Status missing = s->Load(root + "/nothing");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSub(std::string(missing.message()), "trainer_state.json"));

  // A model of another width: the error names the file and the tensor.
  auto other_cfg = ModelConfig::FromJson(R"({"model_type": "qwen2", "hidden_size": 16,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 50})");
  ASSERT_TRUE(other_cfg.ok());
  auto other = TrainStrategy::Create(std::move(*CausalLM::Random(*other_cfg, 1)), BaseOptions());
  ASSERT_TRUE(other.ok());
  absl::Status shape = (*other)->Load(root + "/ok");
  ASSERT_FALSE(shape.ok());
  EXPECT_TRUE(HasSub(std::string(shape.message()), "model.safetensors: tensor 'model.embed_tokens.weight' has shape [50, 32]"));

  // Optimizer moments of the wrong shape.
  ASSERT_TRUE(s->Save(root + "/bad_opt").ok());
  auto state = s->model().NamedParameters();
  std::map<std::string, at::Tensor> moments;
  for (const auto& [name, p] : state) {
    moments["exp_avg/" + name] = at::zeros_like(p);
    moments["exp_avg_sq/" + name] = at::zeros_like(p);
  }
  moments["exp_avg/model.norm.weight"] = at::zeros({3});
  ASSERT_TRUE(SaveSafetensors(root + "/bad_opt/optimizer.safetensors", moments).ok());
  const auto before = Snapshot(s->model());
  absl::Status opt = s->Load(root + "/bad_opt");
  ASSERT_FALSE(opt.ok());
  EXPECT_TRUE(HasSub(std::string(opt.message()), "optimizer.safetensors: tensor 'exp_avg/model.norm.weight' has shape [3]"));
  EXPECT_EQ(s->step(), 1);

  // A corrupt state file.
  ASSERT_TRUE(s->Save(root + "/bad_json").ok());
  std::ofstream(root + "/bad_json/trainer_state.json") << "{\"format\": \"roll-trainer-state\", \"version\": 1}";
  absl::Status js = s->Load(root + "/bad_json");
  ASSERT_FALSE(js.ok());
  EXPECT_TRUE(HasSub(std::string(js.message()), "trainer_state.json: 'step'"));
  EXPECT_EQ(MaxDiff(before, Snapshot(s->model())), 0.0);
  fs::remove_all(root);
}

}  // namespace
}  // namespace roll
