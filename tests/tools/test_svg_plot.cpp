// The SVG line-plot writer: tick choice, scaling, escaping, and a document that holds
// everything a reader needs (title, axis labels with units, ticks, legend, reference lines).
#include <tailbatch/tools/svg_plot.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tailbatch_test.hpp"

using tailbatch::LinePlot;
using tailbatch::PlotSeries;

namespace {

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

LinePlot sample() {
  LinePlot p;
  p.title = "Latency vs offered load";
  p.subtitle = "made by test_svg_plot";
  p.x_label = "offered load (requests/s)";
  p.y_label = "latency (ms)";
  p.series.push_back(PlotSeries{"p50", {{100, 10}, {200, 12}, {300, 20}}, "", false, true});
  p.series.push_back(PlotSeries{"p95 <batch & window>", {{100, 15}, {200, 22}, {300, 95}}, "", true, true});
  p.horizontal.push_back({80.0, "SLO p95 80 ms"});
  p.vertical.push_back({250.0, "saturation 250 rps"});
  return p;
}

}  // namespace

TEST_CASE("nice_ticks covers the range in steps of 1, 2 or 5 x 10^k", "[svg]") {
  auto t = tailbatch::nice_ticks(0.0, 97.0, 6);
  REQUIRE(t.size() >= 2);
  CHECK(t.front() <= 0.0);
  CHECK(t.back() >= 97.0);
  const double step = t[1] - t[0];
  CHECK(step == 20.0);
  for (std::size_t i = 1; i < t.size(); ++i) CHECK(std::fabs(t[i] - t[i - 1] - step) < 1e-9);

  auto small = tailbatch::nice_ticks(0.013, 0.047, 5);
  CHECK(small.front() <= 0.013);
  CHECK(small.back() >= 0.047);
  CHECK(std::fabs(small[1] - small[0] - 0.01) < 1e-12);

  auto big = tailbatch::nice_ticks(1200.0, 5300.0, 10);
  CHECK(std::fabs(big[1] - big[0] - 500.0) < 1e-9);
  CHECK(tailbatch::nice_ticks(5.0, 5.0).size() == 1);
}

TEST_CASE("log_ticks: 1-2-5 per decade, powers of ten over many decades", "[svg]") {
  auto t = tailbatch::log_ticks(3.0, 700.0);
  REQUIRE(!t.empty());
  CHECK(t.front() <= 3.0);
  CHECK(t.back() >= 700.0);
  CHECK(t.front() == 2.0);
  CHECK(t.back() == 1000.0);
  auto wide = tailbatch::log_ticks(0.5, 2e5);
  for (double v : wide) CHECK(std::fabs(std::log10(v) - std::round(std::log10(v))) < 1e-9);
}

TEST_CASE("render_svg draws title, labels, ticks, series, legend and reference lines", "[svg]") {
  const std::string svg = tailbatch::render_svg(sample());
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find(">Latency vs offered load</text>") != std::string::npos);
  CHECK(svg.find(">made by test_svg_plot</text>") != std::string::npos);
  CHECK(svg.find(">offered load (requests/s)</text>") != std::string::npos);
  CHECK(svg.find(">latency (ms)</text>") != std::string::npos);
  CHECK(svg.find(">SLO p95 80 ms</text>") != std::string::npos);
  CHECK(svg.find(">saturation 250 rps</text>") != std::string::npos);
  // The legend names each series; markup in names is escaped.
  CHECK(svg.find(">p50</text>") != std::string::npos);
  CHECK(svg.find(">p95 &lt;batch &amp; window&gt;</text>") != std::string::npos);
  CHECK(svg.find("<batch") == std::string::npos);
  // One path per series, a marker per point, a dashed second series.
  CHECK(count(svg, "<path ") == 2);
  CHECK(count(svg, "<circle ") == 6);
  CHECK(svg.find("stroke-dasharray=\"6 4\"") != std::string::npos);
  // Tick labels: y from 0 through 100 in steps of 20, x in steps of 50 or 100.
  CHECK(svg.find(">0</text>") != std::string::npos);
  CHECK(svg.find(">100</text>") != std::string::npos);
  CHECK(svg.find(">300</text>") != std::string::npos);
  // Tags balance.
  CHECK(count(svg, "<text") == count(svg, "</text>"));
  CHECK(count(svg, "<g") == count(svg, "</g>"));
}

