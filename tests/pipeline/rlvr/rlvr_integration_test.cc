// The RLVR pipeline end to end, as users run it: `roll sft` makes a tiny
// base model, `roll run` trains it with real worker processes. Checks the
// metrics contract, checkpoints, resume, the short learning run of the
// default suite, and config errors.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "roll/pipeline/generation_client.h"
#include "testing/runs.h"
#include "roll/controller/controller.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using testing::ReadMetrics;
using testing::RollBinary;
using testing::Shell;

class RlvrTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir("rlvr-base"));
    model_ = new std::string(testing::MakeSftBase(*dir_));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete model_;
  }
  void SetUp() override { ASSERT_EQ(model_->rfind("ERROR", 0), std::string::npos) << *model_; }

  // `roll run` on configs/rlvr_base.yaml with the shared base model.
  testing::ShellResult Run(const std::string& out, const std::string& overrides) {
    return testing::RunOnModel(testing::RlvrBaseConfig(), out, *model_, overrides);
  }

  static std::string* dir_;
  static std::string* model_;

 public:
  testing::ShellResult RunForTest(const std::string& out, const std::string& overrides) {
    return Run(out, overrides);
  }
};
std::string* RlvrTest::dir_ = nullptr;
std::string* RlvrTest::model_ = nullptr;

// Synchronous RLVR: steps 1..last generated with the model of the step
// before, on every generator rank, whose log-probs match the trainer's
// (about 4e-7 apart; one update of the policy moves them by orders more).
template <typename Metrics>
void ExpectEveryStepSampledWithTheTrainersWeights(Metrics& m, int64_t last) {
  for (int64_t s = 1; s <= last; ++s) {
    EXPECT_EQ(m[s]["rollout/weight_version_min"].template get<double>(), s - 1) << "step " << s;
    EXPECT_EQ(m[s]["rollout/weight_version_max"].template get<double>(), s - 1) << "step " << s;
    EXPECT_LT(m[s]["actor/infer_logprob_abs_diff"].template get<double>(), 1e-4) << "step " << s;
    EXPECT_GT(m[s]["actor/grad_norm"].template get<double>(), 0) << "step " << s;
  }
}

TEST_F(RlvrTest, SftWritesAHuggingFaceModelWithItsTokenizer) {
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(*model_) / f)) << f;
  }
}

TEST_F(RlvrTest, MetricsContractCheckpointsAndTensorBoard) {
  const std::string out = testing::TempDir("rlvr-run");
  auto r = Run(out, "max_steps=2 eval_steps=1 save_steps=2 rollout_batch_size=8 "
                    "actor_train.training_args.per_device_train_batch_size=16 data.num_val=32 "
                    "val_temperature=0.8 val_num_return_sequences=4 val_pass_k=[1,4]");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_EQ(m.size(), 3u) << "steps 0, 1, 2";
  EXPECT_TRUE(m[0].contains("val/accuracy"));
  ASSERT_TRUE(m[0].contains("val/pass@4"));
  EXPECT_GE(m[0]["val/pass@4"].get<double>(), m[0]["val/pass@1"].get<double>());
  EXPECT_FALSE(m[0].contains("train/reward_mean")) << "step 0 is the evaluation before training";
  for (int64_t s : {1, 2}) {
    for (const char* k : {"train/reward_mean", "train/accuracy", "time/step_s", "actor/pg_loss",
                          "actor/grad_norm", "val/accuracy", "rollout/submitted_prompts"}) {
      EXPECT_TRUE(m[s].contains(k)) << "step " << s << " lacks " << k;
    }
  }
  for (const auto& [step, j] : m) {
    for (const auto& [k, v] : j.items()) {
      if (k != "step") EXPECT_NE(k.find('/'), std::string::npos) << k;
    }
  }
  const fs::path ckpt = fs::path(out) / "checkpoint-2";
  for (const char* f : {"actor/config.json", "actor/model.safetensors", "actor/tokenizer.json",
                        "actor/optimizer.safetensors", "pipeline_state.json"}) {
    EXPECT_TRUE(fs::exists(ckpt / f)) << f;
  }
  bool events = false;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "tensorboard")) {
    events |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_TRUE(events);
  fs::remove_all(out);
}

