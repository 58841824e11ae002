// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A search's report.html: every trial's searcher metric on one chart with ASHA's rungs, the trials'
/// sortable table, the best metric against each hyperparameter; each trial's own page kept current.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "../../layout.hpp"
#include "../../error.hpp"
#include "../../detail/atomic_file.hpp"
#include "../../detail/json_fwd.hpp"
#include "../../detail/jsonl.hpp"
#include "../../vocabulary/search_event.hpp"
#include "../../vocabulary/metric_order.hpp"
#include "detail/chart.hpp"
#include "detail/page.hpp"
#include "run_page.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief Writes `<experiment_dir>/report.html` for a search (the folder the experiment runner
 * writes: summary.json, events.jsonl, trials/<id>/) and returns its path: every trial's searcher
 * metric on one chart, with ASHA's rungs and the trials it stopped marked; the trials' table,
 * sortable; the best metric against each numeric hyperparameter. Each trial's own page
 * (`trials/<id>/report.html`) is written where it is missing or older than its metrics, and linked.
 * Works on a search still running (from events.jsonl and the trials' folders).
 */
DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir);

}  // namespace dettrial

namespace dettrial::detail::html {

/// write_experiment_report with the search's summary given, in summary.json's form, rather than read
/// from the folder: the runner's own, while the search runs (an empty object: none).
DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary);

}  // namespace dettrial::detail::html

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../detail/json.hpp"

namespace dettrial::detail::html {

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

// ---- collecting: what the search's folder says, before anything is drawn ---------------------------

/// What a search's page shows.
struct SearchPage {
  std::string name;  ///< summary.json's experiment, else the folder's name
  std::filesystem::path absolute;
  std::string config_text;  ///< the experiment's config.yaml
  std::string metric, searcher, time_metric;
  MetricOrder order;  ///< the searcher metric's direction
  std::map<std::int64_t, TrialRow> rows;
  std::vector<std::string> notes;
  std::optional<std::int64_t> best_trial;
};

/// What events.jsonl says of each trial (also of trials a summary written earlier does not know yet).
struct SearchEvents {
  bool torn = false;
  std::map<std::int64_t, std::string> ended;
  std::map<std::int64_t, std::int64_t> restarts, batches, rungs;
  /// Each validation the searcher was told of: (time metric, value).
  std::map<std::int64_t, std::vector<std::pair<double, double>>> curves;
};

DETTRIAL_INLINE void rows_from_summary(const Json& summary, std::map<std::int64_t, TrialRow>& rows) {
  const Json* trials = detail::json_find(summary, "trials");
  if (!trials || !trials->is_array()) return;
  for (const Json& t : *trials) {
    const auto id = integer_of(t, "id");
    if (!id) continue;
    TrialRow& row = rows[*id];
    row.id = *id;
    row.state = string_of(t, "state");
    row.batches = integer_of(t, "batches_trained");
    row.restarts = integer_of(t, "restarts");
    row.rung = integer_of(t, "rung");
    if (const Json* h = detail::json_find(t, "hparams")) flatten(*h, "", row.hparams);
    row.best = number_of(t, "best_metric");
    row.last = number_of(t, "last_metric");
  }
}

DETTRIAL_INLINE SearchEvents read_search_events(const std::filesystem::path& events_path) {
  SearchEvents events;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(events_path, ec)) return events;
  for (const Json& line : JsonlFile(events_path).read(&events.torn)) {
    // Read as the runner writes them; an event it would refuse is left off the page.
    std::optional<SearchEvent> event;
    try {
      event = SearchEvent::from_json(line);
    } catch (const JsonFieldError&) {
      continue;
    }
    const std::int64_t id = event->trial;
    if (const auto* v = std::get_if<SearchEvent::Validation>(&event->what)) {
      events.curves[id].emplace_back(v->time, v->metric);
      if (v->batches) events.batches[id] = std::max(events.batches[id], *v->batches);
      if (v->rung) {
        const auto [slot, added] = events.rungs.try_emplace(id, *v->rung);
        if (!added) slot->second = std::max(slot->second, *v->rung);
      }
    } else if (const auto* r = std::get_if<SearchEvent::Restart>(&event->what)) {
      events.restarts[id] = r->restarts;
    } else {
      const auto& end = std::get<SearchEvent::End>(event->what);
      events.ended[id] = to_string(end.state);
      events.restarts[id] = end.restarts;
    }
  }
  return events;
}

