#pragma once
// CheckpointStore: the checkpoints of a run under output_dir, written
// atomically. A checkpoint is a directory checkpoint-<step> holding what
// the pipeline's clusters save into it (actor/, critic/: Hugging Face model
// directories plus trainer state) and pipeline_state.json: {"step": N, ...}
// with the pipeline's own state (data position, ...). It is assembled in a
// hidden temporary directory and renamed into place whole, so a crash
// leaves the previous checkpoint of that step, or none, never half of one.
// Not thread-safe.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll {

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string output_dir) : output_dir_(std::move(output_dir)) {}

  // Writes checkpoint-<step>: `write_parts(dir)` fills the directory (the
  // clusters' saves), then pipeline_state.json gets "step" and the members
  // of `state_json` (a JSON object, "{}" for none). Replaces an older
  // checkpoint of the same step only once the new one is complete.
  absl::Status Save(int64_t step, const std::function<absl::Status(const std::string& dir)>& write_parts,
                    const std::string& state_json);

  // The newest complete checkpoint-N under output_dir, or "" when none.
  std::string Latest() const;

  struct State {
    int64_t step = 0;
    // pipeline_state.json whole (a JSON object, "step" included).
    std::string json;
  };
  // Reads `dir`/pipeline_state.json. Errors name the file and what is wrong
  // (missing, not JSON, no integer "step", a member of `required` missing).
  absl::StatusOr<State> Read(const std::string& dir, const std::vector<std::string>& required = {}) const;

  const std::string& output_dir() const { return output_dir_; }

 private:
  std::string output_dir_;
};

}  // namespace roll
