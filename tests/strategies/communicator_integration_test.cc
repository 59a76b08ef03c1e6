// Ranks as real processes: a child process hosts the store (as the
// controller does) and the parent forks one child per rank, so rendezvous
// and collectives cross process boundaries over loopback TCP. The parent
// touches neither LibTorch's compute nor gRPC, so forking it is safe.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "roll/strategies/communicator.h"
#include "strategies/fork_util.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

struct ChildResult {
  int exit_code = -1;  // -1: killed at the deadline or by a signal
  std::string report;  // what the child wrote through its pipe
};

using ::roll::testing::Child;
using ::roll::testing::Spawn;

// Reaps every child, killing those still running at `deadline`.
std::vector<ChildResult> WaitAll(std::vector<Child> children, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  std::vector<ChildResult> results(children.size());
  std::vector<bool> done(children.size(), false);
  size_t remaining = children.size();
  while (remaining > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      pid_t r = waitpid(children[i].pid, &status, Clock::now() >= deadline ? 0 : WNOHANG);
      if (r == 0 && Clock::now() >= deadline) {
        kill(children[i].pid, SIGKILL);
        waitpid(children[i].pid, &status, 0);
        r = children[i].pid;
      }
      if (r == children[i].pid || r < 0) {
        done[i] = true;
        --remaining;
        results[i].exit_code = (r > 0 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
      }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < children.size(); ++i) {
    char buf[4096];
    ssize_t n;
    while ((n = read(children[i].read_fd, buf, sizeof(buf))) > 0) results[i].report.append(buf, n);
    close(children[i].read_fd);
  }
  return results;
}

// Child-side failure: note why, exit non-zero.
int Fail(std::string* report, std::string_view why) {
  report->append(why);
  return 1;
}

class CommunicatorProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ::roll::testing::StoreProcess::Start();
    ASSERT_TRUE(server_ != nullptr);
  }

  CommunicatorOptions Options(const std::string& group, int rank, int world,
                              std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    CommunicatorOptions o;
    o.store_port = server_->port();
    o.store_token = server_->token();
    o.group_name = group;
    o.rank = rank;
    o.world_size = world;
    o.timeout = timeout;
    return o;
  }

  // Runs `body(rank, comm, report)` in `world` processes; expects exit 0.
  std::vector<ChildResult> RunRanks(
      const std::string& group, int world,
      const std::function<int(int, Communicator&, std::string*)>& body,
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::vector<Child> children;
    for (int r = 0; r < world; ++r) {
      CommunicatorOptions o = Options(group, r, world, timeout);
      children.push_back(Spawn([o, r, &body](std::string* report) {
        auto comm = CreateCommunicator(o);
        if (!comm.ok()) {
          *report += comm.status().ToString();
          return 2;
        }
        return body(r, **comm, report);
      }));
    }
    auto results = WaitAll(std::move(children), std::chrono::seconds(60));
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].report;
    }
    return results;
  }

  std::unique_ptr<::roll::testing::StoreProcess> server_;
};

TEST_F(CommunicatorProcessTest, CollectivesAcrossThreeProcesses) {
  RunRanks("procs", 3, [](int rank, Communicator& c, std::string* report) {
    at::Tensor t = torch::full({5}, float(rank + 1));
    if (absl::Status s = c.AllReduce(t, ReduceOp::kSum); !s.ok()) return Fail(report, s.ToString());
    if (!torch::equal(t, torch::full({5}, 6.0f))) return Fail(report, "wrong sum");

    at::Tensor b = rank == 2 ? torch::arange(7, torch::kFloat) : torch::zeros({7});
    if (absl::Status s = c.Broadcast(b, 2); !s.ok()) return Fail(report, s.ToString());
    if (!torch::equal(b, torch::arange(7, torch::kFloat))) return Fail(report, "wrong broadcast");

    auto all = c.AllGather(torch::full({2}, int64_t{rank * 11}, torch::kInt64));
    if (!all.ok()) return Fail(report, all.status().ToString());
    for (int r = 0; r < 3; ++r) {
      if (!torch::equal((*all)[r], torch::full({2}, int64_t{r * 11}, torch::kInt64))) {
        return Fail(report, absl::StrCat("wrong allgather entry ", r));
      }
    }
    if (absl::Status s = c.Barrier(); !s.ok()) return Fail(report, s.ToString());
    return 0;
  });
}

