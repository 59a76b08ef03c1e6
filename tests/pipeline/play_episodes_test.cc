// The demonstrations of an agentic base model (`roll sft`): the shortest-
// solution search over replays, and episodes played with sft.expert_moves.

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
#include "roll/pipeline/agentic.h"

namespace roll {
namespace {

std::unique_ptr<Environment> Env(const std::string& type, const std::vector<std::string>& options) {
  auto env = MakeEnvironment(type, options);
  EXPECT_TRUE(env.ok()) << env.status();
  return *std::move(env);
}

std::string Answer(const std::string& move) { return absl::StrCat("<answer>", move, "</answer>"); }

// Follows the first move of ShortestSolution from `played` on, searching
// again after each; the moves it took (fewer than needed when the episode
// ended without success).
struct Followed {
  std::vector<int> path;
  int moves = 0;
  bool success = false;
};
Followed Follow(Environment& search, Environment& env, uint64_t seed, std::vector<std::string> played) {
  const std::vector<std::string> moves = env.Actions();
  Followed out;
  EXPECT_TRUE(env.Reset(seed).ok());
  for (const std::string& a : played) {
    auto s = env.Step(a);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s->done) return out;
  }
  for (;;) {
    auto best = ShortestSolution(search, seed, played, moves, 20000);
    EXPECT_TRUE(best.ok()) << best.status();
    if (!best.ok() || best->empty()) return out;
    out.path.push_back(best->front());
    played.push_back(Answer(moves[best->front()]));
    auto s = env.Step(played.back());
    EXPECT_TRUE(s.ok()) << s.status();
    ++out.moves;
    if (s->success) {
      out.success = true;
      return out;
    }
    if (s->done) return out;
  }
}

TEST(ShortestSolutionTest, FollowingItSolvesEverySokobanLevelWithinItsDepthAndOnlyGetsShorter) {
  const std::vector<std::string> options = {"dim_room=6", "num_boxes=1", "search_depth=12", "max_steps=100"};
  auto env = Env("sokoban", options), search = Env("sokoban", options);
  int longer = 0;  // levels of two moves or more
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const Followed f = Follow(*search, *env, seed, {});
    EXPECT_TRUE(f.success) << "seed " << seed;
    EXPECT_LE(f.moves, 12) << "seed " << seed;
    if (f.moves < 2) continue;
    ++longer;
    // The whole solution from the start is the one followed move by move:
    // each suffix is what the search returns from where it starts (what
    // PlayEpisodes relies on to follow a plan without searching again).
    auto whole = ShortestSolution(*search, seed, {}, env->Actions(), 20000);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(*whole, f.path) << "seed " << seed;
    // After its first move, the rest is one move shorter: the move lies on
    // a shortest solution.
    const Followed rest = Follow(*search, *env, seed, {Answer(env->Actions()[whole->front()])});
    EXPECT_TRUE(rest.success) << "seed " << seed;
    EXPECT_EQ(rest.moves, f.moves - 1) << "seed " << seed;
  }
  EXPECT_GE(longer, 10);
}

TEST(ShortestSolutionTest, PicksUpAfterWrongMovesAndRespectsTheEpisodesLimit) {
  auto env = Env("sokoban", {"dim_room=6", "num_boxes=2", "search_depth=12", "max_steps=100"});
  auto search = Env("sokoban", {"dim_room=6", "num_boxes=2", "search_depth=12", "max_steps=100"});
  int solved = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    // Two moves that may push a box somewhere worse; the search starts from there.
    const Followed f = Follow(*search, *env, seed, {Answer("Left"), Answer("Up")});
    solved += f.success;
  }
  EXPECT_GE(solved, 8);  // a push into a corner can leave a level unsolvable
  // Three moves allowed: a solution exists exactly when the unlimited
  // search's is at most three moves long.
  const std::vector<std::string> loose = {"dim_room=6", "search_depth=12", "max_steps=100"};
  auto big = Env("sokoban", loose), big_search = Env("sokoban", loose);
  auto three = Env("sokoban", {"dim_room=6", "search_depth=12", "max_steps=3"});
  int found = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Followed unlimited = Follow(*big_search, *big, seed, {});
    ASSERT_TRUE(unlimited.success);
    auto best = ShortestSolution(*three, seed, {}, three->Actions(), 20000);
    ASSERT_TRUE(best.ok());
    EXPECT_EQ(!best->empty(), unlimited.moves <= 3) << "seed " << seed << ": " << unlimited.moves << " moves";
    if (!best->empty()) EXPECT_EQ(static_cast<int>(best->size()), unlimited.moves) << "seed " << seed;
    found += !best->empty();
  }
  EXPECT_GT(found, 0);
  EXPECT_LT(found, 40);
}

TEST(ShortestSolutionTest, ReachesTheGoalOfEveryLakeAndGivesUpAtTheStateBudget) {
  auto env = Env("frozen_lake", {"size=4", "p=0.8", "is_slippery=false"});
  auto search = Env("frozen_lake", {"size=4", "p=0.8", "is_slippery=false"});
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Followed f = Follow(*search, *env, seed, {});
    EXPECT_TRUE(f.success) << "seed " << seed;
    EXPECT_LE(f.moves, 15) << "seed " << seed;
    auto tight = ShortestSolution(*search, seed, {}, env->Actions(), 1);
    ASSERT_TRUE(tight.ok());
    EXPECT_TRUE(tight->empty());
  }
}

