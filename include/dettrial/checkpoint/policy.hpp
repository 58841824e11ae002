// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Checkpoint policies (Determined's `checkpoint_policy`) as types: whether a validation is
/// followed by a checkpoint.
#pragma once

#include <concepts>
#include <string_view>
#include <utility>

#include "../vocabulary/checkpoint.hpp"
#include "../config/experiment_config.hpp"

namespace dettrial::checkpoint_policy {
/// After every validation.
struct all {
  static constexpr std::string_view name = "all";
  static constexpr bool after_validation(bool) { return true; }
};
/// After a validation whose searcher metric is the best so far (Determined's default).
struct best {
  static constexpr std::string_view name = "best";
  static constexpr bool after_validation(bool improved) { return improved; }
};
/// Never after a validation (periodic and final checkpoints still happen).
struct none {
  static constexpr std::string_view name = "none";
  static constexpr bool after_validation(bool) { return false; }
};

/// Calls `f` with the policy type the runtime choice names (from the experiment config).
template <class F>
decltype(auto) visit(CheckpointPolicy policy, F&& f) {
  switch (policy) {
    case CheckpointPolicy::all: return std::forward<F>(f)(all{});
    case CheckpointPolicy::none: return std::forward<F>(f)(none{});
    case CheckpointPolicy::best: break;
  }
  return std::forward<F>(f)(best{});
}
}  // namespace dettrial::checkpoint_policy

namespace dettrial {
static_assert(CheckpointPolicyType<checkpoint_policy::all> && CheckpointPolicyType<checkpoint_policy::best> &&
              CheckpointPolicyType<checkpoint_policy::none>);

}  // namespace dettrial
