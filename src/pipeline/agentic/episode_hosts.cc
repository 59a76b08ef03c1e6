// TurnTemplate, LocalEpisodeHost, the agentic limits and the environment
// seeds of env groups.

#include <utility>

#include "absl/strings/str_cat.h"
#include "roll/models/chat_template.h"
#include "roll/pipeline/agentic.h"

namespace roll {

absl::StatusOr<std::string> TurnTemplate::First(const std::string& instructions,
                                                 const std::string& observation) const {
  if (!chatml_) return absl::StrCat(instructions, "\n\n", observation, "\n");
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  return ApplyChatMlTemplate({{"system", instructions}, {"user", observation}}, o);
}

std::string TurnTemplate::Next(const std::string& observation, bool closed) const {
  if (!chatml_) return absl::StrCat("\n", observation, "\n");
  return absl::StrCat(closed ? "" : "<|im_end|>", "\n<|im_start|>user\n", observation,
                      "<|im_end|>\n<|im_start|>assistant\n");
}

int64_t SequenceLength(const PipelineConfig& c) {
  return c.sequence_length > 0 ? c.sequence_length : c.prompt_length + c.response_length;
}

int64_t MaxTokensPerStep(const PipelineConfig& c) {
  return c.max_tokens_per_step > 0 ? c.max_tokens_per_step : c.actor_infer.generating_args.max_new_tokens;
}

uint64_t EnvGroupSeed(uint64_t seed, int64_t step, int64_t ordinal, bool validation) {
  // Validation groups share one fixed set whatever the step.
  const uint64_t s = RequestSeed(seed ^ 0x6a09e667f3bcc908ull, validation ? -1 : step, ordinal);
  return (s & ~1ull) | (validation ? 1ull : 0ull);
}

absl::StatusOr<std::vector<EnvObservation>> LocalEpisodeHost::Reset(const std::vector<EpisodeStart>& episodes) {
  std::vector<EnvObservation> out;
  for (const EpisodeStart& e : episodes) {
    Open& open = open_[e.key];
    if (!open.env) {
      ROLL_ASSIGN_OR_RETURN(open.env, MakeEnvironment(env_type_, env_options_));
    }
    ROLL_ASSIGN_OR_RETURN(std::string obs, open.env->Reset(e.seed));
    open.steps = 0;
    open.done = false;
    out.push_back({e.key, std::move(obs), open.env->Instructions()});
  }
  return out;
}

absl::StatusOr<std::vector<EnvTransition>> LocalEpisodeHost::Step(const std::vector<EnvAction>& actions) {
  for (const EnvAction& a : actions) {
    auto it = open_.find(a.key);
    if (it == open_.end()) return absl::NotFoundError(absl::StrCat("episode '", a.key, "' is not open"));
    if (it->second.done) return absl::FailedPreconditionError(absl::StrCat("episode '", a.key, "' is done"));
  }
  std::vector<EnvTransition> out;
  for (const EnvAction& a : actions) {
    Open& open = open_.at(a.key);
    ROLL_ASSIGN_OR_RETURN(EnvStep s, open.env->Step(a.action));
    EnvTransition t;
    static_cast<EnvStep&>(t) = std::move(s);
    t.key = a.key;
    t.step = ++open.steps;
    open.done = t.done;
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status LocalEpisodeHost::Close(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) open_.erase(k);
  return absl::OkStatus();
}

}  // namespace roll
