// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html's charts: inline SVG line charts and scatters, with their axes, ticks and legend, and the
/// numbers as text (locale-free).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../../../detail/json_fwd.hpp"
#include "../../../detail/linkage.hpp"

namespace dettrial::detail::html {

/// One line of a chart (or one set of dots of a scatter). `points` are (x, y); a null (NaN) value
/// is not a point.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  /// Values that were null (NaN), infinite or missing: left out of `points`.
  std::size_t skipped = 0;
  /// A dot on each point (validations).
  bool marks = false;
  /// A cross on the last point: a trial the searcher stopped early.
  bool stopped = false;
  /// A CSS colour; empty: the chart's palette, by the series' position.
  std::string color;
};

/// An SVG line chart (or scatter), as svg_chart draws it.
struct Chart {
  /// The `data-chart` attribute: the metric (or field) the chart shows.
  std::string name;
  std::string title;
  std::string x_label = "batches";
  std::vector<Series> series;
  /// Dashed vertical lines at these x values, with their labels (ASHA's rungs).
  std::vector<std::pair<double, std::string>> x_marks;
  /// Dots only, in the order given (no lines).
  bool scatter = false;
  /// A logarithmic x axis (decades); points at x <= 0 are left out.
  bool log_x = false;
  bool legend = true;
};

/// Text for HTML (content and attribute values): & < > " ' escaped.
DETTRIAL_INLINE std::string escape(std::string_view text);

/// `v` with `precision` significant digits ("0.000531533", "1.5e+06"); std::to_chars, so that a
/// program's locale never turns SVG's '.' into ','.
DETTRIAL_INLINE std::string general(double v, int precision = 6);

/// A JSON value for a table cell: numbers with 6 significant digits, strings as they are.
DETTRIAL_INLINE std::string value_text(const Json& v);

/// A JSON value as the table sorts it (`data-value`): numbers exactly, empty for null.
DETTRIAL_INLINE std::string sort_key(const Json& v);

/// Series colours: Tableau's ten, then hues a golden angle apart.
DETTRIAL_INLINE std::string palette(std::size_t i);

/// At most `max_points` of `points` (sorted by x), keeping the first, the last and, in each of
/// (max_points - 2) / 2 equal runs between them, the lowest and the highest: a line drawn through
/// them keeps the series' extremes.
DETTRIAL_INLINE std::vector<std::pair<double, double>> downsample(std::vector<std::pair<double, double>> points,
                                                                  std::size_t max_points = 2000);

/**
 * @brief The chart as an `<svg data-chart="NAME">` element: axes with tick labels, a legend, each
 * series a `<polyline data-series="NAME" data-points="N">` (N: the points drawn, at most 2000; a
 * scatter's series are `<g>` with the same attributes), its dots and crosses. A chart without any
 * finite value says so.
 */
DETTRIAL_INLINE std::string svg_chart(const Chart& chart);

}  // namespace dettrial::detail::html

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../../detail/json.hpp"
namespace dettrial::detail::html {

DETTRIAL_INLINE std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- numbers as text: std::to_chars, so that a program's locale never turns SVG's '.' into ','

DETTRIAL_INLINE std::string general(double v, int precision) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::general, precision);
  return ec == std::errc() ? std::string(buffer, end) : std::string("?");
}

/// The shortest text that reads back as `v` (sort keys).
DETTRIAL_INLINE std::string shortest(double v) {
  if (!std::isfinite(v)) return general(v);
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  return ec == std::errc() ? std::string(buffer, end) : general(v, 17);
}

/// `v` with `decimals` digits after the point; never "-0".
DETTRIAL_INLINE std::string fixed(double v, int decimals) {
  if (!std::isfinite(v) || std::abs(v) >= 1e15) return general(v);
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::fixed, decimals);
  std::string s = ec == std::errc() ? std::string(buffer, end) : std::string("0");
  if (s.front() == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);  // rounded to zero
  return s;
}

