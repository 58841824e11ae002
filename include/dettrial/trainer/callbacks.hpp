// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Callbacks: plain objects whose hooks are called only if they have them (found at compile time).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "../metrics/metrics.hpp"

namespace dettrial {

/**
 * @brief A callback: any object with at least one of Determined's PyTorchCallback hooks:
 * `on_trial_startup(first_batch_idx, checkpoint)`, `on_trial_shutdown()`, `on_training_start()`,
 * `on_training_epoch_start(epoch_idx)`, `on_training_epoch_end(epoch_idx)`,
 * `on_training_workload_end(avg_metrics[, batch_metrics])`, `on_validation_start()`,
 * `on_validation_epoch_start()`, `on_validation_epoch_end(outputs)`, `on_validation_end(metrics)`.
 * A hook a callback does not have costs nothing. Checkpoint hooks: `on_checkpoint_save_start(StateDict&)`
 * (may add entries to state_dict.pth), `on_checkpoint_write_end(path)` (chief only),
 * `on_checkpoint_upload_end(uuid)`, `on_checkpoint_load_start(const StateDict&)`. A callback with
 * state has `state_dict()` (returning anything convertible to `c10::IValue`) and
 * `load_state_dict(const c10::IValue&)`: its state is saved under `callbacks/<name()>` (or
 * `callback_<position>`) and restored on resume.
 */
template <class C>
concept Callback = requires(C& c, std::int64_t i, const std::string& s, const MetricValues& m,
                            std::span<const Metrics> batches, std::span<const Metrics> outputs) {
  requires requires { c.on_trial_startup(i, s); } || requires { c.on_trial_shutdown(); } ||
               requires { c.on_training_start(); } || requires { c.on_training_epoch_start(i); } ||
               requires { c.on_training_epoch_end(i); } || requires { c.on_training_workload_end(m, batches); } ||
               requires { c.on_training_workload_end(m); } || requires { c.on_validation_start(); } ||
               requires { c.on_validation_epoch_start(); } || requires { c.on_validation_epoch_end(outputs); } ||
               requires { c.on_validation_end(m); } || requires { &C::on_checkpoint_save_start; } ||
               requires { &C::on_checkpoint_load_start; } || requires { &C::on_checkpoint_write_end; } ||
               requires { &C::on_checkpoint_upload_end; } || requires { &C::state_dict; };
};

namespace detail {

/// Checks each callback type once, with a sentence instead of silence for a hook-less (misspelt) one.
template <class C>
consteval bool check_callback() {
  static_assert(Callback<C>,
                "dettrial callback: this type has none of dettrial's callback hooks (on_training_start, "
                "on_training_epoch_end, on_validation_end, ...); check the hook names and parameter types");
  return true;
}

template <class C>
inline constexpr bool wants_batch_metrics_v =
    requires(C& c, const MetricValues& m, std::span<const Metrics> b) { c.on_training_workload_end(m, b); };
template <class C>
inline constexpr bool wants_validation_outputs_v = requires(C& c, std::span<const Metrics> o) { c.on_validation_epoch_end(o); };

/// A tuple of references to the callbacks of one fit: the trial's own, then the caller's.
template <class... C>
class CallbackSet {
 public:
  static constexpr std::size_t size = sizeof...(C);
  explicit CallbackSet(std::tuple<C&...> callbacks) : callbacks_(callbacks) { (check_callback<C>(), ...); }

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
  static constexpr bool wants_batch_metrics = (wants_batch_metrics_v<C> || ...);
  /// Whether any callback wants the per-batch validation outputs.
  static constexpr bool wants_validation_outputs = (wants_validation_outputs_v<C> || ...);

 private:
  std::tuple<C&...> callbacks_;
};

}  // namespace detail
}  // namespace dettrial
