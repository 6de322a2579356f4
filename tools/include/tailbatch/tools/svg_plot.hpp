// A small line-plot writer that produces standalone SVG: no dependencies, no fonts to
// install, readable in any browser and embeddable in Markdown.
//
// It draws what a latency report needs and nothing more: a title (and a subtitle saying
// how the figure was made), axes with labels and "nice" ticks (1, 2, 5 × 10^k), grid lines,
// any number of named series as lines with markers, horizontal and vertical reference
// lines (an SLO, a saturation point) with labels, a legend (placed where it hides the least
// data), and a linear or logarithmic y axis. The load generator builds its plots with it
// (load_generator.hpp).
//
// Every function is pure and allocates its result; nothing here keeps state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

struct PlotPoint {
  double x = 0.0;
  double y = 0.0;
};

// One named line of a plot.
struct PlotSeries {
  std::string name;              // the legend entry
  std::vector<PlotPoint> points; // drawn in the given order; non-finite points are skipped
  std::string color;             // an SVG color; empty: the next color of the palette
  bool dashed = false;
  bool markers = true;           // a dot on every point
};

// A reference line across the plot: an SLO (horizontal) or a saturation point (vertical).
struct PlotLine {
  double value = 0.0;
  std::string label;
  std::string color = "#b22222";
};

enum class AxisScale { linear, log };
// automatic: the corner where the legend covers the least of the data.
enum class LegendPosition { automatic, top_left, top_right, bottom_left, bottom_right };

// Everything one plot shows. Labels should carry their units ("offered load (requests/s)").
struct LinePlot {
  std::string title;
  std::string subtitle;  // small text under the title: the command and the machine
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotLine> horizontal;  // y = value
  std::vector<PlotLine> vertical;    // x = value
  std::optional<double> x_min, x_max, y_min, y_max;  // unset: fitted to the data
  AxisScale y_scale = AxisScale::linear;
  LegendPosition legend = LegendPosition::automatic;
  int width = 820;
  int height = 500;
};

namespace tools::detail {

inline std::string svg_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string svg_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A tick label: as few digits as the tick step needs.
inline std::string tick_label(double v, double step) {
  char buf[32];
  if (std::fabs(v) < step * 1e-6) v = 0.0;
  const double mag = std::fabs(v);
  if (mag >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    int decimals = 0;
    while (decimals < 6 && std::fabs(step * std::pow(10.0, decimals) -
                                     std::round(step * std::pow(10.0, decimals))) > 1e-6)
      ++decimals;
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  }
  return buf;
}

inline constexpr const char* plot_palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                               "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};

}  // namespace tools::detail

// Evenly spaced "nice" tick values (steps of 1, 2 or 5 × 10^k) covering [lo, hi] with
// about `target` intervals; the first tick is <= lo and the last >= hi. Allocates.
// Returns {lo} when lo == hi or either is not finite. Thread-safe.
[[nodiscard]] inline std::vector<double> nice_ticks(double lo, double hi, int target = 6) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0.0};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm <= 1.0 ? 1.0 : norm <= 2.0 ? 2.0 : norm <= 5.0 ? 5.0 : 10.0) * mag;
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9) * step;
  for (double t = first; t < hi + step * 0.999; t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
    if (ticks.size() > 1000) break;
  }
  return ticks;
}

// Ticks for a logarithmic axis: 1, 2, 5 × 10^k from below lo to above hi (lo > 0).
// Allocates. Thread-safe.
[[nodiscard]] inline std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0.0) || !std::isfinite(lo) || !std::isfinite(hi) || hi < lo) return {1.0};
  const int kmin = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int kmax = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  const bool decades_only = kmax - kmin > 3;  // many decades: powers of ten only
  std::vector<double> all;
  for (int k = kmin; k <= kmax; ++k)
    for (double m : {1.0, 2.0, 5.0})
      if (!decades_only || m == 1.0) all.push_back(m * std::pow(10.0, k));
  std::vector<double> ticks;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool next_also_below = i + 1 < all.size() && all[i + 1] <= lo * (1 + 1e-9);
    if (next_also_below) continue;  // keep only the last tick at or below lo
    ticks.push_back(all[i]);
    if (all[i] >= hi * (1 - 1e-9)) break;
  }
  return ticks;
}

