// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The trial context: hyperparameters, batch sizes, seed, device, counters, and the wrapping of
/// models, optimizers, schedulers and reducers that the trainer drives.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>
#include <typeinfo>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include "../layout.hpp"
#include "../config/experiment_config.hpp"
#include "../config/hyperparameters.hpp"
#include "../config/profiler_options.hpp"
#include "../error.hpp"
#include "../detail/random.hpp"
#include "../detail/yaml.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/gradient_buckets.hpp"
#include "../distributed/optimizer_shards.hpp"
#include "../distributed/ordered_gradients.hpp"
#include "../process/process_settings.hpp"
#include "../process/threads.hpp"
#include "../metrics/reducers.hpp"
#include "../optim/averaged_model.hpp"
#include "../optim/clip.hpp"
#include "../optim/handles.hpp"
#include "../optim/lr_state.hpp"
#include "../optim/lr_step.hpp"
#include "../optim/mixed_precision.hpp"
#include "../tensorboard/event_file.hpp"
#include "../config/precision.hpp"
#include "../data/to_device.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// Where a process sits in a data-parallel job. One process: rank 0 of 1.
struct DistributedInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  bool is_chief() const { return rank == 0; }

  // Determined's `context.distributed` getters. Nodes are numbered as launchers place ranks: a
  // node's ranks are consecutive, `local_size` of them (torchrun, srun, mpirun by slot).
  int get_rank() const { return rank; }
  int get_size() const { return size; }
  int get_local_rank() const { return local_rank; }
  int get_local_size() const { return local_size; }
  /// This process's node: `rank / local_size`.
  int get_cross_rank() const { return rank / (local_size > 0 ? local_size : 1); }
  /// The number of nodes: `size / local_size`, rounded up.
  int get_cross_size() const {
    const int per_node = local_size > 0 ? local_size : 1;
    return (size + per_node - 1) / per_node;
  }
};

/// Options that set up a Context (usually taken from the experiment config).
struct ContextOptions {
  /// The seed of every RNG; unset means: derived from `reproducibility.experiment_seed`, else from the clock.
  std::optional<std::uint64_t> trial_seed{};
  /// The device; unset means CUDA device 0 when LibTorch has CUDA and a GPU is present, else the CPU.
  std::optional<torch::Device> device{};
  /// Unset: the experiment config's (`optimizations.aggregation_frequency`), else 1.
  std::optional<std::int64_t> aggregation_frequency{};
  /// Unset: the experiment config's (`optimizations.average_aggregated_gradients`), else true.
  std::optional<bool> average_aggregated_gradients{};
  /// Unset: the experiment config's (`resources.slots_per_trial`), else 1. With a communicator, the
  /// world size (a config asking for another number of slots is an error).
  std::optional<std::int64_t> slots_per_trial{};
  /// The process group of a data-parallel job (see Communicator::create); none for one process.
  std::shared_ptr<Communicator> communicator;
  /// Deterministic algorithms (see ExperimentConfig::deterministic); unset: the config's.
  std::optional<bool> deterministic{};
  /// Results that do not depend on the rank count (see ExperimentConfig::rank_invariant); unset: the config's.
  std::optional<bool> rank_invariant{};
  /// Threads for this process's intra-op and BLAS pools (`--threads`). Unset: OMP_NUM_THREADS when
  /// set, else in a data-parallel job this rank's share of the node's cores, else the CPUs this
  /// process may run on (see dettrial::choose_threads and dettrial::apply_threads).
  std::optional<int> threads;
  /// Autocast around forward passes (and for fp16 a gradient scaler); unset: the config's
  /// `optimizations.mixed_precision`.
  std::optional<Precision> mixed_precision{};
  /// The trial's id in its experiment (Determined's `get_trial_id`). Unset: `DET_TRIAL_ID` from the
  /// environment, which dettrial's search runner sets for each trial (as Determined's agents do),
  /// else 0: a trial run on its own belongs to no experiment.
  std::optional<std::int64_t> trial_id{};
  /// The experiment's id (Determined's `get_experiment_id`). Unset: `DET_EXPERIMENT_ID`, else 0.
  std::optional<std::int64_t> experiment_id{};
};

}  // namespace dettrial

namespace dettrial::detail {
/// A non-negative integer id from environment variable `name`; 0 when unset; ConfigError when not a number.
DETTRIAL_INLINE std::int64_t id_from_environment(const char* name);

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

namespace dettrial {
template <class TrialT>
class Trainer;
}  // namespace dettrial

namespace dettrial::detail {
/**
 * @brief The pass every call of ContextAccess takes: only a dettrial::Trainer can make one (the
 * constructor is private to it), and it hands copies to the pieces that drive its run (the fit loop,
 * the schedule, the validation steps, the checkpoints). A trial, or any other code, holds none, so
 * nothing but the trainer moves a run's position, steps its schedulers or ends its batches.
 */
class TrainerKey {
  TrainerKey() = default;
  template <class TrialT>
  friend class dettrial::Trainer;
};
struct ContextAccess;
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
  bool has_data(std::string_view path) const;
  /// The running fit's output folder (metrics.jsonl, checkpoints/; in a search, the trial's own
  /// `trials/<id>/`): where a trial's or callback's own files belong. Empty until `fit` starts (the
  /// trial's constructor runs before), so read it in hooks and batches.
  const std::filesystem::path& output_dir() const { return position_.output_dir; }
  const ExperimentConfig& get_experiment_config() const { return config_; }

