// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The options of Trainer::fit (Determined's Trainer.fit arguments) and what fit returns.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../checkpoint/storage.hpp"
#include "../config/experiment_config.hpp"
#include "../vocabulary/metrics.hpp"
#include "../report/progress.hpp"
#include "../config/units.hpp"
#include "../config/tracking.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief How long to train and when to validate, checkpoint and report.
 * @code{.cpp}
 * trainer.fit({.max_length = dettrial::Epoch{5},
 *              .validation_period = dettrial::Epoch{1},
 *              .reporting_period = dettrial::Batch{100}});
 * @endcode
 */
struct FitOptions {
  /// Total training length: Batch, Epoch, or Record (converted with the global batch size). Unset:
  /// the context's experiment config's searcher.max_length (Determined's `fit(max_length=None)`),
  /// which one of the two must give.
  std::optional<TrainUnit> max_length;
  /// Validate when this period is reached (default: never, but always once at the end).
  TrainUnit validation_period = never();
  /// Checkpoint when this period is reached (default: never, but always once at the end).
  TrainUnit checkpoint_period = never();
  /// Report training metrics (and progress) when this period is reached.
  TrainUnit reporting_period = Batch(100);
  /// Whether to checkpoint right after a validation: all, none, or best by `searcher_metric`.
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  /// The validation metric `best` compares, and its direction.
  std::string searcher_metric{};
  bool smaller_is_better = true;
  /// Validate once before training (when nothing has been trained yet).
  bool step_zero_validation = false;
  /// Train one batch, validate on one batch, then stop: a quick check that the trial runs.
  bool test_mode = false;
  /// Resume from this checkpoint: a checkpoint directory, or a directory holding checkpoints (a
  /// storage directory, or a run's output directory), whose latest is taken.
  std::optional<std::filesystem::path> latest_checkpoint{};
  /// When the resumed checkpoint has an optimizer or LR scheduler state the trial's cannot take (a
  /// Determined checkpoint's LambdaLR, another optimizer type), start that part fresh with a warning
  /// instead of stopping with an error that names it.
  bool resume_fresh_parts = false;
  /// How many times a launcher (or max_restarts) restarted this job; a resumed run with one, or on
  /// another rank count than its checkpoint's, logs a `restart` record saying so.
  std::int64_t restart = 0;
  /// Where metrics.jsonl (and checkpoints) go; empty means `runs/<date>-<time>` under the working directory.
  std::filesystem::path output_dir{};
  /// Where checkpoints go; empty means `<output_dir>/checkpoints`.
  std::filesystem::path checkpoint_dir{};
  /// How many checkpoints to keep (best by the searcher metric, and latest).
  Retention retention{};
  /// Write checkpoints in the background from a snapshot in host memory, while training goes on
  /// (`checkpoint_storage.async`); false writes them in the step loop.
  bool async_checkpoints = true;
  /// The trial's id, saved in its checkpoints: resuming a checkpoint of another trial loads its
  /// weights and optimizer state but starts counting afresh (Determined's warm start).
  std::int64_t trial_id = 0;
  /// Catch SIGINT and SIGTERM during fit: finish the batch, checkpoint and return (see FitResult::signal).
  bool handle_signals = true;
  /// Terminal and log output.
  ReportOptions report{};
  /// LibTorch's profiler over a range of batches, written to `<output_dir>/trace.json` (the
  /// experiment config's `profiling` section).
  ExperimentConfig::Profiling profiling{};
  /// How the training step runs: eagerly (capture::none), or captured once in a CUDA graph and
  /// replayed (capture::cuda_graph; the experiment config's `optimizations.step_capture`).
  StepCapture step_capture = capture::none{};
  /// ZeRO: ZeroStage::optimizer_state shards every wrapped optimizer's state over the ranks of a
  /// data-parallel job (the experiment config's `optimizations.zero_stage`; docs/distributed.md).
  ZeroStage zero_stage = ZeroStage::off;
  /// An MLflow server the run is tracked in (the experiment config's `mlflow` section); tracking is
  /// also on when MLFLOW_TRACKING_URI is set.
  MlflowSettings mlflow{};

  /**
   * @brief The options an experiment config implies, as Determined maps them: searcher.max_length (or
   * max_steps x scheduling_unit), min_validation_period, min_checkpoint_period, reporting every
   * scheduling_unit batches, perform_initial_validation, checkpoint_policy and the searcher metric.
   */
  static FitOptions from_config(const ExperimentConfig& config);
};

/// What fit returns.
struct FitResult {
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// The last training report and the last validation.
  MetricValues last_training_metrics;
  MetricValues last_validation_metrics;
  std::int64_t validations = 0;
  /// The checkpoints this fit wrote, oldest first (some may since have been deleted by retention).
  std::vector<CheckpointInfo> checkpoints;
  /// Where checkpoints went.
  std::filesystem::path checkpoint_dir{};
  /// The batch training resumed from (0 for a fresh start).
  std::int64_t resumed_from_batch = 0;
  /// True when the trial asked to stop (context.set_stop_requested) or a signal did.
  bool stop_requested = false;
  /// True when that stop came before max_length.
  bool stopped_early = false;
  /// The signal (SIGINT, SIGTERM) that stopped training after a checkpoint, or 0.
  int signal = 0;
  std::filesystem::path output_dir{};
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE FitOptions FitOptions::from_config(const ExperimentConfig& config) {
  FitOptions o;
  o.max_length = config.searcher.max_length;
  if (config.min_validation_period) o.validation_period = *config.min_validation_period;
  if (config.min_checkpoint_period) o.checkpoint_period = *config.min_checkpoint_period;
  o.reporting_period = Batch(config.scheduling_unit);
  o.step_zero_validation = config.perform_initial_validation;
  o.checkpoint_policy = config.checkpoint_policy;
  o.searcher_metric = config.searcher.metric;
  o.smaller_is_better = config.searcher.smaller_is_better;
  if (config.checkpoint_storage.path) o.checkpoint_dir = *config.checkpoint_storage.path;
  o.profiling = config.profiling;
  o.step_capture = config.step_capture;
  o.zero_stage = config.zero_stage;
  o.retention = {.save_trial_best = config.checkpoint_storage.save_trial_best,
                 .save_trial_latest = config.checkpoint_storage.save_trial_latest};
  o.async_checkpoints = config.checkpoint_storage.async;
  o.mlflow = config.mlflow;
  return o;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
