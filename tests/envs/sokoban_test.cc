// Sokoban: levels from reverse play are solvable within their depth, and
// the rules (moves, walls, pushes, boxes on and off targets, solved,
// truncation, the format penalty) hold on them.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <queue>
#include <string>
#include <vector>

#include "roll/envs/environment.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kMoves = {"Up", "Down", "Left", "Right"};
constexpr int kDr[] = {-1, 1, 0, 0};
constexpr int kDc[] = {0, 0, -1, 1};

std::unique_ptr<Environment> Room(const std::vector<std::string>& options = {}) {
  auto env = MakeEnvironment("sokoban", options);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? std::move(*env) : nullptr;
}

std::string Answer(const std::string& move) { return "<answer>" + move + "</answer>"; }

int Count(const std::string& obs, char c) { return static_cast<int>(std::count(obs.begin(), obs.end(), c)); }

// The observation after playing `moves` from the reset of `seed`.
std::string Replay(Environment* env, uint64_t seed, const std::vector<int>& moves, EnvStep* last = nullptr) {
  std::string obs = *env->Reset(seed);
  for (int m : moves) {
    auto s = env->Step(Answer(kMoves[m]));
    EXPECT_TRUE(s.ok()) << s.status();
    obs = s->observation;
    if (last) *last = *s;
  }
  return obs;
}

// Breadth-first search over the states reachable in at most `depth` moves
// (a state is its observation): every reachable state the episode goes on
// from, with the moves that reach it, and the shortest solution (empty
// when none).
struct Search {
  std::map<std::string, std::vector<int>> states;
  std::vector<int> solution;
  bool solved = false;
};
Search Explore(Environment* env, uint64_t seed, int depth) {
  Search out;
  const std::string start = *env->Reset(seed);
  out.states[start] = {};
  std::queue<std::string> frontier;
  frontier.push(start);
  while (!frontier.empty() && !out.solved) {
    const std::vector<int> path = out.states[frontier.front()];
    frontier.pop();
    if (static_cast<int>(path.size()) >= depth) continue;
    for (int m = 0; m < 4; ++m) {
      std::vector<int> next = path;
      next.push_back(m);
      EnvStep last;
      const std::string obs = Replay(env, seed, next, &last);
      if (out.states.count(obs)) continue;
      if (last.success) {
        out.solution = next;
        out.solved = true;
        break;
      }
      if (last.done) continue;
      out.states[obs] = next;
      frontier.push(obs);
    }
  }
  return out;
}

TEST(SokobanTest, EveryLevelIsUnsolvedAtFirstAndSolvedWithinItsSearchDepth) {
  auto env = Room({"dim_room=6", "num_boxes=1", "search_depth=12", "max_steps=100"});
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::string obs = *env->Reset(seed);
    EXPECT_GE(Count(obs, 'X'), 1) << "seed " << seed << "\n" << obs;
    Search s = Explore(env.get(), seed, 12);
    EXPECT_TRUE(s.solved) << "seed " << seed << "\n" << obs;
  }
}

TEST(SokobanTest, TwoBoxLevelsAreSolvableToo) {
  auto env = Room({"dim_room=6", "num_boxes=2", "search_depth=8"});
  for (uint64_t seed = 100; seed < 110; ++seed) {
    Search s = Explore(env.get(), seed, 8);
    EXPECT_TRUE(s.solved) << "seed " << seed << "\n" << *env->Reset(seed);
  }
}

TEST(SokobanTest, MostFiveByFiveLevelsAreOnePushFromSolved) {
  // The distribution docs/environments.md quotes (seeds 0-511): why a run
  // that should measure finding a solution sets min_moves.
  auto env = Room({"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=20"});
  std::map<size_t, int> by_length;
  for (uint64_t seed = 0; seed < 512; ++seed) {
    Search s = Explore(env.get(), seed, 10);
    ASSERT_TRUE(s.solved) << "seed " << seed;
    ++by_length[s.solution.size()];
  }
  std::string shown;
  for (const auto& [len, n] : by_length) shown += std::to_string(len) + ":" + std::to_string(n) + " ";
  std::printf("solution lengths of 512 levels: %s\n", shown.c_str());
  EXPECT_GT(by_length[1], 512 / 2) << shown;
  EXPECT_LE(by_length.rbegin()->first, 10u) << shown;
}

