// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::BatchLoop<TrialT, Set>: the trial's half of one fit, generated for it: the batch loop
/// (train_batch eagerly or as the captured step, backward, the optimizer step), validation's
/// evaluate_batch, the trial's loaders and the callbacks. Trainer<TrialT> builds the trial and
/// makes a Run for each fit. The loop by boundary (trainer/fit_loop.hpp) and everything else that
/// does not depend on the trial type is compiled once.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <cstddef>
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

#include "../../checkpoint/detail/checkpointer.hpp"
#include "../../checkpoint/detail/trial_checkpoint.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../data/detail/copy_ahead.hpp"
#include "../../distributed/detail/metrics.hpp"
#include "../../error.hpp"
#include "../../detail/signals.hpp"
#include "../../vocabulary/data.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../../metrics/reducers.hpp"
#include "../../report/detail/reporter.hpp"
#include "../../vocabulary/trial.hpp"
#include "after_update.hpp"
#include "callback_set.hpp"
#include "fit_loop.hpp"
#include "fit_steps.hpp"
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
 * @brief The trial's half of one fit (only Trainer<TrialT> makes one, and only for a trial that
 * meets the concepts): the batch loop that calls train_batch (eagerly or as the captured step),
 * evaluate_batch, the trial's loaders and the per-epoch hooks of the callbacks in `Set`. The loop
 * by boundary, and every step that does not depend on the trial's type, is its base, FitLoop
 * (compiled once), which calls the overrides below once per fit, workload, validation or
 * checkpoint, and the callbacks' other hooks through erase_callbacks(set).
 */
template <class TrialT, class Set>
class BatchLoop final : public FitLoop {
  static constexpr bool declarative = DeclaresModel<TrialT>;

 public:
  using Model = std::conditional_t<declarative, model_t<TrialT>, missing>;
  using OptimizerHolder = std::conditional_t<declarative, optimizer_result_t<TrialT>, missing>;

  /// A declarative trial's model and optimizer holder; `missing` objects for the others.
  BatchLoop(TrainerKey key, Context& context, TrialT& trial, Model& model, OptimizerHolder& optimizer, Set& callbacks)
      : FitLoop(key, context,
                TrialTypeInfo{.trial_type = c10::demangle(typeid(TrialT).name()),
                              .training_batch_type = c10::demangle(typeid(training_batch_t<TrialT>).name()),
                              .training_batch_tensors_only = tensors_only_batch<training_batch_t<TrialT>>(),
                              .epochs_follow_records_per_epoch = epochs_follow_records_per_epoch()},
                erase_callbacks(callbacks)),
        trial_(trial),
        model_(model),
        optimizer_(optimizer),
        callback_set_(callbacks) {}

 private:
  static constexpr bool epochs_follow_records_per_epoch() {
    if constexpr (requires { TrialT::epochs_follow_records_per_epoch; }) return TrialT::epochs_follow_records_per_epoch;
    else return false;
  }

  // ---- the loaders ---------------------------------------------------------------------------

  void build_loaders() override {
    train_loader_.emplace(trial_.build_training_data_loader());
    validation_loader_.emplace(trial_.build_validation_data_loader());
  }

  std::int64_t training_epoch_length(const LoaderChain& chain) const override { return epoch_length(*train_loader_, chain); }
  std::int64_t validation_epoch_length(const LoaderChain& chain) const override { return epoch_length(*validation_loader_, chain); }

  std::optional<std::string> describe_training_data() const override {
    if constexpr (requires { train_loader_->describe(); }) return std::string(train_loader_->describe());
    else return std::nullopt;
  }

  LoaderSeeds data_seeds() const override { return {data_seed(*train_loader_), data_seed(*validation_loader_)}; }

  void restore_data_seeds(const LoaderSeeds& seeds) override {
    restore_data_seed(*train_loader_, seeds.training);
    restore_data_seed(*validation_loader_, seeds.validation);
  }

