// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::TrialSummary: one line of an experiment's summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

#include "../vocabulary/search_event.hpp"

namespace dettrial {

/// One line of the experiment summary.
struct TrialSummary {
  std::int64_t id = 0;
  YAML::Node hparams;
  TrialState state = TrialState::queued;
  std::int64_t restarts = 0;
  std::int64_t batches_trained = 0;
  std::optional<double> best_metric;
  std::optional<double> last_metric;
  std::string best_checkpoint;
};

}  // namespace dettrial
