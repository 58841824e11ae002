// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one place a fit reports through: the terminal (progress and result lines) and the
/// run's metrics.jsonl. Only the chief of a job writes; the other ranks stay quiet.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "../metrics/metrics.hpp"
#include "metrics_log.hpp"
#include "progress.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail {

/// What a fit reports, in the words and files users read: one object, so that new outlets (event
/// files, a profiler) plug in here rather than into the loop.
class Reporter {
 public:
  Reporter() = default;
  /// `writes` is true on the chief: it prints (unless `options.quiet`) and writes
  /// `<output_dir>/metrics.jsonl`, dropping the records a resumed run at batch `resumed_at` redoes.
  Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir, std::optional<std::int64_t> resumed_at);

  /// A line of its own (start-up facts, warnings, stops).
  void line(const std::string& text) { progress_.line(text); }

  /// A phase with a live progress line: `done` of `total` units so far.
  void begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit) { progress_.begin(phase, done, total, unit); }
  void update(std::int64_t done) { progress_.update(done); }
  /// Seconds since the phase began.
  double elapsed() const { return progress_.elapsed(); }

  /// A training workload's averaged metrics and the job's samples per second.
  void training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second);

  /// A validation's metrics, over `records` records (0: not counted) in `seconds`.
  void validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records, double seconds);

  /// A checkpoint written at `batches`.
  void checkpoint(std::int64_t batches, const std::filesystem::path& path, double seconds);

 private:
  Progress progress_{};
  MetricsLog log_{};
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE Reporter::Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir,
                                   std::optional<std::int64_t> resumed_at) {
  if (writes) log_ = MetricsLog(output_dir, resumed_at);
  if (!writes) options.quiet = true;
  progress_ = Progress(options);
  if (log_.dropped() > 0)  // also under --quiet: a trial's log says why its metrics.jsonl shrank
    std::fprintf(stderr, "dettrial: resuming at batch %lld: dropped %zu record(s) of %s written after that checkpoint (that training is done again)\n",
                 static_cast<long long>(resumed_at.value_or(0)), log_.dropped(), log_.path().c_str());
}

DETTRIAL_INLINE void Reporter::training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics,
                                        double samples_per_second) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "  (%.1f samples/s)", samples_per_second);
  progress_.line("[train]" + format_metrics(metrics) + tail);
  log_.write("training", batches, epochs, metrics, "samples_per_second", samples_per_second);
}

DETTRIAL_INLINE void Reporter::validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics,
                                          std::int64_t records, double seconds) {
  char tail[96];
  if (records > 0)
    std::snprintf(tail, sizeof tail, "  (%lld records in %.2f s)", static_cast<long long>(records), seconds);
  else
    std::snprintf(tail, sizeof tail, "  (%.2f s)", seconds);
  progress_.line("[validation]" + format_metrics(metrics) + tail);
  log_.write("validation", batches, epochs, metrics, "seconds", seconds);
}

DETTRIAL_INLINE void Reporter::checkpoint(std::int64_t batches, const std::filesystem::path& path, double seconds) {
  char tail[48];
  std::snprintf(tail, sizeof tail, " (%.2f s)", seconds);
  progress_.line("[checkpoint] batches " + std::to_string(batches) + ": " + path.string() + tail);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
