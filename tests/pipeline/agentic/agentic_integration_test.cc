// The agentic pipeline end to end, as users run it: `roll sft` makes a tiny
// base model from random play, `roll run` trains it on FrozenLake episodes
// with real generation, training and environment workers. Checks the
// metrics contract, config errors before any worker starts, and that a
// killed environment worker loses no trajectory.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <thread>
#include <vector>
#include <chrono>
#include <cstdlib>

#include "testing/runs.h"
#include "testing/files.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using testing::AgenticConfig;
using testing::ReadMetrics;
using testing::RollBinary;
using testing::Shell;

class AgenticTest : public ::testing::Test {
 protected:
  // One base model for every test of this file (each runs in its own
  // process): the first to get here makes it, aside, and renames it into
  // place; a later one finds it.
  static void SetUpTestSuite() {
    const std::string shared = std::string(ROLL_BINARY_DIR) + "/agentic-test-base";
    if (!fs::exists(shared + "/base/config.json")) {
      const std::string aside = testing::TempDir("agentic-base");
      auto r = Shell(RollBinary() + " sft " + AgenticConfig() + " output_dir=" + aside + " sft.output_dir=" + aside +
                     "/base sft.max_steps=80 sft.warmup_steps=10 data.num_train=300 data.num_val=16 "
                     "train_env_manager.max_steps=4 runtime.threads_per_worker=1");
      if (r.code != 0) {
        model_ = new std::string("ERROR: " + r.out);
        sft_out_ = new std::string(r.out);
        return;
      }
      std::ofstream(aside + "/sft.out") << r.out;
      std::error_code ec;
      fs::rename(aside, shared, ec);  // another process may have won: use its model
      if (ec) fs::remove_all(aside);
    }
    model_ = new std::string(shared + "/base");
    sft_out_ = new std::string(testing::ReadFile(shared + "/sft.out"));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete sft_out_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }

 public:
  // `env`: assignments put before the command (e.g. "TMPDIR=/x ").
  testing::ShellResult Run(const std::string& out, const std::string& overrides, const std::string& env = "") {
    return Shell(env + RollBinary() + " run " + AgenticConfig() + " --quiet output_dir=" + out +
                 " actor_train.model_args.model_name_or_path=" + *model_ +
                 " actor_infer.model_args.model_name_or_path=" + *model_ + " train_env_manager.max_steps=4 " +
                 overrides);
  }

  static std::string* model_;
  static std::string* sft_out_;
};
std::string* AgenticTest::model_ = nullptr;
std::string* AgenticTest::sft_out_ = nullptr;

TEST_F(AgenticTest, SftOnRandomPlayLearnsTheAnswerFormat) {
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(*model_) / f)) << f;
  }
  // 80 steps teach the format: most greedy first answers name a move.
  const size_t at = sft_out_->find("\"val_valid_moves_after\": ");
  ASSERT_NE(at, std::string::npos) << *sft_out_;
  EXPECT_GT(std::stod(sft_out_->substr(at + 25)), 0.5) << *sft_out_;
}

TEST_F(AgenticTest, DemonstrationOptionsAreRefusedOnAnRlvrConfig) {
  const std::string out = testing::TempDir("sft-env-options");
  auto r = Shell(RollBinary() + " sft " + testing::RlvrBaseConfig() + " output_dir=" + out +
                 " \"sft.env_options=[size=3]\"");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sft.env_options applies to agentic configs"), std::string::npos) << r.out;
}

TEST_F(AgenticTest, MetricsContractOfAnAgenticRun) {
  const std::string out = testing::TempDir("agentic-run");
  auto r = Run(out, "max_steps=2 eval_steps=2 rollout_batch_size=16 val_batch_size=16 "
                    "actor_train.training_args.gradient_accumulation_steps=4 "
                    "train_env_manager.tags=[lake]");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_EQ(m.size(), 3u) << "steps 0, 1, 2";
  for (int64_t s : {0, 2}) {
    for (const char* k : {"val/success_rate", "val/lake/success_rate", "val/return_mean", "val/steps_mean",
                          "val/valid_action_rate"}) {
      EXPECT_TRUE(m[s].contains(k)) << "step " << s << " lacks " << k;
    }
    EXPECT_LE(m[s]["val/steps_mean"].get<double>(), 4.0);
  }
  for (int64_t s : {1, 2}) {
    for (const char* k : {"train/success_rate", "train/lake/success_rate", "train/return_mean",
                          "train/effective_action_rate", "train/response_length", "rollout/env_steps",
                          "rollout/env_steps_per_s", "rollout/gen_tokens_per_s", "actor/pg_loss", "time/step_s",
                          "time/rollout_s"}) {
      EXPECT_TRUE(m[s].contains(k)) << "step " << s << " lacks " << k;
    }
    EXPECT_EQ(m[s]["train/trajectories"].get<double>(), 16);
  }
  fs::remove_all(out);
}

