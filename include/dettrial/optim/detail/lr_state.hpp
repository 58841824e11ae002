// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Saving and restoring LR schedulers in checkpoints. LibTorch's schedulers have no
/// serialization; their whole state is the step count (the optimizer keeps the learning rates).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "../../vocabulary/optim.hpp"

namespace dettrial::detail {

/// Reaches LRScheduler's protected step count (the usual derived-class member-pointer route).
struct LRSchedulerAccess : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& s) { return s.*(&LRSchedulerAccess::step_count_); }
};

template <class S>
void save_lr_scheduler(void* scheduler, torch::serialize::OutputArchive& archive) {
  S& s = *static_cast<S*>(scheduler);
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>)
    archive.write("step_count", c10::IValue(static_cast<std::int64_t>(LRSchedulerAccess::step_count(s))));
  else std::as_const(s).save(archive);
}

template <class S>
void load_lr_scheduler(void* scheduler, torch::serialize::InputArchive& archive) {
  S& s = *static_cast<S*>(scheduler);
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>) {
    c10::IValue count;
    archive.read("step_count", count);
    LRSchedulerAccess::step_count(s) = static_cast<unsigned>(count.toInt());
  } else {
    s.load(archive);
  }
}

/// Steps taken, when the scheduler is a LibTorch one (for the Python-side state dict); else -1.
template <class S>
std::int64_t lr_scheduler_steps(void* scheduler) {
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>) return LRSchedulerAccess::step_count(*static_cast<S*>(scheduler));
  else return -1;
}

/// A wrapped LR scheduler with its type erased: how to step, save and restore it, and when it steps.
struct WrappedScheduler {
  void* scheduler;
  void (*step)(void*);
  /// The step mode's rule (see dettrial::LRStepMode): steps due after batch_idx.
  std::int64_t (*steps_after)(std::int64_t batch_idx, std::int64_t aggregation_frequency, std::int64_t epoch_len, std::int64_t frequency);
  std::int64_t frequency;
  void (*save)(void*, torch::serialize::OutputArchive&);
  void (*load)(void*, torch::serialize::InputArchive&);
  /// Steps taken, for a LibTorch scheduler; -1 for others.
  std::int64_t (*steps_taken)(void*);
  /// Writes Python's `state_dict()` of the scheduler, when it has `python_state` (dettrial::optim's); else null.
  void (*python_state)(void*, c10::impl::GenericDict&) = nullptr;
  /// Restores the scheduler from Python's `state_dict()` when it can (dettrial::optim's); else null.
  void (*load_python_state)(void*, const c10::impl::GenericDict&, const std::string&) = nullptr;
  /// For a scheduler that keeps entries in Python's parameter groups (OneCycleLR's max_lr, ...): the
  /// optimizer it drives, and how to write those entries into group g of that optimizer's Python
  /// state and read them back from it; else null.
  torch::optim::Optimizer* (*driven_optimizer)(void*) = nullptr;
  void (*python_param_group)(void*, std::size_t, c10::impl::GenericDict&) = nullptr;
  void (*load_python_param_group)(void*, std::size_t, const c10::impl::GenericDict&, const std::string&) = nullptr;
  /// For lr_step::on_validation: `step(metric)` with the validation's value of `metric`.
  void (*step_with_metric)(void*, double) = nullptr;
  std::string metric{};
  /// The scheduler's C++ type, for messages ("dettrial::optim::MultiStepLR").
  std::string type{};

  /// Steps the scheduler as often as its mode says is due after update batch `batch_idx` (none for
  /// lr_step::on_validation, which steps with a validation's metric).
  void step_after_update(std::int64_t batch_idx, std::int64_t aggregation_frequency, std::int64_t epoch_len) {
    const std::int64_t due = steps_after(batch_idx, aggregation_frequency, epoch_len, frequency);
    for (std::int64_t i = 0; i < due; ++i) step(scheduler);
  }
};

/// The scheduler's own Python state dict writer, when it has one.
template <class S>
auto python_state_writer() -> void (*)(void*, c10::impl::GenericDict&) {
  if constexpr (requires(const S& s, c10::impl::GenericDict& d) { s.python_state(d); })
    return [](void* s, c10::impl::GenericDict& d) { static_cast<const S*>(s)->python_state(d); };
  else return nullptr;
}

/// The scheduler's own Python state dict reader, when it has one.
template <class S>
auto python_state_reader() -> void (*)(void*, const c10::impl::GenericDict&, const std::string&) {
  if constexpr (requires(S& s, const c10::impl::GenericDict& d, const std::string& what) { s.load_python_state(d, what); })
    return [](void* s, const c10::impl::GenericDict& d, const std::string& what) { static_cast<S*>(s)->load_python_state(d, what); };
  else return nullptr;
}

/// Sets `w`'s parameter-group entries, when the scheduler keeps some in Python's groups.
template <class S>
void wrap_python_param_groups(WrappedScheduler& w) {
  if constexpr (requires(const S& s, std::size_t g, c10::impl::GenericDict& d) {
                  s.python_param_group(g, d);
                  { s.optimizer() } -> std::convertible_to<torch::optim::Optimizer&>;
                }) {
    w.driven_optimizer = [](void* s) { return &static_cast<S*>(s)->optimizer(); };
    w.python_param_group = [](void* s, std::size_t g, c10::impl::GenericDict& d) { static_cast<const S*>(s)->python_param_group(g, d); };
    if constexpr (requires(S& s, std::size_t g, const c10::impl::GenericDict& d, const std::string& what) {
                    s.load_python_param_group(g, d, what);
                  })
      w.load_python_param_group = [](void* s, std::size_t g, const c10::impl::GenericDict& d, const std::string& what) {
        static_cast<S*>(s)->load_python_param_group(g, d, what);
      };
  }
}

}  // namespace dettrial::detail
