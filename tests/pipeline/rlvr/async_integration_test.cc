// Asynchronous RLVR training end to end (docs/async.md): `roll run` with
// async_generation_ratio on disaggregated placement, real worker processes.
// The off-policy bound and version lags in metrics.jsonl, validation between
// the producer's batches, the checkpoint position and resume, the placement
// check, and async_generation_ratio 0 being the synchronous pipeline.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "testing/runs.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using testing::ReadMetrics;

// Trainer on CPU slot 0, generator on slot 1 (the async placement).
constexpr char kApart[] =
    " actor_train.device_mapping=[0] actor_train.num_gpus_per_worker=1"
    " actor_infer.device_mapping=[1] actor_infer.num_gpus_per_worker=1 ";
constexpr char kSmall[] =
    " rollout_batch_size=8 actor_train.training_args.per_device_train_batch_size=16 data.num_val=32 ";

class AsyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir("async-base"));
    model_ = new std::string(testing::MakeSftBase(*dir_));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }

  testing::ShellResult Run(const std::string& out, const std::string& overrides) {
    return testing::RunOnModel(testing::RlvrBaseConfig(), out, *model_, kSmall + overrides);
  }

  static std::string* dir_;
  static std::string* model_;
};
std::string* AsyncTest::dir_ = nullptr;
std::string* AsyncTest::model_ = nullptr;

