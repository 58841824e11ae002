// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::RunState: one fit's state and the part of Determined's loop that does not depend
/// on the trial type (options, boundaries, reports, agreement across ranks, the checkpoint policy).
/// Compiled once (dettrial::compiled in separate-compilation mode): Trainer<T> keeps only what calls
/// the trial, its loaders and its callbacks.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../checkpoint/checkpointer.hpp"
#include "../checkpoint/trial_checkpoint.hpp"
#include "../config/units.hpp"
#include "../context/context.hpp"
#include "../detail/folder_lock.hpp"
#include "../distributed/metrics.hpp"
#include "../error.hpp"
#include "../metrics/reducers.hpp"
#include "../report/profiler.hpp"
#include "../report/reporter.hpp"
#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"
#include "fit_options.hpp"

namespace dettrial::detail {

/// Which boundaries the last batch of a workload reached (Determined handles them in this order).
struct Reached {
  bool length = false;
  bool validation = false;
  bool checkpoint = false;
  bool report = false;
  bool any() const { return length || validation || checkpoint || report; }
};

/// What a training workload accumulates; kept across workloads so that a batch allocates nothing.
struct Workload {
  WorkloadMeans means;
  std::vector<Metrics> batch_metrics{};  // kept only when a callback asks for them
  std::int64_t records = 0;
  PhaseTimes phases{};
  /// The end of the last timed phase.
  std::chrono::steady_clock::time_point mark{};
};

/**
 * @brief One fit: its options with every period in batches, where it stands (TrialProgress), and
 * what writes, reports and profiles it. Its functions are the loop's steps that do not call the
 * trial; Trainer<T> calls them between the trial's hooks.
 */
struct RunState {
  // Made, moved and destroyed where compiled (a trial's translation unit compiles none of its members' code).
  DETTRIAL_INLINE RunState();
  DETTRIAL_INLINE RunState(RunState&&) noexcept;
  DETTRIAL_INLINE RunState& operator=(RunState&&) noexcept;
  DETTRIAL_INLINE ~RunState();

  FitOptions options;
  /// The run folder's lock, held by the chief from begin() to end() (declared before the
  /// checkpointer: released after a write in flight ends).
  FolderLock folder_lock{};
  TrainUnit length = Batch(1);
  std::int64_t epoch_len = 0;
  /// The rank count whose global batches the training data follows (TrialProgress::data_ranks).
  std::int64_t data_ranks = 1;
  /// The training loader's own batches per epoch on this rank (epoch_len, unless records_per_epoch sets it).
  std::int64_t data_epoch_len = 0;
  /// Where the trial stands: batches and epochs trained, the last validation and checkpoint, the
  /// best searcher metric (what a checkpoint saves as `trial_state.json`; its data seeds are filled
  /// in when it is saved).
  TrialProgress progress{};
  bool warned_best_without_metric = false;
  /// Where checkpoints go, when, and how they are written, restored and retained.
  Checkpointer checkpointer{};
  /// The checkpoint resumed from, and where it says the trial stood.
  std::optional<std::filesystem::path> resume_dir{};
  std::optional<TrialProgress> resumed{};
  bool same_trial = false;
  FitResult result{};
  /// The run in MLflow (on the chief, when tracked), and the status it ends with.
  std::unique_ptr<MlflowRun> mlflow{};
  MlflowEnd mlflow_status = MlflowEnd::failed;
  Reporter reporter{};
  TraceProfiler profiler{};
  /// Wait for the GPU at each phase's end while profiling, so that the phase timings are the GPU's (profiling.sync_timings).
  bool sync_timings = false;
  /// Whether the first eager batch after a capture was announced.
  bool eager_batch_announced = false;

  /// Checks the options, finds (and checks) the checkpoint to resume from before anything is
  /// written, and sets up the output folder, checkpoint storage, reporter and profiler.
  DETTRIAL_INLINE static RunState begin(Context& context, FitOptions options);

  /// The batch this fit starts from: the one the resumed checkpoint of the same trial stood at.
  std::int64_t first_batch() const { return same_trial ? resumed->batches_trained : 0; }
  /// The epoch length from the chief's sharded length (agreed already) and records_per_epoch,
  /// and the run's position in the context.
  DETTRIAL_INLINE void settle_epoch_length(Context& context);
  /// A run begun on `began` ranks continues on this job's: its global batch must divide among them
  /// (throws ConfigError, naming both counts, where it does not).
  DETTRIAL_INLINE static void check_global_batch_divides(const Context& context, std::int64_t began);
  /// With reproducibility.rank_invariant and aggregation, every boundary must fall on an update's
  /// last batch: the micro-batches of an update are kept apart until it, and no checkpoint holds
  /// them (throws ConfigError naming the period that does not).
  DETTRIAL_INLINE void check_rank_invariant_boundaries(const Context& context) const;
  /// After a restore: the position the training stream starts from; every rank takes rank 0's weights.
  DETTRIAL_INLINE void start_position(Context& context);
  /// The fit options that place boundaries must be the same on every rank (throws where not).
  DETTRIAL_INLINE void require_same_settings(Communicator& comm, const Context& context) const;

