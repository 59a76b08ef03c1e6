// The agentic pipeline: multi-turn episodes of train_env_manager's
// environments as the rollout, on the same pieces as RLVR:
//
//   rollout      AgenticRollout over actor_infer (token in, token out) and
//                the environment workers (EnvironmentClient, which replaces
//                a dead worker and replays its episodes)
//   train phase  the trajectory batch (response_mask on generated tokens,
//                the group-normalized episode return as the score) through
//                TrainPhase: log-probs, advantages, updates
//   model update actor_train rank 0 to actor_infer (ModelUpdate)
//
// Validation (step 0, then every eval_steps) plays val_batch_size episodes
// on held-out environment seeds (val_env_manager's workers when the config
// has them). Environment seeds follow from (seed, step), so a resumed run
// plays the episodes an uninterrupted one would: no pipeline state is saved
// beyond the step.

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "roll/common/stopwatch.h"
#include "roll/models/tokenizer.h"
#include "roll/pipeline/agentic.h"
#include "roll/pipeline/generation_client.h"
#include "roll/pipeline/pipeline.h"

namespace roll {
namespace {

class AgenticPipeline : public BasePipeline {
 public:
  AgenticPipeline(const PipelineConfig& config, const RunOptions& options) : BasePipeline(config, options) {}