  bool keeps_global_batches([[maybe_unused]] std::int64_t ranks, [[maybe_unused]] std::int64_t began) override {
    if constexpr (requires { training_loader_t<TrialT>::keeps_global_batches; }) {
      (void)train_loader_->layout_sampler(LoaderChain{.repeat = true, .num_replicas = ranks, .layout_replicas = began});  // checks
      return true;
    } else {
      return false;
    }
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

  // ---- the batch loop ------------------------------------------------------------------------

  void open_training_stream() override { training_batches_.emplace(train_loader_->batches(training_chain()), context_.device()); }
  void close_training_stream() noexcept override { training_batches_.reset(); }

  BoundariesReached train_workload(Workload& workload) override { return train_until_boundary(*training_batches_, workload); }

  /// Trains batch after batch until one reaches a boundary (or, in one process, a stop signal arrives).
  template <class Batches>
  BoundariesReached train_until_boundary(Batches& batches, Workload& workload) {
    step_graph_.check_unchanged();
    workload.begin(key_, context_, checkpointer_.take_waited_seconds());
    Reporter& reporter = outputs_.reporter();
    TraceProfiler& profiler = outputs_.profiler();
    reporter.begin("train", position_.batches_trained(), schedule_.total_batches(), "batches");
    for (;;) {
      const std::int64_t batch_idx = position_.batches_trained(), epoch_idx = schedule_.epoch_of(batch_idx);
      const bool epoch_start = schedule_.starts_epoch(batch_idx), epoch_end = schedule_.ends_epoch(batch_idx);
      ContextAccess::position(key_, context_).current_batch = batch_idx;
      if (epoch_start) callback_set_.template call<hook::on_training_epoch_start>(epoch_idx);
      if (!batches.has_next()) training_stream_ended(batch_idx);
      profiler.before_batch(batch_idx);
      // Synchronized timings only inside the profiled range: a sync a batch elsewhere would cost the GPU its queue.
      train_batch(batches.take(), workload, batch_idx, epoch_idx, outputs_.sync_timings());
      position_.batch_trained();
      if (profiler.after_batch(batch_idx)) outputs_.report_profile();
      if (outputs_.system_metrics_ready()) outputs_.report_system_metrics(position_.batches_trained(), position_.epochs_trained());
      if (epoch_end) {
        callback_set_.template call<hook::on_training_epoch_end>(epoch_idx);
        position_.epoch_trained();
      }
      reporter.update(position_.batches_trained());
      const BoundariesReached reached = schedule_.boundaries_after(batch_idx, epoch_idx, epoch_end);
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
    ContextAccess::begin_training_batch(key_, context_, records);
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
    ContextAccess::finish_batch(key_, context_);
    if (context_.is_update_batch()) step_after_update(key_, context_, schedule_, batch_idx);
    workload.means.add(metrics, batch_idx);
    if constexpr (Set::wants_batch_metrics) workload.batch_metrics.push_back(detached(metrics));
  }

  // ---- validation ----------------------------------------------------------------------------

  /// This rank's share of a validation: its metric totals over its shard (evaluate_batch) or, with
  /// evaluate_full_dataset, the chief's metrics over the whole set (taken as they are).
  RankShare evaluate() override {
    RankShare mine;
    if constexpr (DeclaresEvaluateBatch<TrialT>) {
      callback_set_.template call<hook::on_validation_epoch_start>();
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
      callback_set_.template call<hook::on_validation_epoch_end>(std::span<const Metrics>(outputs));
      mine.totals = reduction.totals();
      mine.batches = reduction.batches();
    } else if (context_.distributed().is_chief()) {  // the whole dataset on the chief only (Determined's rule)
      const Metrics m = in_precision([&]() -> decltype(auto) { return call_evaluate_full_dataset(trial_, *validation_loader_, model_); });
      for (const auto& e : m) mine.totals.push_back({std::string(e.key.view()), Reducer::sum, e.value.to_double()});
      mine.batches = 1;
    }
    return mine;
  }

  /// A copy whose tensors are detached from the graph and on the CPU (kept for callbacks).
  static Metrics detached(const Metrics& m) {
    Metrics out;
    for (const auto& e : m) out.set(e.key, e.value.is_tensor() ? MetricValue(e.value.tensor().detach().cpu()) : e.value);
    return out;
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

  // ---- the captured step ---------------------------------------------------------------------

  void start_step_graph(const capture::cuda_graph& options) override { step_graph_.start(options, context_); }
  void free_step_graph() noexcept override { step_graph_.reset(); }

  TrialT& trial_;
  Model& model_;
  OptimizerHolder& optimizer_;
  Set& callback_set_;
  std::optional<training_loader_t<TrialT>> train_loader_;
  std::optional<validation_loader_t<TrialT>> validation_loader_;
  /// The training loader's endless stream, its next batch copied ahead (open during train()).
  using TrainingStream = std::remove_cvref_t<decltype(std::declval<training_loader_t<TrialT>&>().batches(std::declval<LoaderChain>()))>;
  std::optional<CopyAhead<TrainingStream>> training_batches_;
  /// The captured training step (capture::cuda_graph).
  StepGraph<training_batch_t<TrialT>> step_graph_;
};

}  // namespace dettrial::detail
