// The runtime end to end: a Controller starts real `roll worker` processes and
// calls them in every dispatch mode; workers are killed, hung and orphaned.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <fstream>

#include "testing/processes.h"
#include "roll/controller/controller.h"
#include "roll/worker/debug_worker.h"
#include "rpc/rpc_util.h"
#include "worker.grpc.pb.h"

namespace roll {
namespace {

using ::roll::testing::ProcessAlive;
using ::roll::testing::WaitGone;

std::vector<std::string> Col(const Batch& b, const std::string& name) {
  auto c = b.Column(name);
  return c.ok() ? **c : std::vector<std::string>{"<missing " + name + ">"};
}

PipelineConfig TestConfig(int world_size, const std::string& extra = "") {
  const std::string yaml = absl::StrCat("exp_name: cluster_test\noutput_dir: ", testing::TempDir("cluster"),
                                        "\nworkers:\n  worker_cls: debug\n  world_size: ", world_size,
                                        "\nruntime:\n  worker_binary: ", testing::RollBinary(),
                                        "\n  health_check_interval_s: 0.2\n  worker_timeout_s: 1.5\n", extra);
  LoadOptions load;
  load.extra_roles = {"workers"};
  auto config = ParsePipelineConfig(yaml, "<test>", {}, load);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

class ClusterTest : public ::testing::Test {
 protected:
  void Start(int world_size, const std::string& extra = "") {
    ControllerOptions options;
    options.load.extra_roles = {"workers"};
    auto controller = Controller::Create(TestConfig(world_size, extra), options);
    ASSERT_TRUE(controller.ok()) << controller.status();
    controller_ = *std::move(controller);
    auto cluster = controller_->StartCluster<DebugApi>("workers");
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Cluster<DebugApi>> cluster_;
};

TEST_F(ClusterTest, OneToAllSendsTheSameBatchToEveryRank) {
  Start(3);
  Batch in;
  in.SetTensor("x", at::arange(4, at::kFloat));
  in.SetColumn("prompt", {"a", "b", "c", "d"});
  auto replies = cluster_->Call(debug::kEcho, in).Replies();
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 3u);
  for (const Batch& r : *replies) {
    EXPECT_TRUE(at::equal(*r.Tensor("x"), *in.Tensor("x")));
    EXPECT_EQ(Col(r, "prompt"), (std::vector<std::string>{"a", "b", "c", "d"}));
  }
}

TEST_F(ClusterTest, AllToAllSendsOneBatchPerRank) {
  Start(3);
  std::vector<Batch> inputs(3);
  for (int r = 0; r < 3; ++r) inputs[r].SetColumn("tag", {absl::StrCat("for-", r)});
  auto replies = cluster_->CallEach(debug::kWhoAmI, inputs).Replies();
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(Col((*replies)[r], "tag")[0], absl::StrCat("for-", r));
    EXPECT_EQ(Col((*replies)[r], "rank")[0], std::to_string(r));
  }
  // The wrong number of inputs is refused before anything is sent.
  absl::Status wrong = cluster_->CallEach(debug::kWhoAmI, std::vector<Batch>(2)).Wait();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("needs 3 inputs"), std::string::npos) << wrong;
}

TEST_F(ClusterTest, DataParallelSplitsAndConcatenatesInRankOrder) {
  Start(3);
  Batch in;
  in.SetTensor("x", at::arange(7, at::kFloat));
  auto out = cluster_->Call(debug::kDouble, in).Get();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(at::equal(*out->Tensor("x"), at::arange(7, at::kFloat) * 2));
  // 7 over 3 ranks: 3, 2, 2.
  EXPECT_EQ(Col(*out, "rank"), (std::vector<std::string>{"0", "0", "0", "1", "1", "2", "2"}));
}

TEST_F(ClusterTest, RankZeroMethodsRunOnRankZeroOnly) {
  Start(2);
  CallHandle h = cluster_->Call(debug::kLeader, Batch());
  ASSERT_TRUE(h.Wait().ok());
  EXPECT_EQ(h.ranks(), std::vector<int>{0});
  auto out = h.Get();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->MetaOr("rank", "?"), "0");
}

TEST_F(ClusterTest, MethodErrorNamesTheRankAndKeepsOtherStatuses) {
  Start(3);
  Batch in;
  in.SetMeta("ranks", "1");
  in.SetMeta("message", "bad sample 17");
  CallHandle h = cluster_->Call(debug::kFail, in);
  absl::Status s = h.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cluster 'workers' rank 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("bad sample 17"), std::string::npos) << s;
  // Wait for every rank, then look at each.
  EXPECT_EQ(h.WaitAll(absl::Seconds(10)).code(), absl::StatusCode::kInvalidArgument);
  auto st = h.RankStatus();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_FALSE(st[1].ok());
  EXPECT_TRUE(st[2].ok()) << st[2];
  // The worker survives its method's error.
  EXPECT_TRUE(cluster_->Call(debug::kNoop, Batch()).Wait().ok());
}

