#include "roll/pipeline/job_clusters.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "roll/common/logging.h"

namespace roll {

JobRoles RolesFor(const PipelineConfig& config) {
  JobRoles r;
  r.reference = config.reference.present;
  r.critic = config.adv_estimator == AdvEstimator::kGae;
  r.rewards = !config.rewards.empty();
  return r;
}

absl::Status RestartBudget::Take(const absl::Status& why) {
  if (used_ >= max_) {
    return absl::Status(why.code(), absl::StrCat(why.message(), " (fault_tolerance.max_restarts=", max_,
                                                 " restarts used)"));
  }
  ++used_;
  return absl::OkStatus();
}

JobClusters::JobClusters(const PipelineConfig& config, JobRoles roles, ControllerOptions options)
    : config_(config),
      roles_(roles),
      options_(std::move(options)),
      restarts_(config.fault_tolerance.max_restarts) {}

JobClusters::~JobClusters() { Stop(); }

absl::Status JobClusters::CreateController() {
  if (!controller_) {
    ROLL_ASSIGN_OR_RETURN(controller_, Controller::Create(config_, options_));
  }
  return absl::OkStatus();
}

absl::Status JobClusters::Start() {
  ROLL_RETURN_IF_ERROR(CreateController());
  if (roles_.actor_train) {
    ROLL_ASSIGN_OR_RETURN(train_, controller_->StartCluster<ActorApi>("actor_train"));
  }
  ROLL_ASSIGN_OR_RETURN(infer_, controller_->StartCluster<ActorApi>("actor_infer"));
  if (roles_.reference) {
    ROLL_ASSIGN_OR_RETURN(reference_, controller_->StartCluster<ActorApi>("reference"));
  }
  if (roles_.critic) {
    ROLL_ASSIGN_OR_RETURN(critic_, controller_->StartCluster<CriticApi>("critic"));
  }
  if (roles_.rewards) {
    for (const auto& [name, rc] : config_.rewards) {
      ROLL_ASSIGN_OR_RETURN(auto c, controller_->StartCluster<RewardApi>("rewards." + name));
      rewards_.push_back(std::move(c));
      reward_names_.push_back(name);
    }
  }
  if (roles_.train_envs) {
    ROLL_ASSIGN_OR_RETURN(train_envs_, controller_->StartCluster<EnvironmentApi>("train_env_manager"));
  }
  if (roles_.val_envs) {
    ROLL_ASSIGN_OR_RETURN(val_envs_, controller_->StartCluster<EnvironmentApi>("val_env_manager"));
  }
  return absl::OkStatus();
}

void JobClusters::Stop() {
  for (auto& r : rewards_) r->Shutdown().IgnoreError();
  for (auto* e : {&train_envs_, &val_envs_}) {
    if (*e) (*e)->Shutdown().IgnoreError();
    e->reset();
  }
  for (ClusterBase* c : ModelClusters()) c->Shutdown().IgnoreError();
  rewards_.clear();
  reward_names_.clear();
  train_.reset();
  infer_.reset();
  reference_.reset();
  critic_.reset();
}

std::vector<RewardDomain> JobClusters::reward_domains() const {
  std::vector<RewardDomain> out;
  for (size_t d = 0; d < rewards_.size(); ++d) {
    out.push_back({reward_names_[d], config_.rewards.at(reward_names_[d]).tag_included, rewards_[d].get()});
  }
  return out;
}

std::vector<ClusterBase*> JobClusters::ModelClusters() const {
  std::vector<ClusterBase*> out;
  for (ClusterBase* c :
       std::initializer_list<ClusterBase*>{train_.get(), infer_.get(), reference_.get(), critic_.get()}) {
    if (c != nullptr) out.push_back(c);
  }
  return out;
}

std::string JobClusters::DeadModelWorker() const {
  for (const ClusterBase* c : ModelClusters()) {
    for (const WorkerInfo& w : c->workers()) {
      if (!w.alive) return absl::StrCat(c->name(), " rank ", w.rank);
    }
  }
  return "";
}

bool JobClusters::OnlyGeneratorsDied() const {
  if (!infer_ || !LostAWorker(*infer_)) return false;
  for (const ClusterBase* c : ModelClusters()) {
    if (c != infer_.get() && LostAWorker(*c)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int>> JobClusters::RestartDeadWorkers(ClusterBase& cluster, const absl::Status& why) {
  ROLL_RETURN_IF_ERROR(restarts_.Take(why));
  std::vector<int> dead;
  for (const WorkerInfo& w : cluster.workers()) {
    if (!w.alive) dead.push_back(w.rank);
  }
  LogWarning(absl::StrCat(cluster.name(), " lost a worker (", why.message(), "); restarting rank(s) ",
                          absl::StrJoin(dead, ", "), " (restart ", restarts_.used(), " of ", restarts_.max(), ")"));
  return controller_->RestartDeadWorkers(cluster);
}

}  // namespace roll