/// A row for each trial folder (trials/<id>/).
DETTRIAL_INLINE void rows_from_trial_folders(const std::filesystem::path& trials_dir, std::map<std::int64_t, TrialRow>& rows) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(trials_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string folder = it->path().filename().string();
    if (folder.empty() || folder.find_first_not_of("0123456789") != std::string::npos || folder.size() > 18) continue;
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    const std::int64_t id = std::stoll(folder);
    rows[id].id = id;
    rows[id].has_folder = true;
  }
}

/// The searcher metric at each validation from a trial's own records (when the event log lacks it).
DETTRIAL_INLINE void curve_from_metrics(TrialRow& row, const std::filesystem::path& metrics_log, const SearchPage& search,
                                        std::map<std::int64_t, std::int64_t>& batches) {
  try {
    for (const Json& r : JsonlFile(metrics_log).read()) {
      if (string_of(r, "type") != "validation") continue;
      if (const auto b = integer_of(r, "batches")) batches[row.id] = std::max(batches[row.id], *b);
      const Json* metrics = detail::json_find(r, "metrics");
      if (!metrics) continue;
      const std::optional<double> value = number_of(*metrics, search.metric.c_str());
      std::optional<double> time = number_of(*metrics, search.time_metric.c_str());
      if (!time) time = number_of(r, "batches");
      if (value && time) row.curve.emplace_back(*time, *value);
    }
  } catch (const Error& e) {
    row.problem = e.what();
  }
}

/// Fills in what a trial's row lacks from the events and its folder, and writes the trial's own
/// page where its metrics changed since it was written.
DETTRIAL_INLINE void complete_row(TrialRow& row, const std::filesystem::path& folder, const SearchPage& search, SearchEvents& events) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const RunFolder run{folder};
  const std::int64_t id = row.id;
  if (row.state.empty()) {
    if (const auto e = events.ended.find(id); e != events.ended.end()) row.state = e->second;
    else row.state = fs::exists(run.metrics_log(), ec) ? "RUNNING" : "QUEUED";
  }
  if (!row.restarts && events.restarts.count(id)) row.restarts = events.restarts[id];
  if (!row.rung && events.rungs.count(id)) row.rung = events.rungs[id];
  if (row.hparams.empty() && row.has_folder) flatten(config_hyperparameters(read_text(run.config())), "", row.hparams);
  if (const auto c = events.curves.find(id); c != events.curves.end()) row.curve = c->second;
  const bool has_metrics = row.has_folder && fs::is_regular_file(run.metrics_log(), ec);
  if (row.curve.empty() && has_metrics && !search.metric.empty()) curve_from_metrics(row, run.metrics_log(), search, events.batches);
  // summary.json's count is at the last checkpoint; a validation may have come after it.
  if (events.batches.count(id)) row.batches = std::max(row.batches.value_or(0), events.batches[id]);
  if (!row.curve.empty()) {
    if (!row.last) row.last = row.curve.back().second;
    if (!row.best)
      for (const auto& p : row.curve)
        if (search.order.improves(p.second, row.best)) row.best = p.second;
  }
  if (has_metrics && row.problem.empty()) {
    try {
      if (stale(run.report_page(), {run.metrics_log(), run.config()})) write_run_report(folder);
    } catch (const Error& e) {
      row.problem = e.what();
    }
  }
  row.has_page = fs::is_regular_file(run.report_page(), ec);
}

