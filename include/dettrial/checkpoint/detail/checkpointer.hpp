// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A fit's checkpoints as the trainer uses them: where they go, when a validation is followed
/// by one (the policy), writing one with its callbacks' states and hooks, restoring one, retention.
// IWYU pragma: private, include <dettrial/dettrial.hpp>
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../../config/experiment_config.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../vocabulary/detail/erased_callbacks.hpp"
#include "../../vocabulary/checkpoint.hpp"
#include "../checkpoint.hpp"
#include "../state_dict.hpp"
#include "../../detail/text.hpp"
#include "../../distributed/communicator.hpp"
#include "../policy.hpp"
#include "snapshot.hpp"
#include "../storage.hpp"
#include "trial_checkpoint.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// A checkpoint the chief wrote: how long training stood still for it (taking the snapshot, or the
/// whole write when synchronous), and how long the write took from there.
struct WrittenCheckpoint {
  CheckpointInfo info;
  double seconds = 0;
  double write_seconds = 0;
};

/**
 * @brief The checkpoints of one fit (Determined's layout, crash-safe; checkpoint/ writes the files).
 * Every rank holds one: writing and restoring are collectives; the chief writes the files, keeps the
 * sequence and applies retention.
 *
 * Writing is in two steps. begin() takes the checkpoint at a boundary: the state is copied into the
 * snapshot's host memory, and a background thread serializes, checksums, writes, syncs and renames
 * while training goes on (asynchronous, the default), or does so before begin() returns. finish()
 * hands over a checkpoint once it is durable; what depends on that (its hooks, retention, the
 * report, the searcher's record) comes after. One checkpoint is in flight at most: begin() first
 * waits for the last, and that wait is counted (take_waited_seconds()).
 */
class Checkpointer {
 public:
  // Out of line (compiled once in separate compilation), as a BatchLoop<T> of every trial makes, moves
  // and ends one.
  DETTRIAL_INLINE Checkpointer();
  /// On the chief, removes what an interrupted writer left in `storage` and continues its sequence.
  DETTRIAL_INLINE Checkpointer(TrainerKey key, Context& context, std::filesystem::path storage, CheckpointPolicy policy,
                               Retention retention, bool smaller_is_better, bool asynchronous = true);
  DETTRIAL_INLINE Checkpointer(Checkpointer&&) noexcept;
  DETTRIAL_INLINE Checkpointer& operator=(Checkpointer&&) noexcept;
  DETTRIAL_INLINE ~Checkpointer();

  const std::filesystem::path& storage() const { return storage_; }

  /// Whether a validation is followed by a checkpoint, given whether it improved the searcher metric.
  bool after_validation(bool improved) const { return after_validation_(improved); }

  /**
   * @brief Takes a checkpoint of the Context's state and the callbacks' (`record.sequence` is the
   * next of this storage) and starts writing it, with on_checkpoint_save_start. A collective: every
   * rank's RNG states go to the chief, which writes. The checkpoint in flight must have been
   * finished first (finish with `wait`).
   */
  DETTRIAL_INLINE void begin(const ErasedCallbacks& callbacks, TrialCheckpointRecord record);

  /**
   * @brief The checkpoint in flight, once it is durable (with `wait`, waiting for it), after its
   * hooks: on_checkpoint_write_end on the chief, on_checkpoint_upload_end with its uuid on every
   * rank. A collective while a checkpoint is in flight: every rank calls it at the same places.
   * nullopt while it is still being written, and on the ranks other than the chief. A write that
   * failed is a CheckpointError on every rank, naming the file on the chief.
   */
  DETTRIAL_INLINE std::optional<WrittenCheckpoint> finish(const ErasedCallbacks& callbacks, bool wait);

