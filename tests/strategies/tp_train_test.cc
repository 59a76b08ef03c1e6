// Tensor-parallel training (TrainStrategy with a TensorParallelGroup): a
// model split over 2 and 4 slices of an in-process Gloo group trains like
// one process on the whole model (to 1e-5 in float32), also with a value
// head, tied embeddings and data parallelism over two such workers; each
// slice holds only its part; the checkpoint is the unsplit one and resumes
// with the same split, another one or none.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "roll/models/safetensors.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/tensor_parallel.h"
#include "strategies/train_test_util.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using train_test::MakeBatch;
using train_test::MaxDiff;
using train_test::SplittableConfig;
using train_test::Snapshot;
using train_test::StandardBatch;

using Params = std::map<std::string, at::Tensor>;

TrainStrategyOptions Options() {
  TrainStrategyOptions o = train_test::BaseOptions();
  o.micro_batch_size = 3;      // accumulation over uneven micro-batches
  o.max_grad_norm = 0.5;       // clipping must see the whole model's norm once
  o.adam.weight_decay = 0.1;
  o.lr.type = static_cast<LrSchedulerType>(1);  // cosine
  o.lr.warmup_steps = 1;
  o.lr.total_steps = 8;
  return o;
}



LossFn ValueAndPolicyLoss() {
  return [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    at::Tensor err = out.values - 0.5;
    LossOutput l{TokenMeanLoss(-out.log_probs + err * err + 0.01 * out.entropy, mb), {}};
    l.metrics["tokens_seen"] = mb.loss_mask.sum().item<double>();
    return l;
  };
}

class TensorParallelTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  CommunicatorOptions Base(const std::string& group) const {
    CommunicatorOptions o;
    o.store_host = server_->host();
    o.store_port = server_->port();
    o.store_token = server_->token();
    o.group_name = group;
    o.timeout = std::chrono::seconds(60);
    return o;
  }

  std::unique_ptr<CausalLM> Model(const ModelConfig& config, ModelOptions mo = {}) const {
    auto m = CausalLM::Random(config, 7, mo);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  }

  // A strategy training `tp` slices (plain when tp is 1).
  std::unique_ptr<TrainStrategy> Make(const ModelConfig& config, int tp, const std::string& group,
                                      ModelOptions mo = {}, Communicator* dp = nullptr,
                                      TrainStrategyOptions o = Options()) const {
    std::unique_ptr<CausalLM> whole = Model(config, mo);
    std::unique_ptr<TensorParallelGroup> slices;
    if (tp > 1) {
      auto g = TensorParallelGroup::Create(*whole, tp, Base(group));
      EXPECT_TRUE(g.ok()) << g.status();
      slices = std::move(*g);
    }
    auto s = TrainStrategy::Create(std::move(whole), o, dp, std::move(slices));
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }

  std::unique_ptr<StoreServer> server_;
};


