#pragma once
// Contract tests every Communicator backend must pass: one set of test
// bodies, instantiated per backend (gloo in communicator_test.cc, nccl in
// communicator_gpu_test.cc). Ranks run as threads of the test process, each
// with its own communicator, all rendezvousing through one StoreServer.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "roll/strategies/communicator.h"

namespace roll::comm_test {

struct CommBackend {
  std::string name;  // CommunicatorOptions::backend
  // Most ranks this machine can host (nccl: one per CUDA device).
  int max_ranks = 0;
  // Moves a CPU tensor to the device rank `rank` uses, and back.
  std::function<at::Tensor(const at::Tensor&, int rank)> to_device;
  std::function<at::Tensor(const at::Tensor&)> to_cpu;
  // Backend-specific options for `rank` (e.g. its CUDA device).
  std::function<void(CommunicatorOptions&)> configure;
};

inline std::string PrintBackend(const ::testing::TestParamInfo<CommBackend>& info) {
  return info.param.name;
}

class CommunicatorContractTest : public ::testing::TestWithParam<CommBackend> {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  // The group sizes out of `wanted` this machine can host.
  std::vector<int> Worlds(std::initializer_list<int> wanted) const {
    std::vector<int> out;
    for (int w : wanted) {
      if (w <= GetParam().max_ranks) out.push_back(w);
    }
    return out;
  }

  CommunicatorOptions Options(const std::string& group, int rank, int world) const {
    CommunicatorOptions o;
    o.backend = GetParam().name;
    o.store_host = server_->host();
    o.store_port = server_->port();
    o.store_token = server_->token();
    o.group_name = group;
    o.rank = rank;
    o.world_size = world;
    o.timeout = std::chrono::seconds(20);
    if (GetParam().configure) GetParam().configure(o);
    return o;
  }

  // Runs `body` on `world` threads, one communicator per thread.
  void RunGroup(const std::string& group, int world,
                const std::function<void(Communicator&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto comm = CreateCommunicator(Options(group, r, world));
        ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
        body(**comm);
      });
    }
    for (auto& t : threads) t.join();
  }

  at::Tensor Dev(const at::Tensor& cpu, const Communicator& c) const {
    return GetParam().to_device(cpu, c.rank());
  }
  at::Tensor Cpu(const at::Tensor& t) const { return GetParam().to_cpu(t); }

  std::unique_ptr<StoreServer> server_;
};

// Rank r contributes [r+1, 10(r+1), -r, 0.5r].
inline at::Tensor RankValues(int r) {
  return torch::tensor({r + 1.0f, 10.0f * (r + 1), -1.0f * r, 0.5f * r});
}

TEST_P(CommunicatorContractTest, AllReduceSumAvgMaxOnTwoAndThreeRanks) {
  const auto worlds = Worlds({2, 3});
  if (worlds.empty()) GTEST_SKIP() << "needs 2 ranks";
  for (int world : worlds) {
    at::Tensor sum = torch::zeros({4});
    at::Tensor max = RankValues(0);
    for (int r = 0; r < world; ++r) {
      sum += RankValues(r);
      max = torch::maximum(max, RankValues(r));
    }
    RunGroup("reduce" + std::to_string(world), world, [&](Communicator& c) {
      at::Tensor t = Dev(RankValues(c.rank()), c);
      ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum).ok());
      EXPECT_TRUE(torch::allclose(Cpu(t), sum)) << "sum on rank " << c.rank() << ": " << Cpu(t);

      t = Dev(RankValues(c.rank()), c);
      ASSERT_TRUE(c.AllReduce(t, ReduceOp::kAvg).ok());
      EXPECT_TRUE(torch::allclose(Cpu(t), sum / world)) << "avg on rank " << c.rank() << ": " << Cpu(t);

      t = Dev(RankValues(c.rank()), c);
      ASSERT_TRUE(c.AllReduce(t, ReduceOp::kMax).ok());
      EXPECT_TRUE(torch::equal(Cpu(t), max)) << "max on rank " << c.rank() << ": " << Cpu(t);

      // Integers reduce exactly.
      at::Tensor i = Dev(torch::full({3}, int64_t{1} << (40 + c.rank()), torch::kInt64), c);
      ASSERT_TRUE(c.AllReduce(i, ReduceOp::kSum).ok());
      int64_t expected = 0;
      for (int r = 0; r < world; ++r) expected += int64_t{1} << (40 + r);
      EXPECT_TRUE(torch::equal(Cpu(i), torch::full({3}, expected, torch::kInt64)));
    });
  }
}

TEST_P(CommunicatorContractTest, BroadcastFromEveryRoot) {
  const auto worlds = Worlds({2, 3});
  if (worlds.empty()) GTEST_SKIP() << "needs 2 ranks";
  for (int world : worlds) {
    RunGroup("bcast" + std::to_string(world), world, [&](Communicator& c) {
      for (int root = 0; root < world; ++root) {
        at::Tensor expected = torch::arange(6, torch::kFloat).reshape({2, 3}) * (root + 1);
        at::Tensor t = Dev(c.rank() == root ? expected : torch::full({2, 3}, -7.0f), c);
        ASSERT_TRUE(c.Broadcast(t, root).ok()) << "root " << root;
        EXPECT_TRUE(torch::equal(Cpu(t), expected)) << "root " << root << " rank " << c.rank();
      }
    });
  }
}

TEST_P(CommunicatorContractTest, AllGatherOrdersByRank) {
  const auto worlds = Worlds({2, 3});
  if (worlds.empty()) GTEST_SKIP() << "needs 2 ranks";
  for (int world : worlds) {
    RunGroup("gather" + std::to_string(world), world, [&](Communicator& c) {
      auto out = c.AllGather(Dev(torch::full({2, 2}, 1.5f * c.rank()), c));
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->size(), static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(torch::equal(Cpu((*out)[r]), torch::full({2, 2}, 1.5f * r)))
            << "entry " << r << " on rank " << c.rank();
      }
    });
  }
}

