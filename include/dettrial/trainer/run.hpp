// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Run<TrialT, Set>: one fit of a valid trial, Determined's loop generated for it
/// (workloads ending at any boundary, validation, checkpoints, reports, the final validation).
/// Trainer<TrialT> builds the trial and makes a Run for each fit. What does not depend on the trial
/// type is compiled once: the fit's Schedule, Position and Outputs, and the steps in fit_steps.hpp.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include "../checkpoint/sharded_state.hpp"
#include "../checkpoint/trial_checkpoint.hpp"
#include "../context/context.hpp"
#include "../data/copy_ahead.hpp"
#include "../distributed/agreement.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/metrics.hpp"
#include "../error.hpp"
#include "../detail/scope_exit.hpp"
#include "../detail/signals.hpp"
#include "../vocabulary/metrics.hpp"
#include "../metrics/reducers.hpp"
#include "../report/reporter.hpp"
#include "../vocabulary/trial.hpp"
#include "callbacks.hpp"
#include "fit_options.hpp"
#include "fit_steps.hpp"
#include "outputs.hpp"
#include "position.hpp"
#include "schedule.hpp"
#include "step_graph.hpp"

namespace dettrial::detail {

/// Dereferences a smart pointer, or returns the object itself.
template <class O>
decltype(auto) deref(O& o) {
  if constexpr (TorchOptimizer<O>) return (o);
  else return (*o);
}

/**
 * @brief One fit of a valid trial (only Trainer<TrialT> makes one, and only for a trial that meets
 * the concepts): the trial's loaders, the captured step and the fit's pieces as members (its
 * Schedule, Position, Outputs, Checkpointer and result), and the loop that calls the trial's hooks
 * and the callbacks in `Set` between the steps of fit_steps.hpp.
 */
template <class TrialT, class Set>
class Run {
  static constexpr bool declarative = DeclaresModel<TrialT>;

 public:
  using Model = std::conditional_t<declarative, model_t<TrialT>, missing>;
  using OptimizerHolder = std::conditional_t<declarative, optimizer_result_t<TrialT>, missing>;

  /// A declarative trial's model and optimizer holder; `missing` objects for the others.
  Run(Context& context, TrialT& trial, Model& model, OptimizerHolder& optimizer, Set& callbacks)
      : context_(context), trial_(trial), model_(model), optimizer_(optimizer), callbacks_(callbacks) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Trains until the options' max_length, validating, checkpointing and reporting at their
  /// periods, and validates at the end.
  FitResult fit(FitOptions options) {
    check_step_capture(options.step_capture, context_, tensors_only_batch<training_batch_t<TrialT>>(),
                       c10::demangle(typeid(training_batch_t<TrialT>).name()));
    begin(std::move(options));
    // However the fit ends: a checkpoint write in flight ends (a failure is a warning then), then
    // the outputs end as the fit did, the run folder's lock last.
    const auto end = on_scope_exit([&] {
      checkpointer_.settle();
      outputs_.close();
    });
    // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
    std::size_t started = 0;
    const auto shutdown = on_scope_exit([&] { shut_down(callbacks_, started); });
    const std::int64_t first_batch = position_.first_batch();
    const std::string resume_uuid = position_.resume_dir() ? position_.resume_dir()->filename().string() : std::string();
    callbacks_.each([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if constexpr (hook::on_trial_startup::callable<C>) hook::on_trial_startup::call(cb, first_batch, resume_uuid);
      ++started;
    });
    prepare_training();
    // The graph is made anew in each fit (a resumed run warms up and captures again) and freed after it.
    if (const auto* graph = std::get_if<capture::cuda_graph>(&options_.step_capture)) step_graph_.start(*graph, context_);
    const auto free_graph = on_scope_exit([&] { step_graph_.reset(); });
    announce(context_, options_, schedule_, position_, outputs_.reporter());
    if constexpr (requires { train_loader_->describe(); })
      outputs_.reporter().line("dettrial: training data: " + train_loader_->describe());
    outputs_.start_tensorboard_session(context_);
    const StopSignals signals(options_.handle_signals);
    callbacks_.template call<hook::on_training_start>();
    if (options_.step_zero_validation && position_.untouched()) validate();
    train();
    outputs_.finish_profiling(position_.batches_trained() - 1);
    if (!result_.stop_requested) {
      if (!position_.validated_here()) validate();
      checkpoint_unless_current();
      finish_checkpoint(/*wait=*/true);
      // Trained to its length: retention applies without sparing the newest checkpoint.
      if (context_.distributed().is_chief()) checkpointer_.apply_retention({});
    }
    result_.batches_trained = position_.batches_trained();
    result_.epochs_trained = position_.epochs_trained();
    outputs_.end_as(result_.signal != 0 ? MlflowEnd::killed : MlflowEnd::finished);
    outputs_.write_report(context_, options_.output_dir);
    return std::move(result_);
  }