 protected:
  absl::Status CheckConfig() override {
    const PipelineConfig& cfg = config();
    if (cfg.async_generation_ratio > 0) {
      return absl::UnimplementedError(
          "async_generation_ratio: the agentic pipeline trains synchronously for now (docs/async.md); set it to 0");
    }
    if (cfg.downsample_samples_per_group > 0) {
      return absl::InvalidArgumentError(
          "downsample_samples_per_group is the RLVR pipeline's; the agentic pipeline trains every trajectory "
          "(set it to 0)");
    }
    if (!cfg.train_env_manager.present) {
      return absl::InvalidArgumentError("the agentic pipeline needs a train_env_manager section");
    }
    if (cfg.reward_level == RewardLevel::kStep && cfg.adv_estimator != AdvEstimator::kGrpo &&
        cfg.adv_estimator != AdvEstimator::kDrGrpo && cfg.adv_estimator != AdvEstimator::kRloo) {
      return absl::InvalidArgumentError(absl::StrCat("reward_level step normalizes turn returns within env groups: "
                                                     "it works with adv_estimator grpo, dr_grpo or rloo, not '",
                                                     Sv(ToString(cfg.adv_estimator)), "'"));
    }
    const int64_t gs = cfg.train_env_manager.group_size;
    if (cfg.rollout_batch_size % gs != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rollout_batch_size counts trajectories and must be a multiple of train_env_manager.group_size: ",
          cfg.rollout_batch_size, " is not a multiple of ", gs));
    }
    const EnvManagerConfig& val = ValEnvs();
    if (cfg.val_batch_size % val.group_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("val_batch_size counts trajectories and must be a multiple of ",
                                                     ValSection(), ".group_size: ", cfg.val_batch_size,
                                                     " is not a multiple of ", val.group_size));
    }
    const int64_t per_step = MaxTokensPerStep(cfg), sequence = SequenceLength(cfg);
    if (per_step >= sequence) {
      return absl::InvalidArgumentError(absl::StrCat("max_tokens_per_step (", per_step,
                                                     ") must be below sequence_length (", sequence, ")"));
    }
    return absl::OkStatus();
  }

  int64_t SamplesPerStep() const override { return config().rollout_batch_size; }
  std::string SamplesPerStepWhat() const override {
    return absl::StrCat("rollout_batch_size = ", config().rollout_batch_size, " trajectories");
  }

  JobRoles Roles() const override {
    JobRoles r = RolesFor(config());
    r.rewards = false;  // the environments give the rewards
    r.train_envs = true;
    r.val_envs = config().val_env_manager.present;
    return r;
  }

  absl::Status Prepare() override {
    const std::string path =
        (std::filesystem::path(config().actor_infer.model_args.model_name_or_path) / "tokenizer.json").string();
    auto tok = Tokenizer::FromFile(path);
    if (!tok.ok()) {
      return absl::Status(tok.status().code(),
                          absl::StrCat("the agentic pipeline renders turns with actor_infer's tokenizer: ",
                                       tok.status().message()));
    }
    tokenizer_ = std::make_unique<Tokenizer>(*std::move(tok));
    template_ = std::make_unique<TurnTemplate>(config().data.chat_template);
    return absl::OkStatus();
  }

  absl::Status OnClustersStarted() override {
    gen_client_ = std::make_unique<ClusterGenerationClient>(&clusters().actor_infer(), Restarter());
    train_envs_ = MakeEnvClient(clusters().train_envs(), config().train_env_manager);
    if (clusters().val_envs() != nullptr) val_envs_ = MakeEnvClient(clusters().val_envs(), config().val_env_manager);
    return absl::OkStatus();
  }

  void OnClustersStopping() override {
    gen_client_.reset();
    train_envs_.reset();
    val_envs_.reset();
  }

  absl::StatusOr<TrainingBatch> Rollout(int64_t step, Metrics* m) override {
    const Stopwatch t;
    AgenticRolloutOptions o = Options(config().train_env_manager, config().rollout_batch_size, RolloutGenParams(config()));
    ClusterEpisodeHost host(train_envs_.get());
    AgenticRollout rollout(gen_client_.get(), &host, tokenizer_.get(), *template_);
    ROLL_ASSIGN_OR_RETURN(AgenticRolloutResult result, rollout.Collect(o, step));
    (*m)["time/rollout_s"] = t.Seconds();
    for (const auto& [k, v] : result.metrics) (*m)[k] = v;
    return BuildTrajectoryBatch(config(), result.groups);
  }

  absl::Status Validate(int64_t step, Metrics* m) override {
    const Stopwatch t;
    GenParams p = RolloutGenParams(config());
    p.temperature = config().val_temperature;
    AgenticRolloutOptions o = Options(ValEnvs(), config().val_batch_size, p);
    o.validation = true;
    ClusterEpisodeHost host(val_envs_ ? val_envs_.get() : train_envs_.get());
    AgenticRollout rollout(gen_client_.get(), &host, tokenizer_.get(), *template_);
    auto result = rollout.Collect(o, step);
    ROLL_RETURN_IF_ERROR(result.status());  // the loop names the step and the stage
    TrajectoryMetrics(result->groups, "val/", m);
    (*m)["time/val_s"] = t.Seconds();
    return absl::OkStatus();
  }

 protected:
  const EnvManagerConfig& ValEnvs() const {
    return config().val_env_manager.present ? config().val_env_manager : config().train_env_manager;
  }
  std::string ValSection() const {
    return config().val_env_manager.present ? "val_env_manager" : "train_env_manager";
  }
  AgenticRolloutOptions Options(const EnvManagerConfig& env, int64_t trajectories, const GenParams& p) const {
    AgenticRolloutOptions o;
    o.group_size = env.group_size;
    o.groups = trajectories / env.group_size;
    o.group_size_redundancy = env.group_size_redundancy;
    o.max_groups_in_flight = env.num_env_groups;
    o.max_steps = env.max_steps;
    o.max_tokens_per_step = MaxTokensPerStep(config());
    o.sequence_length = SequenceLength(config());
    o.params = p;
    o.seed = static_cast<uint64_t>(config().seed);
    o.tags = env.tags.empty() ? std::vector<std::string>{env.env_type} : env.tags;
    return o;
  }

  std::unique_ptr<EnvironmentClient> MakeEnvClient(Cluster<EnvironmentApi>* envs, const EnvManagerConfig& env) {
    auto client = std::make_unique<EnvironmentClient>(envs, env.max_env_num_per_worker, Restarter());
    if (env.env_timeout_s > 0) client->set_call_timeout(absl::Seconds(env.env_timeout_s));
    return client;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TurnTemplate> template_;
  std::unique_ptr<ClusterGenerationClient> gen_client_;
  std::unique_ptr<EnvironmentClient> train_envs_, val_envs_;
};

// The job of an agentic config with the training left out: each step plays
// one rollout of rollout_batch_size trajectories each way, on the same
// environment seeds, alternating which goes first.
class AgenticRolloutBench : public AgenticPipeline {
 public:
  using AgenticPipeline::AgenticPipeline;