DETTRIAL_INLINE std::string value_text(const Json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) return general(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

DETTRIAL_INLINE std::string sort_key(const Json& v) {
  if (v.is_number_float()) return shortest(v.get<double>());
  return value_text(v);
}

// ---- axes ------------------------------------------------------------------------------------

/// An axis's range and tick step; a logarithmic axis holds exponents (lo, hi, step in decades).
struct Axis {
  double lo = 0, hi = 1, step = 1;
  bool log = false;
};

/// A range that holds [min, max], from and to multiples of a round step (1, 2 or 5 times a power of
/// ten) that gives about five ticks. One value (or all equal) gets a margin around it.
DETTRIAL_INLINE Axis linear_axis(double min, double max) {
  if (!(max > min)) {
    const double pad = min == 0 ? 1 : std::abs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const double raw = (max - min) / 5;
  if (!std::isfinite(raw) || raw <= 0) return {min, max, 0, false};  // beyond round steps: the bare range
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * magnitude;
  // The tolerance keeps a bound that is a multiple of the step up to rounding (-2.2 / 0.1) from
  // growing by a whole step.
  return {std::floor(min / step + 1e-9) * step, std::ceil(max / step - 1e-9) * step, step, false};
}

/// Whole decades around [min, max] (both > 0), ticked every decade, or every few when they are many.
DETTRIAL_INLINE Axis log_axis(double min, double max) {
  double lo = std::floor(std::log10(min)), hi = std::ceil(std::log10(max));
  if (!(hi > lo)) hi = lo + 1;
  return {lo, hi, std::max(1.0, std::ceil((hi - lo) / 6)), true};
}

/// The tick values of an axis (exponents on a logarithmic one).
DETTRIAL_INLINE std::vector<double> ticks(const Axis& a) {
  if (!(a.step > 0)) return {a.lo, a.hi};
  std::vector<double> out;
  const double n = std::round((a.hi - a.lo) / a.step);
  for (int i = 0; i <= n && i <= 50; ++i) {
    double v = a.lo + i * a.step;
    if (std::abs(v) < a.step * 1e-9) v = 0;  // 0, not 1e-17
    out.push_back(v);
  }
  return out;
}

/// A tick's label, with as many decimals as the step needs (0.05 -> 2): labels differ, none is long.
DETTRIAL_INLINE std::string tick_label(double v, const Axis& a) {
  if (a.log) {
    const long e = std::lround(v);
    if (e >= -3 && e <= 4) return general(std::pow(10.0, static_cast<double>(e)));
    return "1e" + std::to_string(e);
  }
  if (v == 0) return "0";
  if (!(a.step > 0)) return general(v, 4);
  if (a.step >= 1e-4 && std::max(std::abs(a.lo), std::abs(a.hi)) < 1e7)
    return fixed(v, std::max(0, static_cast<int>(std::ceil(-std::log10(a.step) - 1e-9))));
  return general(v, std::clamp(static_cast<int>(std::ceil(std::log10(std::abs(v) / a.step))) + 1, 1, 15));
}

/// Where `v` lies on the axis, 0 (low end) to 1.
DETTRIAL_INLINE double position(double v, const Axis& a) {
  const double t = a.log ? std::log10(v) : v;
  return a.hi > a.lo ? (t - a.lo) / (a.hi - a.lo) : 0.5;
}

DETTRIAL_INLINE std::string palette(std::size_t i) {
  static constexpr const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  if (i < std::size(colors)) return colors[i];
  return "hsl(" + fixed(std::fmod(static_cast<double>(i) * 137.508, 360.0), 0) + ",60%,42%)";
}

/// About how wide a label is at the charts' 12px font (UTF-8 continuation bytes are not characters).
DETTRIAL_INLINE double text_width(std::string_view text) {
  double chars = 0;
  for (const char c : text)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++chars;
  return chars * 6.8;
}

DETTRIAL_INLINE std::vector<std::pair<double, double>> downsample(std::vector<std::pair<double, double>> points, std::size_t max_points) {
  max_points = std::max<std::size_t>(max_points, 4);
  if (points.size() <= max_points) return points;
  const std::size_t inner = points.size() - 2, buckets = (max_points - 2) / 2;
  std::vector<std::pair<double, double>> out;
  out.reserve(2 + 2 * buckets);
  out.push_back(points.front());
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::size_t begin = 1 + b * inner / buckets, end = 1 + (b + 1) * inner / buckets;
    if (begin == end) continue;
    std::size_t low = begin, high = begin;
    for (std::size_t i = begin; i < end; ++i) {
      if (points[i].second < points[low].second) low = i;
      if (points[i].second > points[high].second) high = i;
    }
    out.push_back(points[std::min(low, high)]);  // in x order
    if (low != high) out.push_back(points[std::max(low, high)]);
  }
  out.push_back(points.back());
  return out;
}

/// Where a chart's parts go, in the SVG's coordinates: the plot with its axes (x0..x1, y0..y1 the
/// plotting area); the legend's rows go below plot_height.
struct ChartFrame {
  static constexpr double width = 720, plot_height = 300;
  static constexpr double x0 = 72, x1 = width - 20, y0 = 22, y1 = plot_height - 46;
  static constexpr std::size_t max_marked = 400;  // beyond this many points a series' dots would only blur its line
  static constexpr std::size_t max_legend = 100;
};

/// What a chart draws: each series' finite points, in x order (a scatter's as given), thinned, with
/// how many there were before thinning, and the bounds of all of them (and of the x marks).
struct DrawnPoints {
  std::vector<std::vector<std::pair<double, double>>> series;
  std::vector<std::size_t> totals;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  bool any = false;
};

DETTRIAL_INLINE DrawnPoints drawn_points(const Chart& chart) {
  DrawnPoints d;
  for (const Series& s : chart.series) {
    std::vector<std::pair<double, double>> points;
    for (const auto& p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second) && (!chart.log_x || p.first > 0)) points.push_back(p);
    if (!chart.scatter) std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    d.totals.push_back(points.size());
    points = downsample(std::move(points));
    for (const auto& [x, y] : points) {
      d.xmin = std::min(d.xmin, x);
      d.xmax = std::max(d.xmax, x);
      d.ymin = std::min(d.ymin, y);
      d.ymax = std::max(d.ymax, y);
    }
    d.series.push_back(std::move(points));
  }
  d.any = d.xmin <= d.xmax;
  if (d.any)  // the rungs a trial has not reached are worth seeing too
    for (const auto& mark : chart.x_marks)
      if (std::isfinite(mark.first) && (!chart.log_x || mark.first > 0)) {
        d.xmin = std::min(d.xmin, mark.first);
        d.xmax = std::max(d.xmax, mark.first);
      }
  return d;
}

