// The agentic pipeline end to end, as users run it: `roll sft` makes a tiny
// base model from random play, `roll run` trains it on FrozenLake episodes
// with real generation, training and environment workers. Checks the
// metrics contract, config errors before any worker starts, and that a
// killed environment worker loses no trajectory.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "controller/rlvr_test_util.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using testing::ReadMetrics;
using testing::RollBinary;
using testing::Shell;

std::string AgenticConfig() { return std::string(ROLL_SOURCE_DIR) + "/configs/quickstart_agentic.yaml"; }

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
                     "train_env_manager.max_steps=4");
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
    std::ifstream in(shared + "/sft.out");
    std::stringstream ss;
    ss << in.rdbuf();
    sft_out_ = new std::string(ss.str());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete sft_out_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }

 public:
  testing::ShellResult Run(const std::string& out, const std::string& overrides) {
    return Shell(RollBinary() + " run " + AgenticConfig() + " --quiet output_dir=" + out +
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
  fs::remove_all(out);
}

}  // namespace
}  // namespace roll
