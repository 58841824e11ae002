// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The callback vocabulary: the one table of callback hooks (found at compile time) and what
/// a callback is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

#include "checkpoint.hpp"
#include "metrics.hpp"

namespace dettrial {

/**
 * @brief The callback hooks, one type each: the table both the compile-time check and the trainer's
 * calls use. Each names the hook and the arguments the trainer passes (Determined's PyTorchCallback).
 *
 * A callback declaring a hook by name (a non-overloaded member) that cannot be called with these
 * arguments is a compile error naming the hook, never a hook silently not called.
 */
}  // namespace dettrial

namespace dettrial::hook {

// NAME: the member function; ...: the argument types the trainer passes, in order. A hook whose
// member is a template or an overload set is found by calling it, not by name.
#define DETTRIAL_DETAIL_CALLBACK_HOOK(NAME, ...)                                                                     \
  struct NAME {                                                                                                      \
    static constexpr const char* name = #NAME;                                                                       \
    using arguments = std::tuple<__VA_ARGS__>;                                                                       \
    template <class C>                                                                                               \
    static constexpr bool named_in = requires { &C::NAME; };                                                         \
    template <class C, class... A>                                                                                   \
    static consteval bool callable_with(std::tuple<A...>*) {                                                         \
      return requires(C& c, A... a) { c.NAME(std::forward<A>(a)...); };                                              \
    }                                                                                                                \
    template <class C>                                                                                               \
    static constexpr bool callable = callable_with<C>(static_cast<arguments*>(nullptr));                             \
    template <class C, class... A>                                                                                   \
    static void call(C& c, A&&... a) {                                                                               \
      c.NAME(std::forward<A>(a)...);                                                                                 \
    }                                                                                                                \
    template <class C>                                                                                               \
    static consteval bool check() {                                                                                  \
      static_assert(!named_in<C> || callable<C>,                                                                     \
                    "dettrial callback: " #NAME " is declared but cannot be called as " #NAME "(" #__VA_ARGS__ ")"); \
      return true;                                                                                                   \
    }                                                                                                                \
  };

DETTRIAL_DETAIL_CALLBACK_HOOK(on_trial_startup, std::int64_t, const std::string&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_trial_shutdown)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_epoch_start, std::int64_t)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_epoch_end, std::int64_t)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_epoch_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_epoch_end, std::span<const Metrics>)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_end, const MetricValues&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_save_start, StateDict&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_write_end, const std::filesystem::path&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_upload_end, const std::string&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_load_start, const StateDict&)
DETTRIAL_DETAIL_CALLBACK_HOOK(load_state_dict, const c10::IValue&)
#undef DETTRIAL_DETAIL_CALLBACK_HOOK

/// `on_training_workload_end(avg_metrics[, batch_metrics])`: the one hook with two forms (the
/// per-batch metrics are kept only when a callback takes them).
struct on_training_workload_end {
  static constexpr const char* name = "on_training_workload_end";
  template <class C>
  static constexpr bool named_in = requires { &C::on_training_workload_end; };
  template <class C>
  static constexpr bool takes_batches =
      requires(C& c, const MetricValues& m, std::span<const Metrics> b) { c.on_training_workload_end(m, b); };
  template <class C>
  static constexpr bool callable = takes_batches<C> || requires(C& c, const MetricValues& m) { c.on_training_workload_end(m); };
  template <class C>
  static void call(C& c, const MetricValues& metrics, std::span<const Metrics> batches) {
    if constexpr (takes_batches<C>) c.on_training_workload_end(metrics, batches);
    else c.on_training_workload_end(metrics);
  }
  template <class C>
  static consteval bool check() {
    static_assert(
        !named_in<C> || callable<C>,
        "dettrial callback: on_training_workload_end is declared but cannot be called as "
        "on_training_workload_end(const MetricValues&) or on_training_workload_end(const MetricValues&, std::span<const Metrics>)");
    return true;
  }
};

/// `state_dict()`: a callback's state for checkpoints, anything convertible to `c10::IValue`.
struct state_dict {
  static constexpr const char* name = "state_dict";
  template <class C>
  static constexpr bool named_in = requires { &C::state_dict; };
  template <class C>
  static constexpr bool callable = requires(C& c) { c10::IValue(c.state_dict()); };
  template <class C>
  static c10::IValue call(C& c) {
    return c10::IValue(c.state_dict());
  }
  template <class C>
  static consteval bool check() {
    static_assert(!named_in<C> || callable<C>,
                  "dettrial callback: state_dict is declared but state_dict() does not return something convertible to c10::IValue");
    return true;
  }
};

/// Every hook, in the order Determined documents them.
using all = std::tuple<on_trial_startup, on_trial_shutdown, on_training_start, on_training_epoch_start, on_training_epoch_end,
                       on_training_workload_end, on_validation_start, on_validation_epoch_start, on_validation_epoch_end, on_validation_end,
                       on_checkpoint_save_start, on_checkpoint_write_end, on_checkpoint_upload_end, on_checkpoint_load_start, state_dict,
                       load_state_dict>;

}  // namespace dettrial::hook

namespace dettrial::detail {
template <class C, class... Hook>
consteval bool has_any_hook(std::tuple<Hook...>*) {
  return ((Hook::template named_in<C> || Hook::template callable<C>) || ...);
}
template <class C, class... Hook>
consteval bool check_hooks(std::tuple<Hook...>*) {
  return (Hook::template check<C>() && ...);
}
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief A callback: any object with at least one of the hooks in dettrial::hook (Determined's
 * PyTorchCallback): `on_trial_startup(first_batch_idx, checkpoint_uuid)`, `on_trial_shutdown()`,
 * `on_training_start()`, `on_training_epoch_start(epoch_idx)`, `on_training_epoch_end(epoch_idx)`,
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
concept Callback = detail::has_any_hook<C>(static_cast<hook::all*>(nullptr));

}  // namespace dettrial
