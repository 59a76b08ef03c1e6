// `roll fit-curve`: ScaleRL's compute-performance curve fitted to runs'
// metrics.jsonl (docs/recipes.md).

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "common/plot.h"
#include "nlohmann/json.hpp"
#include "roll/algorithms/scaling_fit.h"
#include "roll/common/cli_args.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using Points = std::vector<std::pair<double, double>>;

// (x, y) of every line of a metrics.jsonl (or a run directory holding one)
// that has both keys.
absl::StatusOr<Points> ReadPoints(const std::string& where, const std::string& x_key, const std::string& y_key) {
  const fs::path path = fs::is_directory(where) ? fs::path(where) / "metrics.jsonl" : fs::path(where);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("fit-curve: cannot read ", path.string()));
  Points out;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("fit-curve: ", path.string(), ":", line_no, ": ", e.what()));
    }
    if (!row.is_object() || !row.contains(x_key) || !row.contains(y_key)) continue;
    if (!row[x_key].is_number() || !row[y_key].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("fit-curve: ", path.string(), ":", line_no, ": '", x_key,
                                                     "' or '", y_key, "' is not a number"));
    }
    out.emplace_back(row[x_key].get<double>(), row[y_key].get<double>());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fit-curve: no line of ", path.string(), " has both '", x_key, "' and '", y_key, "'"));
  }
  return out;
}

struct RunFit {
  std::string run;
  ScalingFit fit;
  int64_t heldout = 0;
  double heldout_rmse = 0;
  Points points;
};

std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> ticks;
  for (double t = std::pow(10.0, std::floor(std::log10(lo))); t <= hi * 1.0001; t *= 10) {
    if (t >= lo * 0.9999) ticks.push_back(t);
  }
  if (ticks.size() < 3) {  // under two decades: 1, 2, 5 steps
    ticks.clear();
    for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10) {
      for (double m : {1.0, 2.0, 5.0}) {
        if (d * m >= lo * 0.9999 && d * m <= hi * 1.0001) ticks.push_back(d * m);
      }
    }
  }
  return ticks;
}

