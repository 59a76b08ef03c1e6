// AgenticRollout::Collect: env groups run to the end, each episode at its
// own pace.
//
// An episode alternates between two places: a request on a generation
// worker (its whole token history as the prompt, one sample) and, once the
// response is back, a step of its environment. Every poll of the engines
// hands back the responses that finished; their episodes step together in
// one environment call and the ones that go on are submitted again at once,
// while the others keep generating. With `lockstep` the environments step
// only when every running episode has answered (the usual synchronous
// loop), which is what the bench compares against.
//
// A group is complete when group_size of its episodes finished; with
// group_size_redundancy the others are cancelled then. An episode whose
// environment call failed is dropped; a group that lost more episodes than
// its redundancy is dropped whole and a new group takes its place, so no
// trajectory is trained twice and nothing waits on a dead environment.

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/common/logging.h"
#include "roll/common/stopwatch.h"
#include "roll/models/tokenizer.h"
#include "roll/pipeline/agentic.h"

namespace roll {
namespace {

enum class EpisodeState { kRunning, kFinished, kFailed, kCancelled };
enum class GroupState { kRunning, kComplete, kDropped };

struct Episode {
  size_t group = 0;  // index into CollectRun::groups_
  Trajectory traj;
  std::string observation;  // the latest one
  int worker = 0;
  int64_t turn = 0;         // requests submitted
  std::string request;      // the request in flight; empty when none
  bool closed = true;       // the last response ended with its EOS
  EpisodeState state = EpisodeState::kRunning;
};

struct Group {
  TrajectoryGroup data;
  std::vector<std::string> keys;      // every episode started, by index
  std::vector<std::string> finished;  // in finishing order
  int64_t failed = 0;
  GroupState state = GroupState::kRunning;
};

class CollectRun {
 public:
  CollectRun(const AgenticRolloutOptions& o, int64_t step, GenerationClient* gen, EpisodeHost* envs,
             const Tokenizer* tok, const TurnTemplate& tmpl)
      : o_(o), step_(step), gen_(gen), envs_(envs), tok_(tok), template_(tmpl),
        worker_load_(std::max(1, gen->num_workers()), 0) {}

  absl::StatusOr<AgenticRolloutResult> Run() {
    const Stopwatch start;
    while (complete_ < o_.groups) {
      ROLL_RETURN_IF_ERROR(StartGroups());
      ROLL_ASSIGN_OR_RETURN(std::vector<SampleResult> samples, gen_->Poll(o_.poll_wait));
      ++polls_;
      in_flight_sum_ += static_cast<double>(in_flight_.size());
      for (SampleResult& s : samples) OnSample(std::move(s));
      if (!ready_.empty() && (!o_.lockstep || RunningRequests() == 0)) {
        ROLL_RETURN_IF_ERROR(StepReady());
      }
      CloseEnded();
      if (complete_ < o_.groups && in_flight_.empty() && ready_.empty() && RunningGroups() == 0 &&
          !CanStartGroup()) {
        return absl::InternalError("agentic rollout: no episode is running and the batch is not full");
      }
    }
    ROLL_RETURN_IF_ERROR(Drain());
    CloseEnded();
    AgenticRolloutResult out;
    for (Group& g : groups_) {
      if (g.state != GroupState::kComplete) continue;
      std::vector<std::string> kept(g.finished.begin(), g.finished.begin() + o_.group_size);
      std::sort(kept.begin(), kept.end(), [&](const std::string& a, const std::string& b) {
        return episodes_.at(a).traj.index < episodes_.at(b).traj.index;
      });
      for (const std::string& k : kept) g.data.episodes.push_back(std::move(episodes_.at(k).traj));
      out.groups.push_back(std::move(g.data));
    }
    const double secs = std::max(1e-9, start.Seconds());
    Metrics& m = out.metrics;
    m["rollout/env_steps"] = static_cast<double>(env_steps_);
    m["rollout/env_steps_per_s"] = static_cast<double>(env_steps_) / secs;
    m["rollout/gen_tokens"] = static_cast<double>(gen_tokens_);
    m["rollout/gen_tokens_per_s"] = static_cast<double>(gen_tokens_) / secs;
    m["rollout/prefill_tokens"] = static_cast<double>(prompt_tokens_ - cached_tokens_);
    m["rollout/prefix_cache_hit_rate"] =
        prompt_tokens_ > 0 ? static_cast<double>(cached_tokens_) / static_cast<double>(prompt_tokens_) : 0.0;
    m["rollout/gen_in_flight_mean"] = polls_ > 0 ? in_flight_sum_ / static_cast<double>(polls_) : 0.0;
    m["rollout/env_time_fraction"] = env_secs_ / secs;
    m["rollout/dropped_episodes"] = static_cast<double>(dropped_episodes_);
    m["rollout/dropped_groups"] = static_cast<double>(dropped_groups_);
    m["rollout/turns"] = static_cast<double>(turns_);
    m["rollout/close_errors"] = static_cast<double>(close_errors_);
    return out;
  }

