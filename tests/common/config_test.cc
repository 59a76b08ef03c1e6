#include "roll/common/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "testing/files.h"

namespace roll {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TestData(const std::string& name) {
  return std::string(ROLL_SOURCE_DIR) + "/tests/common/testdata/config/" + name;
}

// The error message of a load that must fail.
std::string ErrorOf(const absl::StatusOr<PipelineConfig>& result) {
  EXPECT_FALSE(result.ok()) << "expected the load to fail";
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  return std::string(result.status().message());
}

std::vector<std::string> Lines(const std::string& s) { return absl::StrSplit(s, '\n'); }

absl::StatusOr<PipelineConfig> Parse(const std::string& text,
                                     const std::vector<std::string>& overrides = {},
                                     const LoadOptions& options = {}) {
  return ParsePipelineConfig(text, "mem.yaml", overrides, options);
}

TEST(ConfigTest, DefaultsFillEveryAbsentKey) {
  absl::StatusOr<PipelineConfig> cfg = Parse("exp_name: t\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->exp_name, "t");
  EXPECT_EQ(cfg->seed, 42);
  EXPECT_EQ(cfg->output_dir, "./output");
  EXPECT_EQ(cfg->max_steps, 500);
  EXPECT_EQ(cfg->rollout_batch_size, 64);
  EXPECT_EQ(cfg->num_return_sequences_in_group, 1);
  EXPECT_EQ(cfg->track_with, TrackWith::kStdout);
  EXPECT_EQ(cfg->resume_from_checkpoint, "");
  EXPECT_EQ(cfg->runtime.bind_address, "127.0.0.1");
  EXPECT_DOUBLE_EQ(cfg->runtime.call_timeout_s, 600.0);
  EXPECT_DOUBLE_EQ(cfg->runtime.health_check_interval_s, 1.0);
  EXPECT_DOUBLE_EQ(cfg->runtime.worker_timeout_s, 10.0);
  EXPECT_DOUBLE_EQ(cfg->runtime.startup_timeout_s, 60.0);
  EXPECT_DOUBLE_EQ(cfg->runtime.controller_grace_s, 5.0);
  EXPECT_EQ(cfg->runtime.log_level, LogLevel::kInfo);
  EXPECT_EQ(cfg->runtime.worker_binary, "");
  // Roles are absent but named.
  EXPECT_FALSE(cfg->actor_train.present);
  EXPECT_EQ(cfg->actor_train.name, "actor_train");
  EXPECT_EQ(cfg->FindRole("actor_train"), nullptr);
  EXPECT_TRUE(cfg->PresentRoles().empty());
  EXPECT_TRUE(cfg->rewards.empty());
}

TEST(ConfigTest, RoleSectionTakesWorkerDefaults) {
  absl::StatusOr<PipelineConfig> cfg = Parse("exp_name: t\ncritic:\n  worker_cls: Critic\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const WorkerConfig* critic = cfg->FindRole("critic");
  ASSERT_NE(critic, nullptr);
  EXPECT_TRUE(critic->present);
  EXPECT_EQ(critic->name, "critic");
  EXPECT_EQ(critic->worker_cls, "Critic");
  EXPECT_EQ(critic->model_args.dtype, DType::kBf16);
  EXPECT_EQ(critic->num_gpus_per_worker, 1);
  EXPECT_EQ(critic->world_size, 1);  // derived: no device_mapping
  EXPECT_DOUBLE_EQ(critic->generating_args.top_p, 1.0);
  EXPECT_EQ(critic->training_args.lr_scheduler_type, LrSchedulerType::kConstant);
  EXPECT_TRUE(critic->generating_args.do_sample);
}

TEST(ConfigTest, LoadsFullFile) {
  absl::StatusOr<PipelineConfig> cfg = LoadPipelineConfig(TestData("full.yaml"));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->exp_name, "qwen_rlvr");
  EXPECT_EQ(cfg->seed, 7);
  EXPECT_EQ(cfg->output_dir, "runs/qwen_rlvr");
  EXPECT_EQ(cfg->resume_from_checkpoint, "");
  EXPECT_EQ(cfg->track_with, TrackWith::kTensorboard);
  EXPECT_EQ(cfg->ppo_epochs, 2);
  EXPECT_EQ(cfg->runtime.bind_address, "0.0.0.0");
  EXPECT_DOUBLE_EQ(cfg->runtime.call_timeout_s, 120.0);
  EXPECT_EQ(cfg->runtime.log_level, LogLevel::kDebug);

  const WorkerConfig& train = cfg->actor_train;
  EXPECT_EQ(train.model_args.dtype, DType::kFp32);
  EXPECT_DOUBLE_EQ(train.training_args.learning_rate, 1e-6);
  EXPECT_EQ(train.training_args.lr_scheduler_type, LrSchedulerType::kCosine);
  EXPECT_EQ(train.strategy_args.strategy_name, "ddp_train");
  EXPECT_THAT(train.device_mapping, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(train.world_size, 2);  // 4 devices / 2 per worker

  const WorkerConfig& infer = cfg->actor_infer;
  EXPECT_EQ(infer.model_args.model_name_or_path, "/models/qwen");  // section copied
  EXPECT_EQ(infer.model_args.dtype, DType::kFp32);
  EXPECT_EQ(infer.generating_args.max_new_tokens, 512);
  EXPECT_EQ(infer.generating_args.num_return_sequences, 4);
  EXPECT_EQ(infer.generating_args.top_k, 50);
  EXPECT_THAT(infer.generating_args.stop_strings, ElementsAre("</answer>", "<|im_end|>"));
  EXPECT_EQ(infer.world_size, 4);

  EXPECT_THAT(cfg->reference.device_mapping, ElementsAre(0, 2, 4, 6));
  EXPECT_EQ(cfg->reference.world_size, 4);

  ASSERT_EQ(cfg->rewards.size(), 2u);
  const RewardConfig& math = cfg->rewards.at("math");
  EXPECT_EQ(math.name, "rewards.math");
  EXPECT_TRUE(math.present);
  EXPECT_EQ(math.reward_type, "math_rule");
  EXPECT_THAT(math.tag_included, ElementsAre("deepmath", "aime"));
  EXPECT_EQ(math.world_size, 3);
  EXPECT_EQ(cfg->FindRole("rewards.math"), &math);
  EXPECT_EQ(cfg->FindRole("rewards.nope"), nullptr);
  EXPECT_EQ(cfg->FindRole("critic"), nullptr);

  std::vector<std::string> names;
  for (const WorkerConfig* w : cfg->PresentRoles()) names.push_back(w->name);
  EXPECT_THAT(names, ElementsAre("actor_train", "actor_infer", "reference", "rewards.code",
                                 "rewards.math"));
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndSuggestion) {
  std::string err = ErrorOf(Parse(
      "exp_name: t\n"
      "actor_train:\n"
      "  worker_cls: A\n"
      "  training_args:\n"
      "    lerning_rate: 0.1\n"));
  EXPECT_EQ(err,
            "mem.yaml:5:5: actor_train.training_args.lerning_rate: unknown key 'lerning_rate' "
            "(did you mean 'learning_rate'?)");
}

TEST(ConfigTest, KeyOneLevelTooHighPointsToItsSection) {
  std::string err = ErrorOf(Parse("exp_name: t\nactor_train:\n  worker_cls: A\n  dtype: fp16\n"));
  EXPECT_EQ(err,
            "mem.yaml:4:3: actor_train.dtype: unknown key 'dtype' "
            "(did you mean 'model_args.dtype'?)");
}

TEST(ConfigTest, UnknownKeyWithoutCloseMatchHasNoSuggestion) {
  std::string err = ErrorOf(Parse("exp_name: t\nzzzzzz: 1\n"));
  EXPECT_EQ(err, "mem.yaml:2:1: zzzzzz: unknown key 'zzzzzz'");
}

TEST(ConfigTest, WrongTypeNamesExpectedAndGot) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nseed: abc\n")),
            "mem.yaml:2:7: seed: expected integer, got 'abc'");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nmax_steps: 1.5\n")),
            "mem.yaml:2:12: max_steps: expected integer, got '1.5'");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nruntime:\n  call_timeout_s: [1]\n")),
            "mem.yaml:3:19: runtime.call_timeout_s: expected number, got a list");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  generating_args:\n"
                          "    do_sample: maybe\n")),
            "mem.yaml:5:16: critic.generating_args.do_sample: expected boolean (true or false), "
            "got 'maybe'");
  EXPECT_EQ(ErrorOf(Parse("exp_name: {a: 1}\n")),
            "mem.yaml:1:11: exp_name: expected string, got a map");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nruntime: 3\n")),
            "mem.yaml:2:10: runtime: expected a map (section), got '3'");
}

