// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::Trainer<TrialT>: checks a trial at compile time and runs Determined's training
/// loop for it, generated inline.
#pragma once

#include <chrono>
#include <cstdint>
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

#include <torch/torch.h>

#include "../context/context.hpp"
#include "../detail/error.hpp"
#include "../version.hpp"
#include "../metrics/metrics.hpp"
#include "../metrics/reducers.hpp"
#include "../report/metrics_log.hpp"
#include "../report/progress.hpp"
#include "../trial/concepts.hpp"
#include "callbacks.hpp"
#include "fit_options.hpp"
#include "units.hpp"

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
      struct Release {
        Context& context;
        bool armed = true;
        ~Release() {
          if (armed) context.release_registrations();
        }
      } release{context_};
      build(std::forward<Args>(args)...);
      release.armed = false;
    }
  }

 private:
  template <class... Args>
  void build(Args&&... args) {
    if constexpr (std::constructible_from<TrialT, Context&, Args...>)
      trial_ = std::make_unique<TrialT>(context_, std::forward<Args>(args)...);
    else
      trial_ = std::make_unique<TrialT>(std::forward<Args>(args)...);
    if constexpr (declarative) build_declarative();
    if constexpr (requires(TrialT& t) { t.build_callbacks(); })
      callbacks_ = std::make_unique<TrialCallbacks>(trial_->build_callbacks());
    else
      callbacks_ = std::make_unique<TrialCallbacks>();
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
      auto set = std::apply([&](auto&... own) { return detail::CallbackSet<std::remove_reference_t<decltype(own)>..., Callbacks...>(
                                                    std::tie(own..., callbacks...)); },
                            *callbacks_);
      return run(std::move(options), set);
    }
  }

 private:
  enum Boundary { train_boundary, validate_boundary, checkpoint_boundary, report_boundary, boundary_count };

  struct RunState {
    FitOptions options;
    TrainUnit length = Batch(1);
    std::int64_t epoch_len = 0;
    std::int64_t batches_trained = 0;
    std::int64_t epochs_trained = 0;
    std::int64_t last_validation = -1;
    std::int64_t last_checkpoint = -1;
    std::optional<double> best_metric;
    bool warned_best_without_metric = false;
    FitResult result;
    MetricsLog log;
    detail::Progress progress;
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
      else
        context_.wrap_lr_scheduler(*scheduler_, lr_step::every_batch{});
    }
  }

  static std::filesystem::path default_output_dir() {
    const std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    return std::filesystem::path("runs") / (std::string(stamp) + "-" + std::to_string(::getpid()));
  }

  TrainUnit resolve_length(const FitOptions& o) const {
    if (o.test_mode) return Batch(1);
    if (!o.max_length)
      throw ConfigError("fit() needs a training length: set FitOptions::max_length (Batch, Epoch or Record), or "
                        "searcher.max_length in the experiment config and build the options with FitOptions::from_config");
    TrainUnit length = *o.max_length;
    if (length.is_schedule()) throw ConfigError("max_length must be a count, not a schedule of points");
    if (length.unit() == Unit::records) length = length.in_batches_if_records(context_.get_global_batch_size());
    if (length.value() < 1)
      throw ConfigError("max_length is " + length.to_string() + "; training needs a max_length of at least 1");
    return length;
  }
  TrainUnit resolve_period(const TrainUnit& period) const {
    return period.unit() == Unit::records ? period.in_batches_if_records(context_.get_global_batch_size()) : period;
  }

  template <class Set>
  FitResult run(FitOptions options, Set& callbacks) {
    if (options.latest_checkpoint)
      throw Error("resuming from a checkpoint (latest_checkpoint '" + options.latest_checkpoint->string() +
                  "') is not available in dettrial " DETTRIAL_VERSION_STRING);
    RunState st{.options = std::move(options)};
    FitOptions& o = st.options;
    st.length = resolve_length(o);
    o.validation_period = resolve_period(o.validation_period);
    o.checkpoint_period = resolve_period(o.checkpoint_period);
    o.reporting_period = resolve_period(o.reporting_period);
    if (o.output_dir.empty()) o.output_dir = default_output_dir();
    st.result.output_dir = o.output_dir;
    st.log = MetricsLog(o.output_dir);
    st.progress = detail::Progress(o.report);

    // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
    std::size_t started = 0;
    struct Shutdown {
      Set& callbacks;
      std::size_t& started;
      ~Shutdown() {
        std::size_t index = Set::size;
        callbacks.each_reversed([&](auto& cb) {
          if (index-- > started) return;
          if constexpr (requires { cb.on_trial_shutdown(); }) {
            try {
              cb.on_trial_shutdown();
            } catch (const std::exception& e) {
              std::fprintf(stderr, "dettrial: on_trial_shutdown failed: %s\n", e.what());
            }
          }
        });
      }
    } shutdown{callbacks, started};
    callbacks.each([&](auto& cb) {
      if constexpr (requires { cb.on_trial_startup(std::int64_t{}, std::string{}); }) cb.on_trial_startup(std::int64_t{0}, std::string{});
      ++started;
    });

    train_loader_.emplace(trial_->build_training_data_loader());
    validation_loader_.emplace(trial_->build_validation_data_loader());
    st.epoch_len = epoch_length(*train_loader_, training_chain());
    if (st.epoch_len < 1) throw DataError("the training data loader yields no batches (its size() is 0)");
    context_.epoch_len_ = st.epoch_len;
    context_.initial_batch_ = 0;
    context_.current_batch_ = 0;

    st.progress.line("dettrial: trial seed " + std::to_string(context_.get_trial_seed()) + ", device " +
                     context_.device().str() + ", training " + st.length.to_string() + " (an epoch is " +
                     std::to_string(st.epoch_len) + " batches), output " + o.output_dir.string());

    callbacks.each([&](auto& cb) {
      if constexpr (requires { cb.on_training_start(); }) cb.on_training_start();
    });

    if (o.step_zero_validation && st.batches_trained == 0 && st.last_validation < 0) validate(st, callbacks);
    train(st, callbacks);
    if (!st.result.stop_requested) {
      if (st.last_validation != st.batches_trained) validate(st, callbacks);
      if (st.last_checkpoint != st.batches_trained) checkpoint(st);
    }
    st.result.batches_trained = st.batches_trained;
    st.result.epochs_trained = st.epochs_trained;
    return std::move(st.result);
  }

  std::int64_t remaining(const RunState& st) const {
    return st.length.unit() == Unit::epochs ? st.length.value() - st.epochs_trained : st.length.value() - st.batches_trained;
  }

  template <class Set>
  void train(RunState& st, Set& callbacks) {
    using TrainBatch = training_batch_t<TrialT>;
    detail::WorkloadMeans means;
    std::vector<Metrics> batch_metrics;  // kept only when a callback asks for them
    // One endless stream for the whole run (Determined's repeat → shard → skip chain).
    auto stream = train_loader_->batches(training_chain());
    auto it = std::ranges::begin(stream);
    const auto end = std::ranges::end(stream);
    std::int64_t batch_idx = st.batches_trained;
    const bool non_blocking = context_.device().is_cuda();
    const FitOptions& o = st.options;
    const std::int64_t total = st.length.unit() == Unit::epochs ? st.length.value() * st.epoch_len : st.length.value();

    while (remaining(st) > 0) {
      for (const auto& m : context_.models()) m->train();
      for (auto& r : context_.reducers_)
        if (r.for_training) r.reset(r.object);
      means.reset();
      if constexpr (Set::wants_batch_metrics) batch_metrics.clear();
      std::int64_t records = 0;
      bool reached[boundary_count] = {};
      st.progress.begin("train", st.batches_trained, total, "batches");

      for (;;) {
        const std::int64_t epoch_idx = batch_idx / st.epoch_len;
        const std::int64_t in_epoch = batch_idx % st.epoch_len;
        context_.current_batch_ = batch_idx;
        if (in_epoch == 0) {
          callbacks.each([&](auto& cb) {
            if constexpr (requires { cb.on_training_epoch_start(epoch_idx); }) cb.on_training_epoch_start(epoch_idx);
          });
        }
        if (it == end) throw DataError("the training data loader's repeating stream ended at batch " + std::to_string(batch_idx));
        TrainBatch batch = std::move(*it);
        ++it;
        to_device_in_place(batch, context_.device(), non_blocking);
        records += record_count(batch);

        Metrics metrics = as_metrics(detail::call_train_batch(*trial_, batch, model_or_missing(), epoch_idx, batch_idx));
        if constexpr (declarative) {
          const MetricValue& loss = metrics.at("loss");
          if (!loss.is_tensor())
            throw TrialError("train_batch must return the loss as a tensor (the trainer back-propagates it), not a number");
          context_.backward(loss.tensor());
          context_.step_optimizer(detail::deref(*optimizer_));
        }
        if (context_.is_update_batch()) context_.step_lr_schedulers(batch_idx);
        means.add(metrics, batch_idx);
        if constexpr (Set::wants_batch_metrics) batch_metrics.push_back(detached(metrics));

        ++st.batches_trained;
        const bool epoch_end = in_epoch == st.epoch_len - 1;
        if (epoch_end) {
          callbacks.each([&](auto& cb) {
            if constexpr (requires { cb.on_training_epoch_end(epoch_idx); }) cb.on_training_epoch_end(epoch_idx);
          });
          ++st.epochs_trained;
        }
        st.progress.update(st.batches_trained);

        // Determined's boundary rule: batch periods on batches completed, epoch periods on the last
        // batch of an epoch, on epochs completed.
        auto hit = [&](const TrainUnit& u) {
          return u.unit() == Unit::epochs ? epoch_end && u.reached(epoch_idx + 1) : u.reached(batch_idx + 1);
        };
        reached[train_boundary] = o.test_mode || hit(st.length);
        reached[validate_boundary] = hit(o.validation_period);
        reached[checkpoint_boundary] = hit(o.checkpoint_period);
        reached[report_boundary] = hit(o.reporting_period);
        ++batch_idx;
        if (reached[train_boundary] || reached[validate_boundary] || reached[checkpoint_boundary] || reached[report_boundary])
          break;
      }

      report_training(st, means, records, callbacks, batch_metrics);
      // Determined handles the reached boundaries in this order and honours a stop request after each.
      for (const Boundary b : {train_boundary, validate_boundary, checkpoint_boundary, report_boundary}) {
        if (!reached[b]) continue;
        if (b == validate_boundary && st.last_validation != st.batches_trained) validate(st, callbacks);
        if (b == checkpoint_boundary && st.last_checkpoint != st.batches_trained) checkpoint(st);
        if (context_.get_stop_requested()) {
          if (st.last_checkpoint != st.batches_trained) checkpoint(st);
          st.result.stopped_early = remaining(st) > 0;
          st.result.stop_requested = true;
          st.progress.line("dettrial: stop requested; stopped after batch " + std::to_string(st.batches_trained));
          return;
        }
      }
    }
  }

  template <class Set>
  void report_training(RunState& st, const detail::WorkloadMeans& means, std::int64_t records, Set& callbacks,
                       const std::vector<Metrics>& batch_metrics) {
    const double seconds = st.progress.elapsed();
    MetricValues avg;
    avg.set("batches", static_cast<double>(st.batches_trained));
    avg.set("epochs", static_cast<double>(st.epochs_trained));
    for (const auto& [name, value] : means.means()) avg.set(name, value);
    for (auto& r : context_.reducers_)
      if (r.for_training) r.reduce_into(r.object, r.name, avg);
    const double rate = seconds > 0 ? static_cast<double>(records) / seconds : 0.0;
    char tail[64];
    std::snprintf(tail, sizeof tail, "  (%.1f samples/s)", rate);
    st.progress.line("[train]" + detail::format_metrics(avg) + tail);
    st.log.write("training", st.batches_trained, st.epochs_trained, avg, "samples_per_second", rate);
    callbacks.each([&](auto& cb) {
      if constexpr (requires { cb.on_training_workload_end(avg, std::span<const Metrics>(batch_metrics)); })
        cb.on_training_workload_end(avg, std::span<const Metrics>(batch_metrics));
      else if constexpr (requires { cb.on_training_workload_end(avg); })
        cb.on_training_workload_end(avg);
    });
    st.result.last_training_metrics = std::move(avg);
  }

  template <class Set>
  void validate(RunState& st, Set& callbacks) {
    torch::NoGradGuard no_grad;
    for (const auto& m : context_.models()) m->eval();
    for (auto& r : context_.reducers_)
      if (r.for_validation) r.reset(r.object);
    callbacks.each([&](auto& cb) {
      if constexpr (requires { cb.on_validation_start(); }) cb.on_validation_start();
    });
    st.progress.begin("validate", 0, epoch_length(*validation_loader_, validation_chain()), "batches");
    MetricValues metrics;
    std::int64_t records = 0;
    if constexpr (DeclaresEvaluateBatch<TrialT>) {
      callbacks.each([&](auto& cb) {
        if constexpr (requires { cb.on_validation_epoch_start(); }) cb.on_validation_epoch_start();
      });
      detail::ValidationReduction reduction(evaluation_reducer());
      std::vector<Metrics> outputs;
      std::int64_t batch_idx = 0;
      const bool non_blocking = context_.device().is_cuda();
      for (auto&& loaded : validation_loader_->batches(validation_chain())) {
        validation_batch_t<TrialT> batch = std::move(loaded);
        to_device_in_place(batch, context_.device(), non_blocking);
        records += record_count(batch);
        Metrics m = detail::call_evaluate_batch(*trial_, batch, model_or_missing(), batch_idx);
        reduction.add(m, batch_idx);
        if constexpr (Set::wants_validation_outputs) outputs.push_back(std::move(m));
        ++batch_idx;
        st.progress.update(batch_idx);
        if (st.options.test_mode) break;
      }
      if (batch_idx == 0) throw DataError("the validation data loader yielded no batches");
      callbacks.each([&](auto& cb) {
        if constexpr (requires { cb.on_validation_epoch_end(std::span<const Metrics>(outputs)); })
          cb.on_validation_epoch_end(std::span<const Metrics>(outputs));
      });
      metrics = reduction.result();
    } else {
      const Metrics m = detail::call_evaluate_full_dataset(*trial_, *validation_loader_, model_or_missing());
      for (const auto& e : m) metrics.set(std::string(e.key.view()), e.value.to_double());
    }
    for (auto& r : context_.reducers_)
      if (r.for_validation) r.reduce_into(r.object, r.name, metrics);
    callbacks.each([&](auto& cb) {
      if constexpr (requires { cb.on_validation_end(metrics); }) cb.on_validation_end(metrics);
    });
    st.last_validation = st.batches_trained;
    ++st.result.validations;

    const double seconds = st.progress.elapsed();
    MetricValues reported;
    reported.set("batches", static_cast<double>(st.batches_trained));
    reported.set("epochs", static_cast<double>(st.epochs_trained));
    for (const auto& [name, value] : metrics) reported.set(name, value);
    char tail[96];
    if (records > 0)
      std::snprintf(tail, sizeof tail, "  (%lld records in %.2f s)", static_cast<long long>(records), seconds);
    else
      std::snprintf(tail, sizeof tail, "  (%.2f s)", seconds);
    st.progress.line("[validation]" + detail::format_metrics(reported) + tail);
    st.log.write("validation", st.batches_trained, st.epochs_trained, reported, "seconds", seconds);
    st.result.last_validation_metrics = reported;
    apply_checkpoint_policy(st, reported);
  }

  void apply_checkpoint_policy(RunState& st, const MetricValues& metrics) {
    if (st.last_checkpoint == st.batches_trained) return;
    switch (st.options.checkpoint_policy) {
      case CheckpointPolicy::none: return;
      case CheckpointPolicy::all: checkpoint(st); return;
      case CheckpointPolicy::best: {
        if (st.options.searcher_metric.empty()) {
          if (!st.warned_best_without_metric)
            st.progress.line("dettrial: checkpoint_policy 'best' has no searcher metric to compare; checkpointing after every validation");
          st.warned_best_without_metric = true;
          checkpoint(st);
          return;
        }
        const auto value = metrics.get(st.options.searcher_metric);
        if (!value)
          throw TrialError("checkpoint_policy 'best' compares the searcher metric '" + st.options.searcher_metric +
                           "', which validation did not report");
        const bool better = !st.best_metric || (st.options.smaller_is_better ? *value < *st.best_metric : *value > *st.best_metric);
        if (better) {
          st.best_metric = *value;
          checkpoint(st);
        }
        return;
      }
    }
  }

  /// A checkpoint boundary. Writing checkpoints is not available yet, so this says so and saves nothing.
  void checkpoint(RunState& st) {
    st.last_checkpoint = st.batches_trained;
    ++st.result.checkpoints_not_saved;
    st.progress.line("[checkpoint] batches " + std::to_string(st.batches_trained) +
                     ": not saved (checkpoint saving is not available in dettrial " DETTRIAL_VERSION_STRING ")");
  }

  /// A copy whose tensors are detached from the graph and on the CPU (kept for callbacks).
  static Metrics detached(const Metrics& m) {
    Metrics out;
    for (const auto& e : m)
      out.set(e.key, e.value.is_tensor() ? MetricValue(e.value.tensor().detach().cpu()) : e.value);
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
    if constexpr (requires { { loader.batches_for(chain) } -> std::convertible_to<std::int64_t>; })
      return static_cast<std::int64_t>(loader.batches_for(chain));
    else return static_cast<std::int64_t>(loader.size());
  }

  ReducerChoice evaluation_reducer() {
    if constexpr (requires(TrialT& t) { ReducerChoice(t.evaluation_reducer()); }) return ReducerChoice(trial_->evaluation_reducer());
    else return Reducer::avg;
  }

  template <class B>
  std::int64_t record_count(const B& batch) {
    if constexpr (requires(TrialT& t) { { t.get_batch_length(batch) } -> std::convertible_to<std::int64_t>; })
      return trial_->get_batch_length(batch);
    else return batch_length(batch);
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
  detail::missing missing_model_;
};

}  // namespace dettrial
