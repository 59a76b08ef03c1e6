#pragma once
// The config's schemas, one per section struct (the keys, their types,
// defaults, ranges and descriptions: what parsing, the dump, validation and
// docs/config.md all come from), and the enum spellings they share with
// ToString. Private to roll::common; config.cc loads and documents with
// them.

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/config_schema.h"
#include "roll/common/config.h"

namespace roll::config_internal {

template <class E>
std::string_view NameOf(const std::vector<std::pair<std::string, E>>& names, E v) {
  for (const auto& [text, value] : names) {
    if (value == v) return text;
  }
  return "unknown";
}

const std::vector<std::pair<std::string, DType>>& DTypeNames();
const std::vector<std::pair<std::string, LrSchedulerType>>& LrSchedulerNames();
const std::vector<std::pair<std::string, TrackWith>>& TrackWithNames();
const std::vector<std::pair<std::string, LogLevel>>& LogLevelNames();
const std::vector<std::pair<std::string, DeviceType>>& DeviceTypeNames();
const std::vector<std::pair<std::string, ChatTemplate>>& ChatTemplateNames();
const std::vector<std::pair<std::string, AttnImplementation>>& AttnImplementationNames();
const Schema<ModelArgs>& ModelArgsSchema();
const Schema<TrainingArgs>& TrainingArgsSchema();
const Schema<GeneratingArgs>& GeneratingArgsSchema();
const Schema<StrategyConfig>& StrategyConfigSchema();
const Schema<StrategyArgs>& StrategyArgsSchema();
const Schema<WorkerConfig>& WorkerSchema();
const Schema<RewardConfig>& RewardSchema();
const Schema<EnvManagerConfig>& EnvManagerSchema();
const Schema<DataArgs>& DataArgsSchema();
const Schema<FaultToleranceArgs>& FaultToleranceSchema();
const Schema<SftArgs>& SftArgsSchema();
const Schema<RuntimeConfig>& RuntimeSchema();
const Schema<PipelineConfig>& PipelineSchema();

// The fixed role sections: the model roles and the environment managers.
struct FixedRole {
  const char* name;
  WorkerConfig PipelineConfig::*member;
  const char* doc;
};
const std::vector<FixedRole>& FixedRoles();

struct EnvRole {
  const char* name;
  EnvManagerConfig PipelineConfig::*member;
  const char* doc;
};
const std::vector<EnvRole>& EnvRoles();

// Every fixed role section of `cfg` (model roles, then env managers) with
// its name. Cfg: PipelineConfig or const PipelineConfig.
template <class Cfg>
auto FixedSections(Cfg& cfg) {
  using W = std::conditional_t<std::is_const_v<Cfg>, const WorkerConfig, WorkerConfig>;
  std::vector<std::pair<const char*, W*>> out;
  for (const FixedRole& r : FixedRoles()) out.emplace_back(r.name, &(cfg.*r.member));
  for (const EnvRole& r : EnvRoles()) out.emplace_back(r.name, &(cfg.*r.member));
  return out;
}

}  // namespace roll::config_internal
