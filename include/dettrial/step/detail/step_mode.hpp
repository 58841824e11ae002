// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What every mode of the training step shares: a wrapped optimizer as the step drives it,
/// the settings a mode is made from, the optimizer state a checkpoint needs whole, and the concept
/// a mode models (local.hpp, replicated.hpp, ordered.hpp, sharded.hpp; chosen in training_step.hpp).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../../distributed/communicator.hpp"
#include "../../optim/handles.hpp"
#include "precision_step.hpp"

namespace dettrial::detail {

/// One optimizer wrapped with `context.wrap_optimizer`, as the training step drives it.
struct WrappedOptimizer {
  torch::optim::Optimizer* optimizer;
  /// Its groups' parameters, in group order (rebuilt when the groups grow: see refresh_params).
  std::vector<torch::Tensor> params;
  /// Whether an update divides the aggregated gradients by the aggregation frequency.
  bool average;
  /// Its place in wrap order: a mode's per-optimizer state is kept by it.
  std::size_t index;
};

/// The parameters `w.optimizer`'s groups hold now.
inline std::size_t group_param_count(const WrappedOptimizer& w) {
  std::size_t count = 0;
  for (const auto& group : w.optimizer->param_groups()) count += group.params().size();
  return count;
}

/// Rebuilds `w.params` when the groups changed size (unfrozen layers added); true when it did.
/// No allocation when they did not.
inline bool refresh_params(WrappedOptimizer& w) {
  if (group_param_count(w) == w.params.size()) return false;
  w.params.clear();
  for (auto& group : w.optimizer->param_groups())
    for (auto& p : group.params()) w.params.push_back(p);
  return true;
}

/// Determined's `average_aggregated_gradients`: an update's gradients, summed over
/// `aggregation_frequency` micro-batches, divided by it.
inline void average_over_aggregation(WrappedOptimizer& w, std::int64_t aggregation_frequency) {
  if (!w.average || aggregation_frequency <= 1) return;
  const double scale = 1.0 / static_cast<double>(aggregation_frequency);
  for (auto& p : w.params)
    if (p.grad().defined()) p.grad().mul_(scale);
}

/// What the training step is made from (the context's options and the config's).
struct StepSettings {
  /// The job's process group; null in one process.
  Communicator* communicator = nullptr;
  std::int64_t aggregation_frequency = 1;
  /// `optimizations.average_aggregated_gradients` (each optimizer may say otherwise).
  bool average_aggregated_gradients = true;
  /// `reproducibility.rank_invariant`.
  bool rank_invariant = false;
  /// The job's trial seed, and where this process sits (rank_invariant seeds each micro-batch).
  std::uint64_t trial_seed = 0;
  int rank = 0;
  int ranks = 1;
};

/**
 * @brief Optimizer state made whole for the checkpoint being taken (ZeRO's shards gathered into
 * the chief's optimizers, keyed by their parameters as an unsharded run keeps them), dropped again
 * when this object ends. Empty for a mode that holds the whole state anyway.
 */
class WholeStates {
 public:
  WholeStates() = default;
  WholeStates(const WholeStates&) = delete;
  WholeStates& operator=(const WholeStates&) = delete;
  WholeStates(WholeStates&& other) noexcept : made_(std::exchange(other.made_, {})) {}
  WholeStates& operator=(WholeStates&&) = delete;
  ~WholeStates() {
    for (auto& [optimizer, params] : made_)
      for (const auto& p : params) optimizer->state().erase(optimizer_state_key<StateMap>(p));
  }
  /// Records the entries made in `optimizer` for `params`, to drop when this object ends.
  void add(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params) { made_.emplace_back(&optimizer, std::move(params)); }

 private:
  using StateMap = std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
  std::vector<std::pair<torch::optim::Optimizer*, std::vector<torch::Tensor>>> made_{};
};

/**
 * @brief A mode of the training step: how an update's gradients become whole and how the
 * optimizers step. The step calls, per training batch: `begin_batch` (before train_batch),
 * `before_backward` (each backward pass), on an update batch `reduce` then (after the trial's clip)
 * `step` for each optimizer it steps, and `finish_batch`; at the fit's start `start_fit`, before
 * each checkpoint `whole_states`, and `params_changed` when an optimizer's groups grow.
 */
template <class M>
concept TrainingStepMode = requires(M& mode, std::span<WrappedOptimizer> all, WrappedOptimizer& w, PrecisionStep& precision,
                                    std::int64_t batch, std::int64_t records, bool update_batch, std::size_t count) {
  { M::name } -> std::convertible_to<std::string_view>;
  mode.begin_batch(batch, records);
  mode.before_backward(all, update_batch);
  mode.reduce(w, all, batch);
  mode.step(w, precision);
  mode.finish_batch(all, update_batch);
  mode.start_fit(all);
  { mode.whole_states(all) } -> std::same_as<WholeStates>;
  mode.params_changed(w, count);
};

/// What the modes that hold each parameter's whole optimizer state do at the fit's start and for a
/// checkpoint: nothing.
struct WholeParameterState {
  void start_fit(std::span<WrappedOptimizer>) {}
  WholeStates whole_states(std::span<WrappedOptimizer>) { return {}; }
};

}  // namespace dettrial::detail
