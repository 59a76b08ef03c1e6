// `roll`: the command-line entry of roll-cpp. Thin: each subcommand parses
// its flags and calls into the libraries.

#include <malloc.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "roll/controller/agent.h"
#include "cli/bench_dispatch.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/common/config.h"
#include "roll/scheduler/device_mapping.h"
#include "roll/worker/rl_workers.h"
#include "roll/worker/worker.h"

namespace roll {

int CliFail(const absl::Status& s) {
  std::cerr << "roll: " << s.message() << "\n";
  return 1;
}

}  // namespace roll

namespace {

constexpr char kUsage[] = R"(usage: roll <command> [args]

commands:
  run CONFIG [key.path=value ...] [--quiet]
                                       run the config's pipeline: rlvr, agentic, ... (docs/pipelines.md)
  eval CONFIG --model DIR [--model DIR2 ...] [--n N] [--k 1,2,4] [--format json|table] [--plot F.png]
                                       pass@k, accuracy, entropies and support change of models on the
                                       validation prompts (docs/diagnostics.md)
  fit-curve METRICS... --x KEY --y KEY [--format json|table] [--plot F.png|F.svg] [--min-x X]
            [--max-x X] [--extrapolate X] [--r0 R] [--bootstrap N]
                                       ScaleRL's sigmoid curve fitted to runs' metrics.jsonl: asymptote A
                                       (+- bootstrap), exponent B, C_mid, R0 (docs/recipes.md)
  sft CONFIG [key.path=value ...]      supervised fine-tuning of the config's sft section (docs/rlvr.md)
  config CONFIG [key.path=value ...] [--extra-roles a,b]
                                       print the resolved config, or its errors
  config --reference                   print the reference of every config key (docs/config.md)
  config --placement CONFIG [key.path=value ...]
                                       print the placement table: cluster, rank, node, devices,
                                       threads, colocated with (docs/placement.md)
  bench agentic --config CONFIG [--rounds R] [key.path=value ...]
                                       an agentic rollout with episodes advancing independently and
                                       in lock-step: env steps/s, tokens/s, engine occupancy
  bench async --config CONFIG [--seeds N] [key.path=value ...]
                                       the config trained synchronously and asynchronously on the
                                       same devices: samples/s, speedup, final validation (docs/async.md)
  bench dispatch [--workers N] [--calls K]
                                       fan-out latency and 1 MB throughput, next to plain gRPC
  bench env-step [--workers N] [--episodes E] [--rounds R]
                                       one step of E environment episodes, next to plain gRPC
  bench generate --model DIR|random[:k=v,...] [--batch B] [--prompt-len P] [--new N]
         [--threads T] [--baseline-python SCRIPT] [--libtorch-decode]
                                       decode tokens/s, GEMM fraction, optional eager-PyTorch baseline
  bench train [--model DIR | --layers L --hidden H ...] [--batch B] [--seq-len T] [--threads N]
                                       training tokens/s and GEMM fraction (docs/training.md)
  bench weight-sync [--receivers N] [--size-mb M] [--buffer-mb B] [--rounds R] [--colocated]
                                       trainer-to-generator model update vs a raw c10d broadcast
  generate --model DIR (--prompt TEXT | --prompt-ids "1 2;3" | --prompts-file F)
           [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]
           [--n N] [--stop STR] [--ignore-eos] [--format ids|text]
                                       new tokens of each prompt, one line per sample
  logits --model DIR|random[:k=v,...] --prompt-ids "1 2;3" [--save DIR] [--seed S]
                                       float32 logits of each prompt, a JSON line each
  tokenize --tokenizer FILE [--decode] [--json] [--add-special-tokens] [--skip-special-tokens]
                                       stdin lines to space-separated ids, or back
  agent --controller HOST:PORT --token-file F [--bind ADDR] [--node-rank N] [--log-dir DIR]
        [--connect-timeout-s S] [--controller-grace-s S] [--tls-cert F --tls-key F [--tls-ca F]]
                                       serve one node of a multi-node job (docs/multinode.md)
  worker --type T --cluster C ...      run as a worker process (started by the controller)
)";

int Fail(const absl::Status& s) { return roll::CliFail(s); }

int ConfigCommand(const std::vector<std::string>& args) {
  auto flags = roll::CliArgs::Parse(args, {"extra-roles"}, {"reference", "placement"});
  if (!flags.ok()) return Fail(flags.status());
  if (flags->Has("reference")) {
    std::cout << roll::ConfigReferenceMarkdown();
    return 0;
  }
  if (flags->positional().empty()) {
    std::cerr << kUsage;
    return 2;
  }
  std::vector<std::string> overrides(flags->positional().begin() + 1, flags->positional().end());
  roll::LoadOptions load;
  if (flags->Has("extra-roles")) load.extra_roles = absl::StrSplit(flags->Get("extra-roles"), ',');
  auto config = roll::LoadPipelineConfig(flags->positional()[0], overrides, load);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 1;
  }
  if (flags->Has("placement")) {
    auto mapping = roll::DeviceMapping::Build(*config, roll::HostCores());
    if (!mapping.ok()) return Fail(mapping.status());
    std::cout << mapping->Table();
    return 0;
  }
  std::cout << roll::DumpConfigYaml(*config);
  return 0;
}

