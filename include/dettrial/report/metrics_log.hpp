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
#include "../metrics/metrics.hpp"

namespace dettrial {

namespace detail {
// dettrial's fixed package set has no JSON library, and these records are flat: strings, integers
// and doubles. Writing them directly is a few lines; reading them back is left to real JSON tools.
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}
inline void append_json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}
}  // namespace detail

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
