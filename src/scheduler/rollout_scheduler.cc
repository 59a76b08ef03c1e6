#include "roll/scheduler/rollout_scheduler.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace roll {
namespace {

// splitmix64: decorrelates neighbouring (step, ordinal) pairs.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class GroupState { kRunning, kKept, kDropped, kAborted };

struct Group {
  RolloutGroup data;
  GroupState state = GroupState::kRunning;
  int worker = 0;
  int64_t returned = 0;  // samples back from generation (finished or aborted)
  int64_t scored = 0;
  std::set<int64_t> seen;  // sample indices returned, to refuse duplicates
};

}  // namespace

uint64_t RequestSeed(uint64_t seed, int64_t step, int64_t ordinal) {
  return Mix(Mix(seed) ^ Mix(static_cast<uint64_t>(step) * 0x100000001b3ull) ^
             static_cast<uint64_t>(ordinal)) >> 1;  // keep it positive as int64
}

absl::StatusOr<RolloutBatch> RolloutScheduler::Collect(const RolloutOptions& o,
                                                       const PromptSource& source, int64_t step) {
  if (o.groups <= 0) return absl::InvalidArgumentError("RolloutOptions.groups must be > 0");
  if (o.params.n <= 0) return absl::InvalidArgumentError("GenParams.n must be > 0");
  const int workers = gen_->num_workers();
  if (workers <= 0) return absl::FailedPreconditionError("no generation workers");
  const int64_t n = o.params.n;
  const int64_t redundant = static_cast<int64_t>(std::ceil(o.groups * o.redundant_prompts));
  const int64_t budget =
      o.groups * (1 + (o.dynamic_sampling ? std::max<int64_t>(0, o.max_additional_rounds) : 0)) +
      redundant;
  const int64_t upfront = o.groups + redundant;

  std::vector<Group> groups;
  std::map<std::string, int64_t> by_key;
  std::vector<int64_t> in_flight(workers, 0);  // samples per worker
  RolloutBatch out;
  int64_t aborted_samples = 0;

  auto submit = [&](int64_t count) -> absl::Status {
    std::vector<std::vector<GenRequest>> per_worker(workers);
    for (int64_t i = 0; i < count; ++i) {
      ROLL_ASSIGN_OR_RETURN(PromptItem p, source());
      Group g;
      g.data.ordinal = static_cast<int64_t>(groups.size());
      g.data.prompt = std::move(p);
      g.worker = static_cast<int>(std::min_element(in_flight.begin(), in_flight.end()) -
                                  in_flight.begin());
      in_flight[g.worker] += n;
      const std::string key = absl::StrCat(step, ":", g.data.ordinal);
      GenRequest r;
      r.key = key;
      r.prompt = g.data.prompt.prompt;
      r.seed = RequestSeed(o.seed, step, g.data.ordinal);
      per_worker[g.worker].push_back(std::move(r));
      by_key[key] = g.data.ordinal;
      groups.push_back(std::move(g));
    }
    return gen_->Submit(per_worker, o.params);
  };

  // The batch is decided once the first `o.groups` kept groups are known
  // with every earlier group complete.
  auto decided = [&]() {
    int64_t kept = 0;
    for (const Group& g : groups) {
      if (g.state == GroupState::kRunning) return false;
      if (g.state == GroupState::kKept && ++kept == o.groups) return true;
    }
    return false;
  };
  auto open_groups = [&]() {
    int64_t c = 0;
    for (const Group& g : groups) c += g.state == GroupState::kRunning;
    return c;
  };
  auto kept_count = [&]() {
    int64_t c = 0;
    for (const Group& g : groups) c += g.state == GroupState::kKept;
    return c;
  };

  ROLL_RETURN_IF_ERROR(submit(upfront));
  int64_t rounds = 1;
  while (!decided()) {
    const bool gen_idle =
        std::all_of(in_flight.begin(), in_flight.end(), [](int64_t c) { return c == 0; });
    std::vector<SampleResult> finished;
    if (!gen_idle) {
      ROLL_ASSIGN_OR_RETURN(finished, gen_->Poll(o.poll_wait));
    }
    std::vector<SampleResult> to_score;
    for (SampleResult& r : finished) {
      auto it = by_key.find(r.request_key);
      if (it == by_key.end()) {
        return absl::InternalError(absl::StrCat("generation returned unknown request '",
                                                r.request_key, "'"));
      }
      Group& g = groups[it->second];
      if (!g.seen.insert(r.sample_index).second || r.sample_index < 0 || r.sample_index >= n) {
        return absl::InternalError(absl::StrCat("request '", r.request_key, "': sample ",
                                                r.sample_index, " returned twice or out of range"));
      }
      ++g.returned;
      --in_flight[g.worker];
      out.generated.emplace_back(static_cast<int64_t>(r.prompt_ids.size()), static_cast<int64_t>(r.response_ids.size()));
      if (g.state != GroupState::kRunning || r.finish_reason == "abort") {
        ++aborted_samples;
        continue;
      }
      r.ground_truth = g.data.prompt.ground_truth;
      r.tag = g.data.prompt.tag;
      to_score.push_back(std::move(r));
    }
    if (!to_score.empty()) ROLL_RETURN_IF_ERROR(reward_->Submit(std::move(to_score)));
    // With nothing left to generate, wait for the scores instead of spinning.
    ROLL_ASSIGN_OR_RETURN(std::vector<SampleResult> scored,
                          reward_->Poll(gen_idle && to_score.empty()));
    int64_t replacements = 0;
    for (SampleResult& s : scored) {
      Group& g = groups[by_key.at(s.request_key)];
      if (g.state != GroupState::kRunning) continue;
      g.data.samples.push_back(std::move(s));
      if (++g.scored < n) continue;
      std::sort(g.data.samples.begin(), g.data.samples.end(),
                [](const SampleResult& a, const SampleResult& b) {
                  return a.sample_index < b.sample_index;
                });
      bool same = true;
      for (const SampleResult& x : g.data.samples) same &= x.score == g.data.samples[0].score;
      if (o.dynamic_sampling && same) {
        g.state = GroupState::kDropped;
        ++replacements;
      } else {
        g.state = GroupState::kKept;
      }
    }
    // Top up: replace dropped groups while the budget lasts, and never let
    // the pipeline run dry while the batch is short.
    const int64_t submitted = static_cast<int64_t>(groups.size());
    int64_t want = std::min(replacements, budget - submitted);
    if (want <= 0 && open_groups() == 0 && kept_count() < o.groups) {
      want = std::min(o.groups - kept_count(), budget - submitted);
    }
    if (want > 0) {
      ROLL_RETURN_IF_ERROR(submit(want));
      ++rounds;
    }
    if (open_groups() == 0 && static_cast<int64_t>(groups.size()) >= budget) break;
  }

  // Abort what is no longer needed, then drain it.
  std::vector<std::string> abort_keys;
  int64_t taken = 0;
  for (Group& g : groups) {
    if (g.state == GroupState::kKept && taken < o.groups) {
      ++taken;
      continue;
    }
    if (g.state == GroupState::kRunning) {
      g.state = GroupState::kAborted;
      abort_keys.push_back(absl::StrCat(step, ":", g.data.ordinal));
    }
  }
  if (!abort_keys.empty()) ROLL_RETURN_IF_ERROR(gen_->Abort(abort_keys));
  auto outstanding = [&]() {
    int64_t c = 0;
    for (const Group& g : groups) c += n - g.returned;
    return c;
  };
  while (outstanding() > 0) {
    ROLL_ASSIGN_OR_RETURN(std::vector<SampleResult> finished, gen_->Poll(o.poll_wait));
    for (SampleResult& r : finished) {
      auto it = by_key.find(r.request_key);
      if (it == by_key.end()) continue;
      Group& g = groups[it->second];
      if (!g.seen.insert(r.sample_index).second) {
        return absl::InternalError(absl::StrCat("request '", r.request_key, "': sample ",
                                                r.sample_index, " returned twice"));
      }
      ++g.returned;
      ++aborted_samples;
      out.generated.emplace_back(static_cast<int64_t>(r.prompt_ids.size()), static_cast<int64_t>(r.response_ids.size()));
    }
  }
  // Scores still in flight belong to aborted groups; wait them out so the
  // next step starts clean.
  while (reward_->pending() > 0) ROLL_RETURN_IF_ERROR(reward_->Poll(true).status());

  int64_t dropped = 0, filled = 0;
  for (Group& g : groups) {
    if (g.state == GroupState::kDropped) ++dropped;
    if (g.state == GroupState::kKept && static_cast<int64_t>(out.groups.size()) < o.groups) {
      out.groups.push_back(std::move(g.data));
    }
  }
  // Budget spent without enough signal: fill up with zero-variance groups
  // (they carry zero group-relative advantage) to keep the batch size.
  for (Group& g : groups) {
    if (static_cast<int64_t>(out.groups.size()) >= o.groups) break;
    if (g.state == GroupState::kDropped) {
      out.groups.push_back(std::move(g.data));
      ++filled;
    }
  }
  std::sort(out.groups.begin(), out.groups.end(),
            [](const RolloutGroup& a, const RolloutGroup& b) { return a.ordinal < b.ordinal; });
  if (static_cast<int64_t>(out.groups.size()) < o.groups) {
    return absl::InternalError(absl::StrCat("rollout produced ", out.groups.size(), " of ",
                                            o.groups, " groups"));
  }
  out.metrics["rollout/submitted_prompts"] = static_cast<double>(groups.size());
  out.metrics["rollout/dropped_groups"] = static_cast<double>(dropped);
  out.metrics["rollout/filled_zero_variance"] = static_cast<double>(filled);
  out.metrics["rollout/aborted_samples"] = static_cast<double>(aborted_samples);
  out.metrics["rollout/rounds"] = static_cast<double>(rounds);
  return out;
}

}  // namespace roll
