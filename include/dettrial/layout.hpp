// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The names dettrial gives its files and folders: one source of truth for the on-disk
/// layout of a run, a checkpoint and an experiment (the checkpoint's names are Determined's).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace dettrial::layout {

// A run's folder (`--output`).
/// Every report, one JSON object a line.
inline constexpr const char* metrics_log = "metrics.jsonl";
/// The training and validation reports as a table, one row each.
inline constexpr const char* metrics_csv = "metrics.csv";
/// The run's checkpoints, one folder each, named by uuid.
inline constexpr const char* checkpoints = "checkpoints";
/// TensorBoard's event files and the profiler's traces.
inline constexpr const char* tensorboard = "tensorboard";
/// The page `--report` writes (a run's, or an experiment's).
inline constexpr const char* report_page = "report.html";
/// The profiler's trace (the config's profiling section; rank r > 0 writes `trace.rank<r>.json`).
inline constexpr const char* trace = "trace.json";
/// A trial's output (its stdout and stderr), in an experiment.
inline constexpr const char* trial_log = "log.txt";

// A checkpoint's folder (Determined's names, and dettrial's own archive).
/// Models, optimizers, schedulers, callbacks and RNG states, as Python's torch.save writes them.
inline constexpr const char* state_dict = "state_dict.pth";
/// LibTorch's own archive of the optimizers (read where the Python layout cannot say everything).
inline constexpr const char* libtorch_state = "dettrial_state.pt";
/// Where the trial stands: batches and epochs trained, its data seeds, its last validation.
inline constexpr const char* trial_state = "trial_state.json";
/// Where the trial stands, as Determined's PyTorchTrial pickles it (its `_TrialState`): what
/// Determined reads to continue a checkpoint, and what dettrial reads in one Determined wrote.
inline constexpr const char* determined_trial_state = "trial_state.pkl";
/// The experiment config and hyperparameters the checkpoint was written under.
inline constexpr const char* load_data = "load_data.json";
/// The checkpoint's metadata (format, steps completed, files and their checksums).
inline constexpr const char* metadata = "metadata.json";

/// A run's or an experiment's lock: an advisory flock held while a process writes into the folder,
/// its text the holder's pid and host.
inline constexpr const char* lock = ".lock";

// An experiment's folder.
/// The experiment's config; each trial's folder holds its own.
inline constexpr const char* config = "config.yaml";
/// One folder per trial, named by its id.
inline constexpr const char* trials = "trials";
/// The searcher's events, one JSON object a line (an interrupted experiment continues from them).
inline constexpr const char* events_log = "events.jsonl";
/// Every trial's state and best metric at the end.
inline constexpr const char* summary = "summary.json";
/// The experiment's id (drawn when its folder is new, so a continued experiment keeps it).
inline constexpr const char* experiment_id = "experiment.json";

}  // namespace dettrial::layout

namespace dettrial {

/// A run's folder (`--output`, or a trial's folder in an experiment) and the paths of what dettrial
/// writes in it.
struct RunFolder {
  std::filesystem::path dir;

  std::filesystem::path metrics_log() const { return dir / layout::metrics_log; }
  std::filesystem::path metrics_csv() const { return dir / layout::metrics_csv; }
  std::filesystem::path checkpoints() const { return dir / layout::checkpoints; }
  std::filesystem::path tensorboard() const { return dir / layout::tensorboard; }
  std::filesystem::path report_page() const { return dir / layout::report_page; }
  /// Rank `rank`'s profiler trace.
  std::filesystem::path trace(int rank) const {
    return rank == 0 ? dir / layout::trace : dir / ("trace.rank" + std::to_string(rank) + ".json");
  }
  /// The system metrics of node `node` > 0 of a job (node 0's are metrics.jsonl's `system` records).
  std::filesystem::path system_log(int node) const { return dir / ("system.node" + std::to_string(node) + ".jsonl"); }
  /// A trial's output, in an experiment.
  std::filesystem::path trial_log() const { return dir / layout::trial_log; }
  /// A trial's experiment config (written into its folder by the experiment).
  std::filesystem::path config() const { return dir / layout::config; }
  std::filesystem::path lock() const { return dir / layout::lock; }
};

/// A checkpoint's folder (Determined's layout) and the paths of its files.
struct CheckpointFolder {
  std::filesystem::path dir;

  std::filesystem::path state_dict() const { return dir / layout::state_dict; }
  std::filesystem::path libtorch_state() const { return dir / layout::libtorch_state; }
  std::filesystem::path trial_state() const { return dir / layout::trial_state; }
  std::filesystem::path determined_trial_state() const { return dir / layout::determined_trial_state; }
  std::filesystem::path load_data() const { return dir / layout::load_data; }
  std::filesystem::path metadata() const { return dir / layout::metadata; }
};

/// An experiment's folder and the paths of what its runner writes in it.
struct ExperimentFolder {
  std::filesystem::path dir;

  std::filesystem::path config() const { return dir / layout::config; }
  std::filesystem::path trials() const { return dir / layout::trials; }
  /// Trial `id`'s run folder.
  RunFolder trial(std::int64_t id) const { return {trials() / std::to_string(id)}; }
  std::filesystem::path events_log() const { return dir / layout::events_log; }
  std::filesystem::path summary() const { return dir / layout::summary; }
  std::filesystem::path report_page() const { return dir / layout::report_page; }
  std::filesystem::path experiment_id() const { return dir / layout::experiment_id; }
  std::filesystem::path lock() const { return dir / layout::lock; }
};

}  // namespace dettrial
