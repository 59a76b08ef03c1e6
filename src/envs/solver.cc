#include "roll/envs/solver.h"

#include <queue>
#include <set>

namespace roll {
namespace {

// Resets `env` to `seed` and plays `played` then `path`; the last step.
absl::StatusOr<EnvStep> Replay(Environment& env, uint64_t seed, const std::vector<std::string>& played,
                               const std::vector<int>& path, const std::vector<std::string>& moves,
                               std::string* observation) {
  ROLL_ASSIGN_OR_RETURN(*observation, env.Reset(seed));
  EnvStep s;
  for (const std::string& a : played) {
    ROLL_ASSIGN_OR_RETURN(s, env.Step(a));
  }
  for (int m : path) {
    ROLL_ASSIGN_OR_RETURN(s, env.Step(FormatAnswer(moves[m])));
  }
  if (!played.empty() || !path.empty()) *observation = s.observation;
  return s;
}

}  // namespace

absl::StatusOr<std::vector<int>> ShortestSolution(Environment& env, uint64_t seed,
                                                   const std::vector<std::string>& played,
                                                   const std::vector<std::string>& moves, int max_states) {
  // Breadth-first over move sequences from the episode's state; the
  // determinism contract makes each replay the same episode, and states are
  // told apart by their observation. The episode's own limits (max_steps)
  // end the branches that reach them.
  std::string start;
  ROLL_RETURN_IF_ERROR(Replay(env, seed, played, {}, moves, &start).status());
  std::set<std::string> seen{start};
  std::queue<std::vector<int>> frontier;
  frontier.push({});
  while (!frontier.empty() && static_cast<int>(seen.size()) < max_states) {
    const std::vector<int> path = std::move(frontier.front());
    frontier.pop();
    for (int m = 0; m < static_cast<int>(moves.size()); ++m) {
      std::vector<int> next = path;
      next.push_back(m);
      std::string obs;
      ROLL_ASSIGN_OR_RETURN(EnvStep s, Replay(env, seed, played, next, moves, &obs));
      if (s.success) return next;
      if (s.done || !seen.insert(obs).second) continue;
      frontier.push(std::move(next));
    }
  }
  return std::vector<int>();
}

}  // namespace roll
