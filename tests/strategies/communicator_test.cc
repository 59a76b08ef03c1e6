#include "roll/strategies/communicator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <thread>

#include "strategies/communicator_contract.h"

namespace roll {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

comm_test::CommBackend GlooBackend() {
  comm_test::CommBackend b;
  b.name = "gloo";
  b.max_ranks = 3;
  b.to_device = [](const at::Tensor& t, int) { return t.clone(); };
  b.to_cpu = [](const at::Tensor& t) { return t; };
  return b;
}

using comm_test::CommunicatorContractTest;
INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorContractTest, ::testing::Values(GlooBackend()),
                         comm_test::PrintBackend);

class GlooCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }

  CommunicatorOptions Options(const std::string& group, int rank, int world,
                              milliseconds timeout = seconds(10)) const {
    CommunicatorOptions o;
    o.store_host = server_->host();
    o.store_port = server_->port();
    o.store_token = server_->token();
    o.group_name = group;
    o.rank = rank;
    o.world_size = world;
    o.timeout = timeout;
    return o;
  }

  // Both ranks of a two-rank group, created concurrently.
  std::pair<std::unique_ptr<Communicator>, std::unique_ptr<Communicator>> Pair(
      const std::string& group, milliseconds timeout = seconds(10)) {
    auto peer = std::async(std::launch::async,
                           [&] { return CreateCommunicator(Options(group, 1, 2, timeout)); });
    auto c0 = CreateCommunicator(Options(group, 0, 2, timeout));
    auto c1 = peer.get();
    EXPECT_TRUE(c0.ok()) << c0.status();
    EXPECT_TRUE(c1.ok()) << c1.status();
    if (!c0.ok() || !c1.ok()) return {};
    return {std::move(c0).value(), std::move(c1).value()};
  }

  std::unique_ptr<StoreServer> server_;
};

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(StoreServerTest, PortZeroPicksDistinctFreePorts) {
  auto a = StoreServer::Start("127.0.0.1", 0);
  auto b = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT((*a)->port(), 0);
  EXPECT_NE((*a)->port(), (*b)->port());
  EXPECT_EQ((*a)->host(), "127.0.0.1");
}

TEST(StoreServerTest, PortInUseIsAnError) {
  auto a = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StoreServer::Start("127.0.0.1", (*a)->port());
  EXPECT_FALSE(b.ok());
  EXPECT_FALSE(StoreServer::Start("127.0.0.1", 70000).ok());
  EXPECT_FALSE(StoreServer::Start("", 0).ok());
}

TEST_F(GlooCommunicatorTest, RejectsBadOptionsNamingTheField) {
  struct Case {
    std::function<void(CommunicatorOptions&)> edit;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {[](CommunicatorOptions& o) { o.backend = "mpi"; }, "unknown backend 'mpi'"},
      {[](CommunicatorOptions& o) { o.group_name = ""; }, "group_name"},
      {[](CommunicatorOptions& o) { o.group_name = "a/b"; }, "group_name"},
      {[](CommunicatorOptions& o) { o.store_port = 0; }, "store_port"},
      {[](CommunicatorOptions& o) { o.world_size = 0; }, "world_size"},
      {[](CommunicatorOptions& o) { o.rank = 2; }, "rank 2"},
      {[](CommunicatorOptions& o) { o.rank = -1; }, "rank -1"},
      {[](CommunicatorOptions& o) { o.timeout = milliseconds(0); }, "timeout"},
      {[](CommunicatorOptions& o) { o.gloo_hostname = ""; }, "gloo_hostname"},
  };
  for (const auto& c : cases) {
    CommunicatorOptions o = Options("bad", 0, 2);
    c.edit(o);
    auto comm = CreateCommunicator(o);
    ASSERT_FALSE(comm.ok()) << c.mentions;
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
    EXPECT_NE(comm.status().message().find(c.mentions), std::string::npos) << comm.status();
  }
}

#ifndef ROLL_WITH_NCCL
TEST_F(GlooCommunicatorTest, NcclNeedsANcclBuild) {
  CommunicatorOptions o = Options("gpu", 0, 1);
  o.backend = "nccl";
  auto comm = CreateCommunicator(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented) << comm.status();
  EXPECT_NE(comm.status().message().find("ROLL_WITH_NCCL"), std::string::npos);
}
#endif

TEST_F(GlooCommunicatorTest, UnknownInterfaceIsInvalidArgument) {
  CommunicatorOptions o = Options("iface", 0, 1);
  o.gloo_interface = "nosuchif0";
  auto comm = CreateCommunicator(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_NE(comm.status().message().find("nosuchif0"), std::string::npos) << comm.status();
}

TEST_F(GlooCommunicatorTest, ExplicitLoopbackInterfaceWorks) {
  CommunicatorOptions o = Options("lo", 0, 1);
  o.gloo_interface = "lo";
  auto comm = CreateCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = torch::ones({3});
  EXPECT_TRUE((*comm)->AllReduce(t, ReduceOp::kSum).ok());
}

TEST_F(GlooCommunicatorTest, MissingPeerFailsWithinTheTimeoutNamingGroupAndRank) {
  const auto start = Clock::now();
  auto comm = CreateCommunicator(Options("lonely", 0, 2, seconds(2)));
  const double took = SecondsSince(start);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("group 'lonely'"), std::string::npos) << comm.status();
  EXPECT_NE(comm.status().message().find("rank(s) 1 of world_size 2"), std::string::npos)
      << comm.status();
  EXPECT_GE(took, 1.9);
  EXPECT_LT(took, 5.0);
}

