// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::FitLoop: the half of one fit that does not depend on the trial's type, compiled
/// once in separate-compilation mode: Determined's loop by boundary (the fit's start, training
/// workload after workload, validation, checkpoints, an early stop, the end). It calls the trial's
/// half, detail::BatchLoop<TrialT, Set> (trainer/detail/batch_loop.hpp: the batch loop, the trial's hooks, its loaders
/// and the per-epoch callback hooks), through the virtual functions below, each called once per fit,
/// workload, validation or checkpoint, never per batch; the callbacks' other hooks through their
/// one erased form, detail::ErasedCallbacks.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
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
#include "../../vocabulary/data.hpp"
#include "../../vocabulary/detail/erased_callbacks.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../fit_options.hpp"
#include "fit_steps.hpp"
#include "outputs.hpp"
#include "position.hpp"
#include "schedule.hpp"
#include "step_graph.hpp"

namespace dettrial::detail {

/// The data loaders' seeds, as checkpoints keep them (nullopt: the loader has none).
struct LoaderSeeds {
  std::optional<std::uint64_t> training;
  std::optional<std::uint64_t> validation;
};

/// What the loop needs of the trial's types, as values: the trial's name (a checkpoint records it)
/// and whether a step capture can take its training batch (named when it cannot).
struct TrialTypeInfo {
  std::string trial_type;
  std::string training_batch_type;
  bool training_batch_tensors_only = false;
  /// Whether its epochs are records_per_epoch's (a Keras-style trial, as Determined's TFKerasTrial)
  /// rather than its training loader's (a PyTorch-style trial, whose records_per_epoch Determined ignores).
  bool epochs_follow_records_per_epoch = false;
};

/**
 * @brief The trial-independent half of one fit (see the file's comment). Holds the fit's pieces
 * (its Schedule, Position, Outputs, Checkpointer and result), which Run's batch loop reads and
 * advances; none of them reads another's data.
 */
class FitLoop {
 public:
  FitLoop(const FitLoop&) = delete;
  FitLoop& operator=(const FitLoop&) = delete;

  /// Trains until the options' max_length, validating, checkpointing and reporting at their
  /// periods, and validates at the end.
  DETTRIAL_INLINE FitResult fit(FitOptions options);

 protected:
  /// `callbacks`: the Run's callbacks, erased: the hooks the loop and the checkpoints call.
  DETTRIAL_INLINE FitLoop(TrainerKey key, Context& context, TrialTypeInfo facts, ErasedCallbacks callbacks);
  // Not virtual: a Run is never destroyed through a FitLoop.
  DETTRIAL_INLINE ~FitLoop();

  // ---- the trial's half (BatchLoop<TrialT, Set>) ------------------------------------------------------

  /// Builds the training and validation loaders.
  virtual void build_loaders() = 0;
  /// Batches per epoch on this rank of the training or validation loader, read through `chain`.
  virtual std::int64_t training_epoch_length(const LoaderChain& chain) const = 0;
  virtual std::int64_t validation_epoch_length(const LoaderChain& chain) const = 0;
  /// The training loader's description (a line at the start), if it gives one.
  virtual std::optional<std::string> describe_training_data() const = 0;
  virtual LoaderSeeds data_seeds() const = 0;
  /// Sets each loader's seed that `seeds` has (and the loader takes).
  virtual void restore_data_seeds(const LoaderSeeds& seeds) = 0;
  /// Whether the training loader keeps the global batches of the `began`-rank job in this
  /// `ranks`-rank one (checking that it can); false for a loader that cannot.
  virtual bool keeps_global_batches(std::int64_t ranks, std::int64_t began) = 0;

  /// The training loader's endless stream (training_chain()), opened once a fit and closed after.
  virtual void open_training_stream() = 0;
  virtual void close_training_stream() noexcept = 0;
  /// Trains batch after batch from that stream until one reaches a boundary (or, in one process,
  /// a stop signal arrives).
  virtual BoundariesReached train_workload(Workload& workload) = 0;
  /// This rank's share of a validation (the trial's evaluate_batch or evaluate_full_dataset).
  virtual RankShare evaluate() = 0;

