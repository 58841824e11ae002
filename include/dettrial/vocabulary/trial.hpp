// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a trial is: the hooks of both styles (declarative and imperative) as concepts, and the
/// one-sentence diagnostics dettrial::Trainer gives when a hook is missing or mistyped.
///
/// dettrial::Trial is the conjunction of five named pieces, each a concept a user can check on its
/// own (a failed `template <dettrial::Trial T>` names the piece that does not hold):
/// TrainingDataLoaderHook, ValidationDataLoaderHook, ModelHooks, TrainBatchHook and EvaluationHook.
/// The `Declares...` concepts only ask whether a hook is there; the `...Hook` concepts ask whether it
/// is there and right. All of them are false, never a hard error, for a broken trial.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <torch/torch.h>

#include "data.hpp"
#include "metrics.hpp"
#include "optim.hpp"

namespace dettrial::detail {

template <class R>
struct is_scheduled_lr : std::false_type {};
template <class S, class M>
struct is_scheduled_lr<ScheduledLR<S, M>> : std::true_type {};

/// Stands in for a type a broken trial does not provide, so declarations stay well-formed while the
/// one diagnostic that matters is printed.
struct missing {};

}  // namespace dettrial::detail

namespace dettrial {
// ---- the data loaders ----------------------------------------------------------------------------

/// T has a `build_training_data_loader()` hook (whatever it returns).
template <class T>
concept DeclaresTrainingDataLoader = requires(T& t) { t.build_training_data_loader(); };
/// T has a `build_validation_data_loader()` hook (whatever it returns).
template <class T>
concept DeclaresValidationDataLoader = requires(T& t) { t.build_validation_data_loader(); };

}  // namespace dettrial

namespace dettrial::detail {

template <class T>
using training_loader_result = decltype(std::declval<T&>().build_training_data_loader());
template <class T>
using validation_loader_result = decltype(std::declval<T&>().build_validation_data_loader());

template <class T>
consteval auto training_loader_type() {
  if constexpr (DeclaresTrainingDataLoader<T>) return std::type_identity<std::remove_cvref_t<training_loader_result<T>>>{};
  else return std::type_identity<missing>{};
}
template <class T>
consteval auto validation_loader_type() {
  if constexpr (DeclaresValidationDataLoader<T>) return std::type_identity<std::remove_cvref_t<validation_loader_result<T>>>{};
  else return std::type_identity<missing>{};
}
template <class L>
consteval auto batch_type_of() {
  if constexpr (BatchLoader<L>) return std::type_identity<batch_of<L>>{};
  else return std::type_identity<missing>{};
}

}  // namespace dettrial::detail

namespace dettrial {
/// The training loader type of trial T (`detail::missing` when it has none).
template <class T>
using training_loader_t = typename decltype(detail::training_loader_type<T>())::type;
/// The validation loader type of trial T.
template <class T>
using validation_loader_t = typename decltype(detail::validation_loader_type<T>())::type;
/// The batch type `train_batch` receives.
template <class T>
using training_batch_t = typename decltype(detail::batch_type_of<training_loader_t<T>>())::type;
/// The batch type `evaluate_batch` receives.
template <class T>
using validation_batch_t = typename decltype(detail::batch_type_of<validation_loader_t<T>>())::type;

/// Piece 1 of dettrial::Trial: `build_training_data_loader()` returns a dettrial::BatchLoader (such
/// as dettrial::DataLoader).
template <class T>
concept TrainingDataLoaderHook = DeclaresTrainingDataLoader<T> && BatchLoader<training_loader_t<T>>;
/// Piece 2 of dettrial::Trial: `build_validation_data_loader()` returns a dettrial::BatchLoader.
template <class T>
concept ValidationDataLoaderHook = DeclaresValidationDataLoader<T> && BatchLoader<validation_loader_t<T>>;

// ---- the model, optimizer and scheduler of a declarative trial ----------------------------------

/// A declarative trial builds its model with `build_model()` (the seed's MNIST tutorial style).
template <class T>
concept DeclaresModel = requires(T& t) { t.build_model(); };

}  // namespace dettrial

namespace dettrial::detail {
template <class T>
consteval auto model_type() {
  if constexpr (DeclaresModel<T>) return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().build_model())>>{};
  else return std::type_identity<missing>{};
}
}  // namespace dettrial::detail

namespace dettrial {
/// The model type of a declarative trial.
template <class T>
using model_t = typename decltype(detail::model_type<T>())::type;

/// A declarative trial with an `optimizer(model)` hook taking what `build_model()` returns (whatever
/// the hook returns).
template <class T>
concept DeclaresOptimizer = DeclaresModel<T> && requires(T& t, model_t<T>& m) { t.optimizer(m); };

}  // namespace dettrial

