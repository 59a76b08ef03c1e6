#include "roll/common/config.h"

#include <yaml-cpp/yaml.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_schema.h"
#include "common/config_schemas.h"
#include "common/config_tree.h"

namespace roll {
namespace {

using config_internal::ConfigNode;
using config_internal::Diagnostics;
using config_internal::Origin;
using config_internal::ParseContext;
using config_internal::Range;
using config_internal::Schema;
using namespace config_internal;  // the schemas of config_schemas.h

bool IsIdentifier(const std::string& s) {
  if (s.empty() || !(absl::ascii_isalpha(s[0]) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_')) return false;
  }
  return true;
}

absl::Status CheckOptions(const LoadOptions& options) {
  std::vector<std::string> known = PipelineSchema().Names();
  known.push_back("defaults");
  for (const std::string& name : options.extra_roles) {
    if (!IsIdentifier(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadOptions.extra_roles: '", name, "' is not a plain identifier"));
    }
    if (std::find(known.begin(), known.end(), name) != known.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadOptions.extra_roles: '", name, "' is already a top-level key"));
    }
  }
  return absl::OkStatus();
}

// Checks between keys of one present role; derives world_size.
void ValidateRole(WorkerConfig* role, const Origin& section_origin, ParseContext& ctx) {
  const std::string& p = role->name;
  const std::string dm_path = p + ".device_mapping";
  const std::string ws_path = p + ".world_size";
  const std::string ng_path = p + ".num_gpus_per_worker";
  const int devices = static_cast<int>(role->device_mapping.size());
  const int per_worker = role->num_gpus_per_worker;
  if (p == "actor_train" || p == "critic") {
    // The training strategies (TrainStrategy: replicated or fully sharded).
    const std::string sn_path = p + ".strategy_args.strategy_name";
    const std::string& sn = role->strategy_args.strategy_name;
    if (!sn.empty() && sn != "ddp_train" && sn != "fsdp2_train") {
      ctx.diag->Error(ctx.OriginOf(sn_path, section_origin), sn_path,
                      absl::StrCat("unknown training strategy '", sn,
                                   "' (ddp_train: replicated data parallel, the default; "
                                   "fsdp2_train: fully sharded data parallel)"));
    }
  }
  {
    const std::string tp_path = p + ".strategy_args.strategy_config.tensor_model_parallel_size";
    const int tp = role->strategy_args.strategy_config.tensor_model_parallel_size;
    const bool splits = p == "actor_infer" || p == "actor_train" || p == "critic";
    if (tp > 1 && !splits) {
      ctx.diag->Error(ctx.OriginOf(tp_path, section_origin), tp_path,
                      absl::StrCat("tensor parallelism (", tp, ") splits the generator (actor_infer) and the "
                                   "trained models (actor_train, critic); ", p, " runs whole"));
    } else if (tp > 1 && role->strategy_args.strategy_name == "fsdp2_train") {
      ctx.diag->Error(ctx.OriginOf(tp_path, section_origin), tp_path,
                      absl::StrCat("tensor parallelism (", tp, ") with fsdp2_train: the two cannot be "
                                   "combined yet; use one of them"));
    } else if (tp > 1 && tp != per_worker) {
      ctx.diag->Error(ctx.OriginOf(tp_path, section_origin), tp_path,
                      absl::StrCat("tensor_model_parallel_size ", tp, " must equal num_gpus_per_worker (",
                                   per_worker, "): a worker's devices form its tensor-parallel group"));
    }
  }
  if (devices == 0) {
    if (role->world_size == 0) role->world_size = 1;
    return;
  }
  if (devices % per_worker != 0) {
    ctx.diag->Error(ctx.OriginOf(dm_path, ctx.OriginOf(ng_path, section_origin)), dm_path,
                    absl::StrCat("device_mapping has ", devices,
                                 " devices, which is not a multiple of num_gpus_per_worker=",
                                 per_worker));
    return;
  }
  const int derived = devices / per_worker;
  if (role->world_size == 0) {
    role->world_size = derived;
  } else if (role->world_size != derived) {
    ctx.diag->Error(ctx.OriginOf(ws_path, section_origin), ws_path,
                    absl::StrCat("world_size ", role->world_size,
                                 " does not match device_mapping: ", devices, " devices / ",
                                 per_worker, " per worker (num_gpus_per_worker) = ", derived,
                                 " workers"));
  }
}

// A role set to null (e.g. override `critic=null`) is absent.
void DropNullRoles(ConfigNode* root, const LoadOptions& options) {
  std::vector<std::string> names;
  for (const FixedRole& r : FixedRoles()) names.push_back(r.name);
  for (const EnvRole& r : EnvRoles()) names.push_back(r.name);
  names.insert(names.end(), options.extra_roles.begin(), options.extra_roles.end());
  for (const std::string& n : names) {
    const ConfigNode* node = root->Find(n);
    if (node != nullptr && node->IsNull()) root->Erase(n);
  }
  if (ConfigNode* rewards = root->Find("rewards"); rewards && rewards->IsMap()) {
    std::vector<std::string> null_domains;
    for (const ConfigNode& c : rewards->children) {
      if (c.IsNull()) null_domains.push_back(c.key);
    }
    for (const std::string& d : null_domains) rewards->Erase(d);
  }
}

absl::StatusOr<PipelineConfig> BuildConfig(ConfigNode root,
                                           const std::vector<std::string>& overrides,
                                           const LoadOptions& options, Diagnostics* diag) {
  for (const std::string& o : overrides) config_internal::ApplyOverride(&root, o, diag);
  config_internal::ResolveInterpolations(&root, diag);
  DropNullRoles(&root, options);

  PipelineConfig cfg;
  for (auto& [name, section] : FixedSections(cfg)) section->name = name;
  for (const std::string& n : options.extra_roles) cfg.extra_roles[n].name = n;

  ParseContext ctx;
  ctx.diag = diag;
  Schema<PipelineConfig>::ExtraKeys extra;
  extra.names = options.extra_roles;
  extra.parse = [&](const ConfigNode& node, const std::string& path) {
    WorkerConfig* w = &cfg.extra_roles[path];
    w->present = true;
    ctx.origins[path] = node.key_origin;
    WorkerSchema().Parse(node, path, w, ctx);
  };
  PipelineSchema().Parse(root, "", &cfg, ctx, &extra);

  for (auto& [name, section] : FixedSections(cfg)) {
    if (const ConfigNode* n = root.Find(name)) {
      section->present = true;
      ctx.origins[name] = n->key_origin;
    }
  }
  for (const WorkerConfig* role : cfg.PresentRoles()) {
    WorkerConfig* mutable_role = const_cast<WorkerConfig*>(role);
    ValidateRole(mutable_role, ctx.OriginOf(role->name, root.origin), ctx);
    const std::string tp_path = role->name + ".strategy_args.strategy_config.tensor_model_parallel_size";
    if (role->strategy_args.strategy_config.tensor_model_parallel_size > 1 && cfg.device_type != DeviceType::kCpu) {
      // The slices of a worker stay on its device and talk over Gloo.
      ctx.diag->Error(ctx.OriginOf(tp_path, ctx.OriginOf(role->name, root.origin)), tp_path,
                      absl::StrCat("tensor parallelism runs on CPUs only so far (device_type is ",
                                   std::string(ToString(cfg.device_type)), ")"));
    }
  }
  ROLL_RETURN_IF_ERROR(diag->ToStatus());
  return cfg;
}

std::string Cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

template <class T>
void AppendTable(const Schema<T>& schema, const std::string& prefix, std::string* out,
                 bool include_sections = true) {
  absl::StrAppend(out, "| Key | Type | Default | Allowed | Description |\n");
  absl::StrAppend(out, "| --- | --- | --- | --- | --- |\n");
  for (const auto& f : schema.fields()) {
    bool section = !f.nested_keys.empty() || f.type == "map of name -> section";
    if (section && !include_sections) continue;
    std::string def;
    if (f.required) {
      def = "required";
    } else if (section) {
      def = "—";
    } else {
      def = absl::StrCat("`", f.default_text, "`");
    }
    std::string allowed = section ? "—" : f.constraint.empty() ? "any" : f.constraint;
    absl::StrAppend(out, "| `", prefix, f.name, "` | ", Cell(f.type), " | ", def, " | ",
                    Cell(allowed), " | ", Cell(f.doc), " |\n");
  }
  absl::StrAppend(out, "\n");
}

// The rows of the keys `schema` adds to a role section.
template <class T>
void AppendExtraKeys(const Schema<T>& schema, std::string* out) {
  const std::vector<std::string> worker_keys = WorkerSchema().Names();
  for (const auto& f : schema.fields()) {
    if (std::find(worker_keys.begin(), worker_keys.end(), f.name) != worker_keys.end()) continue;
    absl::StrAppend(out, "| `", f.name, "` | ", Cell(f.type), " | `", f.default_text, "` | ",
                    Cell(f.constraint.empty() ? "any" : f.constraint), " | ", Cell(f.doc), " |\n");
  }
}

}  // namespace

std::string_view ToString(DType v) { return NameOf(DTypeNames(), v); }
std::string_view ToString(LrSchedulerType v) { return NameOf(LrSchedulerNames(), v); }
std::string_view ToString(TrackWith v) { return NameOf(TrackWithNames(), v); }
std::string_view ToString(LogLevel v) { return NameOf(LogLevelNames(), v); }
std::string_view ToString(DeviceType v) { return NameOf(DeviceTypeNames(), v); }
std::string_view ToString(ChatTemplate v) { return NameOf(ChatTemplateNames(), v); }
std::string_view ToString(AttnImplementation v) { return NameOf(AttnImplementationNames(), v); }

const WorkerConfig* PipelineConfig::FindRole(std::string_view name) const {
  for (const auto& [role, w] : FixedSections(*this)) {
    if (name == role) return w->present ? w : nullptr;
  }
  constexpr std::string_view kRewards = "rewards.";
  if (name.substr(0, kRewards.size()) == kRewards) {
    auto it = rewards.find(std::string(name.substr(kRewards.size())));
    return it != rewards.end() && it->second.present ? &it->second : nullptr;
  }
  auto it = extra_roles.find(std::string(name));
  return it != extra_roles.end() && it->second.present ? &it->second : nullptr;
}

std::vector<const WorkerConfig*> PipelineConfig::PresentRoles() const {
  std::vector<const WorkerConfig*> out;
  for (const auto& [role, w] : FixedSections(*this)) {
    if (w->present) out.push_back(w);
  }
  for (const auto& [domain, r] : rewards) {
    if (r.present) out.push_back(&r);
  }
  for (const auto& [name, w] : extra_roles) {
    if (w.present) out.push_back(&w);
  }
  return out;
}

absl::StatusOr<PipelineConfig> ParsePipelineConfig(std::string_view yaml_text,
                                                   std::string_view source_name,
                                                   const std::vector<std::string>& overrides,
                                                   const LoadOptions& options) {
  ROLL_RETURN_IF_ERROR(CheckOptions(options));
  Diagnostics diag;
  ConfigNode root =
      config_internal::LoadTreeWithDefaults(yaml_text, std::string(source_name), &diag);
  // Unreadable files leave holes in the tree; checking the rest would only
  // add follow-on errors.
  ROLL_RETURN_IF_ERROR(diag.ToStatus());
  return BuildConfig(std::move(root), overrides, options, &diag);
}

absl::StatusOr<PipelineConfig> LoadPipelineConfig(const std::string& path,
                                                  const std::vector<std::string>& overrides,
                                                  const LoadOptions& options) {
  absl::StatusOr<std::string> text = config_internal::ReadTextFile(path);
  if (!text.ok()) return text.status();
  return ParsePipelineConfig(*text, path, overrides, options);
}

std::string DumpConfigYaml(const PipelineConfig& config) {
  YAML::Emitter e;
  e << YAML::Comment("Resolved roll-cpp pipeline config: every key, defaults filled in.");
  e << YAML::BeginMap;
  PipelineSchema().EmitFields(config, e);
  for (const auto& [name, w] : config.extra_roles) {
    if (!w.present) continue;
    e << YAML::Key << name << YAML::Value;
    WorkerSchema().Emit(w, e);
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::string ConfigReferenceMarkdown() {
  std::string out;
  absl::StrAppend(&out, R"md(# Configuration reference

<!-- Generated from the KEY tables of include/roll/common/config.h; do not edit by hand.
     Regenerate with: build/bin/roll config --reference > docs/config.md -->

A pipeline is configured by one YAML file in ROLL's shape: top-level run
keys, a `runtime` section, and one section per role. Every key below is
optional unless its default says **required**; an absent key takes the
default shown.

Each key is declared once, as one row of its section's KEY table in
`include/roll/common/config.h`:
`KEY(parser, type, name, default, "description", range or choices)`. The
row makes the struct field with its default, the parsing and validation,
the dump of `roll config` and the key's line on this page. A new key is one
new row (then regenerate this page); the top-level keys are grouped by
concern (run, batch, advantage, policy loss, KL and value, rollout,
reward, async, validation, model update, resources) while the YAML stays
flat.

## Loading rules

- **Base files.** `defaults: [base.yaml, other.yaml]` lists files applied in
  order and deep-merged (maps merge key by key; lists and scalars are
  replaced), the including file on top. Paths are relative to the including
  file; `.yaml` may be left out. Base files may have their own `defaults`;
  cycles are errors.
- **Overrides.** `key.path=value` on the command line sets one key after the
  files are merged. The value is parsed as YAML (`actor_train.device_mapping=[0,1]`,
  `exp_name=run2`); an override may create keys the schema knows
  (`rewards.math.worker_cls=MathReward` creates a reward domain).
- **Interpolation.** `${other.key}` is replaced by the value at that path of
  the merged tree (after overrides). A value that is only `${a.b}` takes the
  referenced value whole (a number, list or section); inside a longer string
  the referenced scalar is embedded (`output_dir: runs/${exp_name}`). References
  may chain; list items are addressed by index (`${a.list.0}`); cycles are errors.
- **Roles.** A role section is present when it appears in the YAML (after
  merging and overrides); a section set to `null` is absent. Present roles
  must name a `worker_cls`. Custom pipelines may declare extra role sections,
  parsed like any other role.
- **Errors.** Every problem is reported, one per line, as
  `file.yaml:LINE:COL: key.path: message` (overrides are named as
  `override 'a.b=c'`): unknown keys (with a suggestion), wrong types, missing
  required values, values out of range and invalid enum values.

)md");

  absl::StrAppend(&out, "## Top-level keys\n\n");
  AppendTable(PipelineSchema(), "", &out);

  absl::StrAppend(&out, "## `runtime`\n\n");
  AppendTable(RuntimeSchema(), "runtime.", &out);
  absl::StrAppend(&out, "## `data`\n\n");
  AppendTable(DataArgsSchema(), "data.", &out);
  absl::StrAppend(&out, "## `fault_tolerance`\n\n");
  AppendTable(FaultToleranceSchema(), "fault_tolerance.", &out);
  absl::StrAppend(&out, "## `sft`\n\n");
  AppendTable(SftArgsSchema(), "sft.", &out);

  absl::StrAppend(&out, R"md(## Role sections

The sections `actor_train`, `actor_infer`, `reference`, `critic`,
`rewards.<domain>`, `train_env_manager`, `val_env_manager` (and extra roles a
custom pipeline declares) all take these keys:

)md");
  AppendTable(WorkerSchema(), "", &out);
  absl::StrAppend(&out, R"md(Checks between keys of a present role:

- `device_mapping` indices are `>= 0` and unique within the role.
- `len(device_mapping)` is a multiple of `num_gpus_per_worker`.
- When both `world_size` and `device_mapping` are given,
  `world_size == len(device_mapping) / num_gpus_per_worker`.

)md");
  absl::StrAppend(&out, "### `model_args`\n\n");
  AppendTable(ModelArgsSchema(), "model_args.", &out);
  absl::StrAppend(&out, "### `training_args`\n\n");
  AppendTable(TrainingArgsSchema(), "training_args.", &out);
  absl::StrAppend(&out, "### `generating_args`\n\n");
  AppendTable(GeneratingArgsSchema(), "generating_args.", &out);
  absl::StrAppend(&out, "### `strategy_args`\n\n");
  AppendTable(StrategyArgsSchema(), "strategy_args.", &out);

  absl::StrAppend(&out,
                  "### Extra keys of `rewards.<domain>`\n\n"
                  "| Key | Type | Default | Allowed | Description |\n"
                  "| --- | --- | --- | --- | --- |\n");
  AppendExtraKeys(RewardSchema(), &out);
  absl::StrAppend(&out,
                  "\n### Extra keys of `train_env_manager` and `val_env_manager`\n\n"
                  "| Key | Type | Default | Allowed | Description |\n"
                  "| --- | --- | --- | --- | --- |\n");
  AppendExtraKeys(EnvManagerSchema(), &out);
  return out;
}

}  // namespace roll