TEST(ConfigTest, MissingRequiredValues) {
  // exp_name is required at the top level: reported at the file start.
  EXPECT_EQ(ErrorOf(Parse("seed: 1\n")), "mem.yaml:1:1: exp_name: missing required value");
  EXPECT_THAT(ErrorOf(Parse("exp_name:\n")),
              HasSubstr("mem.yaml:1:1: exp_name: missing required value"));
  // worker_cls is required in a present role: reported at the section key.
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nseed: 1\nreference:\n  world_size: 2\n")),
            "mem.yaml:3:1: reference.worker_cls: missing required value");
}

TEST(ConfigTest, OutOfRangeValues) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  world_size: -1\n")),
            "mem.yaml:4:15: critic.world_size: value -1 is out of range: must be >= 0");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  generating_args:\n"
                          "    temperature: -0.5\n")),
            "mem.yaml:5:18: critic.generating_args.temperature: value -0.5 is out of range: "
            "must be >= 0");
  for (const char* bad : {"0", "1.01", "-1"}) {
    EXPECT_THAT(ErrorOf(Parse(std::string("exp_name: t\ncritic:\n  worker_cls: C\n"
                                          "  generating_args:\n    top_p: ") + bad + "\n")),
                HasSubstr("critic.generating_args.top_p: value " + std::string(bad) +
                          " is out of range: must be (0, 1]"));
  }
  EXPECT_TRUE(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  generating_args:\n"
                    "    top_p: 1\n    temperature: 0\n").ok());
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nruntime:\n  worker_timeout_s: 0\n")),
            "mem.yaml:3:21: runtime.worker_timeout_s: value 0 is out of range: must be > 0");
}

