// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What only dettrial's trainer and checkpoints do with a Context (its run's position, the
/// registrations and the training step as they drive them), behind a key only a Trainer makes.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../config/experiment_config.hpp"
#include "../../detail/linkage.hpp"
#include "../context.hpp"

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
}  // namespace dettrial::detail

namespace dettrial::detail {
/**
 * @brief The one way into what only dettrial's trainer and checkpoints do with a Context: the run's
 * position, the registrations and the training step as they drive them, and the registrations'
 * lifetime. Context keeps these private, so a trial's view of its context (its public members)
 * holds only what Determined's context offers a trial; and each call takes a TrainerKey, which only
 * a Trainer makes.
 */
struct ContextAccess {
  static RunPosition& position(TrainerKey, Context& c) { return c.position_; }
  static ReducerSet& reducers(TrainerKey, Context& c) { return c.registrations_.reducers(); }
  /// Wrapped LR scheduler `i` (type-erased: how to step, save and restore it), in wrap order.
  static const WrappedScheduler& lr_scheduler(TrainerKey, const Context& c, std::size_t i) { return c.registrations_.lr_schedulers()[i]; }
  /// The wrapped LR schedulers, for the loop to step after an update batch.
  static std::span<WrappedScheduler> lr_schedulers(TrainerKey, Context& c) { return c.registrations_.lr_schedulers(); }
  /// The wrapped average, or null.
  static detail::ScheduledAverage* average(TrainerKey, Context& c) { return c.registrations_.average(); }
  static bool has_registrations(TrainerKey, const Context& c) { return c.registrations_.any(); }
  static void release_registrations(TrainerKey, Context& c) { c.release_registrations(); }
  static void seed_rank_stream(TrainerKey, const Context& c) { detail::seed_rank_stream(c.setup_); }

  /// When a fit starts, after its checkpoint is restored: ZeRO `stage` checked and started (see
  /// TrainingStep::start_fit).
  static void start_training_step(TrainerKey, Context& c, ZeroStage stage);
  /// Begins training batch `position().current_batch` of `records` records (with rank_invariant,
  /// its random draws seeded from its place in the data stream).
  static void begin_training_batch(TrainerKey, Context& c, std::int64_t records);
  /// Ends the training batch, after train_batch and before the loop steps what it owns after an
  /// update (the LR schedulers and the average, trainer/after_update.hpp): on an update batch the
  /// scaler's update, once however many optimizers stepped; on the others, with rank_invariant,
  /// the micro-batch's gradients stashed.
  static void finish_batch(TrainerKey, Context& c);
  /// For the checkpoint being taken: the optimizers' whole state (ZeRO's pieces gathered on the
  /// chief; a collective there), dropped when the result ends.
  [[nodiscard]] static WholeStates whole_optimizer_states(TrainerKey, Context& c);
};
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
// The training step's calls are among them: a trial's unit reads neither its modes nor std::visit.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../step/detail/training_step.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void ContextAccess::start_training_step(TrainerKey, Context& c, ZeroStage stage) {
  c.step_->start_fit(stage, c.registrations_.optimizers());
}

DETTRIAL_INLINE void ContextAccess::begin_training_batch(TrainerKey, Context& c, std::int64_t records) {
  c.step_->begin_batch(c.position_.current_batch, records);
}

DETTRIAL_INLINE void ContextAccess::finish_batch(TrainerKey, Context& c) {
  c.step_->finish_batch(c.registrations_.optimizers(), c.is_update_batch());
}

DETTRIAL_INLINE WholeStates ContextAccess::whole_optimizer_states(TrainerKey, Context& c) {
  return c.step_->whole_states(c.registrations_.optimizers());
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
