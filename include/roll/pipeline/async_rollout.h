#pragma once
// Asynchronous training (docs/async.md), PipelineRL-style: a producer
// thread keeps the generators busy with the batches of later steps while
// the trainer trains, and each model update reaches the generators in
// flight (between two decode steps; the sequences running keep their KV
// cache and go on with the new weights). Every token records the weight
// version it was sampled under.
//
// The off-policy bound k (`async_generation_ratio`): the trainer at step s
// trains from the weights of version s - 1, so a sample whose first token
// was sampled under version v is s - 1 - v versions old. The batch of step
// s is admitted to the generators only once they hold version s - 1 - k or
// later, so no trained sample is older than k; the trainer waits (Take)
// while its batch is still being generated, i.e. when it is k steps ahead.
//
// AsyncRollout is the machinery without the cluster: what a batch is comes
// from the `produce` callback (RLVR: a RolloutScheduler::Collect), so the
// agentic pipeline can drive its episodes the same way.
//
// Thread-safety: Start, Take, SetVersion, Paused, StateAfter and Stop are
// called from the pipeline's thread; `produce` and `snapshot` run on the
// producer thread, one batch at a time, never while the pipeline's thread
// is inside Paused or StateAfter.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/pipeline/train_phase.h"
#include "roll/scheduler/rollout_scheduler.h"

namespace roll {

class AsyncRollout {
 public:
  // Generates the batch of `step` (on the producer thread).
  using Produce = std::function<absl::StatusOr<RolloutBatch>(int64_t step)>;
  // The data position before a batch starts (resumable state, e.g. the
  // prompt iterator's PositionJson); called on the producer thread right
  // before produce(step), and by StateAfter.
  using Snapshot = std::function<std::string()>;

  AsyncRollout(int64_t k, Produce produce, Snapshot snapshot);
  ~AsyncRollout();  // Stop()
  AsyncRollout(const AsyncRollout&) = delete;
  AsyncRollout& operator=(const AsyncRollout&) = delete;

  // Produces the batches of steps first .. last in order; the generators
  // hold `version`. Once per object.
  void Start(int64_t first, int64_t last, int64_t version);
  // The batch of `step`, waiting until it is generated; the first error of
  // the producer (its batch and any later one fail with it). The batch
  // carries `async/wait_s` (time waited here) and `time/generation_s` (the
  // producer's time on it) in its metrics.
  absl::StatusOr<RolloutBatch> Take(int64_t step);
  // The generators hold `version` now (after a model update): admits the
  // batches it allows.
  void SetVersion(int64_t version);
  // Runs `fn` while the producer is between batches (validation on the same
  // generators); the producer resumes after it.
  absl::Status Paused(const std::function<absl::Status()>& fn);
  // The data position after the batch of `step` (what a checkpoint at
  // `step` saves): the snapshot taken before batch step + 1 started, or,
  // when it has not started, snapshot() now. Batches generated ahead are
  // not counted: a resumed run generates them again.
  std::string StateAfter(int64_t step);
  // Stops admitting batches and waits for the producer (a batch in
  // progress runs to its end). Idempotent.
  void Stop();

  // Admission rule: may the batch of `step` start with the generators at
  // `version`? (version >= step - 1 - k)
  static bool Admits(int64_t step, int64_t version, int64_t k) { return version >= step - 1 - k; }

 private:
  void Run(int64_t first, int64_t last);

  const int64_t k_;
  Produce produce_;
  Snapshot snapshot_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_ = 0;
  bool stop_ = false;
  bool paused_ = false;
  bool busy_ = false;  // the producer is inside produce()
  absl::Status error_;
  std::map<int64_t, std::string> starts_;  // step -> snapshot before its batch
  struct Ready {
    absl::StatusOr<RolloutBatch> batch;
    double generation_s = 0;
  };
  std::map<int64_t, Ready> ready_;
  std::thread thread_;
};

// The version lag of the samples of a step-`step` batch: lag = (step - 1)
// - the version of a sample's first token. Metrics: rollout/version_lag_mean,
// rollout/version_lag_max, rollout/version_lag_<l>_fraction for l = 0 .. k,
// rollout/token_version_lag_mean (per response token, by its own version),
// rollout/mixed_version_fraction (samples whose tokens span more than one
// version: an update arrived while they were generated). An error naming
// the sample when one is older than k (the bound is broken: nothing is
// trained on it).
absl::Status CheckVersionLag(const std::vector<RolloutGroup>& groups, int64_t step, int64_t k, Metrics* metrics);

// Before anything starts: with async_generation_ratio > 0, actor_infer
// must have devices of its own (no offload between stages; generation goes
// on while actor_train, critic and reference work). The error names the
// role and the shared device.
absl::Status CheckAsyncPlacement(const PipelineConfig& config);

}  // namespace roll
