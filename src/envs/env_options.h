#pragma once
// The "key=value" env_options of an env manager section, read by typed
// getters; Unused() names what no getter asked for, so a misspelt option
// is an error rather than a silent default.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"
#include "roll/envs/environment.h"

namespace roll::envs_internal {

class EnvOptions {
 public:
  // InvalidArgument names an entry without '=' or a key given twice.
  static absl::StatusOr<EnvOptions> Parse(std::string_view env_type, const std::vector<std::string>& key_values);

  // The value of `key` within [lo, hi], or `def` when absent.
  absl::StatusOr<int64_t> Int(const std::string& key, int64_t def, int64_t lo, int64_t hi);
  absl::StatusOr<double> Double(const std::string& key, double def, double lo, double hi);
  absl::StatusOr<bool> Bool(const std::string& key, bool def);
  std::string String(const std::string& key, const std::string& def = "");
  // Every option no getter read so far, now counted as read (the external
  // environment hands them to its server).
  std::map<std::string, std::string> TakeRest();
  // InvalidArgument naming the first option no getter read, and the
  // options the type knows.
  absl::Status CheckAllRead() const;

 private:
  absl::Status Bad(const std::string& key, std::string_view why) const;
  std::string type_;
  std::map<std::string, std::string> values_;
  std::set<std::string> read_;
};

// The index of the move the agent's answer names (ExtractAnswer, case and
// surrounding space ignored) among `names` (lower case), or -1.
int ParseMove(std::string_view text, const std::vector<std::string_view>& names);

// Each environment type reads its options and returns a fresh instance.
absl::StatusOr<std::unique_ptr<Environment>> MakeFrozenLake(EnvOptions* options);
absl::StatusOr<std::unique_ptr<Environment>> MakeSokoban(EnvOptions* options);
absl::StatusOr<std::unique_ptr<Environment>> MakeExternal(EnvOptions* options);

}  // namespace roll::envs_internal