// The plot as a standalone SVG document. Allocates. Throws std::invalid_argument if the
// size is smaller than 200 × 150 or a log axis meets a value <= 0. Thread-safe.
[[nodiscard]] inline std::string render_svg(const LinePlot& plot) {
  using tools::detail::svg_escape;
  using tools::detail::svg_num;
  if (plot.width < 200 || plot.height < 150)
    tailbatch::detail::throw_invalid_argument("LinePlot: width and height must be at least 200 x 150");
  const bool log_y = plot.y_scale == AxisScale::log;

  // Data range.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const auto& s : plot.series)
    for (const auto& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      if (log_y && p.y <= 0.0) continue;
      x_lo = std::min(x_lo, p.x);
      x_hi = std::max(x_hi, p.x);
      y_lo = std::min(y_lo, p.y);
      y_hi = std::max(y_hi, p.y);
    }
  // Reference lines stay clear of the frame's top edge, so their labels can be read.
  for (const auto& h : plot.horizontal) {
    y_lo = std::min(y_lo, h.value);
    y_hi = std::max(y_hi, log_y ? h.value * 1.3 : h.value * 1.08);
  }
  for (const auto& v : plot.vertical) {
    x_lo = std::min(x_lo, v.value);
    x_hi = std::max(x_hi, v.value);
  }
  if (!std::isfinite(x_lo)) { x_lo = 0.0; x_hi = 1.0; }
  if (!std::isfinite(y_lo)) { y_lo = log_y ? 1.0 : 0.0; y_hi = log_y ? 10.0 : 1.0; }
  if (!log_y) y_lo = std::min(y_lo, 0.0);  // latency and throughput axes start at zero
  if (plot.x_min) x_lo = *plot.x_min;
  if (plot.x_max) x_hi = *plot.x_max;
  if (plot.y_min) y_lo = *plot.y_min;
  if (plot.y_max) y_hi = *plot.y_max;
  if (log_y && !(y_lo > 0.0)) tailbatch::detail::throw_invalid_argument("LinePlot: a log y axis needs y_min > 0");
  if (x_hi <= x_lo) x_hi = x_lo + 1.0;
  if (y_hi <= y_lo) y_hi = log_y ? y_lo * 10.0 : y_lo + 1.0;

  std::vector<double> xt = nice_ticks(x_lo, x_hi, 8);
  std::vector<double> yt = log_y ? log_ticks(y_lo, y_hi) : nice_ticks(y_lo, y_hi, 6);
  if (!plot.x_min) x_lo = xt.front();
  if (!plot.x_max) x_hi = xt.back();
  if (!plot.y_min) y_lo = yt.front();
  if (!plot.y_max) y_hi = yt.back();
  const double x_step = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
  const double y_step = yt.size() > 1 ? yt[1] - yt[0] : 1.0;

  // Layout: margins for the title, tick labels and axis labels.
  const double left = 78, right = 24, top = plot.subtitle.empty() ? 52 : 68, bottom = 62;
  const double pw = plot.width - left - right, ph = plot.height - top - bottom;
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double y) {
    double f = log_y ? (std::log10(y) - std::log10(y_lo)) / (std::log10(y_hi) - std::log10(y_lo))
                     : (y - y_lo) / (y_hi - y_lo);
    return top + ph - f * ph;
  };

  std::string o;
  o.reserve(16384);
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(plot.width) +
       "\" height=\"" + std::to_string(plot.height) + "\" viewBox=\"0 0 " + std::to_string(plot.width) +
       " " + std::to_string(plot.height) +
       "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + svg_num(plot.width / 2.0) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" "
       "font-weight=\"bold\">" + svg_escape(plot.title) + "</text>\n";
  if (!plot.subtitle.empty())
    o += "<text x=\"" + svg_num(plot.width / 2.0) + "\" y=\"44\" text-anchor=\"middle\" font-size=\"11\" "
         "fill=\"#555\">" + svg_escape(plot.subtitle) + "</text>\n";

  // Grid and ticks.
  o += "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double t : xt)
    if (t >= x_lo - 1e-9 && t <= x_hi + 1e-9)
      o += "<line x1=\"" + svg_num(px(t)) + "\" y1=\"" + svg_num(top) + "\" x2=\"" + svg_num(px(t)) +
           "\" y2=\"" + svg_num(top + ph) + "\"/>\n";
  for (double t : yt)
    if (t >= y_lo * (1 - 1e-9) - 1e-12 && t <= y_hi * (1 + 1e-9) + 1e-12)
      o += "<line x1=\"" + svg_num(left) + "\" y1=\"" + svg_num(py(t)) + "\" x2=\"" + svg_num(left + pw) +
           "\" y2=\"" + svg_num(py(t)) + "\"/>\n";
  o += "</g>\n<g fill=\"#333\">\n";
  for (double t : xt)
    if (t >= x_lo - 1e-9 && t <= x_hi + 1e-9)
      o += "<text x=\"" + svg_num(px(t)) + "\" y=\"" + svg_num(top + ph + 18) + "\" text-anchor=\"middle\">" +
           tools::detail::tick_label(t, x_step) + "</text>\n";
  for (double t : yt)
    if (t >= y_lo * (1 - 1e-9) - 1e-12 && t <= y_hi * (1 + 1e-9) + 1e-12)
      o += "<text x=\"" + svg_num(left - 8) + "\" y=\"" + svg_num(py(t) + 4) + "\" text-anchor=\"end\">" +
           tools::detail::tick_label(t, log_y ? t : y_step) + "</text>\n";
  o += "</g>\n";
  // Axes and their labels.
  o += "<rect x=\"" + svg_num(left) + "\" y=\"" + svg_num(top) + "\" width=\"" + svg_num(pw) + "\" height=\"" +
       svg_num(ph) + "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n";
  o += "<text x=\"" + svg_num(left + pw / 2) + "\" y=\"" + svg_num(plot.height - 16.0) +
       "\" text-anchor=\"middle\" font-size=\"13\">" + svg_escape(plot.x_label) + "</text>\n";
  o += "<text transform=\"translate(18 " + svg_num(top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\" "
       "font-size=\"13\">" + svg_escape(plot.y_label) + (log_y ? " (log scale)" : "") + "</text>\n";

  // Everything inside the frame is clipped to it.
  o += "<clipPath id=\"plotarea\"><rect x=\"" + svg_num(left) + "\" y=\"" + svg_num(top) + "\" width=\"" +
       svg_num(pw) + "\" height=\"" + svg_num(ph) + "\"/></clipPath>\n<g clip-path=\"url(#plotarea)\">\n";
  for (const auto& h : plot.horizontal) {
    if (log_y && h.value <= 0.0) continue;
    o += "<line x1=\"" + svg_num(left) + "\" y1=\"" + svg_num(py(h.value)) + "\" x2=\"" + svg_num(left + pw) +
         "\" y2=\"" + svg_num(py(h.value)) + "\" stroke=\"" + svg_escape(h.color) +
         "\" stroke-width=\"1.5\" stroke-dasharray=\"7 4\"/>\n";
    o += "<text x=\"" + svg_num(left + pw - 6) + "\" y=\"" + svg_num(py(h.value) - 6) +
         "\" text-anchor=\"end\" fill=\"" + svg_escape(h.color) + "\">" + svg_escape(h.label) + "</text>\n";
  }
  for (const auto& v : plot.vertical) {
    o += "<line x1=\"" + svg_num(px(v.value)) + "\" y1=\"" + svg_num(top) + "\" x2=\"" + svg_num(px(v.value)) +
         "\" y2=\"" + svg_num(top + ph) + "\" stroke=\"" + svg_escape(v.color) +
         "\" stroke-width=\"1.5\" stroke-dasharray=\"3 3\"/>\n";
    const bool right_side = px(v.value) < left + pw * 0.75;
    o += "<text x=\"" + svg_num(px(v.value) + (right_side ? 5 : -5)) + "\" y=\"" + svg_num(top + ph - 8) +
         "\" text-anchor=\"" + (right_side ? "start" : "end") + "\" fill=\"" + svg_escape(v.color) + "\">" +
         svg_escape(v.label) + "</text>\n";
  }
  std::size_t palette_index = 0;
  std::vector<std::string> colors;
  for (const auto& s : plot.series) {
    std::string color = s.color.empty() ? tools::detail::plot_palette[palette_index++ % 8] : s.color;
    colors.push_back(color);
    std::string path;
    bool pen_down = false;
    for (const auto& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y) || (log_y && p.y <= 0.0)) {
        pen_down = false;
        continue;
      }
      path += (pen_down ? " L" : " M") + svg_num(px(p.x)) + " " + svg_num(py(p.y));
      pen_down = true;
    }
    if (!path.empty())
      o += "<path d=\"" + path.substr(1) + "\" fill=\"none\" stroke=\"" + svg_escape(color) +
           "\" stroke-width=\"2\" stroke-linejoin=\"round\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") +
           "/>\n";
    if (s.markers)
      for (const auto& p : s.points)
        if (std::isfinite(p.x) && std::isfinite(p.y) && !(log_y && p.y <= 0.0))
          o += "<circle cx=\"" + svg_num(px(p.x)) + "\" cy=\"" + svg_num(py(p.y)) + "\" r=\"3\" fill=\"" +
               svg_escape(color) + "\"/>\n";
  }
  o += "</g>\n";

  // Legend.
  if (!plot.series.empty()) {
    std::size_t longest = 0;
    for (const auto& s : plot.series) longest = std::max(longest, s.name.size());
    const double lw = 44.0 + 7.0 * static_cast<double>(longest), lh = 10.0 + 18.0 * static_cast<double>(plot.series.size());
    auto corner = [&](LegendPosition p) {
      const bool at_right = p == LegendPosition::top_right || p == LegendPosition::bottom_right;
      const bool at_bottom = p == LegendPosition::bottom_left || p == LegendPosition::bottom_right;
      return PlotPoint{at_right ? left + pw - lw - 10 : left + 10, at_bottom ? top + ph - lh - 28 : top + 10};
    };
    LegendPosition where = plot.legend;
    if (where == LegendPosition::automatic) {
      // Count how much of each line (sampled along its segments) a box in each corner hides.
      auto hidden = [&](PlotPoint at) {
        std::size_t n = 0;
        auto inside = [&](double x, double y) {
          return x >= at.x - 4 && x <= at.x + lw + 4 && y >= at.y - 4 && y <= at.y + lh + 4;
        };
        for (const auto& sr : plot.series) {
          const PlotPoint* prev = nullptr;
          for (const auto& pt : sr.points) {
            if (!std::isfinite(pt.x) || !std::isfinite(pt.y) || (log_y && pt.y <= 0.0)) {
              prev = nullptr;
              continue;
            }
            const double x1 = px(pt.x), y1 = py(pt.y);
            if (prev == nullptr) {
              n += inside(x1, y1) ? 1u : 0u;
            } else {
              const double x0 = px(prev->x), y0 = py(prev->y);
              for (int k = 1; k <= 16; ++k)
                n += inside(x0 + (x1 - x0) * k / 16.0, y0 + (y1 - y0) * k / 16.0) ? 1u : 0u;
            }
            prev = &pt;
          }
        }
        return n;
      };
      std::size_t best = std::numeric_limits<std::size_t>::max();
      for (LegendPosition c : {LegendPosition::top_left, LegendPosition::top_right, LegendPosition::bottom_right,
                               LegendPosition::bottom_left}) {
        const std::size_t h = hidden(corner(c));
        if (h < best) {
          best = h;
          where = c;
        }
      }
    }
    const double lx = corner(where).x, ly = corner(where).y;
    o += "<rect x=\"" + svg_num(lx) + "\" y=\"" + svg_num(ly) + "\" width=\"" + svg_num(lw) + "\" height=\"" +
         svg_num(lh) + "\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n";
    for (std::size_t i = 0; i < plot.series.size(); ++i) {
      const double y = ly + 14 + 18.0 * static_cast<double>(i);
      o += "<line x1=\"" + svg_num(lx + 8) + "\" y1=\"" + svg_num(y) + "\" x2=\"" + svg_num(lx + 32) +
           "\" y2=\"" + svg_num(y) + "\" stroke=\"" + svg_escape(colors[i]) + "\" stroke-width=\"2\"" +
           (plot.series[i].dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
      o += "<text x=\"" + svg_num(lx + 38) + "\" y=\"" + svg_num(y + 4) + "\">" + svg_escape(plot.series[i].name) +
           "</text>\n";
    }
  }
  o += "</svg>\n";
  return o;
}

// Writes render_svg(plot) to path, replacing the file. Blocks on file I/O; allocates.
// Throws std::runtime_error naming the path if it cannot be written, and what
// render_svg() throws. Thread-safe (for distinct paths).
inline void write_svg(const std::string& path, const LinePlot& plot) {
  const std::string svg = render_svg(plot);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) tailbatch::detail::throw_error<std::runtime_error>("write_svg: cannot open " + path + " for writing");
  out << svg;
  out.flush();
  if (!out) tailbatch::detail::throw_error<std::runtime_error>("write_svg: cannot write " + path);
}

}  // namespace tailbatch
