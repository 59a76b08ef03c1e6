// The model update from a fully sharded trainer: each trainer rank sends
// only its own shard pieces on a group of its own, and each generator ends
// bit-equal to the trainer's weights without any rank gathering the model.
// Two trainer ranks and two generators, each a thread with its own
// communicators over one store; a third generator is split into two
// tensor-parallel slices and receives straight into them (no whole model):
// each must hold exactly its part.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/sharding.h"
#include "roll/strategies/train_strategy.h"
#include "roll/strategies/weight_sync.h"
#include "strategies/sync_test_util.h"

namespace roll {
namespace {

constexpr int kTrainers = 2;
constexpr int kGenerators = 3;  // the last one tensor-parallel

std::unique_ptr<CausalLM> Model(uint64_t seed, c10::ScalarType dtype) {
  return testing::SyncTestModel(seed, dtype, /*kv_heads=*/2, /*vocab=*/50);
}

class ShardedSyncTest : public ::testing::TestWithParam<c10::ScalarType> {};

TEST_P(ShardedSyncTest, EveryGeneratorEndsBitEqualAndNoRankGathersTheModel) {
  auto store = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  auto options = [&](const std::string& group, int rank, int world) {
    CommunicatorOptions o;
    o.store_port = (*store)->port();
    o.store_token = (*store)->token();
    o.group_name = group;
    o.rank = rank;
    o.world_size = world;
    o.timeout = std::chrono::seconds(60);
    return o;
  };
  const c10::ScalarType dtype = GetParam();
  std::mutex mu;
  std::map<std::string, at::Tensor> trained;
  std::vector<int64_t> sent_elements(kTrainers);
  std::vector<int64_t> held_during_send(kTrainers, -1);
  std::vector<std::map<std::string, at::Tensor>> received(kGenerators - 1);
  std::vector<std::map<std::string, at::Tensor>> received_slices(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < kTrainers; ++r) {
    threads.emplace_back([&, r] {
      auto dp = CreateCommunicator(options("dp", r, kTrainers));
      ASSERT_TRUE(dp.ok()) << dp.status();
      TrainStrategyOptions o;
      o.lr.base_lr = 1e-2;
      o.fully_sharded = true;
      auto s = TrainStrategy::Create(Model(7, dtype), o, dp->get());
      ASSERT_TRUE(s.ok()) << s.status();
      // One update, so the weights differ from every starting point.
      Batch b;
      b.SetTensor("input_ids", at::arange(2 + r, 14 + r, at::kLong).view({2, 6}));
      auto step = (*s)->TrainStep(b, [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
        return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
      });
      ASSERT_TRUE(step.ok()) << step.status();
      auto sync = CreateCommunicator(options(absl::StrCat("sync.shard", r), 0, 1 + kGenerators));
      ASSERT_TRUE(sync.ok()) << sync.status();
      const std::vector<at::Tensor> pieces = (*s)->ShardPieces();
      ParameterBroadcaster broadcaster(4096);
      absl::Status sent = broadcaster.Run(**sync, pieces);
      ASSERT_TRUE(sent.ok()) << sent;
      int64_t held = 0, n = 0;
      for (const at::Tensor& p : (*s)->model().Parameters()) held += p.numel();
      for (const at::Tensor& p : pieces) n += p.numel();
      std::map<std::string, at::Tensor> full;
      absl::Status gathered = (*s)->WithFullModel([&](CausalLM& m) {
        for (const auto& [name, p] : m.NamedParametersOrdered()) full[name] = p.detach().clone();
        return absl::OkStatus();
      });
      ASSERT_TRUE(gathered.ok()) << gathered;
      std::lock_guard<std::mutex> lock(mu);
      held_during_send[r] = held;
      sent_elements[r] = n;
      if (r == 0) trained = std::move(full);
    });
  }
  for (int g = 0; g < kGenerators; ++g) {
    threads.emplace_back([&, g] {
      auto model = Model(100 + g, dtype);
      // The last generator keeps only two tensor-parallel slices.
      std::vector<std::unique_ptr<CausalLM>> slices;
      if (g == kGenerators - 1) {
        for (int r = 0; r < 2; ++r) {
          auto s = model->TensorParallelSlice(r, 2);
          ASSERT_TRUE(s.ok()) << s.status();
          slices.push_back(std::move(*s));
        }
        model.reset();
      }
      std::vector<std::unique_ptr<Communicator>> groups;
      for (int r = 0; r < kTrainers; ++r) {
        auto c = CreateCommunicator(options(absl::StrCat("sync.shard", r), 1 + g, 1 + kGenerators));
        ASSERT_TRUE(c.ok()) << c.status();
        groups.push_back(std::move(*c));
      }
      ParameterBroadcaster broadcaster(4096);
      std::optional<ShardLayout> layout;
      if (!slices.empty()) {
        std::vector<CausalLM*> raw = {slices[0].get(), slices[1].get()};
        absl::Status s = ReceiveShardedUpdateIntoSlices(broadcaster, groups, raw, &layout);
        ASSERT_TRUE(s.ok()) << s;
        std::lock_guard<std::mutex> lock(mu);
        for (size_t r = 0; r < slices.size(); ++r) {
          for (const auto& [name, p] : slices[r]->NamedParametersOrdered()) {
            received_slices[r][name] = p.detach().clone();
          }
        }
        return;
      }
      absl::Status s = ReceiveShardedUpdate(broadcaster, groups, *model, &layout);
      ASSERT_TRUE(s.ok()) << s;
      std::map<std::string, at::Tensor> got;
      for (const auto& [name, p] : model->NamedParametersOrdered()) got[name] = p.detach().clone();
      std::lock_guard<std::mutex> lock(mu);
      received[g] = std::move(got);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(trained.empty());
  int64_t total = 0;
  for (const auto& [name, t] : trained) total += t.numel();
  for (int g = 0; g < kGenerators - 1; ++g) {
    ASSERT_EQ(received[g].size(), trained.size());
    for (const auto& [name, t] : trained) {
      EXPECT_TRUE(torch::equal(received[g].at(name), t)) << "generator " << g << " " << name;
    }
  }
  // Each tensor-parallel slice holds exactly its part of the trainer's weights.
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(received_slices[r].size(), trained.size());
    for (const auto& [name, t] : received_slices[r]) {
      const int dim = TensorParallelDim(name);
      const at::Tensor want = dim < 0 ? trained.at(name) : trained.at(name).narrow(dim, r * t.size(dim), t.size(dim));
      EXPECT_TRUE(torch::equal(t, want)) << "slice " << r << " " << name;
    }
  }
  for (int r = 0; r < kTrainers; ++r) {
    // The trainer's model held no parameter data while it sent, and it sent
    // its share: about half of the model each.
    EXPECT_EQ(held_during_send[r], 0) << "trainer " << r;
    EXPECT_LE(sent_elements[r], total / kTrainers + 8) << "trainer " << r;
    EXPECT_GE(sent_elements[r], total / kTrainers - 8) << "trainer " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ShardedSyncTest, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace roll
