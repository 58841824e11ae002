// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the user sees: a live progress line with rate and ETA on a terminal, plain report
/// lines otherwise.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// Where reports go and whether a live progress line is drawn.
struct ReportOptions {
  /// Draw a live progress line: unset means only when stdout is a terminal.
  std::optional<bool> live_progress;
  /// Print report lines at all.
  bool quiet = false;
};

}  // namespace dettrial

namespace dettrial::detail {

DETTRIAL_INLINE std::string format_duration(double seconds);

DETTRIAL_INLINE std::string format_metrics(const MetricValues& metrics);

/// Prints reports; draws the live line on terminals, throttled to a few updates a second.
class Progress {
 public:
  using clock = std::chrono::steady_clock;

  Progress() : Progress(ReportOptions{}) {}
  explicit Progress(ReportOptions options);

  /// Starts a phase ("train", "validate") of `total` units (0 when unknown).
  void begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit);

  /// Cheap per-batch call: draws at most every 200 ms, only on terminals.
  void update(std::int64_t done);

  /// Prints one report line (clearing the live line first).
  void line(const std::string& text);

  /// Seconds since begin().
  double elapsed() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

 private:
  bool quiet_;
  bool live_;
  bool drawn_ = false;
  std::string phase_, unit_;
  std::int64_t start_done_ = 0, total_ = 0;
  clock::time_point start_, next_draw_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

DETTRIAL_INLINE std::string format_metrics(const MetricValues& metrics) {
  std::string s;
  char buf[64];
  for (const auto& [name, value] : metrics) {
    std::snprintf(buf, sizeof buf, "%.6g", value);
    s += "  " + name + " " + (std::isfinite(value) ? std::string(buf) : std::string("n/a"));
  }
  return s;
}

DETTRIAL_INLINE Progress::Progress(ReportOptions options)
    : quiet_(options.quiet), live_(!options.quiet && options.live_progress.value_or(isatty(fileno(stdout)) == 1)) {}

DETTRIAL_INLINE void Progress::begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit) {
  phase_ = phase;
  unit_ = unit;
  start_done_ = done;
  total_ = total;
  start_ = clock::now();
  next_draw_ = start_;
}

DETTRIAL_INLINE void Progress::update(std::int64_t done) {
  if (!live_) return;
  const auto now = clock::now();
  if (now < next_draw_) return;
  next_draw_ = now + std::chrono::milliseconds(200);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done - start_done_) / elapsed : 0.0;
  char buf[256];
  if (total_ > 0) {
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : NAN;
    std::snprintf(buf, sizeof buf, "\r\033[K%s %3.0f%% %lld/%lld %s  %.1f %s/s  ETA %s", phase_.c_str(),
                  100.0 * static_cast<double>(done) / static_cast<double>(total_), static_cast<long long>(done),
                  static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(), format_duration(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "\r\033[K%s %lld %s  %.1f %s/s", phase_.c_str(), static_cast<long long>(done), unit_.c_str(), rate,
                  unit_.c_str());
  }
  std::fputs(buf, stdout);
  std::fflush(stdout);
  drawn_ = true;
}

DETTRIAL_INLINE void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (drawn_) std::fputs("\r\033[K", stdout);
  drawn_ = false;
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
