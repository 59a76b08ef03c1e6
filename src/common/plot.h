#pragma once
// WritePlot: a small line plot of a few series, written atomically as a PNG
// (.png: axes, tick values in a built-in digit font, no text otherwise) or
// an SVG (.svg: with axis labels and the series names as a legend). For the
// figures the CLI draws (`roll eval --plot`, `roll fit-curve --plot`); not a
// plotting library.
//
// Series are drawn in order, one colour each (blue, orange, green, red,
// purple, brown, then again). The x axis is linear or logarithmic; ticks
// are the caller's.

#include <string>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll {
namespace common_internal {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
  bool line = true;     // join the points
  bool markers = true;  // a dot at each point
  int color = -1;       // index into the palette; -1: the series' own index
};

struct PlotSpec {
  std::string x_label, y_label;
  bool log_x = false;  // x > 0 everywhere when set
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  std::vector<double> x_ticks, y_ticks;
  std::vector<PlotSeries> series;
};

// The palette's colour names, for tables that refer to the plot.
const char* PlotColorName(int index);

// InvalidArgument for a path that names neither a .png nor an .svg file or
// an empty axis range; the writer's error otherwise.
absl::Status WritePlot(const PlotSpec& spec, const std::string& path);

}  // namespace common_internal
}  // namespace roll
