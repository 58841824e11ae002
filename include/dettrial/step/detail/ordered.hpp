// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step of `reproducibility.rank_invariant`: each micro-batch's gradients kept
/// apart and summed in the data stream's order, so that 1, 2 or 4 ranks train bit for bit alike
/// (see distributed/ordered_gradients.hpp), with each micro-batch's random draws seeded from its
/// place in the stream.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "../../distributed/detail/ordered_gradients.hpp"
#include "../../detail/linkage.hpp"
#include "step_mode.hpp"

namespace dettrial::detail {

/// Gradients summed in stream order, in one process or a job.
class OrderedStep : public WholeParameterState {
 public:
  static constexpr std::string_view name = "ordered";
  /// A ConfigError when `settings` sums aggregated gradients instead of averaging them.
  explicit OrderedStep(const StepSettings& settings);

  /// Seeds the random draws of this micro-batch from its place in the data stream (the same records
  /// get the same dropout masks whatever the rank count).
  void begin_batch(std::int64_t batch, std::int64_t records);
  void before_backward(std::span<WrappedOptimizer>, bool) {}
  /// Once per update batch, however many optimizers step: this batch's gradients stashed, and every
  /// optimizer's gradients replaced by the ordered, records-weighted sum of the update's micro-batches.
  void reduce(WrappedOptimizer& w, std::span<WrappedOptimizer> all, std::int64_t batch);
  void step(WrappedOptimizer& w, PrecisionStep& precision) { precision.step(*w.optimizer, w.params); }
  /// On a batch that only accumulates, its gradients are stashed.
  void finish_batch(std::span<WrappedOptimizer> all, bool update_batch) {
    if (!update_batch) gradients_.stash(params_of(all), records_);
  }
  void params_changed(WrappedOptimizer&, std::size_t) {}

 private:
  /// Every wrapped optimizer's parameters, each once, in wrap order (built again when groups grow).
  const std::vector<torch::Tensor>& params_of(std::span<WrappedOptimizer> all);

  OrderedGradients gradients_;
  std::uint64_t trial_seed_;
  int rank_;
  int ranks_;
  std::vector<torch::Tensor> params_;
  std::size_t params_counted_ = 0;  // the optimizers' parameters params_ was built from
  std::int64_t records_ = 0;
  std::int64_t combined_at_ = -1;  // the update batch whose gradients were combined
};
static_assert(TrainingStepMode<OrderedStep>);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>

#include "../../detail/random.hpp"
#include "../../error.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE OrderedStep::OrderedStep(const StepSettings& settings)
    : gradients_(settings.communicator, settings.aggregation_frequency),
      trial_seed_(settings.trial_seed),
      rank_(settings.rank),
      ranks_(settings.ranks) {
  if (!settings.average_aggregated_gradients)
    throw ConfigError(
        "reproducibility.rank_invariant needs optimizations.average_aggregated_gradients: a sum over the aggregated batches "
        "grows with the aggregation frequency, so it would differ between rank counts");
}

DETTRIAL_INLINE void OrderedStep::begin_batch(std::int64_t batch, std::int64_t records) {
  // Micro-batch k of rank r is the stream's batch k * ranks + r: the same records in any layout.
  const auto stream_batch = static_cast<std::uint64_t>(batch * ranks_ + rank_);
  torch::manual_seed(mix64(trial_seed_ ^ mix64(stream_batch + golden_gamma)) >> 1);
  records_ = records;
}

DETTRIAL_INLINE void OrderedStep::reduce(WrappedOptimizer&, std::span<WrappedOptimizer> all, std::int64_t batch) {
  if (combined_at_ == batch) return;
  combined_at_ = batch;
  const std::vector<torch::Tensor>& params = params_of(all);
  gradients_.stash(params, records_);
  gradients_.combine(params);  // weighted by records: already an average
}

DETTRIAL_INLINE const std::vector<torch::Tensor>& OrderedStep::params_of(std::span<WrappedOptimizer> all) {
  std::size_t count = 0;
  for (auto& w : all) {
    refresh_params(w);
    count += w.params.size();
  }
  if (count != params_counted_) {
    params_counted_ = count;
    params_.clear();
    for (const auto& w : all)
      for (const auto& p : w.params)
        if (std::none_of(params_.begin(), params_.end(), [&](const torch::Tensor& q) { return q.is_same(p); })) params_.push_back(p);
  }
  return params_;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
