// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The steps of Determined's loop that do not call the trial: the run's first lines, a
/// workload's and a validation's metrics reduced over the ranks and reported, the searcher metric's
/// best, a checkpoint's record, an early stop. Each takes the pieces of the fit it needs (Schedule,
/// Position, Outputs' reporter, the Checkpointer); detail::BatchLoop calls them between the trial's
/// hooks. Compiled once in separate-compilation mode, so a trial's translation unit compiles its own
/// loop and little else.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../../checkpoint/detail/checkpointer.hpp"
#include "../../checkpoint/detail/trial_checkpoint.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../detail/linkage.hpp"
#include "../../distributed/detail/metrics.hpp"
#include "../../error.hpp"
#include "../../metrics/reducers.hpp"
#include "../../report/detail/reporter.hpp"
#include "../../vocabulary/metric_order.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../fit_options.hpp"
#include "position.hpp"
#include "schedule.hpp"

namespace dettrial::detail {

/// What a training workload accumulates; kept across workloads so that a batch allocates nothing.
struct Workload {
  WorkloadMeans means;
  std::vector<Metrics> batch_metrics{};  // kept only when a callback asks for them
  std::int64_t records = 0;
  PhaseTimes phases{};
  /// The end of the last timed phase.
  std::chrono::steady_clock::time_point mark{};

  /// A workload begins: models in training mode, training reducers and the sums reset; the
  /// checkpoint writer's wait since the last one is its first phase time.
  DETTRIAL_INLINE void begin(TrainerKey key, Context& context, double checkpoint_wait);
};

/// `runs/<date>-<time>-<pid>` under the working directory.
DETTRIAL_INLINE std::filesystem::path default_output_dir();

/// The fit's checkpoints: in FitOptions::checkpoint_dir, or the run folder's `checkpoints`, with
/// its policy and retention (throws ConfigError for a negative retention count).
DETTRIAL_INLINE Checkpointer fit_checkpointer(TrainerKey key, Context& context, const FitOptions& options);

/// The run's first lines: the runtime, the trial, the job, the checkpoint resumed from, what is
/// profiled and captured, and a scheduler that steps otherwise than its Python namesake.
DETTRIAL_INLINE void announce(TrainerKey key, Context& context, const FitOptions& options, const Schedule& schedule,
                              const Position& position, Reporter& reporter);

/// The workload's training metrics over all ranks, with `batches` and `epochs`, reported.
DETTRIAL_INLINE MetricValues report_training(TrainerKey key, Context& context, const Workload& workload, const TrialProgress& progress,
                                             Reporter& reporter);

/// A validation begins: rank 0's buffers and the parameters checked (agree_on_replicas), models and
/// the averaged model in evaluation mode (the average as torchvision's recipe evaluates it; nothing
/// trains it, so it stays so), validation reducers reset.
DETTRIAL_INLINE void begin_validation(TrainerKey key, Context& context, std::int64_t batches_trained);
/// This rank's share and every other's, reduced: the validation's metrics, as the callbacks get
/// them; `records` the whole job's.
DETTRIAL_INLINE MetricValues reduce_validation(TrainerKey key, Context& context, RankShare mine, std::int64_t& records);
/// After on_validation_end: LR schedulers on the metrics, the position, the report. Returns the
/// metrics with `batches` and `epochs`, as reported and as the checkpoint policy reads them.
DETTRIAL_INLINE MetricValues finish_validation(Context& context, const MetricValues& metrics, std::int64_t records, Position& position,
                                               Reporter& reporter);
/// Whether a validation's `reported` metrics improve the searcher metric (kept as the best when
/// they do); without a searcher metric every validation counts as the best so far. The chief's
/// answer, on every rank.
DETTRIAL_INLINE bool improves_searcher_metric(Context& context, const FitOptions& options, Position& position,
                                              const MetricValues& reported);

/// What a checkpoint saves besides the state, with the loaders' data seeds.
DETTRIAL_INLINE TrialCheckpointRecord checkpoint_record(const Context& context, const FitOptions& options, const Schedule& schedule,
                                                        const Position& position, const MetricValues& last_validation,
                                                        std::optional<std::uint64_t> training_data_seed,
                                                        std::optional<std::uint64_t> validation_data_seed, std::string trial_type);
/// A checkpoint the chief wrote: reported, and retention applied sparing it.
DETTRIAL_INLINE void report_checkpoint(const WrittenCheckpoint& written, Checkpointer& checkpointer, Reporter& reporter);
/// Training stopped early after batch `batches_trained` for `signal` (0: a stop request): a line says so.
DETTRIAL_INLINE void report_stop(int signal, std::int64_t batches_trained, const Checkpointer& checkpointer, Reporter& reporter);

/// The training loader's endless stream ended (a DataError naming the batch).
[[noreturn]] DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx);

