// Data-parallel training across real processes: a child process hosts the
// store (as the controller does) and the parent forks two ranks that each
// train on half of a batch over Gloo. Their parameters after the optimizer
// steps must equal those of one process training on the whole batch. The
// parent does no LibTorch compute and starts no gRPC before forking, so
// forking it is safe.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "roll/models/safetensors.h"
#include "roll/strategies/communicator.h"
#include "strategies/fork_util.h"
#include "strategies/train_test_util.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using ::roll::testing::Child;
using ::roll::testing::Spawn;

// Waits for the child (killing it at the deadline); returns its exit code
// (-1 when killed) and fills `report`.
int Reap(const Child& c, Clock::time_point deadline, std::string* report) {
  int status = 0;
  while (waitpid(c.pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      status = -1;
      break;
    }
    usleep(20 * 1000);
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(c.read_fd, buf, sizeof(buf))) > 0) report->append(buf, n);
  close(c.read_fd);
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TrainStrategyOptions DdpOptions() {
  TrainStrategyOptions o = train_test::BaseOptions();
  o.micro_batch_size = 2;  // accumulation inside each rank as well
  o.max_grad_norm = 0.5;   // clipping must see the all-reduced gradient
  o.bucket_bytes = 4096;   // several buckets in flight
  return o;
}

// Rows 0-2 (16 loss tokens) on rank 0, rows 3-7 (23) on rank 1: uneven
// shares, so averaging per rank would give another update.
const std::vector<int64_t> kRank0Rows = {0, 1, 2};
const std::vector<int64_t> kRank1Rows = {3, 4, 5, 6, 7};
constexpr int kSteps = 2;

TEST(DdpIntegrationTest, TwoRanksOnHalvesEqualOneRankOnTheWholeBatch) {
  auto server = ::roll::testing::StoreProcess::Start();
  ASSERT_TRUE(server != nullptr);
  const int port = server->port();
  const fs::path dir = fs::temp_directory_path() / ("roll_ddp_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  std::vector<Child> children;
  for (int rank = 0; rank < 2; ++rank) {
    children.push_back(Spawn([&, rank](std::string* report) -> int {
      at::set_num_threads(1);
      CommunicatorOptions co;
      co.store_port = port;
      co.store_token = server->token();
      co.group_name = "ddp_test";
      co.rank = rank;
      co.world_size = 2;
      co.timeout = std::chrono::seconds(60);
      auto comm = CreateCommunicator(co);
      if (!comm.ok()) {
        *report += comm.status().ToString();
        return 2;
      }
      // Rank 1 starts from other weights: Create must broadcast rank 0's.
      auto s = TrainStrategy::Create(train_test::TinyModel(rank == 0 ? 7 : 8), DdpOptions(), comm->get());
      if (!s.ok()) {
        *report += s.status().ToString();
        return 3;
      }
      auto share = train_test::StandardBatch().Select(rank == 0 ? kRank0Rows : kRank1Rows);
      if (!share.ok()) return 4;
      for (int i = 0; i < kSteps; ++i) {
        auto r = (*s)->TrainStep(*share, train_test::SftLoss());
        if (!r.ok()) {
          *report += r.status().ToString();
          return 5;
        }
        *report += absl::StrCat(r->metrics.at("loss"), " ", r->metrics.at("grad_norm"), " ",
                                r->metrics.at("tokens"), " ", r->metrics.at("nll_tokens"), "\n");
      }
      absl::Status saved = SaveSafetensors((dir / absl::StrCat("rank", rank, ".safetensors")).string(),
                                           (*s)->model().NamedParameters());
      // Every rank calls Save; rank 0 writes the replicated state.
      if (saved.ok()) saved = (*s)->Save((dir / "checkpoint").string());
      if (!saved.ok()) {
        *report += saved.ToString();
        return 6;
      }
      return 0;
    }));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  std::vector<std::string> reports(2);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(Reap(children[rank], deadline, &reports[rank]), 0) << "rank " << rank << ": " << reports[rank];
  }

  // The reference: one process, the whole batch, same micro-batch size.
  auto single = train_test::MakeStrategy(DdpOptions());
  std::vector<std::string> expected_lines;
  for (int i = 0; i < kSteps; ++i) {
    auto r = single->TrainStep(train_test::StandardBatch(), train_test::SftLoss());
    ASSERT_TRUE(r.ok()) << r.status();
    expected_lines.push_back(absl::StrCat(r->metrics.at("loss"), " ", r->metrics.at("grad_norm")));
    EXPECT_GT(r->metrics.at("grad_norm"), 0.5);  // clipping was active
  }
  const auto reference = train_test::Snapshot(single->model());
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> lines = absl::StrSplit(reports[rank], '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << reports[rank];
    for (int i = 0; i < kSteps; ++i) {
      std::vector<std::string> got = absl::StrSplit(lines[i], ' ');
      std::vector<std::string> want = absl::StrSplit(expected_lines[i], ' ');
      double g0, g1, w0, w1, tokens, nll_tokens;
      ASSERT_TRUE(absl::SimpleAtod(got[0], &g0) && absl::SimpleAtod(got[1], &g1) &&
                  absl::SimpleAtod(got[2], &tokens) && absl::SimpleAtod(got[3], &nll_tokens) &&
                  absl::SimpleAtod(want[0], &w0) && absl::SimpleAtod(want[1], &w1));
      EXPECT_NEAR(g0, w0, 1e-5) << "rank " << rank << " step " << i << ": loss";
      EXPECT_NEAR(g1, w1, 1e-5 * w1) << "rank " << rank << " step " << i << ": grad norm";
      EXPECT_EQ(tokens, 39) << "global loss tokens";
      EXPECT_EQ(nll_tokens, 39) << "metrics are summed over ranks";
    }
    auto file = SafetensorsFile::Open((dir / absl::StrCat("rank", rank, ".safetensors")).string());
    ASSERT_TRUE(file.ok()) << file.status();
    std::map<std::string, at::Tensor> got;
    for (const std::string& name : (*file)->names()) got[name] = *(*file)->Load(name);
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_LT(train_test::MaxDiff(reference, got), 1e-5) << "rank " << rank;
  }
  // Rank 0 wrote the trainer checkpoint; it resumes into a single process.
  auto resumed = train_test::MakeStrategy(DdpOptions(), 1);
  ASSERT_TRUE(resumed->Load((dir / "checkpoint").string()).ok());
  EXPECT_EQ(resumed->step(), kSteps);
  EXPECT_LT(train_test::MaxDiff(reference, train_test::Snapshot(resumed->model())), 1e-5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace roll
