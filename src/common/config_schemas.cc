// The config's schemas (common/config_schemas.h): every key of every
// section, declared once with its type, default, range and description.

#include "common/config_schemas.h"

#include "absl/strings/str_cat.h"

namespace roll::config_internal {
namespace {

const Range kNonNegative = Range::AtLeast(0);
const Range kPositive = Range::AtLeast(1);
const Range kPositiveReal = Range::Above(0);

}  // namespace

// Enum spellings, shared by the schema (parse, dump, docs) and ToString.
const std::vector<std::pair<std::string, DType>>& DTypeNames() {
  static const auto* v = new std::vector<std::pair<std::string, DType>>{
      {"fp32", DType::kFp32}, {"bf16", DType::kBf16}, {"fp16", DType::kFp16}};
  return *v;
}
const std::vector<std::pair<std::string, LrSchedulerType>>& LrSchedulerNames() {
  static const auto* v = new std::vector<std::pair<std::string, LrSchedulerType>>{
      {"constant", LrSchedulerType::kConstant},
      {"cosine", LrSchedulerType::kCosine},
      {"linear", LrSchedulerType::kLinear}};
  return *v;
}
const std::vector<std::pair<std::string, TrackWith>>& TrackWithNames() {
  static const auto* v = new std::vector<std::pair<std::string, TrackWith>>{
      {"stdout", TrackWith::kStdout}, {"tensorboard", TrackWith::kTensorboard}};
  return *v;
}
const std::vector<std::pair<std::string, LogLevel>>& LogLevelNames() {
  static const auto* v = new std::vector<std::pair<std::string, LogLevel>>{
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}};
  return *v;
}



const Schema<ModelArgs>& ModelArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<ModelArgs>;
    s->String("model_name_or_path", &ModelArgs::model_name_or_path,
              "Hugging Face model directory. Empty: the worker loads no model (e.g. rule-based "
              "rewards).")
        .Enum("dtype", &ModelArgs::dtype, DTypeNames(), "Parameter and compute dtype.")
        .String("attn_implementation", &ModelArgs::attn_implementation,
                "Attention kernel: `eager` or `sdpa`.")
        .Bool("fp32_lm_head", &ModelArgs::fp32_lm_head,
              "Compute the LM head's logits in float32 when the model is bf16 or fp16 (ScaleRL's FP32 "
              "precision at the LM head), for training and generation alike.");
    return s;
  }();
  return *s;
}

const Schema<TrainingArgs>& TrainingArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<TrainingArgs>;
    s->Double("learning_rate", &TrainingArgs::learning_rate, "Peak learning rate.", kNonNegative)
        .Double("weight_decay", &TrainingArgs::weight_decay, "Decoupled weight decay.",
                kNonNegative)
        .Integer("per_device_train_batch_size", &TrainingArgs::per_device_train_batch_size,
                 "Micro-batch size per training worker.", kPositive)
        .Integer("gradient_accumulation_steps", &TrainingArgs::gradient_accumulation_steps,
                 "Micro-batches accumulated per optimizer step.", kPositive)
        .Double("max_grad_norm", &TrainingArgs::max_grad_norm,
                "Gradient clipping norm; 0 disables clipping.", kNonNegative)
        .Integer("warmup_steps", &TrainingArgs::warmup_steps,
                 "Linear warm-up of the learning rate, in optimizer updates. A run with no more "
                 "updates than this stays in the warm-up (no decay phase).",
                 kNonNegative)
        .Enum("lr_scheduler_type", &TrainingArgs::lr_scheduler_type, LrSchedulerNames(),
              "Learning-rate schedule after warm-up.")
        .Integer("num_train_epochs", &TrainingArgs::num_train_epochs,
                 "Passes over the data (SFT).", kPositive);
    return s;
  }();
  return *s;
}

const Schema<GeneratingArgs>& GeneratingArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<GeneratingArgs>;
    s->Integer("max_new_tokens", &GeneratingArgs::max_new_tokens,
               "Most tokens generated per response.", kPositive)
        .Double("temperature", &GeneratingArgs::temperature,
                "Sampling temperature; 0 means greedy.", kNonNegative)
        .Double("top_p", &GeneratingArgs::top_p, "Nucleus sampling probability mass.",
                Range{0.0, 1.0, true, false})
        .Integer("top_k", &GeneratingArgs::top_k, "Top-k filtering; 0 disables it.",
                 kNonNegative)
        .Integer("num_return_sequences", &GeneratingArgs::num_return_sequences,
                 "Responses generated per prompt.", kPositive)
        .StringList("stop_strings", &GeneratingArgs::stop_strings,
                    "Generation stops after any of these strings.")
        .Bool("do_sample", &GeneratingArgs::do_sample, "Sample; false decodes greedily.");
    return s;
  }();
  return *s;
}

