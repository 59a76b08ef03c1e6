// AgenticRollout and BuildTrajectoryBatch on a generation fake and
// environments in this process: token-exact trajectories and masks, group
// seeds, limits, redundancy, dropped environments and lock-step.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
#include "roll/models/tokenizer.h"
#include "roll/pipeline/agentic.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

Tokenizer CharTok() {
  CharTokenizerOptions o;
  for (char c = 32; c < 127; ++c) o.alphabet.push_back(c);
  o.alphabet.push_back('\n');
  auto t = MakeCharTokenizer(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// The move a scripted policy makes at turn `turn` of episode `index`.
std::string Move(int64_t index, int64_t turn) {
  static const char* kMoves[] = {"<answer>Right</answer>", "<answer>Down</answer>", "<answer>Left</answer>",
                                 "Down", "jump"};
  return kMoves[(index * 7 + turn * 3 + turn * turn) % 5];
}

int64_t TurnOf(const std::string& request_key) {
  return std::stoll(request_key.substr(request_key.rfind('#') + 1));
}
int64_t IndexOf(const std::string& request_key) {
  const std::string ep = request_key.substr(0, request_key.rfind('#'));
  return std::stoll(ep.substr(ep.rfind('/') + 1));
}

// Answers each request with the scripted move plus EOS (or cut at the
// turn's budget), a few samples per poll in a shuffled order.
class ScriptedGeneration : public GenerationClient {
 public:
  explicit ScriptedGeneration(const Tokenizer* tok, int workers = 2) : tok_(tok), workers_(workers) {}
  int num_workers() const override { return workers_; }
  absl::Status Submit(const std::vector<std::vector<GenRequest>>& per_worker, const GenParams& params) override {
    EXPECT_EQ(params.n, 1);
    for (const auto& reqs : per_worker) {
      for (const GenRequest& r : reqs) {
        EXPECT_FALSE(r.prompt_ids.empty());
        EXPECT_EQ(keys_.count(r.key), 0u) << r.key;
        keys_.insert(r.key);
        prompts_[r.key] = r.prompt_ids;
        SampleResult s;
        s.request_key = r.key;
        s.prompt_ids = r.prompt_ids;
        s.response_text = Move(IndexOf(r.key), TurnOf(r.key));
        for (int32_t id : tok_->Encode(s.response_text)) s.response_ids.push_back(id);
        s.response_ids.push_back(*tok_->eos_id());
        s.finish_reason = "stop_token";
        if (static_cast<int64_t>(s.response_ids.size()) > params.max_new_tokens) {
          s.response_ids.resize(params.max_new_tokens);
          s.finish_reason = "length";
        }
        for (size_t i = 0; i < s.response_ids.size(); ++i) s.logprobs.push_back(-0.01f * (i + 1));
        s.weight_version = 3;
        pending_.push_back(std::move(s));
        max_pending_ = std::max<int64_t>(max_pending_, pending_.size());
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<SampleResult>> Poll(absl::Duration) override {
    std::shuffle(pending_.begin(), pending_.end(), rng_);
    std::vector<SampleResult> out;
    for (int i = 0; i < 3 && !pending_.empty(); ++i) {
      SampleResult s = std::move(pending_.back());
      pending_.pop_back();
      if (aborted_.count(s.request_key)) s.finish_reason = "abort";
      out.push_back(std::move(s));
    }
    return out;
  }
  absl::Status Abort(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) aborted_.insert(k);
    return absl::OkStatus();
  }
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }

  std::map<std::string, std::vector<int64_t>> prompts_;
  std::set<std::string> aborted_;
  int64_t max_pending_ = 0;

 private:
  const Tokenizer* tok_;
  int workers_;
  std::mt19937_64 rng_{7};
  std::set<std::string> keys_;
  std::vector<SampleResult> pending_;
};

// LocalEpisodeHost that counts calls and fails the steps of chosen episodes.
class CountingHost : public EpisodeHost {
 public:
  CountingHost(std::string type, std::vector<std::string> options) : local_(std::move(type), std::move(options)) {}
  absl::StatusOr<std::vector<EnvObservation>> Reset(const std::vector<EpisodeStart>& e) override {
    for (const EpisodeStart& s : e) seeds_[s.key] = s.seed;
    return local_.Reset(e);
  }
  absl::StatusOr<std::vector<EnvTransition>> Step(const std::vector<EnvAction>& a) override {
    ++step_calls_;
    for (const EnvAction& x : a) {
      if (fail_.count(x.key)) return absl::UnavailableError(absl::StrCat("environment of ", x.key, " hung"));
    }
    return local_.Step(a);
  }
  absl::Status Close(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) closed_.insert(k);
    return local_.Close(keys);
  }
  LocalEpisodeHost local_;
  std::map<std::string, uint64_t> seeds_;
  std::set<std::string> fail_, closed_;
  int step_calls_ = 0;
};

AgenticRolloutOptions Options() {
  AgenticRolloutOptions o;
  o.groups = 3;
  o.group_size = 2;
  o.max_tokens_per_step = 32;
  o.sequence_length = 2048;
  o.seed = 11;
  o.tags = {"lake"};
  return o;
}

const std::vector<std::string> kLake = {"size=4", "max_steps=6"};

// A rollout over the scripted generator and lakes in this process.
struct Rig {
  explicit Rig(const std::vector<std::string>& lake = kLake) : host("frozen_lake", lake) {}
  absl::StatusOr<AgenticRolloutResult> Collect(const AgenticRolloutOptions& o, int64_t step) {
    return AgenticRollout(&gen, &host, &tok, TurnTemplate(ChatTemplate::kNone)).Collect(o, step);
  }
  Tokenizer tok = CharTok();
  ScriptedGeneration gen{&tok};
  CountingHost host;
};

TEST(AgenticRolloutTest, TrajectoriesAreTokenExactAgainstTheTurns) {
  Rig rig;
  const Tokenizer& tok = rig.tok;
  const ScriptedGeneration& gen = rig.gen;
  const CountingHost& host = rig.host;
  const TurnTemplate tmpl(ChatTemplate::kNone);
  auto r = rig.Collect(Options(), /*step=*/5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 3u);
  for (const TrajectoryGroup& g : r->groups) {
    ASSERT_EQ(g.episodes.size(), 2u);
    EXPECT_EQ(g.tag, "lake");
    EXPECT_EQ(g.env_seed, EnvGroupSeed(11, 5, g.ordinal, false));
    for (const Trajectory& t : g.episodes) {
      // Replay the episode in this process with the same moves, building
      // the expected token history turn by turn.
      auto env = MakeEnvironment("frozen_lake", kLake);
      ASSERT_TRUE(env.ok());
      auto obs = (*env)->Reset(g.env_seed);
      ASSERT_TRUE(obs.ok());
      EXPECT_EQ(host.seeds_.at(t.key), g.env_seed);
      std::vector<int64_t> ids;
      std::vector<uint8_t> gen_mask;
      auto add = [&](const std::string& text, bool generated, bool eos) {
        for (int32_t id : tok.Encode(text)) {
          ids.push_back(id);
          gen_mask.push_back(generated);
        }
        if (eos) {
          ids.push_back(*tok.eos_id());
          gen_mask.push_back(1);
        }
      };
      add(*tmpl.First((*env)->Instructions(), *obs), false, false);
      double ret = 0;
      bool success = false, done = false;
      size_t turns = 0;
      for (int64_t turn = 0; !done; ++turn) {
        const std::string move = Move(t.index, turn);
        add(move, true, true);
        auto s = (*env)->Step(move);
        ASSERT_TRUE(s.ok());
        ASSERT_LT(turns, t.turns.size());
        EXPECT_EQ(t.turns[turns].response, move);
        EXPECT_EQ(t.turns[turns].reward, s->reward);
        EXPECT_EQ(t.turns[turns].action_valid, s->action_valid);
        ++turns;
        ret += s->reward;
        done = s->done;
        success = s->success;
        if (!done) add(tmpl.Next(s->observation, true), false, false);
      }
      EXPECT_EQ(t.ids, ids) << t.key;
      EXPECT_EQ(t.generated, gen_mask) << t.key;
      EXPECT_EQ(t.turns.size(), turns);
      EXPECT_DOUBLE_EQ(t.episode_return, ret);
      EXPECT_EQ(t.success, success);
      EXPECT_EQ(t.weight_version_min, 3);
      // Log-probs sit on generated tokens only.
      for (size_t i = 0; i < t.ids.size(); ++i) {
        if (!t.generated[i]) EXPECT_EQ(t.logprobs[i], 0.0f);
        else EXPECT_LT(t.logprobs[i], 0.0f);
      }
      // Each request carried the history so far, untouched.
      for (size_t k = 0; k < t.turns.size(); ++k) {
        const std::vector<int64_t>& p = gen.prompts_.at(absl::StrCat(t.key, "#", k));
        EXPECT_EQ(p, std::vector<int64_t>(t.ids.begin(), t.ids.begin() + t.turns[k].begin));
      }
    }
    // Both episodes of a group start from the same lake.
    EXPECT_EQ(host.seeds_.at(g.episodes[0].key), host.seeds_.at(g.episodes[1].key));
  }
  EXPECT_EQ(host.closed_.size(), 6u);
  EXPECT_EQ(gen.pending(), 0);
  EXPECT_GT(r->metrics.at("rollout/env_steps"), 0);
}

TEST(AgenticRolloutTest, TrainingAndValidationSeedsNeverMeet) {
  std::set<uint64_t> train;
  for (int64_t step = 0; step < 50; ++step) {
    for (int64_t g = 0; g < 20; ++g) train.insert(EnvGroupSeed(3, step, g, false));
  }
  EXPECT_EQ(train.size(), 1000u);
  for (int64_t g = 0; g < 200; ++g) {
    EXPECT_EQ(train.count(EnvGroupSeed(3, 0, g, true)), 0u);
    // Validation groups are the same whatever the step.
    EXPECT_EQ(EnvGroupSeed(3, 0, g, true), EnvGroupSeed(3, 9, g, true));
  }
}

TEST(AgenticRolloutTest, MaxStepsAndSequenceLengthTruncate) {
  const std::vector<std::string> big_lake = {"size=6", "max_steps=50"};
  {
    Rig rig(big_lake);
    AgenticRolloutOptions o = Options();
    o.max_steps = 2;
    auto r = rig.Collect(o, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    int truncated = 0;
    for (const auto& g : r->groups) {
      for (const auto& t : g.episodes) {
        EXPECT_LE(t.turns.size(), 2u);
        // Only the limit truncates here (the lake's own is 50 steps).
        if (t.truncated) EXPECT_EQ(t.turns.size(), 2u);
        if (t.turns.size() < 2) EXPECT_FALSE(t.truncated);
        truncated += t.truncated;
      }
    }
    EXPECT_GT(truncated, 0);
  }
  {
    Rig rig(big_lake);
    AgenticRolloutOptions o = Options();
    o.sequence_length = 330;
    auto r = rig.Collect(o, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    Metrics m;
    TrajectoryMetrics(r->groups, "train/", &m);
    int length_truncated = 0;
    for (const auto& g : r->groups) {
      for (const auto& t : g.episodes) {
        EXPECT_LE(static_cast<int64_t>(t.ids.size()), 330);
        length_truncated += t.length_truncated;
        if (t.length_truncated) EXPECT_TRUE(t.truncated);
      }
    }
    EXPECT_GT(length_truncated, 0);
    EXPECT_DOUBLE_EQ(m.at("train/length_truncated_rate"), length_truncated / 6.0);
    // A first turn that cannot fit is a configuration error, named.
    o.sequence_length = 100;
    auto bad = Rig(big_lake).Collect(o, 1);
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("exceeds sequence_length=100"));
  }
}

TEST(AgenticRolloutTest, ARedundantGroupKeepsTheFirstToFinishAndCancelsTheRest) {
  Rig rig;
  AgenticRolloutOptions o = Options();
  o.group_size_redundancy = 1;
  auto r = rig.Collect(o, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 3u);
  for (const auto& g : r->groups) {
    ASSERT_EQ(g.episodes.size(), 2u);
    EXPECT_LT(g.episodes[0].index, g.episodes[1].index);
  }
  // Every episode started (9) was closed, and no request is left running.
  EXPECT_EQ(rig.host.closed_.size(), 9u);
  EXPECT_EQ(rig.gen.pending(), 0);
}

TEST(AgenticRolloutTest, AFailedEnvironmentDropsItsGroupAndANewOneTakesItsPlace) {
  Rig rig;
  rig.host.fail_.insert("train/4/1/0");
  AgenticRolloutOptions o = Options();
  o.lockstep = true;  // one step call per round: the failure takes the whole round's episodes
  auto r = rig.Collect(o, 4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 3u);
  EXPECT_GE(r->metrics.at("rollout/dropped_groups"), 1);
  std::set<int64_t> ordinals;
  for (const auto& g : r->groups) {
    ordinals.insert(g.ordinal);
    for (const auto& t : g.episodes) EXPECT_NE(t.key, "train/4/1/0");
  }
  EXPECT_EQ(ordinals.count(1), 0u);
  EXPECT_EQ(rig.gen.pending(), 0);

  // Every group failing: the rollout gives up, naming the failure.
  Rig broken;
  for (int g = 0; g < 40; ++g) {
    for (int i = 0; i < 2; ++i) broken.host.fail_.insert(absl::StrCat("train/5/", g, "/", i));
  }
  auto bad = broken.Collect(Options(), 5);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("hung"));
}

TEST(AgenticRolloutTest, LockstepWaitsForEveryEpisodeWhileTheDefaultDoesNot) {
  int calls[2];
  for (bool lockstep : {false, true}) {
    Rig rig;
    AgenticRolloutOptions o = Options();
    o.groups = 4;
    o.lockstep = lockstep;
    auto r = rig.Collect(o, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    int most_turns = 0;
    for (const auto& g : r->groups) {
      for (const auto& t : g.episodes) most_turns = std::max<int>(most_turns, t.turns.size());
    }
    calls[lockstep] = rig.host.step_calls_;
    // Lock-step: one environment call per round of turns.
    if (lockstep) EXPECT_EQ(rig.host.step_calls_, most_turns);
  }
  // Independent episodes step as their responses arrive: more, smaller calls.
  EXPECT_GT(calls[0], calls[1]);
}

TEST(AgenticRolloutTest, GroupsInFlightAreBounded) {
  Rig rig;
  AgenticRolloutOptions o = Options();
  o.groups = 6;
  o.max_groups_in_flight = 2;
  auto r = rig.Collect(o, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->groups.size(), 6u);
  EXPECT_LE(rig.gen.max_pending_, 4);  // 2 groups x 2 episodes, one request each
}

TEST(TrajectoryBatchTest, MasksScoresAndLogProbsLineUp) {
  PipelineConfig cfg;
  TrajectoryGroup g;
  g.tag = "lake";
  Trajectory a;
  a.key = "a";
  a.ids = {5, 6, 7, 8, 9, 10};
  a.generated = {0, 0, 1, 1, 0, 1};
  a.logprobs = {0, 0, -0.5f, -0.25f, 0, -0.125f};
  a.turns = {Turn{2, 4, "x", 0.5, true, true}, Turn{5, 6, "y", 1.0, false, false}};
  a.episode_return = 1.5;
  a.success = true;
  Trajectory b;
  b.key = "b";
  b.ids = {5, 6, 7};
  b.generated = {0, 0, 1};
  b.logprobs = {0, 0, -1.0f};
  b.turns = {Turn{2, 3, "z", -1.0, true, true}};
  b.episode_return = -1.0;
  b.truncated = true;
  g.episodes = {a, b};
  auto tb = BuildTrajectoryBatch(cfg, {g});
  ASSERT_TRUE(tb.ok()) << tb.status();
  const Batch& batch = tb->batch;
  at::Tensor resp = *batch.Tensor("response_mask");
  at::Tensor attn = *batch.Tensor("attention_mask");
  at::Tensor lp = *batch.Tensor("infer_log_probs");
  EXPECT_TRUE(resp[0].equal(at::tensor({0, 0, 1, 1, 0, 1}, at::kLong)));
  EXPECT_TRUE(resp[1].equal(at::tensor({0, 0, 1, 0, 0, 0}, at::kLong)));
  EXPECT_TRUE(attn[1].equal(at::tensor({1, 1, 1, 0, 0, 0}, at::kLong)));
  // Column t scores token t+1.
  EXPECT_TRUE(lp[0].equal(at::tensor({0.0f, -0.5f, -0.25f, 0.0f, -0.125f})));
  EXPECT_TRUE(lp[1].equal(at::tensor({0.0f, -1.0f, 0.0f, 0.0f, 0.0f})));
  EXPECT_TRUE(batch.Tensor("scores")->equal(at::tensor({1.5f, -1.0f})));
  EXPECT_TRUE(batch.Tensor("group_index")->equal(at::tensor({0, 0}, at::kLong)));
  // prompt-mean: the group's 4 generated tokens share one weight.
  EXPECT_NEAR((*batch.Tensor("sample_weight"))[0].item<float>(), 0.25f, 1e-7);
  const Metrics& m = tb->metrics;
  EXPECT_DOUBLE_EQ(m.at("train/success_rate"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("train/lake/success_rate"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("train/valid_action_rate"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.at("train/effective_action_rate"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.at("train/steps_mean"), 1.5);
  EXPECT_DOUBLE_EQ(m.at("train/truncated_rate"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("train/response_tokens"), 4);
  EXPECT_DOUBLE_EQ(m.at("train/response_length"), 4.0 / 3.0);
}

TEST(TrajectoryBatchTest, StepLevelRewardsGiveEachTurnItsDiscountedReturn) {
  PipelineConfig cfg;
  cfg.reward_level = RewardLevel::kStep;
  cfg.step_reward_gamma = 0.5;
  TrajectoryGroup g;
  Trajectory a;
  a.key = "a";
  a.ids = {5, 6, 7, 8, 9, 10, 11};
  a.generated = {0, 0, 1, 1, 0, 1, 1};
  a.logprobs.assign(7, 0.0f);
  // Rewards 0.5, then 1 (turn 2 spans ids 5-6).
  a.turns = {Turn{2, 4, "x", 0.5, true, true}, Turn{5, 7, "y", 1.0, true, true}};
  a.episode_return = 1.5;
  Trajectory b;
  b.key = "b";
  b.ids = {5, 6, 7};
  b.generated = {0, 0, 1};
  b.logprobs.assign(3, 0.0f);
  b.turns = {Turn{2, 3, "z", -1.0, true, true}};
  b.episode_return = -1.0;
  g.episodes = {a, b};
  auto tb = BuildTrajectoryBatch(cfg, {g});
  ASSERT_TRUE(tb.ok()) << tb.status();
  const Batch& batch = tb->batch;
  // Column t covers token t+1; turn ids run on across rows.
  at::Tensor turn = *batch.Tensor("token_turn"), score = *batch.Tensor("turn_scores");
  EXPECT_TRUE(turn[0].equal(at::tensor({-1, 0, 0, -1, 1, 1}, at::kLong))) << turn;
  EXPECT_TRUE(turn[1].equal(at::tensor({-1, 2, -1, -1, -1, -1}, at::kLong))) << turn;
  // G_1 = 1, G_0 = 0.5 + 0.5 * 1 = 1.0; b's only turn -1.
  EXPECT_TRUE(score[0].equal(at::tensor({0.0f, 1.0f, 1.0f, 0.0f, 1.0f, 1.0f}))) << score;
  EXPECT_TRUE(score[1].equal(at::tensor({0.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f}))) << score;
  // The advantages then normalize {1, 1, -1} within the group (mean 1/3).
  cfg.adv_estimator = AdvEstimator::kDrGrpo;
  Batch with = batch;
  Metrics m;
  ASSERT_TRUE(ComputeAdvantagesInto(cfg, &with, &m).ok());
  at::Tensor adv = *with.Tensor("advantages");
  EXPECT_NEAR(adv[0][1].item<float>(), 2.0f / 3, 1e-6);
  EXPECT_NEAR(adv[0][5].item<float>(), 2.0f / 3, 1e-6);
  EXPECT_NEAR(adv[1][1].item<float>(), -4.0f / 3, 1e-6);
  EXPECT_EQ(adv[0][3].item<float>(), 0.0f);
  // The trajectory level keeps no turn tensors.
  cfg.reward_level = RewardLevel::kTrajectory;
  auto plain = BuildTrajectoryBatch(cfg, {g});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->batch.HasTensor("token_turn"));
}

TEST(TurnTemplateTest, ChatMlTurnsCloseAndOpenTheRightRoles) {
  const TurnTemplate chatml(ChatTemplate::kChatml);
  const TurnTemplate* t = &chatml;
  EXPECT_EQ(*t->First("rules", "map"),
            "<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nmap<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->Next("map2", true), "\n<|im_start|>user\nmap2<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->Next("map2", false), "<|im_end|>\n<|im_start|>user\nmap2<|im_end|>\n<|im_start|>assistant\n");
  const TurnTemplate plain(ChatTemplate::kNone);
  EXPECT_EQ(*plain.First("rules", "map"), "rules\n\nmap\n");
  EXPECT_EQ(plain.Next("map2", true), "\nmap2\n");
}

}  // namespace
}  // namespace roll
