// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one place a fit reports through: the terminal (progress and result lines), the run's
/// metrics.jsonl and its TensorBoard event files. Only the chief of a job writes; the other ranks
/// stay quiet.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../config/hyperparameters.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../../tensorboard/event_file.hpp"
#include "../../tracking/mlflow.hpp"
#include "../csv_log.hpp"
#include "../metrics_log.hpp"
#include "../progress.hpp"
#include "system_metrics.hpp"
#include "../../detail/linkage.hpp"

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

/// The hyperparameters as TensorBoard's hparams dashboard lists them: nested ones by dotted name,
/// numbers as numbers, true/false as booleans, lists and anything else as their YAML text.
DETTRIAL_INLINE std::vector<std::pair<std::string, HParamValue>> flat_hparams(const Hyperparameters& hparams);

/// A system metrics report as a metrics.jsonl record's fields: `time` (UTC, ISO 8601), each metric
/// by Determined's name, and `gpu_util` and `gpu_free_memory` by GPU UUID.
DETTRIAL_INLINE Json system_record(const SystemReport& report);

/// What a fit reports, in the words and files users read: one object, so that new outlets (event
/// files, a profiler) plug in here rather than into the loop.
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
  /// Every metric but the counters (`batches`, `epochs`: TensorBoard's step already says them).
  void add_scalars(std::string_view prefix, const MetricValues& metrics, std::int64_t step);
  /// The same metrics named `<prefix><name>`, for MLflow.
  static std::vector<std::pair<std::string, double>> prefixed(std::string_view prefix, const MetricValues& metrics);

  Progress progress_{};
  MetricsLog log_{};
  CsvLog csv_{};
  TensorBoardWriter* tensorboard_ = nullptr;
  MlflowRun* mlflow_ = nullptr;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <chrono>
#include <ctime>

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
  if (writes) log_ = MetricsLog(output_dir, resumed_at);
  if (writes) csv_ = CsvLog(output_dir);
  if (writes) tensorboard_ = tensorboard;
  if (writes) mlflow_ = mlflow;
  if (!writes) options.quiet = true;
  progress_ = Progress(options);
  if (log_.dropped() > 0)  // also under --quiet: a trial's log says why its metrics.jsonl shrank
    std::fprintf(
        stderr,
        "dettrial: resuming at batch %lld: dropped %zu record(s) of %s written after that checkpoint (that training is done again)\n",
        static_cast<long long>(resumed_at.value_or(0)), log_.dropped(), log_.path().c_str());
  if (tensorboard_ && tensorboard_->dropped() > 0)
    std::fprintf(stderr, "dettrial: resuming at batch %lld: dropped %zu event(s) of %s written after that checkpoint\n",
                 static_cast<long long>(resumed_at.value_or(0)), tensorboard_->dropped(), tensorboard_->dir().c_str());
}