TEST_F(AgenticTest, BadGroupingIsRefusedBeforeAnyWorkerStarts) {
  const std::string out = testing::TempDir("agentic-bad");
  auto r = Run(out, "max_steps=1 rollout_batch_size=12");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("rollout_batch_size counts trajectories and must be a multiple of "
                       "train_env_manager.group_size: 12 is not a multiple of 8"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("cluster 'actor_train' up"), std::string::npos) << "refused before any worker starts";
  auto pods = Run(out, "max_steps=1 downsample_samples_per_group=4");
  EXPECT_NE(pods.code, 0);
  EXPECT_NE(pods.out.find("downsample_samples_per_group is the RLVR pipeline's"), std::string::npos) << pods.out;
  auto bad_pipeline = Run(out, "pipeline=agentc");
  EXPECT_NE(bad_pipeline.code, 0);
  EXPECT_NE(bad_pipeline.out.find("agentic"), std::string::npos) << bad_pipeline.out;
  fs::remove_all(out);
}

TEST_F(AgenticTest, AKilledEnvironmentWorkerLosesNoTrajectory) {
  const std::string out = testing::TempDir("agentic-kill");
  testing::ShellResult r;
  std::thread run([&] {
    r = Run(out, "max_steps=6 eval_steps=0 rollout_batch_size=32 val_batch_size=16 fault_tolerance.max_restarts=2");
  });
  // Mid-rollout of step 2 or later.
  const bool killed = testing::KillRankWhenMetricsReach(out, "train_env_manager", 2);
  run.join();
  ASSERT_TRUE(killed) << "found no environment worker to kill";
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train_env_manager lost a worker"), std::string::npos) << r.out;
  auto m = ReadMetrics(out);
  for (int64_t s = 1; s <= 6; ++s) {
    ASSERT_TRUE(m.count(s)) << "step " << s;
    // Every step trained exactly its 32 trajectories, none dropped.
    EXPECT_EQ(m[s]["train/trajectories"].get<double>(), 32) << "step " << s;
    EXPECT_EQ(m[s]["rollout/dropped_episodes"].get<double>(), 0) << "step " << s;
  }
  EXPECT_EQ(m[6]["rollout/worker_restarts"].get<double>(), 1);
  // Said out loud at the end too, and counted in metrics.jsonl.
  EXPECT_EQ(m[6]["faults/worker_restarts"].get<double>(), 1);
  EXPECT_EQ(m[6]["faults/dropped_groups"].get<double>(), 0);
  EXPECT_NE(r.out.find("the run survived faults: 1 worker restart(s), 0 failed episode(s), 0 dropped env group(s)"),
            std::string::npos)
      << r.out;
  fs::remove_all(out);
}

// The Python example of an external environment, started by the
// environment workers from its command, under a TMPDIR of the test's own so
// that its servers can be told from any other.
class ExternalAgenticTest : public AgenticTest {
 protected:
  void SetUp() override {
    AgenticTest::SetUp();
    if (std::system("/usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null") != 0) {
      GTEST_SKIP() << "/usr/bin/python3 lacks grpcio/protobuf (scripts/setup installs them)";
    }
  }
  testing::ShellResult RunExternal(const std::string& out, const std::string& tmp, const std::string& options,
                                   const std::string& overrides) {
    fs::create_directories(tmp);
    const std::string server = std::string(ROLL_SOURCE_DIR) + "/examples/environments/python/guess_number.py";
    return Run(out, "train_env_manager.env_type=external 'train_env_manager.env_options=[command=/usr/bin/python3 " +
                        server + ", " + options + "]' " + overrides,
               "TMPDIR=" + tmp + " ");
  }
  // What `list` still returns once the run's processes are gone, waiting up
  // to 5 s for them to finish exiting.
  static std::vector<std::string> LeftAfterExit(const std::function<std::vector<std::string>()>& list) {
    std::vector<std::string> left;
    for (int i = 0; i < 50 && !(left = list()).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return left;
  }
  // The entries of `tmp` (the run's TMPDIR).
  static std::vector<std::string> LeftIn(const std::string& tmp) {
    return LeftAfterExit([&] {
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(tmp)) names.push_back(e.path().filename().string());
      return names;
    });
  }
  // The environment servers started under `tmp` still running.
  static std::vector<std::string> ServersLeftUnder(const std::string& tmp) {
    return LeftAfterExit([&] { return ServersUnder(tmp); });
  }
  // Processes whose environment names `tmp`: the servers started there.
  static std::vector<std::string> ServersUnder(const std::string& tmp) {
    std::vector<std::string> found;
    for (const auto& p : fs::directory_iterator("/proc")) {
      const std::string pid = p.path().filename();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (testing::ReadFile(p.path() / "environ").find("ROLL_ENV_ADDRESS=unix:" + tmp) != std::string::npos) found.push_back(pid);
    }
    return found;
  }
};

