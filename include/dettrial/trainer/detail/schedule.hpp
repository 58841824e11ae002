// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Schedule: a fit's length and periods in batches, its epoch, and which boundaries
/// a batch reaches (Determined's rule). Compiled once in separate-compilation mode.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>

#include "../../checkpoint/checkpoint.hpp"
#include "../../config/units.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../distributed/communicator.hpp"
#include "../../detail/linkage.hpp"
#include "../fit_options.hpp"

namespace dettrial::detail {

/// Which boundaries the last batch of a workload reached (Determined handles them in this order).
struct BoundariesReached {
  bool length = false;
  bool validation = false;
  bool checkpoint = false;
  bool report = false;
  bool any() const { return length || validation || checkpoint || report; }
};

/**
 * @brief When a fit trains, validates, checkpoints and reports: FitOptions' length and periods with
 * records turned into batches, the epoch in batches, and the rank count whose global batches the
 * training data follows. Resolved at the fit's start (resolve, then settle_epoch_length once the
 * loaders exist); read-only after.
 */
class Schedule {
 public:
  Schedule() = default;
  /// The options' length and periods in batches where given in records (by the global batch size);
  /// throws ConfigError for a missing, scheduled or empty max_length.
  DETTRIAL_INLINE static Schedule resolve(const FitOptions& options, const Context& context);

  /// The rank count whose global batches the training data follows (TrialProgress::data_ranks).
  void keep_data_ranks(std::int64_t ranks) { data_ranks_ = ranks; }
  /// The epoch, from the training loader's batches on this rank (the chief's: agreed already) and,
  /// where the trial's epochs follow it (`from_records`: a Keras-style trial), records_per_epoch,
  /// told to the Context; throws DataError for a loader with no batches.
  DETTRIAL_INLINE void settle_epoch_length(TrainerKey key, Context& context, std::int64_t loader_batches, bool from_records);

  const TrainUnit& length() const { return length_; }
  /// Batches per epoch (records_per_epoch's, where set and the trial's epochs follow it).
  std::int64_t epoch_len() const { return epoch_len_; }
  /// Whether the epoch is records_per_epoch's.
  bool epoch_from_records() const { return epoch_from_records_; }
  /// The training loader's own batches per epoch on this rank.
  std::int64_t data_epoch_len() const { return data_epoch_len_; }
  std::int64_t data_ranks() const { return data_ranks_; }

  std::int64_t epoch_of(std::int64_t batch_idx) const { return batch_idx / epoch_len_; }
  bool starts_epoch(std::int64_t batch_idx) const { return batch_idx % epoch_len_ == 0; }
  bool ends_epoch(std::int64_t batch_idx) const { return batch_idx % epoch_len_ == epoch_len_ - 1; }
  /// Batches (or epochs, for a length in epochs) still to train from `progress`.
  std::int64_t remaining(const TrialProgress& progress) const {
    return length_.unit() == Unit::epochs ? length_.value() - progress.epochs_trained : length_.value() - progress.batches_trained;
  }
  /// The whole length in batches (the progress bar's total).
  std::int64_t total_batches() const { return length_.unit() == Unit::epochs ? length_.value() * epoch_len_ : length_.value(); }
  /// Determined's boundary rule: batch periods on batches completed; epoch periods on the last
  /// batch of an epoch, on epochs completed.
  DETTRIAL_INLINE BoundariesReached boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const;
  /// Whether a validation is due once `batches_trained` batches are trained (none before the first).
  bool validates_after(std::int64_t batches_trained) const {
    const std::int64_t last = batches_trained - 1;
    return batches_trained > 0 && boundaries_after(last, epoch_of(last), ends_epoch(last)).validation;
  }

  /// With reproducibility.rank_invariant and aggregation, every boundary and the batch resumed at
  /// must fall on an update's last batch: the micro-batches of an update are kept apart until it,
  /// and no checkpoint holds them (throws ConfigError naming the period that does not).
  DETTRIAL_INLINE void check_rank_invariant_boundaries(const Context& context, std::int64_t resumed_at) const;
  /// What places boundaries (this schedule, and the options and batch `first_batch` that decide
  /// where each acts) must be the same on every rank: throws DistributedError naming the first
  /// that is not.
  DETTRIAL_INLINE void require_same_on_every_rank(Communicator& comm, const Context& context, const FitOptions& options,
                                                  std::int64_t first_batch) const;
  /// A run begun on `began` ranks continues on this job's: its global batch must divide among them
  /// (throws ConfigError, naming both counts, where it does not).
  DETTRIAL_INLINE static void check_global_batch_divides(const Context& context, std::int64_t began);