  /// The captured step: made anew in each fit, and freed after it.
  virtual void start_step_graph(const capture::cuda_graph& options) = 0;
  virtual void free_step_graph() noexcept = 0;

  // ---- what Run's batch loop uses ----------------------------------------------------------------

  /// The training loader's chain: endless, this rank's shard (of the global batches of the rank
  /// count the run began on), skipping what was trained.
  DETTRIAL_INLINE LoaderChain training_chain() const;
  /// The validation loader's chain: one pass over this rank's shard.
  DETTRIAL_INLINE LoaderChain validation_chain() const;

  /// The trainer's pass to the Context's trainer-only calls, handed on to the pieces below.
  TrainerKey key_;
  Context& context_;
  FitOptions options_{};
  Schedule schedule_{};
  Position position_{};
  /// Declared before the checkpointer: the run folder's lock outlives a write in flight.
  Outputs outputs_{};
  Checkpointer checkpointer_{};
  /// What fit returns, filled in as it goes.
  FitResult result_{};

 private:
  DETTRIAL_INLINE void begin(FitOptions options);
  DETTRIAL_INLINE void prepare_training();
  DETTRIAL_INLINE void train();
  DETTRIAL_INLINE bool handle_boundaries(const BoundariesReached& reached);
  /// Stops (and returns true) when any rank received a stop signal or asked to stop.
  DETTRIAL_INLINE bool stop_if_asked();
  DETTRIAL_INLINE void stop_early(int signal);
  DETTRIAL_INLINE void checkpoint_unless_current();
  DETTRIAL_INLINE void validate();
  DETTRIAL_INLINE void checkpoint();
  DETTRIAL_INLINE void finish_checkpoint(bool wait);
  DETTRIAL_INLINE std::int64_t agree_across_ranks(std::int64_t loader_batches);
  DETTRIAL_INLINE void restore(const std::filesystem::path& dir, const TrialProgress& progress);
  DETTRIAL_INLINE std::int64_t data_ranks();
  /// The largest of `value` over the ranks: what every rank acts on.
  DETTRIAL_INLINE int agreed_max(int value);