TEST_F(TensorParallelTrainTest, StepsEqualOneProcessOnTwoAndFourSlices) {
  struct Case {
    std::string name;
    bool tied;
    ModelOptions model;
    LossFn loss;
    ForwardSpec spec;
  };
  ModelOptions with_values;
  with_values.value_head = true;
  const std::vector<Case> cases = {
      {"lm", false, {}, train_test::SftLoss(), {}},
      {"values_entropy", false, with_values, ValueAndPolicyLoss(), ForwardSpec{true, true, true}},
      {"tied", true, {}, train_test::SftLoss(), {}},
  };
  for (const Case& c : cases) {
    const ModelConfig config = SplittableConfig(c.tied);
    auto ref = Make(config, 1, "", c.model);
    std::vector<TrainStepResult> want_steps;
    for (const Batch& b : train_test::ThreeSteps()) {
      auto r = ref->TrainStep(b, c.loss, c.spec);
      ASSERT_TRUE(r.ok()) << r.status();
      want_steps.push_back(*r);
    }
    const Params want = Snapshot(ref->model());
    for (int tp : {2, 4}) {
      const std::string where = absl::StrCat(c.name, " tp ", tp);
      auto s = Make(config, tp, absl::StrCat("steps-", c.name, tp), c.model);
      ASSERT_EQ(s->tensor_parallel_size(), tp);
      // Between calls the whole model holds nothing; the slices hold it.
      for (const at::Tensor& p : s->model().Parameters()) ASSERT_EQ(p.numel(), 0) << where;
      for (size_t i = 0; i < train_test::ThreeSteps().size(); ++i) {
        auto r = s->TrainStep(train_test::ThreeSteps()[i], c.loss, c.spec);
        ASSERT_TRUE(r.ok()) << where << ": " << r.status();
        for (const char* k : {"loss", "grad_norm", "lr"}) {
          EXPECT_NEAR(r->metrics.at(k), want_steps[i].metrics.at(k), 1e-5) << where << " step " << i << " " << k;
        }
        for (const auto& [k, v] : want_steps[i].metrics) EXPECT_TRUE(r->metrics.count(k)) << where << " " << k;
        // Per layer two sums forward and two backward of [rows, T, hidden],
        // one sum for the embeddings and one backward at the LM head's
        // input, and the logits gathered: each rank hands its own columns.
        const int64_t tokens = train_test::ThreeSteps()[i].size() * 12;
        const int64_t want_bytes =
            4 * tokens * (config.hidden_size * (4 * config.num_hidden_layers + 2) + config.vocab_size / tp);
        EXPECT_EQ(r->metrics.at("tp_comm_bytes"), static_cast<double>(want_bytes)) << where << " step " << i;
      }
      // Clipping was active (the norm is over the whole model, each element once).
      EXPECT_GT(want_steps[0].metrics.at("grad_norm"), 0.5);
      const Params got = train_test::WholeParams(*s);
      ASSERT_EQ(got.size(), want.size()) << where;
      EXPECT_LT(MaxDiff(got, want), 1e-5) << where;
      for (const at::Tensor& p : s->model().Parameters()) ASSERT_EQ(p.numel(), 0) << where;

      // Forward (log-probs, entropy, values) equals the unsplit model's.
      auto fo = s->Forward(train_test::ThreeSteps()[0], ForwardSpec{true, true, c.model.value_head});
      auto fr = ref->Forward(train_test::ThreeSteps()[0], ForwardSpec{true, true, c.model.value_head});
      ASSERT_TRUE(fo.ok() && fr.ok()) << where;
      EXPECT_LT((fo->log_probs - fr->log_probs).abs().max().item<double>(), 1e-4) << where;
      EXPECT_LT((fo->entropy - fr->entropy).abs().max().item<double>(), 1e-4) << where;
      if (c.model.value_head) EXPECT_LT((fo->values - fr->values).abs().max().item<double>(), 1e-4) << where;
    }
  }
}

TEST_F(TensorParallelTrainTest, EachSliceHoldsItsPartOfTheParametersAndOptimizerState) {
  const ModelConfig config = SplittableConfig();
  auto ref = Make(config, 1, "");
  int64_t whole = 0, replicated = 0;
  for (const auto& [name, p] : ref->model().NamedParametersOrdered()) {
    whole += p.numel();
    if (TensorParallelDim(name) < 0) replicated += p.numel();
  }
  for (int tp : {2, 4}) {
    auto s = Make(config, tp, absl::StrCat("memory", tp));
    ASSERT_TRUE(s->TrainStep(train_test::ThreeSteps()[0], train_test::SftLoss()).ok());
    // Parameters and both moments of every slice: each slice a 1/tp share of
    // the split parameters plus a copy of the replicated ones.
    int64_t held = 0;
    for (const at::Tensor& t : s->StateTensors()) held += t.numel();
    EXPECT_EQ(held, 3 * ((whole - replicated) + tp * replicated)) << "tp " << tp;
    EXPECT_LT(held / tp, 3 * (whole / tp + replicated)) << "tp " << tp;
  }
}

TEST_F(TensorParallelTrainTest, DataParallelWorkersOfTwoSlicesEachEqualOneProcess) {
  const ModelConfig config = SplittableConfig();
  auto ref = Make(config, 1, "");
  std::vector<TrainStepResult> want_steps;
  for (const Batch& b : train_test::ThreeSteps()) {
    auto r = ref->TrainStep(b, train_test::SftLoss());
    ASSERT_TRUE(r.ok()) << r.status();
    want_steps.push_back(*r);
  }
  const Params want = Snapshot(ref->model());
  std::vector<Params> got(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      CommunicatorOptions o = Base("dp");
      o.rank = rank;
      o.world_size = 2;
      auto dp = CreateCommunicator(o);
      ASSERT_TRUE(dp.ok()) << dp.status();
      auto s = Make(config, 2, absl::StrCat("dp-worker", rank), {}, dp->get());
      for (size_t i = 0; i < train_test::ThreeSteps().size(); ++i) {
        auto r = s->TrainStep(train_test::RankRows(train_test::ThreeSteps()[i], rank, 2), train_test::SftLoss());
        ASSERT_TRUE(r.ok()) << "worker " << rank << ": " << r.status();
        for (const char* k : {"loss", "grad_norm", "lr"}) {
          EXPECT_NEAR(r->metrics.at(k), want_steps[i].metrics.at(k), 1e-5) << "worker " << rank << " step " << i << " " << k;
        }
      }
      got[rank] = train_test::WholeParams(*s);
    });
  }
  for (auto& t : workers) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_LT(MaxDiff(got[r], want), 1e-5) << "worker " << r;
}

