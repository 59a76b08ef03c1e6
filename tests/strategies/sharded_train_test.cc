// Fully sharded training (options.fully_sharded) over Gloo with 1, 2 and 4
// ranks, each a thread with its own communicator: updates equal one
// process training on the whole batch, every rank keeps only its share of
// the state, and checkpoints resume exactly, on another number of ranks too.

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
#include "strategies/train_test_util.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using train_test::MakeBatch;
using train_test::MaxDiff;
using train_test::Snapshot;
using train_test::StandardBatch;

using Params = std::map<std::string, at::Tensor>;

class ShardedTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  // Runs `body(rank, communicator)` on `world` threads of group `group`.
  void RunRanks(const std::string& group, int world,
                const std::function<void(int, Communicator*)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        CommunicatorOptions o;
        o.store_host = server_->host();
        o.store_port = server_->port();
        o.store_token = server_->token();
        o.group_name = group;
        o.rank = r;
        o.world_size = world;
        o.timeout = std::chrono::seconds(60);
        auto comm = CreateCommunicator(o);
        ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
        body(r, comm->get());
      });
    }
    for (auto& t : threads) t.join();
  }

  std::unique_ptr<StoreServer> server_;
};

TrainStrategyOptions Options(bool sharded) {
  TrainStrategyOptions o = train_test::BaseOptions();
  o.micro_batch_size = 2;  // accumulation inside each rank as well
  o.max_grad_norm = 0.5;   // clipping must see the whole model's norm
  o.adam.weight_decay = 0.1;  // decays matrices only, across shard boundaries
  o.lr.type = static_cast<LrSchedulerType>(1);  // cosine
  o.lr.warmup_steps = 1;
  o.lr.total_steps = 8;
  o.fully_sharded = sharded;
  return o;
}




// One process on the whole batches: the reference.
Params Reference(ModelOptions mo, LossFn loss, ForwardSpec spec, std::vector<double>* losses) {
  auto s = train_test::MakeStrategy(Options(false), 7, nullptr, mo);
  for (const Batch& b : train_test::ThreeSteps()) {
    auto r = s->TrainStep(b, loss, spec);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) losses->push_back(r->metrics.at("loss"));
  }
  return Snapshot(s->model());
}

LossFn ValueAndPolicyLoss() {
  return [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    at::Tensor err = out.values - 0.5;
    return LossOutput{TokenMeanLoss(-out.log_probs + err * err, mb), {}};
  };
}

