// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Outputs: what a fit writes besides checkpoints (the run folder's lock, the
/// reporter, the profiler, the system metrics, TensorBoard's session, the MLflow run), opened together and ended
/// together. Compiled once in separate-compilation mode.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../context/context.hpp"
#include "../../detail/folder_lock.hpp"
#include "../../detail/linkage.hpp"
#include "../../report/detail/profiler.hpp"
#include "../../report/detail/reporter.hpp"
#include "../../report/detail/system_metrics.hpp"
#include "../../report/metrics_log.hpp"
#include "../../tracking/mlflow.hpp"
#include "../fit_options.hpp"

namespace dettrial::detail {

/**
 * @brief A fit's outputs: on the chief, the run folder's lock (taken first, before anything there is
 * read or written), then the TensorBoard writer, the MLflow run and the reporter's metrics.jsonl;
 * on every rank the terminal lines and the profiler; on each node's first rank, with
 * profiling.enabled, the system metrics' sampler. close() (and the destructor) ends them in one
 * place: the TensorBoard session and the MLflow run as the fit ended (end_as; failed unless told
 * otherwise), then the lock.
 */
class Outputs {
 public:
  // Out of line (compiled once in separate compilation), as a BatchLoop<T> of every trial makes, moves
  // and ends one.
  DETTRIAL_INLINE Outputs();
  DETTRIAL_INLINE Outputs(Outputs&& other) noexcept;
  /// Ends what this object holds first (a moved-into Outputs never drops an open one silently).
  DETTRIAL_INLINE Outputs& operator=(Outputs&& other) noexcept;
  DETTRIAL_INLINE ~Outputs();

  /// On the chief, the lock of the run folder `output_dir` (a second process there is refused with
  /// an error naming the one that holds it).
  DETTRIAL_INLINE static Outputs lock(const Context& context, const std::filesystem::path& output_dir);
  /// Opens the rest for the fit with `options`, continuing the outputs of a run at batch
  /// `continued_at`: TensorBoard's writer and the MLflow run (on the chief), the reporter, the profiler.
  DETTRIAL_INLINE void open(Context& context, const FitOptions& options, std::optional<std::int64_t> continued_at);

  Reporter& reporter() { return reporter_; }
  TraceProfiler& profiler() { return profiler_; }
  /// Wait for the GPU at each phase's end while profiling, so that the phase timings are the GPU's
  /// (profiling.sync_timings; only inside the profiled range).
  bool sync_timings() const { return sync_timings_ && profiler_.running(); }

  /// One TensorBoard hparams session a folder: a resumed run's folder already starts one. It ends
  /// in close(), as the fit ended.
  DETTRIAL_INLINE void start_tensorboard_session(Context& context);
  /// What the system metrics' sampler samples, and what it cannot (a line, once).
  DETTRIAL_INLINE void announce_system_metrics();
  /// Whether the sampler has reports waiting (an atomic load: asked after each batch).
  bool system_metrics_ready() const noexcept { return system_metrics_.ready(); }
  /// Writes the sampler's waiting reports, at `batches` trained.
  DETTRIAL_INLINE void report_system_metrics(std::int64_t batches, std::int64_t epochs);
  /// Stops the sampler and writes its last reports (training ended or stopped).
  DETTRIAL_INLINE void finish_system_metrics(std::int64_t batches, std::int64_t epochs);
  /// The profiler's summary line, after a profiled range ended.
  DETTRIAL_INLINE void report_profile();
  /// Writes the trace when training ended (or stopped, after batch `last_batch`) inside the profiled range.
  DETTRIAL_INLINE void finish_profiling(std::int64_t last_batch);
  /// The step was captured at batch `batch_idx` (its line).
  DETTRIAL_INLINE void note_capture(std::int64_t batch_idx);
  /// Batch `batch_idx` runs eagerly after the capture (a line the first time).
  DETTRIAL_INLINE void note_eager_batch(std::int64_t batch_idx);
  /// A warning for each callback whose state the checkpoint lacks.
  DETTRIAL_INLINE void warn_missing_callback_states(const std::vector<std::string>& names);
  /// The run's report.html from its metrics.jsonl in `output_dir` (on the chief). A report that
  /// cannot be written is a warning: the training it describes is done and saved.
  DETTRIAL_INLINE void write_report(const Context& context, const std::filesystem::path& output_dir);

  /// How the fit ended, for MLflow's status and TensorBoard's session (succeeded unless `failed`).
  void end_as(MlflowEnd ending) { ending_ = ending; }
  /// Ends the TensorBoard session and the MLflow run as the fit ended, and releases the lock; a
  /// failure to end one is a warning (the fit may be unwinding already). Once.
  DETTRIAL_INLINE void close() noexcept;

