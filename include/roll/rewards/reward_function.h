#pragma once
// Rule-based rewards behind one interface, chosen by a reward section's
// `reward_type`. docs/rewards.md describes each.
//
//   math_rule     final-answer extraction and numeric equivalence (math_verifier.h)
//   format        the response matches a regular expression
//   code_sandbox  the program passes the test cases in a sandbox (code_sandbox.h)
//   countdown     the expression uses the given numbers and hits the target
//
// A RewardFunction is stateless after construction; Score may be called
// from several threads at once.

#include <memory>
#include <string>
#include <vector>
#include <string_view>

#include "roll/common/status.h"

namespace roll {

struct RewardInput {
  std::string response;
  std::string ground_truth;
  std::string tag;
};

struct RewardResult {
  double score = 0.0;
  std::string reason;     // why: "correct", "answer 12 != 13", "timeout after 2s", ...
  std::string extracted;  // what was compared (the final answer), when any
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // An error only for input the reward cannot judge at all (e.g. a ground
  // truth that does not parse); a wrong response is a score of 0.
  virtual absl::StatusOr<RewardResult> Score(const RewardInput& in) const = 0;
};

// `options_json`: a JSON object of the reward's options, or empty.
// InvalidArgument names an unknown type (listing the known ones) or option.
absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRewardFunction(std::string_view reward_type,
                                                                   const std::string& options_json);

// The `reward_options` of a rewards.<domain> section ("key=value" strings)
// as the JSON object MakeRewardFunction takes: a value that parses as JSON
// (a number, true/false, a quoted string, a list) is that value, anything
// else is a string. InvalidArgument names an entry without '=' or a key
// given twice.
absl::StatusOr<std::string> RewardOptionsJson(const std::vector<std::string>& key_values);

}  // namespace roll
