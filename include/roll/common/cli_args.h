#pragma once
// Minimal command-line parsing for the `roll` subcommands: `--name value`,
// `--name=value`, boolean `--flag`, and positional arguments. Every flag a
// command reads must be declared, so a misspelt flag is an error, not silence.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

class CliArgs {
 public:
  // `value_flags` take a value, `bool_flags` do not (names without "--").
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& argv,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Every value of a flag given more than once (e.g. --model A --model B),
  // in order; Get and the others read the last.
  std::vector<std::string> GetAll(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
  std::vector<std::string> positional_;
};

}  // namespace roll
