#pragma once
// Process-wide logging set-up. Every line carries `tag` (e.g. "controller"
// or "actor_train/1") so interleaved worker logs stay readable. The library
// logs through spdlog internally; public headers stay free of it.

#include <string>
#include <string_view>

#include "roll/common/status.h"

namespace roll {

// level: trace|debug|info|warn|error. Logs to stderr, and to `file` when given.
absl::Status InitLogging(std::string_view tag, std::string_view level, const std::string& file = "");

// One line at that level through the process's logger (the controller's,
// a worker's or a tool's, whichever InitLogging set up; before any, spdlog's
// default). Every layer logs through these, never to std::cerr itself;
// what a command prints as its result (JSON, tables) goes to stdout.
void LogInfo(std::string_view message);
void LogWarning(std::string_view message);
void LogError(std::string_view message);

}  // namespace roll
