// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html: one self-contained page of a run's metrics.jsonl or of a search's trials
/// (inline SVG charts, a sortable table, a few lines of inline script; nothing fetched from a
/// network, no fonts or libraries from elsewhere), written next to the data it shows.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../layout.hpp"
#include "../error.hpp"
#include "../detail/atomic_file.hpp"
#include "../detail/json.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief Writes `<run_dir>/report.html` from the run's `metrics.jsonl` and returns its path: one
 * chart per metric (a training metric and its validation counterpart, `loss` and `validation_loss`,
 * share one), one per other numeric field of the records (throughput, per-phase seconds, learning
 * rate), the last values, and the run's hyperparameters and config (its `config.yaml`, or the
 * latest checkpoint's `load_data.json`). A torn last line (the run stopped while writing it) is
 * skipped; a folder without metrics.jsonl, or a corrupt line before the last, is an Error naming the
 * file (and the line).
 */
DETTRIAL_INLINE std::filesystem::path write_run_report(const std::filesystem::path& run_dir);

/**
 * @brief Writes `<experiment_dir>/report.html` for a search (the folder the experiment runner
 * writes: summary.json, events.jsonl, trials/<id>/) and returns its path: every trial's searcher
 * metric on one chart, with ASHA's rungs and the trials it stopped marked; the trials' table,
 * sortable; the best metric against each numeric hyperparameter. Each trial's own page
 * (`trials/<id>/report.html`) is written where it is missing or older than its metrics, and linked.
 * Works on a search still running (from events.jsonl and the trials' folders).
 */
DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir);

/// write_experiment_report for a folder with summary.json or trials/, else write_run_report for one
/// with metrics.jsonl; an Error naming the folder and what it lacks when it has neither.
DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir);

namespace detail::html {

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

/**
 * @brief The JSON objects of a .jsonl file, one per line (blank lines skipped). A last line that is
 * not one (torn by a crash) is skipped and `*torn` set; any other is an Error naming the file and the
 * line number.
 */
DETTRIAL_INLINE std::vector<Json> read_jsonl(const std::filesystem::path& path, bool* torn = nullptr);


/// write_experiment_report with the search's summary given, in summary.json's form, rather than read
/// from the folder: the runner's own, while the search runs (an empty object: none).
DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary);

}  // namespace detail::html

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <system_error>

#include <unistd.h>

#include <yaml-cpp/yaml.h>

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