TEST_F(ClusterTest, UnknownMethodListsTheKnownOnes) {
  Start(1);
  absl::Status s = cluster_->Call(Method<DebugApi>{"no_such_method"}, Batch()).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("echo"), std::string::npos) << s;
}

TEST_F(ClusterTest, KillNineMidCallFailsThePendingCallNamingTheWorker) {
  Start(2);
  Batch in;
  in.SetMeta("ms", "20000");
  CallHandle h = cluster_->Call(debug::kSleep, in);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const pid_t victim = cluster_->workers()[1].pid;
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto t0 = std::chrono::steady_clock::now();
  absl::Status s = h.Wait(absl::Seconds(5));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 3.0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("pid ", victim)), std::string::npos) << s;
  EXPECT_NE(s.message().find("signal 9"), std::string::npos) << s;
  // Later calls fail at once, naming the dead worker.
  absl::Status later = cluster_->Call(debug::kNoop, Batch()).Wait(absl::Seconds(2));
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable) << later;
  EXPECT_NE(later.message().find("not alive"), std::string::npos) << later;
  EXPECT_FALSE(cluster_->workers()[1].alive);
}

// One dead rank is replaced in place: a new process with the same rank
// answers calls, the other rank is the same process throughout, and a call
// that was running on the healthy rank while its peer died completes.
TEST_F(ClusterTest, RestartWorkerReplacesOneRankAndLeavesTheOthersRunning) {
  Start(2);
  const pid_t victim = cluster_->workers()[0].pid;
  const pid_t survivor = cluster_->workers()[1].pid;
  Batch in;
  in.SetMeta("ms", "1500");
  CallHandle running = cluster_->CallEach(debug::kSleep, {Batch(), in});
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  for (int i = 0; i < 100 && cluster_->workers()[0].alive; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(cluster_->workers()[0].alive);
  ASSERT_TRUE(controller_->RestartWorker(*cluster_, 0).ok());
  const std::vector<WorkerInfo> after = cluster_->workers();
  EXPECT_TRUE(after[0].alive);
  EXPECT_NE(after[0].pid, victim);
  EXPECT_EQ(after[1].pid, survivor);
  EXPECT_TRUE(ProcessAlive(survivor));
  // The healthy rank's call went on; the dead rank's failed.
  running.WaitAll(absl::Seconds(10)).IgnoreError();
  const std::vector<absl::Status> status = running.RankStatus();
  EXPECT_FALSE(status[0].ok());
  EXPECT_NE(status[0].message().find(absl::StrCat("pid ", victim)), std::string::npos)
      << "the failure names the process the call went to: " << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
  // Both ranks answer, each with its own rank.
  auto who = cluster_->CallEach(debug::kWhoAmI, {Batch(), Batch()}).Replies();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(Col((*who)[0], "rank"), std::vector<std::string>{"0"});
  EXPECT_EQ(Col((*who)[1], "rank"), std::vector<std::string>{"1"});
  // The monitor watches the new process: killing it is noticed too.
  ASSERT_EQ(kill(after[0].pid, SIGKILL), 0);
  for (int i = 0; i < 100 && cluster_->workers()[0].alive; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(cluster_->workers()[0].alive);
  EXPECT_TRUE(cluster_->workers()[1].alive);
  EXPECT_FALSE(controller_->RestartWorker(*cluster_, 2).ok());
}

TEST_F(ClusterTest, HungWorkerIsDetectedWithinTheWorkerTimeout) {
  Start(2);
  Batch in;
  in.SetMeta("ms", "20000");
  CallHandle h = cluster_->Call(debug::kSleep, in);
  const pid_t victim = cluster_->workers()[0].pid;
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  auto t0 = std::chrono::steady_clock::now();
  absl::Status s = h.Wait(absl::Seconds(10));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // worker_timeout_s is 1.5 and health checks run every 0.2 s.
  EXPECT_LT(waited, 4.0);
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no health reply"), std::string::npos) << s;
  EXPECT_TRUE(WaitGone(victim, 5.0)) << "a hung worker is killed, not left behind";
}

TEST_F(ClusterTest, LongMethodIsNotMistakenForAHungWorker) {
  Start(2);  // worker_timeout_s is 1.5: health must be answered while a method runs
  Batch in;
  in.SetMeta("ms", "3000");
  CallHandle h = cluster_->Call(debug::kSleep, in);
  // Calls queue behind the running one and run in order.
  CallHandle after = cluster_->Call(debug::kEcho, in);
  EXPECT_TRUE(h.Wait(absl::Seconds(20)).ok()) << h.Wait();
  EXPECT_TRUE(after.Wait(absl::Seconds(20)).ok());
  for (const auto& w : cluster_->workers()) EXPECT_TRUE(w.alive) << w.death_reason;
}

TEST_F(ClusterTest, CallTimeoutIsADeadlineError) {
  Start(1);
  Batch in;
  in.SetMeta("ms", "3000");
  CallOptions options;
  options.timeout = absl::Milliseconds(300);
  absl::Status s = cluster_->Call(debug::kSleep, in, options).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s;
}

TEST_F(ClusterTest, CallsWithoutTheTokenAreRefused) {
  Start(1);
  const std::string address = cluster_->workers()[0].address;
  auto stub = rpc::Worker::NewStub(rpc::MakeChannel(address));
  for (const std::string token : {std::string(), std::string("wrong-token")}) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata(rpc::kTokenKey, token);
    rpc::CallRequest req;
    req.set_method("echo");
    rpc::CallReply reply;
    grpc::Status s = stub->Call(&ctx, req, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
  }
  grpc::ClientContext ctx;
  rpc::ShutdownRequest req;
  rpc::ShutdownReply reply;
  EXPECT_EQ(stub->Shutdown(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(cluster_->Call(debug::kNoop, Batch()).Wait().ok());
}

TEST_F(ClusterTest, MalformedBatchIsRefusedAndTheWorkerLives) {
  Start(1);
  auto stub = rpc::Worker::NewStub(rpc::MakeChannel(cluster_->workers()[0].address));
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, controller_->token(), absl::Seconds(5));
  rpc::CallRequest req;
  req.set_method("echo");
  req.set_batch("this is not a batch");
  rpc::CallReply reply;
  grpc::Status s = stub->Call(&ctx, req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(cluster_->Call(debug::kNoop, Batch()).Wait().ok());
}

TEST_F(ClusterTest, ShutdownLeavesNoProcessBehind) {
  Start(3);
  std::vector<pid_t> pids;
  for (const auto& w : cluster_->workers()) pids.push_back(w.pid);
  ASSERT_TRUE(cluster_->Shutdown().ok());
  for (pid_t p : pids) EXPECT_FALSE(ProcessAlive(p)) << p;
  // Each worker wrote its own log, tagged with cluster/rank.
  std::ifstream log(cluster_->workers()[2].log_path);
  std::string content((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(content.find("[workers/2]"), std::string::npos) << content;
}

TEST(ClusterStartTest, WorkerThatCannotStartIsReportedWithItsLog) {
  const std::string yaml = absl::StrCat("exp_name: t\noutput_dir: ", testing::TempDir("badtype"),
                                        "\nworkers:\n  worker_cls: no_such_type\n  world_size: 2\nruntime:\n",
                                        "  worker_binary: ", testing::RollBinary(), "\n");
  LoadOptions load;
  load.extra_roles = {"workers"};
  auto config = ParsePipelineConfig(yaml, "<test>", {}, load);
  ASSERT_TRUE(config.ok()) << config.status();
  ControllerOptions options;
  options.load = load;
  auto controller = Controller::Create(*config, options);
  ASSERT_TRUE(controller.ok());
  auto cluster = (*controller)->StartCluster("workers", "");
  ASSERT_FALSE(cluster.ok());
  EXPECT_NE(cluster.status().message().find("exited with code 1 before registering"), std::string::npos)
      << cluster.status();
  EXPECT_NE(cluster.status().message().find("unknown worker type 'no_such_type'"), std::string::npos)
      << cluster.status();
}

// The controller runs in a child process that is then SIGKILLed: its workers
// must exit by themselves.
TEST(ControllerDeathTest, WorkersExitWhenTheControllerDies) {
  const std::string dir = testing::TempDir("ctrl-death");
  const std::string pid_file = dir + "/pids";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ControllerOptions options;
    options.load.extra_roles = {"workers"};
    auto controller = Controller::Create(TestConfig(2), options);
    if (!controller.ok()) _exit(3);
    auto cluster = (*controller)->StartCluster<DebugApi>("workers");
    if (!cluster.ok()) _exit(4);
    {
      std::ofstream out(pid_file + ".tmp");
      for (const auto& w : (*cluster)->workers()) out << w.pid << "\n";
    }
    std::rename((pid_file + ".tmp").c_str(), pid_file.c_str());
    pause();
    _exit(0);
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < 600 && pids.empty(); ++i) {
    std::ifstream in(pid_file);
    pid_t p;
    while (in >> p) pids.push_back(p);
    if (pids.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t p : pids) ASSERT_TRUE(ProcessAlive(p));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (pid_t p : pids) EXPECT_TRUE(WaitGone(p, 5.0)) << "worker " << p << " outlived its controller";
}

}  // namespace
}  // namespace roll
