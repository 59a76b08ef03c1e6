// `roll bench async`: the same config trained synchronously and
// asynchronously on the same devices, one after the other (docs/async.md).

#include <cmath>

#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "nlohmann/json.hpp"
#include "roll/common/stopwatch.h"
#include "roll/pipeline/async_rollout.h"
#include "roll/pipeline/pipeline.h"
#include "roll/pipeline/rlvr.h"

namespace roll {
namespace {

struct BenchRun {
  double wall_s = 0;             // step 0's log to the last step's
  double samples_per_s = 0;
  double rollout_fraction = 0;   // mean of time/rollout_s / (time/step_s - time/val_s)
  double final_val = NAN;        // the last logged val metric
  int64_t final_val_step = -1;
  double lag_mean = 0;           // mean rollout/version_lag_mean over steps
};

absl::StatusOr<BenchRun> RunOnce(PipelineConfig cfg, const std::string& val_key) {
  BenchRun out;
  const Stopwatch clock;
  double first = 0, last = 0;  // seconds on `clock`
  double fraction_sum = 0, lag_sum = 0;
  int64_t steps = 0;
  RunOptions o;
  o.progress = false;
  o.on_step = [&](int64_t step, const Metrics& m) {
    const double now = clock.Seconds();
    if (step == 0 || steps == 0) first = now;
    last = now;
    if (auto it = m.find(val_key); it != m.end()) {
      out.final_val = it->second;
      out.final_val_step = step;
    }
    if (step == 0) return;
    auto get = [&](const char* k) {
      auto it = m.find(k);
      return it == m.end() ? 0.0 : it->second;
    };
    const double busy = get("time/step_s") - get("time/val_s");
    if (busy > 0) fraction_sum += get("time/rollout_s") / busy;
    lag_sum += get("rollout/version_lag_mean");
    ++steps;
  };
  ROLL_RETURN_IF_ERROR(RunPipeline(cfg, o));
  if (steps == 0) return absl::InvalidArgumentError("bench async: the run trained no step (max_steps)");
  out.wall_s = last - first;
  const double samples = static_cast<double>(steps) * cfg.rollout_batch_size * TrainedSamplesPerGroup(cfg);
  out.samples_per_s = samples / std::max(out.wall_s, 1e-9);
  out.rollout_fraction = fraction_sum / static_cast<double>(steps);
  out.lag_mean = lag_sum / static_cast<double>(steps);
  return out;
}

nlohmann::json Mean(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return xs.empty() ? nlohmann::json(nullptr) : nlohmann::json(s / static_cast<double>(xs.size()));
}

}  // namespace

absl::StatusOr<std::string> RunAsyncBench(const PipelineConfig& config, int seeds) {
  if (config.async_generation_ratio <= 0) {
    return absl::InvalidArgumentError(
        "bench async: the config's async_generation_ratio is 0; set the k to compare (e.g. "
        "async_generation_ratio=2)");
  }
  if (seeds < 1) return absl::InvalidArgumentError("bench async: --seeds must be at least 1");
  RegisterBuiltinPipelines();
  const std::string val_key = "val/accuracy";
  nlohmann::json j;
  j["bench"] = "async";
  j["k"] = config.async_generation_ratio;
  j["steps"] = config.max_steps;
  j["samples_per_step"] = config.rollout_batch_size * TrainedSamplesPerGroup(config);
  j["generated_per_step"] = config.rollout_batch_size * config.num_return_sequences_in_group;
  j["val_metric"] = val_key;
  std::vector<double> sync_sps, async_sps, fractions, sync_val, async_val;
  for (int i = 0; i < seeds; ++i) {
    PipelineConfig sync = config, async = config;
    sync.seed = async.seed = config.seed + i;
    sync.async_generation_ratio = 0;
    sync.output_dir = absl::StrCat(config.output_dir, "/bench_sync_seed", sync.seed);
    async.output_dir = absl::StrCat(config.output_dir, "/bench_async_seed", async.seed);
    sync.resume_from_checkpoint.clear();
    async.resume_from_checkpoint.clear();
    ROLL_ASSIGN_OR_RETURN(BenchRun s, RunOnce(sync, val_key));
    ROLL_ASSIGN_OR_RETURN(BenchRun a, RunOnce(async, val_key));
    nlohmann::json run;
    run["seed"] = sync.seed;
    run["sync_samples_per_s"] = s.samples_per_s;
    run["async_samples_per_s"] = a.samples_per_s;
    run["speedup"] = a.samples_per_s / std::max(s.samples_per_s, 1e-12);
    run["sync_rollout_fraction"] = s.rollout_fraction;
    run["sync_wall_s"] = s.wall_s;
    run["async_wall_s"] = a.wall_s;
    run["async_version_lag_mean"] = a.lag_mean;
    run["sync_final_val"] = std::isnan(s.final_val) ? nlohmann::json(nullptr) : nlohmann::json(s.final_val);
    run["async_final_val"] = std::isnan(a.final_val) ? nlohmann::json(nullptr) : nlohmann::json(a.final_val);
    run["final_val_step"] = s.final_val_step;
    j["runs"].push_back(run);
    sync_sps.push_back(s.samples_per_s);
    async_sps.push_back(a.samples_per_s);
    fractions.push_back(s.rollout_fraction);
    if (!std::isnan(s.final_val)) sync_val.push_back(s.final_val);
    if (!std::isnan(a.final_val)) async_val.push_back(a.final_val);
  }
  j["sync_samples_per_s"] = Mean(sync_sps);
  j["async_samples_per_s"] = Mean(async_sps);
  j["speedup"] = j["async_samples_per_s"].get<double>() / std::max(j["sync_samples_per_s"].get<double>(), 1e-12);
  j["sync_rollout_fraction"] = Mean(fractions);
  j["sync_final_val"] = Mean(sync_val);
  j["async_final_val"] = Mean(async_val);
  j["seeds"] = seeds;
  return j.dump();
}

}  // namespace roll