 private:
  /// The fit's pieces, in an order that fails before anything is written where it can: the run
  /// folder's lock first, then the schedule, the checkpoint to resume from, the checkpoints'
  /// storage and the outputs.
  void begin(FitOptions options) {
    options_ = std::move(options);
    if (options_.output_dir.empty()) options_.output_dir = default_output_dir();
    outputs_ = Outputs::lock(context_, options_.output_dir);
    schedule_ = Schedule::resolve(options_, context_);
    position_ = Position::find(options_);
    ContextAccess::position(context_).output_dir = options_.output_dir;
    checkpointer_ = fit_checkpointer(context_, options_);
    outputs_.open(context_, options_, position_.continued_at());
    result_ = FitResult{};
    result_.checkpoint_dir = checkpointer_.storage();
    result_.output_dir = options_.output_dir;
  }

  /// Builds the data loaders, makes the ranks agree, restores the checkpoint and sets the counters.
  void prepare_training() {
    train_loader_.emplace(trial_.build_training_data_loader());
    validation_loader_.emplace(trial_.build_validation_data_loader());
    schedule_.keep_data_ranks(data_layout());
    schedule_.settle_epoch_length(context_, agree_across_ranks(epoch_length(*train_loader_, training_chain())));
    if (const auto& dir = position_.resume_dir()) restore(*dir, position_.to_restore(options_.trial_id));
    schedule_.check_rank_invariant_boundaries(context_, position_.batches_trained());
    position_.start(context_);
    result_.resumed_from_batch = position_.batches_trained();
    if (Communicator* comm = context_.communicator())
      broadcast_modules(*comm, context_.models());          // every rank starts from rank 0's weights
    shard_optimizer_states(context_, options_.zero_stage);  // after the restore: the loaded state is cut
  }

  /// on_trial_shutdown for the callbacks that started, last first; a failing hook is reported, not thrown.
  static void shut_down(Set& callbacks, std::size_t started) {
    std::size_t index = Set::size;
    callbacks.each_reversed([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if (index-- > started) return;
      if constexpr (hook::on_trial_shutdown::callable<C>) {
        try {
          hook::on_trial_shutdown::call(cb);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "dettrial: on_trial_shutdown failed: %s\n", e.what());
        }
      }
    });
  }

  // ---- the loop: train until a boundary, then handle each boundary reached ------------------

  void train() {
    // One endless stream for the whole run (Determined's repeat → shard → skip chain).
    CopyAhead batches(train_loader_->batches(training_chain()), context_.device());
    Workload workload;
    while (schedule_.remaining(position_.progress()) > 0) {
      const Reached reached = train_until_boundary(batches, workload);
      report_training(workload);
      finish_checkpoint(/*wait=*/false);  // the one written in the background, if it is durable now
      if (const int signal = agreed_max(StopSignals::received()); signal != 0) return stop(signal);
      if (handle_boundaries(reached)) return;
    }
  }

