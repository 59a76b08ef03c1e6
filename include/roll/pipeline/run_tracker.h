#pragma once
// RunTracker: where a run's metrics go. Every step's metrics are appended to
// output_dir/metrics.jsonl (and TensorBoard event files with track_with:
// tensorboard); the terminal gets a progress line every logging_steps steps
// and for the first and the last; a caller's callback sees every step.
//
// A fresh run (resume_step 0) owns its output directory: metrics and event
// files of an earlier run there are removed. A resumed run keeps the lines up
// to resume_step and drops later ones (they are repeated). Not thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

class MetricsWriter;
class TensorBoardWriter;

struct TrackerOptions {
  // Print the progress line to stdout (default true).
  bool progress = true;
  // Called after each step's metrics are written (tests observe a run).
  std::function<void(int64_t step, const std::map<std::string, double>&)> on_step;
};

class RunTracker {
 public:
  static absl::StatusOr<std::unique_ptr<RunTracker>> Open(const PipelineConfig& config, int64_t resume_step,
                                                          TrackerOptions options = {});
  ~RunTracker();

  absl::Status Log(int64_t step, const std::map<std::string, double>& metrics);
  // The progress line of `step` (the ETA follows a moving average of
  // time/step_s over the steps logged so far).
  std::string ProgressLine(int64_t step, const std::map<std::string, double>& metrics);

 private:
  RunTracker(const PipelineConfig& config, TrackerOptions options);

  int64_t max_steps_;
  int logging_steps_;
  TrackerOptions options_;
  std::unique_ptr<MetricsWriter> jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
  double step_time_ema_ = 0;
};

}  // namespace roll