const Schema<StrategyConfig>& StrategyConfigSchema() {
  static const auto* s = [] {
    auto* s = new Schema<StrategyConfig>;
    s->Bool("enable_prefix_caching", &StrategyConfig::enable_prefix_caching,
            "Generation roles: a request whose prompt starts with the tokens of a finished one (a "
            "multi-turn episode's next turn) reuses their cached keys and values and prefills only "
            "the rest. Dropped at every model update.")
        .Integer("tensor_model_parallel_size", &StrategyConfig::tensor_model_parallel_size,
                 "actor_infer, actor_train, critic: the model split over this many tensor-parallel "
                 "ranks (attention heads, MLP and vocabulary; docs/parallelism.md), one per device "
                 "of the worker, so it must equal num_gpus_per_worker. 1: unsplit. Not with "
                 "fsdp2_train; other roles: 1. CPUs only so far.",
                 kPositive);
    return s;
  }();
  return *s;
}

const Schema<StrategyArgs>& StrategyArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<StrategyArgs>;
    s->String("strategy_name", &StrategyArgs::strategy_name,
              "Training roles (actor_train, critic): `ddp_train` (replicated data parallel, the "
              "default when empty) or `fsdp2_train` (fully sharded: parameters, gradients and "
              "optimizer state split over the ranks, docs/parallelism.md). Generation roles run "
              "the built-in engine whatever it says.")
        .Section("strategy_config", &StrategyArgs::strategy_config, &StrategyConfigSchema(),
                 "Settings of the strategy.");
    return s;
  }();
  return *s;
}

template <class T>
void AddWorkerFields(Schema<T>* s) {
  s->String("worker_cls", &T::worker_cls, "Registered worker type name.", /*required=*/true)
      .Section("model_args", &T::model_args, &ModelArgsSchema(), "Model to load.")
      .Section("training_args", &T::training_args, &TrainingArgsSchema(),
               "Optimizer and schedule (training roles).")
      .Section("generating_args", &T::generating_args, &GeneratingArgsSchema(),
               "Sampling settings (generation roles).")
      .Section("strategy_args", &T::strategy_args, &StrategyArgsSchema(),
               "Train/infer strategy.")
      .DeviceMapping("device_mapping", &T::device_mapping,
                     "Devices the cluster occupies, `num_gpus_per_worker` per worker in order. "
                     "Empty: the cluster uses no devices.")
      .Integer("world_size", &T::world_size,
               "Number of workers. 0 derives it: `len(device_mapping) / num_gpus_per_worker`, "
               "or 1 without a device_mapping. When both are given they must agree.",
               kNonNegative)
      .Integer("num_gpus_per_worker", &T::num_gpus_per_worker,
               "Devices per worker; `len(device_mapping)` must be a multiple of it.", kPositive)
      .Integer("infer_batch_size", &T::infer_batch_size,
               "Micro-batch size of forward-only passes (log-probs, values, rewards).", kPositive);
}

const Schema<WorkerConfig>& WorkerSchema() {
  static const auto* s = [] {
    auto* s = new Schema<WorkerConfig>;
    AddWorkerFields(s);
    return s;
  }();
  return *s;
}

const Schema<RewardConfig>& RewardSchema() {
  static const auto* s = [] {
    auto* s = new Schema<RewardConfig>;
    s->Inherit(WorkerSchema())
        .StringList("tag_included", &RewardConfig::tag_included,
                    "Data tags (domains) whose samples this reward worker scores.")
        .String("reward_type", &RewardConfig::reward_type,
                "Reward kind interpreted by the worker (e.g. `math_rule`).")
        .StringList("reward_options", &RewardConfig::reward_options,
                    "Options of the reward as `key=value` strings, e.g. `[timeout_s=2, cpu_s=1]` "
                    "(docs/rewards.md lists them per reward_type).");
    return s;
  }();
  return *s;
}

