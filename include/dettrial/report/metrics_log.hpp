// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief metrics.jsonl: one JSON object per training or validation report, for tools to read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "../layout.hpp"
#include "../error.hpp"
#include "../detail/json_fwd.hpp"
#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// Appends one line per report to `<dir>/metrics.jsonl`.
class MetricsLog {
 public:
  MetricsLog() = default;
  /**
   * Opens `<dir>/metrics.jsonl` for appending. Resuming a trial from its checkpoint at
   * `resumed_at` batches, the records written after that checkpoint (by the run that stopped
   * without checkpointing again) describe training that is about to be done again: they are
   * dropped first, with a torn last line, so that no report appears twice.
   */
  explicit MetricsLog(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at = std::nullopt);
  /// The same for records of its own kind in `file` of `dir` (a node's system metrics).
  MetricsLog(const std::filesystem::path& dir, const std::filesystem::path& file, std::optional<std::int64_t> resumed_at);
  bool enabled() const { return out_.is_open(); }
  const std::filesystem::path& path() const { return path_; }
  /// How many records opening it for a resume dropped.
  std::size_t dropped() const { return dropped_; }

  /// The `"batches"` of a metrics.jsonl record, or nullopt for one without an integer `"batches"`.
  static std::optional<std::int64_t> batches_of_record(const detail::Json& record);
  /// The `"batches"` of one metrics.jsonl line, or nullopt for a line that is not a complete record
  /// (one torn by a crash does not parse).
  static std::optional<std::int64_t> batches_of(std::string_view line);

  /// `{"type":"training"|"validation"|"checkpoint","batches":N,"epochs":E,<extra's fields>,"metrics":{...}}`,
  /// one compact line (`metrics` left out when empty and `extra` has fields of its own).
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, const detail::Json& extra);
  /// The same record without extra fields.
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics);

 private:
  /// Rewrites the file (a new file renamed over it) without the records past `batches`.
  std::size_t drop_records_after(std::int64_t batches);

  std::filesystem::path path_;
  std::ofstream out_;
  std::size_t dropped_ = 0;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../detail/json.hpp"
namespace dettrial {

DETTRIAL_INLINE MetricsLog::MetricsLog(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at)
    : MetricsLog(dir, RunFolder{dir}.metrics_log(), resumed_at) {}

DETTRIAL_INLINE MetricsLog::MetricsLog(const std::filesystem::path& dir, const std::filesystem::path& file,
                                       std::optional<std::int64_t> resumed_at)
    : path_(file) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create output directory '" + dir.string() + "': " + ec.message());
  if (resumed_at && std::filesystem::exists(path_, ec)) dropped_ = drop_records_after(*resumed_at);
  out_.open(path_, std::ios::app);
  if (!out_) throw Error("cannot write '" + path_.string() + "'");
}

DETTRIAL_INLINE std::optional<std::int64_t> MetricsLog::batches_of_record(const detail::Json& record) {
  const detail::Json* batches = detail::json_find(record, "batches");
  if (!batches || !batches->is_number_integer()) return std::nullopt;
  return batches->get<std::int64_t>();
}

DETTRIAL_INLINE std::optional<std::int64_t> MetricsLog::batches_of(std::string_view line) {
  const detail::Json record = detail::Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return std::nullopt;
  return batches_of_record(record);
}

DETTRIAL_INLINE void MetricsLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics) {
  write(type, batches, epochs, metrics, detail::Json::object());
}

DETTRIAL_INLINE void MetricsLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics,
                                       const detail::Json& extra) {
  if (!out_.is_open()) return;
  detail::Json record = {{"type", std::string(type)}, {"batches", batches}, {"epochs", epochs}};
  for (const auto& [key, value] : extra.items()) record[key] = value;
  if (!metrics.empty() || extra.empty()) {
    detail::Json values = detail::Json::object();
    for (const auto& [name, value] : metrics) values[name] = value;  // NaN is written as null
    record["metrics"] = std::move(values);
  }
  out_ << detail::json_line(record);
  out_.flush();
}

DETTRIAL_INLINE std::size_t MetricsLog::drop_records_after(std::int64_t batches) {
  std::ifstream in(path_, std::ios::binary);
  std::string kept, line;
  std::size_t dropped = 0;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // the last line without its newline is torn
    const auto at = batches_of(line);
    if (complete && at && *at <= batches) kept += line + "\n";
    else ++dropped;
  }
  if (dropped == 0) return 0;
  const std::filesystem::path temporary = path_.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw Error("cannot write '" + temporary.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path_, ec);
  if (ec) throw Error("cannot replace '" + path_.string() + "': " + ec.message());
  return dropped;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
