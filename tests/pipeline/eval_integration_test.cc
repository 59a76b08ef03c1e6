// `roll eval` end to end on the quickstart task (a base model from `roll
// sft`), the diagnostics validation logs inside training, and a run on an
// intrinsic reward with its collapse step.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "testing/runs.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

namespace fs = std::filesystem;
using testing::ReadMetrics;
using testing::RollBinary;
using testing::Shell;

class EvalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir("eval-base"));
    model_ = new std::string(testing::MakeSftBase(*dir_, "sft.max_steps=60"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }
  static std::string* dir_;
  static std::string* model_;
};
std::string* EvalTest::dir_ = nullptr;
std::string* EvalTest::model_ = nullptr;

// Outside the fixture: the refusal needs no base model.
TEST(EvalRefusalTest, AnAgenticConfigIsRefusedWithTheWayToEvaluateIt) {
  const testing::ShellResult r =
      Shell(RollBinary() + " eval " + testing::AgenticConfig() + " --model /nonexistent-model");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("pipeline is agentic"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_steps=0"), std::string::npos) << r.out;
  // Refused before any worker starts.
  EXPECT_EQ(r.out.find("cluster"), std::string::npos) << r.out;
}

TEST_F(EvalTest, TwoModelsSideBySideWithPassAtKSupportAndAPlot) {
  const std::string out = testing::TempDir("eval-run");
  // The untrained base (its random initial weights: one step of `roll sft`
  // at a negligible learning rate) against the fine-tuned one.
  const std::string raw = out + "/raw";
  auto sft = Shell(RollBinary() + " sft " + testing::RlvrBaseConfig() + " output_dir=" + out +
                   " sft.output_dir=" + raw + " sft.max_steps=1 sft.warmup_steps=0 sft.learning_rate=1e-12 "
                   "runtime.threads_per_worker=1");
  ASSERT_EQ(sft.code, 0) << sft.out;
  // Progress and logs go to stderr (kept apart), the report to stdout.
  auto r = Shell("{ " + RollBinary() + " eval " + testing::RlvrBaseConfig() + " --model " + raw + " --model " + *model_ +
                 " --n 4 --k 1,2,4 --format json --plot " + out + "/passk.png data.num_val=24 val_batch_size=12 2>" +
                 out + "/progress.txt; }");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["models"].size(), 2u);
  for (const auto& m : j["models"]) {
    EXPECT_EQ(m["prompts"], 24);
    EXPECT_EQ(m["samples"], 96);
    const double p1 = m["pass_at_k"]["1"], p2 = m["pass_at_k"]["2"], p4 = m["pass_at_k"]["4"];
    EXPECT_DOUBLE_EQ(p1, m["accuracy"].get<double>());
    EXPECT_LE(p1, p2);
    EXPECT_LE(p2, p4);
    EXPECT_LE(p4, 1.0);
    EXPECT_GT(m["token_entropy"].get<double>(), 0.0);
    EXPECT_GE(m["answer_entropy"].get<double>(), 0.0);
  }
  // Fine-tuning teaches the answer format: the base solves little.
  EXPECT_GT(j["models"][1]["accuracy"].get<double>(), j["models"][0]["accuracy"].get<double>());
  // The fine-tuned model's answers are more certain than random weights'.
  EXPECT_LT(j["models"][1]["token_entropy"].get<double>(), j["models"][0]["token_entropy"].get<double>());
  const auto& s = j["support"][0];
  EXPECT_EQ(s["preserved"].get<int>() + s["shrunk"].get<int>() + s["expanded"].get<int>() + s["neither"].get<int>(),
            24);
  EXPECT_GE(s["expanded"].get<int>(), s["shrunk"].get<int>());
  std::ifstream png(out + "/passk.png", std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  EXPECT_EQ(magic, std::string("\x89PNG\r\n\x1a\n", 8));
  std::ifstream progress(out + "/progress.txt");
  std::string all((std::istreambuf_iterator<char>(progress)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("eval: model 2/2"), std::string::npos) << all;
  fs::remove_all(out);
}

TEST_F(EvalTest, ValidationLogsPassAtKAndEntropies) {
  const std::string out = testing::TempDir("eval-val");
  auto r = Shell(RollBinary() + " run " + testing::RlvrBaseConfig() + " --quiet output_dir=" + out +
                 " actor_train.model_args.model_name_or_path=" + *model_ +
                 " actor_infer.model_args.model_name_or_path=" + *model_ +
                 " max_steps=0 data.num_val=16 val_batch_size=16 val_num_return_sequences=4 'val_pass_k=[1,4]'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(0));
  for (const char* k : {"val/pass@1", "val/pass@4", "val/token_entropy", "val/answer_entropy"}) {
    EXPECT_TRUE(m[0].contains(k)) << k;
  }
  EXPECT_LE(m[0]["val/pass@1"].get<double>(), m[0]["val/pass@4"].get<double>());
  fs::remove_all(out);
}

TEST_F(EvalTest, AnIntrinsicRewardRunReportsRewardAccuracyAndTheCollapseStep) {
  const std::string out = testing::TempDir("eval-urlvr");
  auto r = Shell(RollBinary() + " run " + testing::RlvrBaseConfig() + " output_dir=" + out +
                 " actor_train.model_args.model_name_or_path=" + *model_ +
                 " actor_infer.model_args.model_name_or_path=" + *model_ +
                 " max_steps=2 eval_steps=0 data.num_val=16 val_batch_size=16 intrinsic_reward=majority_vote"
                 " collapse_patience=1 collapse_threshold=1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  for (int64_t s : {1, 2}) {
    ASSERT_TRUE(m.count(s));
    for (const char* k : {"reward/accuracy", "reward/intrinsic_mean", "reward/verifier_accuracy",
                          "reward/collapse_step"}) {
      EXPECT_TRUE(m[s].contains(k)) << "step " << s << " lacks " << k;
    }
  }
  // Patience 1 at threshold 1: the collapse step is the first step whose
  // agreement is below 1.
  const double a1 = m[1]["reward/accuracy"], a2 = m[2]["reward/accuracy"];
  EXPECT_GE(a1, 0.0);
  EXPECT_LE(a1, 1.0);
  const double want = a1 < 1 ? 1 : a2 < 1 ? 2 : -1;
  EXPECT_EQ(m[2]["reward/collapse_step"].get<double>(), want) << a1 << " " << a2;
  EXPECT_NE(r.out.find("model collapse step"), std::string::npos) << r.out;
  auto bad = Shell(RollBinary() + " run " + testing::RlvrBaseConfig() + " output_dir=" + out +
                   " intrinsic_reward=majority_vote dynamic_sampling=true");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("cannot be used with intrinsic_reward"), std::string::npos) << bad.out;
  fs::remove_all(out);
}

}  // namespace
}  // namespace roll