  /// Trains batch after batch until one reaches a boundary (or, in one process, a stop signal arrives).
  template <class Batches>
  Reached train_until_boundary(Batches& batches, Workload& workload) {
    step_graph_.check_unchanged();
    workload.begin(context_, checkpointer_.take_waited_seconds());
    Reporter& reporter = outputs_.reporter();
    TraceProfiler& profiler = outputs_.profiler();
    reporter.begin("train", position_.batches_trained(), schedule_.total_batches(), "batches");
    for (;;) {
      const std::int64_t batch_idx = position_.batches_trained(), epoch_idx = schedule_.epoch_of(batch_idx);
      const bool epoch_start = schedule_.starts_epoch(batch_idx), epoch_end = schedule_.ends_epoch(batch_idx);
      ContextAccess::position(context_).current_batch = batch_idx;
      if (epoch_start) callbacks_.template call<hook::on_training_epoch_start>(epoch_idx);
      if (!batches.has_next()) training_stream_ended(batch_idx);
      profiler.before_batch(batch_idx);
      // Synchronized timings only inside the profiled range: a sync a batch elsewhere would cost the GPU its queue.
      train_batch(batches.take(), workload, batch_idx, epoch_idx, outputs_.sync_timings());
      position_.batch_trained();
      if (profiler.after_batch(batch_idx)) outputs_.report_profile();
      if (epoch_end) {
        callbacks_.template call<hook::on_training_epoch_end>(epoch_idx);
        position_.epoch_trained();
      }
      reporter.update(position_.batches_trained());
      const Reached reached = schedule_.boundaries_after(batch_idx, epoch_idx, epoch_end);
      if (reached.any()) return reached;
      // One process stops at any batch (with rank_invariant, at an update's last); a job only at
      // boundaries, where its ranks agree.
      if (!context_.communicator() && StopSignals::received() != 0 && (!context_.rank_invariant() || context_.is_update_batch()))
        return reached;
      // The next batch is trained right away: its copy to the device starts while the device still
      // computes this one. Not across a boundary or an epoch's start, so the data is read in the same
      // order relative to checkpoints and callbacks as without it; nor into a profiled range, whose
      // trace shows each of its batches' reads.
      if (!epoch_end && !profiler.starts_at(batch_idx + 1)) batches.stage();
    }
  }

  /// Adds the time since the last phase ended to `phase` (after the GPU's work, with sync_timings).
  static void lap(Workload& workload, double& phase, bool sync) {
    if (sync) torch::cuda::synchronize();
    const auto now = std::chrono::steady_clock::now();
    phase += std::chrono::duration<double>(now - workload.mark).count();
    workload.mark = now;
  }

  /// The trial's train_batch, and for a declarative trial backward, clipping and the optimizer step.
  template <class Batch>
  Metrics eager_step(Batch& batch, Workload& workload, std::int64_t batch_idx, std::int64_t epoch_idx, bool sync_timings) {
    Metrics metrics = [&] {
      RECORD_USER_SCOPE("dettrial::train_batch");
      return as_metrics(in_precision([&]() -> decltype(auto) { return call_train_batch(trial_, batch, model_, epoch_idx, batch_idx); }));
    }();
    lap(workload, workload.phases.train_batch, sync_timings);
    if constexpr (declarative) {
      const MetricValue& loss = metrics.at("loss");
      if (!loss.is_tensor())
        throw TrialError("train_batch must return the loss as a tensor (the trainer back-propagates it), not a number");
      {
        RECORD_USER_SCOPE("dettrial::backward");
        context_.backward(loss.tensor());
      }
      lap(workload, workload.phases.backward, sync_timings);
      {
        RECORD_USER_SCOPE("dettrial::optimizer_step");
        // An optional hook: gradient_clipping() returns a clip policy (clip::by_norm{...}, clip::by_value{...}).
        if constexpr (requires(TrialT& t) { t.gradient_clipping(); })
          context_.step_optimizer(deref(optimizer_), trial_.gradient_clipping());
        else context_.step_optimizer(deref(optimizer_));
      }
      lap(workload, workload.phases.optimizer_step, sync_timings);
    }
    return metrics;
  }

  /// One batch: to the device, train_batch, and for a declarative trial backward and step (eagerly,
  /// or as a replay of the captured step); each phase timed, and named for the profiler's trace.
  template <class Loaded>
  void train_batch(Loaded&& loaded, Workload& workload, std::int64_t batch_idx, std::int64_t epoch_idx, bool sync_timings) {
    training_batch_t<TrialT> batch = std::move(loaded);
    const std::int64_t records = record_count(batch);
    workload.records += records;
    ContextAccess::begin_training_batch(context_, records);
    Metrics metrics;
    if (step_graph_.captured() && step_graph_.fits(batch)) {
      // The batch (on the device already: CopyAhead) is copied into the graph's inputs; the
      // whole step is one replay.
      metrics = step_graph_.replay(batch);
      lap(workload, workload.phases.train_batch, sync_timings);
    } else {
      lap(workload, workload.phases.data, sync_timings);  // the batch came on the device (CopyAhead)
      if (!step_graph_.armed()) {
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      } else if (step_graph_.warming_up() || (!step_graph_.captured() && !step_graph_.ready_to_capture(batch))) {
        step_graph_.note_warm_up_shapes(batch);
        metrics = step_graph_.warm_up([&] { return eager_step(batch, workload, batch_idx, epoch_idx, sync_timings); });
      } else if (!step_graph_.captured()) {
        // Nothing may wait for the device while capturing: no synchronized timings.
        metrics = step_graph_.capture(std::move(batch),
                                      [&](training_batch_t<TrialT>& b) { return eager_step(b, workload, batch_idx, epoch_idx, false); });
        lap(workload, workload.phases.train_batch, sync_timings);
        outputs_.note_capture(batch_idx);
      } else {
        outputs_.note_eager_batch(batch_idx);
        step_graph_.before_eager_batch();
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      }
    }
    ContextAccess::finish_batch(context_, batch_idx);
    workload.means.add(metrics, batch_idx);
    if constexpr (Set::wants_batch_metrics) workload.batch_metrics.push_back(detached(metrics));
  }