 private:
  int64_t RunningGroups() const { return started_ - complete_ - dropped_groups_; }
  bool CanStartGroup() const {
    return complete_ + RunningGroups() < o_.groups &&
           (o_.max_groups_in_flight <= 0 || RunningGroups() < o_.max_groups_in_flight);
  }
  int64_t RunningRequests() const {
    int64_t n = 0;
    for (const auto& [key, ep] : episodes_) n += !ep.request.empty() && ep.state == EpisodeState::kRunning;
    return n;
  }

  // Starts groups while the batch and max_groups_in_flight allow: one reset
  // for all their episodes, then each episode's first turn.
  absl::Status StartGroups() {
    std::vector<EpisodeStart> starts;
    while (CanStartGroup()) {
      if (dropped_groups_ > o_.max_replaced_groups) {
        return absl::UnavailableError(absl::StrCat("agentic rollout: ", dropped_groups_,
                                                   " env groups were dropped in one rollout (more than ",
                                                   o_.max_replaced_groups, "); last failure: ", last_failure_));
      }
      Group g;
      g.data.ordinal = started_++;
      g.data.env_seed = EnvGroupSeed(o_.seed, step_, g.data.ordinal, o_.validation);
      g.data.tag = o_.tags.empty() ? "env" : o_.tags[g.data.ordinal % o_.tags.size()];
      const size_t gi = groups_.size();
      for (int64_t i = 0; i < o_.group_size + o_.group_size_redundancy; ++i) {
        Episode ep;
        ep.group = gi;
        ep.traj.index = i;
        ep.traj.key = absl::StrCat(o_.validation ? "val/" : "train/", step_, "/", g.data.ordinal, "/", i);
        ep.worker = static_cast<int>(std::min_element(worker_load_.begin(), worker_load_.end()) -
                                     worker_load_.begin());
        ++worker_load_[ep.worker];
        g.keys.push_back(ep.traj.key);
        starts.push_back({ep.traj.key, g.data.env_seed});
        episodes_.emplace(ep.traj.key, std::move(ep));
      }
      groups_.push_back(std::move(g));
    }
    if (starts.empty()) return absl::OkStatus();
    const Stopwatch t;
    auto obs = envs_->Reset(starts);
    env_secs_ += t.Seconds();
    if (!obs.ok()) {
      for (const EpisodeStart& s : starts) Fail(s.key, obs.status());
      return absl::OkStatus();
    }
    std::vector<std::vector<GenRequest>> per_worker(worker_load_.size());
    for (const EnvObservation& o : *obs) {
      Episode& ep = episodes_.at(o.key);
      ROLL_ASSIGN_OR_RETURN(const std::string text, template_.First(o.instructions, o.observation));
      for (int32_t id : tok_->Encode(text)) ep.traj.ids.push_back(id);
      ep.traj.generated.assign(ep.traj.ids.size(), 0);
      ep.traj.logprobs.assign(ep.traj.ids.size(), 0.0f);
      ep.observation = o.observation;
      if (static_cast<int64_t>(ep.traj.ids.size()) + o_.max_tokens_per_step > o_.sequence_length) {
        return absl::InvalidArgumentError(absl::StrCat(
            "agentic rollout: the first turn of episode ", o.key, " has ", ep.traj.ids.size(),
            " tokens; with max_tokens_per_step=", o_.max_tokens_per_step, " it exceeds sequence_length=",
            o_.sequence_length));
      }
      per_worker[ep.worker].push_back(NextRequest(&ep));
    }
    return Submit(per_worker);
  }

  GenRequest NextRequest(Episode* ep) {
    const Group& g = groups_[ep->group];
    GenRequest r;
    r.key = absl::StrCat(ep->traj.key, "#", ep->turn);
    r.prompt_ids = ep->traj.ids;
    r.seed = RequestSeed(g.data.env_seed, ep->turn, ep->traj.index);
    ep->request = r.key;
    ++ep->turn;
    in_flight_[r.key] = ep->traj.key;
    return r;
  }

  absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker) {
    bool any = false;
    for (const auto& w : per_worker) any = any || !w.empty();
    if (!any) return absl::OkStatus();
    GenParams p = o_.params;
    p.n = 1;
    p.max_new_tokens = o_.max_tokens_per_step;
    return gen_->Submit(per_worker, p);
  }