TEST(SokobanTest, MinMovesKeepsOnlyLevelsThatFewerMovesDoNotSolve) {
  // Most 5x5 levels are one push from solved; min_moves redraws those. The
  // test's own search (over replays) checks each level's shortest solution.
  auto any = Room({"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=20"});
  auto hard = Room({"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=20", "min_moves=3"});
  auto same = Room({"dim_room=5", "num_boxes=1", "search_depth=10", "max_steps=20", "min_moves=1"});
  int one_move = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    // min_moves=1 (the default) is every level, drawn as before.
    EXPECT_EQ(*same->Reset(seed), *any->Reset(seed)) << "seed " << seed;
    one_move += Explore(any.get(), seed, 10).solution.size() == 1;
    Search s = Explore(hard.get(), seed, 10);
    ASSERT_TRUE(s.solved) << "seed " << seed << "\n" << *hard->Reset(seed);
    EXPECT_GE(s.solution.size(), 3u) << "seed " << seed << "\n" << *hard->Reset(seed);
  }
  EXPECT_GE(one_move, 10);  // without the option, short levels do occur
  EXPECT_EQ(*hard->Reset(5), *hard->Reset(5));  // still decided by the seed
  EXPECT_THAT(std::string(MakeEnvironment("sokoban", {"search_depth=4", "min_moves=5"}).status().message()),
              HasSubstr("min_moves=5 exceeds search_depth=4"));
  EXPECT_THAT(std::string(MakeEnvironment("sokoban", {"min_moves=11"}).status().message()), HasSubstr("min_moves"));
}

TEST(SokobanTest, TheSeedDecidesTheLevel) {
  auto a = Room(), b = Room();
  EXPECT_EQ(*a->Reset(7), *b->Reset(7));
  int differ = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) differ += *a->Reset(seed) != *a->Reset(seed + 10);
  EXPECT_GE(differ, 8);
  // A border of walls around every room.
  const std::string obs = *a->Reset(3);
  EXPECT_EQ(obs.substr(0, 6), "######");
  EXPECT_EQ(obs.substr(obs.size() - 6), "######");
}

TEST(SokobanTest, SolvingPaysTheStepsThePushesAndTheBonus) {
  auto env = Room({"search_depth=12"});
  const uint64_t seed = 5;
  Search s = Explore(env.get(), seed, 12);
  ASSERT_TRUE(s.solved);
  env->Reset(seed).IgnoreError();
  double total = 0;
  EnvStep last;
  for (int m : s.solution) {
    last = *env->Step(Answer(kMoves[m]));
    total += last.reward;
  }
  EXPECT_TRUE(last.done);
  EXPECT_TRUE(last.success);
  EXPECT_FALSE(last.truncated);
  // The last move pushes the box onto its target: step cost, +1, +10.
  EXPECT_NEAR(last.reward, -0.1 + 1.0 + 10.0, 1e-9);
  EXPECT_EQ(Count(last.observation, 'X'), 0);
  EXPECT_EQ(Count(last.observation, '*'), 1);
  // A shortest solution never takes a box off a target: each move costs 0.1,
  // the box goes on once, the room is solved once.
  EXPECT_NEAR(total, -0.1 * s.solution.size() + 1.0 + 10.0, 1e-9);
  EXPECT_FALSE(env->Step(Answer("Up")).ok());  // the episode is over
}

