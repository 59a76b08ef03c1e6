#include "roll/controller/environment_client.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace roll {
namespace {

// Checks that no key is given twice in one request.
absl::Status Unique(const std::vector<std::string>& keys) {
  std::set<std::string> seen;
  for (const std::string& k : keys) {
    if (!seen.insert(k).second) return absl::InvalidArgumentError(absl::StrCat("episode '", k, "' is given twice"));
  }
  return absl::OkStatus();
}

// The n values of a reply's 1-d tensor `name`, as T.
template <class T>
absl::StatusOr<std::vector<T>> Values(const Batch& reply, const char* name, size_t n) {
  ROLL_ASSIGN_OR_RETURN(at::Tensor t, reply.Tensor(name));
  if (t.dim() != 1 || t.size(0) != static_cast<int64_t>(n)) {
    return absl::InternalError(
        absl::StrCat("environment reply: '", name, "' holds ", t.numel(), " values where ", n, " were due"));
  }
  // Read in place when the worker sent the documented type (no tensor op
  // on the controller's thread), else converted.
  const at::ScalarType want =
      std::is_same_v<T, bool> ? at::kBool : std::is_same_v<T, double> ? at::kDouble : at::kLong;
  const at::Tensor c = t.scalar_type() == want && t.is_contiguous() ? t : t.to(want).contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + n);
}

}  // namespace

int EnvironmentClient::rank_of(const std::string& key) const {
  auto it = episodes_.find(key);
  return it == episodes_.end() ? -1 : it->second.rank;
}

absl::StatusOr<std::vector<EnvObservation>> EnvironmentClient::Reset(const std::vector<EpisodeStart>& episodes) {
  std::vector<std::string> keys;
  for (const EpisodeStart& e : episodes) keys.push_back(e.key);
  ROLL_RETURN_IF_ERROR(Unique(keys));
  const int world = envs_->world_size();
  std::vector<int64_t> load(world, 0);
  for (const auto& [key, e] : episodes_) ++load[e.rank];
  std::vector<int> rank(episodes.size());
  for (size_t i = 0; i < episodes.size(); ++i) {
    auto it = episodes_.find(episodes[i].key);
    if (it != episodes_.end()) {
      rank[i] = it->second.rank;
      continue;
    }
    rank[i] = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    if (max_per_worker_ > 0 && load[rank[i]] >= max_per_worker_) {
      return absl::ResourceExhaustedError(absl::StrCat("every one of the ", world, " ranks of ", envs_->name(),
                                                       " holds max_env_num_per_worker=", max_per_worker_,
                                                       " episodes; close some first"));
    }
    ++load[rank[i]];
  }
  std::vector<Batch> per_rank(world);
  std::vector<std::vector<std::string>> rank_keys(world);
  std::vector<std::vector<int64_t>> rank_seeds(world);
  std::vector<std::string> fresh;
  for (size_t i = 0; i < episodes.size(); ++i) {
    auto [it, inserted] = episodes_.try_emplace(episodes[i].key);
    if (inserted) fresh.push_back(episodes[i].key);
    Episode& e = it->second;
    e = Episode();
    e.rank = rank[i];
    e.seed = episodes[i].seed;
    rank_keys[rank[i]].push_back(episodes[i].key);
    rank_seeds[rank[i]].push_back(static_cast<int64_t>(episodes[i].seed));
  }
  for (int r = 0; r < world; ++r) {
    if (rank_keys[r].empty()) continue;
    per_rank[r].SetColumn("episode_key", rank_keys[r]);
    per_rank[r].SetTensor("seed", at::tensor(rank_seeds[r], at::kLong));
  }
  std::map<std::string, EnvObservation> got;
  absl::Status s = Run(environment::kReset, per_rank, /*resend=*/true, [&](int r, const Batch& reply) -> absl::Status {
    if (rank_keys[r].empty()) return absl::OkStatus();
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* obs, reply.Column("observation"));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions, reply.Column("instructions"));
    if (obs->size() != rank_keys[r].size()) {
      return absl::InternalError(absl::StrCat(envs_->name(), " rank ", r, " answered ", obs->size(),
                                              " observations to a reset of ", rank_keys[r].size(), " episodes"));
    }
    for (size_t i = 0; i < obs->size(); ++i) {
      const std::string& key = rank_keys[r][i];
      Episode& e = episodes_.at(key);
      e.started = true;
      e.observation = (*obs)[i];
      got[key] = EnvObservation{key, (*obs)[i], (*instructions)[i]};
    }
    return absl::OkStatus();
  });
  if (!s.ok()) {
    for (const std::string& k : fresh) {
      if (!episodes_.at(k).started) episodes_.erase(k);
    }
    return s;
  }
  std::vector<EnvObservation> out;
  for (const EpisodeStart& e : episodes) out.push_back(std::move(got.at(e.key)));
  return out;
}

