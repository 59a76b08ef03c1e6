#pragma once
// `roll eval` (docs/diagnostics.md): N sampled answers per validation prompt from
// each of several models, on the job the config places (actor_infer and
// the rewards.<domain> workers, as in training), and what they say about
// the models side by side: pass@k curves, mean accuracy, token- and
// answer-level entropy, and the support change of each model against the
// first.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "roll/algorithms/eval_metrics.h"
#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

struct EvalOptions {
  std::vector<std::string> models;  // model directories; the first is the base of the support change
  int64_t n = 8;                    // samples per prompt
  std::vector<int64_t> ks;          // pass@k reported; empty: 1, 2, 4, ... up to n
  // Progress lines ("model 1/2: 64/128 prompts"); null: silent.
  std::function<void(const std::string&)> progress;
};

struct ModelEval {
  std::string model;
  int64_t prompts = 0, samples = 0;
  double accuracy = 0;                 // mean over prompts of the correct share (= pass@1)
  std::map<int64_t, double> pass_at_k;
  double token_entropy = 0, answer_entropy = 0;
  std::vector<bool> solved;            // per prompt: at least one correct sample
};

struct EvalReport {
  int64_t n = 0;
  std::vector<int64_t> ks;
  std::vector<ModelEval> models;
  // support[i]: models[i + 1] against models[0].
  std::vector<SupportChange> support;
};

// Every model in turn: the job started with that model on actor_infer,
// val prompts (data.val_files or the generated task's) sampled n times
// each at actor_infer's generating_args (temperature, top_p, top_k,
// max_new_tokens up to response_length) and scored by the reward workers.
// Errors name the model.
absl::StatusOr<EvalReport> RunEval(const PipelineConfig& config, const EvalOptions& options);

// The report as one JSON object (stable keys: docs/diagnostics.md), or as a table.
std::string EvalJson(const EvalReport& report);
std::string EvalTable(const EvalReport& report);

// pass@k against k (log2 axis, 0..1) for every model, one colour each (the
// table's order: blue, orange, green, red, purple, ...), written atomically
// as a PNG (.png) or SVG (.svg; with the model names as a legend).
absl::Status WritePassAtKPlot(const EvalReport& report, const std::string& path);

}  // namespace roll