 protected:
  absl::Status Validate(int64_t, Metrics*) override { return absl::OkStatus(); }

  absl::Status Step(int64_t step, Metrics* m) override {
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, m), step, "offload"));
    const GenParams p = RolloutGenParams(config());
    for (int i = 0; i < 2; ++i) {
      const bool lockstep = (i + step) % 2 == 1;
      AgenticRolloutOptions o = Options(config().train_env_manager, config().rollout_batch_size, p);
      o.lockstep = lockstep;
      ClusterEpisodeHost host(train_envs_.get());
      AgenticRollout rollout(gen_client_.get(), &host, tokenizer_.get(), *template_);
      const Stopwatch t;
      auto result = rollout.Collect(o, step);
      ROLL_RETURN_IF_ERROR(AtStage(result.status(), step, lockstep ? "lock-step rollout" : "rollout"));
      const std::string mode = lockstep ? "lockstep/" : "independent/";
      (*m)[mode + "rollout_s"] = t.Seconds();
      for (const auto& [k, v] : result->metrics) (*m)[mode + k] = v;
      Metrics traj;
      TrajectoryMetrics(result->groups, "", &traj);
      (*m)[mode + "success_rate"] = traj["success_rate"];
      (*m)[mode + "steps_mean"] = traj["steps_mean"];
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::string> RunAgenticRolloutBench(PipelineConfig config, int rounds, RunOptions options) {
  if (config.pipeline != "agentic") {
    return absl::InvalidArgumentError(absl::StrCat("bench agentic: the config's pipeline is '", config.pipeline,
                                                   "', not agentic"));
  }
  if (rounds < 1) return absl::InvalidArgumentError("bench agentic: --rounds must be at least 1");
  config.max_steps = rounds;
  config.eval_steps = 0;
  config.save_steps = 0;
  config.resume_from_checkpoint.clear();
  std::vector<Metrics> steps;
  options.on_step = [&](int64_t step, const Metrics& m) {
    if (step > 0) steps.push_back(m);
  };
  AgenticRolloutBench bench(config, options);
  ROLL_RETURN_IF_ERROR(bench.Run());
  // The first round warms the engines up: left out when there are more.
  const size_t first = steps.size() > 1 ? 1 : 0;
  auto mean = [&](const std::string& key) {
    double sum = 0;
    for (size_t i = first; i < steps.size(); ++i) sum += steps[i].count(key) ? steps[i].at(key) : 0.0;
    return sum / static_cast<double>(std::max<size_t>(1, steps.size() - first));
  };
  std::string json = absl::StrCat("{\"bench\": \"agentic\", \"env_type\": \"", config.train_env_manager.env_type,
                                  "\", \"trajectories\": ", config.rollout_batch_size, ", \"group_size\": ",
                                  config.train_env_manager.group_size, ", \"generators\": ",
                                  config.actor_infer.world_size, ", \"rounds_measured\": ", steps.size() - first);
  for (const char* mode : {"independent", "lockstep"}) {
    absl::StrAppend(&json, ", \"", mode, "\": {");
    const char* sep = "";
    for (const char* k : {"rollout_s", "rollout/env_steps", "rollout/env_steps_per_s", "rollout/gen_tokens_per_s",
                          "rollout/gen_in_flight_mean", "rollout/env_time_fraction", "rollout/prefix_cache_hit_rate",
                          "success_rate", "steps_mean"}) {
      std::string name = k;
      if (name.rfind("rollout/", 0) == 0) name = name.substr(8);
      absl::StrAppend(&json, sep, "\"", name, "\": ", mean(absl::StrCat(mode, "/", k)));
      sep = ", ";
    }
    absl::StrAppend(&json, "}");
  }
  const double lock = mean("lockstep/rollout_s"), ind = mean("independent/rollout_s");
  absl::StrAppend(&json, ", \"speedup\": ", ind > 0 ? lock / ind : 0.0, "}");
  return json;
}

ROLL_REGISTER_PIPELINE("agentic", AgenticPipeline);

// RegisterBuiltinPipelines calls it, so that the linker keeps this file
// (and the registration above) in every program that runs pipelines.
void LinkAgenticPipeline() {}

}  // namespace roll
