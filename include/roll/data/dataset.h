#pragma once
// Prompt datasets: JSONL records (one JSON object per line) and the
// Sample they parse into. docs/data.md describes the format.
//
// A record has "prompt" (a string) or "messages" (a list of {"role",
// "content"}), "ground_truth" (a string or a number; "answer" is accepted
// too), and optionally "tag" (the reward domain) and "id". Plain values;
// the functions are thread-safe.

#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct DataMessage {
  std::string role;
  std::string content;
};

struct Sample {
  std::string id;
  std::string prompt;                 // empty when `messages` is used
  std::vector<DataMessage> messages;  // empty when `prompt` is used
  std::string ground_truth;
  std::string tag;  // empty: the config's data.default_tag
  // Optional worked solution ending in the answer (key "solution"); `roll
  // sft` trains on it instead of the bare ground truth.
  std::string solution;
};

// Reads `path`. Errors name the file and line (`data.jsonl:12: ...`); every
// bad line up to 20 is reported in one InvalidArgument. Empty lines are
// skipped. Records without an id get "<file stem>-<line>".
absl::StatusOr<std::vector<Sample>> LoadJsonl(const std::string& path);
// Parses JSONL text; `source` names it in errors.
absl::StatusOr<std::vector<Sample>> ParseJsonl(const std::string& text, const std::string& source);

// Writes `samples` as JSONL, atomically (a temporary file renamed into place).
absl::Status WriteJsonl(const std::string& path, const std::vector<Sample>& samples);

}  // namespace roll