  /// `global_batch_size / slots_per_trial`; needs the `global_batch_size` hyperparameter.
  std::int64_t get_per_slot_batch_size() const;
  /// The effective global batch size, `per_slot * slots`.
  std::int64_t get_global_batch_size() const { return get_per_slot_batch_size() * slots_per_trial_; }
  /// The job's ranks: the communicator's size, else `resources.slots_per_trial` (which a fit then
  /// refuses above 1: one process would train alone on a slot's share of each global batch).
  std::int64_t slots_per_trial() const { return slots_per_trial_; }
  /// True when the `global_batch_size` hyperparameter exists.
  bool has_global_batch_size() const { return hparams_.global_batch_size().has_value(); }

  // ---- seed, device, distribution -------------------------------------------------------------

  /// The seed every RNG was seeded with: the same seed gives the same run.
  std::uint64_t get_trial_seed() const { return trial_seed_; }
  /// The trial's id in its experiment: 1, 2, ... in a search run by dettrial; 0 for a trial run on its
  /// own (see ContextOptions::trial_id).
  std::int64_t get_trial_id() const { return trial_id_; }
  /// The experiment's id: a search's own number, kept when it is continued; 0 for a trial run on its own.
  std::int64_t get_experiment_id() const { return experiment_id_; }
  const torch::Device& device() const { return device_; }
  const DistributedInfo& distributed() const { return distributed_; }
  /// The job's process group, or null for one process.
  Communicator* communicator() const { return communicator_.get(); }
  /// The thread count this process is to compute with and why (see ContextOptions::threads).
  const ThreadChoice& threads() const { return threads_; }
  /**
   * @brief What the process this context trains in should set for itself: the thread count, the
   * config's determinism, glibc's retention of freed memory, and the trial's seed (the chief's, in a
   * job). The context applies none of it: `dettrial::main` does, and a main of one's own calls
   * `context.process_settings().apply()` once, before building the trial.
   */
  ProcessSettings process_settings() const {
    return {.threads = threads_, .deterministic = deterministic_, .keep_freed_memory = true, .seed = trial_seed_};
  }
  std::int64_t aggregation_frequency() const { return aggregation_frequency_; }

  /// Moves a nested batch to this context's device (see dettrial::to_device).
  template <class B>
  std::remove_cvref_t<B> to_device(B&& batch) const {
    return dettrial::to_device(std::forward<B>(batch), device_, device_.is_cuda());
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
  bool is_update_batch() const { return (position_.current_batch + 1) % aggregation_frequency_ == 0; }

  /// Ask the trainer to checkpoint and stop at the next boundary.
  void set_stop_requested(bool stop) { stop_requested_ = stop; }
  bool get_stop_requested() const { return stop_requested_; }

  // ---- TensorBoard ----------------------------------------------------------------------------

  /// The run's TensorBoard writer, for a trial's own scalars and histograms next to the trainer's
  /// metrics (`add_scalar(tag, value, context.current_train_batch())`). It writes from the start of
  /// `fit` on the chief; before that, and on the other ranks, it writes nothing.
  TensorBoardWriter& get_tensorboard_writer() { return tensorboard_; }
  /// `<output_dir>/tensorboard`, where the run's event files go (empty until `fit` starts).
  std::filesystem::path get_tensorboard_path() const {
    return position_.output_dir.empty() ? std::filesystem::path() : RunFolder{position_.output_dir}.tensorboard();
  }
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
      module->to(device_);
      models_.push_back(std::move(module));
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
    if constexpr (TorchOptimizer<O>) {  // only the sentence above when it is not
      add_optimizer(optimizer, average_aggregated_gradients);
    }
    return optimizer;
  }

  /**
   * @brief Registers an LR scheduler to be stepped by dettrial in `Mode` (see dettrial::lr_step),
   * every `frequency` units. The scheduler must outlive the trainer. Returns it.
   */
  template <class S, class Mode = lr_step::every_batch>
  S& wrap_lr_scheduler(S& scheduler, Mode mode = {}, std::int64_t frequency = 1) {
    constexpr bool by_metric = std::same_as<Mode, lr_step::on_validation>;
    constexpr bool steppable = by_metric ? MetricLRSchedulerLike<S> : LRSchedulerLike<S>;
    static_assert(by_metric || LRSchedulerLike<S>,
                  "dettrial::Context::wrap_lr_scheduler<S>: S must have step() (a torch::optim scheduler)");
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
      detail::WrappedScheduler w{&scheduler,
                                 nullptr,
                                 &Mode::steps_after,
                                 frequency,
                                 &detail::save_lr_scheduler<S>,
                                 &detail::load_lr_scheduler<S>,
                                 &detail::lr_scheduler_steps<S>,
                                 detail::python_state_writer<S>(),
                                 detail::python_state_reader<S>()};
      w.type = c10::demangle(typeid(S).name());
      detail::wrap_python_param_groups<S>(w);
      if constexpr (by_metric) {
        if (mode.metric.empty())
          throw ConfigError(
              "lr_step::on_validation needs the validation metric to step with, e.g. lr_step::on_validation{\"validation_loss\"}");
        w.step_with_metric = [](void* s, double metric) { static_cast<S*>(s)->step(metric); };
        w.metric = mode.metric;
      } else {
        w.step = [](void* s) { static_cast<S*>(s)->step(); };
      }
      add_lr_scheduler(std::move(w));
    }
    return scheduler;
  }

