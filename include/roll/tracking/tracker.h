#pragma once
// Where a run's metrics go: `<output_dir>/metrics.jsonl` (the contract:
// one JSON object per logged step with "step" and `group/name` keys, step 0
// being the evaluation before training), TensorBoard event files that
// `tensorboard --logdir <output_dir>/tensorboard` reads, and the one-line
// terminal progress. docs/metrics.md describes them.
//
// Thread-compatible: one writer per file, used from one thread at a time.

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

using MetricMap = std::map<std::string, double>;

class MetricsWriter {
 public:
  // Opens (creates) `path` for appending. With `truncate_after` >= 0, lines
  // whose step is greater are dropped first, so a resumed run does not log a
  // step twice. Errors name the file.
  static absl::StatusOr<std::unique_ptr<MetricsWriter>> Open(const std::string& path,
                                                             int64_t truncate_after = -1);
  // Appends {"step": step, ...} and flushes. InvalidArgument for a key not
  // of the form group/name; NaN and infinities are written as null.
  absl::Status Log(int64_t step, const MetricMap& metrics);

 private:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::ofstream out_;
};

// TensorBoard event files: TFRecord framing (length, masked CRC32C of the
// length, an Event protobuf, masked CRC32C of it) holding a file_version
// event, then one event per scalar.
class TensorBoardWriter {
 public:
  // Creates `dir` and `events.out.tfevents.<unix time>.<host>` in it.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  absl::Status Log(int64_t step, const MetricMap& metrics);
  const std::string& path() const { return path_; }

 private:
  explicit TensorBoardWriter(std::string path) : path_(std::move(path)) {}
  absl::Status WriteRecord(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

struct ScalarEvent {
  int64_t step = 0;
  double wall_time = 0;
  std::string tag;
  float value = 0;
};
// Reads the scalars of an event file, checking both CRCs of every record.
// Errors name the file and the byte offset of the bad record.
absl::StatusOr<std::vector<ScalarEvent>> ReadTensorBoardEvents(const std::string& path);

// CRC-32C (Castagnoli) of `data`.
uint32_t Crc32c(const std::string& data);

// "step 12/200 | reward 0.410 | acc 0.406 | val acc 0.380 | 1234 tok/s | 3.2 s/step | ETA 10m01s":
// reward from train/reward_mean, acc from train/accuracy, val acc from
// val/accuracy, tokens/s from
// throughput/gen_tokens_per_s; parts whose metric is absent are left out.
std::string FormatProgressLine(int64_t step, int64_t max_steps, const MetricMap& metrics,
                               double seconds_per_step);

}  // namespace roll
