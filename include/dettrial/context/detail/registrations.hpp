// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a trial registers with its Context (`wrap_model`, `wrap_optimizer`,
/// `wrap_lr_scheduler`, `wrap_averaged_model`, `wrap_reducer`): kept in wrap order, checked as they
/// come, and forgotten together when their trainer goes away.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <torch/torch.h>

#include "../../detail/linkage.hpp"
#include "../../error.hpp"
#include "../../metrics/reducers.hpp"
#include "../../optim/averaged_model.hpp"
#include "../../optim/detail/lr_state.hpp"
#include "../../optim/lr_step.hpp"
#include "../../step/detail/step_mode.hpp"

namespace dettrial::detail {

/// A trial's registrations, in wrap order.
class Registrations {
 public:
  /// True while a trainer's trial is registered here.
  bool any() const { return !models_.empty() || !optimizers_.empty() || !schedulers_.empty() || !reducers_.empty(); }
  /// Forgets every wrapped object (their trainer went away).
  void clear();

  void add_model(std::shared_ptr<torch::nn::Module> module) { models_.push_back(std::move(module)); }
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return models_; }

  /// A TrialError when `optimizer` was wrapped before.
  void add_optimizer(torch::optim::Optimizer& optimizer, bool average_aggregated_gradients);
  std::span<WrappedOptimizer> optimizers() { return optimizers_; }
  std::span<const WrappedOptimizer> optimizers() const { return optimizers_; }
  /// The wrapped `optimizer`; a TrialError naming the misuse when it was not wrapped.
  WrappedOptimizer& find(const torch::optim::Optimizer& optimizer);

  /// Context::wrap_lr_scheduler: `scheduler` stepped in `Mode` every `frequency` units.
  template <class S, class Mode>
  void add_lr_scheduler(S& scheduler, const Mode& mode, std::int64_t frequency);
  std::span<WrappedScheduler> lr_schedulers() { return schedulers_; }
  std::span<const WrappedScheduler> lr_schedulers() const { return schedulers_; }
  /// Steps the lr_step::on_validation schedulers with this validation's metrics; a ConfigError when
  /// the metric one steps with is not among them.
  void step_lr_schedulers_on_validation(const MetricValues& metrics);

  /// Context::wrap_averaged_model (one per trial; the schedule checked).
  void add_average(std::shared_ptr<optim::AveragedWeights> weights, std::shared_ptr<torch::nn::Module> source, AveragingSchedule schedule);
  detail::ScheduledAverage* average() { return average_ ? &*average_ : nullptr; }
  const detail::ScheduledAverage* average() const { return average_ ? &*average_ : nullptr; }

  /// Context::wrap_reducer; `in_job`: the context has a communicator (a LocalReducer is refused).
  template <class T, class R>
  decltype(auto) add_reducer(R&& reducer, std::string name, bool for_training, bool for_validation, bool in_job);
  ReducerSet& reducers() { return reducers_; }
  const ReducerSet& reducers() const { return reducers_; }

 private:
  template <class Result>
  static void check_reducer_name(const std::string& name);

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<WrappedOptimizer> optimizers_;
  std::vector<WrappedScheduler> schedulers_;
  std::optional<detail::ScheduledAverage> average_;
  ReducerSet reducers_;
};

template <class S, class Mode>
void Registrations::add_lr_scheduler(S& scheduler, const Mode& mode, std::int64_t frequency) {
  constexpr bool by_metric = std::same_as<Mode, lr_step::on_validation>;
  constexpr bool steppable = by_metric ? MetricLRSchedulerLike<S> : LRSchedulerLike<S>;
  static_assert(by_metric || LRSchedulerLike<S>, "dettrial::Context::wrap_lr_scheduler<S>: S must have step() (a torch::optim scheduler)");
  static_assert(!by_metric || MetricLRSchedulerLike<S>,
                "dettrial::Context::wrap_lr_scheduler<S>: lr_step::on_validation steps S with the validation metric, so S "
                "must have step(double) (like dettrial::optim::ReduceLROnPlateau)");
  static_assert(LRStepMode<Mode>,
                "dettrial::Context::wrap_lr_scheduler: the mode must be a dettrial::lr_step policy (every_batch, "
                "every_epoch, every_optimizer_step, manual, on_validation) or a type with name and steps_after(...)");
  static_assert(!steppable || CheckpointableLRScheduler<S>,  // one sentence at a time
                "dettrial::Context::wrap_lr_scheduler<S>: checkpoints must restore S, so S must derive from "
                "torch::optim::LRScheduler or have save(torch::serialize::OutputArchive&) const and "
                "load(torch::serialize::InputArchive&)");
  if (frequency < 1) throw ConfigError("an LR scheduler's step frequency must be at least 1");
  if constexpr (steppable && LRStepMode<Mode> && CheckpointableLRScheduler<S>) {  // else only the sentences above
    WrappedScheduler w{&scheduler,
                       nullptr,
                       &Mode::steps_after,
                       frequency,
                       &save_lr_scheduler<S>,
                       &load_lr_scheduler<S>,
                       &lr_scheduler_steps<S>,
                       python_state_writer<S>(),
                       python_state_reader<S>()};
    w.type = c10::demangle(typeid(S).name());
    wrap_python_param_groups<S>(w);
    if constexpr (by_metric) {
      if (mode.metric.empty())
        throw ConfigError(
            "lr_step::on_validation needs the validation metric to step with, e.g. lr_step::on_validation{\"validation_loss\"}");
      w.step_with_metric = [](void* s, double metric) { static_cast<S*>(s)->step(metric); };
      w.metric = mode.metric;
    } else {
      w.step = [](void* s) { static_cast<S*>(s)->step(); };
    }
    schedulers_.push_back(std::move(w));
  }
}