/// A configuration error (exit status 78): every trial of a search would fail the same way.
DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics);

/// Every wrapped optimizer's learning rates, named as LearningRates says; an optimizer whose
/// options cannot tell theirs (a custom type without get_lr) is left out.
DETTRIAL_INLINE LearningRates learning_rates(const Context& context);

/// Merges the user reducers of `role` into `out`, each reducing the parts of every rank (a
/// DistributedError when the ranks wrapped different numbers of them).
DETTRIAL_INLINE void reduce_user_reducers(TrainerKey key, Context& context, ReducerRole role, const std::vector<RankShare>& shares,
                                          MetricValues& out);

/// At the boundaries that read the models (validation, checkpoints): every rank takes rank 0's
/// buffers (see broadcast_buffers: DDP's broadcast_buffers), and, with `compare_parameters`, the
/// ranks check that they hold the same parameters (require_same_parameters: one small all-reduce),
/// after `batches_trained`.
DETTRIAL_INLINE void agree_on_replicas(Context& context, std::int64_t batches_trained, bool compare_parameters = true);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <ctime>
#include <iterator>
#include <unistd.h>

#include "../../detail/signals.hpp"
#include "../../distributed/detail/agreement.hpp"
#include "../../layout.hpp"
#include "../../report/detail/runtime.hpp"
#include "../../version.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void Workload::begin(TrainerKey key, Context& context, double checkpoint_wait) {
  for (const auto& m : context.models()) m->train();
  ContextAccess::reducers(key, context).reset(ReducerRole::training);
  means.reset();
  batch_metrics.clear();
  records = 0;
  phases.reset();
  phases.checkpoint_wait = checkpoint_wait;
  mark = std::chrono::steady_clock::now();
}

DETTRIAL_INLINE std::filesystem::path default_output_dir() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::filesystem::path("runs") / (std::string(stamp) + "-" + std::to_string(::getpid()));
}

DETTRIAL_INLINE Checkpointer fit_checkpointer(TrainerKey key, Context& context, const FitOptions& o) {
  if (o.retention.save_trial_best < 0 || o.retention.save_trial_latest < 0)
    throw ConfigError("checkpoint retention counts (save_trial_best, save_trial_latest) must not be negative");
  std::filesystem::path storage = o.checkpoint_dir.empty() ? RunFolder{o.output_dir}.checkpoints() : o.checkpoint_dir;
  return Checkpointer(key, context, std::move(storage), o.checkpoint_policy, o.retention, o.smaller_is_better, o.async_checkpoints);
}

}  // namespace dettrial::detail

namespace dettrial::detail::fit_steps {
/// Whether a metric's name says smaller is better: a loss or an error ("val_loss", "train_error").
inline bool named_like_a_loss(const std::string& metric) {
  std::string lower(metric);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("loss") != std::string::npos || lower.find("error") != std::string::npos;
}

/// The lines saying what is profiled, and where the trace goes.
inline void announce_profiling(Context& context, const FitOptions& o, std::int64_t from_batch, Reporter& reporter) {
  const bool synced = o.profiling.sync_timings && context.device().is_cuda();
  if (const auto& profiler = context.profiler_options()) {
    const ProfilerSchedule& s = profiler->schedule;
    reporter.line("dettrial: profiling on set_profiler's schedule (skip_first " + std::to_string(s.skip_first) + ", wait " +
                  std::to_string(s.wait) + ", warmup " + std::to_string(s.warmup) + ", active " + std::to_string(s.active) + ", repeat " +
                  std::to_string(s.repeat) + ", from batch " + std::to_string(from_batch) + "); each cycle's trace in " +
                  RunFolder{o.output_dir}.tensorboard().string() +
                  (o.profiling.enabled ? " (the config's profiling range is not used)" : ""));
  } else if (o.profiling.enabled)
    reporter.line(
        "dettrial: profiling batches " + std::to_string(o.profiling.begin_on_batch) + " to " +
        std::to_string(o.profiling.last_traced_batch()) +
        (o.profiling.end_after_batch ? std::string()
                                     : " (end_after_batch unset: " + std::to_string(o.profiling.default_traced_batches) + " batches)") +
        " with LibTorch's profiler" + (synced ? ", timings synchronized with the GPU" : "") + "; trace in " + o.output_dir.string());
}
}  // namespace dettrial::detail::fit_steps