TEST(ConfigTest, BadEnumListsAllowedValues) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  model_args:\n"
                          "    dtype: bf32\n")),
            "mem.yaml:5:12: critic.model_args.dtype: invalid value 'bf32': expected one of: "
            "fp32, bf16, fp16");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nruntime:\n  log_level: loud\n")),
            "mem.yaml:3:14: runtime.log_level: invalid value 'loud': expected one of: trace, "
            "debug, info, warn, error");
}

TEST(ConfigTest, AlgorithmChoicesParseOnceIntoEnumsAliasesIncluded) {
  auto cfg = Parse("exp_name: t\nadv_estimator: reinforce_pp\nkl_penalty: low_var_kl\npg_variant: cispo\n"
                   "loss_agg_mode: seq-mean-token-sum-norm\nrollout_is: sequence\nnorm_std_type: batch\n"
                   "intrinsic_reward: majority_vote\noffload_states: never\nreward_level: step\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->adv_estimator, AdvEstimator::kReinforcePlusPlus);
  EXPECT_EQ(ToString(cfg->adv_estimator), "reinforce_plus_plus");  // the canonical spelling
  EXPECT_EQ(cfg->kl_penalty, KlPenalty::kK3);
  EXPECT_EQ(cfg->pg_variant, PgVariant::kCispo);
  EXPECT_EQ(cfg->loss_agg_mode, LossAggMode::kSeqMeanTokenSumNorm);
  EXPECT_EQ(cfg->rollout_is, RolloutIs::kSequence);
  EXPECT_EQ(cfg->norm_std_type, NormType::kBatch);
  EXPECT_EQ(cfg->norm_mean_type, NormType::kGroup);  // the default
  EXPECT_EQ(cfg->intrinsic_reward, IntrinsicReward::kMajorityVote);
  EXPECT_EQ(cfg->offload_states, OffloadStates::kNever);
  EXPECT_EQ(cfg->reward_level, RewardLevel::kStep);
  // What the controller sends its workers: each choice once, in its
  // canonical spelling, and it parses back to the same config.
  const std::string dump = DumpConfigYaml(*cfg);
  EXPECT_NE(dump.find("adv_estimator: reinforce_plus_plus\n"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("reinforce_pp\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("kl_penalty: k3\n"), std::string::npos) << dump;
  auto again = ParsePipelineConfig(dump, "dump.yaml", {}, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(DumpConfigYaml(*again), dump);
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\npg_variant: trpo\n")),
            "mem.yaml:2:13: pg_variant: invalid value 'trpo': expected one of: ppo, gspo, cispo, up, up_seq");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nkl_penalty: k4\n")),
            "mem.yaml:2:13: kl_penalty: invalid value 'k4': expected one of: k1, kl, k2, mse, k3, low_var_kl, abs");
}

TEST(ConfigTest, CollectsAllErrorsOnePerLine) {
  absl::StatusOr<PipelineConfig> cfg = LoadPipelineConfig(TestData("errors.yaml"));
  std::string err = ErrorOf(cfg);
  const std::string f = TestData("errors.yaml");
  EXPECT_THAT(
      Lines(err),
      ElementsAre(
          f + ":2:7: seed: expected integer, got 'abc'",
          f + ":3:1: max_stepz: unknown key 'max_stepz' (did you mean 'max_steps'?)",
          f + ":4:13: track_with: invalid value 'wandb': expected one of: stdout, tensorboard",
          f + ":7:15: actor_train.world_size: value -2 is out of range: must be >= 0",
          f + ":9:18: actor_train.generating_args.temperature: value -1 is out of range: must "
              "be >= 0",
          f + ":10:12: actor_train.generating_args.top_p: value 1.5 is out of range: must be "
              "(0, 1]",
          f + ":12:12: actor_train.model_args.dtype: invalid value 'bf32': expected one of: "
              "fp32, bf16, fp16",
          f + ":13:1: critic.worker_cls: missing required value"));
  // Every line has the documented shape file:LINE:COL: key.path: message.
  std::regex shape(R"(^.+\.yaml:\d+:\d+: [A-Za-z_][\w.\[\]]*: .+$)");
  for (const std::string& line : Lines(err)) {
    EXPECT_TRUE(std::regex_match(line, shape)) << line;
  }
}

TEST(ConfigTest, InterpolationWholeEmbeddedAndChained) {
  absl::StatusOr<PipelineConfig> cfg;
  cfg = Parse(
      "exp_name: exp\n"
      "output_dir: /runs/${exp_name}/s${seed}\n"
      "seed: ${max_steps}\n"
      "max_steps: ${rollout_batch_size}\n"
      "rollout_batch_size: 8\n"
      "actor_train:\n"
      "  worker_cls: A\n"
      "  device_mapping: [3, 4]\n"
      "  generating_args:\n"
      "    stop_strings: ['a', 'b']\n"
      "critic:\n"
      "  worker_cls: ${actor_train.worker_cls}\n"
      "  device_mapping: ${actor_train.device_mapping}\n"
      "  infer_batch_size: ${actor_train.device_mapping.1}\n"
      "  generating_args: ${actor_train.generating_args}\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->output_dir, "/runs/exp/s8");
  EXPECT_EQ(cfg->seed, 8);
  EXPECT_EQ(cfg->max_steps, 8);
  EXPECT_EQ(cfg->critic.worker_cls, "A");
  EXPECT_THAT(cfg->critic.device_mapping, ElementsAre(3, 4));
  EXPECT_EQ(cfg->critic.infer_batch_size, 4);
  EXPECT_THAT(cfg->critic.generating_args.stop_strings, ElementsAre("a", "b"));
}

TEST(ConfigTest, InterpolationThroughAnInterpolatedSection) {
  absl::StatusOr<PipelineConfig> cfg = Parse(
      "exp_name: t\n"
      "critic:\n"
      "  worker_cls: C\n"
      "  model_args: ${actor_train.model_args}\n"
      "  infer_batch_size: ${reference.model_args.model_name_or_path}\n"
      "reference:\n"
      "  worker_cls: R\n"
      "  model_args: ${critic.model_args}\n"
      "actor_train:\n"
      "  worker_cls: A\n"
      "  model_args: {model_name_or_path: '12'}\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->reference.model_args.model_name_or_path, "12");
  EXPECT_EQ(cfg->critic.infer_batch_size, 12);
}

TEST(ConfigTest, InterpolationErrors) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: ${nope.key}\n")),
            "mem.yaml:1:11: exp_name: interpolation '${nope.key}' refers to a key that does not "
            "exist");
  EXPECT_EQ(ErrorOf(Parse("exp_name: x\nruntime: {log_level: info}\noutput_dir: a/${runtime}\n")),
            "mem.yaml:3:13: output_dir: interpolation '${runtime}' is a map and cannot be "
            "embedded in a string");
  // A type error in an interpolated value points at the reference.
  EXPECT_EQ(ErrorOf(Parse("exp_name: abc\nseed: ${exp_name}\n")),
            "mem.yaml:2:7: seed: expected integer, got 'abc'");
}

TEST(ConfigTest, InterpolationCycleNamesTheKeys) {
  std::string err = ErrorOf(Parse(
      "exp_name: t\n"
      "seed: ${max_steps}\n"
      "max_steps: ${save_steps}\n"
      "save_steps: ${seed}\n"));
  EXPECT_EQ(err, "mem.yaml:2:7: seed: interpolation cycle: seed -> max_steps -> save_steps -> seed");
  EXPECT_EQ(ErrorOf(Parse("exp_name: ${exp_name}\n")),
            "mem.yaml:1:11: exp_name: interpolation cycle: exp_name -> exp_name");
  EXPECT_THAT(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: ${critic}\n")),
              HasSubstr("interpolation cycle: critic.worker_cls -> critic.worker_cls"));
}

TEST(ConfigTest, DefaultsChainWithRelativePaths) {
  absl::StatusOr<PipelineConfig> cfg = LoadPipelineConfig(TestData("chain_top.yaml"));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->exp_name, "from_top");  // including file wins
  EXPECT_EQ(cfg->seed, 3);               // base_extra applied after sub/base_mid
  EXPECT_EQ(cfg->max_steps, 300);
  EXPECT_EQ(cfg->actor_train.worker_cls, "RootWorker");  // from ../base_root.yaml via sub/
  EXPECT_DOUBLE_EQ(cfg->actor_train.training_args.learning_rate, 0.25);  // mid over root
  EXPECT_EQ(cfg->actor_train.training_args.warmup_steps, 9);  // deep merge keeps root's
  EXPECT_THAT(cfg->actor_train.device_mapping, ElementsAre(2, 3, 4));  // lists replaced
  EXPECT_EQ(cfg->actor_train.world_size, 3);
}

TEST(ConfigTest, ErrorsInBaseFilesNameThatFile) {
  EXPECT_EQ(ErrorOf(LoadPipelineConfig(TestData("bad_value_top.yaml"))),
            TestData("bad_value_base.yaml") + ":1:7: seed: expected integer, got 'abc'");
  // The including file (or an override) replaces the bad value.
  absl::StatusOr<PipelineConfig> cfg =
      LoadPipelineConfig(TestData("bad_value_top.yaml"), {"seed=4"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->seed, 4);
  EXPECT_EQ(cfg->max_steps, 3);
  EXPECT_EQ(ErrorOf(LoadPipelineConfig(TestData("chain_top.yaml"),
                                       {"actor_train.training_args.warmup_step=1"})),
            "override 'actor_train.training_args.warmup_step=1': "
            "actor_train.training_args.warmup_step: unknown key 'warmup_step' (did you mean "
            "'warmup_steps'?)");
}

TEST(ConfigTest, DefaultsCycleIsReported) {
  std::string err = ErrorOf(LoadPipelineConfig(TestData("cycle_a.yaml")));
  EXPECT_THAT(err, HasSubstr("cycle_b.yaml:1:12: defaults: defaults cycle: "));
  EXPECT_THAT(err, HasSubstr("cycle_a.yaml -> "));
  EXPECT_THAT(err, HasSubstr("cycle_b.yaml -> "));
  EXPECT_EQ(Lines(err).size(), 1u) << err;
}

TEST(ConfigTest, MissingAndBrokenFiles) {
  absl::StatusOr<PipelineConfig> cfg = LoadPipelineConfig(TestData("no_such_file.yaml"));
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cfg.status().message(), HasSubstr("no_such_file.yaml"));

  std::string err = ErrorOf(LoadPipelineConfig(TestData("missing_base.yaml")));
  EXPECT_THAT(err, HasSubstr("missing_base.yaml:3:5: defaults: cannot read '"));
  EXPECT_THAT(err, HasSubstr("does_not_exist.yaml"));

  err = ErrorOf(LoadPipelineConfig(TestData("bad_syntax_base.yaml")));
  EXPECT_THAT(err, HasSubstr("bad_syntax.yaml:3:5: YAML syntax error: end of sequence flow not found"));

  EXPECT_THAT(ErrorOf(Parse("exp_name: t\nseed: [1\n")), HasSubstr("mem.yaml:3:1: YAML syntax error"));
  EXPECT_EQ(ErrorOf(Parse("- a\n- b\n")),
            "mem.yaml:1:1: expected a map of keys at the top level, got a list");
  EXPECT_EQ(ErrorOf(Parse("exp_name: a\nexp_name: b\n")), "mem.yaml:2:1: exp_name: duplicate key");
}

TEST(ConfigTest, OverridesSetCreateAndParseYamlValues) {
  absl::StatusOr<PipelineConfig> cfg = Parse(
      "exp_name: t\nseed: 1\nactor_train:\n  worker_cls: A\n  device_mapping: [0]\n",
      {"seed=9", "actor_train.device_mapping=[0,1]", "critic.worker_cls=C",
       "critic.generating_args.stop_strings=['x', 'y z']", "rewards.math.worker_cls=M",
       "output_dir=/tmp/${exp_name}", "exp_name=renamed"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->seed, 9);
  EXPECT_THAT(cfg->actor_train.device_mapping, ElementsAre(0, 1));
  EXPECT_EQ(cfg->actor_train.world_size, 2);
  ASSERT_NE(cfg->FindRole("critic"), nullptr);
  EXPECT_EQ(cfg->critic.worker_cls, "C");
  EXPECT_THAT(cfg->critic.generating_args.stop_strings, ElementsAre("x", "y z"));
  ASSERT_NE(cfg->FindRole("rewards.math"), nullptr);
  EXPECT_EQ(cfg->rewards.at("math").worker_cls, "M");
  // Interpolation sees the final tree, overrides included.
  EXPECT_EQ(cfg->output_dir, "/tmp/renamed");
}

TEST(ConfigTest, OverrideNullRemovesARole) {
  absl::StatusOr<PipelineConfig> cfg =
      Parse("exp_name: t\ncritic:\n  worker_cls: C\n", {"critic=null"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->FindRole("critic"), nullptr);
}

TEST(ConfigTest, OverrideErrorsNameTheOverride) {
  std::string err = ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n",
                                  {"seed=abc", "critic.device_mapping=[0, x]", "noequals",
                                   "exp_name.sub=1", "seeed=3", "top=[1"}));
  // Type errors come from the typed parse, after the tree-level ones; the
  // order between them is not part of the contract.
  std::vector<std::string> lines = Lines(err);
  std::sort(lines.begin(), lines.end());
  EXPECT_THAT(lines,
              ElementsAre("override 'critic.device_mapping=[0, x]': critic.device_mapping[1]: "
                          "expected integer, got 'x'",
                          "override 'exp_name.sub=1': exp_name.sub: cannot set a key inside "
                          "'exp_name': it is 't', not a section",
                          "override 'noequals': expected key.path=value",
                          "override 'seed=abc': seed: expected integer, got 'abc'",
                          "override 'seeed=3': seeed: unknown key 'seeed' (did you mean "
                          "'seed'?)",
                          HasSubstr("override 'top=[1': top: cannot parse the value as YAML: ")));
}

TEST(ConfigTest, DeviceMappingForms) {
  auto mapping = [](const std::string& value) -> absl::StatusOr<std::vector<int>> {
    absl::StatusOr<PipelineConfig> cfg =
        Parse("exp_name: t\ncritic:\n  worker_cls: C\n  device_mapping: " + value + "\n");
    if (!cfg.ok()) return cfg.status();
    return cfg->critic.device_mapping;
  };
  EXPECT_THAT(*mapping("list(range(0,4))"), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(*mapping("list(range(2, 8, 3))"), ElementsAre(2, 5));
  EXPECT_THAT(*mapping("\"list(range(3))\""), ElementsAre(0, 1, 2));
  EXPECT_THAT(*mapping("[7, 1]"), ElementsAre(7, 1));
  EXPECT_TRUE(mapping("[]")->empty());

  EXPECT_EQ(mapping("range(0,4)").status().message(),
            "mem.yaml:4:19: critic.device_mapping: expected a list of integers or "
            "\"list(range(a,b[,step]))\", got 'range(0,4)'");
  EXPECT_THAT(std::string(mapping("list(range(0,4,0))").status().message()),
              HasSubstr("range() step must not be 0"));
  EXPECT_THAT(std::string(mapping("list(range(4,0))").status().message()),
              HasSubstr("is empty"));
  EXPECT_EQ(mapping("[0, 1, 1]").status().message(),
            "mem.yaml:4:19: critic.device_mapping: device 1 is listed more than once; a cluster "
            "uses each device once");
  EXPECT_EQ(mapping("[0, -1]").status().message(),
            "mem.yaml:4:19: critic.device_mapping: device index -1 must be >= 0");
}

TEST(ConfigTest, WorldSizeMustAgreeWithDeviceMapping) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  device_mapping: [0, 1, 2, 3]\n"
                          "  num_gpus_per_worker: 2\n  world_size: 3\n")),
            "mem.yaml:6:15: critic.world_size: world_size 3 does not match device_mapping: 4 "
            "devices / 2 per worker (num_gpus_per_worker) = 2 workers");
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\ncritic:\n  worker_cls: C\n  device_mapping: [0, 1, 2]\n"
                          "  num_gpus_per_worker: 2\n")),
            "mem.yaml:4:19: critic.device_mapping: device_mapping has 3 devices, which is not a "
            "multiple of num_gpus_per_worker=2");
  absl::StatusOr<PipelineConfig> ok = Parse(
      "exp_name: t\ncritic:\n  worker_cls: C\n  device_mapping: [0, 1, 2, 3]\n"
      "  num_gpus_per_worker: 2\n  world_size: 2\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->critic.world_size, 2);
}

