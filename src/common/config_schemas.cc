// The config's schemas (common/config_schemas.h), made from the KEY tables
// of roll/common/config.h, where every key is declared once.

#include "common/config_schemas.h"

#include "absl/strings/str_cat.h"

namespace roll::config_internal {
namespace {

const Range kNonNegative = Range::AtLeast(0);
const Range kPositive = Range::AtLeast(1);
const Range kPositiveReal = Range::Above(0);

// The choices of a string key: each spelling stands for itself.
std::vector<std::pair<std::string, std::string>> Choices(std::initializer_list<const char*> names) {
  std::vector<std::pair<std::string, std::string>> v;
  for (const char* n : names) v.emplace_back(n, n);
  return v;
}

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
const std::vector<std::pair<std::string, DeviceType>>& DeviceTypeNames() {
  static const auto* v = new std::vector<std::pair<std::string, DeviceType>>{
      {"cpu", DeviceType::kCpu}, {"cuda", DeviceType::kCuda}};
  return *v;
}
const std::vector<std::pair<std::string, ChatTemplate>>& ChatTemplateNames() {
  static const auto* v = new std::vector<std::pair<std::string, ChatTemplate>>{
      {"none", ChatTemplate::kNone}, {"chatml", ChatTemplate::kChatml}};
  return *v;
}
const std::vector<std::pair<std::string, AttnImplementation>>& AttnImplementationNames() {
  static const auto* v =
      new std::vector<std::pair<std::string, AttnImplementation>>{{"eager", AttnImplementation::kEager}};
  return *v;
}
const std::vector<std::pair<std::string, LogLevel>>& LogLevelNames() {
  static const auto* v = new std::vector<std::pair<std::string, LogLevel>>{
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}};
  return *v;
}

// A KEY row (roll/common/config.h) as an entry of the schema `s` of
// section struct T.
#define ROLL_SCHEMA_KEY(parser, type, name, default_value, description, ...) \
  s->parser(#name, &T::name, description, ##__VA_ARGS__);

// `function()`: the schema of section struct `Struct`, the rows of `table`.
#define ROLL_DEFINE_SCHEMA(function, Struct, table)  \
  const Schema<Struct>& function() {                 \
    static const auto* schema = [] {                 \
      using T = Struct;                              \
      auto* s = new Schema<T>;                       \
      table(ROLL_SCHEMA_KEY)                         \
      return s;                                      \
    }();                                             \
    return *schema;                                  \
  }

ROLL_DEFINE_SCHEMA(ModelArgsSchema, ModelArgs, ROLL_MODEL_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(TrainingArgsSchema, TrainingArgs, ROLL_TRAINING_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(GeneratingArgsSchema, GeneratingArgs, ROLL_GENERATING_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(StrategyConfigSchema, StrategyConfig, ROLL_STRATEGY_CONFIG_KEYS)
ROLL_DEFINE_SCHEMA(StrategyArgsSchema, StrategyArgs, ROLL_STRATEGY_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(WorkerSchema, WorkerConfig, ROLL_WORKER_CONFIG_KEYS)
ROLL_DEFINE_SCHEMA(DataArgsSchema, DataArgs, ROLL_DATA_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(FaultToleranceSchema, FaultToleranceArgs, ROLL_FAULT_TOLERANCE_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(SftArgsSchema, SftArgs, ROLL_SFT_ARGS_KEYS)
ROLL_DEFINE_SCHEMA(RuntimeSchema, RuntimeConfig, ROLL_RUNTIME_CONFIG_KEYS)

const Schema<RewardConfig>& RewardSchema() {
  static const auto* schema = [] {
    using T = RewardConfig;
    auto* s = new Schema<T>;
    s->Inherit(WorkerSchema());
    ROLL_REWARD_CONFIG_KEYS(ROLL_SCHEMA_KEY)
    return s;
  }();
  return *schema;
}

const Schema<EnvManagerConfig>& EnvManagerSchema() {
  static const auto* schema = [] {
    using T = EnvManagerConfig;
    auto* s = new Schema<T>;
    s->Inherit(WorkerSchema());
    ROLL_ENV_MANAGER_CONFIG_KEYS(ROLL_SCHEMA_KEY)
    return s;
  }();
  return *schema;
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
  static const auto* schema = [] {
    using T = PipelineConfig;
    auto* s = new Schema<T>;
    ROLL_PIPELINE_CONFIG_KEYS(ROLL_SCHEMA_KEY)
    for (const FixedRole& role : FixedRoles()) {
      auto member = role.member;
      s->Section(role.name, member, role.doc, &WorkerSchema(),
                 [member](const PipelineConfig& c) { return (c.*member).present; });
    }
    for (const EnvRole& role : EnvRoles()) {
      auto member = role.member;
      s->Section(role.name, member, role.doc, &EnvManagerSchema(),
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
  return *schema;
}

}  // namespace roll::config_internal
