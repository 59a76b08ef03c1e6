#include "roll/pipeline/async_rollout.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "roll/common/stopwatch.h"

namespace roll {
AsyncRollout::AsyncRollout(int64_t k, Produce produce, Snapshot snapshot)
    : k_(k), produce_(std::move(produce)), snapshot_(std::move(snapshot)) {}

AsyncRollout::~AsyncRollout() { Stop(); }

void AsyncRollout::Start(int64_t first, int64_t last, int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    version_ = version;
  }
  thread_ = std::thread([this, first, last] { Run(first, last); });
}

void AsyncRollout::Run(int64_t first, int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || (!paused_ && Admits(step, version_, k_)); });
    if (stop_) return;
    starts_[step] = snapshot_();
    busy_ = true;
    lock.unlock();
    const Stopwatch t;
    absl::StatusOr<RolloutBatch> batch = produce_(step);
    const double took = t.Seconds();
    lock.lock();
    busy_ = false;
    const bool failed = !batch.ok();
    if (failed) error_ = batch.status();
    ready_[step] = Ready{std::move(batch), took};
    cv_.notify_all();
    if (failed) return;
  }
}

absl::StatusOr<RolloutBatch> AsyncRollout::Take(int64_t step) {
  const Stopwatch t;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stop_ || !error_.ok() || ready_.count(step) > 0; });
  auto it = ready_.find(step);
  if (it == ready_.end()) {
    if (!error_.ok()) return error_;
    return absl::CancelledError(absl::StrCat("the asynchronous rollout stopped before the batch of step ", step));
  }
  Ready r = std::move(it->second);
  ready_.erase(it);
  starts_.erase(starts_.begin(), starts_.lower_bound(step));
  if (!r.batch.ok()) return r.batch.status();
  r.batch->metrics["async/wait_s"] = t.Seconds();
  r.batch->metrics["time/generation_s"] = r.generation_s;
  return std::move(r.batch);
}

void AsyncRollout::SetVersion(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  version_ = version;
  cv_.notify_all();
}

absl::Status AsyncRollout::Paused(const std::function<absl::Status()>& fn) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    paused_ = true;
    cv_.wait(lock, [&] { return !busy_; });
  }
  absl::Status s = fn();
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
    cv_.notify_all();
  }
  return s;
}

std::string AsyncRollout::StateAfter(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = starts_.find(step + 1); it != starts_.end()) return it->second;
  // Batch step + 1 has not started, and batch `step` was taken: the
  // producer is between batches and consumes nothing while we hold the lock.
  return snapshot_();
}

void AsyncRollout::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status CheckVersionLag(const std::vector<RolloutGroup>& groups, int64_t step, int64_t k, Metrics* m) {
  const int64_t trainer_version = step - 1;
  std::vector<int64_t> at_lag(static_cast<size_t>(k) + 1, 0);
  int64_t samples = 0, mixed = 0, max_lag = 0, tokens = 0;
  double lag_sum = 0, token_lag_sum = 0;
  for (const RolloutGroup& g : groups) {
    for (const SampleResult& s : g.samples) {
      if (s.token_versions.empty()) continue;  // no token sampled
      const int64_t lag = trainer_version - s.token_versions.front();
      if (lag > k) {
        return absl::InternalError(absl::StrCat(
            "step ", step, ": sample ", s.sample_index, " of request '", s.request_key,
            "' was generated under weight version ", s.token_versions.front(), ", ", lag,
            " versions behind the trainer's ", trainer_version, ", beyond async_generation_ratio=", k,
            "; it is not trained on"));
      }
      ++samples;
      lag_sum += static_cast<double>(lag);
      max_lag = std::max(max_lag, lag);
      if (lag >= 0) ++at_lag[static_cast<size_t>(lag)];
      std::set<int64_t> versions(s.token_versions.begin(), s.token_versions.end());
      if (versions.size() > 1) ++mixed;
      for (int64_t v : s.token_versions) token_lag_sum += static_cast<double>(trainer_version - v);
      tokens += static_cast<int64_t>(s.token_versions.size());
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(samples, 1));
  (*m)["rollout/version_lag_mean"] = lag_sum / n;
  (*m)["rollout/version_lag_max"] = static_cast<double>(max_lag);
  for (size_t l = 0; l < at_lag.size(); ++l) {
    (*m)[absl::StrCat("rollout/version_lag_", l, "_fraction")] = static_cast<double>(at_lag[l]) / n;
  }
  (*m)["rollout/token_version_lag_mean"] = token_lag_sum / static_cast<double>(std::max<int64_t>(tokens, 1));
  (*m)["rollout/mixed_version_fraction"] = static_cast<double>(mixed) / n;
  return absl::OkStatus();
}

}  // namespace roll

namespace roll {

absl::Status CheckAsyncPlacement(const PipelineConfig& cfg) {
  if (cfg.async_generation_ratio == 0) return absl::OkStatus();
  const std::set<int> infer(cfg.actor_infer.device_mapping.begin(), cfg.actor_infer.device_mapping.end());
  for (const WorkerConfig* role : {&cfg.actor_train, &cfg.critic, &cfg.reference}) {
    if (!role->present) continue;
    for (int d : role->device_mapping) {
      if (infer.count(d) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "async_generation_ratio: ", cfg.async_generation_ratio, " generates while ", role->name,
            " trains or scores, so actor_infer needs devices of its own, but both ", role->name,
            ".device_mapping and actor_infer.device_mapping hold device ", d,
            " (e.g. num_gpus_per_node: 2, actor_train.device_mapping: [0], actor_infer.device_mapping: [1])"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace roll
