// `roll run CONFIG [key.path=value ...]`: loads the config and runs the
// pipeline it names (`pipeline:`, default rlvr; docs/pipelines.md).

#include <iostream>

#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/common/config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "roll/pipeline/agentic.h"
#include "roll/pipeline/async_rollout.h"
#include "roll/common/logging.h"
#include "roll/controller/slurm.h"
#include "roll/pipeline/eval.h"
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
  // In a Slurm allocation: num_nodes and the controller's address from it (docs/multinode.md).
  if (auto slurm = FitConfigToSlurm(&*config); !slurm.ok()) return CliFail(slurm.status());
  RegisterBuiltinPipelines();
  if (absl::Status s = InitLogging("controller", ToString(config->runtime.log_level)); !s.ok()) return CliFail(s);
  RunOptions o;
  o.progress = !flags->Has("quiet");
  absl::Status s = RunPipeline(*config, o);
  if (!s.ok()) return CliFail(s);
  return 0;
}

int EvalCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"model", "n", "k", "format", "plot"}, {});
  if (!flags.ok()) return CliFail(flags.status());
  if (flags->positional().empty() || !flags->Has("model")) {
    std::cerr << "usage: roll eval CONFIG --model DIR [--model DIR2 ...] [--n N] [--k 1,2,4,...] "
                 "[--format json|table] [--plot FILE.png|.svg] [key.path=value ...]\n";
    return 2;
  }
  EvalOptions o;
  o.models = flags->GetAll("model");
  auto n = flags->GetInt("n", 8);
  if (!n.ok()) return CliFail(n.status());
  o.n = *n;
  for (absl::string_view k : absl::StrSplit(flags->Get("k"), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(k, &v)) return CliFail(absl::InvalidArgumentError(absl::StrCat("--k: '", k, "' is not an integer")));
    o.ks.push_back(v);
  }
  const std::string format = flags->Get("format", "table");
  if (format != "json" && format != "table") {
    return CliFail(absl::InvalidArgumentError(absl::StrCat("--format: '", format, "' is neither json nor table")));
  }
  o.progress = [](const std::string& line) { std::cerr << "eval: " << line << std::endl; };
  // The report alone goes to stdout: logs go to stderr.
  if (absl::Status s = InitLogging("eval", "info"); !s.ok()) return CliFail(s);
  std::vector<std::string> overrides(flags->positional().begin() + 1, flags->positional().end());
  auto config = LoadPipelineConfig(flags->positional()[0], overrides);
  if (!config.ok()) return CliFail(config.status());
  auto report = RunEval(*config, o);
  if (!report.ok()) return CliFail(report.status());
  std::cout << (format == "json" ? EvalJson(*report) + "\n" : EvalTable(*report)) << std::flush;
  if (flags->Has("plot")) {
    if (absl::Status s = WritePassAtKPlot(*report, flags->Get("plot")); !s.ok()) return CliFail(s);
  }
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
  // The JSON line alone goes to stdout: logs go to stderr.
  if (absl::Status s = InitLogging("bench", "info"); !s.ok()) return CliFail(s);
  RunOptions o;
  o.progress = false;
  auto json = RunAgenticRolloutBench(*config, static_cast<int>(*rounds), o);
  if (!json.ok()) return CliFail(json.status());
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace roll

namespace roll {

int BenchAsyncCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"config", "seeds"}, {});
  if (!flags.ok()) return CliFail(flags.status());
  if (!flags->Has("config")) {
    std::cerr << "usage: roll bench async --config CONFIG [--seeds N] [key.path=value ...]\n";
    return 2;
  }
  auto seeds = flags->GetInt("seeds", 1);
  if (!seeds.ok()) return CliFail(seeds.status());
  auto config = LoadPipelineConfig(flags->Get("config"), flags->positional());
  if (!config.ok()) return CliFail(config.status());
  // The JSON line alone goes to stdout: logs go to stderr.
  if (absl::Status s = InitLogging("bench", "info"); !s.ok()) return CliFail(s);
  auto json = RunAsyncBench(*config, static_cast<int>(*seeds));
  if (!json.ok()) return CliFail(json.status());
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace roll