namespace dettrial::detail {
template <class T>
consteval auto optimizer_type() {
  if constexpr (DeclaresOptimizer<T>)
    return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().optimizer(std::declval<model_t<T>&>()))>>{};
  else return std::type_identity<missing>{};
}
/// What `optimizer(model)` may return: an optimizer by value or a smart pointer to one.
template <class O>
consteval auto optimizer_object_type() {
  if constexpr (TorchOptimizer<O>) return std::type_identity<O>{};
  else if constexpr (requires(O& o) { *o; }) {
    if constexpr (TorchOptimizer<std::remove_cvref_t<decltype(*std::declval<O&>())>>)
      return std::type_identity<std::remove_cvref_t<decltype(*std::declval<O&>())>>{};
    else return std::type_identity<missing>{};
  } else return std::type_identity<missing>{};
}
}  // namespace dettrial::detail

namespace dettrial {
/// What a declarative trial's `optimizer(model)` returns.
template <class T>
using optimizer_result_t = typename decltype(detail::optimizer_type<T>())::type;
/// The optimizer class behind it.
template <class T>
using optimizer_t = typename decltype(detail::optimizer_object_type<optimizer_result_t<T>>())::type;

/// A declarative trial with an `lr_scheduler(optimizer)` hook taking the optimizer class behind what
/// `optimizer(model)` returns (whatever the hook returns).
template <class T>
concept DeclaresLRScheduler = DeclaresModel<T> && requires(T& t, optimizer_t<T>& o) { t.lr_scheduler(o); };

}  // namespace dettrial

namespace dettrial::detail {
template <class T>
consteval auto scheduler_type() {
  if constexpr (DeclaresLRScheduler<T>)
    return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().lr_scheduler(std::declval<optimizer_t<T>&>()))>>{};
  else return std::type_identity<missing>{};
}
}  // namespace dettrial::detail

namespace dettrial {
/// What a declarative trial's optional `lr_scheduler(optimizer)` returns.
template <class T>
using scheduler_result_t = typename decltype(detail::scheduler_type<T>())::type;

/// `build_model()` returns a LibTorch module (a dettrial::ModelHandle).
template <class T>
concept BuildModelHook = DeclaresModel<T> && ModelHandle<model_t<T>>;
/// `optimizer(model)` returns a torch::optim optimizer, by value or by smart pointer.
template <class T>
concept OptimizerHook = DeclaresOptimizer<T> && TorchOptimizer<optimizer_t<T>>;
/// `lr_scheduler(optimizer)` returns a scheduler with `step()` or a dettrial::scheduled(...) one.
template <class T>
concept LRSchedulerHook =
    DeclaresLRScheduler<T> && (LRSchedulerLike<scheduler_result_t<T>> || detail::is_scheduled_lr<scheduler_result_t<T>>::value);

/// Piece 3 of dettrial::Trial: a declarative trial (one with `build_model()`) has a BuildModelHook,
/// an OptimizerHook and, if it declares one, an LRSchedulerHook. True for an imperative trial, which
/// wraps its model and optimizer in its constructor.
template <class T>
concept ModelHooks = !DeclaresModel<T> || (BuildModelHook<T> && OptimizerHook<T> && (!DeclaresLRScheduler<T> || LRSchedulerHook<T>));

// ---- train_batch and the evaluation hook ---------------------------------------------------------

template <class T>
concept DeclaresTrainBatch = requires { &T::train_batch; } || requires(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t i) {
  t.train_batch(b, m, i, i);
} || requires(T& t, training_batch_t<T>& b, std::int64_t i) { t.train_batch(b, i, i); };
template <class T>
concept DeclaresEvaluateBatch = requires { &T::evaluate_batch; } || requires(T& t, validation_batch_t<T>& b, model_t<T>& m) {
  t.evaluate_batch(b, m);
} || requires(T& t, validation_batch_t<T>& b) { t.evaluate_batch(b); };
template <class T>
concept DeclaresEvaluateFullDataset = requires { &T::evaluate_full_dataset; } || requires(T& t, validation_loader_t<T>& l, model_t<T>& m) {
  t.evaluate_full_dataset(l, m);
} || requires(T& t, validation_loader_t<T>& l) { t.evaluate_full_dataset(l); };

}  // namespace dettrial