TEST_F(RlvrTest, ResumedRunMakesTheSameNextStep) {
  const std::string a = testing::TempDir("rlvr-a");
  const std::string b = testing::TempDir("rlvr-b");
  const std::string common =
      "deterministic=true eval_steps=0 save_steps=1 rollout_batch_size=8 "
      "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16 ";
  auto ra = Run(a, common + "max_steps=2");
  ASSERT_EQ(ra.code, 0) << ra.out;
  auto rb = Run(b, common + "max_steps=2 resume_from_checkpoint=" + a + "/checkpoint-1");
  ASSERT_EQ(rb.code, 0) << rb.out;
  auto ma = ReadMetrics(a), mb = ReadMetrics(b);
  ASSERT_TRUE(ma.count(2) && mb.count(2));
  EXPECT_FALSE(mb.count(0)) << "a resumed run does not evaluate step 0 again";
  for (const char* k : {"train/reward_mean", "train/response_length", "actor/pg_loss",
                        "actor/grad_norm", "actor/entropy"}) {
    ASSERT_TRUE(ma[2].contains(k)) << k;
    EXPECT_NEAR(ma[2][k].get<double>(), mb[2][k].get<double>(), 1e-6) << k;
  }
  // A requeued job's `resume_from_checkpoint: latest`: a fresh start while
  // output_dir has no checkpoint, then the newest one.
  const std::string c = testing::TempDir("rlvr-c");
  auto first = Run(c, common + "max_steps=1 resume_from_checkpoint=latest");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("no checkpoint in " + c), std::string::npos) << first.out;
  auto again = Run(c, common + "max_steps=2 resume_from_checkpoint=latest");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("resuming from " + c + "/checkpoint-1 at step 1"), std::string::npos) << again.out;
  auto mc = ReadMetrics(c);
  ASSERT_TRUE(mc.count(0) && mc.count(1) && mc.count(2));
  for (const char* k : {"train/reward_mean", "actor/pg_loss", "actor/grad_norm"}) {
    EXPECT_NEAR(ma[2][k].get<double>(), mc[2][k].get<double>(), 1e-6) << k;
  }
  fs::remove_all(a);
  fs::remove_all(b);
  fs::remove_all(c);
}

TEST_F(RlvrTest, ShortGrpoRunLearns) {
  const std::string out = testing::TempDir("rlvr-learn");
  // The quickstart's base model and settings, fewer steps.
  auto r = Run(out, "max_steps=150 eval_steps=150 save_steps=0");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(0) && m.count(150));
  const double before = m[0]["val/accuracy"].get<double>();
  const double after = m[150]["val/accuracy"].get<double>();
  EXPECT_GT(after, before + 0.1) << "val/accuracy " << before << " -> " << after;
  double early = 0, late = 0;
  for (int s = 1; s <= 10; ++s) early += m[s]["train/reward_mean"].get<double>();
  for (int s = 141; s <= 150; ++s) late += m[s]["train/reward_mean"].get<double>();
  EXPECT_GT(late, early) << "train/reward_mean over the first and last ten steps";
  fs::remove_all(out);
}

TEST_F(RlvrTest, RolloutImportanceWeightsAreLoggedAndNearOneOnPolicy) {
  const std::string out = testing::TempDir("rlvr-tis");
  auto r = Run(out, "max_steps=2 eval_steps=0 save_steps=0 rollout_is=token rollout_is_cap=2.0");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  for (int s : {1, 2}) {
    ASSERT_TRUE(m.count(s) && m[s].contains("actor/rollout_is_mean")) << "step " << s;
    // Generator and trainer hold the same weights: the weights differ from
    // 1 by numerics only, and none reaches the cap.
    EXPECT_NEAR(m[s]["actor/rollout_is_mean"].get<double>(), 1.0, 0.02) << "step " << s;
    EXPECT_EQ(m[s]["actor/rollout_is_truncated"].get<double>(), 0.0) << "step " << s;
  }
  fs::remove_all(out);
}

TEST_F(RlvrTest, DownSamplingTrainsPartOfEachGroup) {
  // 32 prompts x 8 samples generated, 4 of each trained: 128 rows a step,
  // two mini-batches of 64.
  const std::string out = testing::TempDir("rlvr-pods");
  auto r = Run(out, "max_steps=2 eval_steps=0 save_steps=0 downsample_samples_per_group=4");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  for (int s : {1, 2}) {
    ASSERT_TRUE(m.count(s) && m[s].contains("train/trained_samples")) << "step " << s;
    EXPECT_EQ(m[s]["train/trained_samples"].get<double>(), 128.0) << "step " << s;
    EXPECT_GT(m[s]["actor/grad_norm"].get<double>(), 0) << "step " << s;
  }
  fs::remove_all(out);
  auto bad = Run(testing::TempDir("rlvr-bad"), "downsample_samples_per_group=8");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("downsample_samples_per_group (8) must be at least 2 (a group's advantages need two "
                         "samples) and below num_return_sequences_in_group (8)"),
            std::string::npos)
      << bad.out;
  EXPECT_EQ(bad.out.find("cluster 'actor_train' up"), std::string::npos) << "refused before any worker starts";
}