TEST_F(TensorParallelTrainTest, CheckpointIsTheUnsplitOneAndResumesWithAnySplit) {
  const fs::path root = fs::temp_directory_path() / ("roll_tp_ckpt_" + std::to_string(getpid()));
  fs::remove_all(root);
  const std::string ckpt = (root / "checkpoint").string();
  const ModelConfig config = SplittableConfig();
  const auto& steps = train_test::ThreeSteps();

  auto s = Make(config, 2, "save");
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s->TrainStep(steps[i], train_test::SftLoss()).ok());
  absl::Status saved = s->Save(ckpt);
  ASSERT_TRUE(saved.ok()) << saved;
  const Params at_save = train_test::WholeParams(*s);
  ASSERT_TRUE(s->TrainStep(steps[2], train_test::SftLoss()).ok());
  const Params uninterrupted = train_test::WholeParams(*s);

  // A whole Hugging Face model and whole-shaped optimizer moments.
  auto hf = CausalLM::FromPretrained(ckpt);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(MaxDiff(Snapshot(**hf), at_save), 0.0);
  auto opt = SafetensorsFile::Open((fs::path(ckpt) / "optimizer.safetensors").string());
  ASSERT_TRUE(opt.ok()) << opt.status();
  for (const auto& [name, t] : at_save) {
    for (const char* kind : {"exp_avg/", "exp_avg_sq/"}) {
      auto info = (*opt)->Info(kind + name);
      ASSERT_TRUE(info.ok()) << kind << name;
      EXPECT_EQ(info->shape, t.sizes().vec()) << kind << name;
    }
  }

  // Same split: bit for bit. Another split, or none: equal up to rounding.
  for (int tp : {2, 4, 1}) {
    auto r = Make(config, tp, absl::StrCat("load", tp));
    absl::Status loaded = r->Load(ckpt);
    ASSERT_TRUE(loaded.ok()) << "tp " << tp << ": " << loaded;
    EXPECT_EQ(r->step(), 2);
    EXPECT_EQ(MaxDiff(train_test::WholeParams(*r), at_save), 0.0) << "tp " << tp;
    ASSERT_TRUE(r->TrainStep(steps[2], train_test::SftLoss()).ok());
    const double diff = MaxDiff(train_test::WholeParams(*r), uninterrupted);
    if (tp == 2) {
      EXPECT_EQ(diff, 0.0);
    } else {
      EXPECT_LT(diff, 1e-5) << "tp " << tp;
    }
  }

  // An unsplit trainer's checkpoint resumes into a split one.
  auto plain = Make(config, 1, "");
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(plain->TrainStep(steps[i], train_test::SftLoss()).ok());
  const std::string plain_ckpt = (root / "unsplit").string();
  ASSERT_TRUE(plain->Save(plain_ckpt).ok());
  ASSERT_TRUE(plain->TrainStep(steps[2], train_test::SftLoss()).ok());
  auto split = Make(config, 2, "from-unsplit");
  absl::Status loaded = split->Load(plain_ckpt);
  ASSERT_TRUE(loaded.ok()) << loaded;
  ASSERT_TRUE(split->TrainStep(steps[2], train_test::SftLoss()).ok());
  EXPECT_LT(MaxDiff(train_test::WholeParams(*split), Snapshot(plain->model())), 1e-5);
  fs::remove_all(root);
}

TEST_F(TensorParallelTrainTest, RefusesFullShardingAndImpossibleSplits) {
  const ModelConfig config = SplittableConfig();
  std::unique_ptr<CausalLM> whole = Model(config);
  auto g = TensorParallelGroup::Create(*whole, 2, Base("refuse"));
  ASSERT_TRUE(g.ok()) << g.status();
  TrainStrategyOptions o = Options();
  o.fully_sharded = true;
  auto s = TrainStrategy::Create(std::move(whole), o, nullptr, std::move(*g));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tensor parallelism and fully sharded"), std::string::npos) << s.status();
  // 4 key-value heads do not split 3 ways; the error names the numbers.
  std::unique_ptr<CausalLM> other = Model(config);
  auto three = TensorParallelGroup::Create(*other, 3, Base("three"));
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("3"), std::string::npos) << three.status();
}

}  // namespace
}  // namespace roll
