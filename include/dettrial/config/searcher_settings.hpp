// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The searcher section of an experiment config (`searcher:`), as one type: the config reads
/// it, the searchers and the experiment runner use it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "units.hpp"
#include "../vocabulary/metric_order.hpp"

namespace dettrial {

/// The searchers dettrial runs (Determined's `searcher.name`; `async_halving` is read as
/// adaptive_asha with one bracket).
enum class SearcherKind { single, random, grid, adaptive_asha };

/// The name Determined's configs give the searcher.
constexpr std::string_view to_string(SearcherKind kind) {
  switch (kind) {
    case SearcherKind::single: return "single";
    case SearcherKind::random: return "random";
    case SearcherKind::grid: return "grid";
    case SearcherKind::adaptive_asha: return "adaptive_asha";
  }
  return "single";
}

/// Every searcher dettrial runs, in the order its messages list them.
inline constexpr SearcherKind searcher_kinds[] = {SearcherKind::single, SearcherKind::random, SearcherKind::grid,
                                                  SearcherKind::adaptive_asha};

/// The searcher of that name, or nullopt for one dettrial does not run.
constexpr std::optional<SearcherKind> searcher_kind_named(std::string_view name) {
  for (SearcherKind kind : searcher_kinds)
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

/// The checked `searcher:` section of an experiment config.
struct SearcherSettings {
  SearcherKind kind = SearcherKind::single;
  std::string metric;
  bool smaller_is_better = true;
  /// `searcher.max_length`, or the legacy `max_steps` converted to batches.
  std::optional<TrainUnit> max_length;
  /// random, grid, adaptive_asha: how many trials, and how many run at once (0: no limit).
  std::int64_t max_trials = 1;
  std::int64_t max_concurrent_trials = 16;
  /// adaptive_asha: the time a trial gets (in `time_metric`, a validation metric such as
  /// `batches`), the rungs' divisor, the most rungs, the bracket mode and explicit bracket rungs.
  std::string time_metric = "batches";
  std::int64_t max_time = 0;
  double divisor = 4;
  std::int64_t max_rungs = 5;
  std::string mode = "standard";
  std::vector<std::int64_t> bracket_rungs;

  /// The searcher's name as configs write it.
  std::string_view name() const { return to_string(kind); }
  /// Which way `metric` improves.
  MetricOrder order() const { return MetricOrder{smaller_is_better}; }
  /// How long a single, random or grid trial trains, in `max_length`'s unit (0 without one).
  std::int64_t length() const { return max_length ? max_length->value() : 0; }
};

}  // namespace dettrial
