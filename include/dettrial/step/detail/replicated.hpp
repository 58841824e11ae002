// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step of a data-parallel job (PyTorch's DistributedDataParallel): every rank
/// holds the whole model and optimizer state; an update batch's gradients are all-reduced in
/// buckets, each started as soon as the backward pass has filled it.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "../../distributed/communicator.hpp"
#include "../../distributed/detail/gradient_buckets.hpp"
#include "step_mode.hpp"

namespace dettrial::detail {

/// Replicated data parallel: the gradients averaged over the ranks, every rank stepping alike.
class ReplicatedStep : public WholeParameterState {
 public:
  static constexpr std::string_view name = "replicated";
  explicit ReplicatedStep(const StepSettings& settings)
      : communicator_(settings.communicator), aggregation_frequency_(settings.aggregation_frequency) {}

  void begin_batch(std::int64_t, std::int64_t) {}
  /// An update batch's backward pass starts each bucket's all-reduce as soon as its gradients are
  /// ready; the other batches only accumulate.
  void before_backward(std::span<WrappedOptimizer>, bool update_batch) {
    for (auto& buckets : buckets_)
      if (buckets) buckets->arm(update_batch);
  }
  void reduce(WrappedOptimizer& w, std::span<WrappedOptimizer>, std::int64_t) {
    if (buckets_.size() <= w.index) buckets_.resize(w.index + 1);
    auto& buckets = buckets_[w.index];
    if (!buckets) buckets = std::make_unique<GradientBuckets>(*communicator_, w.params);  // on the first update
    buckets->all_reduce();
    average_over_aggregation(w, aggregation_frequency_);
  }
  void step(WrappedOptimizer& w, PrecisionStep& precision) { precision.step(*w.optimizer, w.params); }
  void finish_batch(std::span<WrappedOptimizer>, bool) {}
  /// The buckets were cut for the old parameters: made again on the next update.
  void params_changed(WrappedOptimizer& w, std::size_t) {
    if (w.index < buckets_.size()) buckets_[w.index].reset();
  }

 private:
  Communicator* communicator_;  // never null
  std::int64_t aggregation_frequency_;
  std::vector<std::unique_ptr<GradientBuckets>> buckets_;  // per optimizer, by wrap order
};
static_assert(TrainingStepMode<ReplicatedStep>);

}  // namespace dettrial::detail
