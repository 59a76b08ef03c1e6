#include "roll/envs/environment.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "envs/env_options.h"

namespace roll {
namespace envs_internal {

absl::StatusOr<EnvOptions> EnvOptions::Parse(std::string_view env_type,
                                             const std::vector<std::string>& key_values) {
  EnvOptions o;
  o.type_ = std::string(env_type);
  for (const std::string& kv : key_values) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("env_options: '", kv, "' is not key=value"));
    }
    const std::string key(absl::StripAsciiWhitespace(kv.substr(0, eq)));
    if (!o.values_.emplace(key, std::string(absl::StripAsciiWhitespace(kv.substr(eq + 1)))).second) {
      return absl::InvalidArgumentError(absl::StrCat("env_options: '", key, "' is given twice"));
    }
  }
  return o;
}

absl::Status EnvOptions::Bad(const std::string& key, std::string_view why) const {
  return absl::InvalidArgumentError(
      absl::StrCat("env_options: ", key, "=", values_.at(key), ": ", std::string(why), " (env_type ", type_, ")"));
}

absl::StatusOr<int64_t> EnvOptions::Int(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  read_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) return Bad(key, "not an integer");
  if (v < lo || v > hi) return Bad(key, absl::StrCat("must lie in [", lo, ", ", hi, "]"));
  return v;
}

absl::StatusOr<double> EnvOptions::Double(const std::string& key, double def, double lo, double hi) {
  read_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v)) return Bad(key, "not a number");
  if (!(v >= lo && v <= hi)) return Bad(key, absl::StrCat("must lie in [", lo, ", ", hi, "]"));
  return v;
}

absl::StatusOr<bool> EnvOptions::Bool(const std::string& key, bool def) {
  read_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  bool v = false;
  if (!absl::SimpleAtob(it->second, &v)) return Bad(key, "not true or false");
  return v;
}

std::string EnvOptions::String(const std::string& key, const std::string& def) {
  read_.insert(key);
  auto it = values_.find(key);
  return it == values_.end() ? def : it->second;
}

std::map<std::string, std::string> EnvOptions::TakeRest() {
  std::map<std::string, std::string> rest;
  for (const auto& [key, value] : values_) {
    if (read_.insert(key).second) rest.emplace(key, value);
  }
  return rest;
}

absl::Status EnvOptions::CheckAllRead() const {
  for (const auto& [key, value] : values_) {
    if (!read_.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("env_options: unknown option '", key, "' for env_type ", type_,
                                                     " (known: ", absl::StrJoin(read_, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

int ParseMove(std::string_view text, const std::vector<std::string_view>& names) {
  const std::string a = absl::AsciiStrToLower(std::string(ExtractAnswer(text)));
  for (size_t i = 0; i < names.size(); ++i) {
    if (a == names[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace envs_internal

std::vector<std::string> EnvironmentTypes() { return {"frozen_lake", "sokoban", "external"}; }

absl::StatusOr<std::unique_ptr<Environment>> MakeEnvironment(std::string_view env_type,
                                                             const std::vector<std::string>& options) {
  ROLL_ASSIGN_OR_RETURN(envs_internal::EnvOptions o, envs_internal::EnvOptions::Parse(env_type, options));
  absl::StatusOr<std::unique_ptr<Environment>> env;
  if (env_type == "frozen_lake") {
    env = envs_internal::MakeFrozenLake(&o);
  } else if (env_type == "sokoban") {
    env = envs_internal::MakeSokoban(&o);
  } else if (env_type == "external") {
    env = envs_internal::MakeExternal(&o);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown env_type '", std::string(env_type),
                                                   "' (known: ", absl::StrJoin(EnvironmentTypes(), ", "), ")"));
  }
  if (!env.ok()) return env.status();
  ROLL_RETURN_IF_ERROR(o.CheckAllRead());
  return env;
}

std::string FormatAnswer(std::string_view move) { return absl::StrCat("<answer>", Sv(move), "</answer>"); }

std::string_view ExtractAnswer(std::string_view text) {
  const size_t open = text.rfind("<answer>");
  if (open != std::string_view::npos) {
    text.remove_prefix(open + 8);
    const size_t close = text.find("</answer>");
    if (close != std::string_view::npos) text = text.substr(0, close);
  }
  const absl::string_view trimmed = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  return std::string_view(trimmed.data(), trimmed.size());
}

}  // namespace roll
