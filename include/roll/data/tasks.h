#pragma once
// Synthetic verifiable tasks, so examples and tests need no download. Each
// generator is deterministic in its seed; train and validation prompts are
// disjoint (no validation question appears among the training questions).
//
//   arithmetic  "12+7=" -> "19". Options: operators (a string of + - *,
//               default "+"), min_operand (0), max_operand (99),
//               num_operands (2).
//   countdown   "Use 3 7 25 to make 46." -> ground truth JSON
//               {"numbers":[3,7,25],"target":46}; a reachable target.
//               Options: count (3 numbers), max_number (25), max_target (100).
//               Scored by CountdownScore.

#include <string>
#include <vector>

#include "roll/common/status.h"
#include "roll/data/dataset.h"

namespace roll {

struct TaskSplit {
  std::vector<Sample> train, val;
};

// `options` are "key=value" strings. InvalidArgument names an unknown task
// (listing the known ones), an unknown option or a bad value.
absl::StatusOr<TaskSplit> GenerateTaskSplit(const std::string& task, int num_train, int num_val,
                                            int64_t seed, const std::vector<std::string>& options);

// 1 when the response's final expression (after "answer:" if present, else
// its last line) uses each given number at most once, only + - * / and
// parentheses, and evaluates exactly to the target; else 0. `reason` says
// why. ground_truth is the JSON GenerateTaskSplit writes.
struct CountdownResult {
  double score = 0;
  std::string reason;
};
absl::StatusOr<CountdownResult> CountdownScore(const std::string& response,
                                               const std::string& ground_truth);

}  // namespace roll
