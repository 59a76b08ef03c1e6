// The RLVR run's metrics sinks: metrics.jsonl, TensorBoard, progress line.

#include <chrono>
#include <filesystem>

#include "controller/rlvr_parts.h"
#include "roll/tracking/tracker.h"

namespace roll {
namespace {

class FileTracker : public RunTracker {
 public:
  absl::Status Init(const PipelineConfig& cfg, int64_t resume_step) {
    // A fresh run owns its output directory: metrics of an earlier run there
    // would read as this run's.
    if (resume_step == 0) {
      std::error_code ec;
      std::filesystem::remove(cfg.output_dir + "/metrics.jsonl", ec);
      std::filesystem::remove_all(cfg.output_dir + "/tensorboard", ec);
    }
    ROLL_ASSIGN_OR_RETURN(jsonl_, MetricsWriter::Open(cfg.output_dir + "/metrics.jsonl",
                                                      resume_step > 0 ? resume_step : -1));
    if (cfg.track_with == TrackWith::kTensorboard) {
      ROLL_ASSIGN_OR_RETURN(tb_, TensorBoardWriter::Create(cfg.output_dir + "/tensorboard"));
    }
    last_ = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }

  absl::Status Log(int64_t step, const std::map<std::string, double>& m) override {
    ROLL_RETURN_IF_ERROR(jsonl_->Log(step, m));
    if (tb_) ROLL_RETURN_IF_ERROR(tb_->Log(step, m));
    return absl::OkStatus();
  }

  std::string ProgressLine(int64_t step, int64_t max_steps,
                           const std::map<std::string, double>& m) override {
    // An exponential moving average of the step time drives the ETA.
    auto it = m.find("time/step_s");
    if (it != m.end()) ema_ = ema_ == 0 ? it->second : 0.8 * ema_ + 0.2 * it->second;
    return FormatProgressLine(step, max_steps, m, ema_);
  }

 private:
  std::unique_ptr<MetricsWriter> jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::chrono::steady_clock::time_point last_;
  double ema_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RunTracker>> MakeTracker(const PipelineConfig& config,
                                                        int64_t resume_step) {
  auto t = std::make_unique<FileTracker>();
  ROLL_RETURN_IF_ERROR(t->Init(config, resume_step));
  return std::unique_ptr<RunTracker>(std::move(t));
}

}  // namespace roll
