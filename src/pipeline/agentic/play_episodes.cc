// PlayEpisodes: supervised data for an agentic base model, episodes played
// in the answer format the instructions ask for, each move drawn at random
// or, with probability sft.expert_moves, the first move of a shortest
// solution from the episode's state.

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
#include "roll/envs/solver.h"
#include "roll/pipeline/agentic.h"

namespace roll {

const std::vector<std::string>& DemonstrationEnvOptions(const PipelineConfig& cfg) {
  return cfg.sft.env_options.empty() ? cfg.train_env_manager.env_options : cfg.sft.env_options;
}

absl::StatusOr<std::vector<PlayedEpisode>> PlayEpisodes(const PipelineConfig& cfg, int64_t episodes, uint64_t seed,
                                                        bool validation) {
  const EnvManagerConfig& env = cfg.train_env_manager;
  const std::vector<std::string>& options = DemonstrationEnvOptions(cfg);
  const TurnTemplate tmpl(cfg.data.chat_template);
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<Environment> e, MakeEnvironment(env.env_type, options));
  const std::vector<std::string> moves = e->Actions();
  if (moves.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("train_env_manager: env_type ", env.env_type,
                                                   " names no actions to play at random"));
  }
  // The search replays on its own environment, so `e` keeps its episode.
  std::unique_ptr<Environment> search;
  if (cfg.sft.expert_moves > 0) {
    ROLL_ASSIGN_OR_RETURN(search, MakeEnvironment(env.env_type, options));
  }
  constexpr int kMaxStates = 20000;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, moves.size() - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<PlayedEpisode> out;
  for (int64_t i = 0; i < episodes; ++i) {
    // The seeds a rollout's groups use, so the model sees the rooms it will play.
    const uint64_t env_seed = EnvGroupSeed(seed, i, 0, validation);
    ROLL_ASSIGN_OR_RETURN(std::string obs, e->Reset(env_seed));
    PlayedEpisode ep;
    ep.env_seed = env_seed;
    ROLL_ASSIGN_OR_RETURN(std::string first, tmpl.First(e->Instructions(), obs));
    ep.segments.push_back({std::move(first), false});
    std::vector<std::string> played;
    // The rest of a shortest solution while the episode follows it: a
    // suffix of a shortest solution is one from the state it starts at.
    std::vector<int> plan;
    for (int64_t turn = 0; env.max_steps <= 0 || turn < env.max_steps; ++turn) {
      // Random play draws exactly as it did before expert moves existed.
      size_t move = pick(rng);
      const bool expert = search && u(rng) < cfg.sft.expert_moves;
      if (expert && plan.empty()) {
        ROLL_ASSIGN_OR_RETURN(plan, ShortestSolution(*search, env_seed, played, moves, kMaxStates));
        std::reverse(plan.begin(), plan.end());
      }
      if (expert && !plan.empty()) {
        move = static_cast<size_t>(plan.back());
        plan.pop_back();
      } else {
        plan.clear();  // off the solution: the next expert move searches again
      }
      played.push_back(FormatAnswer(moves[move]));
      ep.segments.push_back({played.back(), true});
      ROLL_ASSIGN_OR_RETURN(EnvStep s, e->Step(played.back()));
      if (s.done) break;
      ep.segments.push_back({tmpl.Next(s.observation, /*closed=*/true), false});
    }
    out.push_back(std::move(ep));
  }
  return out;
}

}  // namespace roll
