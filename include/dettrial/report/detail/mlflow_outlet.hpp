// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An MLflow run as an outlet of the fit's reports: metrics, and tags for checkpoints and restarts.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include "../../detail/linkage.hpp"
#include "../../tracking/mlflow.hpp"
#include "outlet.hpp"

namespace dettrial::detail {

/// The fit's MlflowRun (which keeps what its server does not take, and sends it later): the
/// metrics by TensorBoard's names, the learning rates and phase times as tags too, each checkpoint
/// and restart as tags.
class MlflowOutlet final : public ReportOutlet {
 public:
  explicit MlflowOutlet(MlflowRun& run) : run_(&run) {}

  DETTRIAL_INLINE void training(const TrainingReport& r) override;
  DETTRIAL_INLINE void validation(const ValidationReport& r) override;
  DETTRIAL_INLINE void checkpoint(const CheckpointReport& r) override;
  DETTRIAL_INLINE void system(const SystemMetricsReport& r) override;
  DETTRIAL_INLINE void restart(const RestartReport& r) override;

 private:
  MlflowRun* run_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>
#include <utility>
#include <vector>

#include "../../detail/json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void MlflowOutlet::training(const TrainingReport& r) {
  std::vector<std::pair<std::string, double>> values = prefixed_metrics("train/", r.metrics);
  values.emplace_back("train/samples_per_second", r.samples_per_second);
  Json rates = Json::object(), times = Json::object();
  for (const auto& [name, lr] : r.learning_rates) {
    values.emplace_back("train/" + name, lr);
    rates[name] = lr;
  }
  for (const auto& [phase, value] : r.phase_seconds()) {
    values.emplace_back(std::string("timing/") + phase + "_seconds", value);
    times[phase] = value;
  }
  run_->log_metrics("training", r.batches, values, {{"dettrial.learning_rates", rates.dump()}, {"dettrial.phase_seconds", times.dump()}});
}

DETTRIAL_INLINE void MlflowOutlet::validation(const ValidationReport& r) {
  std::vector<std::pair<std::string, double>> values = prefixed_metrics("validation/", r.metrics);
  values.emplace_back("timing/validation_seconds", r.seconds);
  run_->log_metrics("validation", r.batches, values);
}

DETTRIAL_INLINE void MlflowOutlet::checkpoint(const CheckpointReport& r) {
  const std::string uuid = r.path.filename().string();
  run_->log_metrics("checkpoint", r.batches, {},
                    {{"dettrial.checkpoint.batch_" + std::to_string(r.batches), uuid + " " + r.path.string()},
                     {"dettrial.checkpoint.latest", uuid},
                     {"dettrial.checkpoint.latest_path", r.path.string()}});
}

DETTRIAL_INLINE void MlflowOutlet::system(const SystemMetricsReport& r) {
  run_->log_metrics("system", r.batches, system_scalars(r.report));
}

DETTRIAL_INLINE void MlflowOutlet::restart(const RestartReport& r) {
  run_->log_metrics("restart", r.batches, {},
                    {{"dettrial.restart.batch_" + std::to_string(r.batches),
                      std::to_string(r.ranks_before) + " -> " + std::to_string(r.ranks) + " ranks"}});
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