  /// The run's first lines: the runtime, the trial, the job, the checkpoint resumed from.
  DETTRIAL_INLINE void announce(Context& context);
  /// One TensorBoard hparams session a folder: a resumed run's folder already starts one.
  DETTRIAL_INLINE static void start_tensorboard_session(Context& context);
  /// The session ends as the fit does: failed when it throws.
  DETTRIAL_INLINE static void end_tensorboard_session(Context& context, bool succeeded) noexcept;
  /// The profiler's summary line, after a profiled range ended.
  DETTRIAL_INLINE void report_profile();
  /// The step was captured at batch `batch_idx` (its line).
  DETTRIAL_INLINE void note_capture(std::int64_t batch_idx);
  /// Batch `batch_idx` runs eagerly after the capture (a line the first time).
  DETTRIAL_INLINE void note_eager_batch(std::int64_t batch_idx);
  /// A warning for each callback whose state the checkpoint lacks.
  DETTRIAL_INLINE void warn_missing_callback_states(const std::vector<std::string>& names);
  /// The trial trained to its length: retention applies without sparing the newest checkpoint.
  DETTRIAL_INLINE void complete(const Context& context);
  /// The fit's result, with what it trained, after its report is written.
  DETTRIAL_INLINE FitResult finish(const Context& context);
  /// However the fit ends: a checkpoint write in flight ends (a failure is a warning then), and
  /// the run folder's lock is released.
  DETTRIAL_INLINE void release() noexcept;
  /// Writes the trace when training ended (or stopped) inside the profiled range.
  DETTRIAL_INLINE void finish_profiling();
  /// The run's report.html, from its metrics.jsonl (on the chief). A report that cannot be written
  /// is a warning: the training it describes is done and saved.
  DETTRIAL_INLINE void write_report(const Context& context);

  /// Batches (or epochs) still to train.
  std::int64_t remaining() const {
    return length.unit() == Unit::epochs ? length.value() - progress.epochs_trained : length.value() - progress.batches_trained;
  }
  /// Determined's boundary rule: batch periods on batches completed; epoch periods on the last batch
  /// of an epoch, on epochs completed.
  DETTRIAL_INLINE Reached boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const;

  /// A workload begins: models in training mode, training reducers and the workload's sums reset.
  DETTRIAL_INLINE void begin_workload(Context& context, Workload& workload);
  /// The workload's training metrics over all ranks (reported, and kept as the last ones).
  DETTRIAL_INLINE const MetricValues& report_training(Context& context, const Workload& workload);

  /// A validation begins: rank 0's buffers, models in evaluation mode, validation reducers reset.
  DETTRIAL_INLINE static void begin_validation(Context& context);
  /// This rank's share and every other's, reduced: the validation's metrics, as the callbacks get them.
  DETTRIAL_INLINE MetricValues reduce_validation(Context& context, RankShare mine, std::int64_t& records) const;
  /// After on_validation_end: LR schedulers on the metrics, counters, report. Returns the metrics
  /// with `batches` and `epochs`, as reported and as the checkpoint policy reads them.
  DETTRIAL_INLINE const MetricValues& finish_validation(Context& context, const MetricValues& metrics, std::int64_t records);
  /// After a validation: tracks the best searcher metric; whether the policy asks for a checkpoint.
  DETTRIAL_INLINE bool checkpoint_after_validation(Context& context, const MetricValues& reported);

  /// What a checkpoint saves besides the state, with the loaders' data seeds.
  DETTRIAL_INLINE TrialCheckpointRecord checkpoint_record(const Context& context, std::optional<std::uint64_t> training_data_seed,
                                                          std::optional<std::uint64_t> validation_data_seed, std::string trial_type) const;
  /// A checkpoint the chief wrote: recorded, reported, and retention applied sparing it.
  DETTRIAL_INLINE void checkpoint_written(const WrittenCheckpoint& written);
  /// Training stops early (after its checkpoint) for `signal`, or 0 for a stop request: the result
  /// says why, and a line says so.
  DETTRIAL_INLINE void stopped(int signal);
};

/// `runs/<date>-<time>-<pid>` under the working directory.
DETTRIAL_INLINE std::filesystem::path default_output_dir();

/// The training loader's endless stream ended (a DataError naming the batch).
[[noreturn]] DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx);