 private:
  /// Declared first: released last.
  FolderLock folder_lock_{};
  Reporter reporter_{};
  TraceProfiler profiler_{};
  SystemMetricsSampler system_metrics_{};
  /// A node's system metrics on the first rank of a node other than the chief's.
  MetricsLog node_system_log_{};
  std::unique_ptr<MlflowRun> mlflow_{};
  MlflowEnd ending_ = MlflowEnd::failed;
  /// The writer whose hparams session this fit started (ended in close()).
  TensorBoardWriter* session_ = nullptr;
  bool sync_timings_ = false;
  bool eager_batch_announced_ = false;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>
#include <exception>
#include <type_traits>
#include <utility>
#include <variant>

#include "../../layout.hpp"
#include "../../detail/json.hpp"
#include "../../report/html_report.hpp"
#include "../../report/detail/metrics_log_outlet.hpp"
#include "../../report/detail/runtime.hpp"
#include "../../detail/text.hpp"
#include "../../version.hpp"

namespace dettrial::detail::outputs {
/// The run's MLflow run, when the options or MLFLOW_TRACKING_URI name a server: its params are
/// the hyperparameters, its tags say what ran where.
inline std::unique_ptr<MlflowRun> start_mlflow(const FitOptions& options, Context& context) {
  MlflowSettings wanted = options.mlflow;
  wanted.complete_from_environment();  // a search's trial learns its parent run here: it is named by its id
  const std::string name = wanted.parent_run_id.empty() ? std::filesystem::absolute(options.output_dir).filename().string()
                                                        : "trial " + std::to_string(options.trial_id);
  std::optional<MlflowSettings> settings = tracked_settings(std::move(wanted), name);
  if (!settings) return nullptr;
  MlflowRun::Start start;
  for (const auto& [name, value] : flat_hparams(context.get_hparams())) {
    std::string text = std::visit(
        []<class V>(const V& v) -> std::string {
          if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
          else if constexpr (std::is_arithmetic_v<V>) {
            char number[32];  // as the config wrote it: 32, 0.001
            std::snprintf(number, sizeof number, "%.15g", v);
            return number;
          } else {
            return std::string(v);
          }
        },
        value);
    start.params.emplace_back(name, std::move(text));
  }
  start.tags = {{"dettrial.version", DETTRIAL_VERSION_STRING},
                {"dettrial.system", runtime_summary()},
                {"dettrial.device", context.device().str()},
                {"dettrial.ranks", std::to_string(context.distributed().size)},
                {"dettrial.run_folder", std::filesystem::absolute(options.output_dir).string()}};
  return std::make_unique<MlflowRun>(std::move(*settings), options.output_dir, std::move(start));
}
}  // namespace dettrial::detail::outputs

namespace dettrial::detail {

DETTRIAL_INLINE Outputs::Outputs() = default;

DETTRIAL_INLINE Outputs::Outputs(Outputs&& other) noexcept { *this = std::move(other); }

DETTRIAL_INLINE Outputs& Outputs::operator=(Outputs&& other) noexcept {
  if (this != &other) {
    close();
    folder_lock_ = std::move(other.folder_lock_);
    reporter_ = std::move(other.reporter_);
    profiler_ = std::move(other.profiler_);
    system_metrics_ = std::move(other.system_metrics_);
    node_system_log_ = std::move(other.node_system_log_);
    mlflow_ = std::move(other.mlflow_);
    ending_ = other.ending_;
    session_ = std::exchange(other.session_, nullptr);
    sync_timings_ = other.sync_timings_;
    eager_batch_announced_ = other.eager_batch_announced_;
  }
  return *this;
}

DETTRIAL_INLINE Outputs::~Outputs() { close(); }
DETTRIAL_INLINE Outputs Outputs::lock(const Context& context, const std::filesystem::path& output_dir) {
  Outputs out;
  if (context.distributed().is_chief()) out.folder_lock_ = FolderLock::acquire(RunFolder{output_dir}.lock(), "run folder");
  return out;
}

DETTRIAL_INLINE void Outputs::open(Context& context, const FitOptions& options, std::optional<std::int64_t> continued_at) {
  // One writer per job: the chief reports and writes metrics.jsonl, event files and checkpoints.
  const bool chief = context.distributed().is_chief();
  if (chief) context.get_tensorboard_writer() = TensorBoardWriter(context.get_tensorboard_path(), continued_at);
  if (chief) mlflow_ = detail::outputs::start_mlflow(options, context);
  reporter_ = Reporter(chief, options.report, options.output_dir, continued_at,
                       context.get_enable_tensorboard_logging() ? &context.get_tensorboard_writer() : nullptr, mlflow_.get());
  const bool cuda = context.device().is_cuda();
  if (const auto& profiler = context.profiler_options()) {
    // set_profiler: steps count from this fit's first batch; every rank writes each cycle's trace
    // into the run's TensorBoard folder under its own worker name (host and process).
    profiler_ =
        TraceProfiler(*profiler, continued_at.value_or(0), {RunFolder{options.output_dir}.tensorboard(), /*one_a_cycle=*/true}, cuda);
    sync_timings_ = options.profiling.sync_timings && cuda;
  } else if (options.profiling.enabled) {
    // Every rank profiles its own process: the chief into trace.json, rank r into trace.rank<r>.json.
    const int rank = context.distributed().rank;
    profiler_ = TraceProfiler::for_section(options.profiling, RunFolder{options.output_dir}.trace(rank), cuda);
    sync_timings_ = options.profiling.sync_timings && cuda;
  }
  // The system metrics are the machine's: one sampler a node, on its first rank (as Determined's).
  if (options.profiling.enabled && context.distributed().local_rank == 0) {
    const std::filesystem::path disk = options.checkpoint_dir.empty() ? options.output_dir : options.checkpoint_dir;
    system_metrics_ = SystemMetricsSampler({.interval = std::chrono::duration<double>(options.profiling.sampling_interval),
                                            .samples_per_report = options.profiling.samples_per_report,
                                            .disk = std::filesystem::exists(disk) ? disk : options.output_dir});
    if (!chief)
      node_system_log_ =
          MetricsLog(options.output_dir, RunFolder{options.output_dir}.system_log(context.distributed().get_cross_rank()), continued_at);
  }
}

DETTRIAL_INLINE void Outputs::announce_system_metrics() {
  if (!system_metrics_.running()) return;
  std::string line =
      "dettrial: system metrics (profiling.enabled) sampled every " + detail::number_text(system_metrics_.interval_seconds()) +
      " s, each report averaging " + std::to_string(system_metrics_.samples_per_report()) + " sample(s), into " +
      (node_system_log_.enabled() ? node_system_log_.path().string() : std::string("metrics.jsonl and TensorBoard (system/*)"));
  for (const std::string& note : system_metrics_.notes()) line += "; " + note;
  reporter_.line(line);
}

DETTRIAL_INLINE void Outputs::report_system_metrics(std::int64_t batches, std::int64_t epochs) {
  // A report that cannot be written is left out: the training goes on.
  try {
    for (const SystemReport& report : system_metrics_.take()) {
      if (node_system_log_.enabled()) node_system_log_.write("system", batches, epochs, MetricValues{}, system_record(report));
      else reporter_.system(batches, epochs, report);
    }
  } catch (const std::exception& e) {
    reporter_.line(std::string("dettrial: warning: a system metrics report was not written: ") + e.what());
  }
}

DETTRIAL_INLINE void Outputs::finish_system_metrics(std::int64_t batches, std::int64_t epochs) {
  if (!system_metrics_.running()) return;
  system_metrics_.stop();
  report_system_metrics(batches, epochs);
  if (const std::size_t dropped = system_metrics_.dropped(); dropped > 0)
    reporter_.line("dettrial: warning: " + std::to_string(dropped) + " system metrics report(s) were dropped (none was taken for " +
                   std::to_string(SystemMetricsSampler::max_queued) + " reports)");
}

DETTRIAL_INLINE void Outputs::start_tensorboard_session(Context& context) {
  TensorBoardWriter& writer = context.get_tensorboard_writer();
  if (!writer.has_session()) writer.add_hparams(flat_hparams(context.get_hparams()));
  session_ = &writer;
}

DETTRIAL_INLINE void Outputs::report_profile() { reporter_.line("dettrial: " + profiler_.summary()); }

DETTRIAL_INLINE void Outputs::finish_profiling(std::int64_t last_batch) {
  if (profiler_.finish(last_batch)) report_profile();
}

DETTRIAL_INLINE void Outputs::note_capture(std::int64_t batch_idx) {
  reporter_.line("dettrial: training step captured in a CUDA graph at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE void Outputs::note_eager_batch(std::int64_t batch_idx) {
  if (!eager_batch_announced_)
    reporter_.line("dettrial: batch " + std::to_string(batch_idx) + " has other shapes than the captured batch; such batches run eagerly");
  eager_batch_announced_ = true;
}

DETTRIAL_INLINE void Outputs::warn_missing_callback_states(const std::vector<std::string>& names) {
  for (const std::string& name : names) reporter_.line("dettrial: warning: the checkpoint has no state for callback '" + name + "'");
}

DETTRIAL_INLINE void Outputs::write_report(const Context& context, const std::filesystem::path& output_dir) {
  if (!context.distributed().is_chief()) return;
  try {
    const auto path = write_run_report(output_dir);
    reporter_.line("dettrial: report " + path.string());
  } catch (const std::exception& e) {
    reporter_.line(std::string("dettrial: warning: no report.html: ") + e.what());
  }
}

DETTRIAL_INLINE void Outputs::close() noexcept {
  system_metrics_.stop();
  if (TensorBoardWriter* writer = std::exchange(session_, nullptr)) {
    try {
      writer->end_session(ending_ != MlflowEnd::failed);
      writer->flush();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the TensorBoard session did not end cleanly: %s\n", e.what());
    }
  }
  if (const std::unique_ptr<MlflowRun> mlflow = std::move(mlflow_)) {
    try {
      mlflow->end(ending_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the MLflow run did not end cleanly: %s\n", e.what());
    }
  }
  folder_lock_ = FolderLock{};
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