const Schema<EnvManagerConfig>& EnvManagerSchema() {
  static const auto* s = [] {
    auto* s = new Schema<EnvManagerConfig>;
    s->Inherit(WorkerSchema())
        .String("env_type", &EnvManagerConfig::env_type,
                "Environment the workers host (`frozen_lake`, `sokoban`, `external`; docs/environments.md).")
        .StringList("env_options", &EnvManagerConfig::env_options,
                    "Options of the environment as `key=value` strings, e.g. `[size=4, is_slippery=false]` "
                    "(docs/environments.md lists them per env_type).")
        .Integer("max_env_num_per_worker", &EnvManagerConfig::max_env_num_per_worker,
                 "Episodes one worker may hold at once; 0: no limit.", kNonNegative)
        .Integer("num_env_groups", &EnvManagerConfig::num_env_groups,
                 "Agentic: env groups in flight at once; 0: every group of a step (or validation) at once.",
                 kNonNegative)
        .Integer("group_size", &EnvManagerConfig::group_size,
                 "Agentic: episodes per group; they share the group's environment seed and form one "
                 "group for the group-relative advantage.",
                 kPositive)
        .StringList("tags", &EnvManagerConfig::tags,
                    "Agentic: labels of the groups (given in turn) for per-tag metrics; empty: the env_type.")
        .Integer("max_steps", &EnvManagerConfig::max_steps,
                 "Agentic: turns per episode before it ends as truncated; 0: the environment's own limit.",
                 kNonNegative)
        .Integer("group_size_redundancy", &EnvManagerConfig::group_size_redundancy,
                 "Agentic: extra episodes per group; the first group_size to finish make the group, so an "
                 "episode lost to an environment failure is replaced.",
                 kNonNegative)
        .Double("env_timeout_s", &EnvManagerConfig::env_timeout_s,
                "Agentic: deadline of one environment call in seconds; 0: runtime.call_timeout_s.",
                kNonNegative);
    return s;
  }();
  return *s;
}

std::vector<std::pair<std::string, std::string>> Choices(std::initializer_list<const char*> names) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const char* n : names) v.emplace_back(n, n);
  return v;
}

const Schema<DataArgs>& DataArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<DataArgs>;
    s->StringList("train_files", &DataArgs::train_files,
                  "JSONL files of training prompts; empty: generate `task`.")
        .StringList("val_files", &DataArgs::val_files,
                    "JSONL files of validation prompts; empty: generated with `task`, or the "
                    "last `num_val` training records held out.")
        .Enum("task", &DataArgs::task, Choices({"arithmetic", "countdown"}),
              "Synthetic task generated when no files are given.")
        .StringList("task_options", &DataArgs::task_options,
                    "Task generator settings as `key=value` (docs/data.md).")
        .Integer("num_train", &DataArgs::num_train, "Generated training prompts.", kPositive)
        .Integer("num_val", &DataArgs::num_val, "Validation prompts.", kPositive)
        .String("default_tag", &DataArgs::default_tag, "Domain tag of records without one.")
        .String("prompt_template", &DataArgs::prompt_template,
                "Wraps each prompt; `{prompt}` is replaced by the record's prompt.")
        .Enum("chat_template", &DataArgs::chat_template, Choices({"none", "chatml"}),
              "`chatml` renders messages with the ChatML template.");
    return s;
  }();
  return *s;
}

const Schema<FaultToleranceArgs>& FaultToleranceSchema() {
  static const auto* s = [] {
    auto* s = new Schema<FaultToleranceArgs>;
    s->Integer("max_restarts", &FaultToleranceArgs::max_restarts,
               "Restarts a run may make: a reward worker that dies is replaced (with its cluster) "
               "and its in-flight samples are scored again; a dead actor_infer rank is replaced "
               "alone and its in-flight requests are sent again; a dead worker of actor_train, "
               "reference or critic restarts the job from the newest checkpoint. 0: a dead worker "
               "fails the run.",
               kNonNegative);
    return s;
  }();
  return *s;
}

