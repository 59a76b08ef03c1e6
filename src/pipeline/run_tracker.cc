#include "roll/pipeline/run_tracker.h"

#include <filesystem>
#include <iostream>

#include "roll/tracking/tracker.h"

namespace roll {

RunTracker::RunTracker(const PipelineConfig& config, TrackerOptions options)
    : max_steps_(config.max_steps), logging_steps_(config.logging_steps), options_(std::move(options)) {}

RunTracker::~RunTracker() = default;

absl::StatusOr<std::unique_ptr<RunTracker>> RunTracker::Open(const PipelineConfig& config, int64_t resume_step,
                                                             TrackerOptions options) {
  std::unique_ptr<RunTracker> t(new RunTracker(config, std::move(options)));
  if (resume_step == 0) {
    std::error_code ec;
    std::filesystem::remove(config.output_dir + "/metrics.jsonl", ec);
    std::filesystem::remove_all(config.output_dir + "/tensorboard", ec);
  }
  ROLL_ASSIGN_OR_RETURN(t->jsonl_, MetricsWriter::Open(config.output_dir + "/metrics.jsonl",
                                                       resume_step > 0 ? resume_step : -1));
  if (config.track_with == TrackWith::kTensorboard) {
    ROLL_ASSIGN_OR_RETURN(t->tb_, TensorBoardWriter::Create(config.output_dir + "/tensorboard"));
  }
  return t;
}

absl::Status RunTracker::Log(int64_t step, const std::map<std::string, double>& m) {
  ROLL_RETURN_IF_ERROR(jsonl_->Log(step, m));
  if (tb_) ROLL_RETURN_IF_ERROR(tb_->Log(step, m));
  const std::string line = ProgressLine(step, m);
  const bool show = step == 0 || step == max_steps_ || logging_steps_ <= 1 || step % logging_steps_ == 0;
  if (options_.progress && show) std::cout << line << std::endl;
  if (options_.on_step) options_.on_step(step, m);
  return absl::OkStatus();
}

std::string RunTracker::ProgressLine(int64_t step, const std::map<std::string, double>& m) {
  auto it = m.find("time/step_s");
  if (it != m.end()) step_time_ema_ = step_time_ema_ == 0 ? it->second : 0.8 * step_time_ema_ + 0.2 * it->second;
  return FormatProgressLine(step, max_steps_, m, step_time_ema_);
}

}  // namespace roll