/// A configuration error (exit status 78): every trial of a search would fail the same way.
DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics);

/// Every wrapped optimizer's learning rates, named as LearningRates says; an optimizer whose
/// options cannot tell theirs (a custom type without get_lr) is left out.
DETTRIAL_INLINE LearningRates learning_rates(const Context& context);

/// Merges the user reducers taking part (`role`: for_training or for_validation) into `out`, each
/// reducing the parts of every rank.
DETTRIAL_INLINE void reduce_user_reducers(Context& context, bool WrappedReducer::* role, const std::vector<RankShare>& shares,
                                          MetricValues& out);

/// Every rank takes rank 0's buffers (see broadcast_buffers: DDP's broadcast_buffers, at the
/// boundaries that read them).
DETTRIAL_INLINE void agree_on_buffers(Context& context);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstring>
#include <ctime>
#include <iterator>
#include <unistd.h>

#include <cstdio>
#include <exception>

#include "../checkpoint/storage.hpp"
#include "../detail/signals.hpp"
#include "../detail/yaml.hpp"
#include "../distributed/agreement.hpp"
#include "../layout.hpp"
#include "../report/html_report.hpp"
#include "../report/runtime.hpp"
#include "../version.hpp"

namespace dettrial::detail {

namespace run_state_detail {
inline TrainUnit resolve_length(const FitOptions& o, const Context& context) {
  if (o.test_mode) return Batch(1);
  if (!o.max_length)
    throw ConfigError(
        "fit() needs a training length: set FitOptions::max_length (Batch, Epoch or Record), or "
        "searcher.max_length in the experiment config and build the options with FitOptions::from_config");
  TrainUnit length = *o.max_length;
  if (length.is_schedule()) throw ConfigError("max_length must be a count, not a schedule of points");
  if (length.unit() == Unit::records) length = length.in_batches_if_records(context.get_global_batch_size());
  if (length.value() < 1) throw ConfigError("max_length is " + length.to_string() + "; training needs a max_length of at least 1");
  return length;
}
inline TrainUnit resolve_period(const TrainUnit& period, const Context& context) {
  return period.unit() == Unit::records ? period.in_batches_if_records(context.get_global_batch_size()) : period;
}
/// The profiler of `st`'s fit: set_profiler's schedule, or the config's profiling section.
inline void start_profiler(RunState& st, Context& context, std::optional<std::int64_t> resumed_at) {
  const FitOptions& o = st.options;
  if (const auto& profiler = context.profiler_options()) {
    // set_profiler: steps count from this fit's first batch; every rank writes each cycle's trace
    // into the run's TensorBoard folder under its own worker name (host and process).
    st.profiler = TraceProfiler(*profiler, resumed_at.value_or(0), {RunFolder{o.output_dir}.tensorboard(), /*one_a_cycle=*/true},
                                context.device().is_cuda());
    st.sync_timings = o.profiling.sync_timings && context.device().is_cuda();
  } else if (o.profiling.enabled) {
    // Every rank profiles its own process: the chief into trace.json, rank r into trace.rank<r>.json.
    const int rank = context.distributed().rank;
    st.profiler = TraceProfiler::for_section(o.profiling, RunFolder{o.output_dir}.trace(rank), context.device().is_cuda());
    st.sync_timings = o.profiling.sync_timings && context.device().is_cuda();
  }
}
/// The run's MLflow run, when the options or MLFLOW_TRACKING_URI name a server: its params are
/// the hyperparameters, its tags say what ran where.
inline std::unique_ptr<MlflowRun> start_mlflow(RunState& st, Context& context) {
  MlflowSettings wanted = st.options.mlflow;
  wanted.complete_from_environment();  // a search's trial learns its parent run here: it is named by its id
  const std::string name = wanted.parent_run_id.empty() ? std::filesystem::absolute(st.options.output_dir).filename().string()
                                                        : "trial " + std::to_string(st.options.trial_id);
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
                {"dettrial.system", runtime_summary(context.threads().source, context.thread_pools().text())},
                {"dettrial.device", context.device().str()},
                {"dettrial.ranks", std::to_string(context.distributed().size)},
                {"dettrial.run_folder", std::filesystem::absolute(st.options.output_dir).string()}};
  return std::make_unique<MlflowRun>(std::move(*settings), st.options.output_dir, std::move(start));
}
}  // namespace run_state_detail

