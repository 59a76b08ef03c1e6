#include "common/plot.h"
#include "testing/files.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace roll::common_internal {
namespace {

std::string Read(const std::string& path) { return roll::testing::ReadFile(path); }

PlotSpec Spec() {
  PlotSpec p;
  p.x_label = "compute";
  p.y_label = "accuracy";
  p.log_x = true;
  p.x_min = 1;
  p.x_max = 1e6;
  p.x_ticks = {1, 1e3, 1e6};
  p.y_ticks = {0, 0.5, 1};
  p.series.push_back({"run <a>", {{1, 0.1}, {1e3, 0.4}, {1e6, 0.6}}});
  return p;
}

TEST(PlotTest, WritesAnSvgWithLegendAndAPngWithItsSignature) {
  const std::string dir = std::filesystem::temp_directory_path() / ("roll-plot-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WritePlot(Spec(), dir + "/p.svg").ok());
  const std::string svg = Read(dir + "/p.svg");
  EXPECT_NE(svg.find("run &lt;a>"), std::string::npos) << "the legend names the series, escaped";
  EXPECT_NE(svg.find(">accuracy<"), std::string::npos);
  EXPECT_NE(svg.find(">1e+06<"), std::string::npos) << "tick values";
  ASSERT_TRUE(WritePlot(Spec(), dir + "/p.png").ok());
  const std::string png = Read(dir + "/p.png");
  ASSERT_GT(png.size(), 100u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(png.substr(png.size() - 8, 4), "IEND");
  std::filesystem::remove_all(dir);
}

TEST(PlotTest, BadPathsAndRangesAreNamed) {
  auto s = WritePlot(Spec(), "/tmp/p.jpg");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(".png or .svg"), std::string::npos);
  PlotSpec p = Spec();
  p.x_min = 0;  // log axis from 0
  EXPECT_FALSE(WritePlot(p, "/tmp/p.svg").ok());
}

}  // namespace
}  // namespace roll::common_internal