TEST_P(CommunicatorContractTest, ReduceScatterLeavesEachRankItsReducedChunk) {
  const auto worlds = Worlds({2, 3});
  if (worlds.empty()) GTEST_SKIP() << "needs 2 ranks";
  for (int world : worlds) {
    // Rank r sends chunk j = [100r + 10j, 100r + 10j + 1, 100r + 10j + 2].
    auto input = [](int r, int world) {
      return (torch::arange(3 * world, torch::kFloat) +
              torch::arange(world, torch::kFloat).repeat_interleave(3) * 7 + 100.0f * r)
          .contiguous();
    };
    RunGroup("scatter" + std::to_string(world), world, [&](Communicator& c) {
      at::Tensor sum = torch::zeros({3}), max = torch::full({3}, -1e9f);
      for (int r = 0; r < world; ++r) {
        at::Tensor chunk = input(r, world).slice(0, 3 * c.rank(), 3 * c.rank() + 3);
        sum += chunk;
        max = torch::maximum(max, chunk);
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        at::Tensor out = Dev(torch::zeros({3}), c);
        ASSERT_TRUE(c.ReduceScatter(Dev(input(c.rank(), world), c), &out, op).ok());
        const at::Tensor want = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / world : max;
        EXPECT_TRUE(torch::allclose(Cpu(out), want))
            << ReduceOpName(op) << " on rank " << c.rank() << ": " << Cpu(out) << " want " << want;
      }
      // Mismatched sizes are refused before anything is sent.
      at::Tensor small = Dev(torch::zeros({2}), c);
      absl::Status bad = c.ReduceScatter(Dev(input(c.rank(), world), c), &small, ReduceOp::kSum);
      EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(bad.message().find("chunks"), std::string::npos) << bad;
    });
  }
}

TEST_P(CommunicatorContractTest, BarrierWaitsForTheLastRank) {
  const auto worlds = Worlds({2, 3});
  if (worlds.empty()) GTEST_SKIP() << "needs 2 ranks";
  for (int world : worlds) {
    std::atomic<bool> last_arrived{false};
    RunGroup("barrier" + std::to_string(world), world, [&](Communicator& c) {
      if (c.rank() == world - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        last_arrived = true;
      }
      ASSERT_TRUE(c.Barrier().ok());
      EXPECT_TRUE(last_arrived.load()) << "rank " << c.rank() << " left the barrier early";
    });
  }
}

TEST_P(CommunicatorContractTest, GroupsShareOneStore) {
  if (Worlds({3}).empty()) GTEST_SKIP() << "needs 3 ranks";
  // Threads 0..2 form "all"; threads 0 and 1 also form "pair". Creation and
  // collectives interleave on the same store without crossing groups.
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto all = CreateCommunicator(Options("all", r, 3));
      ASSERT_TRUE(all.ok()) << all.status();
      std::unique_ptr<Communicator> pair;
      if (r < 2) {
        auto p = CreateCommunicator(Options("pair", r, 2));
        ASSERT_TRUE(p.ok()) << p.status();
        pair = std::move(p).value();
        at::Tensor t = Dev(torch::full({2}, 100.0f * (r + 1)), *pair);
        ASSERT_TRUE(pair->AllReduce(t, ReduceOp::kSum).ok());
        EXPECT_TRUE(torch::equal(Cpu(t), torch::full({2}, 300.0f)));
      }
      at::Tensor t = Dev(torch::full({2}, 1.0f * (r + 1)), **all);
      ASSERT_TRUE((*all)->AllReduce(t, ReduceOp::kSum).ok());
      EXPECT_TRUE(torch::equal(Cpu(t), torch::full({2}, 6.0f)));
    });
  }
  for (auto& t : threads) t.join();
}

TEST_P(CommunicatorContractTest, AsyncCollectivesOverlapAndCompleteInOrder) {
  if (Worlds({2}).empty()) GTEST_SKIP() << "needs 2 ranks";
  RunGroup("async", 2, [&](Communicator& c) {
    // Eight buckets in flight at once, as bucketed weight sync issues them.
    std::vector<at::Tensor> buckets;
    std::vector<std::unique_ptr<CollectiveWork>> works;
    for (int b = 0; b < 8; ++b) {
      buckets.push_back(Dev(c.rank() == 0 ? torch::full({1024}, float(b)) : torch::zeros({1024}), c));
      auto w = c.BroadcastAsync(buckets.back(), 0);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(std::move(w).value());
    }
    for (int b = 0; b < 8; ++b) {
      ASSERT_TRUE(works[b]->Wait().ok()) << "bucket " << b;
      EXPECT_TRUE(works[b]->IsCompleted());
      EXPECT_TRUE(works[b]->Wait().ok()) << "a second Wait must repeat the result";
      EXPECT_TRUE(torch::equal(Cpu(buckets[b]), torch::full({1024}, float(b)))) << "bucket " << b;
    }
  });
}

TEST_P(CommunicatorContractTest, SingleRankGroupIsIdentity) {
  if (Worlds({1}).empty()) GTEST_SKIP() << "needs 1 ranks";
  RunGroup("solo", 1, [&](Communicator& c) {
    EXPECT_EQ(c.world_size(), 1);
    at::Tensor t = Dev(RankValues(3), c);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kAvg).ok());
    EXPECT_TRUE(torch::allclose(Cpu(t), RankValues(3)));
    ASSERT_TRUE(c.Barrier().ok());
  });
}

}  // namespace roll::comm_test
