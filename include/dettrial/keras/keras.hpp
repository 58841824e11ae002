// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The TFKerasTrial style: a compiled model (optimizer, loss and metrics by name, as
/// `model.compile` takes them) and in-memory data; dettrial writes the training and validation steps.
///
/// A Keras-style trial has `build_model()` returning `dettrial::keras::compile(...)`'s result and
/// `build_training_data_loader()` / `build_validation_data_loader()` returning an `InMemorySequence`,
/// `WeightedSequence`, `MultiInputSequence`, `DictInputSequence` (or any dettrial loader of
/// `(inputs, labels)` batches); `Trainer<MyKerasTrial>` runs it through
/// `keras::TrialAdapter`, under the same loop, checkpoints, searchers and data parallel as any trial.
/// Training metrics are `loss` and the compiled metrics; validation metrics carry Keras's `val_`
/// prefix (`val_loss`, `val_accuracy`). Keras's callbacks are in keras_callbacks.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../context/context.hpp"
#include "../data/data_loader.hpp"
#include "../vocabulary/metrics.hpp"
#include "../optim/handles.hpp"
#include "../detail/yaml.hpp"
#include "../detail/linkage.hpp"
#include "../trainer/trainer.hpp"
#include "keras_callbacks.hpp"

namespace dettrial::keras {

/**
 * @brief Supervised data held in memory, in batches (Determined's `InMemorySequence`): inputs,
 * labels with as many rows, and the batch size of this process's loader.
 * @code{.cpp}
 * return dettrial::keras::InMemorySequence{.data = images, .labels = labels, .batch_size = 32};
 * @endcode
 */
struct InMemorySequence {
  torch::Tensor data;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  /// Training batches are drawn in a new order every epoch (Keras's `fit(shuffle=True)`), from the
  /// trial's seed; validation batches come in order.
  bool shuffle = true;
};

/**
 * @brief An InMemorySequence with weights: a weight per sample (Keras's `fit(sample_weight=...)`, or a
 * Sequence yielding `(x, y, sample_weight)`) and/or per class (`class_weight`, Determined's
 * `context.configure_fit(class_weight=...)`), multiplied together. A batch's loss is then Keras's
 * weighted loss, the sum of weight x loss over the batch divided by its size; metrics are not
 * weighted (Keras weights only `weighted_metrics`). For validation, `class_weight` is refused, as
 * Keras's `evaluate` takes none.
 */
struct WeightedSequence {
  torch::Tensor data;
  torch::Tensor labels;
  /// One weight per sample (shape (N)); undefined: 1 each.
  torch::Tensor sample_weights{};
  /// A weight per integer class label; a label without one weighs 1.
  std::map<std::int64_t, double> class_weight{};
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/**
 * @brief Several inputs held in memory, as a list: Keras's `fit(x=[a, b], y)` for a model of several
 * inputs. Batches are `(std::vector<torch::Tensor>, labels)`; the model's `forward` takes
 * `const std::vector<torch::Tensor>&`, in the same order.
 */
struct MultiInputSequence {
  std::vector<torch::Tensor> inputs;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/**
 * @brief Several inputs held in memory, by name: Keras's `fit(x={"image": a, "meta": b}, y)`. Batches
 * are `(std::map<std::string, torch::Tensor>, labels)`; the model's `forward` takes
 * `const std::map<std::string, torch::Tensor>&`.
 */
struct DictInputSequence {
  std::map<std::string, torch::Tensor> inputs;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/// Loss functions with Keras's names and semantics (the mean over the batch).
}  // namespace dettrial::keras

namespace dettrial::keras::losses {
/// Integer class labels against logits (`from_logits`) or probabilities.
struct SparseCategoricalCrossentropy {
  bool from_logits = false;
};
/// One-hot (or soft) labels against logits or probabilities.
struct CategoricalCrossentropy {
  bool from_logits = false;
};
/// 0/1 labels against logits or probabilities, element-wise.
struct BinaryCrossentropy {
  bool from_logits = false;
};
struct MeanSquaredError {};
struct MeanAbsoluteError {};
/// A loss of one's own: `(y_pred, y_true) -> scalar tensor`.
using Custom = std::function<torch::Tensor(const torch::Tensor& y_pred, const torch::Tensor& y_true)>;

inline SparseCategoricalCrossentropy sparse_categorical_crossentropy(bool from_logits = false) { return {from_logits}; }
inline CategoricalCrossentropy categorical_crossentropy(bool from_logits = false) { return {from_logits}; }
inline BinaryCrossentropy binary_crossentropy(bool from_logits = false) { return {from_logits}; }
}  // namespace dettrial::keras::losses

namespace dettrial::keras {
/// The losses `compile` takes: one of Keras's (chosen once; a switch per batch) or one's own.
using Loss = std::variant<losses::SparseCategoricalCrossentropy, losses::CategoricalCrossentropy, losses::BinaryCrossentropy,
                          losses::MeanSquaredError, losses::MeanAbsoluteError, losses::Custom>;

/// An optimizer by Keras's name (`"adam"`, `"sgd"`, `"rmsprop"`, `"adamw"`, `"adagrad"`, with
/// Keras's default settings) or one already made over the model's parameters.
using OptimizerChoice = std::variant<std::string, std::shared_ptr<torch::optim::Optimizer>>;

/// What `model.compile` takes. Keras's defaults: RMSprop, no metrics.
struct CompileOptions {
  OptimizerChoice optimizer = std::string("rmsprop");
  Loss loss = losses::SparseCategoricalCrossentropy{};
  /// Metric names: `accuracy` (resolved from the loss as Keras does), `sparse_categorical_accuracy`,
  /// `categorical_accuracy`, `binary_accuracy`, `mse`/`mean_squared_error`, `mae`/`mean_absolute_error`.
  std::vector<std::string> metrics;
};

/// A metric `compile` resolved from its name; the name is what the reports show.
struct CompiledMetric {
  enum class Kind { sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, mean_squared_error, mean_absolute_error };
  Kind kind;
  MetricKey name;
  MetricKey validation_name;  // with Keras's "val_" prefix
};

/// A model with its optimizer, loss and metrics: what a Keras-style trial's `build_model()` returns.
template <ModelHandle M>
struct CompiledModel {
  M model;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  Loss loss;
  std::vector<CompiledMetric> metrics;
};

}  // namespace dettrial::keras

namespace dettrial::detail {
/// Keras's optimizer of that name over `parameters`, with Keras's defaults (Adam: lr 0.001, eps 1e-7; SGD:
/// lr 0.01; RMSprop: lr 0.001, rho 0.9, eps 1e-7; AdamW: lr 0.001, weight decay 0.004, eps 1e-7;
/// Adagrad: lr 0.001, initial accumulator 0.1, eps 1e-7). An unknown name is a ConfigError with a suggestion.
DETTRIAL_INLINE std::shared_ptr<torch::optim::Optimizer> optimizer_named(const std::string& name,
                                                                         const std::vector<torch::Tensor>& parameters);
/// The metrics of `names`, `accuracy` resolved by `loss` as Keras resolves it.
DETTRIAL_INLINE std::vector<keras::CompiledMetric> metrics_named(const std::vector<std::string>& names, const keras::Loss& loss);
/// The loss of a batch (the mean over its rows).
DETTRIAL_INLINE torch::Tensor loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// One metric of a batch, as a tensor on the batch's device (no synchronisation).
DETTRIAL_INLINE torch::Tensor metric_value(keras::CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's loss of each sample (its values averaged over the last axis where Keras averages), for weighting.
DETTRIAL_INLINE torch::Tensor per_sample_loss(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's weighted loss: sum(weight x per-sample loss) / the number of per-sample values.
DETTRIAL_INLINE torch::Tensor weighted_loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights);
/// The weights of a WeightedSequence: sample weights times class weights, one per sample, as float.
DETTRIAL_INLINE torch::Tensor combined_weights(const keras::WeightedSequence& s);

/// The records of several inputs (a vector or a string-keyed map of tensors) and their labels,
/// gathered together: a batch is `(inputs, labels)`.
template <class Inputs>
class InputsDataset {
 public:
  InputsDataset(Inputs inputs, torch::Tensor labels, const char* who) : inputs_(std::move(inputs)), labels_(std::move(labels)) {
    if (!labels_.defined() || labels_.dim() == 0) throw TrialError(std::string(who) + " needs labels with a first (record) dimension");
    if (inputs_.empty()) throw TrialError(std::string(who) + " has no inputs");
    for (const auto& [name, t] : named()) {
      if (!t.defined() || t.dim() == 0) throw TrialError(std::string(who) + ": input " + name + " has no first (record) dimension");
      if (t.size(0) != labels_.size(0))
        throw TrialError(std::string(who) + ": input " + name + " has " + std::to_string(t.size(0)) + " records but there are " +
                         std::to_string(labels_.size(0)) + " labels");
    }
  }
  std::int64_t size() const { return labels_.size(0); }
  std::tuple<Inputs, torch::Tensor> get_batch(const torch::Tensor& indices) const {
    const torch::Tensor at = indices.to(labels_.device());
    Inputs batch = inputs_;
    if constexpr (requires { batch.begin()->second; })
      for (auto& [name, t] : batch) t = t.index_select(0, at);
    else
      for (auto& t : batch) t = t.index_select(0, at);
    return {std::move(batch), labels_.index_select(0, at)};
  }

 private:
  /// (name, tensor) pairs for messages: the key, or "#i" in a list.
  std::vector<std::pair<std::string, torch::Tensor>> named() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    if constexpr (requires { inputs_.begin()->second; })
      for (const auto& [name, t] : inputs_) out.emplace_back("'" + name + "'", t);
    else
      for (std::size_t i = 0; i < inputs_.size(); ++i) out.emplace_back("#" + std::to_string(i), inputs_[i]);
    return out;
  }
  Inputs inputs_;
  torch::Tensor labels_;
};
}  // namespace dettrial::detail

namespace dettrial::keras {
/**
 * @brief `model.compile(optimizer, loss, metrics)`: the model with an optimizer over its parameters
 * (by name with Keras's defaults, or given), a loss and metrics. Bad names are a ConfigError naming them.
 * @code{.cpp}
 * return dettrial::keras::compile(context.wrap_model(model), {.optimizer = "adam",
 *     .loss = dettrial::keras::losses::sparse_categorical_crossentropy(true), .metrics = {"accuracy"}});
 * @endcode
 */
template <ModelHandle M>
CompiledModel<M> compile(M model, CompileOptions options) {
  auto optimizer = std::visit(
      [&](auto& choice) -> std::shared_ptr<torch::optim::Optimizer> {
        if constexpr (std::is_same_v<std::decay_t<decltype(choice)>, std::string>)
          return detail::optimizer_named(choice, model->parameters());
        else return choice;
      },
      options.optimizer);
  if (!optimizer) throw ConfigError("keras::compile was given no optimizer");
  auto metrics = detail::metrics_named(options.metrics, options.loss);
  return CompiledModel<M>{std::move(model), std::move(optimizer), std::move(options.loss), std::move(metrics)};
}

/// Initialises a model's Linear and Conv layers as Keras's Dense and Conv layers are (Glorot-uniform
/// weights, zero biases) instead of LibTorch's defaults, so a port starts where the Keras model starts.
DETTRIAL_INLINE void initialize_like_keras(torch::nn::Module& model);

/// A type whose `build_model()` returns a keras::CompiledModel: a Keras-style trial.
template <class T>
struct is_compiled_model : std::false_type {};
template <class M>
struct is_compiled_model<CompiledModel<M>> : std::true_type {};

template <class K>
concept KerasTrial = requires(K& k) {
  requires is_compiled_model<std::remove_cvref_t<decltype(k.build_model())>>::value;
  k.build_training_data_loader();
  k.build_validation_data_loader();
};

}  // namespace dettrial::keras

namespace dettrial::detail {
/**
 * @brief Validation means as Keras's `evaluate` takes them: each batch's loss and metrics weighted
 * by its records, so a partial last batch counts by its size (Determined's own averaging counts
 * every batch once). The weighted sums stay on the model's device until the validation ends, and
 * are combined across ranks as one process over the whole set would take them.
 */
struct RecordWeightedMeans {
  std::vector<std::string> names;
  torch::Tensor sums;  // one per name: the sum over batches of value x records
  double records = 0;