namespace dettrial::detail {
/// Calls train_batch in the trial's style; only used in unevaluated contexts and by the trainer.
template <class T>
decltype(auto) call_train_batch(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t epoch_idx, std::int64_t batch_idx) {
  if constexpr (DeclaresModel<T>) return t.train_batch(b, m, epoch_idx, batch_idx);
  else return t.train_batch(b, epoch_idx, batch_idx);
}
template <class T>
decltype(auto) call_evaluate_batch(T& t, validation_batch_t<T>& b, model_t<T>& m, std::int64_t batch_idx) {
  if constexpr (DeclaresModel<T>) {
    if constexpr (requires { t.evaluate_batch(b, m, batch_idx); }) return t.evaluate_batch(b, m, batch_idx);
    else return t.evaluate_batch(b, m);
  } else {
    if constexpr (requires { t.evaluate_batch(b, batch_idx); }) return t.evaluate_batch(b, batch_idx);
    else return t.evaluate_batch(b);
  }
}
template <class T>
decltype(auto) call_evaluate_full_dataset(T& t, validation_loader_t<T>& l, model_t<T>& m) {
  if constexpr (DeclaresModel<T>) return t.evaluate_full_dataset(l, m);
  else return t.evaluate_full_dataset(l);
}
}  // namespace dettrial::detail

namespace dettrial {
template <class T>
concept CallableTrainBatch =
    (DeclaresModel<T> && requires(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t i) { t.train_batch(b, m, i, i); }) ||
    (!DeclaresModel<T> && requires(T& t, training_batch_t<T>& b, std::int64_t i) { t.train_batch(b, i, i); });
template <class T>
concept CallableEvaluateBatch =
    (DeclaresModel<T> && (requires(T& t, validation_batch_t<T>& b, model_t<T>& m, std::int64_t i) { t.evaluate_batch(b, m, i); } ||
                          requires(T& t, validation_batch_t<T>& b, model_t<T>& m) { t.evaluate_batch(b, m); })) ||
    (!DeclaresModel<T> && (requires(T& t, validation_batch_t<T>& b, std::int64_t i) { t.evaluate_batch(b, i); } ||
                           requires(T& t, validation_batch_t<T>& b) { t.evaluate_batch(b); }));
template <class T>
concept CallableEvaluateFullDataset =
    (DeclaresModel<T> && requires(T& t, validation_loader_t<T>& l, model_t<T>& m) { t.evaluate_full_dataset(l, m); }) ||
    (!DeclaresModel<T> && requires(T& t, validation_loader_t<T>& l) { t.evaluate_full_dataset(l); });

}  // namespace dettrial

namespace dettrial::detail {
// What a hook returns. Only named once the hook is known to be callable: the concepts below put these
// after the Callable... check in a conjunction, which substitutes its right side only when its left
// side holds (naming one of these for a hook that cannot be called would be a hard error).
template <class T>
using train_batch_result_t =
    decltype(call_train_batch(std::declval<T&>(), std::declval<training_batch_t<T>&>(), std::declval<model_t<T>&>(), 0, 0));
template <class T>
using evaluate_batch_result_t =
    decltype(call_evaluate_batch(std::declval<T&>(), std::declval<validation_batch_t<T>&>(), std::declval<model_t<T>&>(), 0));
template <class T>
using evaluate_full_dataset_result_t =
    decltype(call_evaluate_full_dataset(std::declval<T&>(), std::declval<validation_loader_t<T>&>(), std::declval<model_t<T>&>()));
}  // namespace dettrial::detail

namespace dettrial {
/// Piece 4 of dettrial::Trial: `train_batch` can be called with the training loader's batch type, as
/// `train_batch(batch, model, epoch_idx, batch_idx)` in a declarative trial or
/// `train_batch(batch, epoch_idx, batch_idx)` in an imperative one, and returns dettrial::Metrics (with
/// a "loss" entry) or the loss as a torch::Tensor.
template <class T>
concept TrainBatchHook = DeclaresTrainBatch<T> && CallableTrainBatch<T> && MetricsResult<detail::train_batch_result_t<T>>;

/// `evaluate_batch` can be called with the validation loader's batch type, as
/// `evaluate_batch(batch, model[, batch_idx])` (declarative) or `evaluate_batch(batch[, batch_idx])`
/// (imperative), and returns dettrial::Metrics.
template <class T>
concept EvaluateBatchHook =
    DeclaresEvaluateBatch<T> && CallableEvaluateBatch<T> && std::same_as<std::remove_cvref_t<detail::evaluate_batch_result_t<T>>, Metrics>;
/// `evaluate_full_dataset` can be called with the validation loader, as
/// `evaluate_full_dataset(loader, model)` (declarative) or `evaluate_full_dataset(loader)`
/// (imperative), and returns dettrial::Metrics.
template <class T>
concept EvaluateFullDatasetHook = DeclaresEvaluateFullDataset<T> && CallableEvaluateFullDataset<T> &&
                                  std::same_as<std::remove_cvref_t<detail::evaluate_full_dataset_result_t<T>>, Metrics>;

/// Piece 5 of dettrial::Trial: exactly one of `evaluate_batch` (an EvaluateBatchHook) and
/// `evaluate_full_dataset` (an EvaluateFullDatasetHook).
template <class T>
concept EvaluationHook =
    (EvaluateBatchHook<T> && !DeclaresEvaluateFullDataset<T>) || (EvaluateFullDatasetHook<T> && !DeclaresEvaluateBatch<T>);

}  // namespace dettrial

