// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The optimization vocabulary: what a model, an optimizer, an LR scheduler, a step mode and
/// a clipping policy are to dettrial (concepts), and ScheduledLR, a scheduler with its step mode.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"

namespace dettrial {

/// A model as a trial holds it: a LibTorch module holder (`torch::nn::Sequential`, `MyNet`) or a
/// `std::shared_ptr` to a `torch::nn::Module`.
template <class M>
concept ModelHandle = requires(M& m) {
  { m.ptr() } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
} || requires(M& m) {
  { m.get() } -> std::convertible_to<torch::nn::Module*>;
  { std::shared_ptr<torch::nn::Module>(m) };
};

/// A LibTorch optimizer (torch::optim::SGD, Adam, ... or a user subclass of torch::optim::Optimizer).
template <class O>
concept TorchOptimizer = std::derived_from<std::remove_cvref_t<O>, torch::optim::Optimizer>;

/// Something with `step()`: LibTorch's schedulers (StepLR, ...) and any user type.
template <class S>
concept LRSchedulerLike = requires(S& s) { s.step(); };

/// A scheduler stepped with a metric (ReduceLROnPlateau): `step(double)`.
template <class S>
concept MetricLRSchedulerLike = requires(S& s, double metric) { s.step(metric); };

/// A step mode policy: a type with `steps_after(batch_idx, aggregation_frequency, epoch_len, frequency)`.
template <class M>
concept LRStepMode = requires(std::int64_t i) {
  { M::name } -> std::convertible_to<std::string_view>;
  { M::steps_after(i, i, i, i) } -> std::convertible_to<std::int64_t>;
};

/**
 * @brief A scheduler with its step mode and frequency: what a declarative trial's `lr_scheduler(opt)`
 * returns to choose a mode other than `every_batch`.
 * @code{.cpp}
 * auto lr_scheduler(torch::optim::SGD& opt) {
 *   return dettrial::scheduled(dettrial::optim::StepLR(opt, 1, 0.9), dettrial::lr_step::every_epoch{});
 * }
 * @endcode
 */
template <LRSchedulerLike S, LRStepMode Mode>
struct ScheduledLR {
  S scheduler;
  std::int64_t frequency = 1;
  using mode = Mode;
};

template <LRSchedulerLike S, LRStepMode Mode>
ScheduledLR<S, Mode> scheduled(S scheduler, Mode, std::int64_t frequency = 1) {
  if (frequency < 1) throw ConfigError("an LR scheduler's step frequency must be at least 1");
  return ScheduledLR<S, Mode>{std::move(scheduler), frequency};
}

/**
 * @brief An LR scheduler a checkpoint can restore exactly: a `torch::optim::LRScheduler` (StepLR,
 * ...; dettrial saves its step count), or any type with `save(torch::serialize::OutputArchive&) const`
 * and `load(torch::serialize::InputArchive&)`.
 */
template <class S>
concept CheckpointableLRScheduler = std::derived_from<S, torch::optim::LRScheduler> ||
                                    requires(S& s, const S& cs, torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
                                      cs.save(out);
                                      s.load(in);
                                    };

/// A clipping policy: called with the optimizer's parameters before the step.
template <class C>
concept GradientClipper = std::invocable<C&, std::vector<torch::Tensor>&>;

}  // namespace dettrial
