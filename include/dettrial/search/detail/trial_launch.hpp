// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a search's trial runs as: its own experiment config in its folder, and its command line.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>
// IWYU pragma: private, include <dettrial/search.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "../../layout.hpp"
#include "../../config/experiment_config.hpp"
#include "../searchers.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Trial `r`'s own experiment config: the experiment's, with the trial's hyperparameters as
 * values, one trial of its length (the single searcher), its seed, and checkpoint storage in its
 * folder that keeps what a restart and the experiment's retention need.
 */
DETTRIAL_INLINE YAML::Node trial_config(const ExperimentConfig& experiment, const TrialRequest& r, const RunFolder& folder);

/**
 * @brief The command line of `program` (dettrial::main's) that trains the trial in `folder` from its
 * config: resumed from its latest checkpoint when it has one, from the folder when an attempt failed
 * before its first (main then starts afresh there). `--max-restarts 0`: the runner restarts a
 * search's trials (one RestartPolicy count over a trial's life), not the trial's own process.
 */
DETTRIAL_INLINE std::vector<std::string> trial_arguments(const std::filesystem::path& program, const RunFolder& folder);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>

#include "../../checkpoint/storage.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE YAML::Node trial_config(const ExperimentConfig& experiment, const TrialRequest& r, const RunFolder& folder) {
  YAML::Node doc = YAML::Clone(experiment.yaml);
  doc["hyperparameters"] = YAML::Clone(r.hparams);
  const SearcherSettings& settings = experiment.searcher;
  YAML::Node searcher(YAML::NodeType::Map);
  searcher["name"] = std::string(to_string(SearcherKind::single));
  searcher["metric"] = settings.metric;
  searcher["smaller_is_better"] = settings.smaller_is_better;
  const std::string unit = settings.kind == SearcherKind::adaptive_asha ? settings.time_metric
                           : settings.max_length                        ? std::string(to_string(settings.max_length->unit()))
                                                                        : std::string("batches");
  searcher["max_length"][unit] = r.max_length;
  doc["searcher"] = searcher;
  doc["reproducibility"]["experiment_seed"] = r.seed;
  doc.remove("checkpoint_storage");
  const auto& kept = experiment.checkpoint_storage;
  YAML::Node storage(YAML::NodeType::Map);
  storage["type"] = "shared_fs";
  storage["host_path"] = folder.checkpoints().string();
  // The experiment's best are chosen among the trials' best, so each trial keeps its best until then.
  storage["save_trial_best"] = std::max<std::int64_t>(kept.save_trial_best, kept.save_experiment_best > 0 ? 1 : 0);
  storage["save_trial_latest"] = std::max<std::int64_t>(kept.save_trial_latest, 1);  // restarts need one
  storage["async"] = kept.async;
  doc["checkpoint_storage"] = storage;
  return doc;
}

DETTRIAL_INLINE std::vector<std::string> trial_arguments(const std::filesystem::path& program, const RunFolder& folder) {
  std::vector<std::string> args = {program.string(),    "--config", folder.config().string(), "--output",
                                   folder.dir.string(), "--quiet",  "--max-restarts",         "0"};
  if (!list_checkpoints(folder.checkpoints()).empty()) {
    args.emplace_back("--resume");
    args.push_back(folder.checkpoints().string());
  } else if (std::filesystem::exists(folder.metrics_log())) {
    // A restart before any checkpoint: the folder without one makes main start afresh there,
    // dropping the failed attempt's metrics and TensorBoard events first.
    args.emplace_back("--resume");
    args.push_back(folder.dir.string());
  }
  return args;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
