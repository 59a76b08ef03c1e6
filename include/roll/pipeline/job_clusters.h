#pragma once
// JobClusters: the worker groups of one training job, started from the
// config's role sections (actor_train, actor_infer, and where the job has
// them reference, critic and rewards.<domain>), with the restart budget of
// fault_tolerance.max_restarts that every kind of restart draws from.
//
// It owns the job's Controller, created on the first Start(): restarting
// the clusters keeps its address, token and the agents of other nodes. It
// knows no pipeline: what a dead worker means for the run (replay requests,
// restart from a checkpoint) is the caller's. Not thread-safe; a pipeline
// drives it from its own thread.

#include <memory>
#include <string>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/controller/cluster.h"
#include "roll/controller/controller.h"
#include "roll/worker/rl_workers.h"

namespace roll {

// A rewards.<domain> cluster with the tags it takes.
struct RewardDomain {
  std::string name;
  std::vector<std::string> tags;  // empty: every tag no other domain claims
  Cluster<RewardApi>* cluster = nullptr;
};

// Which optional role sections a job starts.
struct JobRoles {
  // The `actor_train` section; false only for jobs that train nothing
  // (`roll eval`), whose actor_train() must not be called.
  bool actor_train = true;
  bool reference = false;  // the `reference` section (KL against the initial policy)
  bool critic = false;     // the `critic` section (value model, GAE)
  bool rewards = false;    // every rewards.<domain> section
  bool train_envs = false;  // the `train_env_manager` section (agentic)
  bool val_envs = false;    // the `val_env_manager` section (agentic)
};
// The roles the config's algorithm needs: reference when present, critic
// for adv_estimator gae, rewards when any rewards.<domain> is configured.
JobRoles RolesFor(const PipelineConfig& config);

// The job's restart budget, shared by every kind of restart.
class RestartBudget {
 public:
  explicit RestartBudget(int max_restarts) : max_(max_restarts) {}
  // Counts one restart; when none is left returns `why` with the budget
  // appended, so the run's error says why it stopped and that restarts ran out.
  absl::Status Take(const absl::Status& why);
  int used() const { return used_; }
  int max() const { return max_; }

 private:
  int max_;
  int used_ = 0;
};

class JobClusters {
 public:
  JobClusters(const PipelineConfig& config, JobRoles roles, ControllerOptions options = {});
  ~JobClusters();

  // Creates the controller (first call only); no worker starts. The
  // placement is known from here on (checks on it belong before Start).
  absl::Status CreateController();
  // Starts every cluster of the job's roles (creating the controller first
  // when needed); the clusters of a previous Start must have been stopped.
  absl::Status Start();
  // Shuts every cluster down; the controller stays for the next Start.
  void Stop();

  Controller& controller() { return *controller_; }
  const DeviceMapping& placement() const { return controller_->placement(); }
  const PipelineConfig& config() const { return config_; }
  const JobRoles& roles() const { return roles_; }
  RestartBudget& restarts() { return restarts_; }

  Cluster<ActorApi>& actor_train() { return *train_; }
  Cluster<ActorApi>& actor_infer() { return *infer_; }
  Cluster<ActorApi>* reference() { return reference_.get(); }  // null without the role
  Cluster<CriticApi>* critic() { return critic_.get(); }        // null without the role

  // rewards.<domain> clusters, in the config's order, with their tags.
  std::vector<RewardDomain> reward_domains() const;

  // The environment clusters; null without the role.
  Cluster<EnvironmentApi>* train_envs() { return train_envs_.get(); }
  Cluster<EnvironmentApi>* val_envs() { return val_envs_.get(); }

  // The model clusters (actor_train, actor_infer, reference, critic) that exist.
  std::vector<ClusterBase*> ModelClusters() const;
  // "<cluster> rank <r>" of the first dead model worker, or "" when none died.
  std::string DeadModelWorker() const;
  // actor_infer lost a worker and every other model cluster is whole.
  bool OnlyGeneratorsDied() const;
  // Replaces the dead workers of `cluster` in place, the other ranks
  // running on: any cluster of this job, or one a pipeline started itself
  // on controller(). Takes one restart from restarts() (`why`, the failure
  // that showed the death, is returned when none is left) and logs
  // "<cluster> lost a worker (<why>); restarting rank(s) ...". Returns the
  // replaced ranks; what they held (requests, episodes, collectives,
  // weights) is the caller's to rebuild.
  absl::StatusOr<std::vector<int>> RestartDeadWorkers(ClusterBase& cluster, const absl::Status& why);

 private:
  PipelineConfig config_;
  JobRoles roles_;
  ControllerOptions options_;
  RestartBudget restarts_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Cluster<ActorApi>> train_, infer_, reference_;
  std::unique_ptr<Cluster<CriticApi>> critic_;
  std::vector<std::unique_ptr<Cluster<RewardApi>>> rewards_;
  std::unique_ptr<Cluster<EnvironmentApi>> train_envs_, val_envs_;
  std::vector<std::string> reward_names_;
};

}  // namespace roll
