// The demonstrations of an agentic base model (`roll sft`): episodes played
// with sft.expert_moves (the search itself: tests/envs/solver_test.cc).

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "roll/envs/environment.h"
#include "roll/envs/solver.h"
#include "roll/pipeline/agentic.h"
#include "testing/environments.h"

namespace roll {
namespace {

using testing::Env;

PipelineConfig Sokoban5(double expert_moves) {
  PipelineConfig cfg;
  cfg.pipeline = "agentic";
  cfg.seed = 7;
  cfg.data.chat_template = ChatTemplate::kNone;
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
      EXPECT_EQ(seg.text, FormatAnswer(moves[best->front()])) << "episode " << i;
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
      if (seg.answer) EXPECT_EQ(seg.text, FormatAnswer(moves[pick(rng)]));
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
