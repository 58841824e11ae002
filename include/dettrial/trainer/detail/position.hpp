// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Position: where a fit stands (its TrialProgress) and what the checkpoint it
/// resumed from said. Compiled once in separate-compilation mode.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

#include "../../checkpoint/checkpoint.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../detail/linkage.hpp"
#include "../fit_options.hpp"

namespace dettrial::detail {

/**
 * @brief Where a fit stands: batches and epochs trained, the last validation and checkpoint, the
 * best searcher metric (what a checkpoint saves as `trial_state.json`), and the checkpoint it
 * resumed from. Found before anything is written (find), restored with the checkpoint (restored),
 * then moved by the loop one batch, epoch, validation and checkpoint at a time.
 */
class Position {
 public:
  Position() = default;
  /// FitOptions::latest_checkpoint resolved to one checkpoint, and where it says its trial stood
  /// (its `trial_state.json`, or what Determined wrote); a fresh position without one. Throws
  /// CheckpointError for a checkpoint that cannot be read.
  DETTRIAL_INLINE static Position find(const FitOptions& options);

  const TrialProgress& progress() const { return progress_; }
  std::int64_t batches_trained() const { return progress_.batches_trained; }
  std::int64_t epochs_trained() const { return progress_.epochs_trained; }

  // ---- what the resumed checkpoint said --------------------------------------------------------
  const std::optional<std::filesystem::path>& resume_dir() const { return resume_dir_; }
  /// Whether the checkpoint resumed from is this trial's own (else only its weights and optimizer
  /// state are taken, and counting starts afresh: Determined's warm start).
  bool same_trial() const { return same_trial_; }
  /// The batch this fit starts from: the one this trial's resumed checkpoint stood at.
  std::int64_t first_batch() const { return same_trial_ ? resumed_->batches_trained : 0; }
  /// first_batch() where this fit continues its own trial.
  std::optional<std::int64_t> continued_at() const { return same_trial_ ? std::optional(resumed_->batches_trained) : std::nullopt; }
  /// The ranks of the job that wrote this trial's resumed checkpoint, and the rank count whose
  /// global batches its data followed (0: not recorded, or not this trial's).
  std::int64_t resumed_ranks() const { return same_trial_ ? resumed_->ranks : 0; }
  std::int64_t resumed_data_ranks() const { return same_trial_ ? resumed_->data_ranks : 0; }
  /// What a restore reads into: the resumed trial's position, or a fresh one of `trial_id`.
  TrialProgress to_restore(std::int64_t trial_id) const { return same_trial_ ? *resumed_ : TrialProgress{.trial_id = trial_id}; }
  /// The checkpoint was restored: the fit stands where it says, and the Context's training stream
  /// starts there.
  DETTRIAL_INLINE void restored(TrialProgress progress);
  /// The Context's position (what the training stream skips, the current batch) from this one.
  DETTRIAL_INLINE void start(TrainerKey key, Context& context) const;

  // ---- moved by the loop -----------------------------------------------------------------------
  void batch_trained() { ++progress_.batches_trained; }
  void epoch_trained() { ++progress_.epochs_trained; }
  bool validated_here() const { return progress_.last_validation == progress_.batches_trained; }
  bool checkpointed_here() const { return progress_.last_checkpoint == progress_.batches_trained; }
  /// Nothing trained and nothing validated yet (step-zero validation's condition).
  bool untouched() const { return progress_.batches_trained == 0 && progress_.last_validation < 0; }
  void validated() { progress_.last_validation = progress_.batches_trained; }
  void checkpointed() { progress_.last_checkpoint = progress_.batches_trained; }
  /// `value` of the searcher metric is the best validated so far.
  void keep_best(double value) { progress_.best_validation = value; }
  /// What a checkpoint saves as `trial_state.json`: this position, with the trial, the loaders'
  /// data seeds and the ranks.
  DETTRIAL_INLINE TrialProgress saved(std::int64_t trial_id, std::optional<std::uint64_t> training_data_seed,
                                      std::optional<std::uint64_t> validation_data_seed, std::int64_t ranks, std::int64_t data_ranks) const;

 private:
  TrialProgress progress_{};
  std::optional<std::filesystem::path> resume_dir_{};
  std::optional<TrialProgress> resumed_{};
  bool same_trial_ = false;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <utility>

#include "../../checkpoint/storage.hpp"
#include "../../layout.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE Position Position::find(const FitOptions& options) {
  Position p;
  if (!options.latest_checkpoint) return p;
  p.resume_dir_ = resolve_checkpoint(*options.latest_checkpoint);
  const CheckpointInfo info = read_checkpoint_info(*p.resume_dir_);
  if (info.by_determined) {
    // Determined's trial ids belong to its master, which a moved run leaves behind: a checkpoint
    // Determined wrote is this trial's own, continued where it stood.
    p.resumed_ = TrialProgress::from_determined(*p.resume_dir_, info);
    p.resumed_->trial_id = options.trial_id;
  } else {
    p.resumed_ = TrialProgress::from_json(CheckpointFolder{*p.resume_dir_}.trial_state());
  }
  p.same_trial_ = p.resumed_->trial_id == options.trial_id;
  return p;
}

DETTRIAL_INLINE void Position::restored(TrialProgress progress) { progress_ = std::move(progress); }

DETTRIAL_INLINE void Position::start(TrainerKey key, Context& context) const {
  RunPosition& position = ContextAccess::position(key, context);
  position.initial_batch = progress_.batches_trained;  // the training stream skips what was trained
  position.current_batch = progress_.batches_trained;
}

DETTRIAL_INLINE TrialProgress Position::saved(std::int64_t trial_id, std::optional<std::uint64_t> training_data_seed,
                                              std::optional<std::uint64_t> validation_data_seed, std::int64_t ranks,
                                              std::int64_t data_ranks) const {
  TrialProgress saved = progress_;
  saved.trial_id = trial_id;
  saved.training_data_seed = training_data_seed;
  saved.validation_data_seed = validation_data_seed;
  saved.ranks = ranks;
  saved.data_ranks = data_ranks;
  return saved;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