DETTRIAL_INLINE void Reporter::training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second,
                                        double seconds, const PhaseTimes& phases, const LearningRates& learning_rates) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "  (%.1f samples/s)", samples_per_second);
  progress_.line("[train]" + format_metrics(metrics) + tail);
  const std::pair<const char*, double> phase_seconds[] = {{"data", phases.data},
                                                          {"train_batch", phases.train_batch},
                                                          {"backward", phases.backward},
                                                          {"optimizer_step", phases.optimizer_step},
                                                          {"checkpoint_wait", phases.checkpoint_wait},
                                                          {"total", seconds}};
  if (log_.enabled()) {
    Json extra = {{"samples_per_second", samples_per_second}};
    Json times = Json::object();
    for (const auto& [phase, value] : phase_seconds) times[phase] = value;
    extra["seconds"] = std::move(times);
    if (!learning_rates.empty()) {
      Json lrs = Json::object();
      for (const auto& [name, lr] : learning_rates) lrs[name] = lr;
      extra["learning_rates"] = std::move(lrs);
    }
    log_.write("training", batches, epochs, metrics, extra);
    csv_.write("training", batches, epochs, metrics);
  }
  if (mlflow_) {
    std::vector<std::pair<std::string, double>> values = prefixed("train/", metrics);
    values.emplace_back("train/samples_per_second", samples_per_second);
    Json rates = Json::object(), times = Json::object();
    for (const auto& [name, lr] : learning_rates) {
      values.emplace_back("train/" + name, lr);
      rates[name] = lr;
    }
    for (const auto& [phase, value] : phase_seconds) {
      values.emplace_back(std::string("timing/") + phase + "_seconds", value);
      times[phase] = value;
    }
    mlflow_->log_metrics("training", batches, values,
                         {{"dettrial.learning_rates", rates.dump()}, {"dettrial.phase_seconds", times.dump()}});
  }
  if (tensorboard_) {
    add_scalars("train/", metrics, batches);
    tensorboard_->add_scalar("train/samples_per_second", samples_per_second, batches);
    for (const auto& [name, lr] : learning_rates) tensorboard_->add_scalar("train/" + name, lr, batches);
    for (const auto& [phase, value] : phase_seconds) tensorboard_->add_scalar(std::string("timing/") + phase + "_seconds", value, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records,
                                          double seconds) {
  char tail[96];
  if (records > 0) std::snprintf(tail, sizeof tail, "  (%lld records in %.2f s)", static_cast<long long>(records), seconds);
  else std::snprintf(tail, sizeof tail, "  (%.2f s)", seconds);
  progress_.line("[validation]" + format_metrics(metrics) + tail);
  log_.write("validation", batches, epochs, metrics, Json{{"seconds", seconds}});
  csv_.write("validation", batches, epochs, metrics);
  if (mlflow_) {
    std::vector<std::pair<std::string, double>> values = prefixed("validation/", metrics);
    values.emplace_back("timing/validation_seconds", seconds);
    mlflow_->log_metrics("validation", batches, values);
  }
  if (tensorboard_) {
    add_scalars("validation/", metrics, batches);
    tensorboard_->add_scalar("timing/validation_seconds", seconds, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::checkpoint(std::int64_t batches, std::int64_t epochs, const std::filesystem::path& path, double seconds,
                                          double write_seconds) {
  char tail[96];
  if (write_seconds > 0.005) std::snprintf(tail, sizeof tail, " (%.2f s, then %.2f s in the background)", seconds, write_seconds);
  else std::snprintf(tail, sizeof tail, " (%.2f s)", seconds);
  progress_.line("[checkpoint] batches " + std::to_string(batches) + ": " + path.string() + tail);
  log_.write("checkpoint", batches, epochs, MetricValues{},
             Json{{"seconds", seconds}, {"write_seconds", write_seconds}, {"uuid", path.filename().string()}});
  if (mlflow_) {
    const std::string uuid = path.filename().string();
    mlflow_->log_metrics("checkpoint", batches, {},
                         {{"dettrial.checkpoint.batch_" + std::to_string(batches), uuid + " " + path.string()},
                          {"dettrial.checkpoint.latest", uuid},
                          {"dettrial.checkpoint.latest_path", path.string()}});
  }
  if (tensorboard_) {
    tensorboard_->add_scalar("timing/checkpoint_seconds", seconds, batches);
    tensorboard_->add_scalar("timing/checkpoint_write_seconds", write_seconds, batches);
    tensorboard_->flush();
  }
}

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

DETTRIAL_INLINE void Reporter::system(std::int64_t batches, std::int64_t epochs, const SystemReport& report) {
  log_.write("system", batches, epochs, MetricValues{}, system_record(report));
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [name, value] : report.values) values.emplace_back("system/" + name, value);
  for (const SystemReport::Gpu& gpu : report.gpus) {
    values.emplace_back("system/gpu_util/" + gpu.uuid, gpu.gpu_util);
    values.emplace_back("system/gpu_free_memory/" + gpu.uuid, gpu.gpu_free_memory);
  }
  if (mlflow_) mlflow_->log_metrics("system", batches, values);
  if (tensorboard_) {
    for (const auto& [tag, value] : values) tensorboard_->add_scalar(tag, value, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::restart(std::int64_t batches, std::int64_t epochs, std::int64_t ranks_before, std::int64_t ranks,
                                       std::int64_t restart) {
  const auto count = [](std::int64_t n) { return std::to_string(n) + " rank" + (n == 1 ? "" : "s"); };
  progress_.line("[restart] batches " + std::to_string(batches) + ": " +
                 (restart > 0 ? "restart " + std::to_string(restart) + ", " : std::string("resumed, ")) + "on " + count(ranks) +
                 (ranks_before == ranks ? "" : " (the checkpoint's job had " + count(ranks_before) + ")"));
  Json extra = {{"ranks_before", ranks_before}, {"ranks", ranks}};
  if (restart > 0) extra["restart"] = restart;
  log_.write("restart", batches, epochs, MetricValues{}, extra);
  if (mlflow_)
    mlflow_->log_metrics(
        "restart", batches, {},
        {{"dettrial.restart.batch_" + std::to_string(batches), std::to_string(ranks_before) + " -> " + std::to_string(ranks) + " ranks"}});
}

DETTRIAL_INLINE std::vector<std::pair<std::string, double>> Reporter::prefixed(std::string_view prefix, const MetricValues& metrics) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") out.emplace_back(std::string(prefix) + name, value);
  return out;
}

DETTRIAL_INLINE void Reporter::add_scalars(std::string_view prefix, const MetricValues& metrics, std::int64_t step) {
  for (const auto& [tag, value] : prefixed(prefix, metrics)) tensorboard_->add_scalar(tag, value, step);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