TEST(ConfigTest, TrainingStrategyNamesAreChecked) {
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nactor_train:\n  worker_cls: C\n  strategy_args:\n"
                          "    strategy_name: megatron_train\n")),
            "mem.yaml:5:20: actor_train.strategy_args.strategy_name: unknown training strategy "
            "'megatron_train' (ddp_train: replicated data parallel, the default; fsdp2_train: fully "
            "sharded data parallel)");
  for (const char* name : {"ddp_train", "fsdp2_train"}) {
    auto cfg = Parse(absl::StrCat("exp_name: t\ncritic:\n  worker_cls: C\n  strategy_args:\n"
                                  "    strategy_name: ", name, "\n"));
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    EXPECT_EQ(cfg->critic.strategy_args.strategy_name, name);
  }
  // Tensor parallelism: the generator and the trained models, over the
  // worker's devices; not the reference, not with full sharding.
  EXPECT_NE(ErrorOf(Parse("exp_name: t\nreference:\n  worker_cls: C\n  num_gpus_per_worker: 2\n"
                          "  strategy_args:\n    strategy_config:\n      tensor_model_parallel_size: 2\n"))
                .find("reference.strategy_args.strategy_config.tensor_model_parallel_size: tensor "
                      "parallelism (2) splits the generator (actor_infer) and the trained models "
                      "(actor_train, critic); reference runs whole"),
            std::string::npos);
  for (const char* role : {"actor_train", "critic"}) {
    EXPECT_TRUE(Parse(absl::StrCat("exp_name: t\n", role, ":\n  worker_cls: C\n  num_gpus_per_worker: 2\n"
                                   "  strategy_args:\n    strategy_config:\n      tensor_model_parallel_size: 2\n"))
                    .ok())
        << role;
    EXPECT_NE(ErrorOf(Parse(absl::StrCat("exp_name: t\n", role, ":\n  worker_cls: C\n  num_gpus_per_worker: 2\n"
                                         "  strategy_args:\n    strategy_name: fsdp2_train\n"
                                         "    strategy_config:\n      tensor_model_parallel_size: 2\n")))
                  .find("tensor parallelism (2) with fsdp2_train: the two cannot be combined yet"),
              std::string::npos)
        << role;
  }
  EXPECT_NE(ErrorOf(Parse("exp_name: t\nactor_infer:\n  worker_cls: C\n  num_gpus_per_worker: 2\n"
                          "  strategy_args:\n    strategy_config:\n      tensor_model_parallel_size: 4\n"))
                .find("tensor_model_parallel_size 4 must equal num_gpus_per_worker (2)"),
            std::string::npos);
  EXPECT_TRUE(Parse("exp_name: t\nactor_infer:\n  worker_cls: C\n  num_gpus_per_worker: 2\n"
                    "  strategy_args:\n    strategy_config:\n      tensor_model_parallel_size: 2\n")
                  .ok());
  EXPECT_NE(ErrorOf(Parse("exp_name: t\ndevice_type: cuda\nactor_infer:\n  worker_cls: C\n"
                          "  num_gpus_per_worker: 2\n  strategy_args:\n    strategy_config:\n"
                          "      tensor_model_parallel_size: 2\n"))
                .find("tensor parallelism runs on CPUs only so far (device_type is cuda)"),
            std::string::npos);
  // Generation roles keep whatever they name (the built-in engine runs).
  EXPECT_TRUE(Parse("exp_name: t\nactor_infer:\n  worker_cls: C\n  strategy_args:\n"
                    "    strategy_name: vllm\n").ok());
}