DETTRIAL_INLINE std::string series_color(const Chart& chart, std::size_t i) {
  return chart.series[i].color.empty() ? palette(i) : chart.series[i].color;
}

/// One legend entry, placed.
struct LegendEntry {
  std::string label, color;
  bool marks = false, cross = false;
  double x = 0, y = 0;
};

/// The legend: entries left to right, wrapped into rows under the x axis (`*rows` of them).
DETTRIAL_INLINE std::vector<LegendEntry> legend_entries(const Chart& chart, int* rows) {
  using F = ChartFrame;
  std::vector<LegendEntry> entries;
  if (chart.legend) {
    bool stopped = false;
    for (std::size_t i = 0; i < chart.series.size(); ++i) {
      stopped = stopped || chart.series[i].stopped;
      if (i < F::max_legend) entries.push_back({chart.series[i].name, series_color(chart, i), chart.series[i].marks, false, 0, 0});
    }
    if (chart.series.size() > F::max_legend)
      entries.push_back({"and " + std::to_string(chart.series.size() - F::max_legend) + " more", "none", false, false, 0, 0});
    if (stopped) entries.push_back({"stopped early", "#444", false, true, 0, 0});
  }
  *rows = 0;
  double cursor = F::x0;
  for (LegendEntry& e : entries) {
    const double w = 28 + text_width(e.label);
    if (*rows == 0 || (cursor + w > F::width - 8 && cursor > F::x0)) {
      ++*rows;
      cursor = F::x0;
    }
    e.x = cursor;
    e.y = F::plot_height + (*rows - 1) * 18;
    cursor += w + 14;
  }
  return entries;
}

/// From data to the SVG's coordinates.
struct Scales {
  Axis ax, ay;
  double sx(double x) const { return ChartFrame::x0 + position(x, ax) * (ChartFrame::x1 - ChartFrame::x0); }
  double sy(double y) const { return ChartFrame::y1 - position(y, ay) * (ChartFrame::y1 - ChartFrame::y0); }
};