TEST_F(RlvrTest, TheQuickstartConfigRunsItsRecipe) {
  // configs/quickstart_rlvr.yaml itself (what scripts/quickstart runs) for
  // two steps: its recipe is on (dynamic sampling, the generator's
  // log-probs as the old policy: no recompute pass) and it runs.
  const std::string out = testing::TempDir("rlvr-quickstart");
  auto r = testing::RunOnModel(std::string(ROLL_SOURCE_DIR) + "/configs/quickstart_rlvr.yaml", out, *model_,
                               "max_steps=2 eval_steps=2 save_steps=0 data.num_val=16");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(1) && m.count(2)) << r.out;
  for (int64_t s = 1; s <= 2; ++s) {
    EXPECT_GE(m[s]["rollout/rounds"].get<double>(), 1) << "step " << s;
    // Only a recompute pass measures the generator against the trainer.
    EXPECT_FALSE(m[s].contains("actor/infer_logprob_abs_diff")) << "step " << s;
  }
  EXPECT_TRUE(m[2].contains("val/accuracy"));
  auto cfg = LoadPipelineConfig(std::string(ROLL_SOURCE_DIR) + "/configs/quickstart_rlvr.yaml", {});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->dynamic_sampling);
  EXPECT_FALSE(cfg->use_decoupled_loss);
  EXPECT_EQ(cfg->max_steps, 1000);
  fs::remove_all(out);
}

TEST_F(RlvrTest, TwoTrainerAndTwoGeneratorRanks) {
  // One CPU slot per worker: actor_train and actor_infer each get two ranks
  // (data-parallel training over Gloo, generation on both, the model update
  // broadcast to both), colocated slot by slot.
  const std::string out = testing::TempDir("rlvr-dp");
  auto r = Run(out,
               "actor_train.num_gpus_per_worker=1 actor_infer.num_gpus_per_worker=1 max_steps=3 "
               "eval_steps=3 save_steps=0 rollout_batch_size=8 "
               "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* log : {"actor_train_1.log", "actor_infer_1.log"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / "logs" / log)) << log;
  }
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(0) && m.count(3));
  // Generator rank 0 shares trainer rank 0's slot and takes the update from
  // shared memory, rank 1 from the broadcast.
  ExpectEveryStepSampledWithTheTrainersWeights(m, 3);
  EXPECT_TRUE(m[3].contains("val/accuracy"));
  // Only generator rank 0 shares trainer rank 0's slot.
  const std::string shm = "model updates come from shared memory";
  EXPECT_NE(testing::ReadFile(out + "/logs/actor_infer_0.log").find(shm), std::string::npos);
  EXPECT_EQ(testing::ReadFile(out + "/logs/actor_infer_1.log").find(shm), std::string::npos);
  // The placement the run used.
  auto p = Shell(RollBinary() + " config --placement " + testing::RlvrBaseConfig() +
                 " actor_train.num_gpus_per_worker=1 actor_infer.num_gpus_per_worker=1");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("actor_train:1"), std::string::npos) << p.out;
  fs::remove_all(out);
}

TEST_F(RlvrTest, FullyShardedTrainerUpdatesEveryGenerator) {
  // Two fully sharded trainer ranks and two generator ranks, one CPU slot
  // each: generator rank 0 shares trainer rank 0's slot and reads the
  // gathered model from shared memory; generator rank 1 receives each
  // trainer rank's own shard over that rank's group.
  const std::string out = testing::TempDir("rlvr-fsdp");
  auto r = Run(out,
               "actor_train.num_gpus_per_worker=1 actor_infer.num_gpus_per_worker=1 max_steps=3 "
               "eval_steps=3 save_steps=3 rollout_batch_size=8 "
               "actor_train.strategy_args.strategy_name=fsdp2_train "
               "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(0) && m.count(3));
  ExpectEveryStepSampledWithTheTrainersWeights(m, 3);
  for (int64_t s = 1; s <= 3; ++s) EXPECT_GT(m[s]["actor/comm_bytes"].get<double>(), 0) << "step " << s;
  EXPECT_NE(testing::ReadFile(out + "/logs/actor_infer_1.log").find("from 2 sharded trainer ranks"),
            std::string::npos);
  // The checkpoint: the gathered model and one optimizer file per rank.
  for (const char* f : {"model.safetensors", "optimizer-rank0-of-2.safetensors",
                        "optimizer-rank1-of-2.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-3" / "actor" / f)) << f;
  }
  fs::remove_all(out);
}