  TrialTypeInfo facts_;
  ErasedCallbacks callbacks_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <utility>
#include <variant>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "../../detail/generators.hpp"
#include "../../detail/scope_exit.hpp"
#include "../../detail/signals.hpp"
#include "../../distributed/detail/agreement.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE FitLoop::FitLoop(TrainerKey key, Context& context, TrialTypeInfo facts, ErasedCallbacks callbacks)
    : key_(key), context_(context), facts_(std::move(facts)), callbacks_(callbacks) {}
DETTRIAL_INLINE FitLoop::~FitLoop() = default;

DETTRIAL_INLINE FitResult FitLoop::fit(FitOptions options) {
  check_step_capture(key_, options.step_capture, context_, facts_.training_batch_tensors_only, facts_.training_batch_type);
  begin(std::move(options));
  // However the fit ends: a checkpoint write in flight ends (a failure is a warning then), then
  // the outputs end as the fit did, the run folder's lock last.
  const auto end = on_scope_exit([&] {
    checkpointer_.settle();
    outputs_.close();
  });
  // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
  std::size_t started = 0;
  const auto shutdown = on_scope_exit([&] { callbacks_.on_trial_shutdown(started); });
  const std::string resume_uuid = position_.resume_dir() ? position_.resume_dir()->filename().string() : std::string();
  callbacks_.on_trial_startup(position_.first_batch(), resume_uuid, started);
  prepare_training();
  // The graph is made anew in each fit (a resumed run warms up and captures again) and freed after it.
  if (const auto* graph = std::get_if<capture::cuda_graph>(&options_.step_capture)) start_step_graph(*graph);
  const auto free_graph = on_scope_exit([&] { free_step_graph(); });
  announce(key_, context_, options_, schedule_, position_, outputs_.reporter());
  outputs_.announce_system_metrics();
  if (const std::optional<std::string> data = describe_training_data()) outputs_.reporter().line("dettrial: training data: " + *data);
  outputs_.start_tensorboard_session(context_);
  const StopSignals signals(options_.handle_signals);
  callbacks_.on_training_start();
  if (options_.step_zero_validation && position_.untouched()) validate();
  // A checkpoint taken where a validation was due but had not run (an earlier dettrial stopped on
  // a signal before validating): it runs first, where the uninterrupted run ran it.
  if (!position_.validated_here() && schedule_.validates_after(position_.batches_trained())) validate();
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
  outputs_.finish_system_metrics(result_.batches_trained, result_.epochs_trained);
  outputs_.end_as(result_.signal != 0 ? MlflowEnd::killed : MlflowEnd::finished);
  outputs_.write_report(context_, options_.output_dir);
  return std::move(result_);
}

/// The fit's pieces, in an order that fails before anything is written where it can: the run
/// folder's lock first, then the schedule, the checkpoint to resume from, the checkpoints'
/// storage and the outputs.
DETTRIAL_INLINE void FitLoop::begin(FitOptions options) {
  if (!context_.communicator() && context_.slots_per_trial() > 1) {
    const std::string slots = std::to_string(context_.slots_per_trial());
    throw ConfigError("resources.slots_per_trial is " + slots + ", but this process trains alone (its Context has no communicator of " +
                      slots + " ranks), so it would train on 1/" + slots +
                      " of each global batch: launch the ranks (dettrial::main does, or torchrun, srun or mpirun with a Communicator "
                      "in ContextOptions), or set slots_per_trial to 1");
  }
  options_ = std::move(options);
  if (options_.output_dir.empty()) options_.output_dir = default_output_dir();
  outputs_ = Outputs::lock(context_, options_.output_dir);
  schedule_ = Schedule::resolve(options_, context_);
  position_ = Position::find(options_);
  ContextAccess::position(key_, context_).output_dir = options_.output_dir;
  checkpointer_ = fit_checkpointer(key_, context_, options_);
  outputs_.open(context_, options_, position_.continued_at());
  result_ = FitResult{};
  result_.checkpoint_dir = checkpointer_.storage();
  result_.output_dir = options_.output_dir;
}

/// Builds the data loaders, makes the ranks agree, restores the checkpoint and sets the counters.
DETTRIAL_INLINE void FitLoop::prepare_training() {
  build_loaders();
  schedule_.keep_data_ranks(data_ranks());
  schedule_.settle_epoch_length(key_, context_, agree_across_ranks(training_epoch_length(training_chain())),
                                facts_.epochs_follow_records_per_epoch);
  if (const auto& dir = position_.resume_dir()) restore(*dir, position_.to_restore(options_.trial_id));
  schedule_.check_rank_invariant_boundaries(context_, position_.batches_trained());
  position_.start(key_, context_);
  result_.resumed_from_batch = position_.batches_trained();
  if (Communicator* comm = context_.communicator()) broadcast_modules(*comm, context_.models());  // every rank starts from rank 0's weights
  ContextAccess::start_training_step(key_, context_, options_.zero_stage);  // after the restore: ZeRO cuts the loaded state
}

// ---- the loop: train until a boundary, then handle each boundary reached ----------------------

DETTRIAL_INLINE void FitLoop::train() {
  // One endless stream for the whole run (Determined's repeat → shard → skip chain).
  open_training_stream();
  const auto close = on_scope_exit([&] { close_training_stream(); });
  Workload workload;
  while (schedule_.remaining(position_.progress()) > 0) {
    const BoundariesReached reached = train_workload(workload);
    result_.last_training_metrics = report_training(key_, context_, workload, position_.progress(), outputs_.reporter());
    callbacks_.on_training_workload_end(result_.last_training_metrics, workload.batch_metrics);
    finish_checkpoint(/*wait=*/false);  // the one written in the background, if it is durable now
    if (handle_boundaries(reached)) return;
  }
}

/// Validates and checkpoints as reached, in Determined's order (length, validation, checkpoint,
/// report), and after each acts on a stop signal or a stop request, as Determined's harness checks
/// for a preemption after each boundary: a validation due at this batch runs before a signal
/// stops the run. A workload that a signal ended between boundaries (one process) stops at once.
/// Returns true when training stops.
DETTRIAL_INLINE bool FitLoop::handle_boundaries(const BoundariesReached& reached) {
  enum class Kind { length, validation, checkpoint, report };
  const std::pair<bool, Kind> in_order[] = {{reached.length, Kind::length},
                                            {reached.validation, Kind::validation},
                                            {reached.checkpoint, Kind::checkpoint},
                                            {reached.report, Kind::report}};
  for (const auto& [hit, kind] : in_order) {
    if (!hit) continue;
    if (kind == Kind::validation && !position_.validated_here()) validate();
    if (kind == Kind::checkpoint) checkpoint_unless_current();
    if (stop_if_asked()) return true;
  }
  return !reached.any() && stop_if_asked();
}

DETTRIAL_INLINE bool FitLoop::stop_if_asked() {
  // One collective for both: twice the largest signal any rank received, plus one where a rank
  // asked to stop; every rank acts on the same answer.
  const int agreed = agreed_max(StopSignals::received() * 2 + (context_.get_stop_requested() ? 1 : 0));
  if (agreed == 0) return false;
  stop_early(agreed / 2);
  return true;
}

/// The one way training stops early: checkpoint (unless current), record why (`signal`, or 0
/// for a stop request), say so.
DETTRIAL_INLINE void FitLoop::stop_early(int signal) {
  checkpoint_unless_current();
  finish_checkpoint(/*wait=*/true);  // durable before the process exits (with 75 after a signal)
  result_.signal = signal;
  result_.stop_requested = true;
  result_.stopped_early = schedule_.remaining(position_.progress()) > 0;
  report_stop(signal, position_.batches_trained(), checkpointer_, outputs_.reporter());
}

DETTRIAL_INLINE void FitLoop::checkpoint_unless_current() {
  if (!position_.checkpointed_here()) checkpoint();
}

// ---- validation and checkpoints ------------------------------------------------------------------

DETTRIAL_INLINE void FitLoop::validate() {
  RECORD_USER_SCOPE("dettrial::validate");
  bool improved = false;
  {
    torch::NoGradGuard no_grad;
    // Validation changes nothing the training reads: what the trial's evaluation draws from the
    // random generators (a model's own sampling, a stochastic metric) is undone before anything
    // else (a checkpoint saves them), so a run trains the same numbers whatever its validation
    // period.
    const auto generators = on_scope_exit([states = GeneratorStates::record(context_.device())] { states.restore(); });
    begin_validation(key_, context_, position_.batches_trained());
    callbacks_.on_validation_start();
    outputs_.reporter().begin("validate", 0, validation_epoch_length(validation_chain()), "batches");
    std::int64_t records = 0;
    const MetricValues metrics = reduce_validation(key_, context_, evaluate(), records);
    callbacks_.on_validation_end(metrics);
    result_.last_validation_metrics = finish_validation(context_, metrics, records, position_, outputs_.reporter());
    ++result_.validations;
    improved = improves_searcher_metric(context_, options_, position_, result_.last_validation_metrics);
  }
  if (checkpointer_.after_validation(improved)) checkpoint_unless_current();
}

/// Takes a checkpoint (Determined's layout, crash-safe) and starts writing it, in the background
/// unless checkpoint_storage.async is off; the last one is finished first (one in flight at most).
DETTRIAL_INLINE void FitLoop::checkpoint() {
  RECORD_USER_SCOPE("dettrial::checkpoint");
  finish_checkpoint(/*wait=*/true);
  position_.checkpointed();
  // Compared already when a validation ran at this batch: nothing has trained since.
  agree_on_replicas(context_, position_.batches_trained(), /*compare_parameters=*/!position_.validated_here());
  const LoaderSeeds seeds = data_seeds();
  checkpointer_.begin(callbacks_, checkpoint_record(context_, options_, schedule_, position_, result_.last_validation_metrics,
                                                    seeds.training, seeds.validation, facts_.trial_type));
  finish_checkpoint(/*wait=*/false);  // a synchronous write has ended already
}

/// Once the checkpoint in flight is durable (`wait`: waiting for it): its hooks, its record and
/// report line, and retention sparing it. A collective while one is in flight.
DETTRIAL_INLINE void FitLoop::finish_checkpoint(bool wait) {
  if (const std::optional<WrittenCheckpoint> written = checkpointer_.finish(callbacks_, wait)) {  // on the chief
    result_.checkpoints.push_back(written->info);
    report_checkpoint(*written, checkpointer_, outputs_.reporter());
  }
}

/**
 * @brief Makes the ranks of a job agree before training (returns the training loader's batches per
 * epoch, `loader_batches` on this rank, as the job takes them): the epoch length is the chief's sharded
 * length (Determined's rule; a rank whose shard is a batch shorter reads on into the next epoch of
 * the endless stream), the data loaders shuffle with the chief's seeds, each rank's own RNG
 * stream (dropout) is derived from the agreed trial seed and its rank, and the fit options that
 * place boundaries must be the same on every rank.
 */
DETTRIAL_INLINE std::int64_t FitLoop::agree_across_ranks(std::int64_t loader_batches) {
  Communicator* comm = context_.communicator();
  if (!comm) return loader_batches;
  const LoaderSeeds mine = data_seeds();
  const std::vector<std::int64_t> chief =
      comm->broadcast_values({loader_batches, static_cast<std::int64_t>(mine.training.value_or(0)), mine.training ? 1 : 0,
                              static_cast<std::int64_t>(mine.validation.value_or(0)), mine.validation ? 1 : 0});
  LoaderSeeds agreed;
  if (chief[2]) agreed.training = static_cast<std::uint64_t>(chief[1]);
  if (chief[4]) agreed.validation = static_cast<std::uint64_t>(chief[3]);
  restore_data_seeds(agreed);
  schedule_.require_same_on_every_rank(*comm, context_, options_, position_.first_batch());
  ContextAccess::seed_rank_stream(key_, context_);
  return chief[0];
}

/// Restores a checkpoint: models (names and shapes checked), optimizers, schedulers, pending
/// gradients, RNGs, callbacks, and where the trial stands (`progress`).
DETTRIAL_INLINE void FitLoop::restore(const std::filesystem::path& dir, const TrialProgress& progress) {
  outputs_.warn_missing_callback_states(checkpointer_.restore(dir, callbacks_, options_.resume_fresh_parts));
  restore_data_seeds({progress.training_data_seed, progress.validation_data_seed});
  position_.restored(progress);
}

/**
 * @brief The rank count whose global batches the training data follows: the one the resumed run
 * began on, when this job has another and its training loader can keep them (a dettrial
 * DataLoader), else this job's. Checks first that the global batch divides among this job's ranks.
 */
DETTRIAL_INLINE std::int64_t FitLoop::data_ranks() {
  const std::int64_t ranks = context_.distributed().size;
  const std::int64_t began = position_.resumed_data_ranks() > 0 ? position_.resumed_data_ranks() : ranks;
  if (began == ranks) return ranks;
  Schedule::check_global_batch_divides(context_, began);
  if (keeps_global_batches(ranks, began)) return began;
  outputs_.reporter().line("warning: the training data loader is not a dettrial::DataLoader, so it cannot keep the global batches of the " +
                           std::to_string(began) + "-rank job this run began as: from batch " + std::to_string(position_.first_batch()) +
                           " on, it reads its own " + std::to_string(ranks) + "-rank shards");
  return ranks;
}

DETTRIAL_INLINE int FitLoop::agreed_max(int value) { return detail::agreed_max(context_.communicator(), value); }

DETTRIAL_INLINE LoaderChain FitLoop::training_chain() const {
  return LoaderChain{.repeat = true,
                     .skip = context_.get_initial_batch(),
                     .num_replicas = context_.distributed().size,
                     .rank = context_.distributed().rank,
                     .layout_replicas = schedule_.data_ranks()};
}

DETTRIAL_INLINE LoaderChain FitLoop::validation_chain() const {
  return LoaderChain{.repeat = false, .skip = 0, .num_replicas = context_.distributed().size, .rank = context_.distributed().rank};
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