  void OnSample(SampleResult s) {
    auto f = in_flight_.find(s.request_key);
    if (f == in_flight_.end()) return;  // not ours, or returned already
    const std::string key = f->second;
    in_flight_.erase(f);
    Episode& ep = episodes_.at(key);
    if (ep.request != s.request_key || ep.state != EpisodeState::kRunning) return;  // cancelled meanwhile
    ep.request.clear();
    Trajectory& t = ep.traj;
    Turn turn;
    turn.begin = static_cast<int64_t>(t.ids.size());
    for (size_t i = 0; i < s.response_ids.size(); ++i) {
      t.ids.push_back(s.response_ids[i]);
      t.generated.push_back(1);
      t.logprobs.push_back(i < s.logprobs.size() ? s.logprobs[i] : 0.0f);
    }
    turn.end = static_cast<int64_t>(t.ids.size());
    turn.response = std::move(s.response_text);
    gen_tokens_ += static_cast<int64_t>(s.response_ids.size());
    prompt_tokens_ += static_cast<int64_t>(s.prompt_ids.size());
    cached_tokens_ += s.cached_prompt_tokens;
    t.weight_version_min = t.weight_version_min < 0 ? s.weight_version : std::min(t.weight_version_min, s.weight_version);
    t.weight_version_max = std::max(t.weight_version_max, s.weight_version);
    t.turns.push_back(std::move(turn));
    ep.closed = s.finish_reason == "stop_token";
    ready_.push_back(key);
  }

  // One environment call for every episode whose response came back; the
  // episodes that go on are submitted again.
  absl::Status StepReady() {
    std::vector<EnvAction> actions;
    for (const std::string& k : ready_) {
      const Episode& ep = episodes_.at(k);
      if (ep.state == EpisodeState::kRunning) actions.push_back({k, ep.traj.turns.back().response});
    }
    ready_.clear();
    if (actions.empty()) return absl::OkStatus();
    const Stopwatch t;
    auto steps = envs_->Step(actions);
    env_secs_ += t.Seconds();
    if (!steps.ok()) {
      for (const EnvAction& a : actions) Fail(a.key, steps.status());
      return absl::OkStatus();
    }
    env_steps_ += static_cast<int64_t>(steps->size());
    std::vector<std::vector<GenRequest>> per_worker(worker_load_.size());
    for (const EnvTransition& tr : *steps) {
      Episode& ep = episodes_.at(tr.key);
      if (ep.state != EpisodeState::kRunning) continue;  // its group completed meanwhile
      ++turns_;
      Trajectory& traj = ep.traj;
      Turn& turn = traj.turns.back();
      turn.reward = tr.reward;
      turn.action_valid = tr.action_valid;
      turn.effective = tr.observation != ep.observation;
      traj.episode_return += tr.reward;
      ep.observation = tr.observation;
      if (tr.done) {
        traj.success = tr.success;
        traj.truncated = tr.truncated;
        Finish(tr.key);
        continue;
      }
      if (o_.max_steps > 0 && static_cast<int64_t>(traj.turns.size()) >= o_.max_steps) {
        traj.truncated = true;
        Finish(tr.key);
        continue;
      }
      const std::vector<int32_t> next = tok_->Encode(template_.Next(tr.observation, ep.closed));
      if (static_cast<int64_t>(traj.ids.size() + next.size()) + o_.max_tokens_per_step > o_.sequence_length) {
        traj.truncated = true;
        traj.length_truncated = true;
        Finish(tr.key);
        continue;
      }
      for (int32_t id : next) traj.ids.push_back(id);
      traj.generated.resize(traj.ids.size(), 0);
      traj.logprobs.resize(traj.ids.size(), 0.0f);
      per_worker[ep.worker].push_back(NextRequest(&ep));
    }
    return Submit(per_worker);
  }

  void Finish(const std::string& key) {
    Episode& ep = episodes_.at(key);
    ep.state = EpisodeState::kFinished;
    to_close_.push_back(key);
    Group& g = groups_[ep.group];
    if (g.state != GroupState::kRunning) return;
    g.finished.push_back(key);
    if (static_cast<int64_t>(g.finished.size()) >= o_.group_size) {
      g.state = GroupState::kComplete;
      ++complete_;
      CancelRest(&g);
    }
  }

