// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step of one process: gradients accumulated over the aggregated batches,
/// averaged, and the optimizers stepped (Determined's single-slot trial).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "step_mode.hpp"

namespace dettrial::detail {

/// One process, the whole gradients here: aggregation only.
class LocalStep : public WholeParameterState {
 public:
  static constexpr std::string_view name = "local";
  LocalStep() = default;
  explicit LocalStep(const StepSettings& settings) : aggregation_frequency_(settings.aggregation_frequency) {}

  void begin_batch(std::int64_t, std::int64_t) {}
  void before_backward(std::span<WrappedOptimizer>, bool) {}
  void reduce(WrappedOptimizer& w, std::span<WrappedOptimizer>, std::int64_t) { average_over_aggregation(w, aggregation_frequency_); }
  void step(WrappedOptimizer& w, PrecisionStep& precision) { precision.step(*w.optimizer, w.params); }
  void finish_batch(std::span<WrappedOptimizer>, bool) {}
  void params_changed(WrappedOptimizer&, std::size_t) {}

 private:
  std::int64_t aggregation_frequency_ = 1;
};
static_assert(TrainingStepMode<LocalStep>);

}  // namespace dettrial::detail