const Schema<SftArgs>& SftArgsSchema() {
  static const auto* s = [] {
    auto* s = new Schema<SftArgs>;
    s->String("output_dir", &SftArgs::output_dir, "Where `roll sft` writes the model.")
        .String("init_from", &SftArgs::init_from,
                "Model to start from; empty: a random Qwen2-shaped model of the shape below with "
                "a character tokenizer.")
        .Integer("num_layers", &SftArgs::num_layers, "Layers of a fresh model.", kPositive)
        .Integer("hidden_size", &SftArgs::hidden_size, "Hidden size of a fresh model.", kPositive)
        .Integer("num_attention_heads", &SftArgs::num_attention_heads, "Attention heads.",
                 kPositive)
        .Integer("num_key_value_heads", &SftArgs::num_key_value_heads, "Key/value heads.",
                 kPositive)
        .Integer("intermediate_size", &SftArgs::intermediate_size, "MLP width.", kPositive)
        .Integer("max_steps", &SftArgs::max_steps, "Optimizer steps.", kPositive)
        .Integer("batch_size", &SftArgs::batch_size, "Sequences per step.", kPositive)
        .Integer("micro_batch_size", &SftArgs::micro_batch_size,
                 "Sequences per forward and backward pass (gradients accumulate over a step); 0: batch_size. "
                 "Long sequences (agentic episodes) train faster in small micro-batches.",
                 kNonNegative)
        .Double("learning_rate", &SftArgs::learning_rate, "Peak learning rate.", kPositiveReal)
        .Integer("warmup_steps", &SftArgs::warmup_steps, "Linear warm-up steps.", kNonNegative)
        .Double("answer_noise", &SftArgs::answer_noise,
                "Fraction of training answers replaced by wrong ones (a weaker base model).",
                Range{0.0, 1.0, false, true})
        .Double("expert_moves", &SftArgs::expert_moves,
                "Agentic configs: fraction of the demonstrated moves that are the first move of a shortest "
                "solution from the episode's state (breadth-first search over replays of the episode); the "
                "rest are random. 0: random play (a base that knows the format, not the task).",
                Range{0.0, 1.0})
        .StringList("env_options", &SftArgs::env_options,
                    "Agentic configs: the environment options of the demonstrated episodes (same env_type), "
                    "e.g. every level while RL trains on the hard ones; empty: train_env_manager.env_options.");
    return s;
  }();
  return *s;
}

const Schema<RuntimeConfig>& RuntimeSchema() {
  static const auto* s = [] {
    auto* s = new Schema<RuntimeConfig>;
    s->String("bind_address", &RuntimeConfig::bind_address,
              "Address the controller's services bind to. Multi-node jobs need an address the "
              "other nodes reach (docs/multinode.md).")
        .Integer("controller_port", &RuntimeConfig::controller_port,
                 "Port of the controller's service; 0 picks a free port. Multi-node jobs fix it "
                 "so that agents know where to register.",
                 Range{0, 65535})
        .String("token_file", &RuntimeConfig::token_file,
                "File holding the job token every RPC carries; `roll agent --token-file` reads the "
                "same file. Created (mode 0600, a random token) when missing. Empty: a fresh "
                "random token per job, which only single-node jobs can use.")
        .Double("node_timeout_s", &RuntimeConfig::node_timeout_s,
                "Seconds the controller waits for the agents of nodes 1..num_nodes-1 to register.",
                kPositiveReal)
        .Double("call_timeout_s", &RuntimeConfig::call_timeout_s,
                "Deadline of one worker method call, in seconds.", kPositiveReal)
        .Double("health_check_interval_s", &RuntimeConfig::health_check_interval_s,
                "Seconds between health checks of each worker.", kPositiveReal)
        .Double("worker_timeout_s", &RuntimeConfig::worker_timeout_s,
                "A worker that does not answer health checks this long is declared dead.",
                kPositiveReal)
        .Double("startup_timeout_s", &RuntimeConfig::startup_timeout_s,
                "Seconds a started worker has to register with the controller.", kPositiveReal)
        .Double("controller_grace_s", &RuntimeConfig::controller_grace_s,
                "Seconds a worker survives without reaching the controller.", kPositiveReal)
        .Enum("log_level", &RuntimeConfig::log_level, LogLevelNames(), "Log verbosity.")
        .String("worker_binary", &RuntimeConfig::worker_binary,
                "Executable started for workers; empty means the running executable.")
        .Integer("threads_per_worker", &RuntimeConfig::threads_per_worker,
                 "LibTorch intra-op threads of each worker process; 0 means the machine's "
                 "cores divided by the cluster's workers (at least 1).",
                 kNonNegative)
        .String("tls_cert_file", &RuntimeConfig::tls_cert_file,
                "PEM certificate every control-plane server of the job presents; with "
                "`tls_key_file` it turns TLS on. Empty: plaintext (the job token still guards "
                "every call).")
        .String("tls_key_file", &RuntimeConfig::tls_key_file, "PEM private key of `tls_cert_file`.")
        .String("tls_ca_file", &RuntimeConfig::tls_ca_file,
                "PEM CA certificate clients trust; empty: `tls_cert_file` itself (self-signed).")
        .Bool("slurm", &RuntimeConfig::slurm,
              "Inside a Slurm allocation (SLURM_JOB_ID set), `roll run` takes num_nodes and the "
              "node addresses from it and starts the agents of nodes 1.. with srun "
              "(docs/multinode.md). false: ignore Slurm.")
        .String("bind_interface", &RuntimeConfig::bind_interface,
                "In a Slurm allocation: the network interface (e.g. ib0) whose IPv4 address the "
                "controller, agents and workers bind to on each node; empty: the address Slurm "
                "has for the node (NodeAddr).");
    return s;
  }();
  return *s;
}


