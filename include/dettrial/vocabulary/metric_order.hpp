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
 * checkpoint, the search's report page and Keras's monitoring callbacks. A tie is not an improvement.
 */
struct MetricOrder {
  bool smaller_is_better = true;
  /// Whether `a` is strictly better than `b`.
  bool better(double a, double b) const { return smaller_is_better ? a < b : a > b; }
  /// Whether `a` is better than `b` by more than `margin` (Keras's `min_delta`).
  bool better_by(double a, double b, double margin) const { return smaller_is_better ? a + margin < b : a - margin > b; }
  /// Whether `candidate` improves on `best` (with nothing so far, it does).
  bool improves(double candidate, const std::optional<double>& best) const { return !best || better(candidate, *best); }
  /// Whether `candidate` improves on `best` by more than `margin`.
  bool improves_by(double candidate, const std::optional<double>& best, double margin) const {
    return !best || better_by(candidate, *best, margin);
  }
};

}  // namespace dettrial
