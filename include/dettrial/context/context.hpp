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
#include <string>
#include <type_traits>
#include <vector>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include "../config/experiment_config.hpp"
#include "../config/hyperparameters.hpp"
#include "../detail/error.hpp"
#include "../detail/malloc.hpp"
#include "../detail/random.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/threads.hpp"
#include "../metrics/reducers.hpp"
#include "../optim/clip.hpp"
#include "../optim/lr_state.hpp"
#include "../optim/lr_step.hpp"
#include "to_device.hpp"

namespace dettrial {

/// A model as a trial holds it: a LibTorch module holder (`torch::nn::Sequential`, `MyNet`) or a
/// `std::shared_ptr` to a `torch::nn::Module`.
template <class M>
concept ModelHandle =
    requires(M& m) {
      { m.ptr() } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
    } || requires(M& m) {
      { m.get() } -> std::convertible_to<torch::nn::Module*>;
      { std::shared_ptr<torch::nn::Module>(m) };
    };

/// A LibTorch optimizer (torch::optim::SGD, Adam, ... or a user subclass of torch::optim::Optimizer).
template <class O>
concept TorchOptimizer = std::derived_from<std::remove_cvref_t<O>, torch::optim::Optimizer>;

/// The `std::shared_ptr<torch::nn::Module>` behind a model handle.
template <ModelHandle M>
std::shared_ptr<torch::nn::Module> module_of(M& m) {
  if constexpr (requires { m.ptr(); }) return m.ptr();
  else return std::shared_ptr<torch::nn::Module>(m);
}

/// Where a process sits in a data-parallel job. One process: rank 0 of 1.
struct DistributedInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  bool is_chief() const { return rank == 0; }
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
  /// Intra-op threads for this process (`--threads`). Unset: OMP_NUM_THREADS when set, else in a
  /// data-parallel job this rank's share of the node's cores (see dettrial::choose_threads), else
  /// LibTorch's default.
  std::optional<int> threads;
};

template <class TrialT>
class Trainer;
namespace detail {
struct ContextCheckpoint;
}

/**
 * @brief What a trial sees of its run (Determined's PyTorchTrialContext).
 *
 * Imperative trials take it in their constructor and wrap their models, optimizers and schedulers
 * with it; declarative trials may take it to read hyperparameters. The trainer keeps the counters.
 */
class Context {
 public:
  /// A context for the one trial an experiment config describes.
  explicit Context(const ExperimentConfig& config, ContextOptions options = {})
      : Context(config.trial_hyperparameters(), config, std::move(options)) {}

