// The `roll` command as users run it: exit codes and what it prints.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <fstream>

#include "testing/processes.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

using testing::Shell;
using Result = testing::ShellResult;

const std::string kGpt2 = std::string(ROLL_SOURCE_DIR) + "/tests/models/testdata/tokenizers/gpt2.json";

TEST(CliTest, FitCurveFitsARunsMetricsAndHoldsOutTheLaterPoints) {
  const std::string dir = testing::TempDir("fit-curve");
  {
    // A run that follows R(C) = 0.1 + 0.5 / (1 + (300 / C)^1.5) exactly,
    // with lines that lack the keys in between (validation-only steps).
    std::ofstream m(dir + "/metrics.jsonl");
    m << "{\"step\": 0, \"val/accuracy\": 0.1}\n";
    for (int s = 1; s <= 120; ++s) {
      const double c = 20.0 * s;
      m << "{\"step\": " << s << ", \"compute/flops\": " << c
        << ", \"train/accuracy\": " << 0.1 + 0.5 / (1 + std::pow(300 / c, 1.5)) << "}\n";
    }
  }
  Result r = Shell(testing::RollBinary() + " fit-curve " + dir + " --x compute/flops --y train/accuracy --max-x 1200"
                   " --extrapolate 1e6 --format json --r0 0.1 --plot " + dir + "/fit.svg");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& run = j["runs"][0];
  EXPECT_EQ(run["points"], 60);
  EXPECT_NEAR(run["a"].get<double>(), 0.6, 0.01);
  EXPECT_NEAR(run["b"].get<double>(), 1.5, 0.1);
  EXPECT_NEAR(run["c_mid"].get<double>(), 300, 15);
  EXPECT_NEAR(run["predicted"]["y"].get<double>(), 0.6, 0.01);
  EXPECT_EQ(run["heldout"]["points"], 60);
  EXPECT_LT(run["heldout"]["rmse"].get<double>(), 0.005) << "an exact curve: the early fit predicts the rest";
  std::ifstream svg(dir + "/fit.svg");
  EXPECT_TRUE(svg.good());
  Result bad = Shell(testing::RollBinary() + " fit-curve " + dir + " --x compute/flops --y val/loss");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("has both 'compute/flops' and 'val/loss'"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);
}

TEST(CliTest, TokenizeEncodesAndDecodesLines) {
  Result enc = Shell("printf 'Hello, world!\\n  two spaces\\n' | " + testing::RollBinary() +
                     " tokenize --tokenizer " + kGpt2);
  ASSERT_EQ(enc.code, 0) << enc.out;
  // GPT-2 ids of "Hello, world!" are well known.
  EXPECT_EQ(enc.out.substr(0, enc.out.find('\n')), "15496 11 995 0");
  Result dec = Shell("printf '%s' '" + enc.out + "' | " + testing::RollBinary() + " tokenize --decode --tokenizer " +
                     kGpt2);
  ASSERT_EQ(dec.code, 0) << dec.out;
  EXPECT_EQ(dec.out, "Hello, world!\n  two spaces\n");
}

TEST(CliTest, TokenizeRejectsBadInputWithTheLine) {
  Result r = Shell("printf '1 2\\n3 x\\n' | " + testing::RollBinary() + " tokenize --decode --tokenizer " + kGpt2);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("stdin line 2: 'x' is not a token id"), std::string::npos) << r.out;
  Result missing = Shell(testing::RollBinary() + " tokenize --tokenizer /no/such/tokenizer.json </dev/null");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("/no/such/tokenizer.json"), std::string::npos) << missing.out;
}

TEST(CliTest, ConfigPrintsTheResolvedConfigOrEveryError) {
  const std::string dir = testing::TempDir("cli-config");
  {
    std::ofstream f(dir + "/c.yaml");
    f << "exp_name: demo\noutput_dir: /tmp/${exp_name}\nactor_train:\n  worker_cls: debug\n  world_size: 2\n";
  }
  Result ok = Shell(testing::RollBinary() + " config " + dir + "/c.yaml max_steps=7");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("max_steps: 7"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("output_dir: /tmp/demo"), std::string::npos) << ok.out;
  {
    std::ofstream f(dir + "/bad.yaml");
    f << "exp_name: demo\nmax_step: 3\nactor_train:\n  worker_cls: debug\n  world_size: two\n";
  }
  Result bad = Shell(testing::RollBinary() + " config " + dir + "/bad.yaml");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("bad.yaml:2:1: max_step: unknown key 'max_step' (did you mean 'max_steps'?)"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("bad.yaml:5:15: actor_train.world_size:"), std::string::npos) << bad.out;
}