namespace dettrial::detail {

/// The first thing wrong with a trial type, in the order a user would fix them.
enum class TrialProblem {
  none,
  no_training_loader,
  training_loader_not_a_loader,
  no_validation_loader,
  validation_loader_not_a_loader,
  model_not_a_module,
  no_optimizer,
  optimizer_not_an_optimizer,
  scheduler_not_a_scheduler,
  no_train_batch,
  train_batch_not_callable,
  train_batch_not_metrics,
  no_evaluate_hook,
  both_evaluate_hooks,
  evaluate_batch_not_callable,
  evaluate_batch_not_metrics,
  evaluate_full_dataset_not_callable,
  evaluate_full_dataset_not_metrics,
};

/// The first thing wrong with a trial, from the same concepts dettrial::Trial is made of (each rule
/// is stated once, in its concept).
template <class T>
consteval TrialProblem first_trial_problem() {
  using P = TrialProblem;
  if constexpr (!DeclaresTrainingDataLoader<T>) return P::no_training_loader;
  else if constexpr (!TrainingDataLoaderHook<T>) return P::training_loader_not_a_loader;
  else if constexpr (!DeclaresValidationDataLoader<T>) return P::no_validation_loader;
  else if constexpr (!ValidationDataLoaderHook<T>) return P::validation_loader_not_a_loader;
  else if constexpr (DeclaresModel<T> && !BuildModelHook<T>) return P::model_not_a_module;
  else if constexpr (DeclaresModel<T> && !DeclaresOptimizer<T>) return P::no_optimizer;
  else if constexpr (DeclaresModel<T> && !OptimizerHook<T>) return P::optimizer_not_an_optimizer;
  else if constexpr (DeclaresLRScheduler<T> && !LRSchedulerHook<T>) return P::scheduler_not_a_scheduler;
  else if constexpr (!DeclaresTrainBatch<T>) return P::no_train_batch;
  else if constexpr (!CallableTrainBatch<T>) return P::train_batch_not_callable;
  else if constexpr (!TrainBatchHook<T>) return P::train_batch_not_metrics;
  else if constexpr (!DeclaresEvaluateBatch<T> && !DeclaresEvaluateFullDataset<T>) return P::no_evaluate_hook;
  else if constexpr (DeclaresEvaluateBatch<T> && DeclaresEvaluateFullDataset<T>) return P::both_evaluate_hooks;
  else if constexpr (DeclaresEvaluateBatch<T> && !CallableEvaluateBatch<T>) return P::evaluate_batch_not_callable;
  else if constexpr (DeclaresEvaluateBatch<T> && !EvaluateBatchHook<T>) return P::evaluate_batch_not_metrics;
  else if constexpr (DeclaresEvaluateFullDataset<T> && !CallableEvaluateFullDataset<T>) return P::evaluate_full_dataset_not_callable;
  else if constexpr (DeclaresEvaluateFullDataset<T> && !EvaluateFullDatasetHook<T>) return P::evaluate_full_dataset_not_metrics;
  else return P::none;
}

/// Instantiated by dettrial::Trainer<T>: exactly one of these assertions fails for a broken trial,
/// and its message is the one sentence that names the hook at fault.
template <class T>
struct TrialDiagnostics {
  static constexpr TrialProblem problem = first_trial_problem<T>();
  using P = TrialProblem;
  static_assert(problem != P::no_training_loader,
                "dettrial::Trainer<T>: T has no build_training_data_loader() hook; add one that returns a dettrial::DataLoader");
  static_assert(problem != P::training_loader_not_a_loader,
                "dettrial::Trainer<T>: T::build_training_data_loader() must return a dettrial::BatchLoader such as dettrial::DataLoader "
                "(size() batches per epoch and batches(chain), the batches one rank reads)");
  static_assert(problem != P::no_validation_loader,
                "dettrial::Trainer<T>: T has no build_validation_data_loader() hook; add one that returns a dettrial::DataLoader");
  static_assert(problem != P::validation_loader_not_a_loader,
                "dettrial::Trainer<T>: T::build_validation_data_loader() must return a dettrial::BatchLoader such as dettrial::DataLoader "
                "(size() batches per epoch and batches(chain), the batches one rank reads)");
  static_assert(problem != P::model_not_a_module,
                "dettrial::Trainer<T>: T::build_model() must return a LibTorch module (a torch::nn::ModuleHolder such as "
                "torch::nn::Sequential, or a std::shared_ptr to a torch::nn::Module)");
  static_assert(problem != P::no_optimizer,
                "dettrial::Trainer<T>: T has build_model() but no optimizer(model) hook; add one that returns a torch::optim optimizer");
  static_assert(problem != P::optimizer_not_an_optimizer,
                "dettrial::Trainer<T>: T::optimizer(model) must return a torch::optim::Optimizer (by value or by smart pointer)");
  static_assert(problem != P::scheduler_not_a_scheduler,
                "dettrial::Trainer<T>: T::lr_scheduler(optimizer) must return a scheduler with step() or dettrial::scheduled(...)");
  static_assert(problem != P::no_train_batch,
                "dettrial::Trainer<T>: T has no train_batch hook; declare train_batch(batch, model, epoch_idx, batch_idx) in a "
                "trial with build_model(), or train_batch(batch, epoch_idx, batch_idx) in one that wraps its model in its constructor");
  static_assert(problem != P::train_batch_not_callable,
                "dettrial::Trainer<T>: T::train_batch cannot be called with the training loader's batch type as "
                "train_batch(batch, model, epoch_idx, batch_idx) (with build_model) or train_batch(batch, epoch_idx, batch_idx) (without)");
  static_assert(
      problem != P::train_batch_not_metrics,
      "dettrial::Trainer<T>: T::train_batch must return dettrial::Metrics (with a \"loss\" entry) or the loss as a torch::Tensor");
  static_assert(problem != P::no_evaluate_hook,
                "dettrial::Trainer<T>: T has neither evaluate_batch nor evaluate_full_dataset; define exactly one of them");
  static_assert(problem != P::both_evaluate_hooks,
                "dettrial::Trainer<T>: T defines both evaluate_batch and evaluate_full_dataset; define exactly one of them");
  static_assert(problem != P::evaluate_batch_not_callable,
                "dettrial::Trainer<T>: T::evaluate_batch cannot be called with the validation loader's batch type as "
                "evaluate_batch(batch, model[, batch_idx]) (with build_model) or evaluate_batch(batch[, batch_idx]) (without)");
  static_assert(problem != P::evaluate_batch_not_metrics, "dettrial::Trainer<T>: T::evaluate_batch must return dettrial::Metrics");
  static_assert(problem != P::evaluate_full_dataset_not_callable,
                "dettrial::Trainer<T>: T::evaluate_full_dataset cannot be called as evaluate_full_dataset(loader, model) (with "
                "build_model) or evaluate_full_dataset(loader) (without)");
  static_assert(problem != P::evaluate_full_dataset_not_metrics,
                "dettrial::Trainer<T>: T::evaluate_full_dataset must return dettrial::Metrics");
  static constexpr bool ok = problem == P::none;
};

}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief A trial: a plain type with Determined's hooks, in either style.
 *
 * - Declarative: `build_model()`, `optimizer(model)`, optional `lr_scheduler(optimizer)`,
 *   `train_batch(batch, model, epoch_idx, batch_idx)` returning metrics with `loss`; the trainer does
 *   backward, step and zero_grad.
 * - Imperative: the constructor takes the Context and wraps models, optimizers and schedulers;
 *   `train_batch(batch, epoch_idx, batch_idx)` calls `context.backward(loss)` and
 *   `context.step_optimizer(opt)` itself.
 *
 * Both need `build_training_data_loader()`, `build_validation_data_loader()` and exactly one of
 * `evaluate_batch` / `evaluate_full_dataset`. Each of these is a concept of its own, so a compiler's
 * "constraints not satisfied" note names the piece that does not hold; dettrial::Trainer<T> says the
 * same in one sentence.
 */
template <class T>
concept Trial = TrainingDataLoaderHook<T> && ValidationDataLoaderHook<T> && ModelHooks<T> && TrainBatchHook<T> && EvaluationHook<T>;

/// A trial in the declarative style.
template <class T>
concept DeclarativeTrial = Trial<T> && DeclaresModel<T>;
/// A trial in the imperative style.
template <class T>
concept ImperativeTrial = Trial<T> && !DeclaresModel<T>;

}  // namespace dettrial
