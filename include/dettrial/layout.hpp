// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The names dettrial gives its files and folders: one source of truth for the on-disk
/// layout of a run, a checkpoint and an experiment (the checkpoint's names are Determined's).
#pragma once

namespace dettrial::layout {

// A run's folder (`--output`).
/// Every report, one JSON object a line.
inline constexpr const char* metrics_log = "metrics.jsonl";
/// The run's checkpoints, one folder each, named by uuid.
inline constexpr const char* checkpoints = "checkpoints";
/// TensorBoard's event files and the profiler's traces.
inline constexpr const char* tensorboard = "tensorboard";
/// The page `--report` writes (a run's, or an experiment's).
inline constexpr const char* report_page = "report.html";

// A checkpoint's folder (Determined's names, and dettrial's own archive).
/// Models, optimizers, schedulers, callbacks and RNG states, as Python's torch.save writes them.
inline constexpr const char* state_dict = "state_dict.pth";
/// LibTorch's own archive of the optimizers (read where the Python layout cannot say everything).
inline constexpr const char* libtorch_state = "dettrial_state.pt";
/// Where the trial stands: batches and epochs trained, its data seeds, its last validation.
inline constexpr const char* trial_state = "trial_state.json";
/// The experiment config and hyperparameters the checkpoint was written under.
inline constexpr const char* load_data = "load_data.json";
/// The checkpoint's metadata (format, steps completed, files and their checksums).
inline constexpr const char* metadata = "metadata.json";

// An experiment's folder.
/// The experiment's config; each trial's folder holds its own.
inline constexpr const char* config = "config.yaml";
/// One folder per trial, named by its id.
inline constexpr const char* trials = "trials";
/// The searcher's events, one JSON object a line (an interrupted experiment continues from them).
inline constexpr const char* events_log = "events.jsonl";
/// Every trial's state and best metric at the end.
inline constexpr const char* summary = "summary.json";

}  // namespace dettrial::layout