TEST(ConfigTest, DumpReloadsToTheSameConfig) {
  absl::StatusOr<PipelineConfig> cfg = LoadPipelineConfig(TestData("full.yaml"));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  std::string dump = DumpConfigYaml(*cfg);
  // Every key is written, defaults included.
  EXPECT_THAT(dump, HasSubstr("health_check_interval_s: 1.0"));
  EXPECT_THAT(dump, HasSubstr("device_mapping: [0, 1, 2, 3]"));
  EXPECT_THAT(dump, HasSubstr("resume_from_checkpoint: \"\""));
  EXPECT_THAT(dump, HasSubstr("learning_rate: 1e-06"));
  EXPECT_THAT(dump, Not(HasSubstr("critic:")));  // absent roles stay absent

  absl::StatusOr<PipelineConfig> again = ParsePipelineConfig(dump, "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << dump;
  EXPECT_EQ(DumpConfigYaml(*again), dump);
  EXPECT_EQ(again->output_dir, "runs/qwen_rlvr");
  EXPECT_EQ(again->actor_infer.model_args.model_name_or_path, "/models/qwen");
  EXPECT_THAT(again->actor_infer.generating_args.stop_strings,
              ElementsAre("</answer>", "<|im_end|>"));
  EXPECT_EQ(again->rewards.at("math").name, "rewards.math");
  EXPECT_THAT(again->rewards.at("math").tag_included, ElementsAre("deepmath", "aime"));
  EXPECT_EQ(again->PresentRoles().size(), cfg->PresentRoles().size());
}

TEST(ConfigTest, DumpKeepsAwkwardValues) {
  absl::StatusOr<PipelineConfig> cfg = Parse(
      "exp_name: 'null'\noutput_dir: 'a: b # c'\n"
      "critic:\n  worker_cls: C\n  training_args:\n    learning_rate: 0.1\n"
      "    max_grad_norm: 3\n  generating_args:\n    stop_strings: ['', \"\\n\", 'true', '[x']\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  std::string dump = DumpConfigYaml(*cfg);
  absl::StatusOr<PipelineConfig> again = ParsePipelineConfig(dump, "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << dump;
  EXPECT_EQ(again->exp_name, "null");
  EXPECT_EQ(again->output_dir, "a: b # c");
  EXPECT_DOUBLE_EQ(again->critic.training_args.learning_rate, 0.1);
  EXPECT_DOUBLE_EQ(again->critic.training_args.max_grad_norm, 3.0);
  EXPECT_THAT(again->critic.generating_args.stop_strings, ElementsAre("", "\n", "true", "[x"));
  EXPECT_EQ(DumpConfigYaml(*again), dump);
}

TEST(ConfigTest, ExtraRolesForCustomPipelines) {
  LoadOptions options;
  options.extra_roles = {"judge", "teacher"};
  absl::StatusOr<PipelineConfig> cfg = Parse(
      "exp_name: t\njudge:\n  worker_cls: JudgeWorker\n  device_mapping: [0, 1]\n", {}, options);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_EQ(cfg->extra_roles.size(), 2u);
  const WorkerConfig* judge = cfg->FindRole("judge");
  ASSERT_NE(judge, nullptr);
  EXPECT_EQ(judge->name, "judge");
  EXPECT_EQ(judge->worker_cls, "JudgeWorker");
  EXPECT_EQ(judge->world_size, 2);
  EXPECT_EQ(cfg->FindRole("teacher"), nullptr);
  EXPECT_FALSE(cfg->extra_roles.at("teacher").present);
  ASSERT_EQ(cfg->PresentRoles().size(), 1u);

  std::string dump = DumpConfigYaml(*cfg);
  absl::StatusOr<PipelineConfig> again = ParsePipelineConfig(dump, "dump.yaml", {}, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->extra_roles.at("judge").worker_cls, "JudgeWorker");
  EXPECT_EQ(DumpConfigYaml(*again), dump);

  // Without the option the section is unknown; a typo gets the suggestion.
  EXPECT_THAT(ErrorOf(ParsePipelineConfig(dump, "dump.yaml")),
              HasSubstr("judge: unknown key 'judge'"));
  EXPECT_THAT(ErrorOf(Parse("exp_name: t\njduge:\n  worker_cls: J\n", {}, options)),
              HasSubstr("mem.yaml:2:1: jduge: unknown key 'jduge' (did you mean 'judge'?)"));
  // Extra roles are checked like fixed ones.
  EXPECT_EQ(ErrorOf(Parse("exp_name: t\nteacher:\n  world_size: 1\n", {}, options)),
            "mem.yaml:2:1: teacher.worker_cls: missing required value");

  LoadOptions clash;
  clash.extra_roles = {"actor_train"};
  absl::StatusOr<PipelineConfig> bad = Parse("exp_name: t\n", {}, clash);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'actor_train' is already a top-level key"));
}

TEST(ConfigTest, EnumNames) {
  EXPECT_EQ(ToString(DType::kBf16), "bf16");
  EXPECT_EQ(ToString(LrSchedulerType::kCosine), "cosine");
  EXPECT_EQ(ToString(TrackWith::kTensorboard), "tensorboard");
  EXPECT_EQ(ToString(LogLevel::kWarn), "warn");
}

TEST(ConfigTest, EnvManagerSectionsTakeTheirEnvironment) {
  auto cfg = Parse(R"(exp_name: e
train_env_manager:
  worker_cls: environment
  world_size: 2
  env_type: frozen_lake
  env_options: [size=6, is_slippery=true]
  max_env_num_per_worker: 8
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const EnvManagerConfig& t = cfg->train_env_manager;
  EXPECT_TRUE(t.present);
  EXPECT_EQ(t.name, "train_env_manager");
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(t.env_type, "frozen_lake");
  EXPECT_THAT(t.env_options, ElementsAre("size=6", "is_slippery=true"));
  EXPECT_EQ(t.max_env_num_per_worker, 8);
  EXPECT_FALSE(cfg->val_env_manager.present);
  EXPECT_EQ(cfg->FindRole("train_env_manager"), &t);
  EXPECT_EQ(cfg->FindRole("val_env_manager"), nullptr);
  auto again = ParsePipelineConfig(DumpConfigYaml(*cfg), "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->train_env_manager.env_options, ElementsAre("size=6", "is_slippery=true"));
  EXPECT_EQ(again->train_env_manager.max_env_num_per_worker, 8);
  EXPECT_THAT(ErrorOf(Parse("exp_name: e\nval_env_manager: {worker_cls: environment, max_env_num_per_worker: -1}\n")),
              HasSubstr("val_env_manager.max_env_num_per_worker"));
  EXPECT_THAT(ErrorOf(Parse("exp_name: e\nactor_train: {worker_cls: actor, env_type: frozen_lake}\n")),
              HasSubstr("actor_train.env_type"));
}

TEST(ConfigTest, EveryShippedConfigLoads) {
  // The configs users start from (and the docs' commands name) resolve
  // against the current schema; base_local.yaml is a fragment others
  // include (it has no exp_name of its own).
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(ROLL_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml" || entry.path().filename() == "base_local.yaml") continue;
    auto cfg = LoadPipelineConfig(entry.path().string());
    EXPECT_TRUE(cfg.ok()) << entry.path() << ": " << cfg.status();
    ++loaded;
  }
  EXPECT_GE(loaded, 15);
}

TEST(ConfigTest, ReferenceCoversEveryKey) {
  std::string md = ConfigReferenceMarkdown();
  for (const char* key :
       {"`exp_name`", "`track_with`", "`runtime.call_timeout_s`", "`worker_cls`",
        "`device_mapping`", "`model_args.dtype`", "`training_args.lr_scheduler_type`",
        "`generating_args.top_p`", "`strategy_args.strategy_name`", "`tag_included`",
        "`reward_type`", "`env_type`", "`env_options`", "`max_env_num_per_worker`",
        "`fault_tolerance.max_restarts`", "`data.task`", "`sft.max_steps`"}) {
    EXPECT_THAT(md, HasSubstr(key));
  }
  EXPECT_THAT(md, HasSubstr("| `generating_args.top_p` | number | `1.0` | (0, 1] |"));
  EXPECT_THAT(md, HasSubstr("| `exp_name` | string | required |"));
  EXPECT_THAT(md, HasSubstr("one of: fp32, bf16, fp16"));
}

// A choice the code does not implement is refused, not accepted and
// ignored; device_type and chat_template parse into their enums.
TEST(ConfigTest, UnimplementedAttentionKernelIsRefusedAndChoicesBecomeEnums) {
  const std::string err = ErrorOf(Parse("exp_name: t\nactor_train:\n  worker_cls: A\n  model_args:\n"
                                        "    attn_implementation: sdpa\n"));
  EXPECT_NE(err.find("actor_train.model_args.attn_implementation: invalid value 'sdpa': expected one of: eager"),
            std::string::npos)
      << err;
  auto cfg = Parse("exp_name: t\ndevice_type: cuda\nnum_gpus_per_node: 1\ndata:\n  chat_template: chatml\n"
                   "actor_train:\n  worker_cls: A\n  model_args:\n    attn_implementation: eager\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->device_type, DeviceType::kCuda);
  EXPECT_EQ(cfg->data.chat_template, ChatTemplate::kChatml);
  EXPECT_EQ(cfg->actor_train.model_args.attn_implementation, AttnImplementation::kEager);
  EXPECT_NE(ErrorOf(Parse("exp_name: t\ndata:\n  chat_template: llama\n")).find("expected one of: none, chatml"),
            std::string::npos);
}

// docs/config.md is generated; this fails when the schema changed without
// regenerating it.
TEST(ConfigTest, DocsAreInSyncWithSchema) {
  const std::string path = std::string(ROLL_SOURCE_DIR) + "/docs/config.md";
  const std::string actual = testing::ReadFile(path);
  const std::string expected = ConfigReferenceMarkdown();
  if (actual != expected) {
    const std::string fresh = std::string(ROLL_BINARY_DIR) + "/config.md.generated";
    std::ofstream(fresh) << expected;
    ADD_FAILURE() << path << " is out of date with the config schema. Regenerate it with\n"
                  << "  build/bin/roll config --reference > docs/config.md\n"
                  << "or copy the freshly generated " << fresh;
  }
}

}  // namespace
}  // namespace roll
