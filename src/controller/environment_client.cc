#include "roll/controller/environment_client.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "roll/worker/batch_keys.h"

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

// The request of one rank: reset `keys` from `seeds`, or step them with
// `actions`. Empty when `keys` is (the rank has no share).
Batch ResetRequest(const std::vector<std::string>& keys, const std::vector<int64_t>& seeds) {
  Batch b;
  if (keys.empty()) return b;
  b.SetColumn(keys::kEpisodeKey, keys);
  b.SetTensor(keys::kSeed, at::tensor(seeds, at::kLong));
  return b;
}

Batch StepRequest(const std::vector<std::string>& keys, const std::vector<std::string>& actions) {
  Batch b;
  if (keys.empty()) return b;
  b.SetColumn(keys::kEpisodeKey, keys);
  b.SetColumn(keys::kAction, actions);
  return b;
}

}  // namespace

std::string EnvironmentClient::Where(int rank) const { return absl::StrCat(envs_->name(), " rank ", rank); }

// The n values of a rank's reply tensor `name`, as T.
template <class T>
absl::StatusOr<std::vector<T>> EnvironmentClient::Values(int rank, const Batch& reply, const char* name,
                                                         size_t n) const {
  auto t = reply.Tensor(name);
  if (!t.ok()) return absl::InternalError(absl::StrCat(Where(rank), ": reply: ", t.status().message()));
  if (t->dim() != 1 || t->size(0) != static_cast<int64_t>(n)) {
    return absl::InternalError(
        absl::StrCat(Where(rank), ": reply '", name, "' holds ", t->numel(), " values where ", n, " were due"));
  }
  // Read in place when the worker sent the documented type (no tensor op
  // on the controller's thread), else converted.
  const at::ScalarType want =
      std::is_same_v<T, bool> ? at::kBool : std::is_same_v<T, double> ? at::kDouble : at::kLong;
  const at::Tensor c = t->scalar_type() == want && t->is_contiguous() ? *t : t->to(want).contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + n);
}

