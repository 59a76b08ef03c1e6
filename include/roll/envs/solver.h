#pragma once
// ShortestSolution: the expert of the agentic base model's demonstrations
// (`roll sft` with sft.expert_moves), a search over any environment that
// keeps the determinism contract (environment.h), by replays from the seed.

#include <cstdint>
#include <string>
#include <vector>

#include "roll/common/status.h"
#include "roll/envs/environment.h"

namespace roll {

// A shortest sequence of moves (indices into `moves`) that solves the
// episode of `seed` after the answers `played`: breadth-first over replays
// from the seed (the determinism contract), states told apart by their
// observation, branches ending where the episode ends; of the shortest
// ones the first in move order, so its suffix after a move is what the
// search returns from there. Empty when no solution turns up before
// `max_states` states are seen.
absl::StatusOr<std::vector<int>> ShortestSolution(Environment& env, uint64_t seed,
                                                   const std::vector<std::string>& played,
                                                   const std::vector<std::string>& moves, int max_states);

}  // namespace roll
