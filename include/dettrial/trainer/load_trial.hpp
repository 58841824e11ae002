// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `load_trial_from_checkpoint_path`: a trial rebuilt from a checkpoint, with the
/// hyperparameters and config it was trained with (its `load_data.json`), optionally changed, and
/// its models' weights loaded: for inference, evaluation or fine-tuning outside a run.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include "../layout.hpp"
#include "../checkpoint/checkpoint.hpp"
#include "../checkpoint/detail/load_data.hpp"
#include "../checkpoint/storage.hpp"
#include "../config/experiment_config.hpp"
#include "../context/context.hpp"
#include "trainer.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

struct LoadTrialOptions {
  /// Hyperparameters to change, merged over the checkpoint's (a map; nested maps are merged key by key):
  /// `{.hparams = YAML::Load("{dropout: 0.0}")}`.
  YAML::Node hparams{};
  /// The device the models go to; unset: as a Context picks it (the first GPU, else the CPU).
  std::optional<torch::Device> device{};
};

/// A trial rebuilt by load_trial_from_checkpoint_path: it owns the Context and the trial's Trainer.
template <class TrialT>
class LoadedTrial {
 public:
  LoadedTrial(std::unique_ptr<Context> context, std::unique_ptr<Trainer<TrialT>> trainer)
      : context_(std::move(context)), trainer_(std::move(trainer)) {}
  TrialT& trial() { return trainer_->trial(); }
  Context& context() { return *context_; }
  /// The trainer around the trial: `fit` continues training the loaded weights (a warm start).
  Trainer<TrialT>& trainer() { return *trainer_; }
  /// The trial's first (or `index`-th) model, as the context wrapped it.
  torch::nn::Module& model(std::size_t index = 0) { return *context_->models().at(index); }

 private:
  std::unique_ptr<Context> context_;  // before the trainer, which refers to it: destroyed after it
  std::unique_ptr<Trainer<TrialT>> trainer_;
};

}  // namespace dettrial

namespace dettrial::detail {
/// `changes` merged into the map `target`, nested maps key by key.
DETTRIAL_INLINE void merge_yaml_map(YAML::Node target, const YAML::Node& changes);
/// The experiment config a checkpoint was trained under, with its trial's hyperparameters (from its
/// `load_data.json`) and `overrides` merged over them.
DETTRIAL_INLINE ExperimentConfig checkpoint_trial_config(const std::filesystem::path& checkpoint, const YAML::Node& overrides);
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief Rebuilds `TrialT` from a checkpoint (a checkpoint directory, or a folder holding checkpoints
 * whose latest is taken): its experiment config and hyperparameters from the checkpoint's
 * `load_data.json` with `options.hparams` merged over them, the trial built as the Trainer builds it
 * (with `trial_args...` after the Context), and every model's weights loaded, names and shapes
 * checked. The models are left in training mode; call `eval()` for inference.
 * @code{.cpp}
 * auto loaded = dettrial::load_trial_from_checkpoint_path<MnistTrial>("runs/x/checkpoints",
 *                                                                    {.hparams = YAML::Load("{dropout: 0.0}")});
 * loaded.model().eval();
 * @endcode
 */
template <class TrialT, class... Args>
LoadedTrial<TrialT> load_trial_from_checkpoint_path(const std::filesystem::path& path, const LoadTrialOptions& options = {},
                                                    Args&&... trial_args) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  auto context = std::make_unique<Context>(detail::checkpoint_trial_config(dir, options.hparams), ContextOptions{.device = options.device});
  auto trainer = std::make_unique<Trainer<TrialT>>(*context, std::forward<Args>(trial_args)...);
  detail::ContextCheckpoint::load_models(*context, detail::read_state_dict_file(dir), CheckpointFolder{dir}.state_dict());
  return LoadedTrial<TrialT>(std::move(context), std::move(trainer));
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE void merge_yaml_map(YAML::Node target, const YAML::Node& changes) {
  for (const auto& entry : changes) {
    const std::string key = entry.first.as<std::string>();
    if (entry.second.IsMap() && target[key] && target[key].IsMap()) merge_yaml_map(target[key], entry.second);
    else target[key] = YAML::Clone(entry.second);
  }
}

DETTRIAL_INLINE ExperimentConfig checkpoint_trial_config(const std::filesystem::path& checkpoint, const YAML::Node& overrides) {
  const std::filesystem::path file = CheckpointFolder{checkpoint}.load_data();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw CheckpointError("'" + checkpoint.string() +
                          "' has no load_data.json, so the trial cannot be rebuilt from it; "
                          "load only its weights with dettrial::load_weights");
  const detail::LoadData load_data = detail::LoadData::read(CheckpointFolder{checkpoint});
  YAML::Node doc = YAML::Clone(load_data.experiment_config);
  // The trial's own hyperparameters (the experiment config may hold the search space they were drawn from).
  if (load_data.hparams.IsMap()) doc["hyperparameters"] = YAML::Clone(load_data.hparams);
  if (overrides && !overrides.IsNull()) {
    if (!overrides.IsMap())
      throw ConfigError("load_trial_from_checkpoint_path: LoadTrialOptions::hparams must be a map of hyperparameter names to values");
    if (!doc["hyperparameters"] || !doc["hyperparameters"].IsMap()) doc["hyperparameters"] = YAML::Node(YAML::NodeType::Map);
    merge_yaml_map(doc["hyperparameters"], overrides);
  }
  doc["searcher"]["name"] = std::string(to_string(SearcherKind::single));
  return ExperimentConfig::from_yaml(doc, file.string() + " (the checkpoint's config)");
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
