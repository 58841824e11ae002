// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::Trainer<TrialT>: checks a trial at compile time and runs Determined's training
/// loop for it, generated inline.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include "../layout.hpp"
#include "../checkpoint/checkpoint.hpp"
#include "../checkpoint/checkpointer.hpp"
#include "../checkpoint/policy.hpp"
#include "../checkpoint/trial_checkpoint.hpp"
#include "../context/context.hpp"
#include "../data/copy_ahead.hpp"
#include "../distributed/agreement.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/metrics.hpp"
#include "../error.hpp"
#include "../detail/scope_exit.hpp"
#include "../detail/yaml.hpp"
#include "../version.hpp"
#include "../vocabulary/metrics.hpp"
#include "../metrics/reducers.hpp"
#include "../report/html_report.hpp"
#include "../report/profiler.hpp"
#include "../report/reporter.hpp"
#include "../report/runtime.hpp"
#include "../vocabulary/trial.hpp"
#include "../keras/keras.hpp"
#include "callbacks.hpp"
#include "fit_options.hpp"
#include "step_graph.hpp"
#include "../detail/signals.hpp"
#include "../config/units.hpp"

namespace dettrial {

namespace detail {
/// Dereferences a smart pointer, or returns the object itself.
template <class O>
decltype(auto) deref(O& o) {
  if constexpr (TorchOptimizer<O>) return (o);
  else return (*o);
}
}  // namespace detail

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

