// WritePlot: PNG (zlib) and SVG line plots.

#include "common/plot.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"

namespace roll {
namespace common_internal {
namespace {

constexpr std::array<std::array<uint8_t, 3>, 6> kColors = {{{31, 119, 180},
                                                            {255, 127, 14},
                                                            {44, 160, 44},
                                                            {214, 39, 40},
                                                            {148, 103, 189},
                                                            {140, 86, 75}}};
const char* const kColorNames[] = {"blue", "orange", "green", "red", "purple", "brown"};

// Pixels of data coordinates.
struct Frame {
  int width = 640, height = 400, left = 70, right = 20, top = 20, bottom = 50;
  const PlotSpec* spec;
  double Fx(double x) const { return spec->log_x ? std::log(x) : x; }
  double X(double x) const {
    const double lo = Fx(spec->x_min), hi = Fx(spec->x_max);
    return left + (width - left - right) * (Fx(x) - lo) / (hi - lo);
  }
  double Y(double y) const {
    return top + (height - top - bottom) * (spec->y_max - y) / (spec->y_max - spec->y_min);
  }
};

std::string Label(double v) { return absl::StrFormat("%g", v); }

int ColorOf(const PlotSeries& s, size_t i) { return s.color >= 0 ? s.color : static_cast<int>(i); }

// 3x5 digits (and '.', '-', '+', 'e') for the tick values of the PNG.
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
    case '-': return "000000111000000";
    case '+': return "000010111010000";
    case 'e': return "000111101110011";
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

std::string Escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    out += ch == '<' ? std::string("&lt;") : ch == '&' ? std::string("&amp;") : std::string(1, ch);
  }
  return out;
}

std::string Svg(const PlotSpec& p, const Frame& f) {
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      f.width, f.height);
  const double x0 = f.left, x1 = f.width - f.right, y0 = f.Y(p.y_min), y1 = f.Y(p.y_max);
  absl::StrAppendFormat(&s, "<path d=\"M%g %g V%g H%g\" stroke=\"black\" fill=\"none\"/>\n", x0, y1, y0, x1);
  for (double y : p.y_ticks) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%s</text>\n", x0 - 6, f.Y(y) + 4,
                          Label(y));
  }
  for (double x : p.x_ticks) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", f.X(x), y0 + 16,
                          Label(x));
  }
  absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (x0 + x1) / 2,
                        f.height - 8, Escape(p.x_label));
  absl::StrAppendFormat(&s,
                        "<text x=\"14\" y=\"%g\" transform=\"rotate(-90 14 %g)\" text-anchor=\"middle\">"
                        "%s</text>\n",
                        (y0 + y1) / 2, (y0 + y1) / 2, Escape(p.y_label));
  for (size_t i = 0; i < p.series.size(); ++i) {
    const PlotSeries& ser = p.series[i];
    const auto& c = kColors[ColorOf(ser, i) % kColors.size()];
    const std::string rgb = absl::StrFormat("rgb(%d,%d,%d)", c[0], c[1], c[2]);
    if (ser.line) {
      std::string d;
      for (const auto& [x, y] : ser.points) absl::StrAppendFormat(&d, "%s%g %g", d.empty() ? "M" : " L", f.X(x), f.Y(y));
      absl::StrAppendFormat(&s, "<path d=\"%s\" stroke=\"%s\" stroke-width=\"2\" fill=\"none\"/>\n", d, rgb);
    }
    if (ser.markers) {
      for (const auto& [x, y] : ser.points) {
        absl::StrAppendFormat(&s, "<circle cx=\"%g\" cy=\"%g\" r=\"3\" fill=\"%s\"/>\n", f.X(x), f.Y(y), rgb);
      }
    }
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", x0 + 10, y1 + 14 + 16.0 * i, rgb,
                          Escape(ser.name));
  }
  return s + "</svg>\n";
}

std::string Png(const PlotSpec& p, const Frame& f) {
  Canvas c(f.width, f.height);
  const double x0 = f.left, x1 = f.width - f.right;
  for (double y : p.y_ticks) c.Line(x0, f.Y(y), x1, f.Y(y), {225, 225, 225});
  c.Line(x0, f.Y(p.y_min), x1, f.Y(p.y_min), {0, 0, 0});
  c.Line(x0, f.Y(p.y_min), x0, f.Y(p.y_max), {0, 0, 0});
  for (double y : p.y_ticks) {
    const std::string label = Label(y);
    c.Text(static_cast<int>(x0) - 8 - 8 * static_cast<int>(label.size()), static_cast<int>(f.Y(y)) - 5, label);
  }
  for (double x : p.x_ticks) {
    c.Line(f.X(x), f.Y(p.y_min), f.X(x), f.Y(p.y_min) + 4, {0, 0, 0});
    const std::string label = Label(x);
    c.Text(static_cast<int>(f.X(x)) - 4 * static_cast<int>(label.size()), static_cast<int>(f.Y(p.y_min)) + 10, label);
  }
  for (size_t i = 0; i < p.series.size(); ++i) {
    const PlotSeries& ser = p.series[i];
    const auto& color = kColors[ColorOf(ser, i) % kColors.size()];
    double px = 0, py = 0;
    bool first = true;
    for (const auto& [dx, dy] : ser.points) {
      const double x = f.X(dx), y = f.Y(dy);
      if (ser.line && !first) c.Line(px, py, x, y, color, 3);
      if (ser.markers) {
        for (int a = -3; a <= 3; ++a)
          for (int b = -3; b <= 3; ++b)
            if (a * a + b * b <= 9) c.Set(static_cast<int>(x) + a, static_cast<int>(y) + b, color);
      }
      px = x;
      py = y;
      first = false;
    }
  }
  return c.Png();
}

}  // namespace

const char* PlotColorName(int index) { return kColorNames[index % 6]; }

absl::Status WritePlot(const PlotSpec& spec, const std::string& path) {
  auto ends = [&](const char* ext) { return path.size() >= 4 && path.compare(path.size() - 4, 4, ext) == 0; };
  if (!ends(".svg") && !ends(".png")) {
    return absl::InvalidArgumentError(absl::StrCat("plot ", path, ": name a .png or .svg file"));
  }
  if (!(spec.x_max > spec.x_min) || !(spec.y_max > spec.y_min) || (spec.log_x && !(spec.x_min > 0))) {
    return absl::InvalidArgumentError(absl::StrCat("plot ", path, ": empty axis range (x ", spec.x_min, "..",
                                                   spec.x_max, ", y ", spec.y_min, "..", spec.y_max, ")"));
  }
  Frame f;
  f.spec = &spec;
  return WriteFileAtomically(path, ends(".svg") ? Svg(spec, f) : Png(spec, f));
}

}  // namespace common_internal
}  // namespace roll