  void reset() {
    sums = torch::Tensor();
    records = 0;
  }
  void add(const std::vector<torch::Tensor>& values, std::int64_t batch_records) {
    const torch::Tensor weighted = torch::stack(values).to(torch::kDouble) * static_cast<double>(batch_records);
    sums = sums.defined() ? sums + weighted : weighted;
    records += static_cast<double>(batch_records);
  }
  std::vector<double> per_slot_reduce() const {
    std::vector<double> parts(names.size(), 0.0);
    if (sums.defined()) {
      const torch::Tensor host = sums.cpu();
      for (std::size_t i = 0; i < names.size(); ++i) parts[i] = host[static_cast<std::int64_t>(i)].item<double>();
    }
    parts.push_back(records);
    return parts;
  }
  MetricValues cross_slot_reduce(const std::vector<std::vector<double>>& parts) const {
    std::vector<double> total(names.size() + 1, 0.0);
    for (const auto& p : parts)
      for (std::size_t i = 0; i < total.size() && i < p.size(); ++i) total[i] += p[i];
    MetricValues out;
    for (std::size_t i = 0; i < names.size(); ++i) out.set(names[i], total[i] / total.back());
    return out;
  }
};
}  // namespace dettrial::detail

namespace dettrial::keras {
/**
 * @brief A Keras-style trial as a dettrial trial: builds the user's trial, its compiled model (wrapped
 * in the context unless `build_model` did) and optimizer, and writes `train_batch` (forward, loss,
 * backward, optimizer step, metrics) and `evaluate_batch` (the same without the step, `val_` names,
 * averaged over records as Keras's `evaluate` averages: see detail::RecordWeightedMeans).
 * `Trainer<K>` uses it for every KerasTrial K.
 */
template <KerasTrial K>
class TrialAdapter {
  static auto make_loader(InMemorySequence s, bool training) {
    if (!s.data.defined() || !s.labels.defined()) throw TrialError("keras::InMemorySequence needs both data and labels");
    if (s.data.size(0) != s.labels.size(0))
      throw TrialError("keras::InMemorySequence has " + std::to_string(s.data.size(0)) + " inputs but " + std::to_string(s.labels.size(0)) +
                       " labels");
    return DataLoader(TensorDataset(std::move(s.data), std::move(s.labels)),
                      {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(WeightedSequence s, bool training) {
    if (!s.data.defined() || !s.labels.defined()) throw TrialError("keras::WeightedSequence needs both data and labels");
    if (!training && !s.class_weight.empty())
      throw TrialError(
          "keras::WeightedSequence: class_weight applies to training only (Keras's evaluate takes none); "
          "give the validation sequence sample_weights");
    torch::Tensor weights = detail::combined_weights(s);
    return DataLoader(TensorDataset(std::move(s.data), std::move(s.labels), std::move(weights)),
                      {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(MultiInputSequence s, bool training) {
    return DataLoader(
        detail::InputsDataset<std::vector<torch::Tensor>>(std::move(s.inputs), std::move(s.labels), "keras::MultiInputSequence"),
        {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(DictInputSequence s, bool training) {
    return DataLoader(
        detail::InputsDataset<std::map<std::string, torch::Tensor>>(std::move(s.inputs), std::move(s.labels), "keras::DictInputSequence"),
        {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  template <class L>
  static constexpr bool is_sequence = std::is_same_v<L, InMemorySequence> || std::is_same_v<L, WeightedSequence> ||
                                      std::is_same_v<L, MultiInputSequence> || std::is_same_v<L, DictInputSequence>;
  template <class L>
  static auto as_loader(L loader, bool training) {
    if constexpr (is_sequence<std::remove_cvref_t<L>>) return make_loader(std::move(loader), training);
    else return loader;
  }
  /// The model's output for a batch's inputs, with one sentence when its forward cannot take them.
  template <class X>
  torch::Tensor forward(X& x) {
    static_assert(
        requires { compiled_.model->forward(x); },
        "dettrial: the Keras-style model's forward cannot take this batch's inputs: a MultiInputSequence needs "
        "forward(const std::vector<torch::Tensor>&), a DictInputSequence forward(const std::map<std::string, torch::Tensor>&)");
    return compiled_.model->forward(x);
  }
  /// Whether a batch is (inputs, labels, sample_weights): a tuple-like of three.
  template <class Batch>
  static consteval bool weighted_batch() {
    if constexpr (requires { std::tuple_size<std::remove_cvref_t<Batch>>::value; })
      return std::tuple_size_v<std::remove_cvref_t<Batch>> == 3;
    else return false;
  }
  /// Calls `step(inputs, labels, weights or null)` on a batch of two or three parts.
  template <class Batch, class Step>
  static decltype(auto) with_parts(Batch& batch, Step&& step) {
    if constexpr (weighted_batch<Batch>()) {
      auto& [x, y, w] = batch;
      return step(x, y, static_cast<const torch::Tensor*>(&w));
    } else {
      auto& [x, y] = batch;
      return step(x, y, static_cast<const torch::Tensor*>(nullptr));
    }
  }
  torch::Tensor batch_loss(const torch::Tensor& y_pred, const torch::Tensor& y, const torch::Tensor* weights) const {
    return weights ? detail::weighted_loss_value(compiled_.loss, y_pred, y, *weights) : detail::loss_value(compiled_.loss, y_pred, y);
  }

 public:
  using Compiled = std::remove_cvref_t<decltype(std::declval<K&>().build_model())>;
  /// Its epochs are records_per_epoch's, where the config sets it, as Determined's TFKerasTrial
  /// counts them (its workload sequencer's records_per_epoch // global_batch_size); a PyTorch-style
  /// trial's are its loader's.
  static constexpr bool epochs_follow_records_per_epoch = true;

  template <class... Args>
  explicit TrialAdapter(Context& context, Args&&... args)
      : context_(context), trial_(make_trial(context, std::forward<Args>(args)...)), compiled_(trial_.build_model()) {
    const auto module = module_of(compiled_.model);
    bool wrapped = false;
    for (const auto& m : context.models()) wrapped = wrapped || m.get() == module.get();
    if (!wrapped) compiled_.model = context.wrap_model(compiled_.model);
    bool optimizer_wrapped = false;
    for (std::size_t i = 0; i < context.num_optimizers(); ++i)
      optimizer_wrapped = optimizer_wrapped || &context.optimizer(i) == compiled_.optimizer.get();
    if (!optimizer_wrapped) context.wrap_optimizer(*compiled_.optimizer);
    validation_means_.names.push_back("val_loss");
    for (const CompiledMetric& m : compiled_.metrics) validation_means_.names.emplace_back(m.validation_name.view());
    context.wrap_reducer(validation_means_, {}, /*for_training=*/false);
  }

  K& trial() { return trial_; }
  Compiled& compiled() { return compiled_; }

  auto build_training_data_loader() { return as_loader(trial_.build_training_data_loader(), /*training=*/true); }
  auto build_validation_data_loader() { return as_loader(trial_.build_validation_data_loader(), /*training=*/false); }

  auto build_callbacks() {
    if constexpr (requires(K& k) { k.keras_callbacks(); }) return trial_.keras_callbacks();
    else return std::tuple<>{};
  }

  template <class Batch>
  Metrics train_batch(Batch& batch, std::int64_t, std::int64_t) {
    return with_parts(batch, [&](auto& x, const torch::Tensor& y, const torch::Tensor* weights) {
      const torch::Tensor y_pred = forward(x);
      const torch::Tensor loss = batch_loss(y_pred, y, weights);
      context_.backward(loss);
      context_.step_optimizer(*compiled_.optimizer);
      Metrics out{{"loss", loss.detach()}};
      const torch::Tensor seen = y_pred.detach();
      for (const CompiledMetric& m : compiled_.metrics) out.set(m.name, detail::metric_value(m.kind, seen, y));
      return out;
    });
  }

  template <class Batch>
  Metrics evaluate_batch(Batch& batch) {
    torch::NoGradGuard no_grad;
    return with_parts(batch, [&](auto& x, const torch::Tensor& y, const torch::Tensor* weights) {
      const torch::Tensor y_pred = forward(x);
      values_.clear();
      values_.push_back(batch_loss(y_pred, y, weights));
      for (const CompiledMetric& m : compiled_.metrics) values_.push_back(detail::metric_value(m.kind, y_pred, y));
      validation_means_.add(values_, y_pred.size(0));
      return Metrics{};  // the means are validation_means_'s
    });
  }

 private:
  template <class... Args>
  static K make_trial(Context& context, Args&&... args) {
    if constexpr (std::constructible_from<K, Context&, Args...>) return K(context, std::forward<Args>(args)...);
    else return K(std::forward<Args>(args)...);
  }

  Context& context_;
  K trial_;
  Compiled compiled_;
  detail::RecordWeightedMeans validation_means_;
  std::vector<torch::Tensor> values_;  // a batch's loss and metrics, kept to spare an allocation a batch
};

}  // namespace dettrial::keras

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <limits>

namespace dettrial::detail {

DETTRIAL_INLINE std::shared_ptr<torch::optim::Optimizer> optimizer_named(const std::string& name,
                                                                         const std::vector<torch::Tensor>& parameters) {
  namespace optim = torch::optim;
  if (name == "adam") return std::make_shared<optim::Adam>(parameters, optim::AdamOptions(1e-3).eps(1e-7));
  if (name == "sgd") return std::make_shared<optim::SGD>(parameters, optim::SGDOptions(1e-2));
  if (name == "rmsprop") return std::make_shared<optim::RMSprop>(parameters, optim::RMSpropOptions(1e-3).alpha(0.9).eps(1e-7));
  if (name == "adamw") return std::make_shared<optim::AdamW>(parameters, optim::AdamWOptions(1e-3).eps(1e-7).weight_decay(0.004));
  if (name == "adagrad")
    return std::make_shared<optim::Adagrad>(parameters, optim::AdagradOptions(1e-3).initial_accumulator_value(0.1).eps(1e-7));
  throw ConfigError("keras::compile: unknown optimizer '" + name + "'" +
                    detail::suggestion(name, {"adam", "sgd", "rmsprop", "adamw", "adagrad"}) +
                    " (by name: adam, sgd, rmsprop, adamw, adagrad; or pass an optimizer)");
}

DETTRIAL_INLINE std::vector<keras::CompiledMetric> metrics_named(const std::vector<std::string>& names, const keras::Loss& loss) {
  using Kind = keras::CompiledMetric::Kind;
  std::vector<keras::CompiledMetric> out;
  for (const std::string& name : names) {
    if (name == "loss") throw ConfigError("keras::compile: 'loss' is always reported; it is not a metric to ask for");
    Kind kind;
    if (name == "accuracy" || name == "acc") {
      // Keras picks the accuracy that fits the loss.
      if (std::holds_alternative<keras::losses::CategoricalCrossentropy>(loss)) kind = Kind::categorical_accuracy;
      else if (std::holds_alternative<keras::losses::BinaryCrossentropy>(loss)) kind = Kind::binary_accuracy;
      else kind = Kind::sparse_categorical_accuracy;
    } else if (name == "sparse_categorical_accuracy") kind = Kind::sparse_categorical_accuracy;
    else if (name == "categorical_accuracy") kind = Kind::categorical_accuracy;
    else if (name == "binary_accuracy") kind = Kind::binary_accuracy;
    else if (name == "mse" || name == "mean_squared_error") kind = Kind::mean_squared_error;
    else if (name == "mae" || name == "mean_absolute_error") kind = Kind::mean_absolute_error;
    else
      throw ConfigError(
          "keras::compile: unknown metric '" + name + "'" +
          detail::suggestion(name, {"accuracy", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy", "mse", "mae"}));
    out.push_back({kind, MetricKey(name), MetricKey("val_" + name)});
  }
  return out;
}

// Keras clips probabilities to [eps, 1 - eps] before the logarithm. Losses are computed in float32:
// under autocast the outputs may be fp16/bf16, and some losses (binary cross-entropy on
// probabilities) refuse to autocast. Both the batch loss and the per-sample one start here.
constexpr double keras_epsilon = 1e-7;
inline torch::Tensor loss_input(const torch::Tensor& output) {
  const bool low = output.scalar_type() == torch::kHalf || output.scalar_type() == torch::kBFloat16;
  return low ? output.to(torch::kFloat) : output;
}
/// Log-probabilities over the last axis, from logits or from (clipped) probabilities.
inline torch::Tensor log_probabilities(bool from_logits, const torch::Tensor& y_pred) {
  return from_logits ? torch::log_softmax(y_pred, -1) : y_pred.clamp(keras_epsilon, 1 - keras_epsilon).log();
}

DETTRIAL_INLINE torch::Tensor loss_value(const keras::Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        if constexpr (std::is_same_v<L, keras::losses::SparseCategoricalCrossentropy>) {
          // Classes on the last axis; labels of shape (N) or (N, 1) (Keras squeezes the last axis).
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return torch::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}));
        } else if constexpr (std::is_same_v<L, keras::losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1).mean();
        } else if constexpr (std::is_same_v<L, keras::losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          if (l.from_logits) return torch::binary_cross_entropy_with_logits(y_pred, target);
          return torch::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanSquaredError>) {
          return torch::mse_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else if constexpr (std::is_same_v<L, keras::losses::MeanAbsoluteError>) {
          return torch::l1_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else {
          if (!l) throw TrialError("keras::compile was given an empty custom loss");
          return l(y_pred, y_true);
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor per_sample_loss(const keras::Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        namespace F = torch::nn::functional;
        if constexpr (std::is_same_v<L, keras::losses::SparseCategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return F::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}),
                             F::NLLLossFuncOptions().reduction(torch::kNone));
        } else if constexpr (std::is_same_v<L, keras::losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          const torch::Tensor each =
              l.from_logits
                  ? F::binary_cross_entropy_with_logits(y_pred, target,
                                                        F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone))
                  : F::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target, F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
          return each.mean(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanSquaredError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).square().mean(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanAbsoluteError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).abs().mean(-1);
        } else {
          throw TrialError(
              "keras: a custom loss returns one number for the batch, so sample or class weights cannot weigh its "
              "samples; use one of Keras's losses, or weigh inside the custom loss");
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor weighted_loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights) {
  const torch::Tensor each = per_sample_loss(loss, y_pred, y_true);
  // One weight per sample, broadcast over any further axes of the per-sample losses.
  std::vector<std::int64_t> shape(static_cast<std::size_t>(each.dim()), 1);
  shape[0] = each.size(0);
  const torch::Tensor weights = sample_weights.to(each.dtype()).reshape(shape);
  return (each * weights).sum() / static_cast<double>(each.numel());
}

DETTRIAL_INLINE torch::Tensor combined_weights(const keras::WeightedSequence& s) {
  const std::int64_t n = s.data.size(0);
  if (s.labels.size(0) != n)
    throw TrialError("keras::WeightedSequence has " + std::to_string(n) + " inputs but " + std::to_string(s.labels.size(0)) + " labels");
  torch::Tensor weights = torch::ones({n}, torch::kFloat);
  if (s.sample_weights.defined()) {
    if (s.sample_weights.numel() != n)
      throw TrialError("keras::WeightedSequence has " + std::to_string(n) + " inputs but " + std::to_string(s.sample_weights.numel()) +
                       " sample weights");
    weights = s.sample_weights.reshape({n}).to(torch::kFloat).cpu().clone();
  }
  if (!s.class_weight.empty()) {
    if (s.labels.dim() > 2 || (s.labels.dim() == 2 && s.labels.size(1) != 1))
      throw TrialError("keras::WeightedSequence: class_weight needs one integer label per sample (Keras's rule), not labels of shape " +
                       c10::str(s.labels.sizes()));
    const torch::Tensor labels = s.labels.reshape({n}).to(torch::kLong).cpu().contiguous();
    const auto* label = labels.data_ptr<std::int64_t>();
    auto* w = weights.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      if (const auto found = s.class_weight.find(label[i]); found != s.class_weight.end()) w[i] *= static_cast<float>(found->second);
  }
  return weights.to(s.data.device());
}

DETTRIAL_INLINE torch::Tensor metric_value(keras::CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true) {
  using Kind = keras::CompiledMetric::Kind;
  switch (kind) {
    case Kind::sparse_categorical_accuracy:
      return y_pred.argmax(-1).reshape({-1}).eq(y_true.to(torch::kLong).reshape({-1})).to(torch::kFloat).mean();
    case Kind::categorical_accuracy: return y_pred.argmax(-1).eq(y_true.argmax(-1)).to(torch::kFloat).mean();
    case Kind::binary_accuracy:
      // Keras's threshold: 0.5.
      return y_pred.gt(0.5).eq(y_true.reshape(y_pred.sizes()).gt(0.5)).to(torch::kFloat).mean();
    case Kind::mean_squared_error: return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).pow(2).mean();
    case Kind::mean_absolute_error: return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).abs().mean();
  }
  throw TrialError("keras: unknown metric kind");
}

}  // namespace dettrial::detail

namespace dettrial::keras {
DETTRIAL_INLINE void initialize_like_keras(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* linear = m->as<torch::nn::LinearImpl>()) {
      torch::nn::init::xavier_uniform_(linear->weight);
      if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
    } else if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
      torch::nn::init::xavier_uniform_(conv->weight);
      if (conv->bias.defined()) torch::nn::init::zeros_(conv->bias);
    } else if (auto* conv1 = m->as<torch::nn::Conv1dImpl>()) {
      torch::nn::init::xavier_uniform_(conv1->weight);
      if (conv1->bias.defined()) torch::nn::init::zeros_(conv1->bias);
    }
  }
}

}  // namespace dettrial::keras

#endif  // DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

/**
 * @brief A Keras-style trial (keras::KerasTrial: `build_model()` returns `keras::compile(...)`) runs
 * as the trial keras::TrialAdapter writes for it: the same loop, checkpoints, searchers and data
 * parallel; `trial()` is the user's trial.
 */
template <class K>
  requires keras::KerasTrial<K>
class Trainer<K> : public Trainer<keras::TrialAdapter<K>> {
  using Adapted = Trainer<keras::TrialAdapter<K>>;

 public:
  using Adapted::Adapted;
  K& trial() { return Adapted::trial().trial(); }
};

}  // namespace dettrial