absl::Status Plot(const std::vector<RunFit>& fits, const std::string& x_key, const std::string& y_key, double x_hi,
                  const std::string& path) {
  common_internal::PlotSpec p;
  p.x_label = x_key + " (log)";
  p.y_label = y_key;
  p.log_x = true;
  double x_lo = x_hi, y_lo = 1e300, y_hi = -1e300;
  for (const RunFit& f : fits) {
    for (const auto& [x, y] : f.points) {
      if (x <= 0) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  for (size_t i = 0; i < fits.size(); ++i) {
    common_internal::PlotSeries pts, curve;
    pts.name = fits[i].run;
    pts.line = false;
    pts.color = static_cast<int>(i);
    for (const auto& pt : fits[i].points) {
      if (pt.first > 0) pts.points.push_back(pt);
    }
    curve.name = absl::StrFormat("fit: A %.4g, B %.3g, C_mid %.4g", fits[i].fit.curve.a, fits[i].fit.curve.b,
                                 fits[i].fit.curve.c_mid);
    curve.markers = false;
    curve.color = static_cast<int>(i);
    for (int k = 0; k <= 200; ++k) {
      const double x = std::exp(std::log(x_lo) + (std::log(x_hi) - std::log(x_lo)) * k / 200.0);
      const double y = fits[i].fit.curve.At(x);
      curve.points.emplace_back(x, y);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
    p.series.push_back(std::move(pts));
    p.series.push_back(std::move(curve));
  }
  const double pad = std::max(1e-9, (y_hi - y_lo) * 0.05);
  p.x_min = x_lo;
  p.x_max = std::max(x_hi, x_lo * 1.0001);
  p.y_min = y_lo - pad;
  p.y_max = y_hi + pad;
  p.x_ticks = LogTicks(p.x_min, p.x_max);
  for (int k = 0; k <= 4; ++k) p.y_ticks.push_back(std::round((p.y_min + (p.y_max - p.y_min) * k / 4) * 1e4) / 1e4);
  return common_internal::WritePlot(p, path);
}

}  // namespace

int FitCurveCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"x", "y", "format", "plot", "min-x", "max-x", "extrapolate", "r0", "bootstrap"},
                              {});
  if (!flags.ok()) return CliFail(flags.status());
  if (flags->positional().empty() || !flags->Has("x") || !flags->Has("y")) {
    std::cerr << "usage: roll fit-curve METRICS... --x KEY --y KEY [--format json|table] [--plot FILE.png|.svg]\n"
                 "                      [--min-x X] [--max-x X] [--extrapolate X] [--r0 R] [--bootstrap N]\n";
    return 2;
  }
  const std::string x_key = flags->Get("x"), y_key = flags->Get("y"), format = flags->Get("format", "table");
  if (format != "json" && format != "table") {
    return CliFail(absl::InvalidArgumentError(absl::StrCat("--format: '", format, "' is neither json nor table")));
  }
  ScalingFitOptions o;
  auto min_x = flags->GetDouble("min-x", 0);
  auto max_x = flags->GetDouble("max-x", std::numeric_limits<double>::infinity());
  auto extrapolate = flags->GetDouble("extrapolate", 0);
  auto bootstrap = flags->GetInt("bootstrap", 30);
  for (const absl::Status& s : {min_x.status(), max_x.status(), extrapolate.status(), bootstrap.status()}) {
    if (!s.ok()) return CliFail(s);
  }
  o.min_x = *min_x;
  o.bootstrap = static_cast<int>(*bootstrap);
  if (flags->Has("r0")) {
    auto r0 = flags->GetDouble("r0", 0);
    if (!r0.ok()) return CliFail(r0.status());
    o.r0 = *r0;
  }
  std::vector<RunFit> fits;
  for (const std::string& run : flags->positional()) {
    auto points = ReadPoints(run, x_key, y_key);
    if (!points.ok()) return CliFail(points.status());
    Points fitted;
    for (const auto& pt : *points) {
      if (pt.first <= *max_x) fitted.push_back(pt);
    }
    auto fit = FitScalingCurve(fitted, o);
    if (!fit.ok()) return CliFail(absl::Status(fit.status().code(), absl::StrCat(run, ": ", fit.status().message())));
    RunFit f{run, *fit, 0, 0, *points};
    double sq = 0;
    for (const auto& [x, y] : *points) {
      if (x <= *max_x) continue;
      ++f.heldout;
      sq += (y - fit->curve.At(x)) * (y - fit->curve.At(x));
    }
    if (f.heldout > 0) f.heldout_rmse = std::sqrt(sq / static_cast<double>(f.heldout));
    fits.push_back(std::move(f));
  }
  if (format == "json") {
    nlohmann::json j = {{"x", x_key}, {"y", y_key}, {"runs", nlohmann::json::array()}};
    for (const RunFit& f : fits) {
      const ScalingCurve& c = f.fit.curve;
      nlohmann::json r = {{"run", f.run},   {"points", f.fit.points}, {"a", c.a},   {"a_stderr", f.fit.a_stderr},
                          {"b", c.b},       {"c_mid", c.c_mid},       {"r0", c.r0}, {"rmse", f.fit.rmse}};
      if (*extrapolate > 0) r["predicted"] = {{"x", *extrapolate}, {"y", c.At(*extrapolate)}};
      if (f.heldout > 0) r["heldout"] = {{"points", f.heldout}, {"rmse", f.heldout_rmse}};
      j["runs"].push_back(r);
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << absl::StrFormat("%-7s %6s %18s %8s %12s %8s %8s", "colour", "points", "A (+- bootstrap)", "B",
                                 "C_mid", "R0", "rmse");
    if (*extrapolate > 0) std::cout << absl::StrFormat(" %12s", absl::StrFormat("R(%g)", *extrapolate));
    std::cout << absl::StrFormat(" %16s  %s\n", "heldout rmse (n)", "run");
    for (size_t i = 0; i < fits.size(); ++i) {
      const RunFit& f = fits[i];
      const ScalingCurve& c = f.fit.curve;
      std::cout << absl::StrFormat("%-7s %6d %9.4f +- %5.4f %8.3f %12.5g %8.4f %8.4f",
                                   common_internal::PlotColorName(static_cast<int>(i)), f.fit.points, c.a,
                                   f.fit.a_stderr, c.b, c.c_mid, c.r0, f.fit.rmse);
      if (*extrapolate > 0) std::cout << absl::StrFormat(" %12.4f", c.At(*extrapolate));
      std::cout << absl::StrFormat(" %16s  %s\n",
                                   f.heldout ? absl::StrFormat("%.4f (%d)", f.heldout_rmse, f.heldout) : "-", f.run);
    }
  }
  if (flags->Has("plot")) {
    if (absl::Status s = Plot(fits, x_key, y_key, std::max(*extrapolate, 0.0), flags->Get("plot")); !s.ok()) {
      return CliFail(s);
    }
  }
  return 0;
}

}  // namespace roll
