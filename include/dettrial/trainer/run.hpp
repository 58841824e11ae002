// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Run<TrialT, Set>: one fit of a valid trial, Determined's loop generated for it
/// (workloads ending at any boundary, validation, checkpoints, reports, the final validation).
/// Trainer<TrialT> builds the trial and makes a Run for each fit; what does not depend on the trial
/// type is detail::RunState's (run_state.hpp).
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
#include "run_state.hpp"
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
 * the concepts): the trial's loaders, the captured step and the fit's RunState as members, and the
 * loop that calls the trial's hooks and the callbacks in `Set` between RunState's steps.
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
    st_ = RunState::begin(context_, std::move(options));
    const auto release = on_scope_exit([&] { st_.release(); });
    // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
    std::size_t started = 0;
    const auto shutdown = on_scope_exit([&] { shut_down(callbacks_, started); });
    const std::int64_t first_batch = st_.first_batch();
    const std::string resume_uuid = st_.resume_dir ? st_.resume_dir->filename().string() : std::string();
    callbacks_.each([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if constexpr (hook::on_trial_startup::callable<C>) hook::on_trial_startup::call(cb, first_batch, resume_uuid);
      ++started;
    });
    prepare_training();
    // The graph is made anew in each fit (a resumed run warms up and captures again) and freed after it.
    if (const auto* graph = std::get_if<capture::cuda_graph>(&st_.options.step_capture)) step_graph_.start(*graph, context_);
    const auto free_graph = on_scope_exit([&] { step_graph_.reset(); });
    st_.announce(context_);
    if constexpr (requires { train_loader_->describe(); }) st_.reporter.line("dettrial: training data: " + train_loader_->describe());
    RunState::start_tensorboard_session(context_);
    // The hparams session ends as the fit does: failed when it throws.
    const auto end_session = on_scope_exit([&, exceptions = std::uncaught_exceptions()] {
      RunState::end_tensorboard_session(context_, std::uncaught_exceptions() == exceptions);
    });
    const StopSignals signals(st_.options.handle_signals);
    callbacks_.template call<hook::on_training_start>();
    if (st_.options.step_zero_validation && st_.progress.batches_trained == 0 && st_.progress.last_validation < 0) validate();
    train();
    st_.finish_profiling();
    if (!st_.result.stop_requested) {
      if (st_.progress.last_validation != st_.progress.batches_trained) validate();
      checkpoint_unless_current();
      finish_checkpoint(/*wait=*/true);
      st_.complete(context_);
    }
    return st_.finish(context_);
  }

 private:
  /// Builds the data loaders, makes the ranks agree, restores the checkpoint and sets the counters.
  void prepare_training() {
    train_loader_.emplace(trial_.build_training_data_loader());
    validation_loader_.emplace(trial_.build_validation_data_loader());
    st_.data_ranks = data_layout();
    st_.epoch_len = epoch_length(*train_loader_, training_chain());
    agree_across_ranks();
    st_.settle_epoch_length(context_);
    if (st_.resume_dir) restore(*st_.resume_dir, st_.same_trial ? *st_.resumed : TrialProgress{.trial_id = st_.options.trial_id});
    st_.check_rank_invariant_boundaries(context_);
    st_.start_position(context_);
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
    while (st_.remaining() > 0) {
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
    st_.begin_workload(context_, workload);
    for (;;) {
      const std::int64_t batch_idx = st_.progress.batches_trained, epoch_idx = batch_idx / st_.epoch_len;
      const bool epoch_start = batch_idx % st_.epoch_len == 0, epoch_end = batch_idx % st_.epoch_len == st_.epoch_len - 1;
      detail::ContextAccess::position(context_).current_batch = batch_idx;
      if (epoch_start) callbacks_.template call<hook::on_training_epoch_start>(epoch_idx);
      if (!batches.has_next()) training_stream_ended(batch_idx);
      st_.profiler.before_batch(batch_idx);
      // Synchronized timings only inside the profiled range: a sync a batch elsewhere would cost the GPU its queue.
      train_batch(batches.take(), workload, batch_idx, epoch_idx, st_.sync_timings && st_.profiler.running());
      ++st_.progress.batches_trained;
      if (st_.profiler.after_batch(batch_idx)) st_.report_profile();
      if (epoch_end) {
        callbacks_.template call<hook::on_training_epoch_end>(epoch_idx);
        ++st_.progress.epochs_trained;
      }
      st_.reporter.update(st_.progress.batches_trained);
      const Reached reached = st_.boundaries_after(batch_idx, epoch_idx, epoch_end);
      if (reached.any()) return reached;
      // One process stops at any batch (with rank_invariant, at an update's last); a job only at
      // boundaries, where its ranks agree.
      if (!context_.communicator() && StopSignals::received() != 0 && (!context_.rank_invariant() || context_.is_update_batch()))
        return reached;
      // The next batch is trained right away: its copy to the device starts while the device still
      // computes this one. Not across a boundary or an epoch's start, so the data is read in the same
      // order relative to checkpoints and callbacks as without it; nor into a profiled range, whose
      // trace shows each of its batches' reads.
      if (!epoch_end && !st_.profiler.starts_at(batch_idx + 1)) batches.stage();
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
    detail::ContextAccess::begin_training_batch(context_, records);
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
        st_.note_capture(batch_idx);
      } else {
        st_.note_eager_batch(batch_idx);
        step_graph_.before_eager_batch();
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      }
    }
    detail::ContextAccess::finish_batch(context_, batch_idx);
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
      if (kind == Kind::validation && st_.progress.last_validation != st_.progress.batches_trained) validate();
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
    st_.stopped(signal);
  }

  void checkpoint_unless_current() {
    if (st_.progress.last_checkpoint != st_.progress.batches_trained) checkpoint();
  }

  // ---- reports and validation -----------------------------------------------------------------

  void report_training(const Workload& workload) {
    const MetricValues& metrics = st_.report_training(context_, workload);
    callbacks_.template call<hook::on_training_workload_end>(metrics, std::span<const Metrics>(workload.batch_metrics));
  }

  void validate() {
    RECORD_USER_SCOPE("dettrial::validate");
    torch::NoGradGuard no_grad;
    RunState::begin_validation(context_);
    callbacks_.template call<hook::on_validation_start>();
    st_.reporter.begin("validate", 0, epoch_length(*validation_loader_, validation_chain()), "batches");
    std::int64_t records = 0;
    const MetricValues metrics = st_.reduce_validation(context_, evaluate(), records);
    callbacks_.template call<hook::on_validation_end>(metrics);
    const MetricValues& reported = st_.finish_validation(context_, metrics, records);
    if (st_.checkpoint_after_validation(context_, reported)) checkpoint_unless_current();
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
        st_.reporter.update(++batch_idx);
        if (st_.options.test_mode) break;
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
    st_.progress.last_checkpoint = st_.progress.batches_trained;
    agree_on_buffers(context_);
    st_.checkpointer.begin(callbacks_, st_.checkpoint_record(context_, data_seed(*train_loader_), data_seed(*validation_loader_),
                                                             c10::demangle(typeid(TrialT).name())));
    finish_checkpoint(/*wait=*/false);  // a synchronous write has ended already
  }

  /// Once the checkpoint in flight is durable (`wait`: waiting for it): its hooks, its record and
  /// report line, and retention sparing it. A collective while one is in flight.
  void finish_checkpoint(bool wait) {
    if (const std::optional<WrittenCheckpoint> written = st_.checkpointer.finish(callbacks_, wait))
      st_.checkpoint_written(*written);  // on the chief
  }

  /// The largest of `value` over the ranks: what every rank acts on.
  int agreed_max(int value) { return detail::agreed_max(context_.communicator(), value); }

  /**
   * @brief Makes the ranks of a job agree before training: the epoch length is the chief's sharded
   * length (Determined's rule; a rank whose shard is a batch shorter reads on into the next epoch of
   * the endless stream), the data loaders shuffle with the chief's seeds, each rank's own RNG
   * stream (dropout) is derived from the agreed trial seed and its rank, and the fit options that
   * place boundaries must be the same on every rank.
   */
  void agree_across_ranks() {
    Communicator* comm = context_.communicator();
    if (!comm) return;
    const auto train_seed = data_seed(*train_loader_), validation_seed = data_seed(*validation_loader_);
    const std::vector<std::int64_t> chief =
        comm->broadcast_values({st_.epoch_len, static_cast<std::int64_t>(train_seed.value_or(0)), train_seed ? 1 : 0,
                                static_cast<std::int64_t>(validation_seed.value_or(0)), validation_seed ? 1 : 0});
    st_.epoch_len = chief[0];
    if (chief[2]) restore_data_seed(*train_loader_, static_cast<std::uint64_t>(chief[1]));
    if (chief[4]) restore_data_seed(*validation_loader_, static_cast<std::uint64_t>(chief[3]));
    st_.require_same_settings(*comm, context_);
    detail::ContextAccess::seed_rank_stream(context_);
  }

  /**
   * @brief Restores a checkpoint: models (names and shapes checked), optimizers, schedulers, pending
   * gradients, RNGs, callbacks, and where the trial stands (`progress`).
   */
  void restore(const std::filesystem::path& dir, const TrialProgress& progress) {
    st_.warn_missing_callback_states(st_.checkpointer.restore(dir, callbacks_, st_.options.resume_fresh_parts));
    restore_data_seed(*train_loader_, progress.training_data_seed);
    restore_data_seed(*validation_loader_, progress.validation_data_seed);
    st_.progress = progress;
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
                       .layout_replicas = st_.data_ranks};
  }

  /**
   * @brief The rank count whose global batches the training data follows: the one the resumed run
   * began on, when this job has another and its training loader can keep them (a dettrial
   * DataLoader), else this job's. Checks first that the global batch divides among this job's ranks.
   */
  std::int64_t data_layout() {
    const std::int64_t ranks = context_.distributed().size;
    const std::int64_t began = st_.same_trial && st_.resumed->data_ranks > 0 ? st_.resumed->data_ranks : ranks;
    if (began == ranks) return ranks;
    RunState::check_global_batch_divides(context_, began);
    if constexpr (requires { training_loader_t<TrialT>::keeps_global_batches; }) {
      (void)train_loader_->layout_sampler(LoaderChain{.repeat = true, .num_replicas = ranks, .layout_replicas = began});  // checks
      return began;
    } else {
      st_.reporter.line("warning: the training data loader is not a dettrial::DataLoader, so it cannot keep the global batches of the " +
                        std::to_string(began) + "-rank job this run began as: from batch " + std::to_string(st_.resumed->batches_trained) +
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
  RunState st_{};
  std::optional<training_loader_t<TrialT>> train_loader_;
  std::optional<validation_loader_t<TrialT>> validation_loader_;
  /// The captured training step (capture::cuda_graph).
  StepGraph<training_batch_t<TrialT>> step_graph_;
};

}  // namespace dettrial::detail
