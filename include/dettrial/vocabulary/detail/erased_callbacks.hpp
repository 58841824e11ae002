// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::ErasedCallbacks: a fit's callbacks with their types erased, the one way they are:
/// what the trial-independent code (the fit's loop, the checkpointer, compiled once) calls.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../callbacks.hpp"
#include "../checkpoint.hpp"
#include "../metrics.hpp"

namespace dettrial::detail {

/// A callback's name in checkpoints (`callbacks/<name>` in state_dict.pth): its `name()` if it has
/// one, else `callback_<position>`.
template <class C>
std::string callback_name(const C& cb, std::size_t index) {
  if constexpr (requires { std::string(cb.name()); }) return std::string(cb.name());
  else return "callback_" + std::to_string(index);
}

/**
 * @brief The hooks of a fit's callback set that are called outside the batch loop (the fit's start
 * and end, a workload's and a validation's end, a checkpoint's writing and loading), as function
 * pointers over the set: the loop and the Checkpointer are compiled once, not in every trial's unit,
 * and call the callbacks through this alone. The per-epoch hooks, called inside the batch loop, are
 * called on the typed set in the trial's own unit. Each pointer is called at most once per fit,
 * workload, validation or checkpoint, never per batch. Made by erase_callbacks(set).
 */
class ErasedCallbacks {
 public:
  ErasedCallbacks() = default;

  /// on_trial_startup for each callback in order, counting in `started` those that started (a
  /// throwing one stops the rest).
  void on_trial_startup(std::int64_t first_batch, const std::string& resume_uuid, std::size_t& started) const {
    if (set_) startup_(set_, first_batch, resume_uuid, started);
  }
  /// on_trial_shutdown for the first `started` callbacks, last first; a failing hook is reported on
  /// stderr, not thrown (the fit is ending already, maybe with an error of its own).
  void on_trial_shutdown(std::size_t started) const noexcept {
    if (set_) shutdown_(set_, started);
  }
  void on_training_start() const {
    if (set_) training_start_(set_);
  }
  void on_validation_start() const {
    if (set_) validation_start_(set_);
  }
  /// With each batch's metrics when a callback keeps them (CallbackSet::wants_batch_metrics).
  void on_training_workload_end(const MetricValues& metrics, std::span<const Metrics> batches) const {
    if (set_) workload_end_(set_, metrics, batches);
  }
  void on_validation_end(const MetricValues& metrics) const {
    if (set_) validation_end_(set_, metrics);
  }

  /// The callbacks' state_dict()s, by callback_name.
  StateDict states() const { return set_ ? states_(set_) : empty_state_dict(); }
  void on_checkpoint_save_start(StateDict& top) const {
    if (set_) save_start_(set_, top);
  }
  void on_checkpoint_write_end(const std::filesystem::path& dir) const {
    if (set_) write_end_(set_, dir);
  }
  void on_checkpoint_upload_end(const std::string& uuid) const {
    if (set_) upload_end_(set_, uuid);
  }
  void on_checkpoint_load_start(const StateDict& top) const {
    if (set_) load_start_(set_, top);
  }
  /// load_state_dict for each callback with a state in `states`; returns the names of those
  /// without one there (the caller warns).
  std::vector<std::string> load_states(const StateDict& states) const {
    return set_ ? load_states_(set_, states) : std::vector<std::string>{};
  }

 private:
  template <class Set>
  friend ErasedCallbacks erase_callbacks(Set& set);