DETTRIAL_INLINE RunState RunState::begin(Context& context, FitOptions options) {
  RunState st;
  st.options = std::move(options);
  FitOptions& o = st.options;
  if (o.output_dir.empty()) o.output_dir = default_output_dir();
  // Before anything in the folder is read or written: a second process there is refused.
  if (context.distributed().is_chief()) st.folder_lock = FolderLock::acquire(RunFolder{o.output_dir}.lock(), "run folder");
  st.length = run_state_detail::resolve_length(o, context);
  o.validation_period = run_state_detail::resolve_period(o.validation_period, context);
  o.checkpoint_period = run_state_detail::resolve_period(o.checkpoint_period, context);
  o.reporting_period = run_state_detail::resolve_period(o.reporting_period, context);
  if (o.retention.save_trial_best < 0 || o.retention.save_trial_latest < 0)
    throw ConfigError("checkpoint retention counts (save_trial_best, save_trial_latest) must not be negative");
  if (o.latest_checkpoint) {
    st.resume_dir = resolve_checkpoint(*o.latest_checkpoint);
    const CheckpointInfo info = read_checkpoint_info(*st.resume_dir);
    if (info.by_determined) {
      // Determined's trial ids belong to its master, which a moved run leaves behind: a checkpoint
      // Determined wrote is this trial's own, continued where it stood.
      st.resumed = TrialProgress::from_determined(*st.resume_dir, info);
      st.resumed->trial_id = o.trial_id;
    } else {
      st.resumed = TrialProgress::from_json(CheckpointFolder{*st.resume_dir}.trial_state());
    }
    st.same_trial = st.resumed->trial_id == o.trial_id;
  }
  st.result.output_dir = o.output_dir;
  detail::ContextAccess::position(context).output_dir = o.output_dir;
  const std::filesystem::path storage = o.checkpoint_dir.empty() ? RunFolder{o.output_dir}.checkpoints() : o.checkpoint_dir;
  st.result.checkpoint_dir = storage;
  // One writer per job: the chief reports and writes metrics.jsonl, event files and checkpoints.
  const bool chief = context.distributed().is_chief();
  const std::optional<std::int64_t> resumed_at = st.same_trial ? std::optional(st.resumed->batches_trained) : std::nullopt;
  if (chief) context.get_tensorboard_writer() = TensorBoardWriter(context.get_tensorboard_path(), resumed_at);
  if (chief) st.mlflow = run_state_detail::start_mlflow(st, context);
  st.reporter = Reporter(chief, o.report, o.output_dir, resumed_at,
                         context.get_enable_tensorboard_logging() ? &context.get_tensorboard_writer() : nullptr, st.mlflow.get());
  run_state_detail::start_profiler(st, context, resumed_at);
  st.checkpointer = Checkpointer(context, storage, o.checkpoint_policy, o.retention, o.smaller_is_better, o.async_checkpoints);
  return st;
}

DETTRIAL_INLINE void RunState::check_global_batch_divides(const Context& context, std::int64_t began) {
  const std::optional<std::int64_t> given = context.get_hparams().global_batch_size();
  if (!given) return;  // the loader's batch size is then the rank's own choice
  const std::int64_t global = *given;
  const std::int64_t ranks = context.distributed().size;
  if (global % ranks != 0)
    throw ConfigError("global_batch_size " + std::to_string(global) + " does not divide among " + std::to_string(ranks) +
                      " ranks: this run began on " + std::to_string(began) +
                      " and keeps its global batch when resumed; resume on a rank count that divides " + std::to_string(global));
}

DETTRIAL_INLINE void RunState::check_rank_invariant_boundaries(const Context& context) const {
  const std::int64_t agg = context.aggregation_frequency();
  if (!context.rank_invariant() || agg == 1) return;
  const std::pair<const char*, const TrainUnit*> periods[] = {{"max_length", &length},
                                                              {"the validation period", &options.validation_period},
                                                              {"the checkpoint period", &options.checkpoint_period},
                                                              {"the reporting period", &options.reporting_period}};
  for (const auto& [name, period] : periods) {
    if (period->is_never()) continue;
    const std::int64_t per_batch = period->unit() == Unit::epochs ? epoch_len : 1;
    std::vector<std::int64_t> ends = period->is_schedule() ? period->points() : std::vector<std::int64_t>{period->value()};
    for (const std::int64_t end : ends)
      if (end > 0 && end * per_batch % agg != 0)
        throw ConfigError(std::string("reproducibility.rank_invariant keeps an update's batches apart until its last one, so ") + name +
                          " (" + period->to_string() + (per_batch > 1 ? ", epochs of " + std::to_string(epoch_len) + " batches" : "") +
                          ") must end on a multiple of aggregation_frequency " + std::to_string(agg) + " batches");
  }
  if (progress.batches_trained % agg != 0)
    throw ConfigError("reproducibility.rank_invariant cannot resume at batch " + std::to_string(progress.batches_trained) +
                      ", between the batches of an update (aggregation_frequency " + std::to_string(agg) + ")");
}

