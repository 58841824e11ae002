// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The trial context: hyperparameters, batch sizes, seed, device, counters, and the wrapping of
/// models, optimizers, schedulers and reducers that the trainer drives.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include "../config/experiment_config.hpp"
#include "../config/hyperparameters.hpp"
#include "../config/profiler_options.hpp"
#include "../data/to_device.hpp"
#include "../detail/linkage.hpp"
#include "../detail/yaml.hpp"
#include "../optim/clip.hpp"
#include "../step/detail/step_mode.hpp"
#include "../tensorboard/event_file.hpp"
#include "options.hpp"
#include "detail/registrations.hpp"
#include "detail/setup.hpp"

namespace dettrial::detail {
/// Where the running fit stands: set by the trainer, read through the Context's counters.
struct RunPosition {
  /// The batch index training started (or resumed) from.
  std::int64_t initial_batch = 0;
  /// The global index of the batch being trained.
  std::int64_t current_batch = 0;
  /// Batches per epoch on this rank; 0 until training starts.
  std::int64_t epoch_len = 0;
  std::filesystem::path output_dir{};
  /// NumPy's and Python's generator states from the Determined checkpoint this run continues
  /// (`np_rng_state`, `random_rng_state`), written back into its checkpoints; none otherwise.
  c10::IValue python_generators{};
};
}  // namespace dettrial::detail

