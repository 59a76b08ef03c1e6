#pragma once
// Cluster: the controller's handle on a group of worker processes of one
// type (one role section of the config). It starts the workers, fans method
// calls out according to each method's dispatch mode, watches the workers'
// health, and shuts them down when destroyed.
//
// Calls are asynchronous: Call returns a CallHandle at once; replies arrive
// on gRPC's completion threads and are gathered in the handle. A worker that
// dies or stops answering health checks fails its pending calls with an error
// naming the cluster, rank, pid and what happened. Cluster methods are
// thread-safe. A Cluster must not outlive the Controller that started it.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "roll/common/batch.h"
#include "roll/common/status.h"
#include "roll/scheduler/dispatch.h"

namespace roll {

struct CallOptions {
  // Deadline of each per-rank RPC; default: the config's runtime.call_timeout_s.
  absl::Duration timeout = absl::ZeroDuration();
};

// Result of one fan-out call, c10d Work-style. Copyable; copies share state.
class CallHandle {
 public:
  struct State;
  CallHandle() = default;
  explicit CallHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Waits until every rank replied or one failed (fail fast). Returns the
  // first error (naming worker and rank), DeadlineExceeded when `timeout`
  // passed first (the call goes on), or OK.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  // Waits until every rank finished, failed or not; returns the first error.
  absl::Status WaitAll(absl::Duration timeout = absl::InfiniteDuration()) const;
  // True when every rank replied or one failed.
  bool Done() const;
  // One status per executing rank; Unavailable("pending") for ranks still running.
  std::vector<absl::Status> RankStatus() const;
  // The ranks this call runs on.
  std::vector<int> ranks() const;
  // Waits; replies in rank order.
  absl::StatusOr<std::vector<Batch>> Replies() const;
  // Every rank's reply once all ranks finished (WaitAll), in ranks() order;
  // an empty Batch where that rank failed (see RankStatus).
  std::vector<Batch> EachReply() const;
  // Waits; the reply gathered by the method's dispatch mode (data-parallel:
  // concatenated; otherwise rank 0's).
  absl::StatusOr<Batch> Get() const;

 private:
  absl::Status WaitFor(absl::Duration timeout, bool all) const;
  std::shared_ptr<State> state_;
};

struct WorkerInfo {
  int rank = 0;
  pid_t pid = 0;  // the launcher's id: the pid, or NodeProcessId() on another node
  int node = 0;
  std::string address;
  std::string log_path;
  bool alive = true;
  std::string death_reason;  // empty while alive
};

class ClusterBase {
 public:
  class Impl;
  explicit ClusterBase(std::unique_ptr<Impl> impl);
  // Takes over `other`'s workers; `other` is left empty.
  ClusterBase(ClusterBase&& other) noexcept;
  virtual ~ClusterBase();  // shuts the workers down
  ClusterBase(const ClusterBase&) = delete;
  ClusterBase& operator=(const ClusterBase&) = delete;

  const std::string& name() const;
  const std::string& worker_type() const;
  int world_size() const;
  std::vector<WorkerInfo> workers() const;

  // One-to-all and data-parallel methods.
  CallHandle Call(const MethodSpec& method, const Batch& input, const CallOptions& options = {});
  // All-to-all methods: inputs[i] goes to the i-th executing rank.
  CallHandle CallEach(const MethodSpec& method, std::vector<Batch> inputs, const CallOptions& options = {});

  // Asks every worker to exit, waits, then kills stragglers. Idempotent.
  absl::Status Shutdown();

 protected:
  // The controller replaces single workers (Controller::RestartWorker).
  friend class Controller;
  std::unique_ptr<Impl> impl_;
};

// Replaces the dead workers of `cluster` in place after a call to it failed
// (`why`); returns their ranks, or an error when the job's restart budget is
// spent. A client that survives a worker's death (generation, rewards,
// environments, a custom pipeline's own) takes one and sends again what the
// new ranks owed; a pipeline's is BasePipeline::Restarter().
using WorkerRestarter =
    std::function<absl::StatusOr<std::vector<int>>(ClusterBase& cluster, const absl::Status& why)>;

// Typed front: Cluster<Api> accepts only methods declared as Method<Api>.
template <class Api>
class Cluster : public ClusterBase {
 public:
  explicit Cluster(ClusterBase&& base) : ClusterBase(std::move(base)) {}
  CallHandle Call(const Method<Api>& method, const Batch& input, const CallOptions& options = {}) {
    return ClusterBase::Call(method, input, options);
  }
  CallHandle CallEach(const Method<Api>& method, std::vector<Batch> inputs, const CallOptions& options = {}) {
    return ClusterBase::CallEach(method, std::move(inputs), options);
  }
};

// What a call came to on every rank, once all of them finished (it waits
// for all). For clients that replace dead workers and retry their share.
struct CallOutcome {
  // OK; else the first error of a rank that is still alive (replacing
  // workers cannot help; it is the caller's), else the first error of a
  // dead rank.
  absl::Status status;
  // Every rank that failed is dead: replacing them and sending their share
  // again may succeed.
  bool only_dead = false;
  // Per executing rank, in call.ranks() order: it replied.
  std::vector<bool> ok;
};
// `counted` (indexed by rank; empty: every rank): the ranks whose failure
// matters; the others still show in `ok`.
CallOutcome WaitOutcome(const CallHandle& call, const ClusterBase& cluster, const std::vector<bool>& counted = {});

// Whether any worker of `cluster` has died.
bool LostAWorker(const ClusterBase& cluster);

}  // namespace roll
