// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A fit's checkpoints as the trainer uses them: where they go, when a validation is followed
/// by one (the policy), writing one with its callbacks' states and hooks, restoring one, retention.
// IWYU pragma: private, include <dettrial/dettrial.hpp>
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../config/experiment_config.hpp"
#include "../context/context.hpp"
#include "../vocabulary/callbacks.hpp"
#include "../vocabulary/checkpoint.hpp"
#include "checkpoint.hpp"
#include "policy.hpp"
#include "storage.hpp"
#include "trial_checkpoint.hpp"

namespace dettrial::detail {

/// A callback's name in checkpoints (`callbacks/<name>` in state_dict.pth): its `name()` if it has
/// one, else `callback_<position>`.
template <class C>
std::string callback_name(const C& cb, std::size_t index) {
  if constexpr (requires { std::string(cb.name()); }) return std::string(cb.name());
  else return "callback_" + std::to_string(index);
}

/// A checkpoint the chief wrote, and how long writing it took.
struct WrittenCheckpoint {
  CheckpointInfo info;
  double seconds = 0;
};

/**
 * @brief The checkpoints of one fit (Determined's layout, crash-safe; checkpoint/ writes the files).
 * Every rank holds one: writing and restoring are collectives; the chief writes the files, keeps the
 * sequence and applies retention.
 */
class Checkpointer {
 public:
  Checkpointer() = default;
  /// On the chief, removes what an interrupted writer left in `storage` and continues its sequence.
  Checkpointer(Context& context, std::filesystem::path storage, CheckpointPolicy policy, Retention retention, bool smaller_is_better)
      : context_(&context),
        storage_(std::move(storage)),
        after_validation_(checkpoint_policy::visit(policy, []<class P>(P) { return &P::after_validation; })),
        retention_(retention),
        smaller_is_better_(smaller_is_better) {
    if (!context.distributed().is_chief()) return;
    remove_stale_entries(storage_);
    const auto existing = list_checkpoints(storage_);
    sequence_ = existing.empty() ? 0 : existing.back().sequence;
  }

  const std::filesystem::path& storage() const { return storage_; }

  /// Whether a validation is followed by a checkpoint, given whether it improved the searcher metric.
  bool after_validation(bool improved) const { return after_validation_(improved); }

  /**
   * @brief Writes a checkpoint of the Context's state and the callbacks' (`record.sequence` is the
   * next of this storage), with the checkpoint hooks. A collective: every rank's RNG states go to
   * the chief, which writes; the others learn its uuid and get nullopt.
   */
  template <class Set>
  std::optional<WrittenCheckpoint> write(Set& callbacks, TrialCheckpointRecord record) {
    const RankRngStates rng = gather_rng_states(*context_);
    if (!context_->distributed().is_chief()) {
      callbacks.template call<hook::on_checkpoint_upload_end>(share_uuid(context_->communicator(), {}));
      return std::nullopt;
    }
    const auto started = std::chrono::steady_clock::now();
    StateDict top = trial_state_dict(*context_, rng, callback_states(callbacks));
    callbacks.template call<hook::on_checkpoint_save_start>(top);
    record.sequence = ++sequence_;
    const CheckpointInfo info = write_trial_checkpoint(*context_, storage_, top, record);
    share_uuid(context_->communicator(), info.uuid);
    callbacks.template call<hook::on_checkpoint_write_end>(info.path);
    callbacks.template call<hook::on_checkpoint_upload_end>(info.uuid);
    return WrittenCheckpoint{info, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()};
  }

  /**
   * @brief Restores checkpoint `dir` into the Context (models, names and shapes checked first;
   * optimizers, schedulers, pending gradients, RNGs) and the callbacks that keep state. Returns the
   * names of the callbacks with state that the checkpoint has none for.
   */
  template <class Set>
  std::vector<std::string> restore(const std::filesystem::path& dir, Set& callbacks, bool fresh_parts = false) {
    const StateDict top = read_state_dict_file(dir);
    callbacks.template call<hook::on_checkpoint_load_start>(top);
    restore_context(*context_, dir, top, fresh_parts);
    const StateDict states = callback_states_of(top);
    std::vector<std::string> without_state;
    std::size_t index = 0;
    callbacks.each([&](auto& cb) {
      if constexpr (hook::load_state_dict::callable<std::remove_reference_t<decltype(cb)>>) {
        const std::string name = callback_name(cb, index);
        if (const auto found = states.find(name); found != states.end()) hook::load_state_dict::call(cb, found->value());
        else without_state.push_back(name);
      }
      ++index;
    });
    return without_state;
  }

  /// Deletes the checkpoints retention lets go; `keep_uuid` (the newest, mid-trial) is spared.
  void apply_retention(std::string_view keep_uuid) const {
    for (const CheckpointInfo& doomed : checkpoints_to_delete(list_checkpoints(storage_), retention_, smaller_is_better_, keep_uuid))
      delete_checkpoint(doomed);
  }

 private:
  template <class Set>
  static StateDict callback_states(Set& callbacks) {
    StateDict states(c10::StringType::get(), c10::AnyType::get());
    std::size_t index = 0;
    callbacks.each([&](auto& cb) {
      if constexpr (hook::state_dict::callable<std::remove_reference_t<decltype(cb)>>)
        states.insert(callback_name(cb, index), hook::state_dict::call(cb));
      ++index;
    });
    return states;
  }

  Context* context_ = nullptr;
  std::filesystem::path storage_;
  bool (*after_validation_)(bool improved) = &checkpoint_policy::best::after_validation;
  Retention retention_{};
  bool smaller_is_better_ = true;
  std::int64_t sequence_ = 0;
};

}  // namespace dettrial::detail
