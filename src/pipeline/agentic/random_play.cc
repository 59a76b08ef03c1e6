// PlayRandomEpisodes: supervised data for an agentic base model, episodes
// of uniformly random moves in the answer format the instructions ask for.

#include <random>

#include "absl/strings/str_cat.h"
#include "roll/envs/environment.h"
#include "roll/pipeline/agentic.h"

namespace roll {

absl::StatusOr<std::vector<PlayedEpisode>> PlayRandomEpisodes(const PipelineConfig& cfg, int64_t episodes,
                                                              uint64_t seed, bool validation) {
  const EnvManagerConfig& env = cfg.train_env_manager;
  ROLL_ASSIGN_OR_RETURN(TurnTemplate tmpl, TurnTemplate::Create(cfg.data.chat_template));
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<Environment> e, MakeEnvironment(env.env_type, env.env_options));
  const std::vector<std::string> moves = e->Actions();
  if (moves.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("train_env_manager: env_type ", env.env_type,
                                                   " names no actions to play at random"));
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, moves.size() - 1);
  std::vector<PlayedEpisode> out;
  for (int64_t i = 0; i < episodes; ++i) {
    // The seeds a rollout's groups use, so the model sees the lakes it will play.
    const uint64_t env_seed = EnvGroupSeed(seed, i, 0, validation);
    ROLL_ASSIGN_OR_RETURN(std::string obs, e->Reset(env_seed));
    PlayedEpisode ep;
    ep.env_seed = env_seed;
    ROLL_ASSIGN_OR_RETURN(std::string first, tmpl.First(e->Instructions(), obs));
    ep.segments.push_back({std::move(first), false});
    for (int64_t turn = 0; env.max_steps <= 0 || turn < env.max_steps; ++turn) {
      const std::string answer = absl::StrCat("<answer>", moves[pick(rng)], "</answer>");
      ep.segments.push_back({answer, true});
      ROLL_ASSIGN_OR_RETURN(EnvStep s, e->Step(answer));
      if (s.done) break;
      ep.segments.push_back({tmpl.Next(s.observation, /*closed=*/true), false});
    }
    out.push_back(std::move(ep));
  }
  return out;
}

}  // namespace roll