absl::StatusOr<const std::vector<std::string>*> EnvironmentClient::Strings(int rank, const Batch& reply,
                                                                           const char* name, size_t n) const {
  auto c = reply.Column(name);
  if (!c.ok()) return absl::InternalError(absl::StrCat(Where(rank), ": reply: ", c.status().message()));
  if ((*c)->size() != n) {
    return absl::InternalError(
        absl::StrCat(Where(rank), ": reply '", name, "' holds ", (*c)->size(), " entries where ", n, " were due"));
  }
  return *c;
}

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
  // New episodes go to live ranks while there are any: a dead one would
  // need a restart just to take them.
  const std::vector<WorkerInfo> workers = envs_->workers();
  const bool any_alive = std::any_of(workers.begin(), workers.end(), [](const WorkerInfo& w) { return w.alive; });
  auto placement_load = [&](int r) {
    return any_alive && !workers[r].alive ? std::numeric_limits<int64_t>::max() : load[r];
  };
  std::vector<int> rank(episodes.size());
  for (size_t i = 0; i < episodes.size(); ++i) {
    auto it = episodes_.find(episodes[i].key);
    if (it != episodes_.end()) {
      rank[i] = it->second.rank;
      continue;
    }
    rank[i] = 0;
    for (int r = 1; r < world; ++r) {
      if (placement_load(r) < placement_load(rank[i])) rank[i] = r;
    }
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
  for (size_t i = 0; i < episodes.size(); ++i) {
    Episode& e = episodes_[episodes[i].key];  // a new key stays, not started, until it is closed
    e = Episode();
    e.rank = rank[i];
    e.seed = episodes[i].seed;
    rank_keys[rank[i]].push_back(episodes[i].key);
    rank_seeds[rank[i]].push_back(static_cast<int64_t>(episodes[i].seed));
  }
  for (int r = 0; r < world; ++r) per_rank[r] = ResetRequest(rank_keys[r], rank_seeds[r]);
  std::map<std::string, EnvObservation> got;
  ROLL_RETURN_IF_ERROR(Run(environment::kReset, per_rank, rank_keys, /*resend=*/true,
                           [&](int r, const Batch& reply) -> absl::Status {
                             const size_t n = rank_keys[r].size();
                             ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* obs,
                                                   Strings(r, reply, keys::kObservation, n));
                             ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions,
                                                   Strings(r, reply, keys::kInstructions, n));
                             for (size_t i = 0; i < n; ++i) {
                               const std::string& key = rank_keys[r][i];
                               Episode& e = episodes_.at(key);
                               e.started = true;
                               e.observation = (*obs)[i];
                               got[key] = EnvObservation{key, (*obs)[i], (*instructions)[i]};
                             }
                             return absl::OkStatus();
                           }));
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
    if (!e.unsettled.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("episode '", a.key, "' must be reset first: an earlier call failed (", e.unsettled, ")"));
    }
    if (e.done) {
      return absl::FailedPreconditionError(
          absl::StrCat("episode '", a.key, "' is done after ", e.actions.size(), " steps"));
    }
    rank_keys[e.rank].push_back(a.key);
    rank_actions[e.rank].push_back(a.action);
  }
  std::vector<Batch> per_rank(world);
  for (int r = 0; r < world; ++r) per_rank[r] = StepRequest(rank_keys[r], rank_actions[r]);
  std::map<std::string, EnvTransition> got;
  ROLL_RETURN_IF_ERROR(Run(
      environment::kStep, per_rank, rank_keys, /*resend=*/true, [&](int r, const Batch& reply) -> absl::Status {
        // Everything is checked before any episode changes.
        const size_t n = rank_keys[r].size();
        ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* obs, Strings(r, reply, keys::kObservation, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<double> reward, Values<double>(r, reply, keys::kReward, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<bool> done, Values<bool>(r, reply, keys::kDone, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<bool> success, Values<bool>(r, reply, keys::kSuccess, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<bool> truncated, Values<bool>(r, reply, keys::kTruncated, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<bool> valid, Values<bool>(r, reply, keys::kActionValid, n));
        ROLL_ASSIGN_OR_RETURN(const std::vector<int64_t> step, Values<int64_t>(r, reply, keys::kStepIndex, n));
        for (size_t i = 0; i < n; ++i) {
          const Episode& e = episodes_.at(rank_keys[r][i]);
          if (step[i] != static_cast<int64_t>(e.actions.size()) + 1) {
            return absl::InternalError(absl::StrCat(Where(r), ": episode '", rank_keys[r][i], "' is at step ",
                                                    step[i], " where ", e.actions.size() + 1, " were sent"));
          }
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
    it->second.closing = true;  // not rebuilt should its rank die now
  }
  std::vector<Batch> per_rank(world);
  for (int r = 0; r < world; ++r) {
    if (!rank_keys[r].empty()) per_rank[r].SetColumn(keys::kEpisodeKey, rank_keys[r]);
  }
  // A replaced rank never held them: nothing to send it again.
  ROLL_RETURN_IF_ERROR(Run(environment::kClose, per_rank, rank_keys, /*resend=*/false,
                           [](int, const Batch&) { return absl::OkStatus(); }));
  for (const auto& ks : rank_keys) {
    for (const std::string& k : ks) episodes_.erase(k);
  }
  return absl::OkStatus();
}

absl::Status EnvironmentClient::Run(const Method<EnvironmentApi>& method, const std::vector<Batch>& per_rank,
                                    const std::vector<std::vector<std::string>>& keys, bool resend,
                                    const Commit& commit) {
  std::set<int> owed;  // ranks with a share not committed yet
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    if (!keys[r].empty()) owed.insert(r);
  }
  std::set<int> stale;         // replaced ranks whose episodes are not rebuilt yet
  std::map<int, int> deaths;   // per rank, during this call
  // On an error, the episodes of this request (some of which may have
  // taken the action) and those of ranks left unbuilt must be reset before
  // they are used again: nothing is applied twice behind the caller's back.
  auto fail = [&](const absl::Status& why) {
    const std::string reason(why.message());
    for (const auto& ks : keys) {
      for (const std::string& k : ks) {
        if (auto it = episodes_.find(k); it != episodes_.end()) it->second.unsettled = reason;
      }
    }
    for (auto& [key, e] : episodes_) {
      if (stale.count(e.rank)) e.unsettled = reason;
    }
    return why;
  };
  std::vector<bool> has_share(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) has_share[r] = !keys[r].empty();
  std::vector<Batch> inputs = per_rank;
  while (true) {
    CallHandle call = envs_->CallEach(method, inputs, call_options_);
    // Only ranks with a share count: an idle rank that died is replaced
    // when a call needs it.
    const CallOutcome o = WaitOutcome(call, *envs_, has_share);
    const std::vector<Batch> replies = call.EachReply();
    const std::vector<int> ranks = call.ranks();
    for (size_t i = 0; i < ranks.size() && i < o.ok.size(); ++i) {
      if (!o.ok[i] || !owed.count(ranks[i])) continue;
      if (absl::Status s = commit(ranks[i], replies[i]); !s.ok()) return fail(s);
      owed.erase(ranks[i]);
    }
    if (owed.empty()) return absl::OkStatus();
    if (o.status.ok()) {
      return fail(absl::InternalError(absl::StrCat(envs_->name(), ": a call skipped ranks it owed")));
    }
    if (!o.only_dead) return fail(o.status);  // an error of a live rank, or refused before any RPC
    const absl::Status& dead = o.status;
    // Closing on a dead rank: its episodes died with the process. The rank
    // is replaced when a call needs it.
    if (!resend) return absl::OkStatus();
    if (!restart_) return fail(dead);
    // Only dead ranks failed: replace them and rebuild their episodes, as
    // often as ranks keep dying while that is under way.
    absl::Status why = dead;
    while (true) {
      std::vector<pid_t> before;
      for (const WorkerInfo& w : envs_->workers()) before.push_back(w.pid);
      auto replaced = restart_(*envs_, why);
      if (!replaced.ok()) {
        // It may have replaced some ranks before it failed: those hold none
        // of their episodes now.
        const std::vector<WorkerInfo> now = envs_->workers();
        for (size_t r = 0; r < now.size() && r < before.size(); ++r) {
          if (now[r].pid != before[r]) stale.insert(static_cast<int>(r));
        }
        return fail(replaced.status());
      }
      if (replaced->empty()) return fail(why);
      stale.insert(replaced->begin(), replaced->end());
      for (int r : *replaced) {
        if (++deaths[r] > 1) {
          std::vector<std::string> held;
          for (const auto& [key, e] : episodes_) {
            if (e.rank == r && held.size() < 8) held.push_back(key);
          }
          return fail(absl::AbortedError(absl::StrCat(
              Where(r), " died again while this call was recovered (", why.message(), "); the episodes it held (",
              absl::StrJoin(held, ", "), ") may include an action or seed that kills the environment")));
        }
      }
      const CallOutcome o = Replay(stale);
      if (o.status.ok()) break;
      if (!o.only_dead) return fail(o.status);
      why = o.status;
    }
    stale.clear();
    for (int r = 0; r < static_cast<int>(inputs.size()); ++r) inputs[r] = owed.count(r) ? per_rank[r] : Batch();
  }
}

CallOutcome EnvironmentClient::Replay(const std::set<int>& ranks) {
  const int world = envs_->world_size();
  std::vector<std::vector<std::string>> keys(world);
  size_t longest = 0;
  for (const auto& [key, e] : episodes_) {
    // Episodes that must be reset anyway (or are being closed) are not
    // rebuilt; the caller resets them on the new process.
    if (!e.started || e.closing || !e.unsettled.empty() || !ranks.count(e.rank)) continue;
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
      inputs[r] = round == 0 ? ResetRequest(sent[r], seeds) : StepRequest(sent[r], actions);
    }
    CallHandle call =
        envs_->CallEach(round == 0 ? environment::kReset : environment::kStep, std::move(inputs), call_options_);
    CallOutcome o = WaitOutcome(call, *envs_);
    if (!o.status.ok()) return o;
    const std::vector<Batch> replies = call.EachReply();
    const std::vector<int> call_ranks = call.ranks();
    for (size_t i = 0; i < call_ranks.size(); ++i) {
      const int r = call_ranks[i];
      if (sent[r].empty()) continue;
      auto obs = Strings(r, replies[i], keys::kObservation, sent[r].size());
      if (!obs.ok()) {
        return CallOutcome{Annotate(obs.status(), absl::StrCat("replay round ", round)), false, {}};
      }
      for (size_t k = 0; k < sent[r].size(); ++k) last[sent[r][k]] = (**obs)[k];
      if (round > 0) replayed_steps_ += static_cast<int64_t>(sent[r].size());
    }
  }
  for (const auto& [key, obs] : last) {
    const Episode& e = episodes_.at(key);
    if (obs != e.observation) {
      return CallOutcome{absl::InternalError(absl::StrCat(
                             Where(e.rank), ": episode '", key, "' replayed through its ", e.actions.size(),
                             " actions to another observation than it had (the environment is not deterministic "
                             "in its seed and actions), so it cannot be rebuilt")),
                         false, {}};
    }
  }
  return CallOutcome();
}

}  // namespace roll
