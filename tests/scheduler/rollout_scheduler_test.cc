#include "roll/scheduler/rollout_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace roll {
namespace {

// A generation fake: every request yields n samples whose "response" is the
// prompt's answer or not, decided by a per-prompt rule; samples come back a
// few at a time in a shuffled order; aborts turn pending samples into
// "abort" results.
class FakeGeneration : public GenerationClient {
 public:
  FakeGeneration(int workers, uint64_t shuffle_seed) : workers_(workers), rng_(shuffle_seed) {}
  int num_workers() const override { return workers_; }
  absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker,
                      const GenParams& params) override {
    EXPECT_EQ(static_cast<int>(per_worker.size()), workers_);
    for (const auto& reqs : per_worker) {
      for (const GenRequest& r : reqs) {
        EXPECT_EQ(submitted_keys_.count(r.key), 0u) << r.key;
        submitted_keys_.insert(r.key);
        seeds_.push_back(r.seed);
        for (int64_t i = 0; i < params.n; ++i) {
          SampleResult s;
          s.request_key = r.key;
          s.sample_index = i;
          s.prompt_ids = {1, 2};
          // Prompt "p<k>": the text says which samples are right, "all",
          // "none" or "half".
          s.response_text = r.prompt == "all" ? "right"
                            : r.prompt == "none" ? "wrong"
                                                 : (i % 2 == 0 ? "right" : "wrong");
          s.response_ids = {3};
          s.finish_reason = "stop_token";
          pending_.push_back(std::move(s));
        }
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<SampleResult>> Poll(absl::Duration) override {
    std::shuffle(pending_.begin(), pending_.end(), rng_);
    std::vector<SampleResult> out;
    for (int i = 0; i < 3 && !pending_.empty(); ++i) {
      out.push_back(std::move(pending_.back()));
      pending_.pop_back();
    }
    ++polls_;
    return out;
  }
  absl::Status Abort(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) {
      aborted_.insert(k);
      for (SampleResult& s : pending_) {
        if (s.request_key == k) s.finish_reason = "abort";
      }
    }
    return absl::OkStatus();
  }

  int workers_;
  std::mt19937_64 rng_;
  std::vector<SampleResult> pending_;
  std::set<std::string> submitted_keys_, aborted_;
  std::vector<uint64_t> seeds_;
  int polls_ = 0;
};

// Scores "right" 1 and anything else 0, one Poll later than Submit.
class FakeReward : public RewardClient {
 public:
  absl::Status Submit(std::vector<SampleResult> samples) override {
    for (SampleResult& s : samples) {
      EXPECT_NE(s.finish_reason, "abort");
      const std::string id = absl::StrCat(s.request_key, "/", s.sample_index);
      EXPECT_EQ(scored_ids_.count(id), 0u) << "scored twice: " << id;
      scored_ids_.insert(id);
      s.score = s.response_text == "right" ? 1.0 : 0.0;
      queue_.push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<SampleResult>> Poll(bool) override {
    std::vector<SampleResult> out(std::make_move_iterator(queue_.begin()),
                                  std::make_move_iterator(queue_.end()));
    queue_.clear();
    return out;
  }
  int64_t pending() const override { return static_cast<int64_t>(queue_.size()); }

  std::vector<SampleResult> queue_;
  std::set<std::string> scored_ids_;
};

// Prompts cycle through `kinds`; each prompt's ground truth is its number.
PromptSource Prompts(std::vector<std::string> kinds, int* counter) {
  return [kinds, counter]() -> absl::StatusOr<PromptItem> {
    PromptItem p;
    p.id = absl::StrCat((*counter));
    p.prompt = kinds[*counter % kinds.size()];
    p.ground_truth = p.id;
    p.tag = "math";
    ++*counter;
    return p;
  };
}

void ExpectWholeGroups(const RolloutBatch& b, int64_t groups, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(b.groups.size()), groups);
  std::set<std::string> keys;
  for (const RolloutGroup& g : b.groups) {
    ASSERT_EQ(static_cast<int64_t>(g.samples.size()), n);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(g.samples[i].sample_index, i);
      EXPECT_EQ(g.samples[i].ground_truth, g.prompt.ground_truth);
      EXPECT_EQ(g.samples[i].tag, "math");
      keys.insert(absl::StrCat(g.samples[i].request_key, "/", i));
    }
  }
  EXPECT_EQ(static_cast<int64_t>(keys.size()), groups * n) << "a sample appears twice";
}

TEST(RolloutSchedulerTest, CollectsWholeScoredGroups) {
  FakeGeneration gen(2, 1);
  FakeReward reward;
  RolloutScheduler s(&gen, &reward);
  RolloutOptions o;
  o.groups = 5;
  o.params.n = 4;
  int counter = 0;
  auto b = s.Collect(o, Prompts({"half"}, &counter), 1);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectWholeGroups(*b, 5, 4);
  EXPECT_EQ(counter, 5);
  EXPECT_EQ(b->metrics.at("rollout/dropped_groups"), 0);
  for (const RolloutGroup& g : b->groups) {
    EXPECT_EQ(g.samples[0].score, 1.0);
    EXPECT_EQ(g.samples[1].score, 0.0);
  }
}

TEST(RolloutSchedulerTest, DynamicSamplingDropsZeroVarianceGroupsAndTopsUp) {
  FakeGeneration gen(3, 7);
  FakeReward reward;
  RolloutScheduler s(&gen, &reward);
  RolloutOptions o;
  o.groups = 4;
  o.params.n = 2;
  o.dynamic_sampling = true;
  o.max_additional_rounds = 3;
  int counter = 0;
  // Two of every three prompts are all right or all wrong.
  auto b = s.Collect(o, Prompts({"all", "half", "none"}, &counter), 3);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectWholeGroups(*b, 4, 2);
  for (const RolloutGroup& g : b->groups) {
    EXPECT_EQ(g.prompt.prompt, "half") << "a zero-variance group was kept";
  }
  EXPECT_GE(b->metrics.at("rollout/dropped_groups"), 7);  // ordinals 0, 2, 3, 5, 6, 8, 9
  EXPECT_EQ(b->metrics.at("rollout/filled_zero_variance"), 0);
  EXPECT_LE(counter, 16);  // within groups * (1 + rounds)
  EXPECT_TRUE(gen.pending_.empty()) << "requests left running after the step";
}

TEST(RolloutSchedulerTest, DynamicSamplingBudgetFillsWithZeroVarianceGroups) {
  FakeGeneration gen(1, 3);
  FakeReward reward;
  RolloutScheduler s(&gen, &reward);
  RolloutOptions o;
  o.groups = 3;
  o.params.n = 2;
  o.dynamic_sampling = true;
  o.max_additional_rounds = 1;
  int counter = 0;
  auto b = s.Collect(o, Prompts({"all"}, &counter), 0);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectWholeGroups(*b, 3, 2);
  EXPECT_EQ(counter, 6);
  EXPECT_EQ(b->metrics.at("rollout/filled_zero_variance"), 3);
}

TEST(RolloutSchedulerTest, RedundantPromptsAreAbortedAndDrained) {
  FakeGeneration gen(2, 11);
  FakeReward reward;
  RolloutScheduler s(&gen, &reward);
  RolloutOptions o;
  o.groups = 4;
  o.params.n = 3;
  o.redundant_prompts = 1.0;
  int counter = 0;
  auto b = s.Collect(o, Prompts({"half"}, &counter), 2);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectWholeGroups(*b, 4, 3);
  EXPECT_EQ(counter, 8);
  EXPECT_TRUE(gen.pending_.empty());
  EXPECT_EQ(reward.pending(), 0);
  // The batch is the first four prompts by submission order.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b->groups[i].ordinal, i);
  // Every sample came back exactly once: scored, or counted as aborted.
  EXPECT_EQ(b->metrics.at("rollout/aborted_samples") + reward.scored_ids_.size(), 8 * 3);
}

TEST(RolloutSchedulerTest, BatchDoesNotDependOnFinishingOrder) {
  std::vector<std::vector<std::string>> ids;
  for (uint64_t shuffle : {1u, 2u, 3u}) {
    FakeGeneration gen(2, shuffle);
    FakeReward reward;
    RolloutScheduler s(&gen, &reward);
    RolloutOptions o;
    o.groups = 3;
    o.params.n = 2;
    o.dynamic_sampling = true;
    o.seed = 99;
    int counter = 0;
    auto b = s.Collect(o, Prompts({"half", "all", "half", "none"}, &counter), 5);
    ASSERT_TRUE(b.ok()) << b.status();
    std::vector<std::string> got;
    for (const RolloutGroup& g : b->groups) got.push_back(g.prompt.id);
    ids.push_back(got);
    EXPECT_EQ(gen.seeds_[0], RequestSeed(99, 5, 0));
  }
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(ids[0], ids[2]);
}

TEST(RolloutSchedulerTest, SeedsDifferAcrossStepsAndRequests) {
  std::set<uint64_t> seen;
  for (int64_t step = 0; step < 20; ++step) {
    for (int64_t k = 0; k < 20; ++k) seen.insert(RequestSeed(42, step, k));
  }
  EXPECT_EQ(seen.size(), 400u);
  EXPECT_EQ(RequestSeed(42, 3, 4), RequestSeed(42, 3, 4));
}

TEST(RolloutSchedulerTest, RejectsBadOptions) {
  FakeGeneration gen(1, 1);
  FakeReward reward;
  RolloutScheduler s(&gen, &reward);
  RolloutOptions o;
  o.groups = 0;
  int counter = 0;
  EXPECT_FALSE(s.Collect(o, Prompts({"half"}, &counter), 0).ok());
}

}  // namespace
}  // namespace roll
