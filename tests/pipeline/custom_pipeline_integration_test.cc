// Runs examples/custom_pipeline as a user would: `roll sft` makes the base
// model, then the user's own pipeline (its own reward worker group, the
// shared train phase, model update, tracking and checkpoints) trains it.

#include <gtest/gtest.h>

#include <filesystem>

#include "testing/runs.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

std::string ExampleConfig() { return std::string(ROLL_SOURCE_DIR) + "/examples/custom_pipeline/config.yaml"; }
std::string Example() { return std::string(ROLL_BINARY_DIR) + "/bin/custom_pipeline"; }

class CustomPipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir("custom-base"));
    model_ = new std::string(testing::MakeSftBase(*dir_, "sft.max_steps=40"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }

  testing::ShellResult Run(const std::string& out, const std::string& overrides) {
    return testing::Shell(Example() + " " + ExampleConfig() + " output_dir=" + out +
                          " actor_train.model_args.model_name_or_path=" + *model_ +
                          " actor_infer.model_args.model_name_or_path=" + *model_ + " " + overrides);
  }

  static std::string* dir_;
  static std::string* model_;
};
std::string* CustomPipelineTest::dir_ = nullptr;
std::string* CustomPipelineTest::model_ = nullptr;

TEST_F(CustomPipelineTest, TrainsWithItsOwnRewardWorkersOnTheSharedPieces) {
  const std::string out = testing::TempDir("custom-run");
  testing::ShellResult r = Run(out, "max_steps=2 eval_steps=2 save_steps=2");
  ASSERT_EQ(r.code, 0) << r.out;
  auto metrics = testing::ReadMetrics(out);
  ASSERT_EQ(metrics.size(), 3u) << r.out;
  // Validation before training and at the end, scored by the user's workers
  // (two ranks, each scored some of the samples).
  ASSERT_TRUE(metrics[0].contains("val/accuracy"));
  ASSERT_TRUE(metrics[2].contains("val/accuracy"));
  EXPECT_GT(metrics[2]["scorer/rank0_scored"].get<double>(), 0);
  EXPECT_GT(metrics[2]["scorer/rank1_scored"].get<double>(), 0);
  // The shared train phase and model update ran every step.
  for (int64_t step : {1, 2}) {
    const auto& m = metrics[step];
    EXPECT_TRUE(m.contains("train/reward_mean")) << m.dump();
    EXPECT_TRUE(m.contains("actor/pg_loss")) << m.dump();
    EXPECT_TRUE(m.contains("train/advantage_abs_mean")) << m.dump();
    EXPECT_TRUE(m.contains("time/model_update_s")) << m.dump();
  }
  // A checkpoint of the base pipeline's format, with this pipeline's state.
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2/actor/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2/pipeline_state.json"));
  fs::remove_all(out);
}

TEST_F(CustomPipelineTest, KilledMidRunResumesWithThePromptsWhereTheyWere) {
  const std::string a = testing::TempDir("custom-whole"), b = testing::TempDir("custom-killed");
  const std::string common = "deterministic=true eval_steps=0 save_steps=1 max_steps=3 ";
  testing::ShellResult whole = Run(a, common);
  ASSERT_EQ(whole.code, 0) << whole.out;
  // The same run, its controller and workers SIGKILLed once checkpoint-1 is
  // complete (the workers die with the controller), then started again.
  const std::string cmd = "setsid " + Example() + " " + ExampleConfig() + " output_dir=" + b +
                          " actor_train.model_args.model_name_or_path=" + *model_ +
                          " actor_infer.model_args.model_name_or_path=" + *model_ + " " + common + " > " + b +
                          "/first.log 2>&1 & pid=$!; for i in $(seq 600); do [ -e " + b +
                          "/checkpoint-1/pipeline_state.json ] && break; sleep 0.1; done; kill -9 -$pid; wait $pid";
  testing::Shell(cmd);
  ASSERT_TRUE(fs::exists(b + "/checkpoint-1/pipeline_state.json"));
  ASSERT_FALSE(testing::ReadMetrics(b).count(3)) << "killed before the end";
  testing::ShellResult resumed = Run(b, common + "resume_from_checkpoint=latest");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from " + b + "/checkpoint-"), std::string::npos) << resumed.out;
  // The resumed steps trained the prompts the uninterrupted run trained
  // then: the same rewards and losses, not those of the first prompts again.
  auto mw = testing::ReadMetrics(a), mr = testing::ReadMetrics(b);
  for (int64_t step : {2, 3}) {
    ASSERT_TRUE(mw.count(step) && mr.count(step)) << step;
    for (const char* k : {"train/reward_mean", "train/response_length", "actor/pg_loss"}) {
      EXPECT_NEAR(mw[step][k].get<double>(), mr[step][k].get<double>(), 1e-6) << "step " << step << " " << k;
    }
  }
  EXPECT_NE(mw[1]["actor/pg_loss"].get<double>(), mw[2]["actor/pg_loss"].get<double>());
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_F(CustomPipelineTest, BadConfigAndUnknownPipelineAreNamed) {
  const std::string out = testing::TempDir("custom-bad");
  testing::ShellResult typo = Run(out, "scorer.wrold_size=2");
  EXPECT_NE(typo.code, 0);
  EXPECT_NE(typo.out.find("wrold_size"), std::string::npos) << typo.out;
  EXPECT_NE(typo.out.find("world_size"), std::string::npos) << typo.out;
  testing::ShellResult unknown = Run(out, "pipeline=keywords");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.out.find("unknown pipeline 'keywords'; known: keyword"), std::string::npos) << unknown.out;
  fs::remove_all(out);
}

}  // namespace
}  // namespace roll