DETTRIAL_INLINE void RunState::settle_epoch_length(Context& context) {
  if (epoch_len < 1) throw DataError("the training data loader yields no batches (its size() is 0)");
  data_epoch_len = epoch_len;
  // Determined's records_per_epoch: the epoch of epoch-based lengths, periods, LR steps and epoch
  // hooks, in global batches (its legacy sequencer's records_per_epoch // global_batch_size, at
  // least 1), whatever the loader's own length; the data still reshuffles at its own epochs.
  if (const std::int64_t records = context.get_experiment_config().records_per_epoch; records > 0)
    epoch_len = std::max<std::int64_t>(records / context.get_global_batch_size(), 1);
  detail::ContextAccess::position(context).epoch_len = epoch_len;
}

DETTRIAL_INLINE void RunState::start_position(Context& context) {
  RunPosition& position = detail::ContextAccess::position(context);
  position.initial_batch = progress.batches_trained;  // the training stream skips what was trained
  position.current_batch = progress.batches_trained;
  result.resumed_from_batch = progress.batches_trained;
  if (Communicator* comm = context.communicator()) broadcast_modules(*comm, context.models());  // every rank starts from rank 0's weights
}

DETTRIAL_INLINE void RunState::require_same_settings(Communicator& comm, const Context& context) const {
  const FitOptions& o = options;
  const RankSetting placing_boundaries[] = {
      {"max_length", length.to_string()},
      {"the validation period", o.validation_period.to_string()},
      {"the checkpoint period", o.checkpoint_period.to_string()},
      {"the reporting period", o.reporting_period.to_string()},
      {"test mode", o.test_mode ? "on" : "off"},
      {"step-zero validation", o.step_zero_validation ? "on" : "off"},
      {"the checkpoint policy", std::to_string(static_cast<int>(o.checkpoint_policy))},
      {"the searcher metric", o.searcher_metric + (o.smaller_is_better ? " (smaller is better)" : " (larger is better)")},
      {"the batch resumed from", std::to_string(first_batch())},
      {"aggregation_frequency", std::to_string(context.aggregation_frequency())},
      {"the global batch size", context.has_global_batch_size() ? std::to_string(context.get_global_batch_size()) : "-"}};
  detail::require_same_settings(comm, placing_boundaries);
}

DETTRIAL_INLINE void RunState::announce(Context& context) {
  const FitOptions& o = options;
  reporter.line("dettrial " DETTRIAL_VERSION_STRING ": " + runtime_summary(context.threads().source, context.thread_pools().text()));
  reporter.line("dettrial: trial seed " + std::to_string(context.get_trial_seed()) + ", device " + context.device().str() + ", training " +
                length.to_string() + " (an epoch is " + std::to_string(epoch_len) + " batches), output " + o.output_dir.string());
  if (const Communicator* comm = context.communicator())
    reporter.line("dettrial: " + std::to_string(comm->size()) + " processes (" + launcher_name(comm->environment().launcher) + ", " +
                  comm->backend_name() + "), rendezvous at " + comm->environment().master_addr + ":" +
                  std::to_string(comm->environment().master_port) + ", global batch " + std::to_string(context.get_global_batch_size()));
  if (resume_dir)
    reporter.line("dettrial: resumed from " + resume_dir->string() +
                  (same_trial ? " at batch " + std::to_string(progress.batches_trained)
                              : std::string(" (another trial's checkpoint: weights and optimizer state only)")));
  const std::int64_t ranks = context.distributed().size;
  if (same_trial && (o.restart > 0 || (resumed->ranks > 0 && resumed->ranks != ranks)))
    reporter.restart(progress.batches_trained, progress.epochs_trained, resumed->ranks > 0 ? resumed->ranks : ranks, ranks, o.restart);
  if (data_ranks != ranks)
    reporter.line("dettrial: the training data keeps the global batches of the " + std::to_string(data_ranks) +
                  "-rank job this run began as: each of the " + std::to_string(ranks) + " ranks trains its share of each");
  if (const auto* graph = std::get_if<capture::cuda_graph>(&o.step_capture))
    reporter.line("dettrial: the training step is captured in a CUDA graph after " + std::to_string(graph->warmup_batches) +
                  " eager batch(es), and replayed; batches of other shapes run eagerly");
  if (const auto& profiler = context.profiler_options()) {
    const ProfilerSchedule& s = profiler->schedule;
    reporter.line("dettrial: profiling on set_profiler's schedule (skip_first " + std::to_string(s.skip_first) + ", wait " +
                  std::to_string(s.wait) + ", warmup " + std::to_string(s.warmup) + ", active " + std::to_string(s.active) + ", repeat " +
                  std::to_string(s.repeat) + ", from batch " + std::to_string(progress.batches_trained) + "); each cycle's trace in " +
                  RunFolder{o.output_dir}.tensorboard().string() +
                  (o.profiling.enabled ? " (the config's profiling section is not used)" : ""));
  } else if (o.profiling.enabled)
    reporter.line("dettrial: profiling batches " + std::to_string(o.profiling.begin_on_batch) + " to " +
                  (o.profiling.end_after_batch ? std::to_string(*o.profiling.end_after_batch) : std::string("the end of training")) +
                  " with LibTorch's profiler" + (sync_timings ? ", timings synchronized with the GPU" : "") + "; trace in " +
                  o.output_dir.string());
  if (const std::int64_t records = context.get_experiment_config().records_per_epoch; records > 0)
    reporter.line("dettrial: records_per_epoch " + std::to_string(records) + " sets the epoch: " + std::to_string(epoch_len) +
                  " batches of " + std::to_string(context.get_global_batch_size()) + " records (the training data loader's own epoch is " +
                  std::to_string(data_epoch_len) + " batches on this rank)");
}