  /// Steps the lr_step::on_validation schedulers with this validation's metrics (the trainer calls it).
  void step_lr_schedulers_on_validation(const MetricValues& metrics);

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
    using Plain = std::remove_cvref_t<R>;
    if constexpr (MetricReducer<Plain>) {
      static_assert(std::is_lvalue_reference_v<R>,
                    "dettrial::Context::wrap_reducer: a reducer object must outlive the trainer, so pass a member of the trial "
                    "(an lvalue), not a temporary");
      Plain& r = reducer;
      for (const auto& w : reducers_)
        if (w.object == &r) throw TrialError("this reducer was already wrapped with wrap_reducer");
      if constexpr (!CrossSlotReducer<Plain>)
        if (communicator_)
          throw TrialError("wrap_reducer" + (name.empty() ? std::string() : " '" + name + "'") +
                           ": this reducer has only reduce(), which sees one rank's data; in a data-parallel job give it "
                           "per_slot_reduce() and cross_slot_reduce(parts) (see dettrial::CrossSlotReducer), or wrap a "
                           "function with wrap_reducer(fn, name)");
      check_reducer_name<reduced_metrics_t<Plain>>(name);
      reducers_.push_back(detail::WrappedReducer::wrap(r, std::move(name), for_training, for_validation));
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
        static_assert(ReducedMetrics<Result>,
                      "dettrial::Context::wrap_reducer(fn, name): fn must return a number or dettrial::MetricValues");
        if constexpr (ReducedMetrics<Result>) {
          using Function = FunctionReducer<T, std::decay_t<R>>;  // a function reference becomes a pointer
          check_reducer_name<Result>(name);
          auto owned = std::make_shared<Function>(std::forward<R>(reducer));
          Function& r = *owned;
          owned_reducers_.push_back(std::move(owned));
          reducers_.push_back(detail::WrappedReducer::wrap(r, std::move(name), for_training, for_validation));
          return r;
        }
      }
    }
  }

  // ---- the training step ----------------------------------------------------------------------

  /// Back-propagates `loss` (Determined's `context.backward`): outside autocast, and multiplied by the
  /// gradient scaler's scale when one is in use.
  void backward(const torch::Tensor& loss, bool retain_graph = false, bool create_graph = false);
  /// Back-propagates a non-scalar `output` with `gradient` (PyTorch's `backward(gradient)`).
  void backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph = false, bool create_graph = false);

  // ---- mixed precision ------------------------------------------------------------------------

  /**
   * @brief Registers a gradient scaler (Determined's `wrap_scaler`): from then on `backward` scales
   * the loss, `step_optimizer` unscales the gradients before clipping and skips a step with an inf
   * or NaN gradient, and the trainer updates the scale after each update batch; checkpoints keep its
   * state. At most one; with `mixed_precision: fp16` the context has one of its own unless a trial wraps one.
   */
  GradScaler& wrap_scaler(GradScaler& scaler);
  /// The scaler in use, or nullptr.
  GradScaler* scaler() const { return scaler_; }
  /// The precision forward passes run in (the trainer enters autocast around the trial's hooks).
  Precision precision() const { return precision_; }
  /// Autocast's dtype for this precision on this context's device; none for fp32.
  std::optional<at::ScalarType> autocast_dtype() const;

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
    WrappedOptimizer* w = gradients_for_step(optimizer, auto_zero_grads);
    if (!w) return;                                                  // not an update batch
    if constexpr (GradientClipper<Clip>) clip_gradients(w->params);  // else only the sentence above
    step_wrapped(*w, optimizer, auto_zero_grads);
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
    register_average(averaged.weights(), model.ptr(), schedule);
    return averaged;
  }
  /// The wrapped average (its state dict is Python's AveragedModel's), or null.
  std::shared_ptr<optim::AveragedWeights> averaged_weights() const { return average_ ? average_->weights : nullptr; }

  /// Every wrapped model, in wrap order.
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return models_; }
  std::size_t num_optimizers() const { return optimizers_.size(); }
  /// Wrapped optimizer `i`, in wrap order.
  torch::optim::Optimizer& optimizer(std::size_t i) const { return *optimizers_.at(i).optimizer; }
  std::size_t num_lr_schedulers() const { return schedulers_.size(); }
  /// Whether gradients are summed in the data stream's order (reproducibility.rank_invariant).
  bool rank_invariant() const { return ordered_ != nullptr; }

 private:
  // ---- driven by the trainer alone, through detail::ContextAccess ------------------------------
  friend struct detail::ContextAccess;

  /// True while a trainer's trial is registered here.
  bool has_registrations() const { return !models_.empty() || !optimizers_.empty() || !schedulers_.empty() || !reducers_.empty(); }
  /// Forgets every wrapped object (called when their trainer goes away).
  void release_registrations();

  /// Ends the training batch (the trainer calls it after train_batch, before it steps what the
  /// loop owns after an update: the LR schedulers and the average, trainer/after_update.hpp): on an
  /// update batch (every `aggregation_frequency`-th, the one that stepped the optimizers) the
  /// gradient scaler's scale is updated, once however many optimizers stepped; on the others, with
  /// rank_invariant, the micro-batch's gradients are stashed.
  void finish_batch() {
    if (!is_update_batch()) {  // inline: most batches end here
      if (ordered_) stash_ordered_gradients();
      return;
    }
    if (scaler_) scaler_->update();
  }

  /// Begins training batch `position().current_batch` of `records` records. With rank_invariant,
  /// seeds the random draws of this micro-batch from its place in the data stream (the same
  /// records get the same dropout masks whatever the rank count); otherwise nothing.
  void begin_training_batch(std::int64_t records) {
    if (ordered_) seed_micro_batch(records);
  }

  /// In a job, after the trial and its data loaders were built from the same seed on every rank:
  /// ranks other than the chief continue on a stream of their own, derived from the trial seed and
  /// the rank, so that their dropout masks and other draws differ.
  void seed_rank_stream() const;

  void register_average(std::shared_ptr<optim::AveragedWeights> weights, std::shared_ptr<torch::nn::Module> source,
                        AveragingSchedule schedule);
  struct WrappedOptimizer {
    torch::optim::Optimizer* optimizer;
    std::vector<torch::Tensor> params;
    bool average;
    /// Data parallel only: made on the first step, dropped when the parameters change.
    std::unique_ptr<detail::GradientBuckets> buckets;
    /// ZeRO stage 1 only (made when the fit starts, over `buckets`): this rank's pieces of the parameters.
    std::unique_ptr<detail::OptimizerShards> shards{};
  };
  /// ZeRO: optimizer `i`'s shards, made (with padded buckets) when it has none.
  detail::OptimizerShards& shard_optimizer(std::size_t i);
  // step_optimizer's halves around the clip, compiled once (in separate compilation) for every clip
  // type and trial. The first: the gradients of an update batch all-reduced (or combined in order),
  // averaged over aggregated batches and unscaled; null on a batch that only accumulates.
  WrappedOptimizer* gradients_for_step(torch::optim::Optimizer& optimizer, bool auto_zero_grads);
  // The second: the step (this rank's shard, or the scaler's, or the optimizer's), then zero_grad.
  void step_wrapped(WrappedOptimizer& w, torch::optim::Optimizer& optimizer, bool auto_zero_grads);
  /// ZeRO's step: the optimizer steps this rank's pieces (the scaler's skip decided on the whole
  /// gradients, the same on every rank), then every rank gets every rank's parameters.
  void step_shards(WrappedOptimizer& w);

  template <class Result>
  static void check_reducer_name(const std::string& name) {
    constexpr bool returns_many = std::same_as<std::remove_cvref_t<Result>, MetricValues>;
    if (returns_many && !name.empty())
      throw TrialError("wrap_reducer: reducer '" + name + "' returns MetricValues (merged by their own names), so wrap it without a name");
    if (!returns_many && name.empty()) throw TrialError("wrap_reducer: a reducer that returns a number needs a name to report it under");
  }

  static std::uint64_t derive_trial_seed(std::optional<std::uint64_t> experiment_seed);

  std::int64_t global_batch_size_hparam() const;

  std::int64_t require_epoch_len() const;

  /// Rebuilds the cached parameter list when the optimizer's groups changed size (no allocation otherwise).
  void refresh_params(WrappedOptimizer& w);
  // What wrap_optimizer and wrap_lr_scheduler do that does not depend on the type: compiled once.
  void add_optimizer(torch::optim::Optimizer& optimizer, std::optional<bool> average_aggregated_gradients);
  void add_lr_scheduler(detail::WrappedScheduler scheduler);
  /// The `data` section's node at `path`; throws ConfigError naming it when it is missing.
  YAML::Node data_node(std::string_view path) const;

  // rank_invariant: see detail::OrderedGradients.
  void seed_micro_batch(std::int64_t records);
  /// Every wrapped optimizer's parameters, each once, in wrap order.
  const std::vector<torch::Tensor>& ordered_params();
  void stash_ordered_gradients();
  /// Once per update batch, however many optimizers step: this batch's gradients stashed, and
  /// every optimizer's gradients replaced by the ordered sum of the update's micro-batches.
  void combine_ordered_gradients();

  WrappedOptimizer& find_optimizer(const torch::optim::Optimizer& optimizer);

  Hyperparameters hparams_;
  ExperimentConfig config_;
  std::int64_t aggregation_frequency_ = 1;
  bool average_aggregated_gradients_ = true;
  std::int64_t slots_per_trial_ = 1;
  std::uint64_t trial_seed_ = 0;
  std::int64_t trial_id_ = 0;
  std::int64_t experiment_id_ = 0;
  torch::Device device_{torch::kCPU};
  DistributedInfo distributed_;
  std::shared_ptr<Communicator> communicator_;
  ThreadChoice threads_;
  std::optional<bool> deterministic_;

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<WrappedOptimizer> optimizers_;
  std::vector<detail::WrappedScheduler> schedulers_;
  std::optional<optim::detail::ScheduledAverage> average_;
  std::vector<detail::WrappedReducer> reducers_;
  std::vector<std::shared_ptr<void>> owned_reducers_;  // the FunctionReducers wrap_reducer(fn) made

  detail::RunPosition position_{};
  TensorBoardWriter tensorboard_{};
  bool tensorboard_logging_ = true;
  std::optional<ProfilerOptions> profiler_;
  bool stop_requested_ = false;
  Precision precision_ = Precision::fp32;
  std::unique_ptr<GradScaler> own_scaler_;             // fp16 without a scaler of the trial's
  std::unique_ptr<detail::OrderedGradients> ordered_;  // reproducibility.rank_invariant
  std::vector<torch::Tensor> ordered_params_;
  std::size_t ordered_params_counted_ = 0;  // the optimizers' parameters ordered_params_ was built from
  std::int64_t ordered_records_ = 0;
  std::int64_t ordered_combined_at_ = -1;  // the update batch whose gradients were combined
  GradScaler* scaler_ = nullptr;
};

