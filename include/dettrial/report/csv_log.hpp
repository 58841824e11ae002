// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief metrics.csv: the reports of metrics.jsonl as a table (Keras's CSVLogger, Lightning's
/// CSVLogger), for a spreadsheet or pandas.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief One row per training or validation report: `type,batches,epochs`, then one column per
 * metric, in the order metrics first appeared (a report without a metric leaves its cell empty).
 * When a report brings a new metric, the file is rewritten with the new column (as Lightning's
 * CSVLogger does); otherwise a row is appended. A resumed run starts from its metrics.jsonl, which
 * already left out the reports it redoes.
 */
class CsvLog {
 public:
  CsvLog() = default;
  /// `<dir>/metrics.csv`, its rows first those of `<dir>/metrics.jsonl` as it stands.
  explicit CsvLog(const std::filesystem::path& dir);
  bool enabled() const { return !path_.empty(); }
  const std::filesystem::path& path() const { return path_; }

  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics);

 private:
  struct Row {
    std::string type;
    std::int64_t batches = 0, epochs = 0;
    std::map<std::string, double> values;
  };
  /// Adds `row`'s new metrics as columns; true when there were any.
  bool add_columns(const Row& row);
  std::string line(const Row& row) const;
  void rewrite() const;

  std::filesystem::path path_;
  std::vector<std::string> columns_;
  std::vector<Row> rows_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "../layout.hpp"
#include "../detail/atomic_file.hpp"
#include "../detail/json.hpp"
#include "../detail/jsonl.hpp"

namespace dettrial {

DETTRIAL_INLINE CsvLog::CsvLog(const std::filesystem::path& dir) : path_(RunFolder{dir}.metrics_csv()) {
  const std::filesystem::path log = RunFolder{dir}.metrics_log();
  std::error_code ec;
  const std::vector<detail::Json> records = std::filesystem::exists(log, ec) ? detail::JsonlFile(log).read() : std::vector<detail::Json>{};
  for (const detail::Json& record : records) {
    const std::string type = record.value("type", std::string());
    if (type != "training" && type != "validation") continue;
    Row row{type, record.value("batches", std::int64_t{0}), record.value("epochs", std::int64_t{0}), {}};
    const detail::Json metrics = record.value("metrics", detail::Json::object());
    for (const auto& [name, value] : metrics.items())
      if (name != "batches" && name != "epochs")
        row.values[name] = value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
    add_columns(row);
    rows_.push_back(std::move(row));
  }
  rewrite();
}

DETTRIAL_INLINE void CsvLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics) {
  if (!enabled()) return;
  Row row{std::string(type), batches, epochs, {}};
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") row.values[name] = value;
  const bool new_columns = add_columns(row);
  rows_.push_back(std::move(row));
  if (new_columns) {
    rewrite();
    return;
  }
  std::ofstream out(path_, std::ios::app);
  out << line(rows_.back());
}

DETTRIAL_INLINE bool CsvLog::add_columns(const Row& row) {
  bool added = false;
  for (const auto& [name, value] : row.values) {
    if (std::find(columns_.begin(), columns_.end(), name) != columns_.end()) continue;
    columns_.push_back(name);
    added = true;
  }
  return added;
}

DETTRIAL_INLINE std::string CsvLog::line(const Row& row) const {
  std::string text = row.type + "," + std::to_string(row.batches) + "," + std::to_string(row.epochs);
  for (const std::string& column : columns_) {
    text += ',';
    const auto found = row.values.find(column);
    if (found == row.values.end()) continue;
    if (found->second != found->second) {
      text += "nan";
      continue;
    }
    char number[32];
    std::snprintf(number, sizeof number, "%.9g", found->second);
    text += number;
  }
  return text + "\n";
}

DETTRIAL_INLINE void CsvLog::rewrite() const {
  std::string text = "type,batches,epochs";
  for (const std::string& column : columns_) {
    // A name with a comma or a quote is quoted, as RFC 4180 says.
    if (column.find_first_of(",\"\n") == std::string::npos) {
      text += "," + column;
      continue;
    }
    std::string quoted = "\"";
    for (const char c : column) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    text += "," + quoted + "\"";
  }
  text += "\n";
  for (const Row& row : rows_) text += line(row);
  detail::write_atomically(path_, text);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
