#pragma once
// EnvironmentClient: the controller's side of a cluster of environment
// workers (train_env_manager / val_env_manager). It places each episode on
// a rank, keeps what an episode is made of (its seed and the actions given
// so far), and survives the death of a rank: within the restarts the
// Restarter allows, the dead rank is replaced, its episodes are rebuilt by
// replaying them on the new process (environments are deterministic in
// seed and actions; a replay that ends anywhere else is an error), and the
// share of the call that rank owed is sent again. Every action the caller
// gets a transition for was applied exactly once: a step that reached a
// live rank is never repeated, and one lost with a dead rank is applied
// once after the rebuild. A call that fails leaves its episodes to be
// reset (see Step).
//
// Not thread-safe: one rollout loop drives it. The cluster must outlive it.

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "roll/controller/cluster.h"
#include "roll/envs/environment.h"
#include "roll/worker/rl_workers.h"

namespace roll {

struct EpisodeStart {
  std::string key;
  uint64_t seed = 0;
};

struct EnvObservation {
  std::string key;
  std::string observation;
  std::string instructions;
};

struct EnvAction {
  std::string key;
  std::string action;  // the agent's text
};

// What the environment returned for one episode's action.
struct EnvTransition : EnvStep {
  std::string key;
  int64_t step = 0;  // steps of the episode so far, this one included
};

class EnvironmentClient {
 public:
  // max_per_worker: the section's max_env_num_per_worker (0: no limit);
  // `restart` replaces the cluster's dead workers (none: a death fails the call).
  explicit EnvironmentClient(Cluster<EnvironmentApi>* envs, int max_per_worker = 0,
                             WorkerRestarter restart = nullptr)
      : envs_(envs), max_per_worker_(max_per_worker), restart_(std::move(restart)) {}

  // Starts each episode from its seed (an open key starts over on its
  // rank; a new one goes to the live rank holding the fewest and stays open,
  // even when its reset fails, until it is closed). Results in input
  // order. ResourceExhausted when every rank holds max_per_worker.
  absl::StatusOr<std::vector<EnvObservation>> Reset(const std::vector<EpisodeStart>& episodes);
  // One action per episode, each key at most once. NotFound for a key that
  // is not open, FailedPrecondition for a finished or unsettled episode;
  // nothing is sent then. Results in input order.
  //
  // When Step or Reset fails (an error of a live rank, no restart left, a
  // rank that dies again while the call is recovered), some episodes of
  // the request may have taken their action and others not: every episode
  // of the request becomes unsettled, and Step refuses it until it is
  // reset. No action is ever applied a second time behind the caller.
  absl::StatusOr<std::vector<EnvTransition>> Step(const std::vector<EnvAction>& actions);
  // Drops the episodes; keys that are not open are ignored. Episodes of a
  // dead rank are gone with it (no restart for a close). When Close fails,
  // its episodes stay open and unsettled.
  absl::Status Close(const std::vector<std::string>& keys);

  // Deadline of each call to a rank (reset, step, close, replay); a rank
  // that does not answer in time fails the call with DeadlineExceeded
  // naming it. Default: the config's runtime.call_timeout_s.
  void set_call_timeout(absl::Duration timeout) { call_options_.timeout = timeout; }

  int64_t open_episodes() const { return static_cast<int64_t>(episodes_.size()); }
  // The rank holding `key`, or -1.
  int rank_of(const std::string& key) const;
  // Steps replayed so far to rebuild the episodes of replaced ranks.
  int64_t replayed_steps() const { return replayed_steps_; }

 private:
  struct Episode {
    int rank = 0;
    uint64_t seed = 0;
    std::vector<std::string> actions;  // applied so far, in order
    std::string observation;           // the latest one the caller saw
    bool started = false;              // a reset of this seed succeeded
    bool done = false;
    bool closing = false;              // a close was sent
    // Why the episode must be reset before its next step (a call that
    // concerned it failed); empty while all is well.
    std::string unsettled;
  };
  // Commits one rank's reply to the episodes it concerns, all or nothing.
  using Commit = std::function<absl::Status(int rank, const Batch& reply)>;
  // Sends per_rank[r] (the episodes keys[r]) to rank r and commits each
  // rank's reply. When only dead ranks failed: replaces them, rebuilds
  // their episodes and (with `resend`) sends their share again, until every
  // rank with a share committed. A rank that dies twice during one call
  // ends it. On an error the request's episodes become unsettled.
  absl::Status Run(const Method<EnvironmentApi>& method, const std::vector<Batch>& per_rank,
                   const std::vector<std::vector<std::string>>& keys, bool resend, const Commit& commit);
  // Rebuilds every started, settled episode of `ranks` from its seed and
  // actions, and checks each ends where the caller saw it.
  CallOutcome Replay(const std::set<int>& ranks);
  std::string Where(int rank) const;
  template <class T>
  absl::StatusOr<std::vector<T>> Values(int rank, const Batch& reply, const char* name, size_t n) const;
  absl::StatusOr<const std::vector<std::string>*> Strings(int rank, const Batch& reply, const char* name,
                                                          size_t n) const;

  Cluster<EnvironmentApi>* envs_;  // not owned
  int max_per_worker_;
  WorkerRestarter restart_;
  CallOptions call_options_;
  std::map<std::string, Episode> episodes_;
  int64_t replayed_steps_ = 0;
};

}  // namespace roll
