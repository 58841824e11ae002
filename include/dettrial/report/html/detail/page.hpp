// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html's page: its frame (style, script, footer), the JSON records it reads and the table
/// cells it writes, shared by the run's and the search's pages.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "../../../error.hpp"
#include "../../../detail/json_fwd.hpp"
#include "chart.hpp"
#include "../../../detail/linkage.hpp"

namespace dettrial::detail::html {

/// The page: its frame around `header` and `content` (HTML), with a footer line of when it was written.
DETTRIAL_INLINE std::string page(const std::string& title, const std::string& header, const std::string& content);
/// The charts as a row of figures.
DETTRIAL_INLINE std::string figures(const std::vector<Chart>& charts);
/// A config file shown as it is, folded.
DETTRIAL_INLINE std::string config_section(const std::string& name, const std::string& text);
/// A file's bytes; empty when it cannot be read.
DETTRIAL_INLINE std::string read_text(const std::filesystem::path& path);
/// Nested hyperparameters by their dotted names ("optimizer.lr"), in their order.
DETTRIAL_INLINE void flatten(const Json& value, const std::string& prefix, std::vector<std::pair<std::string, Json>>& out);
/// The `hyperparameters` of a config.yaml, or null when it has none or does not parse.
DETTRIAL_INLINE Json config_hyperparameters(const std::string& yaml_text);
/// A table of name/value rows (hyperparameters).
DETTRIAL_INLINE std::string value_table(const std::vector<std::pair<std::string, Json>>& rows);
/// A record's field, when it is there and of that kind.
DETTRIAL_INLINE std::optional<std::int64_t> integer_of(const Json& object, const char* key);
DETTRIAL_INLINE std::optional<double> number_of(const Json& object, const char* key);
DETTRIAL_INLINE std::string string_of(const Json& object, const char* key);
/// A table header cell the script sorts by: `column` is the name `#sort=` takes.
DETTRIAL_INLINE std::string sortable_header(const std::string& column, const std::string& label, bool numeric);
/// A table cell sorted by `value`, showing its text or `inner_html`.
DETTRIAL_INLINE std::string table_cell(const Json& value, const std::string& inner_html = {});
/// A value or null.
DETTRIAL_INLINE Json optional_json(const std::optional<double>& v);
DETTRIAL_INLINE Json optional_json(const std::optional<std::int64_t>& v);

}  // namespace dettrial::detail::html

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../../detail/json.hpp"
namespace dettrial::detail::html {

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
         "<title>" +
         escape(title) + "</title>\n<style>" + page_style() + "</style>\n</head>\n<body>\n<header>\n" + header + "</header>\n<main>\n" +
         content + "<p class=\"meta\">Written by dettrial, " + utc_now() +
         ". Regenerate with <code>--report DIR</code>.</p>\n</main>\n<script>" + page_script() + "</script>\n</body>\n</html>\n";
}

DETTRIAL_INLINE std::string figures(const std::vector<Chart>& charts) {
  std::string out = "<div class=\"charts\">\n";
  for (const Chart& c : charts)
    out += "<figure>\n<figcaption>" + escape(c.title.empty() ? c.name : c.title) + "</figcaption>\n" + svg_chart(c) + "</figure>\n";
  return out + "</div>\n";
}

DETTRIAL_INLINE std::string config_section(const std::string& name, const std::string& text) {
  if (text.empty()) return "";
  return "<details><summary>" + escape(name) + "</summary>\n<pre>" + escape(text) + "</pre>\n</details>\n";
}

DETTRIAL_INLINE std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

DETTRIAL_INLINE void flatten(const Json& value, const std::string& prefix, std::vector<std::pair<std::string, Json>>& out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (!prefix.empty()) {
    out.emplace_back(prefix, value);
  }
}

DETTRIAL_INLINE Json config_hyperparameters(const std::string& yaml_text) {
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    if (doc.IsMap() && doc["hyperparameters"]) return yaml_to_json(doc["hyperparameters"]);
  } catch (const std::exception&) {
    // A config that does not parse: the page shows its text without the table.
  }
  return nullptr;
}

DETTRIAL_INLINE std::string value_table(const std::vector<std::pair<std::string, Json>>& rows) {
  std::string out = "<table>\n";
  for (const auto& [name, value] : rows)
    out += "<tr><th class=\"text\">" + escape(name) + "</th><td class=\"" + (value.is_string() ? "text" : "") + "\">" +
           escape(value_text(value)) + "</td></tr>\n";
  return out + "</table>\n";
}

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

DETTRIAL_INLINE std::string sortable_header(const std::string& column, const std::string& label, bool numeric) {
  return "<th data-column=\"" + escape(column) + "\" data-type=\"" + (numeric ? "number" : "text") + "\"" +
         (numeric ? "" : " class=\"text\"") + " title=\"sort by " + escape(label) + "\">" + escape(label) + "</th>";
}

DETTRIAL_INLINE std::string table_cell(const Json& value, const std::string& inner_html) {
  return "<td" + std::string(value.is_string() ? " class=\"text\"" : "") + " data-value=\"" + escape(sort_key(value)) + "\">" +
         (inner_html.empty() ? escape(value_text(value)) : inner_html) + "</td>";
}

DETTRIAL_INLINE Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }
DETTRIAL_INLINE Json optional_json(const std::optional<std::int64_t>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace dettrial::detail::html
#endif  // DETTRIAL_HEADER_DEFINITIONS