template <class T, class R>
decltype(auto) Registrations::add_reducer(R&& reducer, std::string name, bool for_training, bool for_validation, bool in_job) {
  using Plain = std::remove_cvref_t<R>;
  if constexpr (MetricReducer<Plain>) {
    static_assert(std::is_lvalue_reference_v<R>,
                  "dettrial::Context::wrap_reducer: a reducer object must outlive the trainer, so pass a member of the trial "
                  "(an lvalue), not a temporary");
    Plain& r = reducer;
    if (reducers_.contains(&r)) throw TrialError("this reducer was already wrapped with wrap_reducer");
    if constexpr (!CrossSlotReducer<Plain>)
      if (in_job)
        throw TrialError("wrap_reducer" + (name.empty() ? std::string() : " '" + name + "'") +
                         ": this reducer has only reduce(), which sees one rank's data; in a data-parallel job give it "
                         "per_slot_reduce() and cross_slot_reduce(parts) (see dettrial::CrossSlotReducer), or wrap a "
                         "function with wrap_reducer(fn, name)");
    check_reducer_name<reduced_metrics_t<Plain>>(name);
    reducers_.add(WrappedReducer::wrap(r, std::move(name), for_training, for_validation));
    return static_cast<Plain&>(r);
  } else {
    constexpr bool is_function = std::invocable<Plain&, const std::vector<T>&>;
    static_assert(is_function && SlotValue<std::vector<T>>,
                  "dettrial::Context::wrap_reducer: the reducer must have reset() and either reduce() returning a number or "
                  "dettrial::MetricValues, or per_slot_reduce() returning a number, tensor, string or std::vector/std::tuple of "
                  "them and cross_slot_reduce(parts) returning a number or dettrial::MetricValues (see dettrial::MetricReducer), "
                  "or be a function of const std::vector<T>& (T a number or tensor) returning one");
    if constexpr (is_function) {
      using Result = std::invoke_result_t<Plain&, const std::vector<T>&>;
      static_assert(ReducedMetrics<Result>, "dettrial::Context::wrap_reducer(fn, name): fn must return a number or dettrial::MetricValues");
      if constexpr (ReducedMetrics<Result>) {
        using Function = FunctionReducer<T, std::decay_t<R>>;  // a function reference becomes a pointer
        check_reducer_name<Result>(name);
        auto owned = std::make_shared<Function>(std::forward<R>(reducer));
        Function& r = *owned;
        reducers_.add(WrappedReducer::wrap(r, std::move(name), for_training, for_validation), std::move(owned));
        return r;
      }
    }
  }
}

template <class Result>
void Registrations::check_reducer_name(const std::string& name) {
  constexpr bool returns_many = std::same_as<std::remove_cvref_t<Result>, MetricValues>;
  if (returns_many && !name.empty())
    throw TrialError("wrap_reducer: reducer '" + name + "' returns MetricValues (merged by their own names), so wrap it without a name");
  if (!returns_many && name.empty()) throw TrialError("wrap_reducer: a reducer that returns a number needs a name to report it under");
}

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE void Registrations::clear() {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  average_.reset();
  reducers_.clear();
}

DETTRIAL_INLINE void Registrations::add_optimizer(torch::optim::Optimizer& optimizer, bool average_aggregated_gradients) {
  for (const auto& w : optimizers_)
    if (w.optimizer == &optimizer) throw TrialError("this optimizer was already wrapped with wrap_optimizer");
  WrappedOptimizer w{&optimizer, {}, average_aggregated_gradients, optimizers_.size()};
  refresh_params(w);
  optimizers_.push_back(std::move(w));
}

DETTRIAL_INLINE WrappedOptimizer& Registrations::find(const torch::optim::Optimizer& optimizer) {
  for (auto& w : optimizers_)
    if (w.optimizer == &optimizer) return w;
  throw TrialError("step_optimizer was given an optimizer that was not wrapped with context.wrap_optimizer");
}

DETTRIAL_INLINE void Registrations::step_lr_schedulers_on_validation(const MetricValues& metrics) {
  for (auto& s : schedulers_) {
    if (!s.step_with_metric) continue;
    const std::optional<double> value = metrics.get(s.metric);
    if (!value) {
      std::string names;
      for (const auto& [name, v] : metrics) names += (names.empty() ? "" : ", ") + name;
      throw ConfigError("the LR scheduler stepped on validation needs the validation metric '" + s.metric +
                        "', which the validation did not report (it reported: " + names + ")");
    }
    s.step_with_metric(s.scheduler, *value);
  }
}

DETTRIAL_INLINE void Registrations::add_average(std::shared_ptr<optim::AveragedWeights> weights, std::shared_ptr<torch::nn::Module> source,
                                                AveragingSchedule schedule) {
  if (average_) throw ConfigError("wrap_averaged_model: the trial already wrapped an averaged model (one per trial)");
  if (schedule.every_n_steps < 1)
    throw ConfigError("wrap_averaged_model: every_n_steps must be at least 1, not " + std::to_string(schedule.every_n_steps));
  if (schedule.warmup_steps < 0)
    throw ConfigError("wrap_averaged_model: warmup_steps must be at least 0, not " + std::to_string(schedule.warmup_steps));
  average_ = detail::ScheduledAverage{std::move(weights), std::move(source), schedule};
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
