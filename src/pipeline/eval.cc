// `roll eval`: sampling, metrics and the pass@k plot.

#include "roll/pipeline/eval.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"
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
  std::vector<ClusterRewardClient::Domain> domains;
  for (const JobClusters::RewardDomain& d : job.reward_domains()) domains.push_back({d.name, d.tags, d.cluster});
  ClusterGenerationClient gen(&job.actor_infer());
  ClusterRewardClient rewards(std::move(domains));
  RolloutScheduler sched(&gen, &rewards);
  const GeneratingArgs& g = cfg.actor_infer.generating_args;
  RolloutOptions ro;
  ro.params.n = o.n;
  ro.params.temperature = g.do_sample ? g.temperature : 0.0;
  ro.params.top_p = g.top_p;
  ro.params.top_k = g.top_k;
  ro.params.max_new_tokens = std::min(g.max_new_tokens, cfg.response_length);
  ro.seed = static_cast<uint64_t>(cfg.seed);
  ValidationStats stats;
  const int64_t total = static_cast<int64_t>(prompts.val.size());
  for (int64_t begin = 0; begin < total; begin += cfg.val_batch_size) {
    ro.groups = std::min<int64_t>(cfg.val_batch_size, total - begin);
    int64_t next = begin;
    auto batch = sched.Collect(
        ro, [&]() -> absl::StatusOr<PromptItem> { return prompts.val[next++]; }, begin);
    if (!batch.ok()) {
      job.Stop();
      return batch.status();
    }
    for (const RolloutGroup& group : batch->groups) stats.AddGroup(group.samples);
    if (o.progress) o.progress(absl::StrCat(label, ": ", begin + ro.groups, "/", total, " prompts"));
  }
  job.Stop();
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

constexpr std::array<std::array<uint8_t, 3>, 6> kColors = {{{31, 119, 180},
                                                            {255, 127, 14},
                                                            {44, 160, 44},
                                                            {214, 39, 40},
                                                            {148, 103, 189},
                                                            {140, 86, 75}}};
const char* const kColorNames[] = {"blue", "orange", "green", "red", "purple", "brown"};

// The plot's geometry: pixels of (log2 k, pass@k).
struct Frame {
  int width = 640, height = 400, left = 60, right = 20, top = 20, bottom = 50;
  double kmax = 1;
  double X(double k) const {
    const double span = std::max(1.0, std::log2(kmax));
    return left + (width - left - right) * std::log2(k) / span;
  }
  double Y(double p) const { return top + (height - top - bottom) * (1.0 - p); }
};

// 3x5 digits (and '.') for the axis labels of the PNG.
const char* Glyph(char c) {
  switch (c) {
    case '0': return "111101101101111";
    case '1': return "010110010010111";
    case '2': return "111001111100111";
    case '3': return "111001111001111";
    case '4': return "101101111001001";
    case '5': return "111100111001111";
    case '6': return "111100111101111";
    case '7': return "111001001001001";
    case '8': return "111101111101111";
    case '9': return "111101111001111";
    case '.': return "000000000000010";
    default: return "000000000000000";
  }
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h * 3, 255) {}
  void Set(int x, int y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    std::copy(c.begin(), c.end(), px_.begin() + (static_cast<size_t>(y) * w_ + x) * 3);
  }
  void Line(double x0, double y0, double x1, double y1, std::array<uint8_t, 3> c, int thick = 1) {
    const int steps = static_cast<int>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t));
      const int y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      for (int dx = -(thick / 2); dx <= thick / 2; ++dx)
        for (int dy = -(thick / 2); dy <= thick / 2; ++dy) Set(x + dx, y + dy, c);
    }
  }
  void Text(int x, int y, const std::string& s, int scale = 2) {
    for (char ch : s) {
      const char* g = Glyph(ch);
      for (int r = 0; r < 5; ++r)
        for (int col = 0; col < 3; ++col)
          if (g[r * 3 + col] == '1')
            for (int a = 0; a < scale; ++a)
              for (int b = 0; b < scale; ++b) Set(x + col * scale + a, y + r * scale + b, {0, 0, 0});
      x += 4 * scale;
    }
  }
  // PNG: 8-bit RGB, no interlace, one zlib stream.
  std::string Png() const {
    std::string raw;
    for (int y = 0; y < h_; ++y) {
      raw += '\0';  // filter: none
      raw.append(reinterpret_cast<const char*>(px_.data()) + static_cast<size_t>(y) * w_ * 3, w_ * 3);
    }
    uLongf size = compressBound(raw.size());
    std::string z(size, '\0');
    compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
    z.resize(size);
    std::string out("\x89PNG\r\n\x1a\n", 8);
    auto be32 = [](uint32_t v) {
      return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                         static_cast<char>(v)};
    };
    auto chunk = [&](const char* type, const std::string& data) {
      const std::string body = std::string(type, 4) + data;
      out += be32(static_cast<uint32_t>(data.size())) + body +
             be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
    };
    chunk("IHDR", be32(w_) + be32(h_) + std::string("\x08\x02\x00\x00\x00", 5));
    chunk("IDAT", z);
    chunk("IEND", "");
    return out;
  }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