int BenchEnvStepCommand(const std::vector<std::string>& args) {
  auto flags = roll::CliArgs::Parse(args, {"workers", "episodes", "rounds"}, {});
  if (!flags.ok()) return Fail(flags.status());
  roll::EnvStepBenchOptions o;
  auto workers = flags->GetInt("workers", o.workers);
  auto episodes = flags->GetInt("episodes", o.episodes);
  auto rounds = flags->GetInt("rounds", o.rounds);
  for (const absl::Status& s : {workers.status(), episodes.status(), rounds.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (*workers < 1 || *workers > 64 || *episodes < 1 || *episodes > 100000 || *rounds < 10 || *rounds > 90000) {
    return Fail(absl::InvalidArgumentError(
        "bench env-step: need --workers in [1, 64], --episodes in [1, 100000], --rounds in [10, 90000]"));
  }
  o.workers = static_cast<int>(*workers);
  o.episodes = static_cast<int>(*episodes);
  o.rounds = static_cast<int>(*rounds);
  auto json = roll::RunEnvStepBench(o);
  if (!json.ok()) return Fail(json.status());
  std::cout << *json << std::endl;
  return 0;
}

int BenchCommand(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "generate") return roll::BenchGenerateCommand({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "train") return roll::BenchTrainCommand({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "weight-sync") return roll::BenchWeightSyncCommand({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "env-step") return BenchEnvStepCommand({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "agentic") return roll::BenchAgenticCommand({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "async") return roll::BenchAsyncCommand({args.begin() + 1, args.end()});
  if (args.empty() || args[0] != "dispatch") {
    std::cerr << "roll bench: choose a benchmark: agentic, async, dispatch, env-step, generate, train, weight-sync\n";
    return 2;
  }
  auto flags = roll::CliArgs::Parse({args.begin() + 1, args.end()},
                                    {"workers", "calls", "payload-calls", "payload-mb"}, {});
  if (!flags.ok()) return Fail(flags.status());
  roll::DispatchBenchOptions o;
  auto workers = flags->GetInt("workers", o.workers);
  auto calls = flags->GetInt("calls", o.calls);
  auto payload_calls = flags->GetInt("payload-calls", o.payload_calls);
  auto payload_mb = flags->GetDouble("payload-mb", 1.0);
  for (const absl::Status& s : {workers.status(), calls.status(), payload_calls.status(), payload_mb.status()}) {
    if (!s.ok()) return Fail(s);
  }
  o.workers = static_cast<int>(*workers);
  o.calls = static_cast<int>(*calls);
  o.payload_calls = static_cast<int>(*payload_calls);
  o.payload_bytes = static_cast<int>(*payload_mb * (1 << 20)) / 4 * 4;
  auto json = roll::RunDispatchBench(o);
  if (!json.ok()) return Fail(json.status());
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Tensors of up to 32 MB (glibc's largest mmap threshold) come from the
  // heap and are reused after they are freed, instead of being mapped fresh
  // and unmapped each time: a model step allocates its activations anew, and
  // first-touch page faults on fresh mappings cost more than the arithmetic
  // on virtual machines (with the MLP blocking of prefill, 64 x 128 prompt
  // tokens went from 2.6 k to 16 k tokens/s: `roll bench generate --batch
  // 64`, prefill_tokens_per_s). Freed
  // heap memory up to 256 MB stays with the process; offload trims it
  // explicitly.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  if (roll::IsWorkerInvocation(argc, argv)) {
    roll::RegisterRlWorkers();
    return roll::RunWorkerMain(argc, argv);
  }
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "config") return ConfigCommand(args);
  if (cmd == "bench") return BenchCommand(args);
  if (cmd == "tokenize") return roll::TokenizeCommand(args);
  if (cmd == "generate") return roll::GenerateCommand(args);
  if (cmd == "logits") return roll::LogitsCommand(args);
  if (cmd == "run") return roll::RunCommand(args);
  if (cmd == "eval") return roll::EvalCommand(args);
  if (cmd == "fit-curve") return roll::FitCurveCommand(args);
  if (cmd == "sft") return roll::SftCommand(args);
  if (cmd == "agent") return roll::AgentCommand(args);
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "roll: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