TEST(CliTest, ConfigReferenceMatchesTheDocs) {
  Result r = Shell(testing::RollBinary() + " config --reference");
  ASSERT_EQ(r.code, 0);
  std::ifstream doc(std::string(ROLL_SOURCE_DIR) + "/docs/config.md");
  std::string content((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  EXPECT_EQ(r.out, content) << "regenerate with: build/bin/roll config --reference > docs/config.md";
}

TEST(CliTest, UnknownCommandAndFlagsAreErrors) {
  Result r = Shell(testing::RollBinary() + " frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown command 'frobnicate'"), std::string::npos);
  Result f = Shell(testing::RollBinary() + " bench dispatch --wrokers 2");
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.out.find("unknown flag --wrokers"), std::string::npos) << f.out;
}

TEST(CliTest, RunRefusesAnUnknownPipelineWithTheKnownOnes) {
  const std::string dir = testing::TempDir("cli-pipeline");
  Result r = Shell(testing::RollBinary() + " run " + ROLL_SOURCE_DIR + "/configs/quickstart_rlvr.yaml --quiet output_dir=" +
                   dir + " pipeline=agentc");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown pipeline 'agentc'; known: agentic, rlvr"), std::string::npos) << r.out;
}

TEST(CliTest, BenchEnvStepReportsTheStepNextToPlainGrpc) {
  Result r = Shell(testing::RollBinary() + " bench env-step --workers 2 --episodes 8 --rounds 20 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key : {"\"step_p50_us\"", "\"raw_grpc_p50_us\"", "\"noop_p50_us\"", "\"env_steps_per_s\"",
                          "\"episodes\":8", "\"workers\":2"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
  }
  Result bad = Shell(testing::RollBinary() + " bench env-step --rounds 5");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("--rounds in [10, 90000]"), std::string::npos) << bad.out;
}

TEST(CliTest, BenchWeightSyncDeliversTheParametersAndReportsBothRates) {
  // A 0.25 MB buffer (4 slots of 64 KB) for a 4 MB model of 128-wide
  // layers; the command fails if any receiver ends with other values than
  // the sender's.
  Result r = Shell(testing::RollBinary() +
                   " bench weight-sync --receivers 2 --size-mb 4 --buffer-mb 0.25 --rounds 2");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key : {"\"gb_per_s\"", "\"raw_broadcast_gb_per_s\"", "\"ratio\"", "\"receivers\": 2"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
  }
  // Flattened (as workers' models are), the whole model is one transfer;
  // unflattened, the matrices (64 KB and more) go in place, the norms
  // packed, many more transfers than slots.
  EXPECT_NE(r.out.find("\"flattened\": true"), std::string::npos) << r.out;
  Result parts = Shell(testing::RollBinary() +
                       " bench weight-sync --unflattened --receivers 2 --size-mb 4 --buffer-mb 0.25 --rounds 2");
  ASSERT_EQ(parts.code, 0) << parts.out;
  EXPECT_NE(parts.out.find("\"flattened\": false"), std::string::npos) << parts.out;
  // A bf16 model with fp32 norms: flattened into one buffer all the same,
  // through the broadcast and through shared memory.
  for (const std::string& path : {std::string(""), std::string(" --colocated")}) {
    Result mixed = Shell(testing::RollBinary() + " bench weight-sync --mixed" + path +
                         " --receivers 2 --size-mb 4 --buffer-mb 0.25 --rounds 2");
    ASSERT_EQ(mixed.code, 0) << mixed.out;
    EXPECT_NE(mixed.out.find("\"flattened\": true, \"mixed\": true"), std::string::npos) << mixed.out;
  }
  // The colocated path: through shared memory, checked the same way.
  Result shm = Shell(testing::RollBinary() + " bench weight-sync --colocated --receivers 2 --size-mb 4 --rounds 2");
  ASSERT_EQ(shm.code, 0) << shm.out;
  EXPECT_NE(shm.out.find("\"path\": \"shared-memory\""), std::string::npos) << shm.out;
  Result bad = Shell(testing::RollBinary() + " bench weight-sync --receivers 0");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("must be positive"), std::string::npos) << bad.out;
}