absl::StatusOr<std::vector<EnvTransition>> EnvironmentClient::Step(const std::vector<EnvAction>& actions) {
  std::vector<std::string> keys;
  for (const EnvAction& a : actions) keys.push_back(a.key);
  ROLL_RETURN_IF_ERROR(Unique(keys));
  const int world = envs_->world_size();
  std::vector<std::vector<std::string>> rank_keys(world), rank_actions(world);
  for (const EnvAction& a : actions) {
    auto it = episodes_.find(a.key);
    if (it == episodes_.end()) return absl::NotFoundError(absl::StrCat("episode '", a.key, "' is not open"));
    const Episode& e = it->second;
    if (!e.started) {
      return absl::FailedPreconditionError(absl::StrCat("episode '", a.key, "' has not started (its reset failed)"));
    }
    if (e.done) {
      return absl::FailedPreconditionError(
          absl::StrCat("episode '", a.key, "' is done after ", e.actions.size(), " steps"));
    }
    rank_keys[e.rank].push_back(a.key);
    rank_actions[e.rank].push_back(a.action);
  }
  std::vector<Batch> per_rank(world);
  for (int r = 0; r < world; ++r) {
    if (rank_keys[r].empty()) continue;
    per_rank[r].SetColumn("episode_key", rank_keys[r]);
    per_rank[r].SetColumn("action", rank_actions[r]);
  }
  std::map<std::string, EnvTransition> got;
  ROLL_RETURN_IF_ERROR(Run(environment::kStep, per_rank, /*resend=*/true, [&](int r, const Batch& reply) -> absl::Status {
    if (rank_keys[r].empty()) return absl::OkStatus();
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* obs, reply.Column("observation"));
    const size_t n = rank_keys[r].size();
    ROLL_ASSIGN_OR_RETURN(const std::vector<double> reward, Values<double>(reply, "reward", n));
    ROLL_ASSIGN_OR_RETURN(const std::vector<bool> done, Values<bool>(reply, "done", n));
    ROLL_ASSIGN_OR_RETURN(const std::vector<bool> success, Values<bool>(reply, "success", n));
    ROLL_ASSIGN_OR_RETURN(const std::vector<bool> truncated, Values<bool>(reply, "truncated", n));
    ROLL_ASSIGN_OR_RETURN(const std::vector<bool> valid, Values<bool>(reply, "action_valid", n));
    ROLL_ASSIGN_OR_RETURN(const std::vector<int64_t> step, Values<int64_t>(reply, "step_index", n));
    if (obs->size() != n) {
      return absl::InternalError(absl::StrCat(envs_->name(), " rank ", r, " answered ", obs->size(),
                                              " transitions to a step of ", n, " episodes"));
    }
    for (size_t i = 0; i < n; ++i) {
      const std::string& key = rank_keys[r][i];
      Episode& e = episodes_.at(key);
      e.actions.push_back(rank_actions[r][i]);
      EnvTransition t;
      t.key = key;
      t.observation = (*obs)[i];
      t.reward = reward[i];
      t.done = done[i];
      t.success = success[i];
      t.truncated = truncated[i];
      t.action_valid = valid[i];
      t.step = step[i];
      if (t.step != static_cast<int64_t>(e.actions.size())) {
        return absl::InternalError(absl::StrCat(envs_->name(), " rank ", r, ": episode '", key, "' is at step ",
                                                t.step, " where ", e.actions.size(), " were sent"));
      }
      e.observation = t.observation;
      e.done = t.done;
      got[key] = std::move(t);
    }
    return absl::OkStatus();
  }));
  std::vector<EnvTransition> out;
  for (const EnvAction& a : actions) out.push_back(std::move(got.at(a.key)));
  return out;
}

absl::Status EnvironmentClient::Close(const std::vector<std::string>& keys) {
  const int world = envs_->world_size();
  std::vector<std::vector<std::string>> rank_keys(world);
  for (const std::string& k : keys) {
    auto it = episodes_.find(k);
    if (it == episodes_.end()) continue;
    rank_keys[it->second.rank].push_back(k);
    episodes_.erase(it);
  }
  std::vector<Batch> per_rank(world);
  for (int r = 0; r < world; ++r) {
    if (!rank_keys[r].empty()) per_rank[r].SetColumn("episode_key", rank_keys[r]);
  }
  // A replaced rank never held them: nothing to send it again.
  return Run(environment::kClose, per_rank, /*resend=*/false,
             [](int, const Batch&) { return absl::OkStatus(); });
}

