// `roll eval`: sampling, metrics and the pass@k plot.

#include "roll/pipeline/eval.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plot.h"
#include "roll/pipeline/generation_client.h"
#include "roll/pipeline/job_clusters.h"
#include "roll/pipeline/rlvr.h"
#include "roll/pipeline/validation.h"

namespace roll {
namespace {

absl::StatusOr<ModelEval> EvalOne(const PipelineConfig& base, const std::string& model, const EvalOptions& o,
                                  const std::vector<int64_t>& ks, const std::string& label) {
  PipelineConfig cfg = base;
  cfg.actor_infer.model_args.model_name_or_path = model;
  ROLL_ASSIGN_OR_RETURN(PromptSets prompts, LoadPromptSets(cfg));
  if (prompts.val.empty()) return absl::InvalidArgumentError("eval: the config has no validation prompts");
  JobRoles roles;
  roles.actor_train = false;
  roles.rewards = true;
  JobClusters job(cfg, roles);
  ROLL_RETURN_IF_ERROR(job.Start());
  ClusterGenerationClient gen(&job.actor_infer());
  ClusterRewardClient rewards(job.reward_domains());
  RolloutScheduler sched(&gen, &rewards);
  GenParams params = RolloutGenParams(cfg);
  params.n = o.n;
  ValidationStats stats;
  const absl::Status sampled = SamplePrompts(
      &sched, prompts.val, cfg.val_batch_size, params, static_cast<uint64_t>(cfg.seed), &stats,
      [&](int64_t done, int64_t total) {
        if (o.progress) o.progress(absl::StrCat(label, ": ", done, "/", total, " prompts"));
      });
  job.Stop();
  ROLL_RETURN_IF_ERROR(sampled);
  std::map<std::string, double> m;
  stats.WriteTo(ks, &m, "");
  ModelEval e;
  e.model = model;
  e.prompts = stats.groups();
  e.samples = e.prompts * o.n;
  e.accuracy = m["accuracy"];
  for (int64_t k : ks) e.pass_at_k[k] = m[absl::StrCat("pass@", k)];
  e.token_entropy = m["token_entropy"];
  e.answer_entropy = m["answer_entropy"];
  e.solved = stats.solved();
  return e;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<EvalReport> RunEval(const PipelineConfig& config, const EvalOptions& o) {
  if (config.pipeline == "agentic") {
    // Its validation plays episodes, not prompts; `roll run` with
    // max_steps=0 evaluates a model on the held-out levels.
    return absl::InvalidArgumentError(
        "eval: the config's pipeline is agentic, and roll eval samples the validation prompts of an rlvr config; "
        "evaluate an agentic model with `roll run CONFIG max_steps=0` on that model (the shipped agentic configs "
        "take it from sft.output_dir=MODEL_DIR): val/success_rate on val_batch_size held-out episodes "
        "(docs/agentic.md)");
  }
  if (o.models.empty()) return absl::InvalidArgumentError("eval: give at least one --model");
  if (o.n < 1) return absl::InvalidArgumentError("eval: --n must be at least 1");
  EvalReport r;
  r.n = o.n;
  r.ks = o.ks;
  if (r.ks.empty()) {
    for (int64_t k = 1; k <= o.n; k *= 2) r.ks.push_back(k);
  }
  for (int64_t k : r.ks) {
    if (k < 1 || k > o.n) {
      return absl::InvalidArgumentError(absl::StrCat("eval: pass@", k, " needs 1 <= k <= n = ", o.n));
    }
  }
  for (size_t i = 0; i < o.models.size(); ++i) {
    const std::string label = absl::StrCat("model ", i + 1, "/", o.models.size(), " (", o.models[i], ")");
    auto e = EvalOne(config, o.models[i], o, r.ks, label);
    if (!e.ok()) return Annotate(e.status(), absl::StrCat("eval of ", o.models[i]));
    r.models.push_back(*std::move(e));
  }
  for (size_t i = 1; i < r.models.size(); ++i) {
    ROLL_ASSIGN_OR_RETURN(SupportChange s, CompareSupport(r.models[0].solved, r.models[i].solved));
    r.support.push_back(s);
  }
  return r;
}

std::string EvalJson(const EvalReport& r) {
  std::string s = absl::StrCat("{\"n\": ", r.n, ", \"models\": [");
  for (size_t i = 0; i < r.models.size(); ++i) {
    const ModelEval& m = r.models[i];
    absl::StrAppend(&s, i ? ", " : "", "{\"model\": ", Quote(m.model), ", \"prompts\": ", m.prompts,
                    ", \"samples\": ", m.samples, ", \"accuracy\": ", m.accuracy, ", \"pass_at_k\": {");
    size_t j = 0;
    for (const auto& [k, p] : m.pass_at_k) absl::StrAppend(&s, j++ ? ", " : "", "\"", k, "\": ", p);
    absl::StrAppend(&s, "}, \"token_entropy\": ", m.token_entropy, ", \"answer_entropy\": ", m.answer_entropy, "}");
  }
  absl::StrAppend(&s, "], \"support\": [");
  for (size_t i = 0; i < r.support.size(); ++i) {
    const SupportChange& c = r.support[i];
    absl::StrAppend(&s, i ? ", " : "", "{\"base\": ", Quote(r.models[0].model), ", \"model\": ",
                    Quote(r.models[i + 1].model), ", \"preserved\": ", c.preserved, ", \"shrunk\": ", c.shrunk,
                    ", \"expanded\": ", c.expanded, ", \"neither\": ", c.neither, ", \"srr\": ", c.srr,
                    ", \"ndr\": ", c.ndr, ", \"sds\": ", c.sds, ", \"nscr\": ", c.nscr, "}");
  }
  return s + "]}";
}

std::string EvalTable(const EvalReport& r) {
  std::string s = absl::StrFormat("%-8s %-7s %8s", "colour", "prompts", "accuracy");
  for (int64_t k : r.ks) absl::StrAppend(&s, absl::StrFormat(" %8s", absl::StrCat("pass@", k)));
  absl::StrAppend(&s, absl::StrFormat(" %9s %9s  %s\n", "tok_ent", "ans_ent", "model"));
  for (size_t i = 0; i < r.models.size(); ++i) {
    const ModelEval& m = r.models[i];
    absl::StrAppend(&s, absl::StrFormat("%-8s %-7d %8.4f", common_internal::PlotColorName(static_cast<int>(i)), m.prompts, m.accuracy));
    for (int64_t k : r.ks) absl::StrAppend(&s, absl::StrFormat(" %8.4f", m.pass_at_k.at(k)));
    absl::StrAppend(&s, absl::StrFormat(" %9.4f %9.4f  %s\n", m.token_entropy, m.answer_entropy, m.model));
  }
  for (size_t i = 0; i < r.support.size(); ++i) {
    const SupportChange& c = r.support[i];
    absl::StrAppend(&s, absl::StrFormat("support of %s against %s: preserved %d, shrunk %d, expanded %d, neither %d; "
                                        "SRR %.4f NDR %.4f SDS %.4f NSCR %.4f\n",
                                        r.models[i + 1].model, r.models[0].model, c.preserved, c.shrunk, c.expanded,
                                        c.neither, c.srr, c.ndr, c.sds, c.nscr));
  }
  return s;
}

absl::Status WritePassAtKPlot(const EvalReport& r, const std::string& path) {
  common_internal::PlotSpec p;
  p.x_label = "k";
  p.y_label = "pass@k";
  p.log_x = true;
  p.x_min = 1;
  p.x_max = 2;
  for (int64_t k : r.ks) {
    p.x_max = std::max(p.x_max, static_cast<double>(k));
    p.x_ticks.push_back(static_cast<double>(k));
  }
  p.y_ticks = {0, 0.25, 0.5, 0.75, 1};
  for (const ModelEval& m : r.models) {
    common_internal::PlotSeries series;
    series.name = m.model;
    for (const auto& [k, v] : m.pass_at_k) series.points.emplace_back(static_cast<double>(k), v);
    p.series.push_back(std::move(series));
  }
  return common_internal::WritePlot(p, path);
}

}  // namespace roll