TEST(CliTest, SftTrainsOnEveryThreadOfTheNodesSlots) {
  // LibTorch starts with one intra-op thread on some hosts: roll sft, one
  // process, sets the node's CPU slots' threads itself (2 slots of 1 here)
  // unless runtime.threads_per_worker says otherwise, and never more than
  // the cores it may run on.
  const std::string out = testing::TempDir("sft-threads");
  const std::string sft = testing::RollBinary() + " sft " + ROLL_SOURCE_DIR +
                          "/configs/quickstart_rlvr.yaml sft.max_steps=1 sft.warmup_steps=0 output_dir=" + out;
  Result r = Shell(sft);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"threads\": 2,"), std::string::npos) << r.out;
  Result one = Shell(sft + " runtime.threads_per_worker=1");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("\"threads\": 1,"), std::string::npos) << one.out;
  Result pinned = Shell("taskset -c 0 " + sft);
  ASSERT_EQ(pinned.code, 0) << pinned.out;
  EXPECT_NE(pinned.out.find("\"threads\": 1,"), std::string::npos) << pinned.out;
}

TEST(CliTest, BenchWeightSyncFromAShardedTrainerIntoSplitGenerators) {
  // Each receiver checks that every slice holds its part of the sender's
  // parameters; the bench fails otherwise.
  Result r = Shell(testing::RollBinary() + " bench weight-sync --trainer-shards 2 --tensor-parallel 2 --receivers 2"
                                           " --size-mb 2 --buffer-mb 0.25 --rounds 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"path\": \"sharded\", \"trainer_shards\": 2, \"receivers\": 2, \"tensor_parallel\": 2"),
            std::string::npos)
      << r.out;
  Result both = Shell(testing::RollBinary() + " bench weight-sync --trainer-shards 2 --trainer-tensor-parallel 2");
  EXPECT_EQ(both.code, 1) << both.out;
  EXPECT_NE(both.out.find("cannot be combined"), std::string::npos) << both.out;
}

TEST(CliTest, BenchGenerateRunsBothDecodePathsAndTheLibTorchFloor) {
  const std::string base = testing::RollBinary() +
                           " bench generate --model random:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,"
                           "vocab=256 --prompt-len 8 --new 4 --repeats 1 --threads 1";
  // Batch 3: the hand-written kernel; batch 12: hand-written around
  // LibTorch's GEMM; --libtorch-decode: LibTorch ops throughout. Each run
  // checks that every sequence made its tokens.
  for (const std::string& extra : {std::string(" --batch 3"), std::string(" --batch 12"),
                                   std::string(" --batch 3 --libtorch-decode")}) {
    Result r = Shell(base + extra);
    ASSERT_EQ(r.code, 0) << extra << ": " << r.out;
    const bool fast = extra.find("libtorch") == std::string::npos;
    EXPECT_NE(r.out.find(fast ? "\"fast_decode\":true" : "\"fast_decode\":false"), std::string::npos) << r.out;
    for (const char* key : {"\"decode_tokens_per_s\"", "\"gemm_fraction\"", "\"libtorch_products_tokens_per_s\"",
                            "\"decode_vs_libtorch_products\""}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
    }
  }
}

// `roll bench train` runs its steps to the end and prints its one JSON line
// with the BLAS it ran on (it once crashed on exit after the figures were
// computed, and nothing ran it).
TEST(CliTest, BenchTrainPrintsItsFigures) {
  Result r = Shell(testing::RollBinary() +
                   " bench train --layers 1 --hidden 32 --heads 2 --kv-heads 1 --intermediate 64 --vocab 64"
                   " --batch 2 --seq-len 16 --steps 2 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key : {"\"bench\": \"train\"", "\"tokens_per_s\": ", "\"loss_last\": ", "\"blas\": \"",
                          "\"threads\": 1,"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
  }
}

// The BLAS runs on LibTorch's intra-op threads (PyPI's LibTorch carries MKL
// on its OpenMP pool; with a system LibTorch, cmake/RollBlas.cmake loads the
// OpenMP OpenBLAS), so --threads (and a worker's cpu_threads_per_slot) sets
// the products' threads too: the bench reports an OpenMP BLAS with that many
// threads, after products large enough to use them (batch 12 takes the GEMM
// path).
TEST(CliTest, TheBlasRunsOnTheThreadsTheFlagGives) {
#ifndef ROLL_BLAS_ON_TORCH_POOL
  GTEST_SKIP() << "built with a BLAS that keeps threads of its own (not LibTorch's, not the OpenMP OpenBLAS)";
#endif
  for (int threads : {1, 2}) {
    Result r = Shell(testing::RollBinary() +
                     " bench generate --model random:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,"
                     "vocab=256 --prompt-len 8 --new 4 --repeats 1 --batch 12 --threads " +
                     std::to_string(threads));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("\"blas_threading\":\"openmp\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"blas_threads\":" + std::to_string(threads) + ","), std::string::npos)
        << threads << " threads: " << r.out;
  }
}

}  // namespace
}  // namespace roll