/// The search's settings (summary.json's, else the config's, else a trial's), and every trial.
DETTRIAL_INLINE SearchPage collect_search(const std::filesystem::path& experiment_dir, const Json& summary) {
  namespace fs = std::filesystem;
  std::error_code ec;
  SearchPage search;
  const ExperimentFolder experiment{experiment_dir};
  const fs::path trials_dir = experiment.trials();
  search.config_text = read_text(experiment.config());
  search.metric = string_of(summary, "metric");
  search.searcher = string_of(summary, "searcher");
  std::optional<bool> smaller;
  if (const Json* s = detail::json_find(summary, "smaller_is_better"); s && s->is_boolean()) smaller = s->get<bool>();
  searcher_settings(search.config_text, search.metric, smaller, &search.searcher);
  search.time_metric = string_of(summary, "time_metric");
  if (search.time_metric.empty()) search.time_metric = "batches";
  search.absolute = fs::absolute(experiment_dir, ec).lexically_normal();
  if (search.absolute.filename().empty()) search.absolute = search.absolute.parent_path();  // "experiment/"
  search.name = string_of(summary, "experiment");
  if (search.name.empty()) search.name = search.absolute.filename().string();

  rows_from_summary(summary, search.rows);
  SearchEvents events = read_search_events(experiment.events_log());
  rows_from_trial_folders(trials_dir, search.rows);
  // A trial's config names the searcher metric too (its searcher is `single`, not the search's).
  for (const auto& [id, row] : search.rows)
    if (row.has_folder && (search.metric.empty() || !smaller))
      searcher_settings(read_text(experiment.trial(id).config()), search.metric, smaller);
  search.order = MetricOrder{smaller.value_or(true)};

  if (events.torn)
    search.notes.push_back("The last line of events.jsonl is incomplete (the runner stopped while writing it): it is left out.");
  for (auto& [id, row] : search.rows) {
    complete_row(row, trials_dir / std::to_string(id), search, events);
    if (!row.problem.empty()) search.notes.push_back("trial " + std::to_string(id) + ": " + row.problem);
  }
  search.best_trial = integer_of(summary, "best_trial");
  if (!search.best_trial)
    for (const auto& [id, row] : search.rows)
      if (row.best && (!search.best_trial || search.order.better(*row.best, *search.rows.at(*search.best_trial).best)))
        search.best_trial = id;
  if (search.best_trial && !search.rows.count(*search.best_trial)) search.best_trial.reset();
  return search;
}

// ---- rendering ---------------------------------------------------------------------------------

/// What the search is and where it stands.
DETTRIAL_INLINE std::string search_header(const SearchPage& search, const Json& summary) {
  std::map<std::string, std::int64_t> states;
  for (const auto& [id, row] : search.rows) ++states[row.state];
  std::string header = "<h1>search " + escape(search.name) + "</h1>\n<p class=\"meta\">" + escape(search.absolute.string()) + "</p>\n<p>";
  if (!search.searcher.empty()) header += "Searcher <b>" + escape(search.searcher) + "</b>";
  if (!search.metric.empty())
    header += std::string(search.searcher.empty() ? "Metric" : ", metric") + " <b>" + escape(search.metric) + "</b> (" +
              (search.order.smaller_is_better ? "smaller" : "larger") + " is better)";
  if (const auto max_trials = integer_of(summary, "max_trials"))
    header +=
        std::string(search.searcher.empty() && search.metric.empty() ? "" : "; ") + "at most " + std::to_string(*max_trials) + " trials";
  header += ".</p>\n<p>" + std::to_string(search.rows.size()) + " trial" + (search.rows.size() == 1 ? "" : "s");
  std::string counts;
  for (const auto& [state, n] : states)
    counts +=
        (counts.empty() ? "" : ", ") + std::to_string(n) + " <span class=\"state-" + escape(state) + "\">" + escape(state) + "</span>";
  if (!counts.empty()) header += ": " + counts;
  if (search.best_trial) {
    header += ". Best: trial " + std::to_string(*search.best_trial);
    if (const auto& best = search.rows.at(*search.best_trial).best) header += " (" + escape(search.metric) + " " + general(*best) + ")";
  }
  header += ".</p>\n";
  for (const auto& note : search.notes) header += "<p class=\"note\">" + escape(note) + "</p>\n";
  return header;
}