namespace dettrial::detail {
DETTRIAL_INLINE void announce(TrainerKey key, Context& context, const FitOptions& o, const Schedule& schedule, const Position& position,
                              Reporter& reporter) {
  reporter.line("dettrial " DETTRIAL_VERSION_STRING ": " + runtime_summary());
  reporter.line("dettrial: trial seed " + std::to_string(context.get_trial_seed()) + ", device " + context.device().str() + ", training " +
                schedule.length().to_string() + " (an epoch is " + std::to_string(schedule.epoch_len()) + " batches), output " +
                o.output_dir.string());
  if (const Communicator* comm = context.communicator())
    reporter.line("dettrial: " + std::to_string(comm->size()) + " processes (" + launcher_name(comm->environment().launcher) + ", " +
                  comm->backend_name() + "), rendezvous at " + comm->environment().master_addr + ":" +
                  std::to_string(comm->environment().master_port) + ", global batch " + std::to_string(context.get_global_batch_size()));
  if (const auto& dir = position.resume_dir())
    reporter.line("dettrial: resumed from " + dir->string() +
                  (position.same_trial() ? " at batch " + std::to_string(position.batches_trained())
                                         : std::string(" (another trial's checkpoint: weights and optimizer state only)")));
  const std::int64_t ranks = context.distributed().size, before = position.resumed_ranks();
  if (position.same_trial() && (o.restart > 0 || (before > 0 && before != ranks)))
    reporter.restart(position.batches_trained(), position.epochs_trained(), before > 0 ? before : ranks, ranks, o.restart);
  if (o.zero_stage == ZeroStage::optimizer_state && ranks > 1)
    reporter.line("dettrial: ZeRO stage 1: each of the " + std::to_string(ranks) + " ranks keeps and steps the optimizer state of its 1/" +
                  std::to_string(ranks) +
                  " of the parameters; gradients all-reduced, parameters all-gathered after each step, checkpoints whole");
  if (schedule.data_ranks() != ranks)
    reporter.line("dettrial: the training data keeps the global batches of the " + std::to_string(schedule.data_ranks()) +
                  "-rank job this run began as: each of the " + std::to_string(ranks) + " ranks trains its share of each");
  if (const auto* graph = std::get_if<capture::cuda_graph>(&o.step_capture))
    reporter.line("dettrial: the training step is captured in a CUDA graph after " + std::to_string(graph->warmup_batches) +
                  " eager batch(es), and replayed; batches of other shapes run eagerly");
  detail::fit_steps::announce_profiling(context, o, position.batches_trained(), reporter);
  if (const std::int64_t records = context.get_experiment_config().records_per_epoch; records > 0 && schedule.epoch_from_records())
    reporter.line("dettrial: records_per_epoch " + std::to_string(records) + " sets the epoch: " + std::to_string(schedule.epoch_len()) +
                  " batches of " + std::to_string(context.get_global_batch_size()) + " records (the training data loader's own epoch is " +
                  std::to_string(schedule.data_epoch_len()) + " batches on this rank)");
  else if (records > 0)
    reporter.line("dettrial: records_per_epoch " + std::to_string(records) + " is not used: an epoch is the training data loader's " +
                  std::to_string(schedule.epoch_len()) +
                  " batches on this rank, as Determined's PyTorchTrial ignores records_per_epoch (Keras-style trials count their "
                  "epochs in it)");
  if (o.checkpoint_policy == CheckpointPolicy::best && o.searcher_metric.empty())
    reporter.line("dettrial: checkpoint_policy 'best' has no searcher metric to compare; checkpointing after every validation");
  if (!o.smaller_is_better && detail::fit_steps::named_like_a_loss(o.searcher_metric))
    reporter.line("warning: searcher.smaller_is_better is false for '" + o.searcher_metric + "', so a larger " + o.searcher_metric +
                  " counts as better: the checkpoints kept as best, and a search's decisions, favour the worst; set it to true "
                  "unless larger is better");
  // A port that means Python's StepLR and wraps LibTorch's decays one step late: said once.
  for (std::size_t i = 0; i < context.num_lr_schedulers(); ++i)
    if (ContextAccess::lr_scheduler(key, context, i).type == "torch::optim::StepLR") {
      reporter.line("dettrial: LR scheduler " + std::to_string(i) +
                    " is LibTorch's torch::optim::StepLR, which decays one step() later than Python's StepLR (its first step() does "
                    "not count); dettrial::optim::StepLR decays where Python's does");
      break;
    }
}

DETTRIAL_INLINE MetricValues report_training(TrainerKey key, Context& context, const Workload& workload, const TrialProgress& progress,
                                             Reporter& reporter) {
  const double seconds = reporter.elapsed();
  RankShare mine{.batches = workload.means.batches(), .records = workload.records};
  for (const auto& [name, value] : workload.means.means()) mine.totals.push_back({name, Reducer::avg, value});
  mine.reducer_parts = ContextAccess::reducers(key, context).parts(ReducerRole::training);
  const auto shares = gather_shares(std::move(mine), context.communicator());
  MetricValues avg;
  avg.set("batches", static_cast<double>(progress.batches_trained));
  avg.set("epochs", static_cast<double>(progress.epochs_trained));
  for (const auto& [name, value] : combine_training(shares)) avg.set(name, value);
  reduce_user_reducers(key, context, ReducerRole::training, shares, avg);
  // The whole job's records (every rank's), over the chief's clock.
  const double rate = seconds > 0 ? static_cast<double>(total_records(shares)) / seconds : 0.0;
  reporter.training(progress.batches_trained, progress.epochs_trained, avg, rate, seconds, workload.phases, learning_rates(context));
  return avg;
}

DETTRIAL_INLINE void begin_validation(TrainerKey key, Context& context, std::int64_t batches_trained) {
  agree_on_replicas(context, batches_trained);
  for (const auto& m : context.models()) m->eval();
  if (const auto average = context.averaged_weights()) average->eval();
  ContextAccess::reducers(key, context).reset(ReducerRole::validation);
}

DETTRIAL_INLINE MetricValues reduce_validation(TrainerKey key, Context& context, RankShare mine, std::int64_t& records) {
  mine.reducer_parts = ContextAccess::reducers(key, context).parts(ReducerRole::validation);
  const auto shares = gather_shares(std::move(mine), context.communicator());
  // Decided from the gathered shares, so every rank throws (or goes on) together.
  if (total_batches(shares) == 0) throw DataError("the validation data loader yielded no batches");
  MetricValues metrics = combine_validation(shares);
  reduce_user_reducers(key, context, ReducerRole::validation, shares, metrics);
  records = total_records(shares);
  return metrics;
}

DETTRIAL_INLINE MetricValues finish_validation(Context& context, const MetricValues& metrics, std::int64_t records, Position& position,
                                               Reporter& reporter) {
  context.step_lr_schedulers_on_validation(metrics);  // the same reduced metrics on every rank
  position.validated();
  MetricValues reported;
  reported.set("batches", static_cast<double>(position.batches_trained()));
  reported.set("epochs", static_cast<double>(position.epochs_trained()));
  for (const auto& [name, value] : metrics) reported.set(name, value);
  reporter.validation(position.batches_trained(), position.epochs_trained(), reported, records, reporter.elapsed());
  return reported;
}

DETTRIAL_INLINE bool improves_searcher_metric(Context& context, const FitOptions& options, Position& position,
                                              const MetricValues& reported) {
  if (options.searcher_metric.empty()) return true;
  const auto value = reported.get(options.searcher_metric);
  if (!value) throw missing_searcher_metric(options.searcher_metric, reported);
  const MetricOrder order{options.smaller_is_better};
  bool improved = order.improves(*value, position.progress().best_validation);
  // Every rank holds the same gathered metrics; the chief's decision is still the one acted on,
  // because a checkpoint is a collective that all ranks enter or none.
  if (Communicator* comm = context.communicator()) improved = comm->broadcast_values({improved ? 1 : 0})[0] != 0;
  if (improved) position.keep_best(*value);
  return improved;
}

DETTRIAL_INLINE TrialCheckpointRecord checkpoint_record(const Context& context, const FitOptions& options, const Schedule& schedule,
                                                        const Position& position, const MetricValues& last_validation,
                                                        std::optional<std::uint64_t> training_data_seed,
                                                        std::optional<std::uint64_t> validation_data_seed, std::string trial_type) {
  const bool validated_here = position.validated_here() && !options.searcher_metric.empty();
  return {.progress =
              position.saved(options.trial_id, training_data_seed, validation_data_seed, context.distributed().size, schedule.data_ranks()),
          .mid_aggregation = position.batches_trained() % context.aggregation_frequency() != 0,
          .searcher_metric = options.searcher_metric,
          .validation_metric = validated_here ? last_validation.get(options.searcher_metric) : std::nullopt,
          .trial_type = std::move(trial_type)};
}

DETTRIAL_INLINE void report_checkpoint(const WrittenCheckpoint& written, Checkpointer& checkpointer, Reporter& reporter) {
  reporter.checkpoint(written.info.batches_trained, written.info.epochs_trained, written.info.path, written.seconds, written.write_seconds);
  checkpointer.apply_retention(written.info.uuid);
}

DETTRIAL_INLINE void report_stop(int signal, std::int64_t batches_trained, const Checkpointer& checkpointer, Reporter& reporter) {
  const std::string after = " after batch " + std::to_string(batches_trained);
  if (signal != 0)
    reporter.line(std::string("dettrial: stopped by ") + signal_name(signal) + after + "; resume from " + checkpointer.storage().string());
  else reporter.line("dettrial: stop requested; stopped" + after);
}

DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx) {
  throw DataError("the training data loader's repeating stream ended at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics) {
  std::vector<std::string> names;
  for (const auto& [name, ignored] : metrics) names.push_back(name);
  std::string reported;
  for (const auto& name : names) reported += (reported.empty() ? "" : ", ") + name;
  std::string hint = suggestion(metric, names);
  if (hint.empty()) {  // val_loss for validation_loss: the one name with the same last word
    auto last_word = [](const std::string& n) { return n.substr(n.rfind('_') == std::string::npos ? 0 : n.rfind('_') + 1); };
    std::vector<std::string> same;
    std::ranges::copy_if(names, std::back_inserter(same), [&](const std::string& n) { return last_word(n) == last_word(metric); });
    if (same.size() == 1) hint = "; did you mean '" + same.front() + "'?";
  }
  return ConfigError("searcher.metric '" + metric + "' is not a metric validation reports (it reported " + reported + ")" + hint);
}

DETTRIAL_INLINE LearningRates learning_rates(const Context& context) {
  LearningRates out;
  const std::size_t optimizers = context.num_optimizers();
  for (std::size_t i = 0; i < optimizers; ++i) {
    const auto& groups = context.optimizer(i).param_groups();
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

DETTRIAL_INLINE void reduce_user_reducers(TrainerKey key, Context& context, ReducerRole role, const std::vector<RankShare>& shares,
                                          MetricValues& out) {
  // Every rank sees every share, so a mismatch stops all ranks here together.
  for (const auto& s : shares)
    if (s.reducer_parts.size() != shares.front().reducer_parts.size())
      throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
  ContextAccess::reducers(key, context).merge(role, [&](std::size_t index) { return reducer_parts(shares, index); }, out);
}

DETTRIAL_INLINE void agree_on_replicas(Context& context, std::int64_t batches_trained, bool compare_parameters) {
  Communicator* comm = context.communicator();
  if (!comm) return;
  broadcast_buffers(*comm, context.models());
  // The average's copy too (its count stays on the CPU, the same on every rank).
  const auto average = context.averaged_weights();
  if (average) broadcast_buffers(*comm, {average->averaged_ptr()});
  if (!compare_parameters) return;
  std::vector<ReplicatedModule> replicas;
  for (std::size_t i = 0; i < context.models().size(); ++i) replicas.push_back({"model " + std::to_string(i), context.models()[i]});
  if (average) replicas.push_back({"the averaged model", average->averaged_ptr()});
  require_same_parameters(*comm, replicas, batches_trained);
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
