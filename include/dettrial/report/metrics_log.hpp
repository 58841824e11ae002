// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief metrics.jsonl: one JSON object per training or validation report, for tools to read.
#pragma once

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "../detail/error.hpp"
#include "../detail/json.hpp"
#include "../metrics/metrics.hpp"

namespace dettrial {

/// Appends one line per report to `<dir>/metrics.jsonl`.
class MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::filesystem::path& dir) : path_(dir / "metrics.jsonl") {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create output directory '" + dir.string() + "': " + ec.message());
    out_.open(path_, std::ios::app);
    if (!out_) throw Error("cannot write '" + path_.string() + "'");
  }
  bool enabled() const { return out_.is_open(); }
  const std::filesystem::path& path() const { return path_; }

  /// `{"type": "training"|"validation", "batches": N, "epochs": E, <extra>, "metrics": {...}}`
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics,
             std::string_view extra_key = {}, double extra_value = 0) {
    if (!out_.is_open()) return;
    std::string line = "{\"type\":";
    detail::append_json_string(line, type);
    line += ",\"batches\":" + std::to_string(batches) + ",\"epochs\":" + std::to_string(epochs);
    if (!extra_key.empty()) {
      line += ',';
      detail::append_json_string(line, extra_key);
      line += ':';
      detail::append_json_number(line, extra_value);
    }
    line += ",\"metrics\":{";
    bool first = true;
    for (const auto& [name, value] : metrics) {
      if (!first) line += ',';
      first = false;
      detail::append_json_string(line, name);
      line += ':';
      detail::append_json_number(line, value);
    }
    line += "}}\n";
    out_ << line;
    out_.flush();
  }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace dettrial