 private:
  TrainUnit length_ = Batch(1);
  TrainUnit validation_period_ = never();
  TrainUnit checkpoint_period_ = never();
  TrainUnit reporting_period_ = never();
  bool test_mode_ = false;
  std::int64_t epoch_len_ = 0;
  std::int64_t data_epoch_len_ = 0;
  std::int64_t data_ranks_ = 1;
  bool epoch_from_records_ = false;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../distributed/detail/agreement.hpp"
#include "../../error.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE Schedule Schedule::resolve(const FitOptions& options, const Context& context) {
  auto in_batches = [&](const TrainUnit& period) {
    return period.unit() == Unit::records ? period.in_batches_if_records(context.get_global_batch_size()) : period;
  };
  Schedule s;
  s.test_mode_ = options.test_mode;
  if (options.test_mode) {
    s.length_ = Batch(1);
  } else {
    // Unset: the searcher's length in the context's config, as Determined's Trainer.fit(max_length=None)
    // trains on a cluster.
    const std::optional<TrainUnit>& length = options.max_length ? options.max_length : context.get_experiment_config().searcher.max_length;
    if (!length)
      throw ConfigError(
          "fit() needs a training length: set FitOptions::max_length (Batch, Epoch or Record), or searcher.max_length in the "
          "context's experiment config");
    if (length->is_schedule()) throw ConfigError("max_length must be a count, not a schedule of points");
    s.length_ = in_batches(*length);
    if (s.length_.value() < 1) throw ConfigError("max_length is " + s.length_.to_string() + "; training needs a max_length of at least 1");
  }
  s.validation_period_ = in_batches(options.validation_period);
  s.checkpoint_period_ = in_batches(options.checkpoint_period);
  s.reporting_period_ = in_batches(options.reporting_period);
  return s;
}

DETTRIAL_INLINE void Schedule::settle_epoch_length(TrainerKey key, Context& context, std::int64_t loader_batches, bool from_records) {
  if (loader_batches < 1) throw DataError("the training data loader yields no batches (its size() is 0)");
  epoch_len_ = data_epoch_len_ = loader_batches;
  // Determined's records_per_epoch, for the trials whose epochs follow it (Keras-style, as its
  // TFKerasTrial's legacy sequencer): the epoch of epoch-based lengths, periods, LR steps and epoch
  // hooks, in global batches (records_per_epoch // global_batch_size, at least 1), whatever the
  // loader's own length; the data still reshuffles at its own epochs. PyTorchTrial ignores it.
  const std::int64_t records = context.get_experiment_config().records_per_epoch;
  epoch_from_records_ = from_records && records > 0;
  if (epoch_from_records_) epoch_len_ = std::max<std::int64_t>(records / context.get_global_batch_size(), 1);
  ContextAccess::position(key, context).epoch_len = epoch_len_;
}

DETTRIAL_INLINE BoundariesReached Schedule::boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const {
  auto hit = [&](const TrainUnit& u) {
    return u.unit() == Unit::epochs ? epoch_end && u.reached(epoch_idx + 1) : u.reached(batch_idx + 1);
  };
  return BoundariesReached{.length = test_mode_ || hit(length_),
                           .validation = hit(validation_period_),
                           .checkpoint = hit(checkpoint_period_),
                           .report = hit(reporting_period_)};
}

DETTRIAL_INLINE void Schedule::check_rank_invariant_boundaries(const Context& context, std::int64_t resumed_at) const {
  const std::int64_t agg = context.aggregation_frequency();
  if (!context.rank_invariant() || agg == 1) return;
  const std::pair<const char*, const TrainUnit*> periods[] = {{"max_length", &length_},
                                                              {"the validation period", &validation_period_},
                                                              {"the checkpoint period", &checkpoint_period_},
                                                              {"the reporting period", &reporting_period_}};
  for (const auto& [name, period] : periods) {
    if (period->is_never()) continue;
    const std::int64_t per_batch = period->unit() == Unit::epochs ? epoch_len_ : 1;
    std::vector<std::int64_t> ends = period->is_schedule() ? period->points() : std::vector<std::int64_t>{period->value()};
    for (const std::int64_t end : ends)
      if (end > 0 && end * per_batch % agg != 0)
        throw ConfigError(std::string("reproducibility.rank_invariant keeps an update's batches apart until its last one, so ") + name +
                          " (" + period->to_string() + (per_batch > 1 ? ", epochs of " + std::to_string(epoch_len_) + " batches" : "") +
                          ") must end on a multiple of aggregation_frequency " + std::to_string(agg) + " batches");
  }
  if (resumed_at % agg != 0)
    throw ConfigError("reproducibility.rank_invariant cannot resume at batch " + std::to_string(resumed_at) +
                      ", between the batches of an update (aggregation_frequency " + std::to_string(agg) + ")");
}

DETTRIAL_INLINE void Schedule::require_same_on_every_rank(Communicator& comm, const Context& context, const FitOptions& options,
                                                          std::int64_t first_batch) const {
  const RankSetting placing_boundaries[] = {
      {"max_length", length_.to_string()},
      {"the validation period", validation_period_.to_string()},
      {"the checkpoint period", checkpoint_period_.to_string()},
      {"the reporting period", reporting_period_.to_string()},
      {"test mode", test_mode_ ? "on" : "off"},
      {"step-zero validation", options.step_zero_validation ? "on" : "off"},
      {"the checkpoint policy", std::to_string(static_cast<int>(options.checkpoint_policy))},
      {"the searcher metric", options.searcher_metric + (options.smaller_is_better ? " (smaller is better)" : " (larger is better)")},
      {"the batch resumed from", std::to_string(first_batch)},
      {"aggregation_frequency", std::to_string(context.aggregation_frequency())},
      {"the global batch size", context.has_global_batch_size() ? std::to_string(context.get_global_batch_size()) : "-"}};
  require_same_settings(comm, placing_boundaries);
}

DETTRIAL_INLINE void Schedule::check_global_batch_divides(const Context& context, std::int64_t began) {
  const std::optional<std::int64_t> given = context.get_hparams().global_batch_size();
  if (!given) return;  // the loader's batch size is then the rank's own choice
  const std::int64_t global = *given;
  const std::int64_t ranks = context.distributed().size;
  if (global % ranks != 0)
    throw ConfigError("global_batch_size " + std::to_string(global) + " does not divide among " + std::to_string(ranks) +
                      " ranks: this run began on " + std::to_string(began) +
                      " and keeps its global batch when resumed; resume on a rank count that divides " + std::to_string(global));
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