namespace dettrial::detail {
struct ContextAccess;
class TrainingStep;
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief What a trial sees of its run (Determined's PyTorchTrialContext).
 *
 * Imperative trials take it in their constructor and wrap their models, optimizers and schedulers
 * with it; declarative trials may take it to read hyperparameters. The trainer keeps the counters.
 */
class Context {
 public:
  /// A context for the one trial an experiment config describes.
  explicit Context(const ExperimentConfig& config, ContextOptions options = {});

  /// A context from hyperparameters alone (an empty experiment config).
  explicit Context(Hyperparameters hparams, ContextOptions options = {});

  Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options);

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // Out of line (compiled once in separate compilation): destroying a Context's members is a
  // large graph of inline code (optimizers, buckets, schedulers, the config) that a translation
  // unit making a Context would otherwise compile. (In a whole trial's unit the saving is small:
  // docs/benchmarks.md.)
  ~Context();

  // ---- hyperparameters and configuration -------------------------------------------------------

  /// The hyperparameter `name` (dotted for nested values) as T; throws HyperparameterError naming it.
  template <class T>
  T get_hparam(std::string_view name) const {
    return hparams_.get<T>(name);
  }
  const Hyperparameters& get_hparams() const { return hparams_; }
  /// The experiment config's `data` section.
  const YAML::Node& get_data_config() const { return config_.data; }
  /// The value at `path` (dotted for nested values) of the config's `data` section as T; throws
  /// ConfigError naming `data.<path>` when it is missing or is not a T. The common types are read
  /// once, in dettrial::compiled: a trial's translation unit compiles no YAML lookup for them.
  template <class T>
  T get_data(std::string_view path) const;
  /// The same, or `fallback` when the `data` section does not have `path` (a present but mistyped
  /// value still throws).
  template <class T>
  T get_data_or(std::string_view path, T fallback) const {
    return has_data(path) ? get_data<T>(path) : std::move(fallback);
  }
  /// True when the `data` section has a value at `path`.
  bool has_data(std::string_view path) const { return config_.has_data(path); }
  /// The running fit's output folder (metrics.jsonl, checkpoints/; in a search, the trial's own
  /// `trials/<id>/`): where a trial's or callback's own files belong. Empty until `fit` starts (the
  /// trial's constructor runs before), so read it in hooks and batches.
  const std::filesystem::path& output_dir() const { return position_.output_dir; }
  const ExperimentConfig& get_experiment_config() const { return config_; }

  /// `global_batch_size / slots_per_trial`; needs the `global_batch_size` hyperparameter.
  std::int64_t get_per_slot_batch_size() const { return hparams_.per_slot_batch_size(setup_.slots_per_trial); }
  /// The effective global batch size, `per_slot * slots`.
  std::int64_t get_global_batch_size() const { return get_per_slot_batch_size() * setup_.slots_per_trial; }
  /// The job's ranks: the communicator's size, else `resources.slots_per_trial` (which a fit then
  /// refuses above 1: one process would train alone on a slot's share of each global batch).
  std::int64_t slots_per_trial() const { return setup_.slots_per_trial; }
  /// True when the `global_batch_size` hyperparameter exists.
  bool has_global_batch_size() const { return hparams_.global_batch_size().has_value(); }

  // ---- seed, device, distribution -------------------------------------------------------------

  /// The seed every RNG was seeded with: the same seed gives the same run.
  std::uint64_t get_trial_seed() const { return setup_.trial_seed; }
  /// The trial's id in its experiment: 1, 2, ... in a search run by dettrial; 0 for a trial run on its
  /// own (see ContextOptions::trial_id).
  std::int64_t get_trial_id() const { return setup_.trial_id; }
  /// The experiment's id: a search's own number, kept when it is continued; 0 for a trial run on its own.
  std::int64_t get_experiment_id() const { return setup_.experiment_id; }
  const torch::Device& device() const { return setup_.device; }
  const DistributedInfo& distributed() const { return setup_.distributed; }
  /// The job's process group, or null for one process.
  Communicator* communicator() const { return setup_.communicator.get(); }
  /// The thread count this process is to compute with and why (see ContextOptions::threads).
  const ThreadChoice& threads() const { return setup_.threads; }
  /**
   * @brief What the process this context trains in should set for itself: the thread count, the
   * config's determinism, glibc's retention of freed memory, and the trial's seed (the chief's, in a
   * job). The context applies none of it: `dettrial::main` does, and a main of one's own calls
   * `context.process_settings().apply()` once, before building the trial.
   */
  ProcessSettings process_settings() const {
    return {.threads = setup_.threads, .deterministic = setup_.deterministic, .keep_freed_memory = true, .seed = setup_.trial_seed};
  }
  std::int64_t aggregation_frequency() const { return setup_.step.aggregation_frequency; }

  /// Moves a nested batch to this context's device (see dettrial::to_device).
  template <class B>
  std::remove_cvref_t<B> to_device(B&& batch) const {
    return dettrial::to_device(std::forward<B>(batch), setup_.device, setup_.device.is_cuda());
  }

  // ---- counters -------------------------------------------------------------------------------

  /// The batch index training started (or resumed) from.
  std::int64_t get_initial_batch() const { return position_.initial_batch; }
  /// The global index of the batch being trained.
  std::int64_t current_train_batch() const { return position_.current_batch; }
  /// The epoch of the batch being trained.
  std::int64_t current_train_epoch() const { return position_.current_batch / require_epoch_len(); }
  bool is_epoch_start() const { return position_.current_batch % require_epoch_len() == 0; }
  bool is_epoch_end() const { return position_.current_batch % require_epoch_len() == require_epoch_len() - 1; }
  /// True on batches that step the optimizers (every `aggregation_frequency`-th batch).
  bool is_update_batch() const { return (position_.current_batch + 1) % setup_.step.aggregation_frequency == 0; }

  /// Ask the trainer to checkpoint and stop at the next boundary.
  void set_stop_requested(bool stop) { stop_requested_ = stop; }
  bool get_stop_requested() const { return stop_requested_; }

  // ---- TensorBoard ----------------------------------------------------------------------------

  /// The run's TensorBoard writer, for a trial's own scalars and histograms next to the trainer's
  /// metrics (`add_scalar(tag, value, context.current_train_batch())`). It writes from the start of
  /// `fit` on the chief; before that, and on the other ranks, it writes nothing.
  TensorBoardWriter& get_tensorboard_writer() { return tensorboard_; }
  /// `<output_dir>/tensorboard`, where the run's event files go (empty until `fit` starts).
  std::filesystem::path get_tensorboard_path() const;
  /// Whether the trainer writes its metrics, learning rates and timings to TensorBoard (default on).
  /// Off, the writer still takes the trial's own scalars.
  void set_enable_tensorboard_logging(bool on) { tensorboard_logging_ = on; }

  /**
   * @brief Profiles training with LibTorch's profiler on a schedule (Determined's `set_profiler`,
   * with `torch.profiler.profile`'s arguments), from the trial's constructor. The trainer steps it
   * after every training batch and writes each cycle's trace to the run's TensorBoard folder, where
   * TensorBoard's profile plugin reads it. It takes the place of the config's `profiling` section.
   * A schedule `torch.profiler.schedule` would refuse is a ConfigError.
   *
   * @code
   * context.set_profiler({.activities = {dettrial::ProfilerActivity::cpu, dettrial::ProfilerActivity::cuda},
   *                       .schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 2}});
   * @endcode
   */
  void set_profiler(ProfilerOptions options) {
    detail::check_profiler_options(options);
    profiler_ = std::move(options);
  }
  /// What set_profiler was given, if it was called.
  const std::optional<ProfilerOptions>& profiler_options() const { return profiler_; }
  bool get_enable_tensorboard_logging() const { return tensorboard_logging_; }

  // ---- wrapping -------------------------------------------------------------------------------

  /// Moves the model to the device and registers it (train/eval mode, checkpoints). Returns it.
  template <class M>
  M wrap_model(M model) {
    static_assert(ModelHandle<M>,
                  "dettrial::Context::wrap_model<M>: M must be a LibTorch module holder (torch::nn::Linear, "
                  "torch::nn::Sequential, ...) or a std::shared_ptr to a torch::nn::Module");
    if constexpr (ModelHandle<M>) {  // only the sentence above when it is not
      auto module = module_of(model);
      module->to(setup_.device);
      registrations_.add_model(std::move(module));
    }
    return model;
  }

  /**
   * @brief Registers an optimizer so `step_optimizer` can aggregate, clip and step it. The optimizer
   * must outlive the trainer (a member of the trial). `average_aggregated_gradients` defaults to
   * the experiment config's.
   */
  template <class O>
  O& wrap_optimizer(O& optimizer, std::optional<bool> average_aggregated_gradients = std::nullopt) {
    static_assert(TorchOptimizer<O>, "dettrial::Context::wrap_optimizer<O>: O must derive from torch::optim::Optimizer");
    if constexpr (TorchOptimizer<O>)  // only the sentence above when it is not
      registrations_.add_optimizer(optimizer, average_aggregated_gradients.value_or(setup_.step.average_aggregated_gradients));
    return optimizer;
  }

  /**
   * @brief Registers an LR scheduler to be stepped by dettrial in `Mode` (see dettrial::lr_step),
   * every `frequency` units. The scheduler must outlive the trainer. Returns it.
   */
  template <class S, class Mode = lr_step::every_batch>
  S& wrap_lr_scheduler(S& scheduler, Mode mode = {}, std::int64_t frequency = 1) {
    registrations_.add_lr_scheduler(scheduler, mode, frequency);
    return scheduler;
  }

  /// Steps the lr_step::on_validation schedulers with this validation's metrics (the trainer calls it).
  void step_lr_schedulers_on_validation(const MetricValues& metrics) { registrations_.step_lr_schedulers_on_validation(metrics); }

  /**
   * @brief Registers a user reducer (Determined's `wrap_reducer`): reset before each training workload
   * and validation, reduced at its end, and reported under `name` (or, for MetricValues, their own
   * names). `reducer` is one of:
   * - a CrossSlotReducer (`per_slot_reduce()` on every rank, `cross_slot_reduce(parts)` over all
   *   ranks' parts): owned by the caller, returned as given;
   * - a function of `const std::vector<T>&` (T = double unless given): dettrial keeps a
   *   FunctionReducer<T> and returns it; the trial calls its `update(value)`, and the function gets
   *   every rank's values in batch order;
   * - a LocalReducer (`reduce()` only): one process only, since it cannot see the other ranks' data.
   */
  template <class T = double, class R>
  decltype(auto) wrap_reducer(R&& reducer, std::string name = {}, bool for_training = true, bool for_validation = true) {
    return registrations_.add_reducer<T>(std::forward<R>(reducer), std::move(name), for_training, for_validation,
                                         setup_.communicator != nullptr);
  }

  /**
   * @brief Registers a weight average of `model`, which the trainer then updates after every
   * `schedule.every_n_steps`-th optimizer step (when the update batch ends, after all of its optimizer
   * steps), puts in checkpoints (state_dict.pth's `model_ema`, torchvision's name and layout) and
   * restores on resume, and whose buffers every rank takes from rank 0 where the models' are
   * (validation, checkpoints), so every rank holds the same average. One per trial. Validating on it
   * is the trial's choice: call `averaged.module()` in evaluate_batch.
   */
  template <class M>
  optim::AveragedModel<M>& wrap_averaged_model(optim::AveragedModel<M>& averaged, const M& model, AveragingSchedule schedule = {}) {
    registrations_.add_average(averaged.weights(), model.ptr(), schedule);
    return averaged;
  }
  /// The wrapped average (its state dict is Python's AveragedModel's), or null.
  std::shared_ptr<optim::AveragedWeights> averaged_weights() const {
    const auto* average = registrations_.average();
    return average ? average->weights : nullptr;
  }

  /// Every wrapped model, in wrap order.
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return registrations_.models(); }
  std::size_t num_optimizers() const { return registrations_.optimizers().size(); }
  /// Wrapped optimizer `i`, in wrap order.
  torch::optim::Optimizer& optimizer(std::size_t i) const { return *registrations_.optimizers()[i].optimizer; }
  std::size_t num_lr_schedulers() const { return registrations_.lr_schedulers().size(); }