  void* set_ = nullptr;
  void (*startup_)(void*, std::int64_t, const std::string&, std::size_t&) = nullptr;
  void (*shutdown_)(void*, std::size_t) noexcept = nullptr;
  void (*training_start_)(void*) = nullptr;
  void (*validation_start_)(void*) = nullptr;
  void (*workload_end_)(void*, const MetricValues&, std::span<const Metrics>) = nullptr;
  void (*validation_end_)(void*, const MetricValues&) = nullptr;
  StateDict (*states_)(void*) = nullptr;
  void (*save_start_)(void*, StateDict&) = nullptr;
  void (*write_end_)(void*, const std::filesystem::path&) = nullptr;
  void (*upload_end_)(void*, const std::string&) = nullptr;
  void (*load_start_)(void*, const StateDict&) = nullptr;
  std::vector<std::string> (*load_states_)(void*, const StateDict&) = nullptr;
};

/// `set`'s hooks erased (`set`, a trainer's CallbackSet, must outlive what this returns).
template <class Set>
ErasedCallbacks erase_callbacks(Set& set) {
  ErasedCallbacks e;
  e.set_ = &set;
  e.startup_ = [](void* p, std::int64_t first_batch, const std::string& resume_uuid, std::size_t& started) {
    static_cast<Set*>(p)->each([&](auto& cb) {
      if constexpr (hook::on_trial_startup::callable<std::remove_reference_t<decltype(cb)>>)
        hook::on_trial_startup::call(cb, first_batch, resume_uuid);
      ++started;
    });
  };
  e.shutdown_ = [](void* p, std::size_t started) noexcept {
    std::size_t index = Set::size;
    static_cast<Set*>(p)->each_reversed([&](auto& cb) {
      if (index-- > started) return;
      if constexpr (hook::on_trial_shutdown::callable<std::remove_reference_t<decltype(cb)>>) {
        try {
          hook::on_trial_shutdown::call(cb);
        } catch (const std::exception& error) {
          std::fprintf(stderr, "dettrial: on_trial_shutdown failed: %s\n", error.what());
        }
      }
    });
  };
  e.training_start_ = [](void* p) { static_cast<Set*>(p)->template call<hook::on_training_start>(); };
  e.validation_start_ = [](void* p) { static_cast<Set*>(p)->template call<hook::on_validation_start>(); };
  e.workload_end_ = [](void* p, const MetricValues& metrics, std::span<const Metrics> batches) {
    static_cast<Set*>(p)->template call<hook::on_training_workload_end>(metrics, batches);
  };
  e.validation_end_ = [](void* p, const MetricValues& metrics) { static_cast<Set*>(p)->template call<hook::on_validation_end>(metrics); };
  e.states_ = [](void* p) {
    StateDict states = empty_state_dict();
    std::size_t index = 0;
    static_cast<Set*>(p)->each([&](auto& cb) {
      if constexpr (hook::state_dict::callable<std::remove_reference_t<decltype(cb)>>)
        states.insert(callback_name(cb, index), hook::state_dict::call(cb));
      ++index;
    });
    return states;
  };
  e.save_start_ = [](void* p, StateDict& top) { static_cast<Set*>(p)->template call<hook::on_checkpoint_save_start>(top); };
  e.write_end_ = [](void* p, const std::filesystem::path& dir) { static_cast<Set*>(p)->template call<hook::on_checkpoint_write_end>(dir); };
  e.upload_end_ = [](void* p, const std::string& uuid) { static_cast<Set*>(p)->template call<hook::on_checkpoint_upload_end>(uuid); };
  e.load_start_ = [](void* p, const StateDict& top) { static_cast<Set*>(p)->template call<hook::on_checkpoint_load_start>(top); };
  e.load_states_ = [](void* p, const StateDict& states) {
    std::vector<std::string> without_state;
    std::size_t index = 0;
    static_cast<Set*>(p)->each([&](auto& cb) {
      if constexpr (hook::load_state_dict::callable<std::remove_reference_t<decltype(cb)>>) {
        const std::string name = callback_name(cb, index);
        if (const auto found = states.find(name); found != states.end()) hook::load_state_dict::call(cb, found->value());
        else without_state.push_back(name);
      }
      ++index;
    });
    return without_state;
  };
  return e;
}

}  // namespace dettrial::detail