  /// Waits for a write in flight without its hooks (the fit is ending, perhaps failing): the
  /// checkpoint is completed, or its failure said in a warning. Not a collective.
  void settle() noexcept {
    if (!in_flight_) return;
    in_flight_ = false;
    if (!write_.in_flight()) return;
    try {
      (void)write_.collect();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the checkpoint in flight was not written: %s\n", first_line(e.what()).c_str());
    }
  }

  /// Seconds spent waiting in finish(wait) for writes still in progress since the last call.
  double take_waited_seconds() { return std::exchange(waited_, 0.0); }

  /**
   * @brief Restores checkpoint `dir` into the Context (models, names and shapes checked first;
   * optimizers, schedulers, pending gradients, RNGs) and the callbacks that keep state. Returns the
   * names of the callbacks with state that the checkpoint has none for.
   */
  DETTRIAL_INLINE std::vector<std::string> restore(const std::filesystem::path& dir, const ErasedCallbacks& callbacks,
                                                   bool fresh_parts = false);

  /// Deletes the checkpoints retention lets go; `keep_uuid` (the newest, mid-trial) is spared.
  void apply_retention(std::string_view keep_uuid) const {
    for (const CheckpointInfo& doomed : checkpoints_to_delete(list_checkpoints(storage_), retention_, smaller_is_better_, keep_uuid))
      delete_checkpoint(doomed);
  }

 private:
  /// How long a background write may take: half the time since the last checkpoint began (or since
  /// the fit began), so that it ends well before the next, at most a minute (a checkpoint is not
  /// left undurable for long). Paced over that time, the writer takes a thin share of many steps'
  /// CPU rather than a thick share of a few; whoever waits for it hurries it.
  std::chrono::duration<double> write_budget(std::chrono::steady_clock::time_point now) const {
    return std::min(std::chrono::duration<double>(now - last_begun_) / 2, std::chrono::duration<double>(60.0));
  }

  /// Whether a snapshot of `top` fits in host memory: at most half of what the system has
  /// available. Said once when it does not: checkpoints are then written in the step loop.
  bool snapshot_fits(const StateDict& top) {
    if (snapshot_.bytes() > 0) return true;  // taken before: the memory is held already
    const std::size_t needed = tensor_bytes(top), available = available_memory();
    if (available == 0 || needed <= available / 2) return true;
    if (!said_too_large_)
      std::fprintf(stderr,
                   "dettrial: warning: a snapshot of the state takes %.1f GB and the system has %.1f GB available: checkpoints "
                   "are written in the step loop, as with checkpoint_storage.async false\n",
                   static_cast<double>(needed) / 1e9, static_cast<double>(available) / 1e9);
    said_too_large_ = true;
    return false;
  }

