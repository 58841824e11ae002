// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Where a run is tracked: the experiment config's `mlflow` section, completed by MLflow's
/// own environment variables.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace dettrial::detail {
/// Environment variable `name`'s value, empty when unset.
inline std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief An MLflow tracking server and how a run appears in it (the `mlflow` section of an
 * experiment config). Tracking is on when `tracking_uri` is set, by the config or by
 * `MLFLOW_TRACKING_URI`.
 */
struct MlflowSettings {
  /// The server, `http://` or `https://` (MLFLOW_TRACKING_URI when the config gives none).
  std::string tracking_uri;
  /// The MLflow experiment the runs go into (MLFLOW_EXPERIMENT_NAME, else the experiment config's
  /// `name`, else "Default").
  std::string experiment_name;
  /// The run's name in MLflow (else the run folder's name, or "trial N" in a search).
  std::string run_name;
  /// Tags set on every run, besides dettrial's own.
  std::vector<std::pair<std::string, std::string>> tags;
  /// A search's run, whose child this run is (the runner passes it to its trials).
  std::string parent_run_id;
  /// The experiment config's text, kept as the run's artifact `config.yaml`.
  std::string config_text;

  bool enabled() const { return !tracking_uri.empty(); }

  /// Fills what the config left unset from MLflow's environment variables (and a search's parent
  /// run from its runner's).
  void complete_from_environment() {
    if (tracking_uri.empty()) tracking_uri = detail::environment_value("MLFLOW_TRACKING_URI");
    if (experiment_name.empty()) experiment_name = detail::environment_value("MLFLOW_EXPERIMENT_NAME");
    if (parent_run_id.empty()) parent_run_id = detail::environment_value(parent_run_variable);
    while (!tracking_uri.empty() && tracking_uri.back() == '/') tracking_uri.pop_back();
  }

  /// The variable a search's runner passes its MLflow run id to its trials in.
  static constexpr const char* parent_run_variable = "DETTRIAL_MLFLOW_PARENT_RUN_ID";
};

}  // namespace dettrial
