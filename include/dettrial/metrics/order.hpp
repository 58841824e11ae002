// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::MetricOrder, the one "is this metric better" rule; needs no LibTorch, so the report
/// pages use it too.
#pragma once

#include <optional>

namespace dettrial {

/**
 * @brief Which way a searcher metric improves: the one rule for "is this metric better", used by
 * `checkpoint_policy: best`, checkpoint retention's best checkpoints, a search's best trial and
 * checkpoint, and the search's report page. A tie is not an improvement.
 */
struct MetricOrder {
  bool smaller_is_better = true;
  /// Whether `a` is strictly better than `b`.
  bool better(double a, double b) const { return smaller_is_better ? a < b : a > b; }
  /// Whether `candidate` improves on `best` (with nothing so far, it does).
  bool improves(double candidate, const std::optional<double>& best) const { return !best || better(candidate, *best); }
};

}  // namespace dettrial
