#pragma once
// Environments of agentic (multi-turn) rollouts: the agent reads a text
// observation, answers with a text action, and the environment returns the
// next observation and a reward. Chosen by an env manager section's
// `env_type` with its `env_options`; docs/environments.md describes each.
//
//   frozen_lake  reach the goal on a grid of frozen cells without falling
//                into a hole (optionally slippery)
//   sokoban      push every box onto a target; levels made by reverse play,
//                solvable by construction
//   external     any environment that serves the external-environment
//                protocol (src/rpc/environment.proto) over gRPC, in any
//                language; the framework can start and stop its server
//
// Contract every environment keeps: an episode is a pure function of its
// reset seed and the actions given since. The controller relies on it to
// rebuild the episodes of an environment worker that died, by replaying
// them on the worker that replaces it (docs/environments.md).
//
// An Environment holds one episode at a time and is not thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct EnvStep {
  std::string observation;
  double reward = 0.0;
  // The episode is over: terminated (success or failure) or truncated.
  bool done = false;
  bool success = false;
  // The episode hit the environment's max_steps.
  bool truncated = false;
  // The action named a move the environment understands; an action that
  // does not changes nothing and costs the format penalty.
  bool action_valid = true;
};

class Environment {
 public:
  virtual ~Environment() = default;
  // Starts a new episode (dropping the current one); returns the first
  // observation. The same seed gives the same episode.
  virtual absl::StatusOr<std::string> Reset(uint64_t seed) = 0;
  // Applies one action, the agent's text. FailedPrecondition before Reset
  // or once the episode is done.
  virtual absl::StatusOr<EnvStep> Step(std::string_view action) = 0;
  // What the agent is told once per episode: the rules, how the observation
  // reads, the actions and the answer format.
  virtual std::string Instructions() const = 0;
  // The actions the environment understands, as the agent writes them
  // (e.g. "Left"): what random play draws from (`roll sft` for agentic
  // configs). Empty when actions are free text.
  virtual std::vector<std::string> Actions() const { return {}; }
};

// `options`: "key=value" strings (an env manager's env_options).
// InvalidArgument names an unknown type (listing the known ones), an unknown
// option (listing the type's options) or a value out of range.
absl::StatusOr<std::unique_ptr<Environment>> MakeEnvironment(std::string_view env_type,
                                                             const std::vector<std::string>& options);

// The registered env_type names.
std::vector<std::string> EnvironmentTypes();

// The action inside the last <answer>...</answer> of `text` when there is
// one, else the whole text; trimmed.
std::string_view ExtractAnswer(std::string_view text);
// `move` in the answer format the environments ask for and ExtractAnswer
// reads: "<answer>move</answer>".
std::string FormatAnswer(std::string_view move);

}  // namespace roll
