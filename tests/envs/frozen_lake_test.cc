#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <queue>
#include <set>
#include <string>
#include <vector>

#include "roll/envs/environment.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Environment> Lake(const std::vector<std::string>& options = {}) {
  auto env = MakeEnvironment("frozen_lake", options);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? std::move(*env) : nullptr;
}

std::vector<std::string> Rows(const std::string& obs) {
  std::vector<std::string> rows;
  size_t start = 0;
  while (true) {
    const size_t nl = obs.find('\n', start);
    rows.push_back(obs.substr(start, nl - start));
    if (nl == std::string::npos) return rows;
    start = nl + 1;
  }
}

// The moves of a shortest safe path from P to G on a rendered map; empty
// when there is none.
std::vector<std::string> ShortestPath(const std::string& obs) {
  const std::vector<std::string> g = Rows(obs);
  const int n = static_cast<int>(g.size());
  const char* names[] = {"Left", "Down", "Right", "Up"};
  const int dr[] = {0, 1, 0, -1}, dc[] = {-1, 0, 1, 0};
  std::vector<int> from(n * n, -2), move(n * n, -1);
  std::queue<int> q;
  for (int p = 0; p < n * n; ++p) {
    if (g[p / n][p % n] == 'P') {
      q.push(p);
      from[p] = -1;
    }
  }
  while (!q.empty()) {
    const int p = q.front();
    q.pop();
    if (g[p / n][p % n] == 'G') {
      std::vector<std::string> path;
      for (int c = p; from[c] >= 0; c = from[c]) path.insert(path.begin(), names[move[c]]);
      return path;
    }
    for (int d = 0; d < 4; ++d) {
      const int r = p / n + dr[d], c = p % n + dc[d];
      if (r < 0 || c < 0 || r >= n || c >= n || g[r][c] == 'O' || from[r * n + c] != -2) continue;
      from[r * n + c] = p;
      move[r * n + c] = d;
      q.push(r * n + c);
    }
  }
  return {};
}

TEST(FrozenLakeTest, TheSeedDecidesTheMapAndEveryMapCanBeSolved) {
  auto a = Lake(), b = Lake();
  std::set<std::string> maps;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto oa = a->Reset(seed), ob = b->Reset(seed);
    ASSERT_TRUE(oa.ok() && ob.ok());
    EXPECT_EQ(*oa, *ob) << "seed " << seed;
    EXPECT_EQ(Rows(*oa).size(), 4u);
    EXPECT_EQ((*oa)[0], 'P');
    EXPECT_EQ(oa->back(), 'G');
    EXPECT_FALSE(ShortestPath(*oa).empty()) << *oa;
    maps.insert(*oa);
  }
  EXPECT_GT(maps.size(), 10u) << "seeds should give different maps";
}

TEST(FrozenLakeTest, FollowingASafePathReachesTheGoal) {
  auto env = Lake({"size=6"});
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto obs = env->Reset(seed);
    ASSERT_TRUE(obs.ok());
    const std::vector<std::string> path = ShortestPath(*obs);
    ASSERT_FALSE(path.empty());
    for (size_t i = 0; i < path.size(); ++i) {
      auto s = env->Step("<think>go</think><answer>" + path[i] + "</answer>");
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_TRUE(s->action_valid);
      EXPECT_EQ(s->done, i + 1 == path.size());
      if (s->done) {
        EXPECT_TRUE(s->success);
        EXPECT_EQ(s->reward, 1.0);
        EXPECT_EQ(s->observation.back(), '*') << s->observation;
      } else {
        EXPECT_EQ(s->reward, 0.0);
      }
    }
    auto after = env->Step("Left");
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(FrozenLakeTest, AHoleEndsTheEpisodeWithoutReward) {
  auto env = Lake({"p=0.5"});
  // Find a seed whose map has a hole right of or below the start.
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::string obs = *env->Reset(seed);
    const std::vector<std::string> g = Rows(obs);
    std::string move = g[0][1] == 'O' ? "Right" : g[1][0] == 'O' ? "Down" : "";
    if (move.empty()) continue;
    auto s = env->Step(move);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(s->done);
    EXPECT_FALSE(s->success);
    EXPECT_FALSE(s->truncated);
    EXPECT_EQ(s->reward, 0.0);
    EXPECT_NE(s->observation.find('X'), std::string::npos) << s->observation;
    return;
  }
  FAIL() << "no map with a hole beside the start";
}

