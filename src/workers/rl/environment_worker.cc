// The "environment" worker type: hosts episodes of its env manager
// section's env_type, keyed by the controller's episode keys.

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
#include "roll/worker/batch_keys.h"
#include "roll/worker/rl_workers.h"

namespace roll {
namespace {

class EnvironmentWorker : public Worker {
 public:
  absl::Status Initialize(const WorkerContext& ctx) override {
    if (ctx.cluster != "train_env_manager" && ctx.cluster != "val_env_manager") {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker type 'environment' serves train_env_manager and val_env_manager, not '", ctx.cluster, "'"));
    }
    config_ = static_cast<const EnvManagerConfig*>(ctx.role);
    where_ = absl::StrCat(ctx.cluster, " rank ", ctx.rank);
    // Builds one environment now, so a bad env_type or option fails the
    // start of the cluster rather than the first episode.
    auto probe = MakeEnvironment(config_->env_type, config_->env_options);
    if (!probe.ok()) return Annotate(probe.status(), ctx.cluster);
    return absl::OkStatus();
  }

  void RegisterMethods(MethodTable& t) override {
    t.Bind(environment::kReset, this, &EnvironmentWorker::Reset);
    t.Bind(environment::kStep, this, &EnvironmentWorker::Step);
    t.Bind(environment::kClose, this, &EnvironmentWorker::Close);
  }

 private:
  struct Episode {
    std::unique_ptr<Environment> env;
    int64_t steps = 0;
    bool done = false;
  };

  // The episode_key column, each key once.
  absl::StatusOr<const std::vector<std::string>*> Keys(const Batch& in) const {
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column(keys::kEpisodeKey));
    std::set<std::string> seen;
    for (const std::string& k : *keys) {
      if (!seen.insert(k).second) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": episode '", k, "' is given twice in one request"));
      }
    }
    return keys;
  }

  absl::StatusOr<Batch> Reset(const Batch& in) {
    Batch out;
    if (in.empty()) {
      out.SetColumn(keys::kObservation, {});
      out.SetColumn(keys::kInstructions, {});
      return out;
    }
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, Keys(in));
    ROLL_ASSIGN_OR_RETURN(at::Tensor seeds, in.Tensor(keys::kSeed));
    if (seeds.dim() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": reset: 'seed' must hold one seed per episode (1-d), not ", seeds.dim(), "-d"));
    }
    seeds = seeds.to(at::kLong).contiguous();
    int64_t fresh = 0;
    for (const std::string& k : *keys) fresh += episodes_.count(k) ? 0 : 1;
    const int64_t cap = config_->max_env_num_per_worker;
    if (cap > 0 && static_cast<int64_t>(episodes_.size()) + fresh > cap) {
      return absl::ResourceExhaustedError(absl::StrCat(where_, ": ", episodes_.size(), " episodes open and ", fresh,
                                                       " more asked for; max_env_num_per_worker is ", cap));
    }
    // Fresh environments, swapped in only when every reset succeeded: a
    // failure leaves every episode as it was.
    std::vector<std::unique_ptr<Environment>> envs;
    std::vector<std::string> obs, instructions;
    for (size_t i = 0; i < keys->size(); ++i) {
      auto env = MakeEnvironment(config_->env_type, config_->env_options);
      if (!env.ok()) return Annotate(env.status(), where_);
      auto o = (*env)->Reset(static_cast<uint64_t>(seeds.data_ptr<int64_t>()[i]));
      if (!o.ok()) return Annotate(o.status(), absl::StrCat(where_, " episode ", (*keys)[i]));
      obs.push_back(std::move(*o));
      instructions.push_back((*env)->Instructions());
      envs.push_back(std::move(*env));
    }
    for (size_t i = 0; i < keys->size(); ++i) {
      Episode& e = episodes_[(*keys)[i]];
      e.env = std::move(envs[i]);
      e.steps = 0;
      e.done = false;
    }
    out.SetColumn(keys::kObservation, std::move(obs));
    out.SetColumn(keys::kInstructions, std::move(instructions));
    return out;
  }

  absl::StatusOr<Batch> Step(const Batch& in) {
    std::vector<std::string> obs;
    std::vector<double> reward;
    std::vector<uint8_t> done, success, truncated, valid;
    std::vector<int64_t> step;
    if (!in.empty()) {
      ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, Keys(in));
      ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* actions, in.Column(keys::kAction));
      std::vector<Episode*> eps;
      for (const std::string& k : *keys) {
        auto it = episodes_.find(k);
        if (it == episodes_.end()) {
          return absl::NotFoundError(absl::StrCat(where_, ": episode '", k, "' is not open here (reset it first)"));
        }
        if (it->second.done) {
          return absl::FailedPreconditionError(absl::StrCat(where_, ": episode '", k, "' is done after ",
                                                            it->second.steps, " steps"));
        }
        eps.push_back(&it->second);
      }
      for (size_t i = 0; i < eps.size(); ++i) {
        auto s = eps[i]->env->Step((*actions)[i]);
        // Checked above, so an error here is the environment's own fault.
        if (!s.ok()) return Annotate(s.status(), absl::StrCat(where_, " episode ", (*keys)[i]));
        Episode& e = *eps[i];
        e.done = s->done;
        ++e.steps;
        obs.push_back(std::move(s->observation));
        reward.push_back(s->reward);
        done.push_back(s->done);
        success.push_back(s->success);
        truncated.push_back(s->truncated);
        valid.push_back(s->action_valid);
        step.push_back(e.steps);
      }
    }
    auto flags = [](const std::vector<uint8_t>& v) {
      at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kBool);
      std::copy(v.begin(), v.end(), t.data_ptr<bool>());
      return t;
    };
    Batch out;
    out.SetColumn(keys::kObservation, std::move(obs));
    out.SetTensor(keys::kReward, at::tensor(reward, at::kDouble));
    out.SetTensor(keys::kDone, flags(done));
    out.SetTensor(keys::kSuccess, flags(success));
    out.SetTensor(keys::kTruncated, flags(truncated));
    out.SetTensor(keys::kActionValid, flags(valid));
    out.SetTensor(keys::kStepIndex, at::tensor(step, at::kLong));
    return out;
  }

  absl::StatusOr<Batch> Close(const Batch& in) {
    if (!in.empty()) {
      ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column(keys::kEpisodeKey));
      for (const std::string& k : *keys) episodes_.erase(k);
    }
    return Batch();
  }

  const EnvManagerConfig* config_ = nullptr;
  std::string where_;  // "train_env_manager rank 1"
  std::map<std::string, Episode> episodes_;
};

}  // namespace

void RegisterEnvironmentWorker() { RegisterWorkerType<EnvironmentApi, EnvironmentWorker>(); }

}  // namespace roll