absl::Status EnvironmentClient::Run(const Method<EnvironmentApi>& method, const std::vector<Batch>& per_rank,
                                    bool resend, const Commit& commit) {
  std::vector<Batch> inputs = per_rank;
  std::set<int> owed;  // ranks whose share is not committed yet
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) owed.insert(r);
  while (true) {
    CallHandle call = envs_->CallEach(method, inputs);
    const CallOutcome o = WaitOutcome(call, *envs_);
    const std::vector<Batch> replies = call.EachReply();
    const std::vector<int> ranks = call.ranks();
    for (size_t i = 0; i < ranks.size() && i < o.ok.size(); ++i) {
      if (!o.ok[i] || !owed.count(ranks[i])) continue;
      ROLL_RETURN_IF_ERROR(commit(ranks[i], replies[i]));
      owed.erase(ranks[i]);
    }
    if (o.status.ok() || !o.only_dead || !restart_) return o.status;
    // Only dead ranks failed: replace them and rebuild their episodes, as
    // often as ranks keep dying while that is under way.
    absl::Status why = o.status;
    std::set<int> stale;
    while (true) {
      ROLL_ASSIGN_OR_RETURN(const std::vector<int> replaced, restart_(why));
      if (replaced.empty()) return why;
      stale.insert(replaced.begin(), replaced.end());
      const CallOutcome r = Replay(stale);
      if (r.status.ok()) break;
      if (!r.only_dead) return r.status;
      why = r.status;
    }
    if (!resend) return absl::OkStatus();
    for (int r = 0; r < static_cast<int>(inputs.size()); ++r) {
      inputs[r] = owed.count(r) ? per_rank[r] : Batch();
    }
  }
}

CallOutcome EnvironmentClient::Replay(const std::set<int>& ranks) {
  const int world = envs_->world_size();
  std::vector<std::vector<std::string>> keys(world);
  size_t longest = 0;
  for (const auto& [key, e] : episodes_) {
    if (!e.started || !ranks.count(e.rank)) continue;
    keys[e.rank].push_back(key);
    longest = std::max(longest, e.actions.size());
  }
  std::map<std::string, std::string> last;  // observation after the replay so far
  // Round 0 resets; round j > 0 applies every episode's action j-1.
  for (size_t round = 0; round <= longest; ++round) {
    std::vector<Batch> inputs(world);
    std::vector<std::vector<std::string>> sent(world);
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> actions;
      std::vector<int64_t> seeds;
      for (const std::string& key : keys[r]) {
        const Episode& e = episodes_.at(key);
        if (round > 0 && e.actions.size() < round) continue;
        sent[r].push_back(key);
        if (round == 0) {
          seeds.push_back(static_cast<int64_t>(e.seed));
        } else {
          actions.push_back(e.actions[round - 1]);
        }
      }
      if (sent[r].empty()) continue;
      inputs[r].SetColumn("episode_key", sent[r]);
      if (round == 0) {
        inputs[r].SetTensor("seed", at::tensor(seeds, at::kLong));
      } else {
        inputs[r].SetColumn("action", std::move(actions));
      }
    }
    CallHandle call = envs_->CallEach(round == 0 ? environment::kReset : environment::kStep, std::move(inputs));
    CallOutcome o = WaitOutcome(call, *envs_);
    if (!o.status.ok()) return o;
    const std::vector<Batch> replies = call.EachReply();
    const std::vector<int> call_ranks = call.ranks();
    for (size_t i = 0; i < call_ranks.size(); ++i) {
      const int r = call_ranks[i];
      if (sent[r].empty()) continue;
      auto obs = replies[i].Column("observation");
      if (!obs.ok() || (*obs)->size() != sent[r].size()) {
        return CallOutcome{absl::InternalError(absl::StrCat(envs_->name(), " rank ", r, " answered a replay badly")),
                           false, {}};
      }
      for (size_t k = 0; k < sent[r].size(); ++k) last[sent[r][k]] = (**obs)[k];
      if (round > 0) replayed_steps_ += static_cast<int64_t>(sent[r].size());
    }
  }
  for (const auto& [key, obs] : last) {
    if (obs != episodes_.at(key).observation) {
      return CallOutcome{absl::InternalError(absl::StrCat(
                             envs_->name(), ": episode '", key, "' replayed to another state than it was in (the "
                             "environment is not deterministic in its seed and actions), so it cannot be rebuilt")),
                         false, {}};
    }
  }
  return CallOutcome();
}

}  // namespace roll
