// `roll run CONFIG [key.path=value ...]`: loads the config and runs the
// pipeline it names (`pipeline:`, default rlvr; docs/pipelines.md).

#include <iostream>

#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/common/config.h"
#include "roll/pipeline/agentic.h"
#include "roll/pipeline/pipeline.h"

namespace roll {

int RunCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {}, {"quiet"});
  if (!flags.ok()) return CliFail(flags.status());
  if (flags->positional().empty()) {
    std::cerr << "usage: roll run CONFIG [key.path=value ...] [--quiet]\n";
    return 2;
  }
  std::vector<std::string> overrides(flags->positional().begin() + 1, flags->positional().end());
  auto config = LoadPipelineConfig(flags->positional()[0], overrides);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 1;
  }
  RegisterBuiltinPipelines();
  RunOptions o;
  o.progress = !flags->Has("quiet");
  absl::Status s = RunPipeline(*config, o);
  if (!s.ok()) return CliFail(s);
  return 0;
}

int BenchAgenticCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"config", "rounds"}, {});
  if (!flags.ok()) return CliFail(flags.status());
  if (!flags->Has("config")) {
    std::cerr << "usage: roll bench agentic --config CONFIG [--rounds R] [key.path=value ...]\n";
    return 2;
  }
  auto rounds = flags->GetInt("rounds", 3);
  if (!rounds.ok()) return CliFail(rounds.status());
  auto config = LoadPipelineConfig(flags->Get("config"), flags->positional());
  if (!config.ok()) return CliFail(config.status());
  RunOptions o;
  o.progress = false;
  auto json = RunAgenticRolloutBench(*config, static_cast<int>(*rounds), o);
  if (!json.ok()) return CliFail(json.status());
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace roll
