// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::LoadData: a checkpoint's `load_data.json`, written and read in this one place.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <string>

#include <yaml-cpp/yaml.h>

#include "../../detail/json_fwd.hpp"
#include "../../detail/linkage.hpp"
#include "../../layout.hpp"

namespace dettrial::detail {

/**
 * @brief What Determined records in a checkpoint's `load_data.json` to rebuild the trial: the
 * experiment config the run ran under, the trial's own hyperparameters (a search's config holds the
 * space they were drawn from) and the trial's type. Both the trial loader
 * (`load_trial_from_checkpoint_path`) and the command line's `--resume` read it through read().
 */
struct LoadData {
  YAML::Node experiment_config{YAML::NodeType::Map};
  /// The trial's hyperparameters; Null when the file has none (a file not dettrial wrote).
  YAML::Node hparams;
  std::string trial_type;

  /// The file's JSON (`trial_type: "dettrial"` and `is_trainer`, as Determined's Trainer writes it).
  Json to_json() const;

  /**
   * @brief `folder`'s load_data.json. A CheckpointError naming the file when it is missing, is not
   * JSON (a damaged or hostile file), or lacks the map `experiment_config`; `hparams` that are
   * there but not a map are refused too (they would rebuild another trial).
   */
  static LoadData read(const CheckpointFolder& folder);
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <filesystem>
#include <system_error>

#include "../../error.hpp"
#include "../../detail/json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE Json LoadData::to_json() const {
  return Json{{"trial_type", "dettrial"},
              {"experiment_config", yaml_to_json(experiment_config)},
              {"hparams", yaml_to_json(hparams)},
              {"trial_cls_spec", trial_type},
              {"is_trainer", true}};
}

DETTRIAL_INLINE LoadData LoadData::read(const CheckpointFolder& folder) {
  const std::filesystem::path file = folder.load_data();
  const std::string name = "'" + file.string() + "'";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw CheckpointError(name + " is missing");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());  // JSON is YAML
  } catch (const YAML::Exception& e) {
    throw CheckpointError(name + " is not valid JSON: " + e.what());
  }
  if (!root.IsMap()) throw CheckpointError(name + " is not a JSON object");
  const YAML::Node config = root["experiment_config"];
  if (!config || !config.IsMap()) throw CheckpointError(name + " has no experiment_config (a map)");
  LoadData d;
  d.experiment_config = config;
  if (const YAML::Node hparams = root["hparams"]; hparams && !hparams.IsNull()) {
    if (!hparams.IsMap()) throw CheckpointError(name + "'s hparams are not a map of hyperparameter names to values");
    d.hparams = hparams;
  }
  if (const YAML::Node type = root["trial_cls_spec"]; type && type.IsScalar()) d.trial_type = type.Scalar();
  return d;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
