// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A run's report.html: a chart per metric and per numeric field of its metrics.jsonl, the last
/// values, its hyperparameters and config.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../../layout.hpp"
#include "../../error.hpp"
#include "../../detail/atomic_file.hpp"
#include "../../detail/json_fwd.hpp"
#include "../../detail/jsonl.hpp"
#include "detail/chart.hpp"
#include "detail/page.hpp"
#include "../../detail/linkage.hpp"

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

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../detail/json.hpp"

namespace dettrial::detail::html {

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

/// The title of the chart of a record's field: what it measures, in its units (empty: the name says it).
DETTRIAL_INLINE std::string field_chart_title(std::string_view field) {
  // The trainer's fields, and the system metrics' (profiling.enabled) in Determined's units.
  static const std::pair<const char*, const char*> titles[] = {{"samples_per_second", "throughput (samples per second)"},
                                                               {"seconds", "seconds (per report, by phase)"},
                                                               {"lr", "learning rate"},
                                                               {"learning_rates", "learning rate"},
                                                               {"cpu_util_simple", "CPU utilization (percent of all cores)"},
                                                               {"memory_free", "free memory (GB)"},
                                                               {"disk_iops", "disk operations per second"},
                                                               {"disk_throughput_read", "disk reads (bytes per second)"},
                                                               {"disk_throughput_write", "disk writes (bytes per second)"},
                                                               {"disk_util", "disk use (percent of the run folder's file system)"},
                                                               {"net_throughput_sent", "network sent (bytes per second)"},
                                                               {"net_throughput_recv", "network received (bytes per second)"},
                                                               {"gpu_util", "GPU utilization (percent), by GPU"},
                                                               {"gpu_free_memory", "GPU free memory (bytes), by GPU"}};
  for (const auto& [name, title] : titles)
    if (field == name) return title;
  return {};
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
    if (string_of(r, "type") == "restart") continue;  // listed under the header, not charted
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
          if (const auto t = training_chart.find(without_prefix(key, {"validation_", "val_"})); t != training_chart.end())
            chart = t->second;
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
  for (Chart& c : field_charts) c.title = field_chart_title(c.name);
  if (metric_charts_count) *metric_charts_count = metric_charts.size();
  metric_charts.insert(metric_charts.end(), std::make_move_iterator(field_charts.begin()), std::make_move_iterator(field_charts.end()));
  return metric_charts;
}

/// The hyperparameters of a run: its config.yaml's, else its latest checkpoint's load_data.json's.
DETTRIAL_INLINE Json run_hyperparameters(const std::filesystem::path& dir, const std::string& config_text) {
  if (!config_text.empty()) return config_hyperparameters(config_text);
  std::error_code ec;
  std::filesystem::path newest;
  std::filesystem::file_time_type newest_time{};
  for (std::filesystem::directory_iterator it(RunFolder{dir}.checkpoints(), ec), end; !ec && it != end; it.increment(ec)) {
    const auto file = CheckpointFolder{it->path()}.load_data();
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

}  // namespace dettrial::detail::html

namespace dettrial::detail::html {

/// The last value of each series of a run's charts, with its range and counts, as a table (empty
/// when no series has a value).
DETTRIAL_INLINE std::string last_values_table(const std::vector<Chart>& charts, std::size_t metric_charts) {
  std::string values;
  bool any_skipped = false;
  for (const auto& c : charts)
    for (const auto& s : c.series) any_skipped = any_skipped || s.skipped > 0;
  for (std::size_t i = 0; i < charts.size(); ++i)
    for (const auto& s : charts[i].series) {
      if (s.points.empty() && s.skipped == 0) continue;
      // A metric's name says what it is; a field's series ("data" of "seconds") needs the field's.
      const bool named = i < metric_charts || s.name.find(charts[i].name) != std::string::npos;
      values += "<tr><th class=\"text\">" + escape(named ? s.name : charts[i].name + ": " + s.name) + "</th>";
      if (s.points.empty()) {
        values += "<td></td><td></td><td></td><td></td>";
      } else {
        double low = s.points.front().second, high = low;
        for (const auto& p : s.points) {
          low = std::min(low, p.second);
          high = std::max(high, p.second);
        }
        values += "<td>" + general(s.points.back().second) + "</td><td>" + general(s.points.back().first) + "</td><td>" + general(low) +
                  "</td><td>" + general(high) + "</td>";
      }
      values += "<td>" + std::to_string(s.points.size()) + "</td>" + (any_skipped ? "<td>" + std::to_string(s.skipped) + "</td>" : "") +
                "</tr>\n";
    }
  if (values.empty()) return values;
  return "<h2>Last values</h2>\n<div class=\"scroll\"><table>\n<tr><th class=\"text\">series</th><th>last</th><th>at batch</th><th>min</th>"
         "<th>max</th><th>points</th>" +
         std::string(any_skipped ? "<th>null</th>" : "") + "</tr>\n" + values + "</table></div>\n";
}

/// The run page's header: its name and folder, how many reports it holds and how far it trained.
DETTRIAL_INLINE std::string run_header(const std::vector<Json>& records, const std::filesystem::path& absolute, bool trial_of_search,
                                       bool torn) {
  std::int64_t trainings = 0, validations = 0;
  std::optional<std::int64_t> last_batches, last_epochs;
  for (const Json& r : records) {
    const std::string type = string_of(r, "type");
    trainings += type == "training";
    validations += type == "validation";
    if (const auto b = integer_of(r, "batches")) last_batches = std::max(last_batches.value_or(*b), *b);
    if (const auto e = integer_of(r, "epochs")) last_epochs = std::max(last_epochs.value_or(*e), *e);
  }
  const std::string name = absolute.filename().string();
  std::string header = "<h1>" + escape(trial_of_search ? "trial " + name : "run " + name) + "</h1>\n<p class=\"meta\">" +
                       escape(absolute.string()) + "</p>\n<p>" + std::to_string(trainings) + " training and " +
                       std::to_string(validations) + " validation reports";
  if (last_batches) header += "; trained to batch " + std::to_string(*last_batches);
  if (last_epochs) header += " (epoch " + std::to_string(*last_epochs) + ")";
  header += ".";
  if (trial_of_search) header += " <a href=\"../../report.html\">The search</a>.";
  header += "</p>\n";
  // Restarts and resumes on another rank count: when, and on how many ranks.
  std::string restarts;
  for (const Json& r : records) {
    if (string_of(r, "type") != "restart") continue;
    const auto batches = integer_of(r, "batches"), before = integer_of(r, "ranks_before"), ranks = integer_of(r, "ranks");
    const auto count = integer_of(r, "restart");
    restarts += std::string(restarts.empty() ? "" : "; ") + "at batch " + std::to_string(batches.value_or(0)) + ", " +
                (count ? "restart " + std::to_string(*count) : std::string("resumed")) + " on " + std::to_string(ranks.value_or(0)) +
                " rank(s)" + (before && ranks && *before != *ranks ? " (the checkpoint's job had " + std::to_string(*before) + ")" : "");
  }
  if (!restarts.empty()) header += "<p class=\"meta\">Continued " + escape(restarts) + ".</p>\n";
  if (torn)
    header += "<p class=\"note\">The last line of metrics.jsonl is incomplete (the run stopped while writing it): it is left out.</p>\n";
  return header;
}

}  // namespace dettrial::detail::html

namespace dettrial {
DETTRIAL_INLINE std::filesystem::path write_run_report(const std::filesystem::path& run_dir) {
  namespace html = detail::html;
  using detail::Json;
  const std::filesystem::path metrics_path = RunFolder{run_dir}.metrics_log();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(metrics_path, ec))
    throw Error("'" + run_dir.string() + "' has no metrics.jsonl: nothing to report (a run's output folder has one)");
  bool torn = false;
  const std::vector<Json> records = detail::JsonlFile(metrics_path).read(&torn);
  std::size_t metric_charts = 0;
  const std::vector<html::Chart> charts = html::run_charts(records, &metric_charts);

  std::filesystem::path absolute = std::filesystem::absolute(run_dir, ec).lexically_normal();
  if (absolute.filename().empty()) absolute = absolute.parent_path();  // "run/"
  const std::string name = absolute.filename().string();
  const bool trial_of_search = absolute.parent_path().filename() == layout::trials &&
                               (std::filesystem::exists(ExperimentFolder{absolute.parent_path().parent_path()}.events_log(), ec) ||
                                std::filesystem::exists(ExperimentFolder{absolute.parent_path().parent_path()}.summary(), ec));
  const std::string header = html::run_header(records, absolute, trial_of_search, torn);

  std::string content;
  if (records.empty()) content += "<p class=\"note\">metrics.jsonl holds no reports yet.</p>\n";
  if (!charts.empty()) content += "<h2>Charts</h2>\n" + html::figures(charts);
  content += html::last_values_table(charts, metric_charts);

  const std::string config_text = html::read_text(RunFolder{run_dir}.config());
  std::vector<std::pair<std::string, Json>> hparams;
  html::flatten(html::run_hyperparameters(run_dir, config_text), "", hparams);
  if (!hparams.empty()) content += "<h2>Hyperparameters</h2>\n" + html::value_table(hparams);
  content += html::config_section(layout::config, config_text);

  const std::filesystem::path out = RunFolder{run_dir}.report_page();
  detail::write_atomically(out, html::page((trial_of_search ? "trial " : "run ") + name, header, content));
  return out;
}
}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
