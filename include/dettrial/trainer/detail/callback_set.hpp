// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Callbacks as the trainer holds them: each type checked once against the hook table
/// (vocabulary/callbacks.hpp), and a set of them called hook by hook.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../../checkpoint/state_dict.hpp"
#include "../../vocabulary/callbacks.hpp"
#include "../../vocabulary/metrics.hpp"

namespace dettrial::detail {

/// Checks each callback type once: a sentence instead of silence for a hook-less (misspelt) one, and
/// for a hook declared with the wrong parameters.
template <class C>
consteval bool check_callback() {
  static_assert(Callback<C>,
                "dettrial callback: this type has none of dettrial's callback hooks (on_training_start, "
                "on_training_epoch_end, on_validation_end, ...); check the hook names and parameter types");
  return check_hooks<C>(static_cast<hook::all*>(nullptr));
}

/// A tuple of references to the callbacks of one fit: the trial's own, then the caller's.
template <class... C>
class CallbackSet {
 public:
  static constexpr std::size_t size = sizeof...(C);
  // One callback's check alone would be a statement without effect (-Wunused-value): folded with &&.
  explicit CallbackSet(std::tuple<C&...> callbacks) : callbacks_(callbacks) { static_cast<void>((check_callback<C>() && ...)); }

  /// Calls `Hook` on every callback that has it, in order, with the table's argument types.
  template <class Hook, class... A>
  void call(A&&... args) {
    std::apply([&](auto&... cb) { (call_one<Hook>(cb, args...), ...); }, callbacks_);
  }
  /// Calls `f(callback)` for each callback, in order (reversed: last first).
  template <class F>
  void each(F&& f) {
    std::apply([&](auto&... cb) { (f(cb), ...); }, callbacks_);
  }
  template <class F>
  void each_reversed(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::get<sizeof...(C) - 1 - I>(callbacks_)), ...);
    }(std::index_sequence_for<C...>{});
  }
  /// Whether any callback wants per-batch training metrics (only then are they kept).
  static constexpr bool wants_batch_metrics = (hook::on_training_workload_end::takes_batches<C> || ...);
  /// Whether any callback wants the per-batch validation outputs.
  static constexpr bool wants_validation_outputs = (hook::on_validation_epoch_end::callable<C> || ...);

 private:
  template <class Hook, class Callback, class... A>
  static void call_one(Callback& cb, A&... args) {
    if constexpr (Hook::template callable<Callback>) Hook::call(cb, args...);
  }
  std::tuple<C&...> callbacks_;
};

}  // namespace dettrial::detail