TEST_F(CommunicatorProcessTest, PeerProcessExitFailsTheCollectiveInTime) {
  auto results = RunRanks(
      "exiting",
      2,
      [](int rank, Communicator& c, std::string* report) {
        // Joining made SIGPIPE harmless: a write to the dead peer's socket
        // fails the collective instead of killing this rank.
        struct sigaction now {};
        if (sigaction(SIGPIPE, nullptr, &now) != 0 || now.sa_handler != SIG_IGN) {
          return Fail(report, "SIGPIPE is not ignored after CreateCommunicator");
        }
        if (absl::Status s = c.Barrier(); !s.ok()) return Fail(report, s.ToString());
        if (rank == 1) _exit(0);  // Dies without ever issuing the allreduce.
        at::Tensor t = torch::ones({1024});
        const auto start = Clock::now();
        absl::Status s = c.AllReduce(t, ReduceOp::kSum);
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        *report += s.ToString();
        if (s.ok()) return 1;
        if (s.message().find("group 'exiting' (rank 0 of 2)") == std::string::npos) return 1;
        return took < 5.0 ? 0 : 1;
      },
      std::chrono::seconds(3));
  std::printf("rank 0 after its peer exited: %s\n", results[0].report.c_str());
}

TEST_F(CommunicatorProcessTest, MissingProcessTimesOutNamingIt) {
  std::vector<Child> children;
  CommunicatorOptions o = Options("half", 0, 2, std::chrono::seconds(2));
  children.push_back(Spawn([o](std::string* report) {
    auto comm = CreateCommunicator(o);
    *report += comm.status().ToString();
    return !comm.ok() && absl::IsDeadlineExceeded(comm.status()) ? 0 : 1;
  }));
  auto results = WaitAll(std::move(children), std::chrono::seconds(10));
  EXPECT_EQ(results[0].exit_code, 0) << results[0].report;
  EXPECT_NE(results[0].report.find("group 'half'"), std::string::npos) << results[0].report;
  EXPECT_NE(results[0].report.find("rank(s) 1"), std::string::npos) << results[0].report;
  std::printf("what a controller sees: %s\n", results[0].report.c_str());
}

// Bandwidth numbers for the report: printed and recorded as properties.
// The assertions check correctness of the data that moved.
TEST_F(CommunicatorProcessTest, AllReduce16MBBandwidthTwoProcesses) {
  constexpr int64_t kFloats = 4 * 1024 * 1024;  // 16 MiB
  constexpr int kIters = 10;
  auto results = RunRanks("bw_allreduce", 2, [&](int rank, Communicator& c, std::string* report) {
    at::Tensor t = torch::full({kFloats}, 1.0f + rank);
    if (!c.AllReduce(t, ReduceOp::kSum).ok()) return 1;  // warm-up: t == 3
    if (!c.Barrier().ok()) return 1;
    const auto start = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      if (absl::Status s = c.AllReduce(t, ReduceOp::kSum); !s.ok()) return Fail(report, s.ToString());
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    // Both ranks hold the same value, so each allreduce doubles it.
    if (!torch::equal(t, torch::full({kFloats}, 3.0f * (1 << kIters)))) return Fail(report, "wrong");
    if (rank == 0) {
      *report += absl::StrCat(kFloats * 4.0 * kIters / secs / 1e9);
    }
    return 0;
  });
  if (results[0].exit_code == 0) {
    std::printf("gloo allreduce 16 MiB float32, 2 processes, loopback: %s GB/s (algbw = busbw for n=2)\n",
                results[0].report.c_str());
    RecordProperty("allreduce_16MiB_GBps", results[0].report);
  }
}

TEST_F(CommunicatorProcessTest, Broadcast64MBToTwoReceiversBandwidth) {
  constexpr int64_t kFloats = 16 * 1024 * 1024;  // 64 MiB
  constexpr int kIters = 5;
  auto results = RunRanks("bw_bcast", 3, [&](int rank, Communicator& c, std::string* report) {
    at::Tensor t = rank == 0 ? torch::arange(kFloats, torch::kFloat) : torch::zeros({kFloats});
    if (!c.Broadcast(t, 0).ok()) return 1;  // warm-up
    if (!c.Barrier().ok()) return 1;
    const auto start = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      if (absl::Status s = c.Broadcast(t, 0); !s.ok()) return Fail(report, s.ToString());
    }
    if (!c.Barrier().ok()) return 1;
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (!torch::equal(t, torch::arange(kFloats, torch::kFloat))) return Fail(report, "wrong data");
    if (rank == 0) *report += absl::StrCat(kFloats * 4.0 * kIters / secs / 1e9);
    return 0;
  });
  if (results[0].exit_code == 0) {
    std::printf("gloo broadcast 64 MiB float32, root + 2 receivers, loopback: %s GB/s per receiver\n",
                results[0].report.c_str());
    RecordProperty("broadcast_64MiB_GBps", results[0].report);
  }
}

}  // namespace
}  // namespace roll
