// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one place a fit reports through: the terminal (progress and result lines), and a list
/// of outlets behind one interface (detail::ReportOutlet: metrics.jsonl, metrics.csv, TensorBoard's
/// event files, an MLflow run). Only the chief of a job writes; the other ranks stay quiet.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../config/hyperparameters.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../../tensorboard/event_file.hpp"
#include "../../tracking/mlflow.hpp"
#include "../progress.hpp"
#include "outlet.hpp"
#include "system_metrics.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// The hyperparameters as TensorBoard's hparams dashboard lists them: nested ones by dotted name,
/// numbers as numbers, true/false as booleans, lists and anything else as their YAML text.
DETTRIAL_INLINE std::vector<std::pair<std::string, HParamValue>> flat_hparams(const Hyperparameters& hparams);

/// What a fit reports, in the words and files users read: one object, which writes the terminal's
/// lines and hands each report to its outlets in order, so that a new outlet plugs in as a
/// ReportOutlet rather than into the loop or this class.
class Reporter {
 public:
  Reporter() = default;
  /// `writes` is true on the chief: it prints (unless `options.quiet`) and writes
  /// `<output_dir>/metrics.jsonl`, dropping the records a resumed run at batch `resumed_at` redoes,
  /// and, given a `tensorboard` writer, the same numbers as TensorBoard scalars (`train/<metric>`,
  /// `validation/<metric>`, `train/lr`, `train/samples_per_second`, `timing/<phase>_seconds`).
  /// `metrics.csv` holds the training and validation reports as a table; given an `mlflow` run, the
  /// same go to it.
  Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir, std::optional<std::int64_t> resumed_at,
           TensorBoardWriter* tensorboard = nullptr, MlflowRun* mlflow = nullptr);

  /// An outlet more, after those above: it gets every later report (on the chief only: give none
  /// to another rank's Reporter).
  void add_outlet(std::unique_ptr<ReportOutlet> outlet) { outlets_.push_back(std::move(outlet)); }

  /// A line of its own (start-up facts, warnings, stops).
  void line(const std::string& text) { progress_.line(text); }

  /// A phase with a live progress line: `done` of `total` units so far.
  void begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit) {
    progress_.begin(phase, done, total, unit);
  }
  void update(std::int64_t done) { progress_.update(done); }
  /// Seconds since the phase began.
  double elapsed() const { return progress_.elapsed(); }

  /// A training workload's averaged metrics, the job's samples per second, where the chief's time
  /// went (`seconds` in all) and the learning rates after its last step.
  void training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second, double seconds,
                const PhaseTimes& phases, const LearningRates& learning_rates);

  /// A validation's metrics, over `records` records (0: not counted) in `seconds`.
  void validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records, double seconds);

  /// A checkpoint written at `batches`: training stood still `seconds` for it (a snapshot, or the
  /// whole write when synchronous), and its write went on `write_seconds` from there.
  void checkpoint(std::int64_t batches, std::int64_t epochs, const std::filesystem::path& path, double seconds, double write_seconds);

  /// A report of the machine's system metrics (profiling.enabled), at `batches` trained: a
  /// `{"type":"system"}` record, TensorBoard's `system/<metric>` (`system/gpu_util/<uuid>`) and
  /// MLflow's. No terminal line.
  void system(std::int64_t batches, std::int64_t epochs, const SystemReport& report);

  /// A run continued at `batches` on `ranks` ranks from a checkpoint written by `ranks_before`:
  /// restart `restart` of a launcher that restarted the job (0: resumed by hand).
  void restart(std::int64_t batches, std::int64_t epochs, std::int64_t ranks_before, std::int64_t ranks, std::int64_t restart);

 private:
  /// Hands `report` to each outlet's `hook`, in order.
  template <class Report>
  void to_outlets(void (ReportOutlet::*hook)(const Report&), const Report& report) {
    for (const auto& outlet : outlets_) ((*outlet).*hook)(report);
  }

  Progress progress_{};
  std::vector<std::unique_ptr<ReportOutlet>> outlets_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>

#include "csv_outlet.hpp"
#include "metrics_log_outlet.hpp"
#include "mlflow_outlet.hpp"
#include "tensorboard_outlet.hpp"