std::string Svg(const EvalReport& r, const Frame& f) {
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      f.width, f.height);
  const double x0 = f.left, x1 = f.width - f.right, y0 = f.Y(0), y1 = f.Y(1);
  absl::StrAppendFormat(&s, "<path d=\"M%g %g V%g H%g\" stroke=\"black\" fill=\"none\"/>\n", x0, y1, y0, x1);
  for (double p : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%g</text>\n", x0 - 6, f.Y(p) + 4, p);
  }
  for (int64_t k : r.ks) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%d</text>\n", f.X(k), y0 + 16, k);
  }
  absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">k</text>\n", (x0 + x1) / 2,
                        f.height - 8);
  absl::StrAppendFormat(&s, "<text x=\"14\" y=\"%g\" transform=\"rotate(-90 14 %g)\" text-anchor=\"middle\">"
                        "pass@k</text>\n", (y0 + y1) / 2, (y0 + y1) / 2);
  for (size_t i = 0; i < r.models.size(); ++i) {
    const auto& c = kColors[i % kColors.size()];
    const std::string rgb = absl::StrFormat("rgb(%d,%d,%d)", c[0], c[1], c[2]);
    std::string d;
    for (const auto& [k, p] : r.models[i].pass_at_k) absl::StrAppendFormat(&d, "%s%g %g", d.empty() ? "M" : " L", f.X(k), f.Y(p));
    absl::StrAppendFormat(&s, "<path d=\"%s\" stroke=\"%s\" stroke-width=\"2\" fill=\"none\"/>\n", d, rgb);
    for (const auto& [k, p] : r.models[i].pass_at_k) {
      absl::StrAppendFormat(&s, "<circle cx=\"%g\" cy=\"%g\" r=\"3\" fill=\"%s\"/>\n", f.X(k), f.Y(p), rgb);
    }
    std::string name;
    for (char ch : r.models[i].model) name += ch == '<' ? std::string("&lt;") : ch == '&' ? std::string("&amp;") : std::string(1, ch);
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", x0 + 10, y1 + 14 + 16.0 * i, rgb,
                          name);
  }
  return s + "</svg>\n";
}

}  // namespace

absl::StatusOr<EvalReport> RunEval(const PipelineConfig& config, const EvalOptions& o) {
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
    absl::StrAppend(&s, absl::StrFormat("%-8s %-7d %8.4f", kColorNames[i % 6], m.prompts, m.accuracy));
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
  Frame f;
  for (int64_t k : r.ks) f.kmax = std::max(f.kmax, static_cast<double>(k));
  const bool svg = path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
  const bool png = path.size() >= 4 && path.compare(path.size() - 4, 4, ".png") == 0;
  if (!svg && !png) return absl::InvalidArgumentError(absl::StrCat("--plot ", path, ": name a .png or .svg file"));
  if (svg) return common_internal::WriteFileAtomically(path, Svg(r, f));
  Canvas c(f.width, f.height);
  const double x0 = f.left, x1 = f.width - f.right;
  for (double p : {0.25, 0.5, 0.75, 1.0}) c.Line(x0, f.Y(p), x1, f.Y(p), {225, 225, 225});
  c.Line(x0, f.Y(0), x1, f.Y(0), {0, 0, 0});
  c.Line(x0, f.Y(0), x0, f.Y(1), {0, 0, 0});
  for (double p : {0.0, 0.5, 1.0}) {
    const std::string label = p == 0.5 ? "0.5" : p == 1.0 ? "1" : "0";
    c.Text(static_cast<int>(x0) - 8 - 8 * static_cast<int>(label.size()), static_cast<int>(f.Y(p)) - 5, label);
  }
  for (int64_t k : r.ks) {
    c.Line(f.X(k), f.Y(0), f.X(k), f.Y(0) + 4, {0, 0, 0});
    const std::string label = absl::StrCat(k);
    c.Text(static_cast<int>(f.X(k)) - 4 * static_cast<int>(label.size()), static_cast<int>(f.Y(0)) + 10, label);
  }
  for (size_t i = 0; i < r.models.size(); ++i) {
    const auto& color = kColors[i % kColors.size()];
    double px = -1, py = -1;
    for (const auto& [k, p] : r.models[i].pass_at_k) {
      const double x = f.X(k), y = f.Y(p);
      if (px >= 0) c.Line(px, py, x, y, color, 3);
      for (int dx = -3; dx <= 3; ++dx)
        for (int dy = -3; dy <= 3; ++dy)
          if (dx * dx + dy * dy <= 9) c.Set(static_cast<int>(x) + dx, static_cast<int>(y) + dy, color);
      px = x;
      py = y;
    }
  }
  return common_internal::WriteFileAtomically(path, c.Png());
}

}  // namespace roll
