#pragma once
// Helpers for the RLVR pipeline tests: run `roll` as users do, read
// metrics.jsonl, and make one small SFT base model per test binary.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "controller/test_util.h"
#include "nlohmann/json.hpp"

namespace roll::testing {

struct ShellResult {
  int code = -1;
  std::string out;
};

inline ShellResult Shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string QuickstartConfig() {
  return std::string(ROLL_SOURCE_DIR) + "/configs/quickstart_rlvr.yaml";
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
// returns the model directory.
inline std::string MakeSftBase(const std::string& dir, const std::string& extra = "") {
  const std::string model = dir + "/base";
  ShellResult r = Shell(RollBinary() + " sft " + QuickstartConfig() + " output_dir=" + dir +
                        " sft.output_dir=" + model + " " + extra);
  if (r.code != 0) return "ERROR: " + r.out;
  return model;
}

}  // namespace roll::testing