// Not inline, so that the explicit instantiations below keep a trial's translation unit from compiling it.
template <class T>
T Context::get_data(std::string_view path) const {
  const YAML::Node node = data_node(path);
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

namespace dettrial::detail {
/**
 * @brief The one way into what only dettrial's trainer and checkpoints do with a Context: the run's
 * position, the reducers and schedulers as they drive them, a training batch's beginning and end,
 * and the registrations' lifetime. Context keeps these private, so a trial's view of its context
 * (its public members) holds only what Determined's context offers a trial; and each call takes a
 * TrainerKey, which only a Trainer makes.
 */
struct ContextAccess {
  static RunPosition& position(TrainerKey, Context& c) { return c.position_; }
  static std::span<WrappedReducer> reducers(TrainerKey, Context& c) { return c.reducers_; }
  /// Wrapped LR scheduler `i` (type-erased: how to step, save and restore it), in wrap order.
  static const WrappedScheduler& lr_scheduler(TrainerKey, const Context& c, std::size_t i) { return c.schedulers_.at(i); }
  static void begin_training_batch(TrainerKey, Context& c, std::int64_t records) { c.begin_training_batch(records); }
  static void finish_batch(TrainerKey, Context& c) { c.finish_batch(); }
  /// The wrapped LR schedulers, for the loop to step after an update batch.
  static std::span<WrappedScheduler> lr_schedulers(TrainerKey, Context& c) { return c.schedulers_; }
  /// The wrapped average, or null.
  static optim::detail::ScheduledAverage* average(TrainerKey, Context& c) { return c.average_ ? &*c.average_ : nullptr; }
  static void seed_rank_stream(TrainerKey, const Context& c) { c.seed_rank_stream(); }
  static bool has_registrations(TrainerKey, const Context& c) { return c.has_registrations(); }
  static void release_registrations(TrainerKey, Context& c) { c.release_registrations(); }
  /// ZeRO: optimizer `i`'s shards, made when it has none; or the shards it has (null without).
  static OptimizerShards& shard_optimizer(TrainerKey, Context& c, std::size_t i) { return c.shard_optimizer(i); }
  static OptimizerShards* optimizer_shards(TrainerKey, Context& c, std::size_t i) { return c.optimizers_.at(i).shards.get(); }
};
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cerrno>
#include <cstdlib>

namespace dettrial::detail {
DETTRIAL_INLINE std::int64_t id_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  char* end = nullptr;
  errno = 0;
  const long long id = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || id < 0)
    throw ConfigError(std::string(name) + " is '" + text + "'; it must be a trial or experiment id (a non-negative integer)");
  return id;
}
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE Context::Context(const ExperimentConfig& config, ContextOptions options)
    : Context(config.trial_hyperparameters(), config, std::move(options)) {}

DETTRIAL_INLINE Context::Context(Hyperparameters hparams, ContextOptions options)
    : Context(std::move(hparams), ExperimentConfig{}, std::move(options)) {}

DETTRIAL_INLINE Context::~Context() = default;

DETTRIAL_INLINE void Context::add_optimizer(torch::optim::Optimizer& optimizer, std::optional<bool> average_aggregated_gradients) {
  for (const auto& w : optimizers_)
    if (w.optimizer == &optimizer) throw TrialError("this optimizer was already wrapped with wrap_optimizer");
  WrappedOptimizer w{&optimizer, {}, average_aggregated_gradients.value_or(average_aggregated_gradients_), nullptr};
  refresh_params(w);
  optimizers_.push_back(std::move(w));
}

DETTRIAL_INLINE void Context::add_lr_scheduler(detail::WrappedScheduler scheduler) { schedulers_.push_back(std::move(scheduler)); }

DETTRIAL_INLINE bool Context::has_data(std::string_view path) const {
  return config_.data.IsMap() && Hyperparameters(config_.data, config_.source).contains(path);
}

DETTRIAL_INLINE YAML::Node Context::data_node(std::string_view path) const {
  if (!has_data(path)) {
    std::string known;
    if (config_.data.IsMap())
      for (const auto& kv : config_.data) known += (known.empty() ? "" : ", ") + kv.first.Scalar();
    throw ConfigError("data." + std::string(path) + " is missing from " + config_.source + "'s data section" +
                      (known.empty() ? " (it has none)" : " (it has: " + known + ")"));
  }
  return Hyperparameters(config_.data, config_.source).node(path);
}

DETTRIAL_INLINE Context::Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options)
    : hparams_(std::move(hparams)),
      config_(std::move(config)),
      aggregation_frequency_(options.aggregation_frequency.value_or(config_.aggregation_frequency)),
      average_aggregated_gradients_(options.average_aggregated_gradients.value_or(config_.average_aggregated_gradients)),
      slots_per_trial_(options.slots_per_trial.value_or(config_.slots_per_trial)) {
  if (aggregation_frequency_ < 1) throw ConfigError("aggregation_frequency must be at least 1");
  if (slots_per_trial_ < 1) throw ConfigError("slots_per_trial must be at least 1");
  if (options.communicator && options.communicator->size() > 1) {
    communicator_ = std::move(options.communicator);
    const LaunchEnvironment& env = communicator_->environment();
    if (slots_per_trial_ > 1 && slots_per_trial_ != env.size)
      throw ConfigError("resources.slots_per_trial is " + std::to_string(slots_per_trial_) + ", but " + launcher_name(env.launcher) +
                        " started " + std::to_string(env.size) + " processes");
    slots_per_trial_ = env.size;
    distributed_ = DistributedInfo{.rank = env.rank, .size = env.size, .local_rank = env.local_rank, .local_size = env.local_size};
  }
  // One GPU per process: the local rank picks it.
  device_ = options.device
                ? *options.device
                : (torch::cuda::is_available()
                       ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                         distributed_.local_rank %
                                                         std::max<std::int64_t>(static_cast<std::int64_t>(torch::cuda::device_count()), 1)))
                       : torch::Device(torch::kCPU));
  // NCCL takes tensors on one GPU only: models, gradients and every collective must be there. (Gloo
  // takes CPU tensors, and CUDA ones too.)
  if (communicator_ && !communicator_->device().is_cpu() && communicator_->device() != device_)
    throw ConfigError(std::string("the ") + communicator_->backend_name() + " backend of rank " + std::to_string(distributed_.rank) +
                      " takes tensors on " + communicator_->device().str() + ", but this process's device is " + device_.str() +
                      "; give every rank the device its local rank picks (or leave ContextOptions::device unset)");
  trial_seed_ = options.trial_seed ? *options.trial_seed : derive_trial_seed(config_.experiment_seed);
  trial_id_ = options.trial_id ? *options.trial_id : detail::id_from_environment("DET_TRIAL_ID");
  experiment_id_ = options.experiment_id ? *options.experiment_id : detail::id_from_environment("DET_EXPERIMENT_ID");
  // One trial seed for the job: the chief's (without an experiment seed each rank's clock differs,
  // and the ranks would shard different permutations of the data).
  if (communicator_) trial_seed_ = static_cast<std::uint64_t>(communicator_->broadcast_values({static_cast<std::int64_t>(trial_seed_)})[0]);
  const bool rank_invariant = options.rank_invariant.value_or(config_.rank_invariant);
  threads_ = choose_threads(
      communicator_ ? communicator_->environment() : LaunchEnvironment{}, options.threads, CoreCount::of_this_process(),
      [](const char* name) { return std::getenv(name); }, rank_invariant ? ThreadDefault::one_per_rank : ThreadDefault::share_of_cores);
  deterministic_ = options.deterministic ? options.deterministic : config_.deterministic;
  // On a GPU the ordered sums alone do not give the same bits: cuDNN's and atomic kernels may round
  // differently from run to run (the MNIST example's 1 and 2 ranks ended 3e-8 apart on an H200).
  // Unless the user chose, rank_invariant asks for the deterministic ones there.
  if (rank_invariant && device_.is_cuda() && !deterministic_) deterministic_ = true;
  if (rank_invariant) {
    if (!average_aggregated_gradients_)
      throw ConfigError(
          "reproducibility.rank_invariant needs optimizations.average_aggregated_gradients: a sum over the aggregated batches "
          "grows with the aggregation frequency, so it would differ between rank counts");
    ordered_ = std::make_unique<detail::OrderedGradients>(communicator_.get(), aggregation_frequency_);
  }
  precision_ = options.mixed_precision.value_or(config_.mixed_precision);