  template <class X>
  using if_ok = std::conditional_t<trial_ok, X, detail::missing>;
  using Model = std::conditional_t<trial_ok && declarative, model_t<TrialT>, detail::missing>;
  using OptimizerHolder = std::conditional_t<trial_ok && declarative, optimizer_result_t<TrialT>, detail::missing>;
  using SchedulerResult = std::conditional_t<trial_ok && declarative, scheduler_result_t<TrialT>, detail::missing>;
  using TrainLoader = if_ok<training_loader_t<TrialT>>;
  using ValidationLoader = if_ok<validation_loader_t<TrialT>>;

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
    if (context_.has_registrations())
      throw TrialError("this context already serves a trainer; give each Trainer its own dettrial::Context");
    if constexpr (trial_ok) {
      // If building fails half-way, the context must not keep pointers into the half-built trial.
      auto release = detail::on_scope_exit([this] { context_.release_registrations(); });
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
  ~Trainer() { context_.release_registrations(); }

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
      return run(std::move(options), set);
    }
  }

 private:
  /// Which boundaries the last batch of a workload reached (Determined handles them in this order).
  struct Reached {
    bool length = false;
    bool validation = false;
    bool checkpoint = false;
    bool report = false;
  };

  /// One fit: its options with every period in batches, where it stands, and what it reports.
  struct RunState {
    FitOptions options;
    TrainUnit length = Batch(1);
    std::int64_t epoch_len = 0;
    /// The training loader's own batches per epoch on this rank (epoch_len, unless records_per_epoch sets it).
    std::int64_t data_epoch_len = 0;
    /// Where the trial stands: batches and epochs trained, the last validation and checkpoint, the
    /// best searcher metric (what a checkpoint saves as `trial_state.json`; its data seeds are filled
    /// in when it is saved).
    TrialProgress progress{};
    bool warned_best_without_metric = false;
    /// Where checkpoints go, when, and how they are written, restored and retained.
    detail::Checkpointer checkpointer{};
    /// The checkpoint resumed from, and where it says the trial stood.
    std::optional<std::filesystem::path> resume_dir{};
    std::optional<TrialProgress> resumed{};
    bool same_trial = false;
    FitResult result{};
    detail::Reporter reporter{};
    detail::TraceProfiler profiler{};
    /// Wait for the GPU at each phase's end while profiling, so that the phase timings are the GPU's (profiling.sync_timings).
    bool sync_timings = false;
    /// Whether the first eager batch after a capture was announced.
    bool eager_batch_announced = false;
  };

  /// What a training workload accumulates; kept across workloads so that a batch allocates nothing.
  struct Workload {
    detail::WorkloadMeans means;
    std::vector<Metrics> batch_metrics{};  // kept only when a callback asks for them
    std::int64_t records = 0;
    detail::PhaseTimes phases{};
    /// The end of the last timed phase.
    std::chrono::steady_clock::time_point mark{};
  };

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
  static std::filesystem::path default_output_dir() {
    const std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    return std::filesystem::path("runs") / (std::string(stamp) + "-" + std::to_string(::getpid()));
  }

 private:
  // ---- a fit from start to end ----------------------------------------------------------------

  template <class Set>
  FitResult run(FitOptions options, Set& callbacks) {
    RunState st = begin_run(std::move(options));
    // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
    std::size_t started = 0;
    const auto shutdown = detail::on_scope_exit([&] { shut_down(callbacks, started); });
    const std::int64_t first_batch = st.same_trial ? st.resumed->batches_trained : 0;
    const std::string resume_uuid = st.resume_dir ? st.resume_dir->filename().string() : std::string();
    callbacks.each([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if constexpr (hook::on_trial_startup::callable<C>) hook::on_trial_startup::call(cb, first_batch, resume_uuid);
      ++started;
    });
    prepare_training(st, callbacks, first_batch);
    // The graph is made anew in each fit (a resumed run warms up and captures again) and freed after it.
    if (const auto* graph = std::get_if<capture::cuda_graph>(&st.options.step_capture)) step_graph_.start(*graph, context_);
    const auto free_graph = detail::on_scope_exit([&] { step_graph_.reset(); });
    announce(st);
    // One hparams session a folder: a resumed run's folder already starts one.
    if (!context_.get_tensorboard_writer().has_session())
      context_.get_tensorboard_writer().add_hparams(detail::flat_hparams(context_.get_hparams()));
    // The hparams session ends as the fit does: failed when it throws.
    const auto end_session = detail::on_scope_exit([&, exceptions = std::uncaught_exceptions()] {
      context_.get_tensorboard_writer().end_session(std::uncaught_exceptions() == exceptions);
      context_.get_tensorboard_writer().flush();
    });
    const detail::StopSignals signals(st.options.handle_signals);
    callbacks.template call<hook::on_training_start>();
    if (st.options.step_zero_validation && st.progress.batches_trained == 0 && st.progress.last_validation < 0) validate(st, callbacks);
    train(st, callbacks);
    finish_profiling(st);
    if (!st.result.stop_requested) {
      if (st.progress.last_validation != st.progress.batches_trained) validate(st, callbacks);
      checkpoint_unless_current(st, callbacks);
      // The trial is complete: retention applies without sparing the newest.
      if (context_.distributed().is_chief()) st.checkpointer.apply_retention({});
    }
    st.result.batches_trained = st.progress.batches_trained;
    st.result.epochs_trained = st.progress.epochs_trained;
    write_report(st);
    return std::move(st.result);
  }

  /// The run's report.html, from its metrics.jsonl (on the chief). A report that cannot be written
  /// is a warning: the training it describes is done and saved.
  void write_report(RunState& st) {
    if (!context_.distributed().is_chief()) return;
    try {
      const auto path = write_run_report(st.options.output_dir);
      st.reporter.line("dettrial: report " + path.string());
    } catch (const std::exception& e) {
      st.reporter.line(std::string("dettrial: warning: no report.html: ") + e.what());
    }
  }

  /// Checks the options, finds (and checks) the checkpoint to resume from before anything is
  /// written, and sets up the output folder, checkpoint storage and reporter.
  RunState begin_run(FitOptions options) {
    RunState st{.options = std::move(options)};
    FitOptions& o = st.options;
    detail::check_step_capture<training_batch_t<TrialT>>(o.step_capture, context_);
    st.length = resolve_length(o);
    o.validation_period = resolve_period(o.validation_period);
    o.checkpoint_period = resolve_period(o.checkpoint_period);
    o.reporting_period = resolve_period(o.reporting_period);
    if (o.retention.save_trial_best < 0 || o.retention.save_trial_latest < 0)
      throw ConfigError("checkpoint retention counts (save_trial_best, save_trial_latest) must not be negative");
    if (o.latest_checkpoint) {
      st.resume_dir = resolve_checkpoint(*o.latest_checkpoint);
      read_checkpoint_info(*st.resume_dir);
      st.resumed = TrialProgress::from_json(*st.resume_dir / layout::trial_state);
      st.same_trial = st.resumed->trial_id == o.trial_id;
    }
    if (o.output_dir.empty()) o.output_dir = default_output_dir();
    st.result.output_dir = o.output_dir;
    context_.position().output_dir = o.output_dir;
    const std::filesystem::path storage = o.checkpoint_dir.empty() ? o.output_dir / layout::checkpoints : o.checkpoint_dir;
    st.result.checkpoint_dir = storage;
    // One writer per job: the chief reports and writes metrics.jsonl, event files and checkpoints.
    const bool chief = context_.distributed().is_chief();
    const std::optional<std::int64_t> resumed_at = st.same_trial ? std::optional(st.resumed->batches_trained) : std::nullopt;
    if (chief) context_.get_tensorboard_writer() = TensorBoardWriter(context_.get_tensorboard_path(), resumed_at);
    st.reporter = detail::Reporter(chief, o.report, o.output_dir, resumed_at,
                                   context_.get_enable_tensorboard_logging() ? &context_.get_tensorboard_writer() : nullptr);
    if (const auto& profiler = context_.profiler_options()) {
      // set_profiler: steps count from this fit's first batch; every rank writes each cycle's trace
      // into the run's TensorBoard folder under its own worker name (host and process).
      st.profiler = detail::TraceProfiler(*profiler, resumed_at.value_or(0), {o.output_dir / layout::tensorboard, /*one_a_cycle=*/true},
                                          context_.device().is_cuda());
      st.sync_timings = o.profiling.sync_timings && context_.device().is_cuda();
    } else if (o.profiling.enabled) {
      // Every rank profiles its own process: the chief into trace.json, rank r into trace.rank<r>.json.
      const int rank = context_.distributed().rank;
      st.profiler = detail::TraceProfiler::for_section(
          o.profiling, o.output_dir / (rank == 0 ? std::string("trace.json") : "trace.rank" + std::to_string(rank) + ".json"),
          context_.device().is_cuda());
      st.sync_timings = o.profiling.sync_timings && context_.device().is_cuda();
    }
    st.checkpointer = detail::Checkpointer(context_, storage, o.checkpoint_policy, o.retention, o.smaller_is_better);
    return st;
  }

  /// Builds the data loaders, makes the ranks agree, restores the checkpoint and sets the counters.
  template <class Set>
  void prepare_training(RunState& st, Set& callbacks, std::int64_t first_batch) {
    train_loader_.emplace(trial_->build_training_data_loader());
    validation_loader_.emplace(trial_->build_validation_data_loader());
    st.epoch_len = epoch_length(*train_loader_, training_chain());
    agree_across_ranks(st, first_batch);
    if (st.epoch_len < 1) throw DataError("the training data loader yields no batches (its size() is 0)");
    st.data_epoch_len = st.epoch_len;
    // Determined's records_per_epoch: the epoch of epoch-based lengths, periods, LR steps and epoch
    // hooks, in global batches (its legacy sequencer's records_per_epoch // global_batch_size, at
    // least 1), whatever the loader's own length; the data still reshuffles at its own epochs.
    if (const std::int64_t records = context_.get_experiment_config().records_per_epoch; records > 0)
      st.epoch_len = std::max<std::int64_t>(records / context_.get_global_batch_size(), 1);
    detail::RunPosition& position = context_.position();
    position.epoch_len = st.epoch_len;
    if (st.resume_dir) restore(st, *st.resume_dir, st.same_trial ? *st.resumed : TrialProgress{.trial_id = st.options.trial_id}, callbacks);
    position.initial_batch = st.progress.batches_trained;  // the training stream skips what was trained
    position.current_batch = st.progress.batches_trained;
    st.result.resumed_from_batch = st.progress.batches_trained;
    if (Communicator* comm = context_.communicator())
      detail::broadcast_modules(*comm, context_.models());  // every rank starts from rank 0's weights
  }

  /// Writes the trace when training ended (or stopped) inside the profiled range.
  void finish_profiling(RunState& st) {
    if (st.profiler.finish(st.progress.batches_trained - 1)) st.reporter.line("dettrial: " + st.profiler.summary());
  }

  /// The run's first lines: the runtime, the trial, the job, the checkpoint resumed from.
  void announce(RunState& st) {
    const FitOptions& o = st.options;
    st.reporter.line("dettrial " DETTRIAL_VERSION_STRING ": " +
                     detail::runtime_summary(context_.threads().source, context_.thread_pools().text()));
    st.reporter.line("dettrial: trial seed " + std::to_string(context_.get_trial_seed()) + ", device " + context_.device().str() +
                     ", training " + st.length.to_string() + " (an epoch is " + std::to_string(st.epoch_len) + " batches), output " +
                     o.output_dir.string());
    if (const Communicator* comm = context_.communicator())
      st.reporter.line("dettrial: " + std::to_string(comm->size()) + " processes (" + launcher_name(comm->environment().launcher) + ", " +
                       comm->backend_name() + "), rendezvous at " + comm->environment().master_addr + ":" +
                       std::to_string(comm->environment().master_port) + ", global batch " +
                       std::to_string(context_.get_global_batch_size()));
    if (st.resume_dir)
      st.reporter.line("dettrial: resumed from " + st.resume_dir->string() +
                       (st.same_trial ? " at batch " + std::to_string(st.progress.batches_trained)
                                      : std::string(" (another trial's checkpoint: weights and optimizer state only)")));
    if (const auto* graph = std::get_if<capture::cuda_graph>(&o.step_capture))
      st.reporter.line("dettrial: the training step is captured in a CUDA graph after " + std::to_string(graph->warmup_batches) +
                       " eager batch(es), and replayed; batches of other shapes run eagerly");
    if (const auto& profiler = context_.profiler_options()) {
      const ProfilerSchedule& s = profiler->schedule;
      st.reporter.line("dettrial: profiling on set_profiler's schedule (skip_first " + std::to_string(s.skip_first) + ", wait " +
                       std::to_string(s.wait) + ", warmup " + std::to_string(s.warmup) + ", active " + std::to_string(s.active) +
                       ", repeat " + std::to_string(s.repeat) + ", from batch " + std::to_string(st.progress.batches_trained) +
                       "); each cycle's trace in " + (o.output_dir / layout::tensorboard).string() +
                       (o.profiling.enabled ? " (the config's profiling section is not used)" : ""));
    } else if (o.profiling.enabled)
      st.reporter.line("dettrial: profiling batches " + std::to_string(o.profiling.begin_on_batch) + " to " +
                       (o.profiling.end_after_batch ? std::to_string(*o.profiling.end_after_batch) : std::string("the end of training")) +
                       " with LibTorch's profiler" + (st.sync_timings ? ", timings synchronized with the GPU" : "") + "; trace in " +
                       o.output_dir.string());
    if (const std::int64_t records = context_.get_experiment_config().records_per_epoch; records > 0)
      st.reporter.line("dettrial: records_per_epoch " + std::to_string(records) + " sets the epoch: " + std::to_string(st.epoch_len) +
                       " batches of " + std::to_string(context_.get_global_batch_size()) +
                       " records (the training data loader's own epoch is " + std::to_string(st.data_epoch_len) + " batches on this rank)");
  }

  /// on_trial_shutdown for the callbacks that started, last first; a failing hook is reported, not thrown.
  template <class Set>
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

  TrainUnit resolve_length(const FitOptions& o) const {
    if (o.test_mode) return Batch(1);
    if (!o.max_length)
      throw ConfigError(
          "fit() needs a training length: set FitOptions::max_length (Batch, Epoch or Record), or "
          "searcher.max_length in the experiment config and build the options with FitOptions::from_config");
    TrainUnit length = *o.max_length;
    if (length.is_schedule()) throw ConfigError("max_length must be a count, not a schedule of points");
    if (length.unit() == Unit::records) length = length.in_batches_if_records(context_.get_global_batch_size());
    if (length.value() < 1) throw ConfigError("max_length is " + length.to_string() + "; training needs a max_length of at least 1");
    return length;
  }
  TrainUnit resolve_period(const TrainUnit& period) const {
    return period.unit() == Unit::records ? period.in_batches_if_records(context_.get_global_batch_size()) : period;
  }

  // ---- the loop: train until a boundary, then handle each boundary reached ------------------

  std::int64_t remaining(const RunState& st) const {
    return st.length.unit() == Unit::epochs ? st.length.value() - st.progress.epochs_trained
                                            : st.length.value() - st.progress.batches_trained;
  }

  template <class Set>
  void train(RunState& st, Set& callbacks) {
    // One endless stream for the whole run (Determined's repeat → shard → skip chain).
    detail::CopyAhead batches(train_loader_->batches(training_chain()), context_.device());
    Workload workload;
    while (remaining(st) > 0) {
      const Reached reached = train_until_boundary(st, batches, workload, callbacks);
      report_training(st, workload, callbacks);
      if (const int signal = agreed_max(detail::StopSignals::received()); signal != 0)
        return stop(st, callbacks, signal,
                    std::string("dettrial: stopped by ") + detail::signal_name(signal) + " after batch " +
                        std::to_string(st.progress.batches_trained) + "; resume from " + st.checkpointer.storage().string());
      if (handle_boundaries(st, reached, callbacks)) return;
    }
  }

  /// Trains batch after batch until one reaches a boundary (or, in one process, a stop signal arrives).
  template <class Set, class Batches>
  Reached train_until_boundary(RunState& st, Batches& batches, Workload& workload, Set& callbacks) {
    step_graph_.check_unchanged();
    for (const auto& m : context_.models()) m->train();
    for (auto& r : context_.reducers())
      if (r.for_training) r.reset(r.object);
    workload.means.reset();
    workload.batch_metrics.clear();
    workload.records = 0;
    workload.phases.reset();
    workload.mark = std::chrono::steady_clock::now();
    st.reporter.begin("train", st.progress.batches_trained,
                      st.length.unit() == Unit::epochs ? st.length.value() * st.epoch_len : st.length.value(), "batches");
    for (;;) {
      const std::int64_t batch_idx = st.progress.batches_trained, epoch_idx = batch_idx / st.epoch_len;
      const bool epoch_start = batch_idx % st.epoch_len == 0, epoch_end = batch_idx % st.epoch_len == st.epoch_len - 1;
      context_.position().current_batch = batch_idx;
      if (epoch_start) callbacks.template call<hook::on_training_epoch_start>(epoch_idx);
      if (!batches.has_next()) throw DataError("the training data loader's repeating stream ended at batch " + std::to_string(batch_idx));
      st.profiler.before_batch(batch_idx);
      // Synchronized timings only inside the profiled range: a sync a batch elsewhere would cost the GPU its queue.
      train_batch<Set>(st, batches.take(), workload, batch_idx, epoch_idx, st.sync_timings && st.profiler.running());
      ++st.progress.batches_trained;
      if (st.profiler.after_batch(batch_idx)) st.reporter.line("dettrial: " + st.profiler.summary());
      if (epoch_end) {
        callbacks.template call<hook::on_training_epoch_end>(epoch_idx);
        ++st.progress.epochs_trained;
      }
      st.reporter.update(st.progress.batches_trained);
      const Reached reached = boundaries_after(st, batch_idx, epoch_idx, epoch_end);
      if (reached.length || reached.validation || reached.checkpoint || reached.report) return reached;
      // One process stops at any batch; a job only at boundaries, where its ranks agree.
      if (!context_.communicator() && detail::StopSignals::received() != 0) return reached;
      // The next batch is trained right away: its copy to the device starts while the device still
      // computes this one. Not across a boundary or an epoch's start, so the data is read in the same
      // order relative to checkpoints and callbacks as without it; nor into a profiled range, whose
      // trace shows each of its batches' reads.
      if (!epoch_end && !st.profiler.starts_at(batch_idx + 1)) batches.stage();
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
      return as_metrics(in_precision(
          [&]() -> decltype(auto) { return detail::call_train_batch(*trial_, batch, model_or_missing(), epoch_idx, batch_idx); }));
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
          context_.step_optimizer(detail::deref(*optimizer_), trial_->gradient_clipping());
        else context_.step_optimizer(detail::deref(*optimizer_));
      }
      lap(workload, workload.phases.optimizer_step, sync_timings);
    }
    return metrics;
  }

  /// One batch: to the device, train_batch, and for a declarative trial backward and step (eagerly,
  /// or as a replay of the captured step); each phase timed, and named for the profiler's trace.
  template <class Set, class Loaded>
  void train_batch(RunState& st, Loaded&& loaded, Workload& workload, std::int64_t batch_idx, std::int64_t epoch_idx, bool sync_timings) {
    training_batch_t<TrialT> batch = std::move(loaded);
    workload.records += record_count(batch);
    Metrics metrics;
    if (step_graph_.captured() && step_graph_.fits(batch)) {
      // The batch (on the device already: detail::CopyAhead) is copied into the graph's inputs; the
      // whole step is one replay.
      metrics = step_graph_.replay(batch);
      lap(workload, workload.phases.train_batch, sync_timings);
    } else {
      lap(workload, workload.phases.data, sync_timings);  // the batch came on the device (detail::CopyAhead)
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
        st.reporter.line("dettrial: training step captured in a CUDA graph at batch " + std::to_string(batch_idx));
      } else {
        if (!st.eager_batch_announced)
          st.reporter.line("dettrial: batch " + std::to_string(batch_idx) +
                           " has other shapes than the captured batch; such batches run eagerly");
        st.eager_batch_announced = true;
        step_graph_.before_eager_batch();
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      }
    }
    context_.finish_batch(batch_idx);
    workload.means.add(metrics, batch_idx);
    if constexpr (Set::wants_batch_metrics) workload.batch_metrics.push_back(detached(metrics));
  }

  /// Determined's boundary rule: batch periods on batches completed; epoch periods on the last batch
  /// of an epoch, on epochs completed.
  Reached boundaries_after(const RunState& st, std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const {
    auto hit = [&](const TrainUnit& u) {
      return u.unit() == Unit::epochs ? epoch_end && u.reached(epoch_idx + 1) : u.reached(batch_idx + 1);
    };
    const FitOptions& o = st.options;
    return Reached{.length = o.test_mode || hit(st.length),
                   .validation = hit(o.validation_period),
                   .checkpoint = hit(o.checkpoint_period),
                   .report = hit(o.reporting_period)};
  }

  /// Validates and checkpoints as reached, in Determined's order (length, validation, checkpoint,
  /// report), honouring a stop request after each. Returns true when training stops.
  template <class Set>
  bool handle_boundaries(RunState& st, const Reached& reached, Set& callbacks) {
    enum class Kind { length, validation, checkpoint, report };
    const std::pair<bool, Kind> in_order[] = {{reached.length, Kind::length},
                                              {reached.validation, Kind::validation},
                                              {reached.checkpoint, Kind::checkpoint},
                                              {reached.report, Kind::report}};
    for (const auto& [hit, kind] : in_order) {
      if (!hit) continue;
      if (kind == Kind::validation && st.progress.last_validation != st.progress.batches_trained) validate(st, callbacks);
      if (kind == Kind::checkpoint) checkpoint_unless_current(st, callbacks);
      if (agreed_max(context_.get_stop_requested() ? 1 : 0) != 0) {
        stop(st, callbacks, 0, "dettrial: stop requested; stopped after batch " + std::to_string(st.progress.batches_trained));
        return true;
      }
    }
    return false;
  }

  /// The one way training stops early: checkpoint (unless current), record why, say so.
  template <class Set>
  void stop(RunState& st, Set& callbacks, int signal, const std::string& message) {
    checkpoint_unless_current(st, callbacks);
    st.result.signal = signal;
    st.result.stop_requested = true;
    st.result.stopped_early = remaining(st) > 0;
    st.reporter.line(message);
  }

  template <class Set>
  void checkpoint_unless_current(RunState& st, Set& callbacks) {
    if (st.progress.last_checkpoint != st.progress.batches_trained) checkpoint(st, callbacks);
  }

  // ---- reports and validation -----------------------------------------------------------------

  template <class Set>
  void report_training(RunState& st, const Workload& workload, Set& callbacks) {
    const double seconds = st.reporter.elapsed();
    detail::RankShare mine{.batches = workload.means.batches(), .records = workload.records};
    for (const auto& [name, value] : workload.means.means()) mine.totals.push_back({name, Reducer::avg, value});
    for (auto& r : context_.reducers())
      if (r.for_training) mine.reducer_parts.push_back(r.per_slot(r.object));
    const auto shares = detail::gather_shares(std::move(mine), context_.communicator());
    MetricValues avg;
    avg.set("batches", static_cast<double>(st.progress.batches_trained));
    avg.set("epochs", static_cast<double>(st.progress.epochs_trained));
    for (const auto& [name, value] : detail::combine_training(shares)) avg.set(name, value);
    reduce_user_reducers(&detail::WrappedReducer::for_training, shares, avg);
    // The whole job's records (every rank's), over the chief's clock.
    const double rate = seconds > 0 ? static_cast<double>(detail::total_records(shares)) / seconds : 0.0;
    st.reporter.training(st.progress.batches_trained, st.progress.epochs_trained, avg, rate, seconds, workload.phases, learning_rates());
    callbacks.template call<hook::on_training_workload_end>(avg, std::span<const Metrics>(workload.batch_metrics));
    st.result.last_training_metrics = std::move(avg);
  }

  /// Every wrapped optimizer's learning rates, named as detail::LearningRates says; an optimizer
  /// whose options cannot tell theirs (a custom type without get_lr) is left out.
  detail::LearningRates learning_rates() const {
    detail::LearningRates out;
    const std::size_t optimizers = context_.num_optimizers();
    for (std::size_t i = 0; i < optimizers; ++i) {
      const auto& groups = context_.optimizer(i).param_groups();
      for (std::size_t g = 0; g < groups.size(); ++g) {
        try {
          const double lr = groups[g].options().get_lr();
          // Appended piece by piece: GCC 12 at -O3 mistakes chained string + for overlapping copies (-Wrestrict).
          std::string name = "lr";
          if (optimizers > 1) name.append("_").append(std::to_string(i));
          if (groups.size() > 1) name.append("_group_").append(std::to_string(g));
          out.emplace_back(std::move(name), lr);
        } catch (const c10::Error&) {
          break;
        }
      }
    }
    return out;
  }

  /// Merges the user reducers taking part (`role`: for_training or for_validation) into `out`, each
  /// reducing the parts of every rank.
  void reduce_user_reducers(bool detail::WrappedReducer::* role, const std::vector<detail::RankShare>& shares, MetricValues& out) {
    // Every rank sees every share, so a mismatch stops all ranks here together.
    for (const auto& s : shares)
      if (s.reducer_parts.size() != shares.front().reducer_parts.size())
        throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
    std::size_t index = 0;
    for (auto& r : context_.reducers())
      if (r.*role) r.cross_slot_into(r.object, r.name, detail::reducer_parts(shares, index++), out);
  }

  /// Every rank takes rank 0's buffers (see detail::broadcast_buffers: DDP's broadcast_buffers, at
  /// the boundaries that read them).
  void agree_on_buffers() {
    if (Communicator* comm = context_.communicator()) detail::broadcast_buffers(*comm, context_.models());
  }

  template <class Set>
  void validate(RunState& st, Set& callbacks) {
    RECORD_USER_SCOPE("dettrial::validate");
    torch::NoGradGuard no_grad;
    agree_on_buffers();
    for (const auto& m : context_.models()) m->eval();
    for (auto& r : context_.reducers())
      if (r.for_validation) r.reset(r.object);
    callbacks.template call<hook::on_validation_start>();
    st.reporter.begin("validate", 0, epoch_length(*validation_loader_, validation_chain()), "batches");
    detail::RankShare mine = evaluate(st, callbacks);
    for (auto& r : context_.reducers())
      if (r.for_validation) mine.reducer_parts.push_back(r.per_slot(r.object));
    const auto shares = detail::gather_shares(std::move(mine), context_.communicator());
    // Decided from the gathered shares, so every rank throws (or goes on) together.
    if (detail::total_batches(shares) == 0) throw DataError("the validation data loader yielded no batches");
    MetricValues metrics = detail::combine_validation(shares);
    reduce_user_reducers(&detail::WrappedReducer::for_validation, shares, metrics);
    callbacks.template call<hook::on_validation_end>(metrics);
    context_.step_lr_schedulers_on_validation(metrics);  // the same reduced metrics on every rank
    st.progress.last_validation = st.progress.batches_trained;
    ++st.result.validations;
    MetricValues reported;
    reported.set("batches", static_cast<double>(st.progress.batches_trained));
    reported.set("epochs", static_cast<double>(st.progress.epochs_trained));
    for (const auto& [name, value] : metrics) reported.set(name, value);
    st.reporter.validation(st.progress.batches_trained, st.progress.epochs_trained, reported, detail::total_records(shares),
                           st.reporter.elapsed());
    st.result.last_validation_metrics = reported;
    apply_checkpoint_policy(st, reported, callbacks);
  }

  /// This rank's share of a validation: its metric totals over its shard (evaluate_batch) or, with
  /// evaluate_full_dataset, the chief's metrics over the whole set (taken as they are).
  template <class Set>
  detail::RankShare evaluate(RunState& st, Set& callbacks) {
    detail::RankShare mine;
    if constexpr (DeclaresEvaluateBatch<TrialT>) {
      callbacks.template call<hook::on_validation_epoch_start>();
      detail::ValidationReduction reduction(evaluation_reducer());
      std::vector<Metrics> outputs;
      std::int64_t batch_idx = 0;
      detail::CopyAhead batches(validation_loader_->batches(validation_chain()), context_.device());
      while (batches.has_next()) {
        validation_batch_t<TrialT> batch = batches.take();
        mine.records += record_count(batch);
        Metrics m =
            in_precision([&]() -> decltype(auto) { return detail::call_evaluate_batch(*trial_, batch, model_or_missing(), batch_idx); });
        reduction.add(m, batch_idx);
        if constexpr (Set::wants_validation_outputs) outputs.push_back(std::move(m));
        st.reporter.update(++batch_idx);
        if (st.options.test_mode) break;
        batches.stage();  // the next batch copies while the device evaluates this one
      }
      callbacks.template call<hook::on_validation_epoch_end>(std::span<const Metrics>(outputs));
      mine.totals = reduction.totals();
      mine.batches = reduction.batches();
    } else if (context_.distributed().is_chief()) {  // the whole dataset on the chief only (Determined's rule)
      const Metrics m = in_precision(
          [&]() -> decltype(auto) { return detail::call_evaluate_full_dataset(*trial_, *validation_loader_, model_or_missing()); });
      for (const auto& e : m) mine.totals.push_back({std::string(e.key.view()), Reducer::sum, e.value.to_double()});
      mine.batches = 1;
    }
    return mine;
  }

  /// After a validation: tracks the best searcher metric and checkpoints as the policy says.
  template <class Set>
  void apply_checkpoint_policy(RunState& st, const MetricValues& metrics, Set& callbacks) {
    bool improved = true;  // without a searcher metric every validation counts as the best so far
    if (!st.options.searcher_metric.empty()) {
      const auto value = metrics.get(st.options.searcher_metric);
      if (!value) throw missing_searcher_metric(st.options.searcher_metric, metrics);
      improved = MetricOrder{st.options.smaller_is_better}.improves(*value, st.progress.best_validation);
      // Every rank holds the same gathered metrics; the chief's decision is still the one acted on,
      // because a checkpoint is a collective that all ranks enter or none.
      if (Communicator* comm = context_.communicator()) improved = comm->broadcast_values({improved ? 1 : 0})[0] != 0;
      if (improved) st.progress.best_validation = *value;
    } else if (st.options.checkpoint_policy == CheckpointPolicy::best && !st.warned_best_without_metric) {
      st.reporter.line("dettrial: checkpoint_policy 'best' has no searcher metric to compare; checkpointing after every validation");
      st.warned_best_without_metric = true;
    }
    if (st.checkpointer.after_validation(improved)) checkpoint_unless_current(st, callbacks);
  }

  /// A configuration error (exit status 78): every trial of a search would fail the same way.
  static ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics) {
    std::vector<std::string> names;
    for (const auto& [name, ignored] : metrics) names.push_back(name);
    std::string reported;
    for (const auto& name : names) reported += (reported.empty() ? "" : ", ") + name;
    std::string hint = detail::suggestion(metric, names);
    if (hint.empty()) {  // val_loss for validation_loss: the one name with the same last word
      auto last_word = [](const std::string& n) { return n.substr(n.rfind('_') == std::string::npos ? 0 : n.rfind('_') + 1); };
      std::vector<std::string> same;
      std::ranges::copy_if(names, std::back_inserter(same), [&](const std::string& n) { return last_word(n) == last_word(metric); });
      if (same.size() == 1) hint = "; did you mean '" + same.front() + "'?";
    }
    return ConfigError("searcher.metric '" + metric + "' is not a metric validation reports (it reported " + reported + ")" + hint);
  }

  TrialProgress progress_of(const RunState& st) const {
    TrialProgress progress = st.progress;
    progress.trial_id = st.options.trial_id;
    progress.training_data_seed = data_seed(*train_loader_);
    progress.validation_data_seed = data_seed(*validation_loader_);
    return progress;
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

  /// Writes a checkpoint (Determined's layout, crash-safe) on the chief, runs the checkpoint hooks,
  /// and applies retention sparing the new one.
  template <class Set>
  void checkpoint(RunState& st, Set& callbacks) {
    RECORD_USER_SCOPE("dettrial::checkpoint");
    st.progress.last_checkpoint = st.progress.batches_trained;
    agree_on_buffers();
    const bool validated_here = st.progress.last_validation == st.progress.batches_trained && !st.options.searcher_metric.empty();
    const std::optional<detail::WrittenCheckpoint> written = st.checkpointer.write(
        callbacks, {.progress = progress_of(st),
                    .mid_aggregation = st.progress.batches_trained % context_.aggregation_frequency() != 0,
                    .searcher_metric = st.options.searcher_metric,
                    .validation_metric = validated_here ? st.result.last_validation_metrics.get(st.options.searcher_metric) : std::nullopt,
                    .trial_type = c10::demangle(typeid(TrialT).name())});
    if (!written) return;  // not the chief
    st.result.checkpoints.push_back(written->info);
    st.reporter.checkpoint(st.progress.batches_trained, st.progress.epochs_trained, written->info.path, written->seconds);
    st.checkpointer.apply_retention(written->info.uuid);
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
  void agree_across_ranks(RunState& st, std::int64_t first_batch) {
    Communicator* comm = context_.communicator();
    if (!comm) return;
    const auto train_seed = data_seed(*train_loader_), validation_seed = data_seed(*validation_loader_);
    const std::vector<std::int64_t> chief =
        comm->broadcast_values({st.epoch_len, static_cast<std::int64_t>(train_seed.value_or(0)), train_seed ? 1 : 0,
                                static_cast<std::int64_t>(validation_seed.value_or(0)), validation_seed ? 1 : 0});
    st.epoch_len = chief[0];
    if (chief[2]) restore_data_seed(*train_loader_, static_cast<std::uint64_t>(chief[1]));
    if (chief[4]) restore_data_seed(*validation_loader_, static_cast<std::uint64_t>(chief[3]));
    const FitOptions& o = st.options;
    const detail::RankSetting placing_boundaries[] = {
        {"max_length", st.length.to_string()},
        {"the validation period", o.validation_period.to_string()},
        {"the checkpoint period", o.checkpoint_period.to_string()},
        {"the reporting period", o.reporting_period.to_string()},
        {"test mode", o.test_mode ? "on" : "off"},
        {"step-zero validation", o.step_zero_validation ? "on" : "off"},
        {"the checkpoint policy", std::to_string(static_cast<int>(o.checkpoint_policy))},
        {"the searcher metric", o.searcher_metric + (o.smaller_is_better ? " (smaller is better)" : " (larger is better)")},
        {"the batch resumed from", std::to_string(first_batch)},
        {"aggregation_frequency", std::to_string(context_.aggregation_frequency())},
        {"the global batch size", context_.has_global_batch_size() ? std::to_string(context_.get_global_batch_size()) : "-"}};
    detail::require_same_settings(*comm, placing_boundaries);
    context_.seed_rank_stream();
  }

  /**
   * @brief Restores a checkpoint: models (names and shapes checked), optimizers, schedulers, pending
   * gradients, RNGs, callbacks, and where the trial stands (`progress`).
   */
  template <class Set>
  void restore(RunState& st, const std::filesystem::path& dir, const TrialProgress& progress, Set& callbacks) {
    for (const std::string& name : st.checkpointer.restore(dir, callbacks))
      st.reporter.line("dettrial: warning: the checkpoint has no state for callback '" + name + "'");
    restore_data_seed(*train_loader_, progress.training_data_seed);
    restore_data_seed(*validation_loader_, progress.validation_data_seed);
    st.progress = progress;
  }

  /// A copy whose tensors are detached from the graph and on the CPU (kept for callbacks).
  static Metrics detached(const Metrics& m) {
    Metrics out;
    for (const auto& e : m) out.set(e.key, e.value.is_tensor() ? MetricValue(e.value.tensor().detach().cpu()) : e.value);
    return out;
  }

  /// The training loader's chain: endless, this rank's shard, skipping what was trained.
  LoaderChain training_chain() const {
    return LoaderChain{.repeat = true,
                       .skip = context_.get_initial_batch(),
                       .num_replicas = context_.distributed().size,
                       .rank = context_.distributed().rank};
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
    if constexpr (requires(TrialT& t) { ReducerChoice(t.evaluation_reducer()); }) return ReducerChoice(trial_->evaluation_reducer());
    else return Reducer::avg;
  }

  template <class B>
  std::int64_t record_count(const B& batch) {
    if constexpr (requires(TrialT& t) {
                    { t.get_batch_length(batch) } -> std::convertible_to<std::int64_t>;
                  })
      return trial_->get_batch_length(batch);
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

  auto& model_or_missing() {
    if constexpr (declarative) return *model_;
    else return missing_model_;
  }

  Context& context_;
  std::unique_ptr<TrialT> trial_;
  std::optional<Model> model_;
  std::optional<OptimizerHolder> optimizer_;
  std::unique_ptr<SchedulerResult> scheduler_;
  std::unique_ptr<TrialCallbacks> callbacks_;
  std::optional<TrainLoader> train_loader_;
  std::optional<ValidationLoader> validation_loader_;
  /// The captured training step (capture::cuda_graph), for one fit at a time.
  detail::StepGraph<if_ok<training_batch_t<TrialT>>> step_graph_;
  detail::missing missing_model_;
};

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