TEST_CASE("Coordinates: larger y is higher on the page; points map inside the frame", "[svg]") {
  LinePlot p;
  p.title = "t";
  p.x_label = "x (s)";
  p.y_label = "y (ms)";
  p.series.push_back(PlotSeries{"s", {{0, 0}, {10, 100}}, "#000000", false, true});
  const std::string svg = tailbatch::render_svg(p);
  // Two markers: the first (0,0) at the bottom-left corner, the second (10,100) above it.
  auto first = svg.find("<circle cx=\"");
  auto second = svg.find("<circle cx=\"", first + 1);
  REQUIRE(second != std::string::npos);
  double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  std::sscanf(svg.c_str() + first, "<circle cx=\"%lf\" cy=\"%lf\"", &x1, &y1);
  std::sscanf(svg.c_str() + second, "<circle cx=\"%lf\" cy=\"%lf\"", &x2, &y2);
  CHECK(x2 > x1);
  CHECK(y2 < y1);
  CHECK(x1 >= 0);
  CHECK(x2 <= p.width);
  CHECK(y1 <= p.height);
  CHECK(y2 >= 0);
}

TEST_CASE("Log scale, skipped points, and bad sizes", "[svg]") {
  LinePlot p = sample();
  p.y_scale = tailbatch::AxisScale::log;
  p.series[0].points.push_back({350, 0.0});    // not drawable on a log axis: skipped
  p.series[0].points.push_back({400, NAN});    // skipped
  const std::string svg = tailbatch::render_svg(p);
  CHECK(svg.find("latency (ms) (log scale)") != std::string::npos);
  CHECK(count(svg, "<circle ") == 6);
  CHECK(svg.find("nan") == std::string::npos);

  p.y_min = 0.0;
  CHECK_THROWS_AS(tailbatch::render_svg(p), std::invalid_argument);
  LinePlot tiny = sample();
  tiny.width = 100;
  CHECK_THROWS_AS(tailbatch::render_svg(tiny), std::invalid_argument);
  // An empty plot still renders a frame.
  LinePlot empty;
  empty.title = "nothing yet";
  CHECK(tailbatch::render_svg(empty).find("nothing yet") != std::string::npos);
}

TEST_CASE("write_svg writes the file and reports an unwritable path", "[svg]") {
  const auto path = std::filesystem::temp_directory_path() / "tailbatch_test_svg_plot.svg";
  tailbatch::write_svg(path.string(), sample());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str() == tailbatch::render_svg(sample()));
  std::filesystem::remove(path);
  CHECK_THROWS_AS(tailbatch::write_svg("/nonexistent-dir/x/plot.svg", sample()), std::runtime_error);
}

TEST_CASE("The legend goes to the corner that hides the least of the data", "[svg]") {
  auto legend_x = [](const std::string& svg) {
    const auto at = svg.find("fill-opacity=\"0.9\"");
    REQUIRE(at != std::string::npos);
    const auto rect = svg.rfind("<rect x=\"", at);
    double x = 0;
    std::sscanf(svg.c_str() + rect, "<rect x=\"%lf\"", &x);
    return x;
  };
  LinePlot p;
  p.title = "t";
  p.x_label = "x (s)";
  p.y_label = "y (ms)";
  // A line from the top-left corner to the bottom-right one: the legend moves right.
  p.series.push_back(PlotSeries{"falling", {{0, 100}, {10, 0}}, "", false, true});
  CHECK(legend_x(tailbatch::render_svg(p)) > p.width / 2.0);
  // Rising from the bottom-left: the top-left corner is free.
  p.series[0].points = {{0, 0}, {10, 100}};
  CHECK(legend_x(tailbatch::render_svg(p)) < p.width / 2.0);
  // Asked for explicitly, it stays where it was put.
  p.legend = tailbatch::LegendPosition::top_right;
  CHECK(legend_x(tailbatch::render_svg(p)) > p.width / 2.0);
}
