// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::ReportOutlet: where a fit's reports go besides the terminal (metrics.jsonl,
/// metrics.csv, TensorBoard's event files, an MLflow run), one interface, one file per outlet.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../vocabulary/metrics.hpp"
#include "../../detail/linkage.hpp"
#include "system_metrics.hpp"

namespace dettrial::detail {

/// Where a training workload's time went on this rank, in seconds.
struct PhaseTimes {
  /// From the end of one batch's step to the next batch on the device: loading, collating, copying.
  double data = 0;
  /// The trial's train_batch (for an imperative trial: forward, backward and the optimizer step).
  double train_batch = 0;
  /// A declarative trial's backward pass, and its clipping and optimizer step, run by the trainer.
  double backward = 0;
  double optimizer_step = 0;
  /// Waiting, at a checkpoint since the last report, for the last checkpoint's background write
  /// (one is in flight at most): 0 when writes keep up with the checkpoint period.
  double checkpoint_wait = 0;
  void reset() { *this = PhaseTimes{}; }
};

/// A learning rate as reported: `lr` for a single optimizer's single group, else suffixed with the
/// optimizer's and group's indices (`lr_1`, `lr_group_2`, `lr_1_group_2`).
using LearningRates = std::vector<std::pair<std::string, double>>;

/// A training workload's report: its averaged metrics, the job's samples per second, where the
/// chief's time went (`seconds` in all) and the learning rates after its last step.
struct TrainingReport {
  std::int64_t batches, epochs;
  const MetricValues& metrics;
  double samples_per_second, seconds;
  const PhaseTimes& phases;
  const LearningRates& learning_rates;

  /// The phases by the names every outlet gives them ("data", ..., "checkpoint_wait", "total").
  std::array<std::pair<const char*, double>, 6> phase_seconds() const {
    return {{{"data", phases.data},
             {"train_batch", phases.train_batch},
             {"backward", phases.backward},
             {"optimizer_step", phases.optimizer_step},
             {"checkpoint_wait", phases.checkpoint_wait},
             {"total", seconds}}};
  }
};

/// A validation's metrics, over `records` records (0: not counted) in `seconds`.
struct ValidationReport {
  std::int64_t batches, epochs;
  const MetricValues& metrics;
  std::int64_t records;
  double seconds;
};

/// A checkpoint written at `batches`: training stood still `seconds` for it, and its write went on
/// `write_seconds` from there.
struct CheckpointReport {
  std::int64_t batches, epochs;
  const std::filesystem::path& path;
  double seconds, write_seconds;
};

/// The machine's system metrics at `batches` trained.
struct SystemMetricsReport {
  std::int64_t batches, epochs;
  const SystemReport& report;
};

/// A run continued at `batches` on `ranks` ranks from a checkpoint written by `ranks_before`:
/// restart `restart` of a launcher that restarted the job (0: resumed by hand).
struct RestartReport {
  std::int64_t batches, epochs, ranks_before, ranks, restart;
};

/**
 * @brief An outlet of a fit's reports (Lightning's loggers as a list): the Reporter hands each
 * report to every outlet it holds, in order; an outlet writes what it keeps of it and ignores the
 * rest (each hook does nothing unless overridden). A new outlet is a new file with a class of its
 * own, added where the fit's outputs open (trainer/detail/outputs.hpp), never an edit of the
 * Reporter. Called once per workload, validation, checkpoint or report: never per batch.
 */
class ReportOutlet {
 public:
  virtual ~ReportOutlet() = default;
  virtual void training(const TrainingReport&) {}
  virtual void validation(const ValidationReport&) {}
  virtual void checkpoint(const CheckpointReport&) {}
  virtual void system(const SystemMetricsReport&) {}
  virtual void restart(const RestartReport&) {}
};

/// Every metric but the counters (`batches`, `epochs`: a step says them), named `<prefix><name>`.
DETTRIAL_INLINE std::vector<std::pair<std::string, double>> prefixed_metrics(std::string_view prefix, const MetricValues& metrics);

/// A system report's figures as scalars: `system/<metric>`, and `system/gpu_util/<uuid>` and
/// `system/gpu_free_memory/<uuid>` for each GPU.
DETTRIAL_INLINE std::vector<std::pair<std::string, double>> system_scalars(const SystemReport& report);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE std::vector<std::pair<std::string, double>> prefixed_metrics(std::string_view prefix, const MetricValues& metrics) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") out.emplace_back(std::string(prefix) + name, value);
  return out;
}

DETTRIAL_INLINE std::vector<std::pair<std::string, double>> system_scalars(const SystemReport& report) {
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [name, value] : report.values) values.emplace_back("system/" + name, value);
  for (const SystemReport::Gpu& gpu : report.gpus) {
    values.emplace_back("system/gpu_util/" + gpu.uuid, gpu.gpu_util);
    values.emplace_back("system/gpu_free_memory/" + gpu.uuid, gpu.gpu_free_memory);
  }
  return values;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