TEST_F(ShardedTrainTest, StepsEqualOneProcessOnTheWholeBatchOnOneTwoAndFourRanks) {
  struct Case {
    std::string name;
    ModelOptions model;
    LossFn loss;
    ForwardSpec spec;
  };
  ModelOptions with_values;
  with_values.value_head = true;
  std::vector<Case> cases = {
      {"lm", {}, train_test::SftLoss(), {}},
      {"lm_values", with_values, ValueAndPolicyLoss(), ForwardSpec{true, false, true}},
  };
  for (const Case& c : cases) {
    std::vector<double> ref_losses;
    const Params want = Reference(c.model, c.loss, c.spec, &ref_losses);
    for (int world : {1, 2, 4}) {
      std::mutex mu;
      std::vector<Params> got(world);
      std::vector<std::vector<double>> losses(world);
      std::vector<int64_t> shard_elements(world);
      int64_t model_elements = 0;
      RunRanks(absl::StrCat("steps-", c.name, "-", world), world, [&](int rank, Communicator* comm) {
        auto s = train_test::MakeStrategy(Options(true), 7, comm, c.model);
        ASSERT_TRUE(s->fully_sharded());
        // Outside a unit call the model holds no parameter data at all.
        for (const at::Tensor& p : s->model().Parameters()) ASSERT_EQ(p.numel(), 0);
        for (const Batch& b : train_test::ThreeSteps()) {
          auto r = s->TrainStep(train_test::RankRows(b, rank, world), c.loss, c.spec);
          ASSERT_TRUE(r.ok()) << "rank " << rank << ": " << r.status();
          losses[rank].push_back(r->metrics.at("loss"));
        }
        int64_t held = 0;
        for (const at::Tensor& t : s->StateTensors()) {
          if (t.scalar_type() == at::kFloat && t.dim() == 1) held += t.numel();
        }
        Params full = train_test::WholeParams(*s);
        std::lock_guard<std::mutex> lock(mu);
        got[rank] = std::move(full);
        shard_elements[rank] = held;
        if (rank == 0) model_elements = s->model().NumParameters();
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(got[r].size(), want.size()) << c.name << " world " << world;
        EXPECT_LT(MaxDiff(got[r], want), 1e-5) << c.name << " world " << world << " rank " << r;
        for (size_t i = 0; i < ref_losses.size(); ++i) {
          EXPECT_NEAR(losses[r][i], ref_losses[i], 1e-5) << c.name << " world " << world << " step " << i;
        }
      }
      // Parameters + both moments: a third of the rank's float tensors each,
      // at most the model's share plus one element of padding per unit.
      int64_t total = 0;
      for (const auto& [name, t] : want) total += t.numel();
      for (int r = 0; r < world; ++r) {
        EXPECT_LE(shard_elements[r], 3 * (total / world + 4 + 2)) << c.name << " world " << world;
        EXPECT_GE(shard_elements[r], 3 * (total / world)) << c.name << " world " << world;
      }
      EXPECT_EQ(model_elements, 0);
    }
  }
}

TEST_F(ShardedTrainTest, TiedEmbeddingsGetTheGradientOfBothUses) {
  auto config = train_test::TinyConfig();
  config.tie_word_embeddings = true;
  auto make = [&](bool sharded, Communicator* comm) {
    auto m = CausalLM::Random(config, 7);
    EXPECT_TRUE(m.ok()) << m.status();
    auto s = TrainStrategy::Create(std::move(*m), Options(sharded), comm);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  };
  auto ref = make(false, nullptr);
  for (const Batch& b : train_test::ThreeSteps()) ASSERT_TRUE(ref->TrainStep(b, train_test::SftLoss()).ok());
  const Params want = Snapshot(ref->model());
  std::vector<Params> got(2);
  RunRanks("tied", 2, [&](int rank, Communicator* comm) {
    auto s = make(true, comm);
    for (const Batch& b : train_test::ThreeSteps()) {
      auto r = s->TrainStep(train_test::RankRows(b, rank, 2), train_test::SftLoss());
      ASSERT_TRUE(r.ok()) << r.status();
    }
    got[rank] = train_test::WholeParams(*s);
  });
  for (const Params& g : got) EXPECT_LT(MaxDiff(g, want), 1e-5);
}

TEST_F(ShardedTrainTest, BFloat16ModelKeepsFloat32MasterShards) {
  ModelOptions bf16;
  bf16.dtype = at::kBFloat16;
  std::vector<double> ref_losses;
  const Params want = Reference(bf16, train_test::SftLoss(), {}, &ref_losses);
  std::vector<Params> got(2);
  std::vector<std::map<std::string, at::Tensor>> states(2);
  RunRanks("bf16", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(Options(true), 7, comm, bf16);
    for (const Batch& b : train_test::ThreeSteps()) {
      auto r = s->TrainStep(train_test::RankRows(b, rank, 2), train_test::SftLoss());
      ASSERT_TRUE(r.ok()) << r.status();
    }
    got[rank] = train_test::WholeParams(*s);
  });
  // bf16 compute rounds differently with other batch splits; the update
  // itself runs on float32 masters, so the weights stay within bf16 steps.
  for (const Params& g : got) {
    for (const auto& [name, t] : g) EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
    EXPECT_LT(MaxDiff(g, want), 2e-2);
  }
}