/// `v` with `precision` significant digits ("0.000531533", "1.5e+06").
DETTRIAL_INLINE std::string general(double v, int precision = 6) {
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

/// A JSON value for a table cell: numbers with 6 significant digits, strings as they are.
DETTRIAL_INLINE std::string value_text(const Json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) return general(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// A JSON value as the table sorts it (`data-value`): numbers exactly, empty for null.
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

/// Series colours: Tableau's ten, then hues a golden angle apart.
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

DETTRIAL_INLINE std::vector<std::pair<double, double>> downsample(std::vector<std::pair<double, double>> points,
                                                                  std::size_t max_points) {
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

DETTRIAL_INLINE std::string svg_chart(const Chart& chart) {
  constexpr double width = 720, plot_height = 300;  // the plot and its axes; the legend goes below
  constexpr double x0 = 72, x1 = width - 20, y0 = 22, y1 = plot_height - 46;
  constexpr std::size_t max_marked = 400;  // beyond this many points a series' dots would only blur its line
  constexpr std::size_t max_legend = 100;

  // What is drawn: each series' finite points, in x order (a scatter's as given), thinned.
  std::vector<std::vector<std::pair<double, double>>> drawn;
  std::vector<std::size_t> totals;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const Series& s : chart.series) {
    std::vector<std::pair<double, double>> points;
    for (const auto& p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second) && (!chart.log_x || p.first > 0)) points.push_back(p);
    if (!chart.scatter)
      std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    totals.push_back(points.size());
    points = downsample(std::move(points));
    for (const auto& [x, y] : points) {
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
    drawn.push_back(std::move(points));
  }
  const bool any = xmin <= xmax;
  if (any)  // the rungs a trial has not reached are worth seeing too
    for (const auto& mark : chart.x_marks)
      if (std::isfinite(mark.first) && (!chart.log_x || mark.first > 0)) {
        xmin = std::min(xmin, mark.first);
        xmax = std::max(xmax, mark.first);
      }
  const auto color_of = [&](std::size_t i) { return chart.series[i].color.empty() ? palette(i) : chart.series[i].color; };

  // The legend: entries left to right, wrapped into rows under the x axis.
  struct Entry {
    std::string label, color;
    bool marks = false, cross = false;
    double x = 0, y = 0;
  };
  std::vector<Entry> entries;
  if (chart.legend) {
    bool stopped = false;
    for (std::size_t i = 0; i < chart.series.size(); ++i) {
      stopped = stopped || chart.series[i].stopped;
      if (i < max_legend) entries.push_back({chart.series[i].name, color_of(i), chart.series[i].marks, false, 0, 0});
    }
    if (chart.series.size() > max_legend)
      entries.push_back({"and " + std::to_string(chart.series.size() - max_legend) + " more", "none", false, false, 0, 0});
    if (stopped) entries.push_back({"stopped early", "#444", false, true, 0, 0});
  }
  int rows = 0;
  double cursor = x0;
  for (Entry& e : entries) {
    const double w = 28 + text_width(e.label);
    if (rows == 0 || (cursor + w > width - 8 && cursor > x0)) {
      ++rows;
      cursor = x0;
    }
    e.x = cursor;
    e.y = plot_height + (rows - 1) * 18;
    cursor += w + 14;
  }
  const double height = plot_height + (rows > 0 ? rows * 18 + 6 : 0);

  std::string out = "<svg class=\"chart\" data-chart=\"" + escape(chart.name) + "\" viewBox=\"0 0 " + fixed(width, 0) + " " +
                    fixed(height, 0) + "\" width=\"" + fixed(width, 0) + "\" height=\"" + fixed(height, 0) +
                    "\" role=\"img\" aria-label=\"" + escape(chart.title.empty() ? chart.name : chart.title) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  const std::string frame = "<rect class=\"frame\" x=\"" + fixed(x0, 1) + "\" y=\"" + fixed(y0, 1) + "\" width=\"" + fixed(x1 - x0, 1) +
                            "\" height=\"" + fixed(y1 - y0, 1) + "\" fill=\"none\"/>\n";
  if (!any) {
    out += frame + "<text class=\"empty\" x=\"" + fixed((x0 + x1) / 2, 1) + "\" y=\"" + fixed((y0 + y1) / 2, 1) +
           "\" text-anchor=\"middle\">no values to plot (each is null or missing)</text>\n";
    for (std::size_t i = 0; i < chart.series.size(); ++i)  // the series are there, empty: tools count them
      out += "<polyline data-series=\"" + escape(chart.series[i].name) + "\" data-points=\"0\" points=\"\" fill=\"none\"/>\n";
  } else {
    const Axis ax = chart.log_x ? log_axis(xmin, xmax) : linear_axis(xmin, xmax);
    const Axis ay = linear_axis(ymin, ymax);
    const auto sx = [&](double x) { return x0 + position(x, ax) * (x1 - x0); };
    const auto sy = [&](double y) { return y1 - position(y, ay) * (y1 - y0); };
    const auto tick_at = [](double t, const Axis& a) { return a.hi > a.lo ? (t - a.lo) / (a.hi - a.lo) : 0.5; };

    out += "<g class=\"axis\">\n";
    for (const double t : ticks(ay)) {
      const std::string y = fixed(y1 - tick_at(t, ay) * (y1 - y0), 1);
      out += "<line class=\"grid\" x1=\"" + fixed(x0, 1) + "\" x2=\"" + fixed(x1, 1) + "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
      out += "<text x=\"" + fixed(x0 - 6, 1) + "\" y=\"" + y + "\" dy=\"4\" text-anchor=\"end\">" + escape(tick_label(t, ay)) + "</text>\n";
    }
    for (const double t : ticks(ax)) {
      const std::string x = fixed(x0 + tick_at(t, ax) * (x1 - x0), 1);
      out += "<line class=\"grid\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(y0, 1) + "\" y2=\"" + fixed(y1, 1) + "\"/>";
      out += "<text x=\"" + x + "\" y=\"" + fixed(y1 + 16, 1) + "\" text-anchor=\"middle\">" + escape(tick_label(t, ax)) + "</text>\n";
    }
    out += "<text class=\"label\" x=\"" + fixed((x0 + x1) / 2, 1) + "\" y=\"" + fixed(y1 + 34, 1) + "\" text-anchor=\"middle\">" +
           escape(chart.x_label) + (ax.log ? " (log scale)" : "") + "</text>\n</g>\n";

    for (std::size_t i = 0; i < chart.x_marks.size(); ++i) {
      const auto& [at, label] = chart.x_marks[i];
      if (!std::isfinite(at) || (chart.log_x && at <= 0)) continue;
      const std::string x = fixed(sx(at), 1);
      out += "<g class=\"rung\"><line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(y0, 1) + "\" y2=\"" + fixed(y1, 1) +
             "\" stroke-dasharray=\"5 4\"/><text x=\"" + x + "\" dx=\"3\" y=\"" + fixed(y0 + 11 + static_cast<double>(i % 3) * 12, 1) +
             "\">" + escape(label) + "</text><title>" + escape(label) + " at " + escape(chart.x_label) + " " + general(at) +
             "</title></g>\n";
    }

    for (std::size_t i = 0; i < chart.series.size(); ++i) {
      const Series& s = chart.series[i];
      const auto& points = drawn[i];
      const std::string color = color_of(i), name = escape(s.name), count = std::to_string(points.size());
      const auto tooltip = [&](const std::pair<double, double>& p) {
        return "<title>" + name + ": " + escape(chart.x_label) + " " + general(p.first) + ", " + general(p.second) + "</title>";
      };
      const auto dot = [&](const std::pair<double, double>& p, double r) {
        return "<circle cx=\"" + fixed(sx(p.first), 1) + "\" cy=\"" + fixed(sy(p.second), 1) + "\" r=\"" + fixed(r, 1) + "\">" +
               tooltip(p) + "</circle>";
      };
      if (chart.scatter) {
        out += "<g data-series=\"" + name + "\" data-points=\"" + count + "\" fill=\"" + color + "\" fill-opacity=\"0.85\">";
        for (const auto& p : points) out += dot(p, 4.5);
        out += "</g>\n";
        continue;
      }
      out += "<polyline data-series=\"" + name + "\" data-points=\"" + count + "\" data-total=\"" + std::to_string(totals[i]) +
             "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"";
      for (const auto& [x, y] : points) out += fixed(sx(x), 1) + "," + fixed(sy(y), 1) + " ";
      if (!points.empty()) out.pop_back();
      out += "\"/>\n";
      // A single point draws no line: it gets its dot whatever the series.
      if ((s.marks && points.size() <= max_marked) || points.size() == 1) {
        out += "<g class=\"marks\" fill=\"" + color + "\">";
        for (const auto& p : points) out += dot(p, 2.6);
        out += "</g>\n";
      }
      if (s.stopped && !points.empty()) {
        const double cx = sx(points.back().first), cy = sy(points.back().second);
        out += "<path class=\"cross\" stroke=\"" + color + "\" d=\"M" + fixed(cx - 5, 1) + " " + fixed(cy - 5, 1) + "L" + fixed(cx + 5, 1) +
               " " + fixed(cy + 5, 1) + "M" + fixed(cx - 5, 1) + " " + fixed(cy + 5, 1) + "L" + fixed(cx + 5, 1) + " " +
               fixed(cy - 5, 1) + "\"><title>" + name + ": stopped early at " + escape(chart.x_label) + " " +
               general(points.back().first) + "</title></path>\n";
      }
    }
  }
  out += frame;

  for (const Entry& e : entries) {
    const std::string mid = fixed(e.y + 9, 1);
    out += "<g class=\"legend\">";
    if (e.cross)
      out += "<path class=\"cross\" stroke=\"" + e.color + "\" d=\"M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 4, 1) + "L" + fixed(e.x + 15, 1) +
             " " + fixed(e.y + 14, 1) + "M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 14, 1) + "L" + fixed(e.x + 15, 1) + " " +
             fixed(e.y + 4, 1) + "\"/>";
    else if (e.color != "none")
      out += "<line x1=\"" + fixed(e.x, 1) + "\" x2=\"" + fixed(e.x + 20, 1) + "\" y1=\"" + mid + "\" y2=\"" + mid + "\" stroke=\"" +
             e.color + "\" stroke-width=\"2\"/>";
    if (e.marks) out += "<circle cx=\"" + fixed(e.x + 10, 1) + "\" cy=\"" + mid + "\" r=\"2.6\" fill=\"" + e.color + "\"/>";
    out += "<text x=\"" + fixed(e.x + 26, 1) + "\" y=\"" + fixed(e.y + 13, 1) + "\">" + escape(e.label) + "</text></g>\n";
  }
  out += "</svg>\n";
  return out;
}

DETTRIAL_INLINE std::vector<Json> read_jsonl(const std::filesystem::path& path, bool* torn) {
  if (torn) *torn = false;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path.string() + "'");
  std::vector<Json> out;
  // A line that is not a record is fatal only once another line follows it: the last may be torn.
  std::string bad_reason;
  std::size_t bad_line = 0, number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (bad_line != 0)
      throw Error("'" + path.string() + "' line " + std::to_string(bad_line) + " is not a JSON record (" + bad_reason +
                  "); the file is damaged: fix or delete that line");
    try {
      Json record = Json::parse(line);
      if (record.is_object()) {
        out.push_back(std::move(record));
        continue;
      }
      bad_reason = "it is " + json_kind(record) + ", not an object";
    } catch (const Json::parse_error& e) {
      const std::string what = e.what();
      const auto colon = what.find(": ");
      bad_reason = colon == std::string::npos ? what : what.substr(colon + 2);
    }
    bad_line = number;
  }
  if (in.bad()) throw Error("cannot read '" + path.string() + "'");
  if (bad_line != 0 && torn) *torn = true;
  return out;
}

