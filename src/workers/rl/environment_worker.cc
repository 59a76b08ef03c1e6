// The "environment" worker type: hosts episodes of its env manager
// section's env_type, keyed by the controller's episode keys.

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
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
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column("episode_key"));
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
      out.SetColumn("observation", {});
      out.SetColumn("instructions", {});
      return out;
    }
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, Keys(in));
    ROLL_ASSIGN_OR_RETURN(at::Tensor seeds, in.Tensor("seed"));
    seeds = seeds.to(at::kLong).contiguous();
    int64_t fresh = 0;
    for (const std::string& k : *keys) fresh += episodes_.count(k) ? 0 : 1;
    const int64_t cap = config_->max_env_num_per_worker;
    if (cap > 0 && static_cast<int64_t>(episodes_.size()) + fresh > cap) {
      return absl::ResourceExhaustedError(absl::StrCat(where_, ": ", episodes_.size(), " episodes open and ", fresh,
                                                       " more asked for; max_env_num_per_worker is ", cap));
    }
    std::vector<std::string> obs, instructions;
    for (size_t i = 0; i < keys->size(); ++i) {
      Episode& e = episodes_[(*keys)[i]];
      if (!e.env) {
        auto env = MakeEnvironment(config_->env_type, config_->env_options);
        if (!env.ok()) return Annotate(env.status(), where_);
        e.env = std::move(*env);
      }
      auto o = e.env->Reset(static_cast<uint64_t>(seeds.data_ptr<int64_t>()[i]));
      if (!o.ok()) return Annotate(o.status(), absl::StrCat(where_, " episode ", (*keys)[i]));
      e.steps = 0;
      e.done = false;
      obs.push_back(std::move(*o));
      instructions.push_back(e.env->Instructions());
    }
    out.SetColumn("observation", std::move(obs));
    out.SetColumn("instructions", std::move(instructions));
    return out;
  }

  absl::StatusOr<Batch> Step(const Batch& in) {
    const int64_t n = in.size();
    if (n == 0) return StepReply({}, at::zeros({0}, at::kDouble), at::zeros({0, 4}, at::kBool), at::zeros({0}, at::kLong));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, Keys(in));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* actions, in.Column("action"));
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
    std::vector<std::string> obs;
    at::Tensor reward = at::zeros({n}, at::kDouble);
    at::Tensor flags = at::zeros({n, 4}, at::kBool);  // done, success, truncated, action_valid
    at::Tensor step = at::zeros({n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
      auto s = eps[i]->env->Step((*actions)[i]);
      // Checked above, so an error here is the environment's own fault.
      if (!s.ok()) return Annotate(s.status(), absl::StrCat(where_, " episode ", (*keys)[i]));
      Episode& e = *eps[i];
      e.done = s->done;
      ++e.steps;
      obs.push_back(std::move(s->observation));
      reward[i] = s->reward;
      flags[i][0] = s->done;
      flags[i][1] = s->success;
      flags[i][2] = s->truncated;
      flags[i][3] = s->action_valid;
      step[i] = e.steps;
    }
    return StepReply(std::move(obs), reward, flags, step);
  }

  static Batch StepReply(std::vector<std::string> obs, at::Tensor reward, at::Tensor flags, at::Tensor step) {
    Batch out;
    out.SetColumn("observation", std::move(obs));
    out.SetTensor("reward", reward);
    out.SetTensor("done", flags.select(1, 0).contiguous());
    out.SetTensor("success", flags.select(1, 1).contiguous());
    out.SetTensor("truncated", flags.select(1, 2).contiguous());
    out.SetTensor("action_valid", flags.select(1, 3).contiguous());
    out.SetTensor("step_index", step);
    return out;
  }

  absl::StatusOr<Batch> Close(const Batch& in) {
    if (!in.empty()) {
      ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column("episode_key"));
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
