// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step: one mode (local, replicated, ordered or sharded) chosen from the
/// options, the combinations that cannot train refused here and nowhere else, and the precision
/// step it owns. The Context's step_optimizer and backward, and the trainer's batch boundaries, come
/// through it.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <variant>

#include <torch/torch.h>

#include "../../config/experiment_config.hpp"
#include "../../detail/linkage.hpp"
#include "local.hpp"
#include "ordered.hpp"
#include "precision_step.hpp"
#include "replicated.hpp"
#include "sharded.hpp"
#include "step_mode.hpp"

namespace dettrial::detail {

/**
 * @brief The training step of a Context: its mode, chosen once from the settings (rank_invariant:
 * ordered; a communicator: replicated; else local) and again when a fit starts (ZeRO: sharded), and
 * its precision step. Each call dispatches on the mode with std::visit: a branch, no virtual call
 * and no allocation per batch. A new mode is a file modelling TrainingStepMode, an alternative of
 * `Mode` and its rule in start_fit.
 */
class TrainingStep {
 public:
  using Mode = std::variant<LocalStep, ReplicatedStep, OrderedStep, ShardedStep>;

  /// Local: one process, fp32 (a Context's own until its constructor has chosen).
  TrainingStep() = default;
  /// The mode for `settings` (a ConfigError where they cannot train), with `precision`.
  TrainingStep(const StepSettings& settings, PrecisionStep precision);

  bool rank_invariant() const { return std::holds_alternative<OrderedStep>(mode_); }
  PrecisionStep& precision() { return precision_; }
  const PrecisionStep& precision() const { return precision_; }

  /// When a fit starts, after its checkpoint is restored: ZeRO `stage` refused in one sentence where
  /// it cannot apply (an optimizer it cannot shard, rank_invariant, one rank), else the sharded mode
  /// takes over and cuts the loaded state. Every rank calls it (every rank refuses alike).
  void start_fit(ZeroStage stage, std::span<WrappedOptimizer> optimizers);
  /// The mode chosen from the settings again (the trial's trainer went away), its state dropped.
  void release();

  void begin_batch(std::int64_t batch, std::int64_t records) {
    std::visit([&](auto& mode) { mode.begin_batch(batch, records); }, mode_);
  }
  /// Back-propagates `output` (with `gradient`, when defined): the mode prepared (buckets armed on an
  /// update batch), then the precision step's backward.
  void backward(std::span<WrappedOptimizer> all, bool update_batch, const torch::Tensor& output, const torch::Tensor& gradient,
                const torch::Device& device, bool retain_graph, bool create_graph) {
    std::visit([&](auto& mode) { mode.before_backward(all, update_batch); }, mode_);
    precision_.backward(output, gradient, device, retain_graph, create_graph);
  }
  /// step_optimizer's first half, on an update batch: `w`'s gradients made whole (reduced over the
  /// ranks, averaged over the aggregated batches) and unscaled, ready for the trial's clip.
  void reduce(WrappedOptimizer& w, std::span<WrappedOptimizer> all, std::int64_t batch);
  /// step_optimizer's second half: the step (or its skip), then zero_grad when asked.
  void step(WrappedOptimizer& w, bool auto_zero_grads);
  /// When a training batch ends: the mode's end of batch; on an update batch, the scale's update.
  void finish_batch(std::span<WrappedOptimizer> all, bool update_batch) {
    std::visit([&](auto& mode) { mode.finish_batch(all, update_batch); }, mode_);
    if (update_batch) precision_.update();
  }
  /// For the checkpoint being taken: every optimizer's whole state where the mode holds only
  /// pieces of it (a collective in that mode). Dropped when the result ends.
  [[nodiscard]] WholeStates whole_states(std::span<WrappedOptimizer> all) {
    return std::visit([&](auto& mode) { return mode.whole_states(all); }, mode_);
  }

 private:
  static Mode choose(const StepSettings& settings);

  StepSettings settings_{};
  Mode mode_{};
  PrecisionStep precision_{};
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>
#include <typeinfo>

#include "../../error.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE TrainingStep::TrainingStep(const StepSettings& settings, PrecisionStep precision)
    : settings_(settings), mode_(choose(settings)), precision_(std::move(precision)) {}

DETTRIAL_INLINE TrainingStep::Mode TrainingStep::choose(const StepSettings& settings) {
  if (settings.rank_invariant) return Mode(std::in_place_type<OrderedStep>, settings);
  if (settings.communicator) return Mode(std::in_place_type<ReplicatedStep>, settings);
  return Mode(std::in_place_type<LocalStep>, settings);
}

DETTRIAL_INLINE void TrainingStep::start_fit(ZeroStage stage, std::span<WrappedOptimizer> optimizers) {
  if (stage == ZeroStage::off) return;
  for (const WrappedOptimizer& w : optimizers)
    if (const std::string why = ShardedStep::refusal(*w.optimizer); !why.empty())
      throw ConfigError("ZeRO (optimizations.zero_stage 1) cannot shard optimizer " + std::to_string(w.index) + " (" +
                        c10::demangle(typeid(*w.optimizer).name()) + "): " + why);
  if (settings_.rank_invariant)
    throw ConfigError(
        "ZeRO (optimizations.zero_stage 1) and reproducibility.rank_invariant do not go together: rank_invariant sums every "
        "gradient in the data stream's order on every rank, and steps whole parameters; set one of them off");
  if (!settings_.communicator)
    throw ConfigError(
        "ZeRO (optimizations.zero_stage 1) shards the optimizer state over the ranks of a data-parallel job, and this run has one "
        "rank: start 2 or more (--nprocs, torchrun), or set zero_stage 0");
  ShardedStep sharded(settings_);
  sharded.start_fit(optimizers);
  mode_ = std::move(sharded);
}

DETTRIAL_INLINE void TrainingStep::release() {
  mode_ = choose(settings_);
  precision_.release();
}

DETTRIAL_INLINE void TrainingStep::reduce(WrappedOptimizer& w, std::span<WrappedOptimizer> all, std::int64_t batch) {
  // Parameter groups may have grown since wrapping (unfrozen layers).
  if (const std::size_t count = group_param_count(w); count != w.params.size()) {
    std::visit([&](auto& mode) { mode.params_changed(w, count); }, mode_);
    refresh_params(w);
  }
  std::visit([&](auto& mode) { mode.reduce(w, all, batch); }, mode_);
  precision_.unscale(w.params);  // clipping sees the true gradients
}

DETTRIAL_INLINE void TrainingStep::step(WrappedOptimizer& w, bool auto_zero_grads) {
  std::visit([&](auto& mode) { mode.step(w, precision_); }, mode_);
  precision_.after_step();
  if (auto_zero_grads) w.optimizer->zero_grad();
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