TEST_F(ExternalAgenticTest, APythonEnvironmentServerIsDrivenEndToEnd) {
  const std::string out = testing::TempDir("agentic-external"), tmp = out + "/tmp";
  auto r = RunExternal(out, tmp, "max_number=4, max_steps=3",
                       "max_steps=1 eval_steps=1 save_steps=1 rollout_batch_size=16 val_batch_size=16 "
                       "actor_train.training_args.gradient_accumulation_steps=4");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_EQ(m.size(), 2u) << "steps 0 and 1";
  EXPECT_TRUE(m[0].contains("val/success_rate"));
  EXPECT_LE(m[0]["val/steps_mean"].get<double>(), 3.0);
  EXPECT_EQ(m[1]["train/trajectories"].get<double>(), 16);
  EXPECT_GT(m[1]["rollout/env_steps"].get<double>(), 15);
  EXPECT_EQ(m[1]["rollout/dropped_episodes"].get<double>(), 0);
  // The servers the environment workers started ended with them.
  const std::vector<std::string> left = ServersLeftUnder(tmp);
  EXPECT_TRUE(left.empty()) << left.size() << " environment servers outlived the run, e.g. pid " << left[0];
  // Nothing stays in the temporary directory: not the servers' sockets and
  // logs, not the Python server's generated messages, not the checkpoint's
  // staging.
  EXPECT_TRUE(fs::exists(out + "/checkpoint-1"));
  const std::vector<std::string> files = LeftIn(tmp);
  EXPECT_TRUE(files.empty()) << files.size() << " entries left in TMPDIR, e.g. " << files[0];
  fs::remove_all(out);
}

TEST_F(ExternalAgenticTest, AControllerStoppedMidRunLeavesNothingInTmpdir) {
  // SIGTERM to the controller mid-run: its workers get their parent-death
  // signal (SIGTERM), stop their servers and remove their directories.
  const std::string out = testing::TempDir("agentic-stop"), tmp = out + "/tmp";
  testing::ShellResult r;
  std::thread run([&] {
    r = RunExternal(out, tmp, "max_number=4, max_steps=3",
                    "max_steps=200 eval_steps=0 save_steps=0 rollout_batch_size=16 val_batch_size=16 "
                    "actor_train.training_args.gradient_accumulation_steps=4");
  });
  bool stopped = false;
  for (int i = 0; i < 600 && !stopped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ReadMetrics(out).size() < 2) continue;
    stopped = testing::Shell("pkill -TERM -f '^" + testing::RollBinary() + " run .*output_dir=" + out + " '").code == 0;
  }
  run.join();
  ASSERT_TRUE(stopped) << "found no controller to stop";
  EXPECT_NE(r.code, 0) << r.out;
  const std::vector<std::string> left = ServersLeftUnder(tmp);
  EXPECT_TRUE(left.empty()) << left.size() << " environment servers outlived the controller";
  const std::vector<std::string> files = LeftIn(tmp);
  EXPECT_TRUE(files.empty()) << files.size() << " entries left in TMPDIR, e.g. " << files[0];
  fs::remove_all(out);
}

TEST_F(ExternalAgenticTest, AHangingEnvironmentServerFailsTheRunByNameInsteadOfWaiting) {
  const std::string out = testing::TempDir("agentic-hang"), tmp = out + "/tmp";
  const auto start = std::chrono::steady_clock::now();
  auto r = RunExternal(out, tmp, "hang_on_step=1, timeout_s=1",
                       "max_steps=1 rollout_batch_size=16 val_batch_size=16 "
                       "actor_train.training_args.gradient_accumulation_steps=4");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("external environment (command /usr/bin/python3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Step did not answer within 1s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("env groups were dropped"), std::string::npos) << r.out;
  EXPECT_LT(took, 180.0);
  const std::vector<std::string> left = ServersLeftUnder(tmp);
  EXPECT_TRUE(left.empty()) << left.size() << " hung environment servers outlived the run";
  // A failed run leaves nothing in the temporary directory either.
  const std::vector<std::string> files = LeftIn(tmp);
  EXPECT_TRUE(files.empty()) << files.size() << " entries left in TMPDIR, e.g. " << files[0];
  fs::remove_all(out);
}

}  // namespace
}  // namespace roll