DETTRIAL_INLINE void RunState::finish_profiling() {
  if (profiler.finish(progress.batches_trained - 1)) reporter.line("dettrial: " + profiler.summary());
}

DETTRIAL_INLINE void RunState::write_report(const Context& context) {
  if (!context.distributed().is_chief()) return;
  try {
    const auto path = write_run_report(options.output_dir);
    reporter.line("dettrial: report " + path.string());
  } catch (const std::exception& e) {
    reporter.line(std::string("dettrial: warning: no report.html: ") + e.what());
  }
}

DETTRIAL_INLINE Reached RunState::boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const {
  auto hit = [&](const TrainUnit& u) {
    return u.unit() == Unit::epochs ? epoch_end && u.reached(epoch_idx + 1) : u.reached(batch_idx + 1);
  };
  return Reached{.length = options.test_mode || hit(length),
                 .validation = hit(options.validation_period),
                 .checkpoint = hit(options.checkpoint_period),
                 .report = hit(options.reporting_period)};
}

DETTRIAL_INLINE void RunState::begin_workload(Context& context, Workload& workload) {
  for (const auto& m : context.models()) m->train();
  for (auto& r : detail::ContextAccess::reducers(context))
    if (r.for_training) r.reset(r.object);
  workload.means.reset();
  workload.batch_metrics.clear();
  workload.records = 0;
  workload.phases.reset();
  workload.phases.checkpoint_wait = checkpointer.take_waited_seconds();
  workload.mark = std::chrono::steady_clock::now();
  reporter.begin("train", progress.batches_trained, length.unit() == Unit::epochs ? length.value() * epoch_len : length.value(), "batches");
}

DETTRIAL_INLINE const MetricValues& RunState::report_training(Context& context, const Workload& workload) {
  const double seconds = reporter.elapsed();
  RankShare mine{.batches = workload.means.batches(), .records = workload.records};
  for (const auto& [name, value] : workload.means.means()) mine.totals.push_back({name, Reducer::avg, value});
  for (auto& r : detail::ContextAccess::reducers(context))
    if (r.for_training) mine.reducer_parts.push_back(r.per_slot(r.object));
  const auto shares = gather_shares(std::move(mine), context.communicator());
  MetricValues avg;
  avg.set("batches", static_cast<double>(progress.batches_trained));
  avg.set("epochs", static_cast<double>(progress.epochs_trained));
  for (const auto& [name, value] : combine_training(shares)) avg.set(name, value);
  reduce_user_reducers(context, &WrappedReducer::for_training, shares, avg);
  // The whole job's records (every rank's), over the chief's clock.
  const double rate = seconds > 0 ? static_cast<double>(total_records(shares)) / seconds : 0.0;
  reporter.training(progress.batches_trained, progress.epochs_trained, avg, rate, seconds, workload.phases, learning_rates(context));
  result.last_training_metrics = std::move(avg);
  return result.last_training_metrics;
}

DETTRIAL_INLINE void RunState::begin_validation(Context& context) {
  agree_on_buffers(context);
  for (const auto& m : context.models()) m->eval();
  for (auto& r : detail::ContextAccess::reducers(context))
    if (r.for_validation) r.reset(r.object);
}