  /// A context from hyperparameters alone (an empty experiment config).
  explicit Context(Hyperparameters hparams, ContextOptions options = {})
      : Context(std::move(hparams), ExperimentConfig{}, std::move(options)) {}

  Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options)
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
    device_ = options.device ? *options.device
                             : (torch::cuda::is_available()
                                    ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(distributed_.local_rank %
                                                                                                std::max<std::int64_t>(static_cast<std::int64_t>(torch::cuda::device_count()), 1)))
                                    : torch::Device(torch::kCPU));
    // NCCL takes tensors on one GPU only: models, gradients and every collective must be there. (Gloo
    // takes CPU tensors, and CUDA ones too.)
    if (communicator_ && !communicator_->device().is_cpu() && communicator_->device() != device_)
      throw ConfigError(std::string("the ") + communicator_->backend_name() + " backend of rank " + std::to_string(distributed_.rank) +
                        " takes tensors on " + communicator_->device().str() + ", but this process's device is " + device_.str() +
                        "; give every rank the device its local rank picks (or leave ContextOptions::device unset)");
    trial_seed_ = options.trial_seed ? *options.trial_seed : derive_trial_seed(config_.experiment_seed);
    // One trial seed for the job: the chief's (without an experiment seed each rank's clock differs,
    // and the ranks would shard different permutations of the data).
    if (communicator_) trial_seed_ = static_cast<std::uint64_t>(communicator_->broadcast_values({static_cast<std::int64_t>(trial_seed_)})[0]);
    if (const auto choice = choose_threads(communicator_ ? communicator_->environment() : LaunchEnvironment{}, options.threads,
                                           CoreCount::of_this_process())) {
      if (choice->set_by_dettrial) torch::set_num_threads(choice->threads);
      threads_ = *choice;
    }
    if (const auto on = options.deterministic ? options.deterministic : config_.deterministic) set_deterministic(*on);
    detail::keep_freed_memory();
    seed_everything();
  }

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // ---- hyperparameters and configuration -------------------------------------------------------

  /// The hyperparameter `name` (dotted for nested values) as T; throws HyperparameterError naming it.
  template <class T>
  T get_hparam(std::string_view name) const {
    return hparams_.get<T>(name);
  }
  const Hyperparameters& get_hparams() const { return hparams_; }
  /// The experiment config's `data` section.
  const YAML::Node& get_data_config() const { return config_.data; }
  /// The running fit's output folder (metrics.jsonl, checkpoints/; in a search, the trial's own
  /// `trials/<id>/`): where a trial's or callback's own files belong. Empty until `fit` starts (the
  /// trial's constructor runs before), so read it in hooks and batches.
  const std::filesystem::path& output_dir() const { return output_dir_; }
  const ExperimentConfig& get_experiment_config() const { return config_; }

  /// `global_batch_size / slots_per_trial`; needs the `global_batch_size` hyperparameter.
  std::int64_t get_per_slot_batch_size() const {
    const std::int64_t global = global_batch_size_hparam();
    return global / slots_per_trial_;
  }
  /// The effective global batch size, `per_slot * slots`.
  std::int64_t get_global_batch_size() const { return get_per_slot_batch_size() * slots_per_trial_; }
  /// True when the `global_batch_size` hyperparameter exists.
  bool has_global_batch_size() const { return hparams_.contains("global_batch_size"); }

  // ---- seed, device, distribution -------------------------------------------------------------

  /// The seed every RNG was seeded with: the same seed gives the same run.
  std::uint64_t get_trial_seed() const { return trial_seed_; }
  const torch::Device& device() const { return device_; }
  const DistributedInfo& distributed() const { return distributed_; }
  /// The job's process group, or null for one process.
  Communicator* communicator() const { return communicator_.get(); }
  /// The intra-op thread count this process was given and why, when one was chosen (see ContextOptions::threads).
  const std::optional<ThreadChoice>& threads() const { return threads_; }
  std::int64_t aggregation_frequency() const { return aggregation_frequency_; }

  /// Moves a nested batch to this context's device (see dettrial::to_device).
  template <class B>
  std::remove_cvref_t<B> to_device(B&& batch) const {
    return dettrial::to_device(std::forward<B>(batch), device_, device_.is_cuda());
  }

  // ---- counters -------------------------------------------------------------------------------

  /// The batch index training started (or resumed) from.
  std::int64_t get_initial_batch() const { return initial_batch_; }
  /// The global index of the batch being trained.
  std::int64_t current_train_batch() const { return current_batch_; }
  /// The epoch of the batch being trained.
  std::int64_t current_train_epoch() const { return current_batch_ / require_epoch_len(); }
  bool is_epoch_start() const { return current_batch_ % require_epoch_len() == 0; }
  bool is_epoch_end() const { return current_batch_ % require_epoch_len() == require_epoch_len() - 1; }
  /// True on batches that step the optimizers (every `aggregation_frequency`-th batch).
  bool is_update_batch() const { return (current_batch_ + 1) % aggregation_frequency_ == 0; }

  /// Ask the trainer to checkpoint and stop at the next boundary.
  void set_stop_requested(bool stop) { stop_requested_ = stop; }
  bool get_stop_requested() const { return stop_requested_; }

  // ---- wrapping -------------------------------------------------------------------------------

  /// Moves the model to the device and registers it (train/eval mode, checkpoints). Returns it.
  template <class M>
  M wrap_model(M model) {
    static_assert(ModelHandle<M>,
                  "dettrial::Context::wrap_model<M>: M must be a LibTorch module holder (torch::nn::Linear, "
                  "torch::nn::Sequential, ...) or a std::shared_ptr to a torch::nn::Module");
    auto module = module_of(model);
    module->to(device_);
    models_.push_back(std::move(module));
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
    for (const auto& w : optimizers_)
      if (w.optimizer == &optimizer) throw TrialError("this optimizer was already wrapped with wrap_optimizer");
    WrappedOptimizer w{&optimizer, {}, average_aggregated_gradients.value_or(average_aggregated_gradients_)};
    refresh_params(w);
    optimizers_.push_back(std::move(w));
    return optimizer;
  }

  /**
   * @brief Registers an LR scheduler to be stepped by dettrial in `Mode` (see dettrial::lr_step),
   * every `frequency` units. The scheduler must outlive the trainer. Returns it.
   */
  template <class S, class Mode = lr_step::every_batch>
  S& wrap_lr_scheduler(S& scheduler, Mode = {}, std::int64_t frequency = 1) {
    static_assert(LRSchedulerLike<S>, "dettrial::Context::wrap_lr_scheduler<S>: S must have step() (a torch::optim scheduler)");
    static_assert(LRStepMode<Mode>,
                  "dettrial::Context::wrap_lr_scheduler: the mode must be a dettrial::lr_step policy (every_batch, "
                  "every_epoch, every_optimizer_step, manual) or a type with name and steps_after(...)");
    static_assert(CheckpointableLRScheduler<S>,
                  "dettrial::Context::wrap_lr_scheduler<S>: checkpoints must restore S, so S must derive from "
                  "torch::optim::LRScheduler or have save(torch::serialize::OutputArchive&) const and "
                  "load(torch::serialize::InputArchive&)");
    if (frequency < 1) throw ConfigError("an LR scheduler's step frequency must be at least 1");
    schedulers_.push_back(WrappedScheduler{&scheduler, [](void* s) { static_cast<S*>(s)->step(); }, &Mode::steps_after,
                                           frequency, std::string(Mode::name), &detail::save_lr_scheduler<S>,
                                           &detail::load_lr_scheduler<S>, &detail::lr_scheduler_steps<S>});
    return scheduler;
  }

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
        static_assert(ReducedMetrics<Result>, "dettrial::Context::wrap_reducer(fn, name): fn must return a number or dettrial::MetricValues");
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

  /// Back-propagates `loss` (Determined's `context.backward`).
  void backward(const torch::Tensor& loss, bool retain_graph = false, bool create_graph = false) {
    // In a job, an update batch's backward pass starts each gradient bucket's all-reduce as soon as
    // the bucket's gradients are ready (see all_reduce_gradients).
    if (communicator_)
      for (auto& w : optimizers_) arm_gradient_hooks(w);
    loss.backward({}, retain_graph, create_graph);
  }

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
    if (aggregation_frequency_ > 1 && !auto_zero_grads)
      throw TrialError("step_optimizer(auto_zero_grads=false) cannot be used with aggregation_frequency > 1");
    if (!is_update_batch()) return;
    WrappedOptimizer& w = find_optimizer(optimizer);
    refresh_params(w);  // param groups may have grown since wrapping (unfrozen layers)
    if (communicator_) all_reduce_gradients(w);
    if (w.average && aggregation_frequency_ > 1) {
      const double scale = 1.0 / static_cast<double>(aggregation_frequency_);
      for (auto& p : w.params)
        if (p.grad().defined()) p.grad().mul_(scale);
    }
    clip_gradients(w.params);
    optimizer.step();
    if (auto_zero_grads) optimizer.zero_grad();
  }

  /// True while a trainer's trial is registered here.
  bool has_registrations() const {
    return !models_.empty() || !optimizers_.empty() || !schedulers_.empty() || !reducers_.empty();
  }
  /// Forgets every wrapped object (called when their trainer goes away).
  void release_registrations() {
    for (auto& w : optimizers_) remove_gradient_hooks(w);
    models_.clear();
    optimizers_.clear();
    schedulers_.clear();
    reducers_.clear();
    owned_reducers_.clear();
    stop_requested_ = false;
    epoch_len_ = 0;
  }

  /// Every wrapped model, in wrap order.
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return models_; }
  std::size_t num_optimizers() const { return optimizers_.size(); }
  std::size_t num_lr_schedulers() const { return schedulers_.size(); }

 private:
  template <class>
  friend class Trainer;
  friend struct detail::ContextCheckpoint;

  /// A flat buffer that carries the gradients of several parameters in one all-reduce.
  struct GradientBucket {
    torch::Tensor flat;
    std::vector<std::pair<std::size_t, std::int64_t>> members;  // (parameter index, offset)
  };
  struct WrappedOptimizer {
    torch::optim::Optimizer* optimizer;
    std::vector<torch::Tensor> params;
    bool average;
    // Data parallel only: built on the first distributed step, then reused.
    std::vector<GradientBucket> buckets{};
    std::vector<std::size_t> bucket_of{};                      // per parameter
    std::vector<std::int64_t> offset_of{};                     // per parameter, in its bucket
    std::vector<unsigned> hooks{};                             // per parameter
    std::vector<char> filled{};                                // per parameter: its slice holds this step's gradient
    std::vector<std::size_t> pending{};                        // per bucket: parameters still to come
    std::vector<c10::intrusive_ptr<c10d::Work>> works{};       // the all-reduces started, in bucket order
    std::vector<torch::Tensor> collective_arg{1};            // c10d takes a vector: one, reused
    bool armed = false;                                      // this backward pass feeds the buckets
  };
  struct WrappedScheduler {
    void* scheduler;
    void (*step)(void*);
    std::int64_t (*steps_after)(std::int64_t, std::int64_t, std::int64_t, std::int64_t);
    std::int64_t frequency;
    std::string mode;
    void (*save)(void*, torch::serialize::OutputArchive&);
    void (*load)(void*, torch::serialize::InputArchive&);
    std::int64_t (*steps_taken)(void*);
  };

  template <class Result>
  static void check_reducer_name(const std::string& name) {
    constexpr bool returns_many = std::same_as<std::remove_cvref_t<Result>, MetricValues>;
    if (returns_many && !name.empty())
      throw TrialError("wrap_reducer: reducer '" + name + "' returns MetricValues (merged by their own names), so wrap it without a name");
    if (!returns_many && name.empty())
      throw TrialError("wrap_reducer: a reducer that returns a number needs a name to report it under");
  }

  static std::uint64_t derive_trial_seed(std::optional<std::uint64_t> experiment_seed) {
    // One trial of an experiment: a value in [0, 2^31) drawn from the experiment seed, as Determined's
    // master draws trial seeds; without an experiment seed, the clock (Determined's default).
    std::uint64_t x = experiment_seed ? *experiment_seed
                                      : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    return detail::mix64(x + detail::golden_gamma) % (1ULL << 31);
  }

  /// LibTorch's switches for bit-identical runs (process-wide): deterministic algorithms (an op
  /// without a deterministic implementation throws, naming itself), cuDNN's deterministic kernels and
  /// no autotuning, and cuBLAS's fixed workspace, which it needs before its first use.
  static void set_deterministic(bool on) {
    at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(on);
    at::globalContext().setBenchmarkCuDNN(!on && at::globalContext().benchmarkCuDNN());
    if (on) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }

  void seed_everything() const {
    torch::manual_seed(trial_seed_);  // CPU and, when present, every CUDA device
  }

  /// In a job, after the trial and its data loaders were built from the same seed on every rank:
  /// ranks other than the chief continue on a stream of their own, derived from the trial seed and
  /// the rank, so that their dropout masks and other draws differ.
  void seed_rank_stream() const {
    if (distributed_.rank > 0)
      torch::manual_seed(detail::mix64(trial_seed_ ^ (static_cast<std::uint64_t>(distributed_.rank) * detail::golden_gamma)) >> 1);
  }

  std::int64_t global_batch_size_hparam() const {
    if (!hparams_.contains("global_batch_size"))
      throw HyperparameterError(
          "the batch size getters need the hyperparameter 'global_batch_size', which " + hparams_.source() +
          " does not define");
    const auto global = hparams_.get<std::int64_t>("global_batch_size");
    if (global < slots_per_trial_)
      throw HyperparameterError("global_batch_size (" + std::to_string(global) + ") is smaller than slots_per_trial (" +
                                std::to_string(slots_per_trial_) + ")");
    return global;
  }

  std::int64_t require_epoch_len() const {
    if (epoch_len_ <= 0) throw TrialError("epoch counters are only known once training has started");
    return epoch_len_;
  }

  /// Rebuilds the cached parameter list when the optimizer's groups changed size (no allocation otherwise).
  void refresh_params(WrappedOptimizer& w) {
    std::size_t count = 0;
    for (const auto& group : w.optimizer->param_groups()) count += group.params().size();
    if (count == w.params.size()) return;
    remove_gradient_hooks(w);
    w.params.clear();
    w.buckets.clear();
    for (auto& group : w.optimizer->param_groups())
      for (auto& p : group.params()) w.params.push_back(p);
  }

  /// PyTorch DDP's default bucket size.
  static constexpr std::int64_t bucket_bytes = 25 << 20;

  /**
   * @brief Averages the gradients across ranks, as PyTorch's DDP does: flat buckets (of one dtype and
   * device, up to 25 MiB, filled from the last parameters back, the order the backward pass produces
   * them) whose all-reduces start during the backward pass as each bucket fills, in bucket order on
   * every rank; step_optimizer then waits for them and divides by the world size. The buckets are
   * allocated on the first step and reused. A backward pass not run through `context.backward`, and
   * parameters without a gradient (zeros), are handled here after the fact.
   */
  void all_reduce_gradients(WrappedOptimizer& w) {
    if (w.buckets.empty()) build_buckets(w);
    torch::NoGradGuard no_grad;
    if (!w.armed) {  // the hooks did not feed this step (or saw two backward passes): start over
      for (const auto& work : w.works) communicator_->wait(work, "gradient all-reduce");
      std::fill(w.filled.begin(), w.filled.end(), 0);
      w.works.clear();
    }
    for (std::size_t i = 0; i < w.params.size(); ++i)
      if (!w.filled[i]) fill_slice(w, i, torch::Tensor());
    for (std::size_t b = 0; b < w.buckets.size(); ++b) w.pending[b] = 0;
    start_ready_buckets(w);
    const double scale = 1.0 / static_cast<double>(distributed_.size);
    for (std::size_t k = 0; k < w.buckets.size(); ++k) {
      communicator_->wait(w.works[k], "gradient all-reduce");
      GradientBucket& b = w.buckets[k];
      b.flat.mul_(scale);
      for (const auto& [i, offset] : b.members) {
        torch::Tensor& p = w.params[i];
        const torch::Tensor slice = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
        if (p.grad().defined()) p.mutable_grad().copy_(slice);
        else p.mutable_grad() = slice.clone();
      }
    }
    w.armed = false;
  }

  void build_buckets(WrappedOptimizer& w) {
    w.bucket_of.assign(w.params.size(), 0);
    w.offset_of.assign(w.params.size(), 0);
    for (std::size_t k = w.params.size(); k-- > 0;) {
      const torch::Tensor& p = w.params[k];
      if (w.buckets.empty() || w.buckets.back().flat.scalar_type() != p.scalar_type() || w.buckets.back().flat.device() != p.device() ||
          (w.buckets.back().flat.numel() + p.numel()) * p.element_size() > bucket_bytes)
        w.buckets.push_back(GradientBucket{torch::empty({0}, p.options()), {}});
      GradientBucket& b = w.buckets.back();
      b.members.emplace_back(k, b.flat.numel());
      w.offset_of[k] = b.flat.numel();
      b.flat = torch::empty({b.flat.numel() + p.numel()}, p.options());
      w.bucket_of[k] = w.buckets.size() - 1;
    }
    w.filled.assign(w.params.size(), 0);
    w.pending.assign(w.buckets.size(), 0);
    w.works.reserve(w.buckets.size());
    // The hooks find their WrappedOptimizer by its optimizer: the vector holding it may grow.
    torch::optim::Optimizer* optimizer = w.optimizer;
    for (std::size_t k = 0; k < w.params.size(); ++k)
      w.hooks.push_back(w.params[k].register_hook([this, optimizer, k](const torch::Tensor& grad) {
        WrappedOptimizer& self = find_optimizer(*optimizer);
        if (!self.armed) return;
        if (self.filled[k]) {  // a second backward pass in this step: redone in step_optimizer
          self.armed = false;
          return;
        }
        torch::NoGradGuard no_grad;
        fill_slice(self, k, grad);
        --self.pending[self.bucket_of[k]];
        start_ready_buckets(self);
      }));
  }

  /// Puts parameter k's gradient for this step (its accumulated .grad plus `incoming`) into its slice.
  static void fill_slice(WrappedOptimizer& w, std::size_t k, const torch::Tensor& incoming) {
    const torch::Tensor& p = w.params[k];
    torch::Tensor slice = w.buckets[w.bucket_of[k]].flat.narrow(0, w.offset_of[k], p.numel());
    if (incoming.defined()) {
      slice.copy_(incoming.reshape({-1}));
      if (p.grad().defined()) slice.add_(p.grad().reshape({-1}));
    } else if (p.grad().defined()) {
      slice.copy_(p.grad().reshape({-1}));
    } else {
      slice.zero_();
    }
    w.filled[k] = 1;
  }

  /// Starts the all-reduces of the buckets that are full, strictly in bucket order (ranks must issue
  /// collectives in the same order).
  void start_ready_buckets(WrappedOptimizer& w) {
    while (w.works.size() < w.buckets.size() && w.pending[w.works.size()] == 0) {
      w.collective_arg[0] = w.buckets[w.works.size()].flat;
      w.works.push_back(communicator_->allreduce_async(w.collective_arg));
    }
  }

  /// Before an update batch's backward pass: every bucket waits for all its parameters.
  void arm_gradient_hooks(WrappedOptimizer& w) {
    w.armed = !w.buckets.empty() && is_update_batch();
    if (!w.armed) return;
    std::fill(w.filled.begin(), w.filled.end(), 0);
    for (std::size_t b = 0; b < w.buckets.size(); ++b) w.pending[b] = w.buckets[b].members.size();
    w.works.clear();
  }

  static void remove_gradient_hooks(WrappedOptimizer& w) {
    for (std::size_t k = 0; k < w.hooks.size() && k < w.params.size(); ++k) w.params[k].remove_hook(w.hooks[k]);
    w.hooks.clear();
    w.armed = false;
  }

  WrappedOptimizer& find_optimizer(const torch::optim::Optimizer& optimizer) {
    for (auto& w : optimizers_)
      if (w.optimizer == &optimizer) return w;
    throw TrialError("step_optimizer was given an optimizer that was not wrapped with context.wrap_optimizer");
  }

  /// Called by the trainer on update batches after train_batch: steps the schedulers per their mode.
  void step_lr_schedulers(std::int64_t batch_idx) {
    for (auto& s : schedulers_) {
      const std::int64_t n = s.steps_after(batch_idx, aggregation_frequency_, epoch_len_, s.frequency);
      for (std::int64_t i = 0; i < n; ++i) s.step(s.scheduler);
    }
  }

  Hyperparameters hparams_;
  ExperimentConfig config_;
  std::int64_t aggregation_frequency_ = 1;
  bool average_aggregated_gradients_ = true;
  std::int64_t slots_per_trial_ = 1;
  std::uint64_t trial_seed_ = 0;
  torch::Device device_{torch::kCPU};
  DistributedInfo distributed_;
  std::shared_ptr<Communicator> communicator_;
  std::optional<ThreadChoice> threads_;

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<WrappedOptimizer> optimizers_;
  std::vector<WrappedScheduler> schedulers_;
  std::vector<detail::WrappedReducer> reducers_;
  std::vector<std::shared_ptr<void>> owned_reducers_;  // the FunctionReducers wrap_reducer(fn) made

  std::int64_t initial_batch_ = 0;
  std::filesystem::path output_dir_{};
  std::int64_t current_batch_ = 0;
  std::int64_t epoch_len_ = 0;
  bool stop_requested_ = false;
};

}  // namespace dettrial