/// The searcher metric of every trial, with ASHA's rungs.
DETTRIAL_INLINE Chart search_curves(const SearchPage& search, const Json& summary, const std::map<std::int64_t, std::string>& colors) {
  Chart chart;
  chart.name = search.metric.empty() ? "searcher metric" : search.metric;
  chart.title = (search.metric.empty() ? std::string("searcher metric") : search.metric) + " at each validation, by trial";
  chart.x_label = search.time_metric;
  for (const auto& [id, row] : search.rows) {
    if (row.curve.empty()) continue;
    Series s;
    s.name = "trial " + std::to_string(id);
    s.points = row.curve;
    s.marks = true;
    s.stopped = row.state == "STOPPED_EARLY";
    s.color = colors.at(id);
    chart.series.push_back(std::move(s));
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
      chart.x_marks.emplace_back(static_cast<double>(length), numbered ? "rung " + std::to_string(++k) : std::to_string(length));
  }
  return chart;
}

/// Every hyperparameter of the trials by its dotted name, in the order first seen.
DETTRIAL_INLINE std::vector<std::string> hyperparameter_names(const std::map<std::int64_t, TrialRow>& rows) {
  std::vector<std::string> names;
  for (const auto& [id, row] : rows)
    for (const auto& [hp, value] : row.hparams)
      if (std::find(names.begin(), names.end(), hp) == names.end()) names.push_back(hp);
  return names;
}

DETTRIAL_INLINE Json hyperparameter_of(const TrialRow& row, const std::string& hp) {
  for (const auto& [n, v] : row.hparams)
    if (n == hp) return v;
  return nullptr;
}

/// The best metric against `hp`, where it is numeric and varies (nullopt otherwise).
DETTRIAL_INLINE std::optional<Chart> hyperparameter_scatter(const SearchPage& search, const std::string& hp,
                                                            const std::map<std::int64_t, std::string>& colors) {
  const std::string metric = search.metric.empty() ? std::string("metric") : search.metric;
  Chart scatter;
  scatter.name = metric + " vs " + hp;
  scatter.title = "best " + metric + " by " + hp;
  scatter.x_label = hp;
  scatter.scatter = true;
  scatter.legend = false;
  std::set<double> values;
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const auto& [id, row] : search.rows) {
    const Json v = hyperparameter_of(row, hp);
    if (v.is_null()) continue;
    if (!v.is_number()) return std::nullopt;
    const double x = v.get<double>();
    values.insert(x);
    low = std::min(low, x);
    high = std::max(high, x);
    if (!row.best) continue;
    Series s;
    s.name = "trial " + std::to_string(id);
    s.points.emplace_back(x, *row.best);
    s.color = colors.at(id);
    scatter.series.push_back(std::move(s));
  }
  if (values.size() < 2 || scatter.series.empty()) return std::nullopt;
  scatter.log_x = low > 0 && high / low >= 100;  // learning rates and the like, drawn from log spaces
  return scatter;
}