DETTRIAL_INLINE MetricValues RunState::reduce_validation(Context& context, RankShare mine, std::int64_t& records) const {
  for (auto& r : detail::ContextAccess::reducers(context))
    if (r.for_validation) mine.reducer_parts.push_back(r.per_slot(r.object));
  const auto shares = gather_shares(std::move(mine), context.communicator());
  // Decided from the gathered shares, so every rank throws (or goes on) together.
  if (total_batches(shares) == 0) throw DataError("the validation data loader yielded no batches");
  MetricValues metrics = combine_validation(shares);
  reduce_user_reducers(context, &WrappedReducer::for_validation, shares, metrics);
  records = total_records(shares);
  return metrics;
}

DETTRIAL_INLINE const MetricValues& RunState::finish_validation(Context& context, const MetricValues& metrics, std::int64_t records) {
  context.step_lr_schedulers_on_validation(metrics);  // the same reduced metrics on every rank
  progress.last_validation = progress.batches_trained;
  ++result.validations;
  MetricValues reported;
  reported.set("batches", static_cast<double>(progress.batches_trained));
  reported.set("epochs", static_cast<double>(progress.epochs_trained));
  for (const auto& [name, value] : metrics) reported.set(name, value);
  reporter.validation(progress.batches_trained, progress.epochs_trained, reported, records, reporter.elapsed());
  result.last_validation_metrics = std::move(reported);
  return result.last_validation_metrics;
}

DETTRIAL_INLINE bool RunState::checkpoint_after_validation(Context& context, const MetricValues& reported) {
  bool improved = true;  // without a searcher metric every validation counts as the best so far
  if (!options.searcher_metric.empty()) {
    const auto value = reported.get(options.searcher_metric);
    if (!value) throw missing_searcher_metric(options.searcher_metric, reported);
    improved = MetricOrder{options.smaller_is_better}.improves(*value, progress.best_validation);
    // Every rank holds the same gathered metrics; the chief's decision is still the one acted on,
    // because a checkpoint is a collective that all ranks enter or none.
    if (Communicator* comm = context.communicator()) improved = comm->broadcast_values({improved ? 1 : 0})[0] != 0;
    if (improved) progress.best_validation = *value;
  } else if (options.checkpoint_policy == CheckpointPolicy::best && !warned_best_without_metric) {
    reporter.line("dettrial: checkpoint_policy 'best' has no searcher metric to compare; checkpointing after every validation");
    warned_best_without_metric = true;
  }
  return checkpointer.after_validation(improved);
}

DETTRIAL_INLINE TrialCheckpointRecord RunState::checkpoint_record(const Context& context, std::optional<std::uint64_t> training_data_seed,
                                                                  std::optional<std::uint64_t> validation_data_seed,
                                                                  std::string trial_type) const {
  TrialProgress saved = progress;
  saved.trial_id = options.trial_id;
  saved.training_data_seed = training_data_seed;
  saved.validation_data_seed = validation_data_seed;
  saved.ranks = context.distributed().size;
  saved.data_ranks = data_ranks;
  const bool validated_here = progress.last_validation == progress.batches_trained && !options.searcher_metric.empty();
  return {.progress = std::move(saved),
          .mid_aggregation = progress.batches_trained % context.aggregation_frequency() != 0,
          .searcher_metric = options.searcher_metric,
          .validation_metric = validated_here ? result.last_validation_metrics.get(options.searcher_metric) : std::nullopt,
          .trial_type = std::move(trial_type)};
}

DETTRIAL_INLINE void RunState::checkpoint_written(const WrittenCheckpoint& written) {
  result.checkpoints.push_back(written.info);
  reporter.checkpoint(written.info.batches_trained, written.info.epochs_trained, written.info.path, written.seconds, written.write_seconds);
  checkpointer.apply_retention(written.info.uuid);
}

DETTRIAL_INLINE void RunState::stopped(int signal) {
  result.signal = signal;
  result.stop_requested = true;
  result.stopped_early = remaining() > 0;
  const std::string after = " after batch " + std::to_string(progress.batches_trained);
  if (signal != 0)
    reporter.line(std::string("dettrial: stopped by ") + signal_name(signal) + after + "; resume from " + checkpointer.storage().string());
  else reporter.line("dettrial: stop requested; stopped" + after);
}

DETTRIAL_INLINE RunState::RunState() = default;
DETTRIAL_INLINE RunState::RunState(RunState&&) noexcept = default;
DETTRIAL_INLINE RunState& RunState::operator=(RunState&&) noexcept = default;
DETTRIAL_INLINE RunState::~RunState() = default;

DETTRIAL_INLINE void RunState::start_tensorboard_session(Context& context) {
  if (!context.get_tensorboard_writer().has_session()) context.get_tensorboard_writer().add_hparams(flat_hparams(context.get_hparams()));
}