TEST_F(RlvrTest, ShardedTrainerUpdatesATensorParallelGenerator) {
  // Two fully sharded trainer ranks and one generator whose model is split
  // over its two CPU slots: each trainer rank sends its own shard, the
  // generator puts each element straight into the slice that holds it
  // (keeping no whole model), and its log-probs match the trainer's.
  const std::string out = testing::TempDir("rlvr-tp");
  auto r = Run(out,
               "actor_train.num_gpus_per_worker=1 max_steps=3 eval_steps=3 save_steps=0 "
               "rollout_batch_size=8 colocated_weight_update=false "
               "actor_train.strategy_args.strategy_name=fsdp2_train "
               "actor_infer.strategy_args.strategy_config.tensor_model_parallel_size=2 "
               "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  ASSERT_TRUE(m.count(0) && m.count(3));
  ExpectEveryStepSampledWithTheTrainersWeights(m, 3);
  const std::string log = testing::ReadFile(out + "/logs/actor_infer_0.log");
  EXPECT_NE(log.find("generating with 2 tensor-parallel slices"), std::string::npos) << log;
  EXPECT_NE(log.find("from 2 sharded trainer ranks"), std::string::npos) << log;
  EXPECT_NE(log.find("straight into the 2 tensor-parallel slices; the whole model is not kept"),
            std::string::npos)
      << log;
  // A split the worker's devices cannot hold is refused before any worker starts.
  auto bad = Run(out + "-bad", "actor_infer.strategy_args.strategy_config.tensor_model_parallel_size=4");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("must equal num_gpus_per_worker (2)"), std::string::npos) << bad.out;
  fs::remove_all(out);
}

TEST_F(RlvrTest, TensorParallelTrainerAndGeneratorTrainLikeTheUnsplitOnes) {
  // The quickstart's one trainer and one generator, each splitting the
  // model over its two CPU slots: the model update goes from the trainer's
  // slices to the generator's (through shared memory, colocated; over the
  // broadcast with colocated_weight_update=false) without either joining
  // the whole model; the checkpoint is the unsplit one. Step 1 sees the
  // same rollouts as an unsplit run, so its loss and gradient norm agree up
  // to the rounding of the split sums.
  const std::string common =
      "deterministic=true max_steps=2 eval_steps=2 save_steps=2 rollout_batch_size=8 "
      "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16 ";
  const std::string plain = testing::TempDir("rlvr-unsplit");
  const std::string out = testing::TempDir("rlvr-tp-train");
  auto rp = Run(plain, common);
  ASSERT_EQ(rp.code, 0) << rp.out;
  auto r = Run(out, common +
                        "actor_train.strategy_args.strategy_config.tensor_model_parallel_size=2 "
                        "actor_infer.strategy_args.strategy_config.tensor_model_parallel_size=2");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  auto mp = ReadMetrics(plain);
  ASSERT_TRUE(m.count(1) && m.count(2) && mp.count(1));
  ExpectEveryStepSampledWithTheTrainersWeights(m, 2);
  EXPECT_NEAR(m[1]["actor/loss"].get<double>(), mp[1]["actor/loss"].get<double>(), 1e-4);
  EXPECT_NEAR(m[1]["actor/grad_norm"].get<double>(), mp[1]["actor/grad_norm"].get<double>(),
              1e-3 * mp[1]["actor/grad_norm"].get<double>());
  EXPECT_NE(testing::ReadFile(out + "/logs/actor_train_0.log").find("trains 2 tensor-parallel slices"),
            std::string::npos);
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-2" / "actor" / f)) << f;
  }
  const std::string split_logs =
      testing::ReadFile(out + "/logs/actor_train_0.log") + testing::ReadFile(out + "/logs/actor_infer_0.log");
  EXPECT_NE(split_logs.find("read out of the 2 tensor-parallel slices"), std::string::npos) << split_logs;
  EXPECT_NE(split_logs.find("straight into the 2 tensor-parallel slices"), std::string::npos) << split_logs;
  // The same over the broadcast: the generator's log-probs match the trainer's.
  const std::string bcast = testing::TempDir("rlvr-tp-bcast");
  auto rb = Run(bcast, common + "save_steps=0 colocated_weight_update=false "
                                "actor_train.strategy_args.strategy_config.tensor_model_parallel_size=2 "
                                "actor_infer.strategy_args.strategy_config.tensor_model_parallel_size=2");
  ASSERT_EQ(rb.code, 0) << rb.out;
  auto mb = ReadMetrics(bcast);
  ASSERT_TRUE(mb.count(2));
  ExpectEveryStepSampledWithTheTrainersWeights(mb, 2);
  EXPECT_EQ(testing::ReadFile(bcast + "/logs/actor_infer_0.log").find("model updates come from shared memory"),
            std::string::npos);
  fs::remove_all(bcast);
  fs::remove_all(out);
  fs::remove_all(plain);
}