  /// Validates and checkpoints as reached, in Determined's order (length, validation, checkpoint,
  /// report), honouring a stop request after each. Returns true when training stops.
  bool handle_boundaries(const Reached& reached) {
    enum class Kind { length, validation, checkpoint, report };
    const std::pair<bool, Kind> in_order[] = {{reached.length, Kind::length},
                                              {reached.validation, Kind::validation},
                                              {reached.checkpoint, Kind::checkpoint},
                                              {reached.report, Kind::report}};
    for (const auto& [hit, kind] : in_order) {
      if (!hit) continue;
      if (kind == Kind::validation && !position_.validated_here()) validate();
      if (kind == Kind::checkpoint) checkpoint_unless_current();
      if (agreed_max(context_.get_stop_requested() ? 1 : 0) != 0) {
        stop(0);
        return true;
      }
    }
    return false;
  }

  /// The one way training stops early: checkpoint (unless current), record why (`signal`, or 0
  /// for a stop request), say so.
  void stop(int signal) {
    checkpoint_unless_current();
    finish_checkpoint(/*wait=*/true);  // durable before the process exits (with 75 after a signal)
    result_.signal = signal;
    result_.stop_requested = true;
    result_.stopped_early = schedule_.remaining(position_.progress()) > 0;
    report_stop(signal, position_.batches_trained(), checkpointer_, outputs_.reporter());
  }

  void checkpoint_unless_current() {
    if (!position_.checkpointed_here()) checkpoint();
  }

  // ---- reports and validation -----------------------------------------------------------------

  void report_training(const Workload& workload) {
    result_.last_training_metrics = detail::report_training(context_, workload, position_.progress(), outputs_.reporter());
    callbacks_.template call<hook::on_training_workload_end>(result_.last_training_metrics,
                                                             std::span<const Metrics>(workload.batch_metrics));
  }

  void validate() {
    RECORD_USER_SCOPE("dettrial::validate");
    torch::NoGradGuard no_grad;
    begin_validation(context_);
    callbacks_.template call<hook::on_validation_start>();
    outputs_.reporter().begin("validate", 0, epoch_length(*validation_loader_, validation_chain()), "batches");
    std::int64_t records = 0;
    const MetricValues metrics = reduce_validation(context_, evaluate(), records);
    callbacks_.template call<hook::on_validation_end>(metrics);
    result_.last_validation_metrics = finish_validation(context_, metrics, records, position_, outputs_.reporter());
    ++result_.validations;
    if (checkpointer_.after_validation(improves_searcher_metric(context_, options_, position_, result_.last_validation_metrics)))
      checkpoint_unless_current();
  }

  /// This rank's share of a validation: its metric totals over its shard (evaluate_batch) or, with
  /// evaluate_full_dataset, the chief's metrics over the whole set (taken as they are).
  RankShare evaluate() {
    RankShare mine;
    if constexpr (DeclaresEvaluateBatch<TrialT>) {
      callbacks_.template call<hook::on_validation_epoch_start>();
      ValidationReduction reduction(evaluation_reducer());
      std::vector<Metrics> outputs;
      std::int64_t batch_idx = 0;
      CopyAhead batches(validation_loader_->batches(validation_chain()), context_.device());
      while (batches.has_next()) {
        validation_batch_t<TrialT> batch = batches.take();
        mine.records += record_count(batch);
        Metrics m = in_precision([&]() -> decltype(auto) { return call_evaluate_batch(trial_, batch, model_, batch_idx); });
        reduction.add(m, batch_idx);
        if constexpr (Set::wants_validation_outputs) outputs.push_back(std::move(m));
        outputs_.reporter().update(++batch_idx);
        if (options_.test_mode) break;
        batches.stage();  // the next batch copies while the device evaluates this one
      }
      callbacks_.template call<hook::on_validation_epoch_end>(std::span<const Metrics>(outputs));
      mine.totals = reduction.totals();
      mine.batches = reduction.batches();
    } else if (context_.distributed().is_chief()) {  // the whole dataset on the chief only (Determined's rule)
      const Metrics m = in_precision([&]() -> decltype(auto) { return call_evaluate_full_dataset(trial_, *validation_loader_, model_); });
      for (const auto& e : m) mine.totals.push_back({std::string(e.key.view()), Reducer::sum, e.value.to_double()});
      mine.batches = 1;
    }
    return mine;
  }