// Finds, over seeds and the states reachable from them, one where `want`
// holds for the player's cell, the next cell and the one after in some
// direction; returns the seed, the moves to it and the direction.
struct Spot {
  uint64_t seed = 0;
  std::vector<int> moves;
  int dir = -1;
};
template <class Pred>
Spot FindSpot(Environment* env, Pred want) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Search s = Explore(env, seed, 10);
    for (const auto& [obs, moves] : s.states) {
      std::vector<std::string> rows;
      for (size_t b = 0, e; b <= obs.size(); b = e + 1) {
        e = obs.find('\n', b);
        if (e == std::string::npos) e = obs.size();
        rows.push_back(obs.substr(b, e - b));
      }
      const int n = static_cast<int>(rows.size());
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) {
          if (rows[r][c] != 'P' && rows[r][c] != 'S') continue;
          for (int d = 0; d < 4; ++d) {
            auto at = [&](int k) {
              const int rr = r + k * kDr[d], cc = c + k * kDc[d];
              return rr < 0 || cc < 0 || rr >= n || cc >= n ? '#' : rows[rr][cc];
            };
            if (want(at(1), at(2))) return {seed, moves, d};
          }
        }
      }
    }
  }
  return {};
}

TEST(SokobanTest, WallsStopThePlayerAndTheStepStillCosts) {
  auto env = Room();
  Spot spot = FindSpot(env.get(), [](char next, char) { return next == '#'; });
  ASSERT_GE(spot.dir, 0);
  const std::string before = Replay(env.get(), spot.seed, spot.moves);
  EnvStep s = *env->Step(Answer(kMoves[spot.dir]));
  EXPECT_EQ(s.observation, before);
  EXPECT_TRUE(s.action_valid);
  EXPECT_NEAR(s.reward, -0.1, 1e-9);
}

TEST(SokobanTest, ABoxMovesIntoAFreeCellButNotIntoAWallOrAnotherBox) {
  auto env = Room();
  Spot push = FindSpot(env.get(), [](char next, char beyond) {
    return next == 'X' && (beyond == '_' || beyond == 'O');
  });
  ASSERT_GE(push.dir, 0);
  const std::string before = Replay(env.get(), push.seed, push.moves);
  EnvStep s = *env->Step(Answer(kMoves[push.dir]));
  EXPECT_NE(s.observation, before);
  EXPECT_EQ(Count(s.observation, 'X') + Count(s.observation, '*'), 1);
  // Onto a target: +1 on top of the step cost.
  const bool onto_target = Count(s.observation, '*') == 1;
  EXPECT_NEAR(s.reward, onto_target ? 0.9 + (s.success ? 10.0 : 0.0) : -0.1, 1e-9);

  Spot blocked = FindSpot(env.get(), [](char next, char beyond) { return next == 'X' && beyond == '#'; });
  ASSERT_GE(blocked.dir, 0);
  const std::string stuck = Replay(env.get(), blocked.seed, blocked.moves);
  EXPECT_EQ(env->Step(Answer(kMoves[blocked.dir]))->observation, stuck);

  auto two = Room({"num_boxes=2", "search_depth=20"});
  Spot pair = FindSpot(two.get(), [](char next, char beyond) {
    return (next == 'X' || next == '*') && (beyond == 'X' || beyond == '*');
  });
  ASSERT_GE(pair.dir, 0);
  const std::string jammed = Replay(two.get(), pair.seed, pair.moves);
  EXPECT_EQ(two->Step(Answer(kMoves[pair.dir]))->observation, jammed);
}

TEST(SokobanTest, PushingABoxOffItsTargetCostsOne) {
  auto env = Room({"num_boxes=2", "search_depth=20"});
  Spot off = FindSpot(env.get(), [](char next, char beyond) { return next == '*' && (beyond == '_'); });
  ASSERT_GE(off.dir, 0);
  Replay(env.get(), off.seed, off.moves);
  EnvStep s = *env->Step(Answer(kMoves[off.dir]));
  EXPECT_NEAR(s.reward, -0.1 - 1.0, 1e-9);
}

TEST(SokobanTest, AnActionItCannotReadCostsThePenaltyAndChangesNothing) {
  auto env = Room({"format_penalty=-0.5"});
  const std::string obs = *env->Reset(1);
  EnvStep s = *env->Step("I would go north");
  EXPECT_FALSE(s.action_valid);
  EXPECT_NEAR(s.reward, -0.5, 1e-9);
  EXPECT_EQ(s.observation, obs);
  EXPECT_FALSE(s.done);
}