#if TORCH_VERSION_MAJOR < 2
  if (precision_ == Precision::fp16 && device_.is_cpu())
    throw ConfigError("mixed_precision fp16 autocasts on the CPU from LibTorch 2 on; this LibTorch " TORCH_VERSION
                      " autocasts the CPU to bf16 only (use bf16)");
#endif
  if (precision_ == Precision::fp16) {  // fp16's narrow range needs loss scaling; bf16's does not
    own_scaler_ = std::make_unique<GradScaler>();
    own_scaler_->mark_wrapped();
    scaler_ = own_scaler_.get();
  }
}

DETTRIAL_INLINE std::int64_t Context::get_per_slot_batch_size() const {
  const std::int64_t global = global_batch_size_hparam();
  return global / slots_per_trial_;
}

DETTRIAL_INLINE void Context::backward(const torch::Tensor& loss, bool retain_graph, bool create_graph) {
  backward(loss, torch::Tensor(), retain_graph, create_graph);
}

DETTRIAL_INLINE void Context::backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph, bool create_graph) {
  if (gradient.defined() && gradient.sizes() != output.sizes())
    throw TrialError("context.backward: the gradient's shape " + c10::str(gradient.sizes()) + " differs from the output's " +
                     c10::str(output.sizes()));
  // In a job, an update batch's backward pass starts each gradient bucket's all-reduce as soon as
  // the bucket's gradients are ready (see all_reduce_gradients).
  for (auto& w : optimizers_)
    if (w.buckets) w.buckets->arm(is_update_batch());
  // Outside autocast (PyTorch's advice: backward ops run in the dtypes forward chose).
  std::optional<AutocastGuard> autocast_off;
  if (precision_ != Precision::fp32) autocast_off.emplace(device_.type(), std::nullopt);
  const bool scaled = scaler_ && scaler_->enabled();
  if (!gradient.defined())  // a loss: scaled in float32, as PyTorch's GradScaler does (fp16 times 65536 overflows)
    (scaled ? scaler_->scaled(output.to(torch::kFloat)) : output).backward({}, retain_graph, create_graph);
  else output.backward(scaled ? scaler_->scaled(gradient) : gradient, retain_graph, create_graph);
}

