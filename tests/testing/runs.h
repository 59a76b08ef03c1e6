#pragma once
// Helpers for the pipeline tests: run `roll` as users do, read
// metrics.jsonl, make one small SFT base model per test binary, kill a
// worker of a running job.

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "testing/processes.h"
#include "nlohmann/json.hpp"

namespace roll::testing {

// The quickstart's task, model and placement with plain GRPO (the presets'
// base; configs/quickstart_rlvr.yaml adds its recipe on top).
inline std::string RlvrBaseConfig() {
  return std::string(ROLL_SOURCE_DIR) + "/configs/rlvr_base.yaml";
}

// The agentic quickstart (FrozenLake 3x3).
inline std::string AgenticConfig() {
  return std::string(ROLL_SOURCE_DIR) + "/configs/quickstart_agentic.yaml";
}

// step -> metrics of <dir>/metrics.jsonl.
inline std::map<int64_t, nlohmann::json> ReadMetrics(const std::string& dir) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j;
  }
  return out;
}

// step -> how many lines of <dir>/metrics.jsonl carry it (a restarted run
// must log each step once).
inline std::map<int64_t, int> LinesPerStep(const std::string& dir) {
  std::map<int64_t, int> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) ++out[nlohmann::json::parse(line).at("step").get<int64_t>()];
  }
  return out;
}

// `roll sft` on the quickstart task with `extra` overrides into `dir`;
// returns the model directory. One thread: ctest runs two tests at a time,
// and two processes of two OpenMP threads on two cores run 3-5x slower.
inline std::string MakeSftBase(const std::string& dir, const std::string& extra = "") {
  const std::string model = dir + "/base";
  ShellResult r = Shell(RollBinary() + " sft " + RlvrBaseConfig() + " output_dir=" + dir +
                        " sft.output_dir=" + model + " runtime.threads_per_worker=1 " + extra);
  if (r.code != 0) return "ERROR: " + r.out;
  return model;
}

// `roll run CONFIG --quiet output_dir=OUT` with actor_train and actor_infer
// on `model` and `overrides` after.
inline ShellResult RunOnModel(const std::string& config, const std::string& out, const std::string& model,
                              const std::string& overrides) {
  return Shell(RollBinary() + " run " + config + " --quiet output_dir=" + out +
               " actor_train.model_args.model_name_or_path=" + model +
               " actor_infer.model_args.model_name_or_path=" + model + " " + overrides);
}

// While `roll run ... output_dir=<out>` runs, SIGKILLs rank 0 of its
// cluster `cluster` once metrics.jsonl has `after_lines` lines (polling for
// up to a minute); returns whether a kill happened.
inline bool KillRankWhenMetricsReach(const std::string& out, const std::string& cluster, size_t after_lines) {
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ReadMetrics(out).size() < after_lines) continue;
    auto pid = Shell("pgrep -P \"$(pgrep -f '^" + RollBinary() + " run .*output_dir=" + out + " ')\" -f 'cluster " +
                     cluster + " --rank 0 '");
    if (pid.code == 0 && !pid.out.empty() && Shell("kill -9 " + pid.out).code == 0) return true;
  }
  return false;
}

}  // namespace roll::testing