TEST(SokobanTest, AnEpisodeIsTruncatedAtMaxSteps) {
  auto env = Room({"max_steps=3"});
  env->Reset(2).IgnoreError();
  EnvStep s;
  for (int i = 0; i < 3; ++i) s = *env->Step("nonsense");
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.truncated);
  EXPECT_FALSE(s.success);
}

// With describe=true each observation is the grid followed by one line per
// box off its target and per free target: its offset from the player.
std::vector<std::string> Lines(const std::string& obs) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = obs.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(obs.substr(start, nl - start));
  }
  out.push_back(obs.substr(start));
  return out;
}
std::string Offset(const char* what, int dr, int dc) {
  return std::string(what) + (dr >= 0 ? " +" : " ") + std::to_string(dr) + (dc >= 0 ? " +" : " ") + std::to_string(dc);
}
// The description lines a grid (rows of `dim` characters) calls for.
std::vector<std::string> Described(const std::vector<std::string>& rows) {
  int pr = -1, pc = -1;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    for (int c = 0; c < static_cast<int>(rows[r].size()); ++c) {
      if (rows[r][c] == 'P' || rows[r][c] == 'S') pr = r, pc = c;
    }
  }
  std::vector<std::string> boxes, targets;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    for (int c = 0; c < static_cast<int>(rows[r].size()); ++c) {
      if (rows[r][c] == 'X') boxes.push_back(Offset("box", r - pr, c - pc));
      if (rows[r][c] == 'O' || rows[r][c] == 'S') targets.push_back(Offset("target", r - pr, c - pc));
    }
  }
  boxes.insert(boxes.end(), targets.begin(), targets.end());
  return boxes;
}

TEST(SokobanTest, DescribeListsEachBoxAndFreeTargetByItsOffsetFromThePlayer) {
  auto plain = Room({"dim_room=6", "num_boxes=2", "search_depth=20"});
  auto described = Room({"dim_room=6", "num_boxes=2", "search_depth=20", "describe=true"});
  EXPECT_THAT(described->Instructions(), HasSubstr("offset from you"));
  EXPECT_THAT(plain->Instructions(), ::testing::Not(HasSubstr("offset")));
  int lines_seen = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::string a = *plain->Reset(seed), b = *described->Reset(seed);
    for (int turn = 0; turn < 8; ++turn) {
      // The same level and the same play: the grid first, then the lines.
      const std::vector<std::string> grid = Lines(a), all = Lines(b);
      ASSERT_EQ(grid.size(), 6u);
      ASSERT_GE(all.size(), grid.size());
      EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + 6), grid);
      EXPECT_EQ(std::vector<std::string>(all.begin() + 6, all.end()), Described(grid)) << b;
      lines_seen += static_cast<int>(all.size()) - 6;
      const std::string move = Answer(kMoves[(seed + turn) % 4]);
      auto sa = plain->Step(move);
      auto sb = described->Step(move);
      ASSERT_TRUE(sa.ok() && sb.ok());
      EXPECT_EQ(sa->reward, sb->reward);
      if (sa->done) break;
      a = sa->observation;
      b = sb->observation;
    }
  }
  EXPECT_GT(lines_seen, 40);
}

TEST(SokobanTest, StepBeforeResetAndBadOptionsAreNamed) {
  auto env = Room();
  EXPECT_EQ(env->Step(Answer("Up")).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(MakeEnvironment("sokoban", {"dim_room=3"}).status().message()), HasSubstr("dim_room"));
  EXPECT_THAT(std::string(MakeEnvironment("sokoban", {"num_box=2"}).status().message()), HasSubstr("num_box"));
  EXPECT_THAT(std::string(MakeEnvironment("sokobn", {}).status().message()), HasSubstr("sokoban"));
  EXPECT_THAT(env->Instructions(), HasSubstr("<answer>Up</answer>"));
}

}  // namespace
}  // namespace roll