// ---- the page ---------------------------------------------------------------------------------

/// The page's style: system fonts only (nothing to download).
DETTRIAL_INLINE const char* page_style() {
  return R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{padding:14px 24px;background:#fff;border-bottom:1px solid #d0d7de}
h1{font-size:20px;margin:0 0 4px;word-break:break-all}
h2{font-size:16px;margin:26px 0 8px}
main{padding:4px 24px 32px}
p{margin:4px 0}
.meta{color:#57606a}
.note{color:#9a6700}
a{color:#0969da}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:0}
figcaption{font-weight:600;margin:0 0 4px;word-break:break-all}
svg.chart{display:block;width:100%;height:auto;max-width:900px}
svg.chart text{font-size:12px;fill:#30363d}
svg.chart .label{fill:#57606a}
svg.chart .empty{fill:#9a6700}
svg.chart .grid{stroke:#eaeef2;stroke-width:1}
svg.chart .frame{stroke:#8c959f;stroke-width:1}
svg.chart .rung line{stroke:#6e7781;stroke-width:1}
svg.chart .rung text{font-size:11px;fill:#57606a}
svg.chart .cross{fill:none;stroke-width:2.2}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 9px;text-align:right;white-space:nowrap}
th{background:#eef1f4;font-weight:600}
td.text,th.text{text-align:left}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th:hover{background:#e2e6ea}
th[aria-sort=ascending]::after{content:" \25B2";font-size:10px}
th[aria-sort=descending]::after{content:" \25BC";font-size:10px}
tr.best td{background:#fff8c5}
.state-COMPLETED{color:#1a7f37}
.state-STOPPED_EARLY{color:#9a6700}
.state-ERRORED{color:#cf222e;font-weight:600}
.state-RUNNING,.state-QUEUED{color:#0969da}
.scroll{overflow-x:auto}
pre{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;overflow:auto;font-size:12px}
details{margin:8px 0}
summary{cursor:pointer}
)CSS";
}

/// The page's script: sorts the trials' table by a clicked header or by the URL's `#sort=COLUMN`
/// (or `#sort=COLUMN:desc`), then sets `document.body.dataset.ready`, which tests wait for.
DETTRIAL_INLINE const char* page_script() {
  return R"JS(
(function () {
  "use strict";
  var table = document.getElementById("trials");
  var current = null;
  function sortTable(column, descending) {
    if (!table || !table.tHead || !table.tBodies.length) return false;
    var headers = table.tHead.rows[0].cells, index = -1;
    for (var i = 0; i < headers.length; i++) {
      if (headers[i].getAttribute("data-column") === column) { index = i; break; }
    }
    if (index < 0) return false;
    var numeric = headers[index].getAttribute("data-type") === "number";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[index] ? a.cells[index].getAttribute("data-value") : null;
      var y = b.cells[index] ? b.cells[index].getAttribute("data-value") : null;
      var xMissing = x === null || x === "", yMissing = y === null || y === "";
      if (xMissing || yMissing) return xMissing === yMissing ? 0 : (xMissing ? 1 : -1);  /* blanks last */
      var order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
      return descending ? -order : order;
    });
    for (var r = 0; r < rows.length; r++) body.appendChild(rows[r]);
    for (var h = 0; h < headers.length; h++) headers[h].removeAttribute("aria-sort");
    headers[index].setAttribute("aria-sort", descending ? "descending" : "ascending");
    current = { column: column, descending: descending };
    return true;
  }
  function sortFromHash() {
    var match = /(?:^#|&)sort=([^&]*)/.exec(window.location.hash);
    if (!match) return;
    var spec = match[1], descending = false;
    try { spec = decodeURIComponent(spec); } catch (e) { /* kept as written */ }
    var colon = spec.lastIndexOf(":");
    if (colon >= 0 && /^(asc|desc)$/.test(spec.slice(colon + 1))) {
      descending = spec.slice(colon + 1) === "desc";
      spec = spec.slice(0, colon);
    }
    sortTable(spec, descending);
  }
  if (table && table.tHead) {
    var headers = table.tHead.rows[0].cells;
    for (var i = 0; i < headers.length; i++) {
      headers[i].addEventListener("click", function (event) {
        var column = event.currentTarget.getAttribute("data-column");
        var descending = !!current && current.column === column && !current.descending;
        if (sortTable(column, descending)) {
          try { history.replaceState(null, "", "#sort=" + encodeURIComponent(column) + (descending ? ":desc" : "")); } catch (e) { /* file: URLs may refuse */ }
        }
      });
    }
    window.addEventListener("hashchange", sortFromHash);
  }
  sortFromHash();
  document.body.dataset.ready = "1";
})();
)JS";
}

/// Now, for the page's footer line.
DETTRIAL_INLINE std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char text[32] = "";
  if (::gmtime_r(&now, &tm)) std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

DETTRIAL_INLINE std::string page(const std::string& title, const std::string& header, const std::string& content) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"generator\" content=\"dettrial\">\n"
         "<title>" + escape(title) + "</title>\n<style>" + page_style() + "</style>\n</head>\n<body>\n<header>\n" + header +
         "</header>\n<main>\n" + content + "<p class=\"meta\">Written by dettrial, " + utc_now() +
         ". Regenerate with <code>--report DIR</code>.</p>\n</main>\n<script>" + page_script() + "</script>\n</body>\n</html>\n";
}

DETTRIAL_INLINE std::string figures(const std::vector<Chart>& charts) {
  std::string out = "<div class=\"charts\">\n";
  for (const Chart& c : charts)
    out += "<figure>\n<figcaption>" + escape(c.title.empty() ? c.name : c.title) + "</figcaption>\n" + svg_chart(c) + "</figure>\n";
  return out + "</div>\n";
}

/// A config file shown as it is, folded.
DETTRIAL_INLINE std::string config_section(const std::string& name, const std::string& text) {
  if (text.empty()) return "";
  return "<details><summary>" + escape(name) + "</summary>\n<pre>" + escape(text) + "</pre>\n</details>\n";
}

DETTRIAL_INLINE std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Nested hyperparameters by their dotted names ("optimizer.lr"), in their order.
DETTRIAL_INLINE void flatten(const Json& value, const std::string& prefix, std::vector<std::pair<std::string, Json>>& out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (!prefix.empty()) {
    out.emplace_back(prefix, value);
  }
}

/// The `hyperparameters` of a config.yaml, or null when it has none or does not parse.
DETTRIAL_INLINE Json config_hyperparameters(const std::string& yaml_text) {
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    if (doc.IsMap() && doc["hyperparameters"]) return yaml_to_json(doc["hyperparameters"]);
  } catch (const std::exception&) {
    // A config that does not parse: the page shows its text without the table.
  }
  return nullptr;
}

/// The series named `series_name` of the chart named `chart_name`, each made on first use (charts
/// and series keep the order they were first seen in).
DETTRIAL_INLINE Series& series_of(std::vector<Chart>& charts, const std::string& chart_name, const std::string& series_name) {
  auto chart = std::find_if(charts.begin(), charts.end(), [&](const Chart& c) { return c.name == chart_name; });
  if (chart == charts.end()) {
    charts.emplace_back();
    charts.back().name = chart_name;
    chart = std::prev(charts.end());
  }
  auto& list = chart->series;
  const auto found = std::find_if(list.begin(), list.end(), [&](const Series& s) { return s.name == series_name; });
  if (found != list.end()) return *found;
  list.emplace_back();
  list.back().name = series_name;
  return list.back();
}

/// A number, or a null (NaN) counted as skipped.
DETTRIAL_INLINE void add_value(Series& s, double x, const Json& value) {
  if (value.is_number()) {
    const double y = value.get<double>();
    if (std::isfinite(y)) {
      s.points.emplace_back(x, y);
      return;
    }
  }
  ++s.skipped;
}

DETTRIAL_INLINE std::string_view without_prefix(std::string_view name, std::initializer_list<std::string_view> prefixes) {
  for (const std::string_view p : prefixes)
    if (name.size() > p.size() && name.substr(0, p.size()) == p) return name.substr(p.size());
  return name;
}

/// The charts of a run's records: its metrics first (`*metric_charts` of them), then every other
/// numeric field.
DETTRIAL_INLINE std::vector<Chart> run_charts(const std::vector<Json>& records, std::size_t* metric_charts_count = nullptr) {
  // A validation metric joins the chart of the training metric of the same stem (validation_loss:
  // loss; validation_error: train_error), so the two curves compare at a glance.
  std::map<std::string, std::string, std::less<>> training_chart;  // stem -> the training metric's name
  std::set<std::string, std::less<>> training_names;
  const auto is_training = [](const Json& r) {
    const Json* type = json_find(r, "type");
    return type && type->is_string() && type->get_ref<const std::string&>() == "training";
  };
  // The records repeat their own `batches` and `epochs` among the metrics (as searchers' time
  // metrics): the x axis already shows them.
  const auto counter = [](const std::string& key) { return key == "batches" || key == "epochs"; };
  for (const Json& r : records) {
    const Json* metrics = json_find(r, "metrics");
    if (!is_training(r) || !metrics || !metrics->is_object()) continue;
    for (auto it = metrics->begin(); it != metrics->end(); ++it) {
      if (counter(it.key())) continue;
      training_names.insert(it.key());
      training_chart.try_emplace(std::string(without_prefix(it.key(), {"train_", "training_"})), it.key());
    }
  }
  std::vector<Chart> metric_charts, field_charts;
  for (const Json& r : records) {
    const Json* batches = json_find(r, "batches");
    if (!batches || !batches->is_number()) continue;  // nowhere on the x axis
    const double x = batches->get<double>();
    const bool training = is_training(r);
    const Json* type = json_find(r, "type");
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "record";
    if (const Json* metrics = json_find(r, "metrics"); metrics && metrics->is_object()) {
      for (auto it = metrics->begin(); it != metrics->end(); ++it) {
        const std::string& key = it.key();
        if (counter(key) || !(it.value().is_number() || it.value().is_null())) continue;
        std::string chart = key, series = key;
        if (!training) {
          if (const auto t = training_chart.find(without_prefix(key, {"validation_", "val_"})); t != training_chart.end()) chart = t->second;
          if (training_names.count(key)) series = key + " (" + kind + ")";  // the same name on both sides
        }
        Series& s = series_of(metric_charts, chart, series);
        s.marks = s.marks || !training;
        add_value(s, x, it.value());
      }
    }
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string& key = it.key();
      if (key == "type" || key == "batches" || key == "epochs" || key == "metrics") continue;
      const auto add = [&](const std::string& name, const Json& value) {
        Series& s = series_of(field_charts, key, training ? name : kind + " " + name);
        s.marks = s.marks || !training;
        add_value(s, x, value);
      };
      if (it.value().is_number() || it.value().is_null()) {
        add(key, it.value());
      } else if (it.value().is_object()) {  // {"seconds": {"data": .., "train_batch": ..}}, {"lr": {"group0": ..}}
        for (auto inner = it.value().begin(); inner != it.value().end(); ++inner)
          if (inner.value().is_number() || inner.value().is_null()) add(inner.key(), inner.value());
      }
    }
  }
  for (Chart& c : field_charts) {
    if (c.name == "samples_per_second") c.title = "throughput (samples per second)";
    else if (c.name == "seconds") c.title = "seconds (per report, by phase)";
    else if (c.name == "lr" || c.name == "learning_rates") c.title = "learning rate";
  }
  if (metric_charts_count) *metric_charts_count = metric_charts.size();
  metric_charts.insert(metric_charts.end(), std::make_move_iterator(field_charts.begin()), std::make_move_iterator(field_charts.end()));
  return metric_charts;
}

/// A table of name/value rows (hyperparameters).
DETTRIAL_INLINE std::string value_table(const std::vector<std::pair<std::string, Json>>& rows) {
  std::string out = "<table>\n";
  for (const auto& [name, value] : rows)
    out += "<tr><th class=\"text\">" + escape(name) + "</th><td class=\"" + (value.is_string() ? "text" : "") + "\">" +
           escape(value_text(value)) + "</td></tr>\n";
  return out + "</table>\n";
}

/// The hyperparameters of a run: its config.yaml's, else its latest checkpoint's load_data.json's.
DETTRIAL_INLINE Json run_hyperparameters(const std::filesystem::path& dir, const std::string& config_text) {
  if (!config_text.empty()) return config_hyperparameters(config_text);
  std::error_code ec;
  std::filesystem::path newest;
  std::filesystem::file_time_type newest_time{};
  for (std::filesystem::directory_iterator it(dir / layout::checkpoints, ec), end; !ec && it != end; it.increment(ec)) {
    const auto file = it->path() / layout::load_data;
    std::error_code time_ec;
    const auto time = std::filesystem::last_write_time(file, time_ec);
    if (!time_ec && (newest.empty() || time > newest_time)) {
      newest = file;
      newest_time = time;
    }
  }
  if (newest.empty()) return nullptr;
  try {
    const Json load_data = read_json_file(newest);
    if (const Json* hparams = json_find(load_data, "hparams")) return *hparams;
  } catch (const Error&) {
    // A damaged checkpoint: the page goes without the table.
  }
  return nullptr;
}

/// Whether `page` is missing or older than any of `sources` (that exist).
DETTRIAL_INLINE bool stale(const std::filesystem::path& page, std::initializer_list<std::filesystem::path> sources) {
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(page, ec);
  if (ec) return true;
  for (const auto& source : sources) {
    std::error_code source_ec;
    const auto changed = std::filesystem::last_write_time(source, source_ec);
    if (!source_ec && changed >= written) return true;
  }
  return false;
}

/// Fills in what `metric`, `smaller` (and `*name`) lack from a config's `searcher:` section; a config
/// that does not parse changes nothing.
DETTRIAL_INLINE void searcher_settings(const std::string& yaml_text, std::string& metric, std::optional<bool>& smaller,
                                       std::string* name = nullptr) {
  if (yaml_text.empty() || (!metric.empty() && smaller && (!name || !name->empty()))) return;
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    if (!doc.IsMap() || !doc["searcher"] || !doc["searcher"].IsMap()) return;
    const YAML::Node s = doc["searcher"];
    if (metric.empty() && s["metric"] && s["metric"].IsScalar()) metric = s["metric"].Scalar();
    if (name && name->empty() && s["name"] && s["name"].IsScalar()) *name = s["name"].Scalar();
    if (!smaller && s["smaller_is_better"] && s["smaller_is_better"].IsScalar()) smaller = s["smaller_is_better"].as<bool>();
  } catch (const std::exception&) {
    // The page goes without what the config would have said.
  }
}

/// One trial of a search as its page shows it.
struct TrialRow {
  std::int64_t id = 0;
  std::string state;
  std::optional<std::int64_t> batches, restarts, rung;
  std::vector<std::pair<std::string, Json>> hparams;
  std::optional<double> best, last;
  /// The searcher metric at each validation: (time metric, value).
  std::vector<std::pair<double, double>> curve;
  bool has_folder = false, has_page = false;
  std::string problem;  ///< why its own page could not be written
};

DETTRIAL_INLINE std::optional<std::int64_t> integer_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  if (v && (v->is_number_integer() || v->is_number_unsigned())) return v->get<std::int64_t>();
  return std::nullopt;
}

DETTRIAL_INLINE std::optional<double> number_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  if (v && v->is_number() && std::isfinite(v->get<double>())) return v->get<double>();
  return std::nullopt;
}

DETTRIAL_INLINE std::string string_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

/// A table header cell the script sorts by: `column` is the name `#sort=` takes.
DETTRIAL_INLINE std::string sortable_header(const std::string& column, const std::string& label, bool numeric) {
  return "<th data-column=\"" + escape(column) + "\" data-type=\"" + (numeric ? "number" : "text") + "\"" + (numeric ? "" : " class=\"text\"") +
         " title=\"sort by " + escape(label) + "\">" + escape(label) + "</th>";
}

DETTRIAL_INLINE std::string table_cell(const Json& value, const std::string& inner_html = {}) {
  return "<td" + std::string(value.is_string() ? " class=\"text\"" : "") + " data-value=\"" + escape(sort_key(value)) + "\">" +
         (inner_html.empty() ? escape(value_text(value)) : inner_html) + "</td>";
}

DETTRIAL_INLINE Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }
DETTRIAL_INLINE Json optional_json(const std::optional<std::int64_t>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace dettrial::detail::html

namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_run_report(const std::filesystem::path& run_dir) {
  namespace html = detail::html;
  using detail::Json;
  const std::filesystem::path metrics_path = run_dir / layout::metrics_log;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(metrics_path, ec))
    throw Error("'" + run_dir.string() + "' has no metrics.jsonl: nothing to report (a run's output folder has one)");
  bool torn = false;
  const std::vector<Json> records = html::read_jsonl(metrics_path, &torn);
  std::size_t metric_charts = 0;
  const std::vector<html::Chart> charts = html::run_charts(records, &metric_charts);

  std::int64_t trainings = 0, validations = 0;
  std::optional<std::int64_t> last_batches, last_epochs;
  for (const Json& r : records) {
    const std::string type = html::string_of(r, "type");
    trainings += type == "training";
    validations += type == "validation";
    if (const auto b = html::integer_of(r, "batches")) last_batches = std::max(last_batches.value_or(*b), *b);
    if (const auto e = html::integer_of(r, "epochs")) last_epochs = std::max(last_epochs.value_or(*e), *e);
  }
  std::filesystem::path absolute = std::filesystem::absolute(run_dir, ec).lexically_normal();
  if (absolute.filename().empty()) absolute = absolute.parent_path();  // "run/"
  const std::string name = absolute.filename().string();
  const bool trial_of_search = absolute.parent_path().filename() == layout::trials &&
                               (std::filesystem::exists(absolute.parent_path().parent_path() / layout::events_log, ec) ||
                                std::filesystem::exists(absolute.parent_path().parent_path() / layout::summary, ec));

  std::string header = "<h1>" + html::escape(trial_of_search ? "trial " + name : "run " + name) + "</h1>\n<p class=\"meta\">" +
                       html::escape(absolute.string()) + "</p>\n<p>" + std::to_string(trainings) + " training and " +
                       std::to_string(validations) + " validation reports";
  if (last_batches) header += "; trained to batch " + std::to_string(*last_batches);
  if (last_epochs) header += " (epoch " + std::to_string(*last_epochs) + ")";
  header += ".";
  if (trial_of_search) header += " <a href=\"../../report.html\">The search</a>.";
  header += "</p>\n";
  if (torn) header += "<p class=\"note\">The last line of metrics.jsonl is incomplete (the run stopped while writing it): it is left out.</p>\n";

  std::string content;
  if (records.empty()) content += "<p class=\"note\">metrics.jsonl holds no reports yet.</p>\n";
  if (!charts.empty()) content += "<h2>Charts</h2>\n" + html::figures(charts);

  // The last value of each series, and its range.
  std::string values;
  bool any_skipped = false;
  for (const auto& c : charts)
    for (const auto& s : c.series) any_skipped = any_skipped || s.skipped > 0;
  for (std::size_t i = 0; i < charts.size(); ++i)
    for (const auto& s : charts[i].series) {
      if (s.points.empty() && s.skipped == 0) continue;
      // A metric's name says what it is; a field's series ("data" of "seconds") needs the field's.
      const bool named = i < metric_charts || s.name.find(charts[i].name) != std::string::npos;
      values += "<tr><th class=\"text\">" + html::escape(named ? s.name : charts[i].name + ": " + s.name) + "</th>";
      if (s.points.empty()) {
        values += "<td></td><td></td><td></td><td></td>";
      } else {
        double low = s.points.front().second, high = low;
        for (const auto& p : s.points) {
          low = std::min(low, p.second);
          high = std::max(high, p.second);
        }
        values += "<td>" + html::general(s.points.back().second) + "</td><td>" + html::general(s.points.back().first) + "</td><td>" +
                  html::general(low) + "</td><td>" + html::general(high) + "</td>";
      }
      values += "<td>" + std::to_string(s.points.size()) + "</td>" + (any_skipped ? "<td>" + std::to_string(s.skipped) + "</td>" : "") + "</tr>\n";
    }
  if (!values.empty())
    content += "<h2>Last values</h2>\n<div class=\"scroll\"><table>\n<tr><th class=\"text\">series</th><th>last</th><th>at batch</th><th>min</th>"
            "<th>max</th><th>points</th>" + std::string(any_skipped ? "<th>null</th>" : "") + "</tr>\n" + values + "</table></div>\n";

  const std::string config_text = html::read_text(run_dir / layout::config);
  std::vector<std::pair<std::string, Json>> hparams;
  html::flatten(html::run_hyperparameters(run_dir, config_text), "", hparams);
  if (!hparams.empty()) content += "<h2>Hyperparameters</h2>\n" + html::value_table(hparams);
  content += html::config_section(layout::config, config_text);

  const std::filesystem::path out = run_dir / layout::report_page;
  detail::write_atomically(out, html::page((trial_of_search ? "trial " : "run ") + name, header, content));
  return out;
}

DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir) {
  std::error_code ec;
  const std::filesystem::path summary_path = experiment_dir / layout::summary;
  const bool has_summary = std::filesystem::is_regular_file(summary_path, ec);
  if (!has_summary && !std::filesystem::is_directory(experiment_dir / layout::trials, ec))
    throw Error("'" + experiment_dir.string() + "' has neither summary.json nor trials/: it is not a search's folder");
  return detail::html::write_experiment_page(experiment_dir, has_summary ? detail::read_json_file(summary_path) : detail::Json::object());
}

}  // namespace dettrial

namespace dettrial::detail::html {

DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path events_path = experiment_dir / layout::events_log, trials_dir = experiment_dir / layout::trials;
  const std::string config_text = html::read_text(experiment_dir / layout::config);

  // The search's settings: summary.json's, else the config's, else a trial's (below).
  std::string metric = html::string_of(summary, "metric"), searcher = html::string_of(summary, "searcher");
  std::optional<bool> smaller;
  if (const Json* s = detail::json_find(summary, "smaller_is_better"); s && s->is_boolean()) smaller = s->get<bool>();
  html::searcher_settings(config_text, metric, smaller, &searcher);
  std::string time_metric = html::string_of(summary, "time_metric");
  if (time_metric.empty()) time_metric = "batches";
  fs::path absolute = fs::absolute(experiment_dir, ec).lexically_normal();
  if (absolute.filename().empty()) absolute = absolute.parent_path();  // "experiment/"
  std::string name = html::string_of(summary, "experiment");
  if (name.empty()) name = absolute.filename().string();

  std::map<std::int64_t, html::TrialRow> rows;
  if (const Json* trials = detail::json_find(summary, "trials"); trials && trials->is_array()) {
    for (const Json& t : *trials) {
      const auto id = html::integer_of(t, "id");
      if (!id) continue;
      html::TrialRow& row = rows[*id];
      row.id = *id;
      row.state = html::string_of(t, "state");
      row.batches = html::integer_of(t, "batches_trained");
      row.restarts = html::integer_of(t, "restarts");
      row.rung = html::integer_of(t, "rung");
      if (const Json* h = detail::json_find(t, "hparams")) html::flatten(*h, "", row.hparams);
      row.best = html::number_of(t, "best_metric");
      row.last = html::number_of(t, "last_metric");
    }
  }
  // The event log: each validation the searcher was told of, and how trials ended (also for the
  // trials a summary written earlier does not know yet).
  bool torn = false;
  std::map<std::int64_t, std::string> ended;
  std::map<std::int64_t, std::int64_t> restarts, event_batches, event_rungs;
  std::map<std::int64_t, std::vector<std::pair<double, double>>> curves;
  if (fs::is_regular_file(events_path, ec)) {
    for (const Json& e : html::read_jsonl(events_path, &torn)) {
      const auto id = html::integer_of(e, "trial");
      if (!id) continue;
      const std::string kind = html::string_of(e, "event");
      if (kind == "validation") {
        const auto value = html::number_of(e, "metric");
        auto time = html::number_of(e, "time");
        const auto batches = html::integer_of(e, "batches");
        if (!time && batches) time = static_cast<double>(*batches);
        if (value && time) curves[*id].emplace_back(*time, *value);
        if (batches) event_batches[*id] = std::max(event_batches[*id], *batches);
        if (const auto rung = html::integer_of(e, "rung")) {
          const auto [slot, added] = event_rungs.try_emplace(*id, *rung);
          if (!added) slot->second = std::max(slot->second, *rung);
        }
      } else if (kind == "end") {
        ended[*id] = html::string_of(e, "state");
        if (const auto r = html::integer_of(e, "restarts")) restarts[*id] = *r;
      } else if (kind == "restart") {
        if (const auto r = html::integer_of(e, "restarts")) restarts[*id] = *r;
      }
    }
  }
  for (fs::directory_iterator it(trials_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string folder = it->path().filename().string();
    if (folder.empty() || folder.find_first_not_of("0123456789") != std::string::npos || folder.size() > 18) continue;
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    const std::int64_t id = std::stoll(folder);
    rows[id].id = id;
    rows[id].has_folder = true;
  }

  // A trial's config names the searcher metric too (its searcher is `single`, not the search's).
  for (const auto& [id, row] : rows)
    if (row.has_folder && (metric.empty() || !smaller)) html::searcher_settings(html::read_text(trials_dir / std::to_string(id) / layout::config), metric, smaller);
  const bool smaller_is_better = smaller.value_or(true);

  std::vector<std::string> notes;
  if (torn) notes.push_back("The last line of events.jsonl is incomplete (the runner stopped while writing it): it is left out.");
  for (auto& [id, row] : rows) {
    const fs::path folder = trials_dir / std::to_string(id);
    if (row.state.empty()) {
      if (const auto e = ended.find(id); e != ended.end()) row.state = e->second;
      else row.state = fs::exists(folder / layout::metrics_log, ec) ? "RUNNING" : "QUEUED";
    }
    if (!row.restarts && restarts.count(id)) row.restarts = restarts[id];
    if (!row.rung && event_rungs.count(id)) row.rung = event_rungs[id];
    if (row.hparams.empty() && row.has_folder)
      html::flatten(html::config_hyperparameters(html::read_text(folder / layout::config)), "", row.hparams);
    if (const auto c = curves.find(id); c != curves.end()) row.curve = c->second;
    const bool has_metrics = row.has_folder && fs::is_regular_file(folder / layout::metrics_log, ec);
    if (row.curve.empty() && has_metrics && !metric.empty()) {
      // No event log (or not this trial's): the searcher metric from the trial's own records.
      try {
        for (const Json& r : html::read_jsonl(folder / layout::metrics_log)) {
          if (html::string_of(r, "type") != "validation") continue;
          const Json* metrics = detail::json_find(r, "metrics");
          const auto value = metrics ? html::number_of(*metrics, metric.c_str()) : std::nullopt;
          auto time = metrics ? html::number_of(*metrics, time_metric.c_str()) : std::nullopt;
          if (!time) time = html::number_of(r, "batches");
          if (value && time) row.curve.emplace_back(*time, *value);
          if (const auto b = html::integer_of(r, "batches")) event_batches[id] = std::max(event_batches[id], *b);
        }
      } catch (const Error& e) {
        row.problem = e.what();
      }
    }
    // summary.json's count is at the last checkpoint; a validation may have come after it.
    if (event_batches.count(id)) row.batches = std::max(row.batches.value_or(0), event_batches[id]);
    if (!row.curve.empty()) {
      if (!row.last) row.last = row.curve.back().second;
      if (!row.best)
        for (const auto& p : row.curve)
          if (!row.best || (smaller_is_better ? p.second < *row.best : p.second > *row.best)) row.best = p.second;
    }
    // The trial's own page, where its metrics changed since it was written.
    if (has_metrics && row.problem.empty()) {
      try {
        if (html::stale(folder / layout::report_page, {folder / layout::metrics_log, folder / layout::config})) write_run_report(folder);
      } catch (const Error& e) {
        row.problem = e.what();
      }
    }
    row.has_page = fs::is_regular_file(folder / layout::report_page, ec);
    if (!row.problem.empty()) notes.push_back("trial " + std::to_string(id) + ": " + row.problem);
  }

  std::optional<std::int64_t> best_trial = html::integer_of(summary, "best_trial");
  if (!best_trial)
    for (const auto& [id, row] : rows)
      if (row.best && (!best_trial || (smaller_is_better ? *row.best < *rows.at(*best_trial).best : *row.best > *rows.at(*best_trial).best)))
        best_trial = id;
  if (best_trial && !rows.count(*best_trial)) best_trial.reset();

  // ---- the header: what the search is and where it stands
  std::map<std::string, std::int64_t> states;
  for (const auto& [id, row] : rows) ++states[row.state];
  std::string header = "<h1>search " + html::escape(name) + "</h1>\n<p class=\"meta\">" + html::escape(absolute.string()) + "</p>\n<p>";
  if (!searcher.empty()) header += "Searcher <b>" + html::escape(searcher) + "</b>";
  if (!metric.empty())
    header += std::string(searcher.empty() ? "Metric" : ", metric") + " <b>" + html::escape(metric) + "</b> (" +
              (smaller_is_better ? "smaller" : "larger") + " is better)";
  if (const auto max_trials = html::integer_of(summary, "max_trials"))
    header += std::string(searcher.empty() && metric.empty() ? "" : "; ") + "at most " + std::to_string(*max_trials) + " trials";
  header += ".</p>\n<p>" + std::to_string(rows.size()) + " trial" + (rows.size() == 1 ? "" : "s");
  std::string counts;
  for (const auto& [state, n] : states)
    counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " <span class=\"state-" + html::escape(state) + "\">" + html::escape(state) + "</span>";
  if (!counts.empty()) header += ": " + counts;
  if (best_trial) {
    header += ". Best: trial " + std::to_string(*best_trial);
    if (rows.at(*best_trial).best) header += " (" + html::escape(metric) + " " + html::general(*rows.at(*best_trial).best) + ")";
  }
  header += ".</p>\n";
  for (const auto& note : notes) header += "<p class=\"note\">" + html::escape(note) + "</p>\n";

  // ---- the searcher metric of every trial, with ASHA's rungs
  std::vector<html::Chart> charts;
  html::Chart curves_chart;
  curves_chart.name = metric.empty() ? "searcher metric" : metric;
  curves_chart.title = (metric.empty() ? std::string("searcher metric") : metric) + " at each validation, by trial";
  curves_chart.x_label = time_metric;
  std::size_t index = 0;
  std::map<std::int64_t, std::string> colors;  // one colour per trial, on every chart
  for (const auto& [id, row] : rows) {
    colors[id] = html::palette(index++);
    if (row.curve.empty()) continue;
    html::Series s;
    s.name = "trial " + std::to_string(id);
    s.points = row.curve;
    s.marks = true;
    s.stopped = row.state == "STOPPED_EARLY";
    s.color = colors[id];
    curves_chart.series.push_back(std::move(s));
  }
  if (const Json* brackets = detail::json_find(summary, "brackets"); brackets && brackets->is_array()) {
    std::set<std::int64_t> lengths;
    for (const Json& b : *brackets)
      if (const Json* rungs = detail::json_find(b, "rungs"); rungs && rungs->is_array())
        for (const Json& r : *rungs)
          if (r.is_number_integer()) lengths.insert(r.get<std::int64_t>());
    // One bracket: its rungs by number; several: by length only (the same number means different lengths).
    const bool numbered = brackets->size() == 1;
    std::int64_t k = 0;
    for (const auto length : lengths)
      curves_chart.x_marks.emplace_back(static_cast<double>(length), numbered ? "rung " + std::to_string(++k) : std::to_string(length));
  }
  charts.push_back(std::move(curves_chart));

  // ---- the table's columns: the trial's record, each hyperparameter (by its dotted name), its metric
  std::vector<std::string> hparam_names;
  for (const auto& [id, row] : rows)
    for (const auto& [hp, value] : row.hparams)
      if (std::find(hparam_names.begin(), hparam_names.end(), hp) == hparam_names.end()) hparam_names.push_back(hp);
  const auto hparam_of = [](const html::TrialRow& row, const std::string& hp) -> Json {
    for (const auto& [n, v] : row.hparams)
      if (n == hp) return v;
    return nullptr;
  };
  const bool has_rungs = std::any_of(rows.begin(), rows.end(), [](const auto& kv) { return kv.second.rung.has_value(); });
  const std::set<std::string> fixed_columns = {"trial", "state", "batches", "restarts", "rung", "best", "last"};
  const auto column_of = [&](const std::string& hp) { return fixed_columns.count(hp) ? "hparams." + hp : hp; };

  // ---- the best metric against each numeric hyperparameter that varies
  for (const auto& hp : hparam_names) {
    html::Chart scatter;
    scatter.name = (metric.empty() ? std::string("metric") : metric) + " vs " + hp;
    scatter.title = "best " + (metric.empty() ? std::string("metric") : metric) + " by " + hp;
    scatter.x_label = hp;
    scatter.scatter = true;
    scatter.legend = false;
    bool numeric = true;
    std::set<double> values;
    double low = std::numeric_limits<double>::infinity(), high = -low;
    for (const auto& [id, row] : rows) {
      const Json v = hparam_of(row, hp);
      if (v.is_null()) continue;
      if (!v.is_number()) {
        numeric = false;
        break;
      }
      const double x = v.get<double>();
      values.insert(x);
      low = std::min(low, x);
      high = std::max(high, x);
      if (!row.best) continue;
      html::Series s;
      s.name = "trial " + std::to_string(id);
      s.points.emplace_back(x, *row.best);
      s.color = colors[id];
      scatter.series.push_back(std::move(s));
    }
    if (!numeric || values.size() < 2 || scatter.series.empty()) continue;
    scatter.log_x = low > 0 && high / low >= 100;  // learning rates and the like, drawn from log spaces
    charts.push_back(std::move(scatter));
  }

  std::string table = "<div class=\"scroll\"><table id=\"trials\" class=\"sortable\">\n<thead><tr>" +
                      html::sortable_header("trial", "trial", true) + html::sortable_header("state", "state", false) +
                      html::sortable_header("batches", "batches", true) + html::sortable_header("restarts", "restarts", true);
  if (has_rungs) table += html::sortable_header("rung", "rung", true);
  for (const auto& hp : hparam_names) {
    const bool numeric = std::all_of(rows.begin(), rows.end(), [&](const auto& kv) {
      const Json v = hparam_of(kv.second, hp);
      return v.is_null() || v.is_number();
    });
    table += html::sortable_header(column_of(hp), hp, numeric);
  }
  const std::string metric_label = metric.empty() ? std::string("metric") : metric;
  table += html::sortable_header("best", "best " + metric_label, true) + html::sortable_header("last", "last " + metric_label, true) +
           "</tr></thead>\n<tbody>\n";
  for (const auto& [id, row] : rows) {
    table += "<tr data-trial=\"" + std::to_string(id) + "\"" + (best_trial && *best_trial == id ? " class=\"best\"" : "") + ">";
    const std::string link = "trials/" + std::to_string(id) + "/report.html";
    table += html::table_cell(Json(id), "<span style=\"color:" + colors[id] + "\">&#9632;</span> " +
                                            (row.has_page ? "<a href=\"" + link + "\">" + std::to_string(id) + "</a>" : std::to_string(id)));
    table += html::table_cell(Json(row.state), "<span class=\"state-" + html::escape(row.state) + "\">" + html::escape(row.state) + "</span>");
    table += html::table_cell(html::optional_json(row.batches)) + html::table_cell(html::optional_json(row.restarts));
    if (has_rungs)  // shown from 1, as the chart numbers them
      table += html::table_cell(html::optional_json(row.rung ? std::optional<std::int64_t>(*row.rung + 1) : std::nullopt));
    for (const auto& hp : hparam_names) table += html::table_cell(hparam_of(row, hp));
    table += html::table_cell(html::optional_json(row.best)) + html::table_cell(html::optional_json(row.last)) + "</tr>\n";
  }
  table += "</tbody>\n</table></div>\n";

  std::string content;
  if (rows.empty()) content += "<p class=\"note\">No trial has started yet.</p>\n";
  content += "<h2>Trials</h2>\n<p class=\"meta\">Click a column to sort by it; a trial's number opens its own page.</p>\n" + table;
  content += "<h2>Charts</h2>\n" + html::figures(charts);
  content += html::config_section(layout::config, config_text);

  const fs::path out = experiment_dir / layout::report_page;
  detail::write_atomically(out, html::page("search " + name, header, content));
  return out;
}

}  // namespace dettrial::detail::html

namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw Error("'" + dir.string() + "' is not a folder: nothing to report");
  if (std::filesystem::is_regular_file(dir / layout::summary, ec) || std::filesystem::is_directory(dir / layout::trials, ec))
    return write_experiment_report(dir);
  if (std::filesystem::is_regular_file(dir / layout::metrics_log, ec)) return write_run_report(dir);
  throw Error("'" + dir.string() + "' holds no metrics.jsonl (a run's folder) and no summary.json or trials/ (a search's folder): nothing to report");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