namespace dettrial::detail {

/// flat_hparams' recursion: the entries of `map`, their names prefixed.
DETTRIAL_INLINE void flatten_hparams(const YAML::Node& map, const std::string& prefix,
                                     std::vector<std::pair<std::string, HParamValue>>& out) {
  for (const auto& kv : map) {
    const std::string name = prefix + kv.first.Scalar();
    const YAML::Node& value = kv.second;
    if (value.IsMap()) {
      flatten_hparams(value, name + ".", out);
    } else if (value.IsScalar()) {
      const std::string& text = value.Scalar();
      double number = 0;
      std::size_t used = 0;
      if (text == "true" || text == "True" || text == "false" || text == "False") {
        out.emplace_back(name, text == "true" || text == "True");
      } else {
        try {
          number = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used > 0 && used == text.size() && value.Tag() != "!") out.emplace_back(name, number);  // "!" marks a quoted scalar
        else out.emplace_back(name, text);
      }
    } else if (value.IsDefined() && !value.IsNull()) {
      YAML::Emitter emitter;
      emitter << YAML::Flow << value;
      out.emplace_back(name, std::string(emitter.c_str()));
    }
  }
}

DETTRIAL_INLINE std::vector<std::pair<std::string, HParamValue>> flat_hparams(const Hyperparameters& hparams) {
  std::vector<std::pair<std::string, HParamValue>> out;
  if (hparams.yaml().IsMap()) flatten_hparams(hparams.yaml(), "", out);
  return out;
}

DETTRIAL_INLINE Reporter::Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir,
                                   std::optional<std::int64_t> resumed_at, TensorBoardWriter* tensorboard, MlflowRun* mlflow) {
  if (!writes) options.quiet = true;
  progress_ = Progress(options);
  if (!writes) return;
  // The order each report reaches them in: the files first, then the servers and event files.
  outlets_.push_back(std::make_unique<MetricsLogOutlet>(output_dir, resumed_at));
  outlets_.push_back(std::make_unique<CsvOutlet>(output_dir));
  if (mlflow) outlets_.push_back(std::make_unique<MlflowOutlet>(*mlflow));
  if (tensorboard) outlets_.push_back(std::make_unique<TensorBoardOutlet>(*tensorboard, resumed_at));
}

DETTRIAL_INLINE void Reporter::training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second,
                                        double seconds, const PhaseTimes& phases, const LearningRates& learning_rates) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "  (%.1f samples/s)", samples_per_second);
  progress_.line("[train]" + format_metrics(metrics) + tail);
  to_outlets(&ReportOutlet::training, TrainingReport{.batches = batches,
                                                     .epochs = epochs,
                                                     .metrics = metrics,
                                                     .samples_per_second = samples_per_second,
                                                     .seconds = seconds,
                                                     .phases = phases,
                                                     .learning_rates = learning_rates});
}

DETTRIAL_INLINE void Reporter::validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records,
                                          double seconds) {
  char tail[96];
  if (records > 0) std::snprintf(tail, sizeof tail, "  (%lld records in %.2f s)", static_cast<long long>(records), seconds);
  else std::snprintf(tail, sizeof tail, "  (%.2f s)", seconds);
  progress_.line("[validation]" + format_metrics(metrics) + tail);
  to_outlets(&ReportOutlet::validation,
             ValidationReport{.batches = batches, .epochs = epochs, .metrics = metrics, .records = records, .seconds = seconds});
}

DETTRIAL_INLINE void Reporter::checkpoint(std::int64_t batches, std::int64_t epochs, const std::filesystem::path& path, double seconds,
                                          double write_seconds) {
  char tail[96];
  if (write_seconds > 0.005) std::snprintf(tail, sizeof tail, " (%.2f s, then %.2f s in the background)", seconds, write_seconds);
  else std::snprintf(tail, sizeof tail, " (%.2f s)", seconds);
  progress_.line("[checkpoint] batches " + std::to_string(batches) + ": " + path.string() + tail);
  to_outlets(&ReportOutlet::checkpoint,
             CheckpointReport{.batches = batches, .epochs = epochs, .path = path, .seconds = seconds, .write_seconds = write_seconds});
}

DETTRIAL_INLINE void Reporter::system(std::int64_t batches, std::int64_t epochs, const SystemReport& report) {
  to_outlets(&ReportOutlet::system, SystemMetricsReport{.batches = batches, .epochs = epochs, .report = report});
}

DETTRIAL_INLINE void Reporter::restart(std::int64_t batches, std::int64_t epochs, std::int64_t ranks_before, std::int64_t ranks,
                                       std::int64_t restart) {
  const auto count = [](std::int64_t n) { return std::to_string(n) + " rank" + (n == 1 ? "" : "s"); };
  progress_.line("[restart] batches " + std::to_string(batches) + ": " +
                 (restart > 0 ? "restart " + std::to_string(restart) + ", " : std::string("resumed, ")) + "on " + count(ranks) +
                 (ranks_before == ranks ? "" : " (the checkpoint's job had " + count(ranks_before) + ")"));
  to_outlets(&ReportOutlet::restart,
             RestartReport{.batches = batches, .epochs = epochs, .ranks_before = ranks_before, .ranks = ranks, .restart = restart});
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