  template <class L>
  static std::optional<std::uint64_t> data_seed(const L& loader) {
    if constexpr (requires {
                    { loader.seed() } -> std::convertible_to<std::uint64_t>;
                  })
      return loader.seed();
    else return std::nullopt;
  }
  template <class L>
  static void restore_data_seed(L& loader, const std::optional<std::uint64_t>& seed) {
    if constexpr (requires { loader.set_seed(std::uint64_t{}); })
      if (seed) loader.set_seed(*seed);
  }

  // ---- checkpoints: when, and the callbacks' part (checkpoint/ writes and reads the files) ----

  /// Takes a checkpoint (Determined's layout, crash-safe) and starts writing it, in the background
  /// unless checkpoint_storage.async is off; the last one is finished first (one in flight at most).
  void checkpoint() {
    RECORD_USER_SCOPE("dettrial::checkpoint");
    finish_checkpoint(/*wait=*/true);
    position_.checkpointed();
    agree_on_buffers(context_);
    checkpointer_.begin(
        callbacks_, checkpoint_record(context_, options_, schedule_, position_, result_.last_validation_metrics, data_seed(*train_loader_),
                                      data_seed(*validation_loader_), c10::demangle(typeid(TrialT).name())));
    finish_checkpoint(/*wait=*/false);  // a synchronous write has ended already
  }

  /// Once the checkpoint in flight is durable (`wait`: waiting for it): its hooks, its record and
  /// report line, and retention sparing it. A collective while one is in flight.
  void finish_checkpoint(bool wait) {
    if (const std::optional<WrittenCheckpoint> written = checkpointer_.finish(callbacks_, wait)) {  // on the chief
      result_.checkpoints.push_back(written->info);
      report_checkpoint(*written, checkpointer_, outputs_.reporter());
    }
  }

  /// The largest of `value` over the ranks: what every rank acts on.
  int agreed_max(int value) { return detail::agreed_max(context_.communicator(), value); }

  /**
   * @brief Makes the ranks of a job agree before training (returns the training loader's batches per
   * epoch, `loader_batches` on this rank, as the job takes them): the epoch length is the chief's sharded
   * length (Determined's rule; a rank whose shard is a batch shorter reads on into the next epoch of
   * the endless stream), the data loaders shuffle with the chief's seeds, each rank's own RNG
   * stream (dropout) is derived from the agreed trial seed and its rank, and the fit options that
   * place boundaries must be the same on every rank.
   */
  std::int64_t agree_across_ranks(std::int64_t loader_batches) {
    Communicator* comm = context_.communicator();
    if (!comm) return loader_batches;
    const auto train_seed = data_seed(*train_loader_), validation_seed = data_seed(*validation_loader_);
    const std::vector<std::int64_t> chief =
        comm->broadcast_values({loader_batches, static_cast<std::int64_t>(train_seed.value_or(0)), train_seed ? 1 : 0,
                                static_cast<std::int64_t>(validation_seed.value_or(0)), validation_seed ? 1 : 0});
    if (chief[2]) restore_data_seed(*train_loader_, static_cast<std::uint64_t>(chief[1]));
    if (chief[4]) restore_data_seed(*validation_loader_, static_cast<std::uint64_t>(chief[3]));
    schedule_.require_same_on_every_rank(*comm, context_, options_, position_.first_batch());
    ContextAccess::seed_rank_stream(context_);
    return chief[0];
  }

  /**
   * @brief Restores a checkpoint: models (names and shapes checked), optimizers, schedulers, pending
   * gradients, RNGs, callbacks, and where the trial stands (`progress`).
   */
  void restore(const std::filesystem::path& dir, const TrialProgress& progress) {
    outputs_.warn_missing_callback_states(checkpointer_.restore(dir, callbacks_, options_.resume_fresh_parts));
    restore_data_seed(*train_loader_, progress.training_data_seed);
    restore_data_seed(*validation_loader_, progress.validation_data_seed);
    position_.restored(progress);
  }