nlohmann::json ReadJson(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

TEST_F(AsyncTest, RunKeepsTheOffPolicyBoundAndValidatesBetweenBatches) {
  const std::string out = testing::TempDir("async-run");
  auto r = Run(out, std::string(kApart) + "async_generation_ratio=1 max_steps=4 eval_steps=2 save_steps=0");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_EQ(m.size(), 5u) << "steps 0 .. 4";
  for (int64_t s = 1; s <= 4; ++s) {
    for (const char* k : {"rollout/version_lag_max", "rollout/version_lag_mean", "rollout/version_lag_0_fraction",
                          "rollout/version_lag_1_fraction", "rollout/mixed_version_fraction",
                          "async/wait_s", "time/generation_s", "actor/pg_loss"}) {
      ASSERT_TRUE(m[s].contains(k)) << "step " << s << " lacks " << k;
    }
    EXPECT_LE(m[s]["rollout/version_lag_max"].get<double>(), 1.0) << "step " << s;
    EXPECT_FALSE(m[s].contains("rollout/version_lag_2_fraction"));
  }
  EXPECT_EQ(m[1]["rollout/version_lag_max"].get<double>(), 0.0) << "nothing trained before step 1";
  // The batch of step 2 was generated while step 1 trained: one version old.
  EXPECT_EQ(m[2]["rollout/version_lag_max"].get<double>(), 1.0);
  EXPECT_GT(m[2]["rollout/version_lag_1_fraction"].get<double>(), 0.0);
  for (int64_t s : {0, 2, 4}) EXPECT_TRUE(m[s].contains("val/accuracy")) << "step " << s;
  // Compute accounting: compute/flops sums every step's training and
  // generation FLOPs; device-seconds grow with the two slots held.
  double flops = 0, device_s = 0;
  for (int64_t s = 1; s <= 4; ++s) {
    ASSERT_TRUE(m[s].contains("compute/train_flops") && m[s].contains("compute/generation_flops")) << s;
    EXPECT_GT(m[s]["compute/generation_flops"].get<double>(), 0.0);
    flops += m[s]["compute/train_flops"].get<double>() + m[s]["compute/generation_flops"].get<double>();
    EXPECT_NEAR(m[s]["compute/flops"].get<double>(), flops, 1e-9 * flops) << "step " << s;
    EXPECT_GT(m[s]["compute/device_seconds"].get<double>(), device_s) << "step " << s;
    EXPECT_NEAR(m[s]["compute/device_seconds"].get<double>() - device_s, 2 * m[s]["time/step_s"].get<double>(), 1e-6);
    device_s = m[s]["compute/device_seconds"].get<double>();
  }
  fs::remove_all(out);
}

TEST_F(AsyncTest, RecomputeOptionTrainsWithinTheBound) {
  const std::string out = testing::TempDir("async-recompute");
  auto r = Run(out, std::string(kApart) +
                        "async_generation_ratio=1 async_recompute_kv=true max_steps=3 eval_steps=0 save_steps=0");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  for (int64_t s = 1; s <= 3; ++s) {
    ASSERT_TRUE(m.count(s)) << s;
    EXPECT_LE(m[s]["rollout/version_lag_max"].get<double>(), 1.0);
  }
  fs::remove_all(out);
}

TEST_F(AsyncTest, CheckpointCountsOnlyTrainedBatchesAndResumes) {
  const std::string a = testing::TempDir("async-a");
  // k = 2: when step 2 is saved, the producer has drawn the prompts of step
  // 3 too (and 4 would be next); the checkpoint holds those of steps 1-2.
  auto ra = Run(a, std::string(kApart) + "async_generation_ratio=2 max_steps=3 eval_steps=0 save_steps=2");
  ASSERT_EQ(ra.code, 0) << ra.out;
  const nlohmann::json state = ReadJson(fs::path(a) / "checkpoint-2" / "pipeline_state.json");
  EXPECT_EQ(state["data_position"]["index"].get<int64_t>(), 2 * 8) << state.dump();
  EXPECT_EQ(state["data_position"]["epoch"].get<int64_t>(), 0);

  const std::string b = testing::TempDir("async-b");
  auto rb = Run(b, std::string(kApart) + "async_generation_ratio=2 max_steps=4 eval_steps=0 save_steps=0 "
                                         "resume_from_checkpoint=" + a + "/checkpoint-2");
  ASSERT_EQ(rb.code, 0) << rb.out;
  auto mb = ReadMetrics(b);
  ASSERT_TRUE(mb.count(3) && mb.count(4)) << rb.out;
  EXPECT_FALSE(mb.count(1) || mb.count(2)) << "steps 1-2 are not trained again";
  // Generation restarts from the checkpoint's weights (version 2).
  EXPECT_EQ(mb[3]["rollout/version_lag_max"].get<double>(), 0.0);
  EXPECT_LE(mb[4]["rollout/version_lag_max"].get<double>(), 2.0);
  // The cumulative compute goes on from the checkpoint's.
  auto ma = ReadMetrics(a);
  EXPECT_NEAR(mb[3]["compute/flops"].get<double>(),
              ma[2]["compute/flops"].get<double>() + mb[3]["compute/train_flops"].get<double>() +
                  mb[3]["compute/generation_flops"].get<double>(),
              1e-6 * mb[3]["compute/flops"].get<double>());
  fs::remove_all(a);
  fs::remove_all(b);
}

// A generator killed in an asynchronous run: when the model update finds
// it dead, the update replaces it in place (with the weights it sends);
// when the producer's requests find it dead, the step fails and the job
// restarts from the newest checkpoint (the producer's client has no
// restarter: a replacement there would race the model updates). Either
// way, with one restart allowed, every step is logged once, each scored
// its 8 x 8 samples, and none trained on a sample older than k.
TEST_F(AsyncTest, KilledGeneratorIsRecoveredWithNoStepLostOrTrainedTwice) {
  const std::string out = testing::TempDir("async-gen-killed");
  bool killed = false;
  testing::ShellResult r;
  std::thread run([&] {
    r = Run(out, std::string(kApart) + "async_generation_ratio=1 max_steps=8 eval_steps=0 save_steps=2 "
                                       "fault_tolerance.max_restarts=1");
  });
  // Steps 0..3 logged: checkpoint-2 exists.
  killed = testing::KillRankWhenMetricsReach(out, "actor_infer", 4);
  run.join();
  ASSERT_TRUE(killed) << "found no actor_infer worker to kill";
  ASSERT_EQ(r.code, 0) << r.out;
  const bool job_restart = r.out.find("actor_infer rank 0 died") != std::string::npos &&
                           r.out.find("restarting the job from") != std::string::npos;
  const bool in_place = r.out.find("actor_infer lost a worker") != std::string::npos &&
                        r.out.find("restarting rank(s) 0 with") != std::string::npos;
  // Asynchronous training never replaces a generator in place (the rollout
  // beside the model update would see the same death again): the job
  // restarts from its checkpoint, once.
  EXPECT_TRUE(job_restart) << r.out;
  EXPECT_FALSE(in_place) << r.out;
  auto lines = testing::LinesPerStep(out);
  auto m = ReadMetrics(out);
  for (int64_t s = 0; s <= 8; ++s) EXPECT_EQ(lines[s], 1) << "step " << s;
  for (int64_t s = 1; s <= 8; ++s) {
    EXPECT_EQ(m[s].value("reward/math_samples", 0.0), 64) << "step " << s;
    EXPECT_LE(m[s].value("rollout/version_lag_max", 99.0), 1.0) << "step " << s;
  }
  EXPECT_EQ(m[8].value("rollout/worker_restarts", 0.0), 1);
  fs::remove_all(out);
}

TEST_F(AsyncTest, SharedDevicesAreRefusedBeforeAnyWorkerStarts) {
  const std::string out = testing::TempDir("async-colocated");
  auto r = Run(out, "async_generation_ratio=1 max_steps=1");  // the quickstart colocates them
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("actor_infer needs devices of its own"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device 0"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(fs::path(out) / "logs")) << "no worker was started";
  fs::remove_all(out);
}

TEST_F(AsyncTest, RatioZeroIsTheSynchronousPipeline) {
  const std::string a = testing::TempDir("async-zero-a"), b = testing::TempDir("async-zero-b");
  const std::string common = std::string(kApart) + "deterministic=true max_steps=2 eval_steps=0 save_steps=0 ";
  auto ra = Run(a, common);
  ASSERT_EQ(ra.code, 0) << ra.out;
  auto rb = Run(b, common + "async_generation_ratio=0");
  ASSERT_EQ(rb.code, 0) << rb.out;
  auto ma = ReadMetrics(a), mb = ReadMetrics(b);
  for (int64_t s : {1, 2}) {
    ASSERT_TRUE(ma.count(s) && mb.count(s));
    for (const char* k : {"train/reward_mean", "train/response_length", "actor/pg_loss", "actor/grad_norm"}) {
      EXPECT_EQ(ma[s][k].get<double>(), mb[s][k].get<double>()) << "step " << s << " " << k;
    }
    EXPECT_FALSE(mb[s].contains("rollout/version_lag_max"));
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_F(AsyncTest, ScaleRlRecipeRunsWithInterruptionAndKeepsItsPromptHistoryInCheckpoints) {
  const std::string out = testing::TempDir("scalerl");
  auto r = testing::RunOnModel(std::string(ROLL_SOURCE_DIR) + "/configs/scalerl.yaml", out, *model_,
                               kSmall + std::string("max_steps=2 eval_steps=0 save_steps=2 positive_pass_rate=0.5 "
                               // Forced length interruption: after 1 token, "=" and up to 3 more.
                               "interrupt_min_tokens=1 interrupt_max_tokens=1 interrupt_answer_tokens=3 interrupt_text=="));
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(2));
  for (const char* k : {"train/zero_variance_filtered", "rollout/retired_prompts", "rollout/version_lag_max",
                        "actor/rollout_is_mean", "compute/flops"}) {
    EXPECT_TRUE(m[2].contains(k)) << k;
  }
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(m[step].contains("train/interrupted_fraction"));
    EXPECT_GT(m[step]["train/interrupted_fraction"].get<double>(), 0.5) << "answers run past 1 token";
    EXPECT_LE(m[step]["train/response_length"].get<double>(), 5.0) << "1 + 1 injected + at most 3";
  }
  const nlohmann::json state = ReadJson(fs::path(out) / "checkpoint-2" / "pipeline_state.json");
  ASSERT_TRUE(state.contains("positive_resampling")) << state.dump();
  int64_t retired = 0, prompts = 0;
  for (const auto& [id, cn] : state["positive_resampling"]["history"].items()) {
    ++prompts;
    EXPECT_EQ(cn[1].get<int64_t>(), 8) << id << ": one group of 8 samples";
    retired += cn[0].get<int64_t>() >= 4;
  }
  EXPECT_EQ(prompts, 16) << "2 steps x 8 prompts";
  EXPECT_EQ(m[2]["rollout/retired_prompts"].get<double>(), static_cast<double>(retired));
  fs::remove_all(out);
}

}  // namespace
}  // namespace roll