TEST_F(GlooCommunicatorTest, UnreachableStoreFailsWithinTheTimeout) {
  CommunicatorOptions o = Options("nostore", 0, 1, seconds(2));
  auto spare = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(spare.ok());
  o.store_port = (*spare)->port();
  spare->reset();  // Nobody listens there any more.
  const auto start = Clock::now();
  auto comm = CreateCommunicator(o);
  ASSERT_FALSE(comm.ok());
  // Connecting is tried again until the timeout, not longer.
  EXPECT_GE(SecondsSince(start), 1.9);
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_NE(comm.status().message().find("connecting to the store"), std::string::npos)
      << comm.status();
}

TEST_F(GlooCommunicatorTest, StoreThatStartsListeningWithinTheTimeoutIsReached) {
  // A rank whose first connection fails must not give up at once: the
  // other ranks would wait out the whole timeout for it.
  auto spare = StoreServer::Start("127.0.0.1", 0, "late-token");
  ASSERT_TRUE(spare.ok());
  const int port = (*spare)->port();
  spare->reset();
  CommunicatorOptions o = Options("late", 0, 1, seconds(10));
  o.store_port = port;
  o.store_token = "late-token";
  auto late = std::async(std::launch::async, [port] {
    std::this_thread::sleep_for(milliseconds(500));
    return StoreServer::Start("127.0.0.1", port, "late-token");
  });
  auto comm = CreateCommunicator(o);
  auto store = late.get();
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto t = torch::ones({4});
  ASSERT_TRUE((*comm)->AllReduce(t, ReduceOp::kSum).ok());
  EXPECT_TRUE(torch::equal(t, torch::ones({4})));
}

TEST_F(GlooCommunicatorTest, ReusedGroupNameIsRejected) {
  auto first = CreateCommunicator(Options("once", 0, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = CreateCommunicator(Options("once", 0, 1));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(again.status().message().find("unique per store"), std::string::npos);
}

TEST_F(GlooCommunicatorTest, StalledPeerTimesOutThenTheGroupIsBroken) {
  auto [c0, c1] = Pair("stall", seconds(2));
  ASSERT_TRUE(c0 && c1);
  // Rank 1 is alive but never issues the allreduce.
  at::Tensor t = torch::ones({16});
  const auto start = Clock::now();
  absl::Status s = c0->AllReduce(t, ReduceOp::kSum, milliseconds(1000));
  const double took = SecondsSince(start);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("group 'stall' (rank 0 of 2)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("allreduce(sum)"), std::string::npos) << s;
  EXPECT_LT(took, 3.0);
  // Ranks disagree on the sequence now: later calls fail fast.
  absl::Status later = c0->Barrier();
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_NE(later.message().find("broken"), std::string::npos) << later;
}

TEST_F(GlooCommunicatorTest, PeerLeavingMidCollectiveFailsFast) {
  auto [c0, c1] = Pair("leaver", seconds(5));
  ASSERT_TRUE(c0 && c1);
  at::Tensor t = torch::ones({16});
  auto work = c0->AllReduceAsync(t, ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  c1.reset();  // Closes rank 1's connections.
  const auto start = Clock::now();
  absl::Status s = (*work)->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("group 'leaver'"), std::string::npos) << s;
  EXPECT_LT(SecondsSince(start), 6.0);
}

TEST_F(GlooCommunicatorTest, BadTensorsAreRejectedWithoutBreakingTheGroup) {
  auto [c0, c1] = Pair("inputs");
  ASSERT_TRUE(c0 && c1);
  at::Tensor strided = torch::ones({4, 4}).t();
  at::Tensor undefined;
  at::Tensor bf16 = torch::ones({4}, torch::kBFloat16);
  at::Tensor ints = torch::ones({4}, torch::kInt32);
  struct Case {
    absl::Status status;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {c0->AllReduce(strided, ReduceOp::kSum), "contiguous"},
      {c0->AllReduce(undefined, ReduceOp::kSum), "undefined"},
      {c0->AllReduce(bf16, ReduceOp::kSum), "BFloat16"},
      {c0->AllReduce(ints, ReduceOp::kAvg), "floating-point"},
      {c0->Broadcast(ints, 2), "root is outside [0, 2)"},
      {c0->Broadcast(ints, -1), "root is outside"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_NE(c.status.message().find(c.mentions), std::string::npos) << c.status;
    EXPECT_NE(c.status.message().find("group 'inputs'"), std::string::npos) << c.status;
  }
  // Nothing was issued, so the ranks are still in step.
  at::Tensor a = torch::full({2}, 1.0f), b = torch::full({2}, 2.0f);
  auto peer = std::async(std::launch::async, [&] { return c1->AllReduce(b, ReduceOp::kSum); });
  EXPECT_TRUE(c0->AllReduce(a, ReduceOp::kSum).ok());
  EXPECT_TRUE(peer.get().ok());
  EXPECT_TRUE(torch::equal(a, torch::full({2}, 3.0f)));
}

TEST_F(GlooCommunicatorTest, ReportsIdentity) {
  auto [c0, c1] = Pair("ident");
  ASSERT_TRUE(c0 && c1);
  EXPECT_EQ(c0->rank(), 0);
  EXPECT_EQ(c1->rank(), 1);
  EXPECT_EQ(c1->world_size(), 2);
  EXPECT_EQ(c0->group_name(), "ident");
  EXPECT_EQ(c0->backend(), "gloo");
  EXPECT_EQ(ReduceOpName(ReduceOp::kAvg), "avg");
}

}  // namespace
}  // namespace roll