TEST_F(ShardedTrainTest, CheckpointResumesExactlyOnTheSameAndOtherRankCounts) {
  const fs::path root = fs::temp_directory_path() / ("roll_sharded_ckpt_" + std::to_string(getpid()));
  fs::remove_all(root);
  const std::string ckpt = (root / "checkpoint").string();
  const auto& steps = train_test::ThreeSteps();

  // Two ranks: two steps, save, one more step.
  std::vector<Params> uninterrupted(2), at_save(2);
  RunRanks("save", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(Options(true), 7, comm);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(s->TrainStep(train_test::RankRows(steps[i], rank, 2), train_test::SftLoss()).ok());
    }
    absl::Status saved = s->Save(ckpt);
    ASSERT_TRUE(saved.ok()) << saved;
    at_save[rank] = train_test::WholeParams(*s);
    ASSERT_TRUE(s->TrainStep(train_test::RankRows(steps[2], rank, 2), train_test::SftLoss()).ok());
    uninterrupted[rank] = train_test::WholeParams(*s);
  });
  for (const char* f : {"config.json", "model.safetensors", "optimizer-rank0-of-2.safetensors",
                        "optimizer-rank1-of-2.safetensors", "rng_state.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / f)) << f;
  }
  EXPECT_FALSE(fs::exists(fs::path(ckpt) / "optimizer.safetensors"));
  // The model is a whole Hugging Face checkpoint.
  auto hf = CausalLM::FromPretrained(ckpt);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(MaxDiff(Snapshot(**hf), at_save[0]), 0.0);

  // Resumed on 2 ranks: bit for bit.
  std::vector<Params> resumed(2);
  RunRanks("load2", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(Options(true), /*seed=*/99, comm);
    absl::Status loaded = s->Load(ckpt);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(s->step(), 2);
    ASSERT_TRUE(s->TrainStep(train_test::RankRows(steps[2], rank, 2), train_test::SftLoss()).ok());
    resumed[rank] = train_test::WholeParams(*s);
  });
  EXPECT_EQ(MaxDiff(resumed[0], uninterrupted[0]), 0.0);

  // On 4 ranks and on 1 (same weights and moments, cut another way): equal
  // up to the rounding of another batch split.
  for (int world : {4, 1}) {
    std::vector<Params> other(world);
    RunRanks(absl::StrCat("load", world, "x"), world, [&](int rank, Communicator* comm) {
      auto s = train_test::MakeStrategy(Options(true), 99, comm);
      absl::Status loaded = s->Load(ckpt);
      ASSERT_TRUE(loaded.ok()) << loaded;
      EXPECT_EQ(MaxDiff(train_test::WholeParams(*s), at_save[0]), 0.0);
      ASSERT_TRUE(s->TrainStep(train_test::RankRows(steps[2], rank, world), train_test::SftLoss()).ok());
      other[rank] = train_test::WholeParams(*s);
    });
    EXPECT_LT(MaxDiff(other[0], uninterrupted[0]), 1e-5) << "world " << world;
  }

  // A replicated trainer refuses the sharded optimizer state by name; a
  // sharded one resumes a replicated checkpoint.
  auto ddp = train_test::MakeStrategy(Options(false), 7);
  absl::Status refused = ddp->Load(ckpt);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("sharded over 2 ranks"), std::string::npos) << refused;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ddp->TrainStep(steps[i], train_test::SftLoss()).ok());
  const std::string ddp_ckpt = (root / "replicated").string();
  ASSERT_TRUE(ddp->Save(ddp_ckpt).ok());
  ASSERT_TRUE(ddp->TrainStep(steps[2], train_test::SftLoss()).ok());
  const Params ddp_after = Snapshot(ddp->model());
  std::vector<Params> from_ddp(2);
  RunRanks("fromddp", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(Options(true), 99, comm);
    absl::Status loaded = s->Load(ddp_ckpt);
    ASSERT_TRUE(loaded.ok()) << loaded;
    ASSERT_TRUE(s->TrainStep(train_test::RankRows(steps[2], rank, 2), train_test::SftLoss()).ok());
    from_ddp[rank] = train_test::WholeParams(*s);
  });
  EXPECT_LT(MaxDiff(from_ddp[0], ddp_after), 1e-5);
  fs::remove_all(root);
}