DETTRIAL_INLINE GradScaler& Context::wrap_scaler(GradScaler& scaler) {
  if (scaler_ && scaler_ != own_scaler_.get()) throw TrialError("wrap_scaler was called twice: a context takes one GradScaler");
  scaler.mark_wrapped();
  scaler_ = &scaler;
  return scaler;
}

DETTRIAL_INLINE std::optional<at::ScalarType> Context::autocast_dtype() const {
  switch (precision_) {
    case Precision::fp32: return std::nullopt;
    case Precision::bf16: return at::kBFloat16;
    case Precision::fp16: return at::kHalf;
  }
  return std::nullopt;
}

DETTRIAL_INLINE void Context::release_registrations() {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  average_.reset();
  reducers_.clear();
  owned_reducers_.clear();
  ordered_params_.clear();
  ordered_params_counted_ = 0;
  ordered_combined_at_ = -1;
  stop_requested_ = false;
  position_ = {};
  scaler_ = own_scaler_.get();
}

DETTRIAL_INLINE void Context::step_lr_schedulers_on_validation(const MetricValues& metrics) {
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

DETTRIAL_INLINE void Context::register_average(std::shared_ptr<optim::AveragedWeights> weights, std::shared_ptr<torch::nn::Module> source,
                                               AveragingSchedule schedule) {
  if (average_) throw ConfigError("wrap_averaged_model: the trial already wrapped an averaged model (one per trial)");
  if (schedule.every_n_steps < 1)
    throw ConfigError("wrap_averaged_model: every_n_steps must be at least 1, not " + std::to_string(schedule.every_n_steps));
  if (schedule.warmup_steps < 0)
    throw ConfigError("wrap_averaged_model: warmup_steps must be at least 0, not " + std::to_string(schedule.warmup_steps));
  average_ = optim::detail::ScheduledAverage{std::move(weights), std::move(source), schedule};
}

DETTRIAL_INLINE void Context::seed_micro_batch(std::int64_t records) {
  // Micro-batch k of rank r is the stream's batch k * ranks + r: the same records in any layout.
  const auto stream_batch = static_cast<std::uint64_t>(position_.current_batch * distributed_.size + distributed_.rank);
  torch::manual_seed(detail::mix64(trial_seed_ ^ detail::mix64(stream_batch + detail::golden_gamma)) >> 1);
  ordered_records_ = records;
}

DETTRIAL_INLINE const std::vector<torch::Tensor>& Context::ordered_params() {
  std::size_t count = 0;
  for (auto& w : optimizers_) {
    refresh_params(w);
    count += w.params.size();
  }
  if (count != ordered_params_counted_) {  // built once (again when groups grow)
    ordered_params_counted_ = count;
    ordered_params_.clear();
    for (const auto& w : optimizers_)
      for (const auto& p : w.params)
        if (std::none_of(ordered_params_.begin(), ordered_params_.end(), [&](const torch::Tensor& q) { return q.is_same(p); }))
          ordered_params_.push_back(p);
  }
  return ordered_params_;
}

DETTRIAL_INLINE void Context::stash_ordered_gradients() { ordered_->stash(ordered_params(), ordered_records_); }

DETTRIAL_INLINE void Context::combine_ordered_gradients() {
  if (ordered_combined_at_ == position_.current_batch) return;
  ordered_combined_at_ = position_.current_batch;
  const std::vector<torch::Tensor>& params = ordered_params();
  ordered_->stash(params, ordered_records_);
  ordered_->combine(params);
}

DETTRIAL_INLINE void Context::seed_rank_stream() const {
  if (distributed_.rank > 0)
    torch::manual_seed(detail::mix64(trial_seed_ ^ (static_cast<std::uint64_t>(distributed_.rank) * detail::golden_gamma)) >> 1);
}

DETTRIAL_INLINE std::uint64_t Context::derive_trial_seed(std::optional<std::uint64_t> experiment_seed) {
  // One trial of an experiment: a value in [0, 2^31) drawn from the experiment seed, as Determined's
  // master draws trial seeds; without an experiment seed, the clock (Determined's default).
  std::uint64_t x =
      experiment_seed ? *experiment_seed : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return detail::mix64(x + detail::golden_gamma) % (1ULL << 31);
}

DETTRIAL_INLINE std::int64_t Context::global_batch_size_hparam() const {
  const std::optional<std::int64_t> given = hparams_.global_batch_size();
  if (!given)
    throw HyperparameterError("the batch size getters need the hyperparameter 'global_batch_size', which " + hparams_.source() +
                              " does not define");
  const std::int64_t global = *given;
  if (global < slots_per_trial_)
    throw HyperparameterError("global_batch_size (" + std::to_string(global) + ") is smaller than slots_per_trial (" +
                              std::to_string(slots_per_trial_) + ")");
  return global;
}

DETTRIAL_INLINE std::int64_t Context::require_epoch_len() const {
  if (position_.epoch_len <= 0) throw TrialError("epoch counters are only known once training has started");
  return position_.epoch_len;
}

DETTRIAL_INLINE Context::WrappedOptimizer* Context::gradients_for_step(torch::optim::Optimizer& optimizer, bool auto_zero_grads) {
  if (aggregation_frequency_ > 1 && !auto_zero_grads)
    throw TrialError("step_optimizer(auto_zero_grads=false) cannot be used with aggregation_frequency > 1");
  if (!is_update_batch()) return nullptr;
  WrappedOptimizer& w = find_optimizer(optimizer);
  refresh_params(w);  // param groups may have grown since wrapping (unfrozen layers)
  if (ordered_) {
    combine_ordered_gradients();  // weighted by records: already an average
  } else if (communicator_) {
    if (!w.buckets) w.buckets = std::make_unique<detail::GradientBuckets>(*communicator_, w.params);
    w.buckets->all_reduce();
  }
  if (w.average && aggregation_frequency_ > 1 && !ordered_) {
    const double scale = 1.0 / static_cast<double>(aggregation_frequency_);
    for (auto& p : w.params)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
  if (scaler_) scaler_->unscale(w.params);  // clipping sees the true gradients
  return &w;
}

DETTRIAL_INLINE void Context::step_wrapped(WrappedOptimizer& w, torch::optim::Optimizer& optimizer, bool auto_zero_grads) {
  if (w.shards) step_shards(w);                          // ZeRO: this rank's 1/N, then all-gathered
  else if (scaler_) scaler_->step(optimizer, w.params);  // skipped when a gradient is inf or NaN
  else optimizer.step();
  // Autocast caches low-precision copies of the weights until its region ends; a forward pass
  // later in the same train_batch must see the stepped weights.
  if (precision_ != Precision::fp32) at::autocast::clear_cache();
  if (auto_zero_grads) optimizer.zero_grad();
}

DETTRIAL_INLINE void Context::refresh_params(WrappedOptimizer& w) {
  std::size_t count = 0;
  for (const auto& group : w.optimizer->param_groups()) count += group.params().size();
  if (count == w.params.size()) return;
  if (w.shards)
    throw TrialError("an optimizer's parameter groups changed from " + std::to_string(w.params.size()) + " to " + std::to_string(count) +
                     " parameters during training; with ZeRO (optimizations.zero_stage 1) its shards are cut once, when the fit "
                     "starts: add the parameters before it (frozen ones stay still with requires_grad off)");
  w.buckets.reset();
  w.params.clear();
  for (auto& group : w.optimizer->param_groups())
    for (auto& p : group.params()) w.params.push_back(p);
}

DETTRIAL_INLINE detail::OptimizerShards& Context::shard_optimizer(std::size_t i) {
  WrappedOptimizer& w = optimizers_.at(i);
  if (w.shards) return *w.shards;
  if (!communicator_) throw TrialError("ZeRO shards an optimizer over the ranks of a data-parallel job; this context has one rank");
  refresh_params(w);
  // Gradients as views of the buckets where a view shares memory with its base (the CPU and CUDA;
  // not, for one, LibTorch's lazy device, whose views are replayed): a rank then holds them once.
  using Layout = detail::GradientBuckets::GradientLayout;
  const bool aliasing = std::all_of(w.params.begin(), w.params.end(), [](const torch::Tensor& p) { return p.is_cpu() || p.is_cuda(); });
  w.buckets = std::make_unique<detail::GradientBuckets>(*communicator_, w.params, communicator_->size(),
                                                        aliasing ? Layout::bucket_views : Layout::copied);
  w.shards = std::make_unique<detail::OptimizerShards>(*communicator_, *w.buckets, *w.optimizer);
  return *w.shards;
}

DETTRIAL_INLINE void Context::step_shards(WrappedOptimizer& w) {
  bool stepped = true;
  {
    const auto stepping = w.shards->stepping();
    if (scaler_) stepped = scaler_->step(*w.optimizer, w.params);
    else w.optimizer->step();
  }
  if (stepped) w.shards->all_gather_parameters();
}

DETTRIAL_INLINE Context::WrappedOptimizer& Context::find_optimizer(const torch::optim::Optimizer& optimizer) {
  for (auto& w : optimizers_)
    if (w.optimizer == &optimizer) return w;
  throw TrialError("step_optimizer was given an optimizer that was not wrapped with context.wrap_optimizer");
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