PipelineConfig Sokoban5(double expert_moves) {
  PipelineConfig cfg;
  cfg.pipeline = "agentic";
  cfg.seed = 7;
  cfg.data.chat_template = "none";
  cfg.train_env_manager.env_type = "sokoban";
  cfg.train_env_manager.env_options = {"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=8"};
  cfg.sft.expert_moves = expert_moves;
  return cfg;
}

// Success rate and mean answers of the played episodes.
std::pair<double, double> Outcome(const PipelineConfig& cfg, const std::vector<PlayedEpisode>& eps) {
  auto env = Env(cfg.train_env_manager.env_type, cfg.train_env_manager.env_options);
  int solved = 0, answers = 0;
  for (const PlayedEpisode& ep : eps) {
    EXPECT_TRUE(env->Reset(ep.env_seed).ok());
    bool success = false;
    for (const PlayedEpisode::Segment& seg : ep.segments) {
      if (!seg.answer) continue;
      ++answers;
      auto s = env->Step(seg.text);
      EXPECT_TRUE(s.ok()) << s.status();
      EXPECT_TRUE(s->action_valid) << seg.text;
      success = s->success;
    }
    solved += success;
  }
  return {static_cast<double>(solved) / eps.size(), static_cast<double>(answers) / eps.size()};
}

TEST(PlayEpisodesTest, ExpertMovesSolveTheRoomsAndMixWithRandomPlay) {
  auto random = PlayEpisodes(Sokoban5(0.0), 200, 7, false);
  auto half = PlayEpisodes(Sokoban5(0.5), 200, 7, false);
  auto expert = PlayEpisodes(Sokoban5(1.0), 200, 7, false);
  ASSERT_TRUE(random.ok() && half.ok() && expert.ok()) << expert.status();
  const auto [r, r_len] = Outcome(Sokoban5(0.0), *random);
  const auto [h, h_len] = Outcome(Sokoban5(0.5), *half);
  const auto [e, e_len] = Outcome(Sokoban5(1.0), *expert);
  // Every 5x5 level is solvable in its 10 moves; 8 allowed solve most.
  EXPECT_GE(e, 0.9);
  EXPECT_LT(r, h);
  EXPECT_LT(h, e);
  EXPECT_LT(e_len, r_len);
  // The same rooms in the same order, whatever the moves.
  for (size_t i = 0; i < random->size(); ++i) EXPECT_EQ((*random)[i].env_seed, (*expert)[i].env_seed);
  // All expert: every move is the search's first from the state before it
  // (the episode follows one plan instead of searching at every turn).
  const PipelineConfig cfg = Sokoban5(1.0);
  auto search = Env("sokoban", cfg.train_env_manager.env_options);
  const std::vector<std::string> moves = search->Actions();
  for (size_t i = 0; i < 40; ++i) {
    std::vector<std::string> played;
    for (const PlayedEpisode::Segment& seg : (*expert)[i].segments) {
      if (!seg.answer) continue;
      auto best = ShortestSolution(*search, (*expert)[i].env_seed, played, moves, 20000);
      ASSERT_TRUE(best.ok() && !best->empty());
      EXPECT_EQ(seg.text, Answer(moves[best->front()])) << "episode " << i;
      played.push_back(seg.text);
    }
  }
}

TEST(PlayEpisodesTest, RandomPlayIsUnchangedByTheOption) {
  // expert_moves 0 draws nothing extra: the episodes are what they were
  // before the option existed (a base model made then is made again).
  auto a = PlayEpisodes(Sokoban5(0.0), 50, 11, true);
  ASSERT_TRUE(a.ok());
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<size_t> pick(0, 3);
  const std::vector<std::string> moves = {"Up", "Down", "Left", "Right"};
  for (const PlayedEpisode& ep : *a) {
    for (const PlayedEpisode::Segment& seg : ep.segments) {
      if (seg.answer) EXPECT_EQ(seg.text, Answer(moves[pick(rng)]));
    }
  }
}


TEST(PlayEpisodesTest, SftEnvOptionsPlayTheDemonstrationsOnOtherLevels) {
  // RL trains on levels of three moves or more; the demonstrations may
  // cover every level (sft.env_options), or default to the training ones.
  PipelineConfig hard = Sokoban5(1.0);
  hard.train_env_manager.env_options.push_back("min_moves=3");
  PipelineConfig every = hard;
  every.sft.env_options = {"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=8"};
  auto on_hard = PlayEpisodes(hard, 60, 7, false);
  auto on_every = PlayEpisodes(every, 60, 7, false);
  ASSERT_TRUE(on_hard.ok() && on_every.ok()) << on_hard.status() << on_every.status();
  auto answers = [](const PlayedEpisode& ep) {
    int n = 0;
    for (const PlayedEpisode::Segment& seg : ep.segments) n += seg.answer;
    return n;
  };
  int short_every = 0;
  for (size_t i = 0; i < on_hard->size(); ++i) {
    // All expert: an episode's answers are its level's shortest solution.
    EXPECT_GE(answers((*on_hard)[i]), 3) << "episode " << i;
    short_every += answers((*on_every)[i]) < 3;
  }
  EXPECT_GE(short_every, 20);  // most levels are shorter
  // Each demonstration starts from the level its options make.
  auto plain = Env("sokoban", every.sft.env_options);
  EXPECT_NE((*on_every)[0].segments[0].text.find(*plain->Reset((*on_every)[0].env_seed)), std::string::npos);
}

}  // namespace
}  // namespace roll