TEST_F(ShardedTrainTest, RanksWithDifferentMicroBatchCountsStayInStep) {
  // Rank 0: rows 0-4, rank 1: rows 5-7, one row per micro-batch: 5 against
  // 3 micro-batches, each issuing per-unit collectives.
  TrainStrategyOptions o = Options(true);
  o.micro_batch_size = 1;
  TrainStrategyOptions ref_o = o;
  ref_o.fully_sharded = false;
  auto ref = train_test::MakeStrategy(ref_o, 7);
  for (const Batch& b : train_test::ThreeSteps()) ASSERT_TRUE(ref->TrainStep(b, train_test::SftLoss()).ok());
  const Params want = Snapshot(ref->model());
  std::vector<Params> got(2);
  RunRanks("uneven", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(o, 7, comm);
    for (const Batch& b : train_test::ThreeSteps()) {
      std::vector<int64_t> rows = rank == 0 ? std::vector<int64_t>{0, 1, 2, 3, 4} : std::vector<int64_t>{5, 6, 7};
      auto r = s->TrainStep(*b.Select(rows), train_test::SftLoss());
      ASSERT_TRUE(r.ok()) << "rank " << rank << ": " << r.status();
    }
    // Forward with no rows on one rank still meets the other's collectives.
    Batch mine = rank == 0 ? StandardBatch() : *StandardBatch().Select({});
    auto f = s->Forward(mine, {});
    ASSERT_TRUE(f.ok()) << "rank " << rank << ": " << f.status();
    EXPECT_EQ(f->log_probs.size(0), rank == 0 ? 8 : 0);
    // A token id outside the vocabulary on one rank fails every rank's step
    // by name instead of leaving the others waiting.
    Batch bad = train_test::RankRows(StandardBatch(), rank, 2);
    if (rank == 1) {
      at::Tensor ids = bad.tensors().at("input_ids").clone();
      ids[0][0] = 999;
      bad.SetTensor("input_ids", ids);
    }
    auto r = s->TrainStep(bad, train_test::SftLoss());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
    EXPECT_NE(r.status().message().find(rank == 1 ? "token id 999" : "another rank"), std::string::npos)
        << r.status();
    // A loss function failing on one rank only, in its second micro-batch:
    // every rank's step fails at once (not at the group's timeout) and no
    // update is made.
    const auto start = std::chrono::steady_clock::now();
    LossFn flaky = [rank](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
      if (rank == 1 && mb.index == 1) return absl::InvalidArgumentError("bad reward");
      return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
    };
    std::vector<int64_t> rows = rank == 0 ? std::vector<int64_t>{0, 1, 2, 3, 4} : std::vector<int64_t>{5, 6, 7};
    auto failed = s->TrainStep(*StandardBatch().Select(rows), flaky);
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find(rank == 1 ? "bad reward" : "another rank's loss function"),
              std::string::npos)
        << failed.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    got[rank] = train_test::WholeParams(*s);
  });
  for (const Params& g : got) EXPECT_LT(MaxDiff(g, want), 1e-5);
}

TEST_F(ShardedTrainTest, ForwardMatchesTheReplicatedModel) {
  auto ref = train_test::MakeStrategy(Options(false), 7);
  const Batch b = StandardBatch();
  ForwardSpec spec{true, true, false};
  auto want = ref->Forward(b, spec);
  ASSERT_TRUE(want.ok()) << want.status();
  RunRanks("forward", 2, [&](int rank, Communicator* comm) {
    auto s = train_test::MakeStrategy(Options(true), 7, comm);
    auto got = s->Forward(b, spec);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(torch::allclose(got->log_probs, want->log_probs, 1e-5, 1e-6)) << "rank " << rank;
    EXPECT_TRUE(torch::allclose(got->entropy, want->entropy, 1e-5, 1e-6)) << "rank " << rank;
  });
}

}  // namespace
}  // namespace roll