  /// A copy whose tensors are detached from the graph and on the CPU (kept for callbacks).
  static Metrics detached(const Metrics& m) {
    Metrics out;
    for (const auto& e : m) out.set(e.key, e.value.is_tensor() ? MetricValue(e.value.tensor().detach().cpu()) : e.value);
    return out;
  }

  /// The training loader's chain: endless, this rank's shard (of the global batches of the rank
  /// count the run began on), skipping what was trained.
  LoaderChain training_chain() const {
    return LoaderChain{.repeat = true,
                       .skip = context_.get_initial_batch(),
                       .num_replicas = context_.distributed().size,
                       .rank = context_.distributed().rank,
                       .layout_replicas = schedule_.data_ranks()};
  }

  /**
   * @brief The rank count whose global batches the training data follows: the one the resumed run
   * began on, when this job has another and its training loader can keep them (a dettrial
   * DataLoader), else this job's. Checks first that the global batch divides among this job's ranks.
   */
  std::int64_t data_layout() {
    const std::int64_t ranks = context_.distributed().size;
    const std::int64_t began = position_.resumed_data_ranks() > 0 ? position_.resumed_data_ranks() : ranks;
    if (began == ranks) return ranks;
    Schedule::check_global_batch_divides(context_, began);
    if constexpr (requires { training_loader_t<TrialT>::keeps_global_batches; }) {
      (void)train_loader_->layout_sampler(LoaderChain{.repeat = true, .num_replicas = ranks, .layout_replicas = began});  // checks
      return began;
    } else {
      outputs_.reporter().line(
          "warning: the training data loader is not a dettrial::DataLoader, so it cannot keep the global batches of the " +
          std::to_string(began) + "-rank job this run began as: from batch " + std::to_string(position_.first_batch()) +
          " on, it reads its own " + std::to_string(ranks) + "-rank shards");
      return ranks;
    }
  }
  /// The validation loader's chain: one pass over this rank's shard.
  LoaderChain validation_chain() const {
    return LoaderChain{.repeat = false, .skip = 0, .num_replicas = context_.distributed().size, .rank = context_.distributed().rank};
  }
  /// Batches per epoch on this rank: the loader's sharded length when it knows one.
  template <class L>
  static std::int64_t epoch_length(const L& loader, const LoaderChain& chain) {
    if constexpr (requires {
                    { loader.batches_for(chain) } -> std::convertible_to<std::int64_t>;
                  }) {
      return static_cast<std::int64_t>(loader.batches_for(chain));
    } else {  // Determined's DistributedBatchSampler length: len // n + (len % n > rank)
      const auto len = static_cast<std::int64_t>(loader.size());
      return len / chain.num_replicas + (len % chain.num_replicas > chain.rank ? 1 : 0);
    }
  }

  ReducerChoice evaluation_reducer() {
    if constexpr (requires(TrialT& t) { ReducerChoice(t.evaluation_reducer()); }) return ReducerChoice(trial_.evaluation_reducer());
    else return Reducer::avg;
  }

  template <class B>
  std::int64_t record_count(const B& batch) {
    if constexpr (requires(TrialT& t) {
                    { t.get_batch_length(batch) } -> std::convertible_to<std::int64_t>;
                  })
      return trial_.get_batch_length(batch);
    else return batch_length(batch);
  }

  /// Runs a trial hook under autocast when the context's precision asks for it (no cost at fp32).
  template <class F>
  decltype(auto) in_precision(F&& hook) {
    if (const std::optional<at::ScalarType> dtype = context_.autocast_dtype()) {
      AutocastGuard autocast(context_.device().type(), dtype);
      return std::forward<F>(hook)();
    }
    return std::forward<F>(hook)();
  }

  Context& context_;
  TrialT& trial_;
  Model& model_;
  OptimizerHolder& optimizer_;
  Set& callbacks_;
  FitOptions options_{};
  Schedule schedule_{};
  Position position_{};
  /// Declared before the checkpointer: the run folder's lock outlives a write in flight.
  Outputs outputs_{};
  Checkpointer checkpointer_{};
  /// What fit returns, filled in as it goes.
  FitResult result_{};
  std::optional<training_loader_t<TrialT>> train_loader_;
  std::optional<validation_loader_t<TrialT>> validation_loader_;
  /// The captured training step (capture::cuda_graph).
  StepGraph<training_batch_t<TrialT>> step_graph_;
};

}  // namespace dettrial::detail
