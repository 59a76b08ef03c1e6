#pragma once
// Subcommands of the `roll` binary that live outside the controller library
// (they link the model code, which the controller itself never does).

#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

// Prints "roll: <message>" to stderr and returns exit code 1.
int CliFail(const absl::Status& status);

int TokenizeCommand(const std::vector<std::string>& args);
// `roll generate` and `roll bench generate` (cli_generate.cc).
int GenerateCommand(const std::vector<std::string>& args);
int BenchGenerateCommand(const std::vector<std::string>& args);
// `roll bench train` (cli_train.cc).
int BenchTrainCommand(const std::vector<std::string>& args);

}  // namespace roll