  void Fail(const std::string& key, const absl::Status& why) {
    Episode& ep = episodes_.at(key);
    if (ep.state != EpisodeState::kRunning) return;
    ep.state = EpisodeState::kFailed;
    ++dropped_episodes_;
    last_failure_ = absl::StrCat(key, ": ", why.message());
    to_close_.push_back(key);
    Group& g = groups_[ep.group];
    if (g.state != GroupState::kRunning) return;
    if (++g.failed > o_.group_size_redundancy) {
      g.state = GroupState::kDropped;
      ++dropped_groups_;
      LogWarning(absl::StrCat("agentic rollout: episode ", key, " failed (", why.message(), "); its env group ",
                              ep.group, " is dropped (", g.failed, " failed, group_size_redundancy ",
                              o_.group_size_redundancy, ") and a new group takes its place"));
      CancelRest(&g);
    } else {
      LogWarning(absl::StrCat("agentic rollout: episode ", key, " failed (", why.message(), "); env group ",
                              ep.group, " goes on with its redundant episodes (", g.failed, " of ",
                              o_.group_size_redundancy, " used)"));
    }
  }

  // Ends the group's running episodes: their requests are aborted (drained
  // later) and their environments closed.
  void CancelRest(Group* g) {
    std::vector<std::string> aborts;
    for (const std::string& k : g->keys) {
      Episode& ep = episodes_.at(k);
      if (ep.state != EpisodeState::kRunning) continue;
      ep.state = EpisodeState::kCancelled;
      if (!ep.request.empty()) aborts.push_back(ep.request);
      to_close_.push_back(k);
    }
    if (!aborts.empty()) pending_aborts_.insert(pending_aborts_.end(), aborts.begin(), aborts.end());
  }

  void CloseEnded() {
    if (!pending_aborts_.empty()) {
      // An abort that fails leaves the request to finish by itself; Drain
      // waits for it either way.
      gen_->Abort(pending_aborts_).IgnoreError();
      pending_aborts_.clear();
    }
    if (to_close_.empty()) return;
    std::vector<std::string> keys;
    for (const std::string& k : to_close_) {
      Episode& ep = episodes_.at(k);
      --worker_load_[ep.worker];
      keys.push_back(k);
    }
    to_close_.clear();
    const Stopwatch t;
    // A close that fails (a hung or lost environment worker) costs nothing
    // already collected; the episodes are done with either way.
    if (!envs_->Close(keys).ok()) ++close_errors_;
    env_secs_ += t.Seconds();
  }

  // Aborts what still runs (redundant episodes of complete groups) and
  // waits until every request came back, so nothing leaks into a later call.
  absl::Status Drain() {
    std::vector<std::string> keys;
    for (const auto& [req, ep] : in_flight_) keys.push_back(req);
    if (!keys.empty()) ROLL_RETURN_IF_ERROR(gen_->Abort(keys));
    for (const auto& [key, ep] : episodes_) {
      if (ep.state == EpisodeState::kRunning) {
        episodes_.at(key).state = EpisodeState::kCancelled;
        to_close_.push_back(key);
      }
    }
    while (!in_flight_.empty()) {
      ROLL_ASSIGN_OR_RETURN(std::vector<SampleResult> samples, gen_->Poll(o_.poll_wait));
      for (const SampleResult& s : samples) in_flight_.erase(s.request_key);
    }
    return absl::OkStatus();
  }

  const AgenticRolloutOptions& o_;
  const int64_t step_;
  GenerationClient* gen_;
  EpisodeHost* envs_;
  const Tokenizer* tok_;
  const TurnTemplate& template_;
  std::vector<int64_t> worker_load_;  // episodes per generation worker
  std::map<std::string, Episode> episodes_;
  std::vector<Group> groups_;
  std::map<std::string, std::string> in_flight_;  // request key -> episode key
  std::vector<std::string> ready_;                 // episodes with a response to step
  std::vector<std::string> to_close_;
  std::vector<std::string> pending_aborts_;
  int64_t started_ = 0, complete_ = 0, dropped_groups_ = 0, dropped_episodes_ = 0;
  int64_t env_steps_ = 0, gen_tokens_ = 0, turns_ = 0, polls_ = 0, close_errors_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0;
  double in_flight_sum_ = 0, env_secs_ = 0;
  std::string last_failure_;
};

}  // namespace

absl::StatusOr<AgenticRolloutResult> AgenticRollout::Collect(const AgenticRolloutOptions& o, int64_t step) {
  if (o.groups <= 0) return absl::InvalidArgumentError("AgenticRolloutOptions.groups must be > 0");
  if (o.group_size <= 0) return absl::InvalidArgumentError("AgenticRolloutOptions.group_size must be > 0");
  if (o.max_tokens_per_step <= 0) {
    return absl::InvalidArgumentError("AgenticRolloutOptions.max_tokens_per_step must be > 0");
  }
  if (gen_->num_workers() <= 0) return absl::FailedPreconditionError("no generation workers");
  return CollectRun(o, step, gen_, envs_, tokenizer_, template_).Run();
}

}  // namespace roll