// The quickstart colocates the trainer and the generator on both CPU slots.
// With offload_states=always each gives its memory up while the other's
// stage runs; the run must make exactly the steps of a run that keeps
// everything resident.
TEST_F(RlvrTest, OffloadedColocatedRunMatchesTheResidentOne) {
  const std::string a = testing::TempDir("rlvr-resident");
  const std::string b = testing::TempDir("rlvr-offload");
  const std::string spill = b + "/spill";
  fs::create_directories(spill);
  const std::string common =
      "deterministic=true max_steps=2 eval_steps=2 save_steps=2 rollout_batch_size=8 "
      "actor_train.training_args.per_device_train_batch_size=16 data.num_val=16 ";
  auto ra = Run(a, common + "offload_states=never");
  ASSERT_EQ(ra.code, 0) << ra.out;
  auto rb = Run(b, common + "offload_states=always offload_dir=" + spill);
  ASSERT_EQ(rb.code, 0) << rb.out;
  auto ma = ReadMetrics(a), mb = ReadMetrics(b);
  ASSERT_TRUE(ma.count(2) && mb.count(2));
  for (int64_t s = 1; s <= 2; ++s) {
    for (const char* k : {"train/reward_mean", "train/response_length", "actor/pg_loss", "actor/grad_norm",
                          "actor/entropy", "actor/infer_logprob_abs_diff"}) {
      ASSERT_TRUE(mb[s].contains(k)) << k;
      EXPECT_NEAR(ma[s][k].get<double>(), mb[s][k].get<double>(), 1e-6) << "step " << s << " " << k;
    }
    // The generator gives up its parameters and KV cache for the trainer's
    // stages; the trainer gives up its parameters and AdamW moments for
    // the next rollout (in step 1 it still is from step 0's validation).
    EXPECT_GT(mb[s].value("offload/actor_infer_mb", 0.0), 0) << "step " << s;
    EXPECT_GT(mb[s].value("time/offload_s", 0.0), 0) << "step " << s;
    EXPECT_FALSE(ma[s].contains("offload/actor_infer_mb")) << "step " << s;
  }
  EXPECT_EQ(ma[2]["val/accuracy"].get<double>(), mb[2]["val/accuracy"].get<double>());
  // Weights and two moments: three times the parameters (the checkpoint's
  // model file, less its header).
  const double model_mb = static_cast<double>(fs::file_size(b + "/checkpoint-2/actor/model.safetensors")) / (1 << 20);
  EXPECT_NEAR(mb[2].value("offload/actor_train_mb", 0.0), 3 * model_mb, 0.05 * model_mb);
  EXPECT_NEAR(mb[0].value("offload/actor_train_mb", 0.0), 3 * model_mb, 0.05 * model_mb);
  // The checkpoint of the offloaded run equals the resident run's.
  const std::string wa = testing::ReadFile(a + "/checkpoint-2/actor/model.safetensors");
  const std::string wb = testing::ReadFile(b + "/checkpoint-2/actor/model.safetensors");
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "checkpoint-2 weights differ";
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_F(RlvrTest, SamplesAreRoutedToTheRewardOfTheirDomain) {
  // A JSONL dataset with two domains: "math" goes to the math rule, "easy"
  // to a format reward that accepts any response.
  const std::string out = testing::TempDir("rlvr-domains");
  const std::string data = out + "/data.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 64; ++i) {
      const int a = (i * 7) % 50, b = (i * 13) % 50;
      f << R"({"prompt": ")" << a << "+" << b << R"(=", "ground_truth": ")" << a + b << R"(", "tag": ")"
        << (i % 2 ? "math" : "easy") << "\"}\n";
    }
  }
  const std::string common =
      "data.train_files=[" + data + "] data.num_val=8 max_steps=2 eval_steps=0 save_steps=0 "
      "rollout_batch_size=8 actor_train.training_args.per_device_train_batch_size=16 ";
  auto r = Run(out, common + "'rewards.easy={worker_cls: reward, reward_type: format, "
                             "reward_options: [pattern=^], tag_included: [easy]}'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = ReadMetrics(out);
  for (int64_t s : {1, 2}) {
    ASSERT_TRUE(m[s].contains("reward/easy_mean") && m[s].contains("reward/math_mean")) << m[s].dump();
    EXPECT_EQ(m[s]["reward/easy_mean"].get<double>(), 1.0) << "step " << s;
    EXPECT_LT(m[s]["reward/math_mean"].get<double>(), 0.9) << "step " << s;
    EXPECT_EQ(m[s]["reward/easy_samples"].get<double>() + m[s]["reward/math_samples"].get<double>(), 64);
  }
  // A tag no reward section takes is an error that names it.
  auto bad = Run(out, common);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("no reward domain takes samples tagged 'easy'"), std::string::npos) << bad.out;
  fs::remove_all(out);
}