/// The grid, the tick labels and the x axis's label.
DETTRIAL_INLINE std::string svg_axes(const Chart& chart, const Scales& s) {
  using F = ChartFrame;
  const auto tick_at = [](double t, const Axis& a) { return a.hi > a.lo ? (t - a.lo) / (a.hi - a.lo) : 0.5; };
  std::string out = "<g class=\"axis\">\n";
  for (const double t : ticks(s.ay)) {
    const std::string y = fixed(F::y1 - tick_at(t, s.ay) * (F::y1 - F::y0), 1);
    out += "<line class=\"grid\" x1=\"" + fixed(F::x0, 1) + "\" x2=\"" + fixed(F::x1, 1) + "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
    out +=
        "<text x=\"" + fixed(F::x0 - 6, 1) + "\" y=\"" + y + "\" dy=\"4\" text-anchor=\"end\">" + escape(tick_label(t, s.ay)) + "</text>\n";
  }
  for (const double t : ticks(s.ax)) {
    const std::string x = fixed(F::x0 + tick_at(t, s.ax) * (F::x1 - F::x0), 1);
    out += "<line class=\"grid\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(F::y0, 1) + "\" y2=\"" + fixed(F::y1, 1) + "\"/>";
    out += "<text x=\"" + x + "\" y=\"" + fixed(F::y1 + 16, 1) + "\" text-anchor=\"middle\">" + escape(tick_label(t, s.ax)) + "</text>\n";
  }
  out += "<text class=\"label\" x=\"" + fixed((F::x0 + F::x1) / 2, 1) + "\" y=\"" + fixed(F::y1 + 34, 1) + "\" text-anchor=\"middle\">" +
         escape(chart.x_label) + (s.ax.log ? " (log scale)" : "") + "</text>\n</g>\n";
  return out;
}

/// The chart's x marks (ASHA's rungs) as dashed lines with their labels.
DETTRIAL_INLINE std::string svg_x_marks(const Chart& chart, const Scales& s) {
  using F = ChartFrame;
  std::string out;
  for (std::size_t i = 0; i < chart.x_marks.size(); ++i) {
    const auto& [at, label] = chart.x_marks[i];
    if (!std::isfinite(at) || (chart.log_x && at <= 0)) continue;
    const std::string x = fixed(s.sx(at), 1);
    out += "<g class=\"rung\"><line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(F::y0, 1) + "\" y2=\"" + fixed(F::y1, 1) +
           "\" stroke-dasharray=\"5 4\"/><text x=\"" + x + "\" dx=\"3\" y=\"" + fixed(F::y0 + 11 + static_cast<double>(i % 3) * 12, 1) +
           "\">" + escape(label) + "</text><title>" + escape(label) + " at " + escape(chart.x_label) + " " + general(at) + "</title></g>\n";
  }
  return out;
}

/// Series `i`: a scatter's dots, or a line with its dots (validations, or a single point) and a
/// cross at its end when the searcher stopped it early.
DETTRIAL_INLINE std::string svg_series(const Chart& chart, std::size_t i, const std::vector<std::pair<double, double>>& points,
                                       std::size_t total, const Scales& sc) {
  const Series& s = chart.series[i];
  const std::string color = series_color(chart, i), name = escape(s.name), count = std::to_string(points.size());
  const auto tooltip = [&](const std::pair<double, double>& p) {
    return "<title>" + name + ": " + escape(chart.x_label) + " " + general(p.first) + ", " + general(p.second) + "</title>";
  };
  const auto dot = [&](const std::pair<double, double>& p, double r) {
    return "<circle cx=\"" + fixed(sc.sx(p.first), 1) + "\" cy=\"" + fixed(sc.sy(p.second), 1) + "\" r=\"" + fixed(r, 1) + "\">" +
           tooltip(p) + "</circle>";
  };
  std::string out;
  if (chart.scatter) {
    out += "<g data-series=\"" + name + "\" data-points=\"" + count + "\" fill=\"" + color + "\" fill-opacity=\"0.85\">";
    for (const auto& p : points) out += dot(p, 4.5);
    return out + "</g>\n";
  }
  out += "<polyline data-series=\"" + name + "\" data-points=\"" + count + "\" data-total=\"" + std::to_string(total) +
         "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"";
  for (const auto& [x, y] : points) out += fixed(sc.sx(x), 1) + "," + fixed(sc.sy(y), 1) + " ";
  if (!points.empty()) out.pop_back();
  out += "\"/>\n";
  // A single point draws no line: it gets its dot whatever the series.
  if ((s.marks && points.size() <= ChartFrame::max_marked) || points.size() == 1) {
    out += "<g class=\"marks\" fill=\"" + color + "\">";
    for (const auto& p : points) out += dot(p, 2.6);
    out += "</g>\n";
  }
  if (s.stopped && !points.empty()) {
    const double cx = sc.sx(points.back().first), cy = sc.sy(points.back().second);
    out += "<path class=\"cross\" stroke=\"" + color + "\" d=\"M" + fixed(cx - 5, 1) + " " + fixed(cy - 5, 1) + "L" + fixed(cx + 5, 1) +
           " " + fixed(cy + 5, 1) + "M" + fixed(cx - 5, 1) + " " + fixed(cy + 5, 1) + "L" + fixed(cx + 5, 1) + " " + fixed(cy - 5, 1) +
           "\"><title>" + name + ": stopped early at " + escape(chart.x_label) + " " + general(points.back().first) + "</title></path>\n";
  }
  return out;
}

