#pragma once
// The subcommands of the `roll` binary, one file each (cli_<name>.cc), and
// what the benchmarks among them share.

#include <functional>
#include <string>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

// Prints "roll: <message>" to stderr and returns exit code 1.
int CliFail(const absl::Status& status);

// GFLOP/s of a float32 1024 x 1024 matrix product on this process's
// intra-op threads, best of several timed rounds: the reference rate the
// model benchmarks report their fraction of.
double MeasureGemmGflops();
// Seconds per call of `fn`: the best of `rounds` rounds, each calling it
// until `round_s` seconds have passed (after three warm-up calls).
double BestSecondsPerCall(const std::function<void()>& fn, int rounds = 5, double round_s = 0.1);

// The BLAS this process loaded (`library`: "openblas", or "mkl" inside
// LibTorch, as PyPI's wheel carries it), as it reports itself: its threading
// ("openmp": LibTorch's intra-op pool, so --threads governs the products
// too; "pthreads": a pool of its own beside LibTorch's; "sequential"), or
// "unknown" for another BLAS; and the threads a product runs on, as the
// BLAS counts them after the last product (-1 when unknown). The
// benchmarks print it beside their figures, after their products ran.
struct BlasInfo {
  std::string library = "unknown";
  std::string threading = "unknown";
  int threads = -1;
  std::string directory;  // of the BLAS library loaded ("" if unknown)
};
BlasInfo LoadedBlas();

int TokenizeCommand(const std::vector<std::string>& args);
// `roll generate` and `roll bench generate` (cli_generate.cc).
int GenerateCommand(const std::vector<std::string>& args);
int LogitsCommand(const std::vector<std::string>& args);
int BenchGenerateCommand(const std::vector<std::string>& args);
// `roll bench train` (cli_train.cc).
int BenchTrainCommand(const std::vector<std::string>& args);
// `roll run` (cli_run.cc) and `roll sft` (cli_sft.cc).
int RunCommand(const std::vector<std::string>& args);
// `roll eval` (cli_run.cc).
int EvalCommand(const std::vector<std::string>& args);
// `roll fit-curve` (cli_fit_curve.cc).
int FitCurveCommand(const std::vector<std::string>& args);
// `roll bench agentic` (cli_run.cc).
int BenchAgenticCommand(const std::vector<std::string>& args);
// `roll bench async --config CONFIG [--seeds N] [key.path=value ...]`
// (cli_run.cc), on RunAsyncBench (bench_async.cc).
int BenchAsyncCommand(const std::vector<std::string>& args);
// `roll bench async`: trains `config` synchronously (async_generation_ratio
// 0) and then as it is (k > 0) on the same placement, `seeds` times (seed,
// seed + 1, ...), into output_dir/bench_{sync,async}_seed<seed>; one JSON
// line: sync_samples_per_s and async_samples_per_s (trained samples over
// the time from step 0's log to the last step's), speedup,
// sync_rollout_fraction (mean share of a synchronous step, validation left
// out, spent generating), sync_final_val and async_final_val (the last
// val/accuracy), means over the seeds and each run under "runs".
absl::StatusOr<std::string> RunAsyncBench(const PipelineConfig& config, int seeds);
int SftCommand(const std::vector<std::string>& args);
// `roll bench weight-sync` (cli_weight_sync.cc).
int BenchWeightSyncCommand(const std::vector<std::string>& args);
// `roll agent` (cli_agent.cc).
int AgentCommand(const std::vector<std::string>& args);

}  // namespace roll