TEST(FrozenLakeTest, AnActionItCannotReadCostsThePenaltyAndChangesNothing) {
  auto env = Lake({"format_penalty=-0.25"});
  const std::string start = *env->Reset(3);
  for (const char* bad : {"jump", "<answer>north</answer>", "", "Left Right"}) {
    auto s = env->Step(bad);
    ASSERT_TRUE(s.ok());
    EXPECT_FALSE(s->action_valid) << bad;
    EXPECT_EQ(s->reward, -0.25);
    EXPECT_EQ(s->observation, start);
  }
  auto s = env->Step("  <answer> uP </answer>");  // case and spaces do not matter; Up at the top stays
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->action_valid);
  EXPECT_EQ(s->observation, start);
}

TEST(FrozenLakeTest, AnEpisodeIsTruncatedAtMaxSteps) {
  auto env = Lake({"max_steps=3"});
  ASSERT_TRUE(env->Reset(1).ok());
  for (int i = 1; i <= 3; ++i) {
    auto s = env->Step("Left");  // against the wall
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->done, i == 3);
    EXPECT_EQ(s->truncated, i == 3);
    EXPECT_FALSE(s->success);
  }
}

TEST(FrozenLakeTest, SlipperyIceSlipsButReplaysExactlyFromTheSeed) {
  auto play = [](uint64_t seed) {
    auto env = Lake({"is_slippery=true", "p=1", "size=8", "max_steps=1000"});
    std::vector<std::string> trace = {*env->Reset(seed)};
    for (int i = 0; i < 40; ++i) {
      auto s = env->Step(i % 2 ? "Right" : "Down");
      EXPECT_TRUE(s.ok());
      trace.push_back(s->observation);
      if (s->done) break;
    }
    return trace;
  };
  EXPECT_EQ(play(5), play(5));
  // Without slipping, alternating Down and Right walks the diagonal.
  const std::vector<std::string> t = play(5);
  int off_diagonal = 0;
  for (const std::string& obs : t) {
    const std::vector<std::string> g = Rows(obs);
    for (size_t r = 0; r < g.size(); ++r) {
      const size_t c = g[r].find('P');
      if (c != std::string::npos && (c < r ? r - c : c - r) > 1) ++off_diagonal;
    }
  }
  EXPECT_GT(off_diagonal, 0) << "slippery ice never slipped";
  EXPECT_THAT(Lake({"is_slippery=true"})->Instructions(), HasSubstr("slippery"));
}

TEST(FrozenLakeTest, BadOptionsAreNamed) {
  EXPECT_THAT(MakeEnvironment("frozen_lake", {"siez=4"}).status().message(),
              HasSubstr("unknown option 'siez' for env_type frozen_lake (known: format_penalty, is_slippery"));
  EXPECT_THAT(MakeEnvironment("frozen_lake", {"size=1"}).status().message(), HasSubstr("size=1: must lie in [2, 32]"));
  EXPECT_THAT(MakeEnvironment("frozen_lake", {"is_slippery=maybe"}).status().message(),
              HasSubstr("is_slippery=maybe: not true or false"));
  EXPECT_THAT(MakeEnvironment("frozen_lake", {"size"}).status().message(), HasSubstr("'size' is not key=value"));
  EXPECT_THAT(MakeEnvironment("frozen_lake", {"size=4", "size=5"}).status().message(), HasSubstr("given twice"));
  EXPECT_THAT(MakeEnvironment("sokobn", {}).status().message(), HasSubstr("unknown env_type 'sokobn' (known: frozen_lake, sokoban, external)"));
  auto env = Lake();
  EXPECT_EQ(env->Step("Left").status().code(), absl::StatusCode::kFailedPrecondition);
  // Too many holes for a path on so large a lake: an error, not an endless search.
  auto holey = Lake({"size=32", "p=0.5"});
  auto r = holey->Reset(1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("raise p or lower size"));
  EXPECT_EQ(holey->Step("Left").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExtractAnswerTest, TakesTheLastAnswerTagOrTheWholeText) {
  EXPECT_EQ(ExtractAnswer(" Left \n"), "Left");
  EXPECT_EQ(ExtractAnswer("<answer>Up</answer> then <answer> Down </answer>"), "Down");
  EXPECT_EQ(ExtractAnswer("<answer>Right"), "Right");
}

}  // namespace
}  // namespace roll