DETTRIAL_INLINE std::string svg_legend(const std::vector<LegendEntry>& entries) {
  std::string out;
  for (const LegendEntry& e : entries) {
    const std::string mid = fixed(e.y + 9, 1);
    out += "<g class=\"legend\">";
    if (e.cross)
      out += "<path class=\"cross\" stroke=\"" + e.color + "\" d=\"M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 4, 1) + "L" +
             fixed(e.x + 15, 1) + " " + fixed(e.y + 14, 1) + "M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 14, 1) + "L" + fixed(e.x + 15, 1) +
             " " + fixed(e.y + 4, 1) + "\"/>";
    else if (e.color != "none")
      out += "<line x1=\"" + fixed(e.x, 1) + "\" x2=\"" + fixed(e.x + 20, 1) + "\" y1=\"" + mid + "\" y2=\"" + mid + "\" stroke=\"" +
             e.color + "\" stroke-width=\"2\"/>";
    if (e.marks) out += "<circle cx=\"" + fixed(e.x + 10, 1) + "\" cy=\"" + mid + "\" r=\"2.6\" fill=\"" + e.color + "\"/>";
    out += "<text x=\"" + fixed(e.x + 26, 1) + "\" y=\"" + fixed(e.y + 13, 1) + "\">" + escape(e.label) + "</text></g>\n";
  }
  return out;
}

DETTRIAL_INLINE std::string svg_chart(const Chart& chart) {
  using F = ChartFrame;
  const DrawnPoints drawn = drawn_points(chart);
  int rows = 0;
  const std::vector<LegendEntry> entries = legend_entries(chart, &rows);
  const double height = F::plot_height + (rows > 0 ? rows * 18 + 6 : 0);

  std::string out = "<svg class=\"chart\" data-chart=\"" + escape(chart.name) + "\" viewBox=\"0 0 " + fixed(F::width, 0) + " " +
                    fixed(height, 0) + "\" width=\"" + fixed(F::width, 0) + "\" height=\"" + fixed(height, 0) +
                    "\" role=\"img\" aria-label=\"" + escape(chart.title.empty() ? chart.name : chart.title) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  const std::string frame = "<rect class=\"frame\" x=\"" + fixed(F::x0, 1) + "\" y=\"" + fixed(F::y0, 1) + "\" width=\"" +
                            fixed(F::x1 - F::x0, 1) + "\" height=\"" + fixed(F::y1 - F::y0, 1) + "\" fill=\"none\"/>\n";
  if (!drawn.any) {
    out += frame + "<text class=\"empty\" x=\"" + fixed((F::x0 + F::x1) / 2, 1) + "\" y=\"" + fixed((F::y0 + F::y1) / 2, 1) +
           "\" text-anchor=\"middle\">no values to plot (each is null or missing)</text>\n";
    for (std::size_t i = 0; i < chart.series.size(); ++i)  // the series are there, empty: tools count them
      out += "<polyline data-series=\"" + escape(chart.series[i].name) + "\" data-points=\"0\" points=\"\" fill=\"none\"/>\n";
  } else {
    const Scales scales{chart.log_x ? log_axis(drawn.xmin, drawn.xmax) : linear_axis(drawn.xmin, drawn.xmax),
                        linear_axis(drawn.ymin, drawn.ymax)};
    out += svg_axes(chart, scales) + svg_x_marks(chart, scales);
    for (std::size_t i = 0; i < chart.series.size(); ++i) out += svg_series(chart, i, drawn.series[i], drawn.totals[i], scales);
  }
  return out + frame + svg_legend(entries) + "</svg>\n";
}

}  // namespace dettrial::detail::html
#endif  // DETTRIAL_HEADER_DEFINITIONS