  /// The trainer's pass (detail::TrainerKey); none in a Checkpointer made empty.
  std::optional<TrainerKey> key_;
  Context* context_ = nullptr;
  std::filesystem::path storage_;
  bool (*after_validation_)(bool improved) = &checkpoint_policy::best::after_validation;
  Retention retention_{};
  bool smaller_is_better_ = true;
  bool asynchronous_ = true;
  std::int64_t sequence_ = 0;
  bool in_flight_ = false;
  HostSnapshot snapshot_;
  BackgroundWrite write_;
  std::chrono::steady_clock::time_point taken_at_{};
  std::chrono::steady_clock::time_point last_begun_ = std::chrono::steady_clock::now();
  double stood_still_ = 0;
  double waited_ = 0;
  bool said_too_large_ = false;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE Checkpointer::Checkpointer() = default;

DETTRIAL_INLINE Checkpointer::Checkpointer(TrainerKey key, Context& context, std::filesystem::path storage, CheckpointPolicy policy,
                                           Retention retention, bool smaller_is_better, bool asynchronous)
    : key_(key),
      context_(&context),
      storage_(std::move(storage)),
      after_validation_(checkpoint_policy::visit(policy, []<class P>(P) { return &P::after_validation; })),
      retention_(retention),
      smaller_is_better_(smaller_is_better),
      asynchronous_(asynchronous) {
  if (!context.distributed().is_chief()) return;
  remove_stale_entries(storage_);
  const auto existing = list_checkpoints(storage_);
  sequence_ = existing.empty() ? 0 : existing.back().sequence;
}

DETTRIAL_INLINE Checkpointer::Checkpointer(Checkpointer&&) noexcept = default;
DETTRIAL_INLINE Checkpointer& Checkpointer::operator=(Checkpointer&&) noexcept = default;
DETTRIAL_INLINE Checkpointer::~Checkpointer() = default;

DETTRIAL_INLINE void Checkpointer::begin(const ErasedCallbacks& callbacks, TrialCheckpointRecord record) {
  const auto started = std::chrono::steady_clock::now();
  const RankRngStates rng = gather_rng_states(*context_);
  const detail::WholeStates whole_optimizer_states =
      detail::ContextAccess::whole_optimizer_states(*key_, *context_);  // ZeRO's, on the chief
  in_flight_ = true;
  if (!context_->distributed().is_chief()) return;
  StateDict top = trial_state_dict(*key_, *context_, rng, callbacks.states());
  callbacks.on_checkpoint_save_start(top);
  record.sequence = ++sequence_;
  const bool background = asynchronous_ && snapshot_fits(top);
  if (!background) {
    write_.run_here([&] {
      TakenCheckpoint taken = take_checkpoint(*key_, *context_, storage_, top, record, nullptr);
      return write_checkpoint_files(taken);
    });
  } else {
    auto taken = std::make_shared<TakenCheckpoint>(take_checkpoint(*key_, *context_, storage_, top, record, &snapshot_));
    auto pace = std::make_shared<WritePace>(write_budget(started), snapshot_.bytes());
    write_.start([taken, pace] { return write_checkpoint_files(*taken, pace.get()); }, pace);
  }
  last_begun_ = started;
  taken_at_ = std::chrono::steady_clock::now();
  stood_still_ = std::chrono::duration<double>(taken_at_ - started).count();
}

DETTRIAL_INLINE std::optional<WrittenCheckpoint> Checkpointer::finish(const ErasedCallbacks& callbacks, bool wait) {
  if (!in_flight_) return std::nullopt;
  const bool chief = context_->distributed().is_chief();
  const auto asked = std::chrono::steady_clock::now();
  enum : std::int64_t { writing = 0, written = 1, failed = 2 };
  std::int64_t status = writing;
  std::optional<CheckpointInfo> info;
  std::string error;
  if (chief && (wait || write_.ended())) {
    try {
      info = write_.collect();
      status = written;
    } catch (const std::exception& e) {
      error = first_line(e.what());
      status = failed;
    }
  }
  if (Communicator* comm = context_->communicator()) status = comm->broadcast_values({status})[0];
  const auto ended = std::chrono::steady_clock::now();
  if (wait) waited_ += std::chrono::duration<double>(ended - asked).count();
  if (status == writing) return std::nullopt;
  in_flight_ = false;
  if (status == failed)
    throw CheckpointError(chief ? "the checkpoint could not be written: " + error
                                : std::string("the chief rank could not write the checkpoint (its log says why)"));
  const std::string uuid = share_uuid(context_->communicator(), chief ? info->uuid : std::string());
  if (chief) callbacks.on_checkpoint_write_end(info->path);
  callbacks.on_checkpoint_upload_end(uuid);
  if (!chief) return std::nullopt;
  return WrittenCheckpoint{*info, stood_still_, std::chrono::duration<double>(ended - taken_at_).count()};
}

DETTRIAL_INLINE std::vector<std::string> Checkpointer::restore(const std::filesystem::path& dir, const ErasedCallbacks& callbacks,
                                                               bool fresh_parts) {
  const StateDict top = read_state_dict_file(dir);
  callbacks.on_checkpoint_load_start(top);
  restore_context(*key_, *context_, dir, top, fresh_parts);
  return callbacks.load_states(callback_states_of(top));
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