/// The trials' table: each trial's record, each hyperparameter (by its dotted name), its metric.
DETTRIAL_INLINE std::string trials_table(const SearchPage& search, const std::vector<std::string>& hparam_names,
                                         const std::map<std::int64_t, std::string>& colors) {
  const auto& rows = search.rows;
  const bool has_rungs = std::any_of(rows.begin(), rows.end(), [](const auto& kv) { return kv.second.rung.has_value(); });
  const std::set<std::string> fixed_columns = {"trial", "state", "batches", "restarts", "rung", "best", "last"};
  std::string table = "<div class=\"scroll\"><table id=\"trials\" class=\"sortable\">\n<thead><tr>" +
                      sortable_header("trial", "trial", true) + sortable_header("state", "state", false) +
                      sortable_header("batches", "batches", true) + sortable_header("restarts", "restarts", true);
  if (has_rungs) table += sortable_header("rung", "rung", true);
  for (const auto& hp : hparam_names) {
    const bool numeric = std::all_of(rows.begin(), rows.end(), [&](const auto& kv) {
      const Json v = hyperparameter_of(kv.second, hp);
      return v.is_null() || v.is_number();
    });
    table += sortable_header(fixed_columns.count(hp) ? "hparams." + hp : hp, hp, numeric);
  }
  const std::string metric_label = search.metric.empty() ? std::string("metric") : search.metric;
  table += sortable_header("best", "best " + metric_label, true) + sortable_header("last", "last " + metric_label, true) +
           "</tr></thead>\n<tbody>\n";
  for (const auto& [id, row] : rows) {
    table +=
        "<tr data-trial=\"" + std::to_string(id) + "\"" + (search.best_trial && *search.best_trial == id ? " class=\"best\"" : "") + ">";
    const std::string link = "trials/" + std::to_string(id) + "/report.html";
    table += table_cell(Json(id), "<span style=\"color:" + colors.at(id) + "\">&#9632;</span> " +
                                      (row.has_page ? "<a href=\"" + link + "\">" + std::to_string(id) + "</a>" : std::to_string(id)));
    table += table_cell(Json(row.state), "<span class=\"state-" + escape(row.state) + "\">" + escape(row.state) + "</span>");
    table += table_cell(optional_json(row.batches)) + table_cell(optional_json(row.restarts));
    if (has_rungs)  // shown from 1, as the chart numbers them
      table += table_cell(optional_json(row.rung ? std::optional<std::int64_t>(*row.rung + 1) : std::nullopt));
    for (const auto& hp : hparam_names) table += table_cell(hyperparameter_of(row, hp));
    table += table_cell(optional_json(row.best)) + table_cell(optional_json(row.last)) + "</tr>\n";
  }
  return table + "</tbody>\n</table></div>\n";
}

DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary) {
  const SearchPage search = collect_search(experiment_dir, summary);
  std::map<std::int64_t, std::string> colors;  // one colour per trial, on every chart
  std::size_t index = 0;
  for (const auto& [id, row] : search.rows) colors[id] = palette(index++);
  std::vector<Chart> charts{search_curves(search, summary, colors)};
  const std::vector<std::string> hparam_names = hyperparameter_names(search.rows);
  for (const auto& hp : hparam_names)
    if (auto scatter = hyperparameter_scatter(search, hp, colors)) charts.push_back(std::move(*scatter));

  std::string content;
  if (search.rows.empty()) content += "<p class=\"note\">No trial has started yet.</p>\n";
  content += "<h2>Trials</h2>\n<p class=\"meta\">Click a column to sort by it; a trial's number opens its own page.</p>\n" +
             trials_table(search, hparam_names, colors);
  content += "<h2>Charts</h2>\n" + figures(charts);
  content += config_section(layout::config, search.config_text);

  const std::filesystem::path out = ExperimentFolder{experiment_dir}.report_page();
  detail::write_atomically(out, html::page("search " + search.name, search_header(search, summary), content));
  return out;
}

}  // namespace dettrial::detail::html

namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir) {
  std::error_code ec;
  const ExperimentFolder experiment{experiment_dir};
  const std::filesystem::path summary_path = experiment.summary();
  const bool has_summary = std::filesystem::is_regular_file(summary_path, ec);
  if (!has_summary && !std::filesystem::is_directory(experiment.trials(), ec))
    throw Error("'" + experiment_dir.string() + "' has neither summary.json nor trials/: it is not a search's folder");
  return detail::html::write_experiment_page(experiment_dir, has_summary ? detail::read_json_file(summary_path) : detail::Json::object());
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
