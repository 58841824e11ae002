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

  /// `{"type":"training"|"validation"|"checkpoint","batches":N,"epochs":E,<extra's fields>,"metrics":{...}}`,
  /// one compact line (`metrics` left out when empty and `extra` has fields of its own).
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, const detail::Json& extra);
  /// The same record without extra fields.
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics);

 private:
  /// Rewrites the file (a new file renamed over it) without the records past `batches`, or without
  /// a `"batches"` of their own; a damaged line before the last is an Error naming it (the file is
  /// then left as it was).
  std::size_t drop_records_after(std::int64_t batches);

  std::filesystem::path path_;
  std::ofstream out_;
  std::size_t dropped_ = 0;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../detail/json.hpp"
#include "../detail/jsonl.hpp"

namespace dettrial {

DETTRIAL_INLINE MetricsLog::MetricsLog(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at)
    : MetricsLog(dir, RunFolder{dir}.metrics_log(), resumed_at) {}

DETTRIAL_INLINE MetricsLog::MetricsLog(const std::filesystem::path& dir, const std::filesystem::path& file,
                                       std::optional<std::int64_t> resumed_at)
    : path_(file) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create output directory '" + dir.string() + "': " + ec.message());
  if (std::filesystem::exists(path_, ec)) {
    // Appending to a torn last line would lose the first new record with it.
    if (resumed_at) dropped_ = drop_records_after(*resumed_at);
    else detail::JsonlFile(path_).cut_torn_line();
  }
  out_.open(path_, std::ios::app);
  if (!out_) throw Error("cannot write '" + path_.string() + "'");
}

DETTRIAL_INLINE std::optional<std::int64_t> MetricsLog::batches_of_record(const detail::Json& record) {
  const detail::Json* batches = detail::json_find(record, "batches");
  if (!batches || !batches->is_number_integer()) return std::nullopt;
  return batches->get<std::int64_t>();
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
  return detail::JsonlFile(path_).keep_only([batches](const detail::Json& record) {
    const auto at = batches_of_record(record);
    return at && *at <= batches;
  });
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
