// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The run's metrics.jsonl as an outlet of the fit's reports: every report a record.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

#include "../../detail/json_fwd.hpp"
#include "../../detail/linkage.hpp"
#include "../metrics_log.hpp"
#include "outlet.hpp"
#include "system_metrics.hpp"

namespace dettrial::detail {

/// A system metrics report as a metrics.jsonl record's fields: `time` (UTC, ISO 8601), each metric
/// by Determined's name, and `gpu_util` and `gpu_free_memory` by GPU UUID.
DETTRIAL_INLINE Json system_record(const SystemReport& report);

/// `<output_dir>/metrics.jsonl`: a `training`, `validation`, `checkpoint`, `system` or `restart`
/// record per report (MetricsLog's format, which the report pages and the search runner read).
class MetricsLogOutlet final : public ReportOutlet {
 public:
  /// Drops the records a run resumed at batch `resumed_at` redoes, saying so on stderr (also under
  /// --quiet: a trial's log says why its metrics.jsonl shrank).
  DETTRIAL_INLINE MetricsLogOutlet(const std::filesystem::path& output_dir, std::optional<std::int64_t> resumed_at);

  DETTRIAL_INLINE void training(const TrainingReport& r) override;
  DETTRIAL_INLINE void validation(const ValidationReport& r) override;
  DETTRIAL_INLINE void checkpoint(const CheckpointReport& r) override;
  DETTRIAL_INLINE void system(const SystemMetricsReport& r) override;
  DETTRIAL_INLINE void restart(const RestartReport& r) override;

 private:
  MetricsLog log_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

#include "../../detail/json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE Json system_record(const SystemReport& report) {
  const auto since_epoch = report.time.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char time[40];
  const std::size_t n = std::strftime(time, sizeof time, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(time + n, sizeof time - n, ".%03dZ", static_cast<int>(millis));
  Json record = {{"time", time}};
  for (const auto& [name, value] : report.values) record[name] = value;
  if (!report.gpus.empty()) {
    Json util = Json::object(), free_memory = Json::object();
    for (const SystemReport::Gpu& gpu : report.gpus) {
      util[gpu.uuid] = gpu.gpu_util;
      free_memory[gpu.uuid] = gpu.gpu_free_memory;
    }
    record["gpu_util"] = std::move(util);
    record["gpu_free_memory"] = std::move(free_memory);
  }
  return record;
}

DETTRIAL_INLINE MetricsLogOutlet::MetricsLogOutlet(const std::filesystem::path& output_dir, std::optional<std::int64_t> resumed_at)
    : log_(output_dir, resumed_at) {
  if (log_.dropped() > 0)
    std::fprintf(
        stderr,
        "dettrial: resuming at batch %lld: dropped %zu record(s) of %s written after that checkpoint (that training is done again)\n",
        static_cast<long long>(resumed_at.value_or(0)), log_.dropped(), log_.path().c_str());
}

DETTRIAL_INLINE void MetricsLogOutlet::training(const TrainingReport& r) {
  Json extra = {{"samples_per_second", r.samples_per_second}};
  Json times = Json::object();
  for (const auto& [phase, value] : r.phase_seconds()) times[phase] = value;
  extra["seconds"] = std::move(times);
  if (!r.learning_rates.empty()) {
    Json lrs = Json::object();
    for (const auto& [name, lr] : r.learning_rates) lrs[name] = lr;
    extra["learning_rates"] = std::move(lrs);
  }
  log_.write("training", r.batches, r.epochs, r.metrics, extra);
}

DETTRIAL_INLINE void MetricsLogOutlet::validation(const ValidationReport& r) {
  log_.write("validation", r.batches, r.epochs, r.metrics, Json{{"seconds", r.seconds}});
}

DETTRIAL_INLINE void MetricsLogOutlet::checkpoint(const CheckpointReport& r) {
  log_.write("checkpoint", r.batches, r.epochs, MetricValues{},
             Json{{"seconds", r.seconds}, {"write_seconds", r.write_seconds}, {"uuid", r.path.filename().string()}});
}

DETTRIAL_INLINE void MetricsLogOutlet::system(const SystemMetricsReport& r) {
  log_.write("system", r.batches, r.epochs, MetricValues{}, system_record(r.report));
}

DETTRIAL_INLINE void MetricsLogOutlet::restart(const RestartReport& r) {
  Json extra = {{"ranks_before", r.ranks_before}, {"ranks", r.ranks}};
  if (r.restart > 0) extra["restart"] = r.restart;
  log_.write("restart", r.batches, r.epochs, MetricValues{}, extra);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
