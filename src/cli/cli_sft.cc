// `roll sft CONFIG [key.path=value ...]`: supervised fine-tuning (RunSft,
// roll/pipeline/sft.h). Prints a progress line every 50 steps on stderr
// and the result as one JSON line on stdout.

#include <iostream>

#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/common/config.h"
#include "roll/pipeline/sft.h"

namespace roll {

int SftCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {}, {});
  if (!flags.ok()) return CliFail(flags.status());
  if (flags->positional().empty()) {
    std::cerr << "usage: roll sft CONFIG [key.path=value ...]\n";
    return 2;
  }
  std::vector<std::string> overrides(flags->positional().begin() + 1, flags->positional().end());
  auto config = LoadPipelineConfig(flags->positional()[0], overrides);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 1;
  }
  const int steps = config->sft.max_steps;
  auto out = RunSft(*config, [steps](int step, double loss, double lr) {
    std::cerr << absl::StrFormat("sft step %d/%d loss %.4f lr %.2e\n", step, steps, loss, lr);
  });
  if (!out.ok()) return CliFail(out.status());
  std::cout << out->ToJson() << std::endl;
  return 0;
}

}  // namespace roll