// Runs `roll run` with `overrides` and, once metrics.jsonl has
// `after_lines` lines, SIGKILLs rank 0 of `cluster` (a child of the
// `roll run` whose output_dir is `out`). Returns the run's result; *killed
// tells whether a kill happened.
testing::ShellResult RunAndKill(RlvrTest* t, const std::string& out, const std::string& overrides,
                                const std::string& cluster, size_t after_lines, bool* killed) {
  testing::ShellResult r;
  std::thread run([&] { r = t->RunForTest(out, overrides); });
  *killed = testing::KillRankWhenMetricsReach(out, cluster, after_lines);
  run.join();
  return r;
}

TEST_F(RlvrTest, KilledRewardWorkerIsRestartedAndNoSampleIsLost) {
  const std::string out = testing::TempDir("rlvr-restart");
  bool killed = false;
  auto r = RunAndKill(this, out,
                                  "max_steps=8 eval_steps=0 save_steps=0 rollout_batch_size=8 data.num_val=8 "
                                  "actor_train.training_args.per_device_train_batch_size=16 "
                                  "fault_tolerance.max_restarts=2",
                                  "rewards.math", 2, &killed);
  ASSERT_TRUE(killed) << "found no reward worker to kill";
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rewards.math lost a worker"), std::string::npos) << r.out;
  auto m = ReadMetrics(out);
  for (int64_t s = 1; s <= 8; ++s) {
    ASSERT_TRUE(m.count(s)) << "step " << s;
    // Every step scored exactly its 8 x 8 samples: none lost, none twice.
    EXPECT_EQ(m[s]["reward/math_samples"].get<double>(), 64) << "step " << s;
  }
  EXPECT_EQ(m[8]["rollout/worker_restarts"].get<double>(), 1);
  fs::remove_all(out);
}