  // ---- the training step ----------------------------------------------------------------------

  /// Back-propagates `loss` (Determined's `context.backward`): outside autocast, and multiplied by the
  /// gradient scaler's scale when one is in use.
  void backward(const torch::Tensor& loss, bool retain_graph = false, bool create_graph = false);
  /// Back-propagates a non-scalar `output` with `gradient` (PyTorch's `backward(gradient)`).
  void backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph = false, bool create_graph = false);

  /**
   * @brief Steps a wrapped optimizer with Determined's semantics: on batches that are not update
   * batches it returns (gradients accumulate); on update batches it divides the gradients by the
   * aggregation frequency (if averaging), clips them, steps, and zeroes them.
   */
  template <class Clip = clip::none>
  void step_optimizer(torch::optim::Optimizer& optimizer, Clip clip_gradients = {}, bool auto_zero_grads = true) {
    static_assert(GradientClipper<Clip>,
                  "dettrial::Context::step_optimizer: the clip argument must be callable with std::vector<torch::Tensor>& "
                  "(dettrial::clip::by_norm{...}, clip::by_value{...})");
    detail::WrappedOptimizer* w = gradients_for_step(optimizer, auto_zero_grads);
    if (!w) return;                                                  // not an update batch
    if constexpr (GradientClipper<Clip>) clip_gradients(w->params);  // else only the sentence above
    finish_step(*w, auto_zero_grads);
  }

  /// Whether gradients are summed in the data stream's order (reproducibility.rank_invariant).
  bool rank_invariant() const;

  // ---- mixed precision ------------------------------------------------------------------------

  /**
   * @brief Registers a gradient scaler (Determined's `wrap_scaler`): from then on `backward` scales
   * the loss, `step_optimizer` unscales the gradients before clipping and skips a step with an inf
   * or NaN gradient, and the trainer updates the scale after each update batch; checkpoints keep its
   * state. At most one; with `mixed_precision: fp16` the context has one of its own unless a trial wraps one.
   */
  GradScaler& wrap_scaler(GradScaler& scaler);
  /// The scaler in use, or nullptr.
  GradScaler* scaler() const;
  /// The precision forward passes run in (the trainer enters autocast around the trial's hooks).
  Precision precision() const;
  /// Autocast's dtype for this precision on this context's device; none for fp32.
  std::optional<at::ScalarType> autocast_dtype() const;

 private:
  // ---- driven by the trainer alone, through detail::ContextAccess ------------------------------
  friend struct detail::ContextAccess;

  /// Forgets every wrapped object (called when their trainer goes away).
  void release_registrations();
  // step_optimizer's first half, compiled once (in separate compilation) for every clip type and
  // trial: the gradients of an update batch made whole and unscaled; null on a batch that only
  // accumulates.
  detail::WrappedOptimizer* gradients_for_step(torch::optim::Optimizer& optimizer, bool auto_zero_grads);
  // Its second half: the step (or its skip), then zero_grad when asked.
  void finish_step(detail::WrappedOptimizer& w, bool auto_zero_grads);

  std::int64_t require_epoch_len() const;

  Hyperparameters hparams_;
  ExperimentConfig config_;
  detail::ContextSetup setup_;
  detail::Registrations registrations_;
  // Held through a pointer so that a trial's unit does not read the step's modes (their classes,
  // and std::visit over them, are compiled once with the rest of the Context).
  std::unique_ptr<detail::TrainingStep> step_;
  detail::RunPosition position_{};
  TensorBoardWriter tensorboard_{};
  bool tensorboard_logging_ = true;
  std::optional<ProfilerOptions> profiler_;
  bool stop_requested_ = false;
};

