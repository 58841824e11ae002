// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The end of an experiment: its retention over all trials' checkpoints, and the summary table.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>
// IWYU pragma: private, include <dettrial/search.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../../layout.hpp"
#include "../../config/experiment_config.hpp"
#include "../trial_summary.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Determined's garbage collection at the end of an experiment: a checkpoint of the trials in
 * `trials` goes when it is neither among the experiment's `save_experiment_best` nor its trial's
 * `save_trial_best` (by the searcher metric), nor among its trial's `save_trial_latest`.
 */
DETTRIAL_INLINE void apply_experiment_retention(const ExperimentConfig& config, const std::vector<RunFolder>& trials);

/// The table printed at the end: a row per trial (`metric` the searcher metric's name), then the
/// best trial's checkpoint when there is one.
DETTRIAL_INLINE std::string summary_table(const std::map<std::int64_t, TrialSummary>& trials, const std::string& metric,
                                          std::optional<std::int64_t> best_trial);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstdio>

#include "../../checkpoint/storage.hpp"
#include "../../detail/yaml.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void apply_experiment_retention(const ExperimentConfig& config, const std::vector<RunFolder>& trials) {
  const auto& storage = config.checkpoint_storage;
  if (storage.save_experiment_best == 0) return;  // the trials applied their own retention already
  const MetricOrder order = config.searcher.order();
  std::vector<CheckpointInfo> ranked;
  std::map<std::string, std::int64_t> trial_best_keep;  // uuid -> kept by its trial's rules
  for (const RunFolder& trial : trials) {
    const auto all = list_checkpoints(trial.checkpoints());
    for (const auto& c :
         checkpoints_to_delete(all, {.save_trial_best = storage.save_trial_best, .save_trial_latest = storage.save_trial_latest},
                               config.searcher.smaller_is_better))
      trial_best_keep[c.uuid] = 0;  // candidates for deletion
    for (const auto& c : all)
      if (c.validation_metric) ranked.push_back(c);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo& a, const CheckpointInfo& b) {
    return order.better(*a.validation_metric, *b.validation_metric);
  });
  for (std::size_t k = 0; k < ranked.size() && static_cast<std::int64_t>(k) < storage.save_experiment_best; ++k)
    trial_best_keep.erase(ranked[k].uuid);  // among the experiment's best: kept
  for (const RunFolder& trial : trials)
    for (const auto& c : list_checkpoints(trial.checkpoints()))
      if (trial_best_keep.count(c.uuid)) delete_checkpoint(c);
}

DETTRIAL_INLINE std::string summary_table(const std::map<std::int64_t, TrialSummary>& trials, const std::string& metric,
                                          std::optional<std::int64_t> best_trial) {
  std::string table = "\n trial  state           batches  restarts  best " + metric + "  last  hyperparameters\n";
  for (const auto& [id, t] : trials) {
    char row[160];
    std::snprintf(row, sizeof row, " %5lld  %-14s %8lld  %8lld  %12s  %6s  ", static_cast<long long>(id), to_string(t.state),
                  static_cast<long long>(t.batches_trained), static_cast<long long>(t.restarts),
                  t.best_metric ? std::to_string(*t.best_metric).c_str() : "-",
                  t.last_metric ? std::to_string(*t.last_metric).c_str() : "-");
    table += row + one_line(t.hparams) + "\n";
  }
  if (best_trial) table += " best: trial " + std::to_string(*best_trial) + ", checkpoint " + trials.at(*best_trial).best_checkpoint + "\n";
  return table;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
