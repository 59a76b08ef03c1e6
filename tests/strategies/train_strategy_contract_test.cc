// The contract every parallel layout of TrainStrategy keeps (replicated
// on one and two ranks, fully sharded on two, tensor parallel with two
// slices, alone and data parallel over two workers): its steps and its
// Forward equal one process's on the whole batch, each rank keeps its share
// of the state, a checkpoint resumes exactly, and a failing loss makes no
// update. A new layout joins kLayouts and passes the same tests.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "roll/strategies/communicator.h"
#include "roll/strategies/tensor_parallel.h"
#include "strategies/train_test_util.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

using train_test::MaxDiff;
using train_test::RankRows;
using train_test::Snapshot;
using train_test::ThreeSteps;
using Params = std::map<std::string, at::Tensor>;

struct Layout {
  const char* name;
  int data_parallel;  // workers, each a thread with its own communicator
  int tensor_parallel;
  bool fully_sharded;
  // The share of the whole model's elements (times parameters plus two
  // moments) one worker may hold at most, apart from replicated vectors.
  double state_share;
};

const Layout kLayouts[] = {
    {"replicated", 1, 1, false, 1.0},
    {"replicated_dp2", 2, 1, false, 1.0},
    {"fully_sharded_dp2", 2, 1, true, 0.5},
    {"tensor_parallel_tp2", 1, 2, false, 1.0},
    {"tensor_parallel_tp2_dp2", 2, 2, false, 1.0},
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

ModelConfig Config() { return train_test::SplittableConfig(); }

TrainStrategyOptions Options(const Layout& layout) {
  TrainStrategyOptions o = train_test::BaseOptions();
  o.micro_batch_size = 3;  // accumulation over uneven micro-batches
  o.max_grad_norm = 0.5;   // clipping must see the whole model's norm, each element once
  o.adam.weight_decay = 0.1;
  o.lr.type = static_cast<LrSchedulerType>(1);  // cosine
  o.lr.warmup_steps = 1;
  o.lr.total_steps = 8;
  o.fully_sharded = layout.fully_sharded;
  return o;
}

int64_t Elements(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.numel();
  return n;
}

class TrainStrategyContractTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  CommunicatorOptions Group(const std::string& name, int rank, int world) const {
    CommunicatorOptions o;
    o.store_host = server_->host();
    o.store_port = server_->port();
    o.store_token = server_->token();
    o.group_name = name;
    o.rank = rank;
    o.world_size = world;
    o.timeout = std::chrono::seconds(60);
    return o;
  }

  // Runs body(worker, strategy) on every data-parallel worker of the
  // layout at once, each with a strategy of that layout made for `tag`.
  void RunWorkers(const std::string& tag,
                  const std::function<void(int worker, TrainStrategy& s)>& body) {
    const Layout& layout = GetParam();
    const std::string group = absl::StrCat(layout.name, "-", tag);
    std::vector<std::thread> threads;
    for (int w = 0; w < layout.data_parallel; ++w) {
      threads.emplace_back([&, w] {
        std::unique_ptr<Communicator> dp;
        if (layout.data_parallel > 1) {
          auto c = CreateCommunicator(Group(group + "-dp", w, layout.data_parallel));
          ASSERT_TRUE(c.ok()) << "worker " << w << ": " << c.status();
          dp = std::move(*c);
        }
        // Every worker starts from its own weights: the strategy makes them
        // rank 0's.
        auto whole = CausalLM::Random(Config(), 7 + w);
        ASSERT_TRUE(whole.ok()) << whole.status();
        std::unique_ptr<TensorParallelGroup> slices;
        if (layout.tensor_parallel > 1) {
          CommunicatorOptions tp = Group(absl::StrCat(group, "-tp", w), 0, 0);
          auto g = TensorParallelGroup::Create(**whole, layout.tensor_parallel, tp);
          ASSERT_TRUE(g.ok()) << g.status();
          slices = std::move(*g);
        }
        auto s = TrainStrategy::Create(std::move(*whole), Options(layout), dp.get(), std::move(slices));
        ASSERT_TRUE(s.ok()) << "worker " << w << ": " << s.status();
        EXPECT_EQ((*s)->fully_sharded(), layout.fully_sharded);
        EXPECT_EQ((*s)->tensor_parallel_size(), layout.tensor_parallel);
        body(w, **s);
      });
    }
    for (auto& t : threads) t.join();
  }

  // One process on the whole batches: what every layout must equal.
  static std::unique_ptr<TrainStrategy> Reference(const Layout& layout) {
    TrainStrategyOptions o = Options(layout);
    o.fully_sharded = false;
    auto s = TrainStrategy::Create(std::move(*CausalLM::Random(Config(), 7)), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }

  std::unique_ptr<StoreServer> server_;
};

TEST_P(TrainStrategyContractTest, StepsAndForwardEqualOneProcessOnTheWholeBatch) {
  const Layout& layout = GetParam();
  auto ref = Reference(layout);
  std::vector<TrainStepResult> want;
  for (const Batch& b : ThreeSteps()) {
    auto r = ref->TrainStep(b, train_test::SftLoss());
    ASSERT_TRUE(r.ok()) << r.status();
    want.push_back(*r);
  }
  ASSERT_GT(want[0].metrics.at("grad_norm"), 0.5);  // clipping was active
  const Params want_params = Snapshot(ref->model());
  auto want_forward = ref->Forward(ThreeSteps()[0], ForwardSpec{true, true, false});
  ASSERT_TRUE(want_forward.ok()) << want_forward.status();

  RunWorkers("steps", [&](int w, TrainStrategy& s) {
    const std::string where = absl::StrCat(layout.name, " worker ", w);
    for (size_t i = 0; i < ThreeSteps().size(); ++i) {
      auto r = s.TrainStep(RankRows(ThreeSteps()[i], w, layout.data_parallel), train_test::SftLoss());
      ASSERT_TRUE(r.ok()) << where << ": " << r.status();
      for (const char* k : {"loss", "grad_norm", "lr", "nll_tokens"}) {
        EXPECT_NEAR(r->metrics.at(k), want[i].metrics.at(k), 1e-5) << where << " step " << i << " " << k;
      }
      for (const char* k : {"tokens", "sequences", "skipped"}) {
        EXPECT_EQ(r->metrics.at(k), want[i].metrics.at(k)) << where << " step " << i << " " << k;
      }
      // Data parallel: the gradients crossed the ranks.
      EXPECT_EQ(r->metrics.at("comm_bytes") > 0, layout.data_parallel > 1) << where;
    }
    EXPECT_EQ(s.step(), 3) << where;
    EXPECT_LT(MaxDiff(train_test::WholeParams(s), want_params), 1e-5) << where;

    // Forward: this worker's rows, in their order.
    const Batch mine = RankRows(ThreeSteps()[0], w, layout.data_parallel);
    auto got = s.Forward(mine, ForwardSpec{true, true, false});
    ASSERT_TRUE(got.ok()) << where << ": " << got.status();
    std::vector<int64_t> rows;
    for (int64_t r = w; r < ThreeSteps()[0].size(); r += layout.data_parallel) rows.push_back(r);
    const at::Tensor index = torch::tensor(rows, at::kLong);
    EXPECT_LT((got->log_probs - want_forward->log_probs.index_select(0, index)).abs().max().item<double>(), 1e-4)
        << where;
    EXPECT_LT((got->entropy - want_forward->entropy.index_select(0, index)).abs().max().item<double>(), 1e-4)
        << where;
  });
}

TEST_P(TrainStrategyContractTest, EachWorkerKeepsItsShareOfParametersAndBothMoments) {
  const Layout& layout = GetParam();
  int64_t whole = 0, vectors = 0;
  for (const auto& [name, p] : Reference(layout)->model().NamedParametersOrdered()) {
    whole += p.numel();
    if (p.dim() == 1) vectors += p.numel();
  }
  RunWorkers("state", [&](int w, TrainStrategy& s) {
    ASSERT_TRUE(s.TrainStep(RankRows(ThreeSteps()[0], w, layout.data_parallel), train_test::SftLoss()).ok());
    const int64_t held = Elements(s.StateTensors());
    EXPECT_GE(held, 3 * static_cast<int64_t>(whole * layout.state_share)) << layout.name;
    // Norm vectors may be copied to every slice; shards are padded.
    EXPECT_LE(held, 3 * static_cast<int64_t>(whole * layout.state_share + layout.tensor_parallel * vectors + 64))
        << layout.name;
  });
}

TEST_P(TrainStrategyContractTest, CheckpointResumesExactly) {
  const Layout& layout = GetParam();
  testing::ScratchDir tmp("contract");
  const std::string dir = tmp / layout.name;
  std::vector<Params> uninterrupted(layout.data_parallel), resumed(layout.data_parallel);
  RunWorkers("save", [&](int w, TrainStrategy& s) {
    const int n = layout.data_parallel;
    ASSERT_TRUE(s.TrainStep(RankRows(ThreeSteps()[0], w, n), train_test::SftLoss()).ok());
    const absl::Status saved = s.Save(dir);
    ASSERT_TRUE(saved.ok()) << saved;
    for (size_t i = 1; i < ThreeSteps().size(); ++i) {
      ASSERT_TRUE(s.TrainStep(RankRows(ThreeSteps()[i], w, n), train_test::SftLoss()).ok());
    }
    uninterrupted[w] = train_test::WholeParams(s);
  });
  // A fresh strategy of the same layout, from other weights, resumes.
  RunWorkers("load", [&](int w, TrainStrategy& s) {
    const int n = layout.data_parallel;
    const absl::Status loaded = s.Load(dir);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(s.step(), 1);
    for (size_t i = 1; i < ThreeSteps().size(); ++i) {
      ASSERT_TRUE(s.TrainStep(RankRows(ThreeSteps()[i], w, n), train_test::SftLoss()).ok());
    }
    resumed[w] = train_test::WholeParams(s);
  });
  for (int w = 0; w < layout.data_parallel; ++w) {
    ASSERT_FALSE(resumed[w].empty()) << layout.name;
    EXPECT_EQ(MaxDiff(resumed[w], uninterrupted[w]), 0.0) << layout.name << " worker " << w;
  }
}

TEST_P(TrainStrategyContractTest, AFailingLossNamesTheMicroBatchAndMakesNoUpdate) {
  const Layout& layout = GetParam();
  const LossFn broken = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    if (mb.index == 1) return absl::InvalidArgumentError("advantages missing");
    return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
  };
  RunWorkers("loss", [&](int w, TrainStrategy& s) {
    const Params before = train_test::WholeParams(s);
    auto r = s.TrainStep(RankRows(ThreeSteps()[0], w, layout.data_parallel), broken);
    ASSERT_FALSE(r.ok()) << layout.name;
    EXPECT_NE(r.status().ToString().find("micro-batch 1 of"), std::string::npos) << r.status();
    EXPECT_NE(r.status().ToString().find("advantages missing"), std::string::npos) << r.status();
    EXPECT_EQ(s.step(), 0);
    EXPECT_EQ(MaxDiff(train_test::WholeParams(s), before), 0.0) << layout.name;
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainStrategyContractTest, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace roll
