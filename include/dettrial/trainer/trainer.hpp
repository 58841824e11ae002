// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::Trainer<TrialT>: checks a trial at compile time and runs Determined's training
/// loop for it, generated inline.
#pragma once

#include <concepts>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

#include "../context/detail/access.hpp"
#include "../context/context.hpp"
#include "../error.hpp"
#include "../detail/scope_exit.hpp"
#include "../vocabulary/trial.hpp"
#include "detail/callback_set.hpp"
#include "fit_options.hpp"
#include "detail/batch_loop.hpp"
#include "detail/fit_steps.hpp"

namespace dettrial {

/**
 * @brief Runs a trial: builds it, and on `fit()` runs Determined's loop (workloads ending at any
 * boundary, validation, reporting, the final validation) for it.
 *
 * `Trainer<T>` checks T's hooks at compile time; a trial that breaks the contract gets one sentence
 * naming the hook at fault. The trial is built in place (it may keep references to itself), from the
 * Context when it takes one.
 * @code{.cpp}
 * dettrial::Context context(dettrial::ExperimentConfig::load_file("const.yaml"));
 * dettrial::Trainer<MnistTrial> trainer(context);
 * trainer.fit({.max_length = dettrial::Epoch{1}});
 * @endcode
 * @tparam TrialT a type satisfying dettrial::Trial.
 */
template <class TrialT>
class Trainer {
  static constexpr bool trial_ok = detail::TrialDiagnostics<TrialT>::ok;
  static constexpr bool declarative = DeclaresModel<TrialT>;

  using Model = std::conditional_t<trial_ok && declarative, model_t<TrialT>, detail::missing>;
  using OptimizerHolder = std::conditional_t<trial_ok && declarative, optimizer_result_t<TrialT>, detail::missing>;
  using SchedulerResult = std::conditional_t<trial_ok && declarative, scheduler_result_t<TrialT>, detail::missing>;

  static constexpr auto trial_callbacks_type() {
    if constexpr (requires(TrialT& t) { t.build_callbacks(); })
      return std::type_identity<decltype(std::declval<TrialT&>().build_callbacks())>{};
    else return std::type_identity<std::tuple<>>{};
  }
  using TrialCallbacks = typename decltype(trial_callbacks_type())::type;

 public:
  /// Builds the trial (with `args...` after the context, when its constructor takes them) and, for a
  /// declarative trial, its model, optimizer and scheduler, wrapped in `context`.
  template <class... Args>
  explicit Trainer(Context& context, Args&&... args) : context_(context) {
    static_assert(std::constructible_from<TrialT, Context&, Args...> || std::constructible_from<TrialT, Args...>,
                  "dettrial::Trainer<T>: T must be constructible from (dettrial::Context&, args...) or from (args...), "
                  "where args are the Trainer's arguments after the context");
    if (detail::ContextAccess::has_registrations(key_, context_))
      throw TrialError("this context already serves a trainer; give each Trainer its own dettrial::Context");
    if constexpr (trial_ok) {
      // If building fails half-way, the context must not keep pointers into the half-built trial.
      auto release = detail::on_scope_exit([this] { detail::ContextAccess::release_registrations(key_, context_); });
      build(std::forward<Args>(args)...);
      release.dismiss();
    }
  }

 private:
  template <class... Args>
  void build(Args&&... args) {
    if constexpr (std::constructible_from<TrialT, Context&, Args...>)
      trial_ = std::make_unique<TrialT>(context_, std::forward<Args>(args)...);
    else trial_ = std::make_unique<TrialT>(std::forward<Args>(args)...);
    if constexpr (declarative) build_declarative();
    if constexpr (requires(TrialT& t) { t.build_callbacks(); }) callbacks_ = std::make_unique<TrialCallbacks>(trial_->build_callbacks());
    else callbacks_ = std::make_unique<TrialCallbacks>();
    if (context_.models().empty())
      throw TrialError("the trial wrapped no model: call context.wrap_model(...) in its constructor (or define build_model())");
    if (context_.num_optimizers() == 0)
      throw TrialError("the trial wrapped no optimizer: call context.wrap_optimizer(...) in its constructor (or define optimizer(model))");
  }

 public:
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// The context forgets the trial's models, optimizers, schedulers and reducers (they die with it).
  ~Trainer() { detail::ContextAccess::release_registrations(key_, context_); }

  TrialT& trial() { return *trial_; }
  Context& context() { return context_; }
  /// The model of a declarative trial.
  Model& model()
    requires declarative
  {
    return *model_;
  }

  /// The optimizer of a declarative trial.
  auto& optimizer()
    requires declarative
  {
    return detail::deref(*optimizer_);
  }

  /**
   * @brief Trains until `max_length`, validating, checkpointing and reporting at the configured
   * periods, and validates at the end. `callbacks...` (caller-owned) run after the trial's own.
   */
  template <class... Callbacks>
  FitResult fit(FitOptions options, Callbacks&... callbacks) {
    if constexpr (!trial_ok) {
      return {};
    } else {
      auto set = std::apply(
          [&](auto&... own) {
            return detail::CallbackSet<std::remove_reference_t<decltype(own)>..., Callbacks...>(std::tie(own..., callbacks...));
          },
          *callbacks_);
      detail::BatchLoop<TrialT, decltype(set)> run(key_, context_, *trial_, model_or_missing(), optimizer_or_missing(), set);
      return run.fit(std::move(options));
    }
  }

 private:
  void build_declarative() {
    model_.emplace(context_.wrap_model(trial_->build_model()));
    optimizer_.emplace(trial_->optimizer(*model_));
    auto& optimizer = detail::deref(*optimizer_);
    context_.wrap_optimizer(optimizer);
    if constexpr (!std::same_as<SchedulerResult, detail::missing>) {
      scheduler_ = std::make_unique<SchedulerResult>(trial_->lr_scheduler(optimizer));
      if constexpr (detail::is_scheduled_lr<SchedulerResult>::value)
        context_.wrap_lr_scheduler(scheduler_->scheduler, typename SchedulerResult::mode{}, scheduler_->frequency);
      else context_.wrap_lr_scheduler(*scheduler_, lr_step::every_batch{});
    }
  }

 public:
  /// `runs/<date>-<time>-<pid>` under the working directory.
  static std::filesystem::path default_output_dir() { return detail::default_output_dir(); }

 private:
  /// The model and optimizer holder a Run gets: a declarative trial's, else `missing` objects.
  auto& model_or_missing() {
    if constexpr (declarative) return *model_;
    else return missing_;
  }
  auto& optimizer_or_missing() {
    if constexpr (declarative) return *optimizer_;
    else return missing_;
  }

  /// The pass to the context's trainer-only calls: made here, and only here (detail::TrainerKey).
  detail::TrainerKey key_{};
  Context& context_;
  std::unique_ptr<TrialT> trial_;
  std::optional<Model> model_;
  std::optional<OptimizerHolder> optimizer_;
  std::unique_ptr<SchedulerResult> scheduler_;
  std::unique_ptr<TrialCallbacks> callbacks_;
  detail::missing missing_;
};

}  // namespace dettrial