const std::vector<FixedRole>& FixedRoles() {
  static const auto* v = new std::vector<FixedRole>{
      {"actor_train", &PipelineConfig::actor_train, "The policy being trained."},
      {"actor_infer", &PipelineConfig::actor_infer, "Generation (rollout) workers of the policy."},
      {"reference", &PipelineConfig::reference, "Frozen reference policy for the KL term."},
      {"critic", &PipelineConfig::critic, "Value model (PPO/GAE)."},
  };
  return *v;
}


const std::vector<EnvRole>& EnvRoles() {
  static const auto* v = new std::vector<EnvRole>{
      {"train_env_manager", &PipelineConfig::train_env_manager,
       "Environment workers for training rollouts (agentic pipelines)."},
      {"val_env_manager", &PipelineConfig::val_env_manager,
       "Environment workers for validation rollouts (agentic pipelines)."},
  };
  return *v;
}


const Schema<PipelineConfig>& PipelineSchema() {
  static const auto* s = [] {
    auto* s = new Schema<PipelineConfig>;
    s->String("exp_name", &PipelineConfig::exp_name, "Experiment name.", /*required=*/true)
        .String("pipeline", &PipelineConfig::pipeline,
                "Pipeline `roll run` runs, by registered name: `rlvr`, or one a program registers "
                "(docs/pipelines.md); an unknown name is refused with the known ones.")
        .Integer("seed", &PipelineConfig::seed, "Random seed of the run.", kNonNegative)
        .String("output_dir", &PipelineConfig::output_dir,
                "Directory for metrics.jsonl, logs and checkpoints.")
        .Integer("max_steps", &PipelineConfig::max_steps,
                 "Training steps; 0 only evaluates.", kNonNegative)
        .Integer("save_steps", &PipelineConfig::save_steps,
                 "Checkpoint every N steps; 0 disables periodic checkpoints.", kNonNegative)
        .Integer("logging_steps", &PipelineConfig::logging_steps, "Print the progress line every N steps (metrics.jsonl gets every step).",
                 kPositive)
        .Integer("eval_steps", &PipelineConfig::eval_steps,
                 "Evaluate every N steps; 0 disables periodic evaluation.", kNonNegative)
        .String("resume_from_checkpoint", &PipelineConfig::resume_from_checkpoint,
                "Checkpoint directory to resume from; empty or `false`: start fresh; `latest`: the "
                "newest checkpoint under output_dir, or a fresh start when there is none (a "
                "requeued job).",
                /*required=*/false, /*false_is_empty=*/true)
        .Integer("rollout_batch_size", &PipelineConfig::rollout_batch_size,
                 "Prompts per training step.", kPositive)
        .Integer("val_batch_size", &PipelineConfig::val_batch_size,
                 "Prompts per validation batch.", kPositive)
        .Integer("num_return_sequences_in_group", &PipelineConfig::num_return_sequences_in_group,
                 "Responses sampled per prompt (the group of group-relative advantages).",
                 kPositive)
        .Integer("prompt_length", &PipelineConfig::prompt_length, "Most prompt tokens.",
                 kPositive)
        .Integer("response_length", &PipelineConfig::response_length,
                 "Most response tokens.", kPositive)
        .Integer("sequence_length", &PipelineConfig::sequence_length,
                 "Agentic: most tokens of a trajectory (all turns); an episode that would exceed it ends "
                 "as truncated. 0: prompt_length + response_length.",
                 kNonNegative)
        .Integer("max_tokens_per_step", &PipelineConfig::max_tokens_per_step,
                 "Agentic: most tokens generated in one turn; 0: actor_infer.generating_args.max_new_tokens.",
                 kNonNegative)
        .Enum("track_with", &PipelineConfig::track_with, TrackWithNames(),
              "Metrics sink besides metrics.jsonl.")
        .Integer("ppo_epochs", &PipelineConfig::ppo_epochs,
                 "Optimization passes over each rollout batch.", kPositive)
        .Bool("deterministic", &PipelineConfig::deterministic,
              "Reproducible runs: a resumed run repeats an uninterrupted one.")
        .Enum("adv_estimator", &PipelineConfig::adv_estimator,
              AdvEstimatorNames(),
              "Advantage estimator (docs/algorithms.md).")
        .Double("gamma", &PipelineConfig::gamma, "Discount factor.", Range{0.0, 1.0})
        .Double("lambd", &PipelineConfig::lambd, "GAE lambda.", Range{0.0, 1.0})
        .Enum("norm_mean_type", &PipelineConfig::norm_mean_type, NormTypeNames(),
              "Baseline subtracted from outcome rewards.")
        .Enum("norm_std_type", &PipelineConfig::norm_std_type, NormTypeNames(),
              "Standard deviation outcome rewards are divided by.")
        .Bool("whiten_advantages", &PipelineConfig::whiten_advantages,
              "Whiten advantages over the batch's response tokens.")
        .Double("advantage_clip", &PipelineConfig::advantage_clip,
                "Clip advantages to [-c, c]; 0 disables.", kNonNegative)
        .Double("reward_clip", &PipelineConfig::reward_clip, "Clip rewards to [-c, c]; 0 disables.",
                kNonNegative)
        .Enum("reward_level", &PipelineConfig::reward_level, RewardLevelNames(),
              "Agentic: `trajectory` gives every turn the episode's return; `step` gives each turn its "
              "discounted return from that turn on (step_reward_gamma), normalized over the turns of its env "
              "group (grpo, dr_grpo, rloo).")
        .Double("step_reward_gamma", &PipelineConfig::step_reward_gamma,
                "Agentic, reward_level step: discount of later steps' rewards in a turn's return.",
                Range{0.0, 1.0})
        .Enum("pg_variant", &PipelineConfig::pg_variant,
              PgVariantNames(), "Policy loss.")
        .Double("pg_clip", &PipelineConfig::pg_clip, "PPO clip range epsilon.", kNonNegative)
        .Double("pg_clip_low", &PipelineConfig::pg_clip_low,
                "Lower clip epsilon (DAPO clip-higher); 0: pg_clip.", kNonNegative)
        .Double("pg_clip_high", &PipelineConfig::pg_clip_high,
                "Upper clip epsilon (DAPO clip-higher); 0: pg_clip.", kNonNegative)
        .Bool("dual_clip_loss", &PipelineConfig::dual_clip_loss,
              "Dual clip for negative advantages.")
        .Double("dual_clip_c", &PipelineConfig::dual_clip_c, "Dual-clip constant c.",
                Range::Above(1))
        .Enum("loss_agg_mode", &PipelineConfig::loss_agg_mode,
              LossAggModeNames(),
              "How per-token losses become the step loss.")
        .Enum("rollout_is", &PipelineConfig::rollout_is, RolloutIsNames(),
              "Train/inference mismatch correction: each token's loss times the truncated importance weight "
              "min(pi_old / pi_generator, rollout_is_cap), per token or per sequence (docs/algorithms.md).")
        .Double("rollout_is_cap", &PipelineConfig::rollout_is_cap,
                "Truncation cap of the rollout_is weights.", kPositiveReal)
        .Bool("use_decoupled_loss", &PipelineConfig::use_decoupled_loss,
              "The PPO ratio's old policy: true, the trainer's log-probs recomputed before the update "
              "(AReaL's proximal policy; with rollout_is, the decoupled objective); false, the generator's own "
              "log-probs (no recompute pass).")
        .Bool("async_recompute_kv", &PipelineConfig::async_recompute_kv,
              "Asynchronous training: on a model update, the sequences in flight run their prefix through the new "
              "weights again (their KV cache recomputed) instead of keeping the old weights' keys and values.")
        .Bool("filter_zero_variance_groups", &PipelineConfig::filter_zero_variance_groups,
              "ScaleRL's zero-variance filtering: groups whose samples all scored alike get no loss (masked "
              "out of the step's batch; not resampled, unlike dynamic_sampling).")
        .Integer("downsample_samples_per_group", &PipelineConfig::downsample_samples_per_group,
                 "PODS max-variance down-sampling (RLVR): of each group's num_return_sequences_in_group samples, "
                 "train only this many, those whose rewards vary most (the highest and lowest scores); all are "
                 "generated and scored. 0: train every sample.",
                 kNonNegative)
        .Double("positive_pass_rate", &PipelineConfig::positive_pass_rate,
                "ScaleRL's No-Positive-Resampling (RLVR): a training prompt whose pass rate over all the samples "
                "generated for it in trained steps reaches this is not drawn again in later epochs. 0: off.",
                Range{0.0, 1.0})
        .Integer("interrupt_min_tokens", &PipelineConfig::interrupt_min_tokens,
                 "ScaleRL's forced length interruption (RLVR): a response still going after a budget drawn per "
                 "sample from [interrupt_min_tokens, interrupt_max_tokens] gets interrupt_text appended (masked "
                 "from the loss) and interrupt_answer_tokens more to answer. 0: off.",
                 kNonNegative)
        .Integer("interrupt_max_tokens", &PipelineConfig::interrupt_max_tokens,
                 "Upper end of the interruption budget's range.", kNonNegative)
        .Integer("interrupt_answer_tokens", &PipelineConfig::interrupt_answer_tokens,
                 "Tokens the answer may take after the interruption phrase.", kNonNegative)
        .String("interrupt_text", &PipelineConfig::interrupt_text,
                "The phrase appended at the interruption.")
        .Integer("async_generation_ratio", &PipelineConfig::async_generation_ratio,
                 "Asynchronous training (docs/async.md): generation runs up to this many model versions ahead "
                 "of training (k), with in-flight model updates; no sample is trained more than k versions "
                 "after its first token. 0: synchronous.",
                 kNonNegative)
        .Bool("use_kl_loss", &PipelineConfig::use_kl_loss,
              "Add kl_loss_coef x KL(policy, reference) to the loss (needs `reference`).")
        .Double("kl_loss_coef", &PipelineConfig::kl_loss_coef, "Weight of the KL loss.",
                kNonNegative)
        .Enum("kl_penalty", &PipelineConfig::kl_penalty,
              KlPenaltyNames(), "KL estimator.")
        .Bool("add_token_level_kl", &PipelineConfig::add_token_level_kl,
              "Subtract init_kl_coef x KL from the token rewards (needs `reference`).")
        .Double("init_kl_coef", &PipelineConfig::init_kl_coef, "Weight of the KL in the reward.",
                kNonNegative)
        .Double("entropy_loss_coef", &PipelineConfig::entropy_loss_coef,
                "Entropy bonus weight (subtracted from the loss).", kNonNegative)
        .Double("value_clip", &PipelineConfig::value_clip, "Critic value clip; 0 disables.",
                kNonNegative)
        .Bool("dynamic_sampling", &PipelineConfig::dynamic_sampling,
              "DAPO dynamic sampling: drop zero-variance groups and sample more prompts.")
        .Enum("intrinsic_reward", &PipelineConfig::intrinsic_reward,
              IntrinsicRewardNames(),
              "RLVR: train on a reward that needs no ground truth (docs/diagnostics.md); the reward workers still "
              "score each sample for reward/accuracy.")
        .Double("collapse_threshold", &PipelineConfig::collapse_threshold,
                "Reward accuracy below which a step counts toward the model collapse step.", Range{0.0, 1.0})
        .Integer("collapse_patience", &PipelineConfig::collapse_patience,
                 "Window of steps whose mean reward accuracy must lie below collapse_threshold (the collapse step is its first).", kPositive)
        .Integer("max_additional_rounds", &PipelineConfig::max_additional_rounds,
                 "Extra sampling rounds dynamic sampling may use per step.", kNonNegative)
        .Double("redundant_prompts", &PipelineConfig::redundant_prompts,
                "Extra prompts submitted beyond the batch, as a fraction; the surplus is "
                "aborted.",
                Range{0.0, 4.0})
        .Bool("overlong_mask", &PipelineConfig::overlong_mask,
              "Responses cut at response_length get no loss.")
        .Integer("overlong_buffer_len", &PipelineConfig::overlong_buffer_len,
                 "Soft overlong penalty buffer in tokens; 0 disables.", kNonNegative)
        .Double("overlong_penalty_factor", &PipelineConfig::overlong_penalty_factor,
                "Largest soft overlong penalty.", kNonNegative)
        .StringList("val_pass_k", &PipelineConfig::val_pass_k,
                    "k values of the pass@k validation metrics.")
        .Integer("val_num_return_sequences", &PipelineConfig::val_num_return_sequences,
                 "Responses per validation prompt (>= the largest k).", kPositive)
        .Double("val_temperature", &PipelineConfig::val_temperature,
                "Validation sampling temperature; 0 decodes greedily.", kNonNegative)
        .Integer("model_update_buffer_size_mb", &PipelineConfig::model_update_buffer_size_mb,
                 "Staging memory of the trainer-to-generator weight broadcast (split into "
                 "slots so that packing and transfers overlap).",
                 kPositive)
        .Bool("colocated_weight_update", &PipelineConfig::colocated_weight_update,
              "Generator ranks that share a device (CPU slot or GPU) with actor_train rank 0 take "
              "the model update through host shared memory instead of the broadcast (no "
              "network). Must stay on where a GPU is shared so: NCCL cannot put two ranks of "
              "the weight-sync group on one GPU.")
        .Enum("offload_states", &PipelineConfig::offload_states, OffloadStatesNames(),
              "Clusters that share devices with another cluster move their parameters, optimizer "
              "state and KV cache off the device while the other's stage runs. auto: always on "
              "cuda, never on cpu.")
        .String("offload_dir", &PipelineConfig::offload_dir,
                "Directory for the spill files of offloaded CPU tensors; empty: the system's "
                "temporary directory, or `/var/tmp` when that is a tmpfs (docs/placement.md, "
                "\"Offload\").")
        .Integer("num_nodes", &PipelineConfig::num_nodes,
                 "Nodes of the job; device index i lives on node i / num_gpus_per_node.", kPositive)
        .Integer("num_gpus_per_node", &PipelineConfig::num_gpus_per_node,
                 "Devices per node (CPU slots when device_type is cpu). 0: on cpu, the host's "
                 "cores / cpu_threads_per_slot; on cuda it must be set.",
                 kNonNegative)
        .Enum("device_type", &PipelineConfig::device_type, Choices({"cpu", "cuda"}),
              "What a device index names: a CPU slot (`cpu_threads_per_slot` threads) or a GPU.")
        .Integer("cpu_threads_per_slot", &PipelineConfig::cpu_threads_per_slot,
                 "LibTorch threads of one CPU slot; a worker with k slots runs k x this many.",
                 kPositive)
        .Section("data", &PipelineConfig::data, &DataArgsSchema(), "Prompts (docs/data.md).")
        .Section("sft", &PipelineConfig::sft, &SftArgsSchema(), "`roll sft` settings.")
        .Section("fault_tolerance", &PipelineConfig::fault_tolerance, &FaultToleranceSchema(),
                 "What happens when a worker dies.")
        .Section("runtime", &PipelineConfig::runtime, &RuntimeSchema(),
                 "Controller/worker runtime settings.");
    for (const FixedRole& role : FixedRoles()) {
      auto member = role.member;
      s->Section(role.name, member, &WorkerSchema(), role.doc,
                 [member](const PipelineConfig& c) { return (c.*member).present; });
    }
    for (const EnvRole& role : EnvRoles()) {
      auto member = role.member;
      s->Section(role.name, member, &EnvManagerSchema(), role.doc,
                 [member](const PipelineConfig& c) { return (c.*member).present; });
    }
    s->SectionMap("rewards", &PipelineConfig::rewards, &RewardSchema(),
                  "Reward workers by domain: `rewards.<domain>` is a role section with the "
                  "extra keys `tag_included` and `reward_type`.",
                  [](const std::string& path, RewardConfig* r) {
                    r->name = path;
                    r->present = true;
                  });
    return s;
  }();
  return *s;
}

}  // namespace roll::config_internal