TEST_F(RlvrTest, WithoutRestartsADeadRewardWorkerFailsTheRunByName) {
  const std::string out = testing::TempDir("rlvr-norestart");
  bool killed = false;
  auto r = RunAndKill(this, out,
                                  "max_steps=30 eval_steps=0 save_steps=0 rollout_batch_size=8 data.num_val=8 "
                                  "actor_train.training_args.per_device_train_batch_size=16",
                                  "rewards.math", 2, &killed);
  ASSERT_TRUE(killed) << "found no reward worker to kill";
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("rewards.math"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fault_tolerance.max_restarts=0"), std::string::npos) << r.out;
  fs::remove_all(out);
}

// Kills rank 0 of `cluster` in step 4 or 5 of an 8-step run with a
// checkpoint every 2 steps and one restart allowed: the job restarts from
// the newest checkpoint, every step is in metrics.jsonl exactly once and
// every step scored its 8 x 8 samples.
void ExpectJobRestartsFromCheckpoint(RlvrTest* t, const std::string& cluster) {
  const std::string out = testing::TempDir("rlvr-job-restart");
  bool killed = false;
  // Steps 0..3 logged means checkpoint-2 exists (step 2 is logged, then
  // saved, then step 3 runs).
  auto r = RunAndKill(t, out,
                      "max_steps=8 eval_steps=0 save_steps=2 rollout_batch_size=8 data.num_val=8 "
                      "actor_train.training_args.per_device_train_batch_size=16 fault_tolerance.max_restarts=1",
                      cluster, 4, &killed);
  ASSERT_TRUE(killed) << "found no " << cluster << " worker to kill";
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(cluster + " rank 0 died"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restarting the job from"), std::string::npos) << r.out;
  auto lines = testing::LinesPerStep(out);
  auto by_step = ReadMetrics(out);
  for (int64_t s = 0; s <= 8; ++s) EXPECT_EQ(lines[s], 1) << "step " << s;
  for (int64_t s = 1; s <= 8; ++s) {
    EXPECT_EQ(by_step[s].value("reward/math_samples", 0.0), 64) << "step " << s;
  }
  EXPECT_EQ(by_step[8].value("rollout/worker_restarts", 0.0), 1);
  EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-8" / "pipeline_state.json"));
  fs::remove_all(out);
}

TEST_F(RlvrTest, KilledTrainerRestartsTheJobFromTheLastCheckpoint) {
  ExpectJobRestartsFromCheckpoint(this, "actor_train");
}

// Generator rank 0 of two killed mid-run is restarted on its own (rank 1
// keeps running): the new process and rank 1 join a new weight-sync group
// with trainer rank 0 (the broadcast, not shared memory, to exercise the
// group's re-forming), the new one takes the weights the old one had, and
// its requests in flight are submitted again. No job restart, no sample lost
// or counted twice, and every step still generates with the trainer's
// weights of the step before.
TEST_F(RlvrTest, KilledGeneratorIsRestartedAndItsRequestsAreRetried) {
  const std::string out = testing::TempDir("rlvr-gen-restart");
  bool killed = false;
  auto r = RunAndKill(this, out,
                      "max_steps=8 eval_steps=8 save_steps=0 rollout_batch_size=8 data.num_val=8 "
                      "actor_train.training_args.per_device_train_batch_size=16 fault_tolerance.max_restarts=1 "
                      "colocated_weight_update=false actor_infer.num_gpus_per_worker=1",
                      "actor_infer", 4, &killed);
  ASSERT_TRUE(killed) << "found no actor_infer worker to kill";
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("actor_infer lost a worker"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restarting rank(s) 0 (restart 1 of 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("actor_infer rank(s) 0 rejoin the weight sync at version "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("restarting the job"), std::string::npos) << r.out;
  auto lines = testing::LinesPerStep(out);
  auto m = ReadMetrics(out);
  for (int64_t s = 0; s <= 8; ++s) EXPECT_EQ(lines[s], 1) << "step " << s;
  for (int64_t s = 1; s <= 8; ++s) {
    EXPECT_EQ(m[s].value("reward/math_samples", 0.0), 64) << "step " << s;
    EXPECT_EQ(m[s]["rollout/weight_version_min"].get<double>(), s - 1) << "step " << s;
    EXPECT_EQ(m[s]["rollout/weight_version_max"].get<double>(), s - 1) << "step " << s;
    EXPECT_LT(m[s]["actor/infer_logprob_abs_diff"].get<double>(), 1e-4) << "step " << s;
  }
  EXPECT_EQ(m[8].value("rollout/worker_restarts", 0.0), 1);
  EXPECT_TRUE(m[8].contains("val/accuracy"));
  fs::remove_all(out);
}

// The generation client over two real actor_infer workers; rank 0 is killed
// with requests in flight: other requests were returned whole before, and
// one request had returned some of its samples but not all. The client
// replaces rank 0 through its restarter and submits that rank's unfinished
// requests again, while rank 1 -- the same process throughout -- keeps
// generating its own. Every (request, sample) comes back exactly once (the
// samples of the partly returned request that come back a second time are
// dropped), and the retried samples are the ones an uninterrupted run draws.
TEST_F(RlvrTest, GenerationClientRetriesTheRequestsOfAKilledGenerator) {
  const std::string out = testing::TempDir("rlvr-gen-client");
  auto cfg = LoadPipelineConfig(testing::RlvrBaseConfig(),
                                {"output_dir=" + out, "actor_infer.model_args.model_name_or_path=" + *model_,
                                 "actor_train.model_args.model_name_or_path=" + *model_,
                                 "actor_infer.num_gpus_per_worker=1", "runtime.worker_binary=" + RollBinary()});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto controller = Controller::Create(*cfg);
  ASSERT_TRUE(controller.ok()) << controller.status();
  std::unique_ptr<Cluster<ActorApi>> infer;
  int restarts = 0;
  auto start = [&]() -> absl::Status {
    if (infer) infer->Shutdown().IgnoreError();
    ROLL_ASSIGN_OR_RETURN(infer, (*controller)->StartCluster<ActorApi>("actor_infer"));
    return absl::OkStatus();
  };
  // 1-token requests finish in the first engine step; the others sample at
  // a high temperature, so their samples stop (EOS) at different steps.
  GenParams quick, full;
  quick.n = full.n = 4;
  quick.max_new_tokens = 1;
  full.max_new_tokens = 6;
  full.temperature = 3.0;
  std::vector<std::vector<GenRequest>> short_reqs(2), long_reqs(2);
  for (int w = 0; w < 2; ++w) {
    for (int i = 3 * w; i < 3 * w + 3; ++i) {
      short_reqs[w].push_back({"short" + std::to_string(i), std::to_string(i) + "+" + std::to_string(i) + "=", 7u + i});
      long_reqs[w].push_back({"long" + std::to_string(i), std::to_string(10 + i) + "+3=", 17u + i});
    }
  }
  // Polls one engine step at a time; with `kill`, kills rank 0 at the first
  // moment one of its requests has returned some but not all of its samples.
  // With `nested`, rank 1 dies too, right after rank 0 was replaced and
  // before its requests are submitted again: the client must replace rank 1
  // as well and still owe rank 0 what it had not sent.
  auto run = [&](bool kill, bool nested, std::map<std::string, std::vector<int64_t>>* got, bool* killed_partial,
                 std::string* error) {
    ASSERT_TRUE(start().ok());
    const pid_t survivor = infer->workers()[1].pid;
    int calls = 0;
    ClusterGenerationClient client(infer.get(), [&](ClusterBase& cluster,
                                                     const absl::Status&) -> absl::StatusOr<std::vector<int>> {
      ++restarts;
      EXPECT_EQ(&cluster, infer.get());
      ROLL_ASSIGN_OR_RETURN(std::vector<int> dead, (*controller)->RestartDeadWorkers(cluster));
      if (nested && ++calls == 1) {
        EXPECT_EQ(::kill(infer->workers()[1].pid, SIGKILL), 0);
        for (int i = 0; i < 200 && infer->workers()[1].alive; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(25));
        }
      }
      return dead;
    });
    ASSERT_TRUE(client.Submit(short_reqs, quick).ok());
    ASSERT_TRUE(client.Submit(long_reqs, full).ok());
    std::vector<SampleResult> all;
    std::map<std::string, int> per_request;
    for (int i = 0; i < 400 && client.in_flight() > 0; ++i) {
      auto more = client.Poll(absl::ZeroDuration());
      if (!more.ok()) {
        *error = more.status().ToString();
        return;
      }
      for (auto& r : *more) {
        ++per_request[r.request_key];
        all.push_back(std::move(r));
      }
      if (kill && !*killed_partial) {
        for (const auto& [key, n] : per_request) {
          // Rank 0 holds requests 0..2.
          if (n > 0 && n < 4 && key.back() < '3') *killed_partial = true;
        }
        if (*killed_partial) ASSERT_EQ(::kill(infer->workers()[0].pid, SIGKILL), 0);
      }
    }
    if (!nested) EXPECT_EQ(infer->workers()[1].pid, survivor) << "rank 1 must not be restarted";
    for (const SampleResult& r : all) {
      const std::string id = r.request_key + "#" + std::to_string(r.sample_index);
      EXPECT_FALSE(got->count(id)) << id << " returned twice";
      (*got)[id] = r.response_ids;
    }
  };
  std::map<std::string, std::vector<int64_t>> plain, retried;
  std::string error;
  bool partial = false;
  run(false, false, &plain, &partial, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(restarts, 0);
  run(true, false, &retried, &partial, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_TRUE(partial) << "no request was ever partly returned; the test needs one";
  EXPECT_EQ(restarts, 1);
  ASSERT_EQ(plain.size(), 48u) << "12 requests x 4 samples";
  ASSERT_EQ(retried.size(), 48u);
  for (const auto& [id, tokens] : plain) EXPECT_EQ(retried[id], tokens) << id;
  // A second death while the first is recovered.
  std::map<std::string, std::vector<int64_t>> nested;
  partial = false;
  restarts = 0;
  run(true, true, &nested, &partial, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_TRUE(partial);
  EXPECT_EQ(restarts, 2);
  ASSERT_EQ(nested.size(), 48u);
  for (const auto& [id, tokens] : plain) EXPECT_EQ(nested[id], tokens) << id;
  infer.reset();
  fs::remove_all(out);
}

TEST_F(RlvrTest, BadConfigValuesAreNamed) {
  auto r = Run(testing::TempDir("rlvr-bad"), "adv_estimator=gpro");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("adv_estimator"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("grpo"), std::string::npos) << r.out;
  auto d = Run(testing::TempDir("rlvr-bad"), "rollout_batch_size=3");
  EXPECT_EQ(d.code, 1);
  EXPECT_NE(d.out.find("multiple of the mini-batch"), std::string::npos) << d.out;
  auto p = Run(testing::TempDir("rlvr-bad"), "actor_infer.device_mapping=[0,7]");
  EXPECT_EQ(p.code, 1);
  EXPECT_NE(p.out.find("actor_infer.device_mapping: device 7 is beyond the job's 2 devices"), std::string::npos)
      << p.out;
  // Generators sharing a GPU with the trainer cannot take the update over
  // NCCL (one rank per GPU): the shared-memory path must stay on.
  auto g = Run(testing::TempDir("rlvr-bad"), "device_type=cuda colocated_weight_update=false");
  EXPECT_EQ(g.code, 1);
  EXPECT_NE(g.out.find("actor_infer rank 0 shares a GPU with actor_train rank 0"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("cluster 'actor_train' up"), std::string::npos) << "refused before any worker starts";
  // A GPU job where the workers see no GPU (here: a CPU-only LibTorch)
  // fails by name instead of training on the CPU.
  if (!at::hasCUDA()) {
    auto c = Run(testing::TempDir("rlvr-bad"), "device_type=cuda");
    EXPECT_EQ(c.code, 1);
    EXPECT_NE(c.out.find("actor_train: device_type is cuda, but this process sees no CUDA device"), std::string::npos)
        << c.out;
  }
}

}  // namespace
}  // namespace roll