// Not inline, so that the explicit instantiations below keep a trial's translation unit from compiling it.
template <class T>
T Context::get_data(std::string_view path) const {
  const YAML::Node node = config_.data_node(path);
  T value{};
  if (!detail::try_read(node, value))
    throw ConfigError(detail::where(node, config_.source) + ": data." + std::string(path) + " is " + detail::describe(node) +
                      ", which is not a " + detail::type_name<T>());
  return value;
}

#if defined(DETTRIAL_SEPARATE_COMPILATION)
#if DETTRIAL_HEADER_DEFINITIONS
#define DETTRIAL_DATA_TYPE(T) template T Context::get_data<T>(std::string_view) const;
#else
#define DETTRIAL_DATA_TYPE(T) extern template T Context::get_data<T>(std::string_view) const;
#endif
DETTRIAL_DATA_TYPE(double)
DETTRIAL_DATA_TYPE(float)
DETTRIAL_DATA_TYPE(int)
DETTRIAL_DATA_TYPE(std::int64_t)
DETTRIAL_DATA_TYPE(bool)
DETTRIAL_DATA_TYPE(std::string)
#undef DETTRIAL_DATA_TYPE
#endif

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../error.hpp"
#include "../layout.hpp"
#include "../step/detail/training_step.hpp"