DETTRIAL_INLINE void RunState::end_tensorboard_session(Context& context, bool succeeded) noexcept {
  try {
    context.get_tensorboard_writer().end_session(succeeded);
    context.get_tensorboard_writer().flush();
  } catch (const std::exception& e) {  // ends a fit that may be unwinding already
    std::fprintf(stderr, "dettrial: warning: the TensorBoard session did not end cleanly: %s\n", e.what());
  }
}

DETTRIAL_INLINE void RunState::report_profile() { reporter.line("dettrial: " + profiler.summary()); }

DETTRIAL_INLINE void RunState::note_capture(std::int64_t batch_idx) {
  reporter.line("dettrial: training step captured in a CUDA graph at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE void RunState::note_eager_batch(std::int64_t batch_idx) {
  if (!eager_batch_announced)
    reporter.line("dettrial: batch " + std::to_string(batch_idx) + " has other shapes than the captured batch; such batches run eagerly");
  eager_batch_announced = true;
}

DETTRIAL_INLINE void RunState::warn_missing_callback_states(const std::vector<std::string>& names) {
  for (const std::string& name : names) reporter.line("dettrial: warning: the checkpoint has no state for callback '" + name + "'");
}

DETTRIAL_INLINE void RunState::complete(const Context& context) {
  if (context.distributed().is_chief()) checkpointer.apply_retention({});
}

DETTRIAL_INLINE FitResult RunState::finish(const Context& context) {
  result.batches_trained = progress.batches_trained;
  result.epochs_trained = progress.epochs_trained;
  mlflow_status = result.signal != 0 ? MlflowEnd::killed : MlflowEnd::finished;
  write_report(context);
  return std::move(result);
}

DETTRIAL_INLINE void RunState::release() noexcept {
  checkpointer.settle();
  if (mlflow) {
    try {
      mlflow->end(mlflow_status);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the MLflow run did not end cleanly: %s\n", e.what());
    }
  }
  folder_lock = FolderLock{};
}

DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx) {
  throw DataError("the training data loader's repeating stream ended at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE std::filesystem::path default_output_dir() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::filesystem::path("runs") / (std::string(stamp) + "-" + std::to_string(::getpid()));
}

DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics) {
  std::vector<std::string> names;
  for (const auto& [name, ignored] : metrics) names.push_back(name);
  std::string reported;
  for (const auto& name : names) reported += (reported.empty() ? "" : ", ") + name;
  std::string hint = suggestion(metric, names);
  if (hint.empty()) {  // val_loss for validation_loss: the one name with the same last word
    auto last_word = [](const std::string& n) { return n.substr(n.rfind('_') == std::string::npos ? 0 : n.rfind('_') + 1); };
    std::vector<std::string> same;
    std::ranges::copy_if(names, std::back_inserter(same), [&](const std::string& n) { return last_word(n) == last_word(metric); });
    if (same.size() == 1) hint = "; did you mean '" + same.front() + "'?";
  }
  return ConfigError("searcher.metric '" + metric + "' is not a metric validation reports (it reported " + reported + ")" + hint);
}

DETTRIAL_INLINE LearningRates learning_rates(const Context& context) {
  LearningRates out;
  const std::size_t optimizers = context.num_optimizers();
  for (std::size_t i = 0; i < optimizers; ++i) {
    const auto& groups = context.optimizer(i).param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      try {
        const double lr = groups[g].options().get_lr();
        // Appended piece by piece: GCC 12 at -O3 mistakes chained string + for overlapping copies (-Wrestrict).
        std::string name = "lr";
        if (optimizers > 1) name.append("_").append(std::to_string(i));
        if (groups.size() > 1) name.append("_group_").append(std::to_string(g));
        out.emplace_back(std::move(name), lr);
      } catch (const c10::Error&) {
        break;
      }
    }
  }
  return out;
}

DETTRIAL_INLINE void reduce_user_reducers(Context& context, bool WrappedReducer::* role, const std::vector<RankShare>& shares,
                                          MetricValues& out) {
  // Every rank sees every share, so a mismatch stops all ranks here together.
  for (const auto& s : shares)
    if (s.reducer_parts.size() != shares.front().reducer_parts.size())
      throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
  std::size_t index = 0;
  for (auto& r : detail::ContextAccess::reducers(context))
    if (r.*role) r.cross_slot_into(r.object, r.name, reducer_parts(shares, index++), out);
}

DETTRIAL_INLINE void agree_on_buffers(Context& context) {
  Communicator* comm = context.communicator();
  if (!comm) return;
  broadcast_buffers(*comm, context.models());
  // The average's copy too (its count stays on the CPU, the same on every rank).
  if (const auto average = context.averaged_weights()) broadcast_buffers(*comm, {average->averaged_ptr()});
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
