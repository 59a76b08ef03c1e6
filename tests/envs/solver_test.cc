// ShortestSolution, the expert of the agentic base model's demonstrations:
// a breadth-first search over replays of an environment's episode.

#include "roll/envs/solver.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing/environments.h"

namespace roll {
namespace {

using testing::Env;

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
    played.push_back(FormatAnswer(moves[best->front()]));
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
    const Followed rest = Follow(*search, *env, seed, {FormatAnswer(env->Actions()[whole->front()])});
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
    const Followed f = Follow(*search, *env, seed, {FormatAnswer("Left"), FormatAnswer("Up")});
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

}  // namespace
}  // namespace roll
