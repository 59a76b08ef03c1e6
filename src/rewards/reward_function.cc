#include "roll/rewards/reward_function.h"

#include <regex>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "roll/data/tasks.h"
#include "roll/rewards/math_verifier.h"

namespace roll {
namespace {

class MathRule : public RewardFunction {
 public:
  explicit MathRule(MathVerifyOptions o) : o_(o) {}
  absl::StatusOr<RewardResult> Score(const RewardInput& in) const override {
    MathVerifyResult v = VerifyMath(in.response, in.ground_truth, o_);
    return RewardResult{v.correct ? 1.0 : 0.0, v.reason, v.extracted.value_or("")};
  }

 private:
  MathVerifyOptions o_;
};

class FormatReward : public RewardFunction {
 public:
  FormatReward(std::regex re, std::string pattern) : re_(std::move(re)), pattern_(std::move(pattern)) {}
  absl::StatusOr<RewardResult> Score(const RewardInput& in) const override {
    const bool ok = std::regex_search(in.response, re_);
    return RewardResult{ok ? 1.0 : 0.0, ok ? "format ok" : absl::StrCat("does not match ", pattern_), ""};
  }

 private:
  std::regex re_;
  std::string pattern_;
};

class CountdownReward : public RewardFunction {
 public:
  absl::StatusOr<RewardResult> Score(const RewardInput& in) const override {
    ROLL_ASSIGN_OR_RETURN(CountdownResult r, CountdownScore(in.response, in.ground_truth));
    return RewardResult{r.score, r.reason, ""};
  }
};

absl::StatusOr<nlohmann::json> ParseOptions(std::string_view type, const std::string& text,
                                            std::initializer_list<const char*> known) {
  nlohmann::json j = nlohmann::json::object();
  if (!text.empty()) {
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(type), " options: ", e.what()));
    }
    if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(std::string(type), " options: expected an object"));
  }
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* name : known) ok |= k == name;
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(std::string(type), " has no option '", k, "'"));
  }
  return j;
}

}  // namespace

// Defined in code_sandbox.cc.
absl::StatusOr<std::unique_ptr<RewardFunction>> MakeCodeSandboxReward(const std::string& options_json);

absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRewardFunction(std::string_view type,
                                                                   const std::string& options_json) {
  if (type == "math_rule") {
    ROLL_ASSIGN_OR_RETURN(nlohmann::json j, ParseOptions(type, options_json, {"last_number_fallback"}));
    MathVerifyOptions o;
    if (j.contains("last_number_fallback")) {
      if (!j["last_number_fallback"].is_boolean()) {
        return absl::InvalidArgumentError("math_rule option 'last_number_fallback' must be true or false");
      }
      o.last_number_fallback = j["last_number_fallback"].get<bool>();
    }
    return std::unique_ptr<RewardFunction>(new MathRule(o));
  }
  if (type == "format") {
    ROLL_ASSIGN_OR_RETURN(nlohmann::json j, ParseOptions(type, options_json, {"pattern"}));
    if (j.contains("pattern") && !j["pattern"].is_string()) {
      return absl::InvalidArgumentError("format option 'pattern' must be a string");
    }
    // Default: reasoning in <think> tags, then an answer.
    std::string pattern = j.value("pattern", std::string(R"(^<think>[\s\S]*</think>[\s\S]*\S)"));
    try {
      return std::unique_ptr<RewardFunction>(new FormatReward(std::regex(pattern), pattern));
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrCat("format pattern '", pattern, "': ", e.what()));
    }
  }
  if (type == "countdown") {
    ROLL_RETURN_IF_ERROR(ParseOptions(type, options_json, {}).status());
    return std::unique_ptr<RewardFunction>(new CountdownReward());
  }
  if (type == "code_sandbox") return MakeCodeSandboxReward(options_json);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown reward_type '", std::string(type), "' (known: math_rule, format, code_sandbox, countdown)"));
}

absl::StatusOr<std::string> RewardOptionsJson(const std::vector<std::string>& key_values) {
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& kv : key_values) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("reward_options: '", kv, "' is not key=value"));
    }
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (out.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("reward_options: '", key, "' is given twice"));
    }
    nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    out[key] = v.is_discarded() ? nlohmann::json(value) : v;
  }
  return key_values.empty() ? std::string() : out.dump();
}

}  // namespace roll
