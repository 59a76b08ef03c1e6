#include "roll/common/cli_args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

namespace roll {

absl::StatusOr<CliArgs> CliArgs::Parse(const std::vector<std::string>& argv,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags) {
  CliArgs out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) {
      out.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (bool_flags.count(name)) {
      if (value) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      out.values_[name] = "true";
    } else if (value_flags.count(name)) {
      if (!value) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
        }
        value = argv[++i];
      }
      out.values_[name] = *value;
      out.all_[name].push_back(*value);
    } else {
      std::vector<std::string> known;
      for (const auto& f : value_flags) known.push_back("--" + f);
      for (const auto& f : bool_flags) known.push_back("--" + f);
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (known: ",
                                                     absl::StrJoin(known, " "), ")"));
    }
  }
  return out;
}

std::string CliArgs::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> CliArgs::GetAll(const std::string& name) const {
  auto it = all_.find(name);
  return it == all_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<std::string> CliArgs::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
  return it->second;
}

absl::StatusOr<int64_t> CliArgs::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", name, ": expected an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> CliArgs::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", name, ": expected a number, got '", it->second, "'"));
  }
  return v;
}

}  // namespace roll