namespace dettrial {
DETTRIAL_INLINE Context::Context(const ExperimentConfig& config, ContextOptions options)
    : Context(config.trial_hyperparameters(), config, std::move(options)) {}

DETTRIAL_INLINE Context::Context(Hyperparameters hparams, ContextOptions options)
    : Context(std::move(hparams), ExperimentConfig{}, std::move(options)) {}

DETTRIAL_INLINE Context::Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options)
    : hparams_(std::move(hparams)),
      config_(std::move(config)),
      setup_(detail::setup_context(config_, std::move(options))),
      step_(std::make_unique<detail::TrainingStep>(setup_.step, detail::PrecisionStep(setup_.precision, setup_.device))) {}

DETTRIAL_INLINE Context::~Context() = default;

DETTRIAL_INLINE void Context::backward(const torch::Tensor& loss, bool retain_graph, bool create_graph) {
  backward(loss, torch::Tensor(), retain_graph, create_graph);
}

DETTRIAL_INLINE void Context::backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph, bool create_graph) {
  if (gradient.defined() && gradient.sizes() != output.sizes())
    throw TrialError("context.backward: the gradient's shape " + c10::str(gradient.sizes()) + " differs from the output's " +
                     c10::str(output.sizes()));
  step_->backward(registrations_.optimizers(), is_update_batch(), output, gradient, setup_.device, retain_graph, create_graph);
}

DETTRIAL_INLINE void Context::release_registrations() {
  registrations_.clear();
  step_->release();
  stop_requested_ = false;
  position_ = {};
}

DETTRIAL_INLINE std::filesystem::path Context::get_tensorboard_path() const {
  return position_.output_dir.empty() ? std::filesystem::path() : RunFolder{position_.output_dir}.tensorboard();
}

DETTRIAL_INLINE std::int64_t Context::require_epoch_len() const {
  if (position_.epoch_len <= 0) throw TrialError("epoch counters are only known once training has started");
  return position_.epoch_len;
}

DETTRIAL_INLINE detail::WrappedOptimizer* Context::gradients_for_step(torch::optim::Optimizer& optimizer, bool auto_zero_grads) {
  if (setup_.step.aggregation_frequency > 1 && !auto_zero_grads)
    throw TrialError("step_optimizer(auto_zero_grads=false) cannot be used with aggregation_frequency > 1");
  if (!is_update_batch()) return nullptr;
  detail::WrappedOptimizer& w = registrations_.find(optimizer);
  step_->reduce(w, registrations_.optimizers(), position_.current_batch);
  return &w;
}

DETTRIAL_INLINE void Context::finish_step(detail::WrappedOptimizer& w, bool auto_zero_grads) { step_->step(w, auto_zero_grads); }

DETTRIAL_INLINE bool Context::rank_invariant() const { return step_->rank_invariant(); }

DETTRIAL_INLINE GradScaler& Context::wrap_scaler(GradScaler& scaler) { return step_->precision().wrap_scaler(scaler); }

DETTRIAL_INLINE GradScaler* Context::scaler() const { return step_->precision().scaler(); }

DETTRIAL_INLINE Precision Context::precision() const { return step_->precision().precision(); }

DETTRIAL_INLINE std::optional<at::ScalarType> Context::autocast_dtype() const { return step_->precision().autocast_dtype(); }

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
