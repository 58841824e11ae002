// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A running trial's validations, read from its metrics.jsonl as the trial appends them.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>
// IWYU pragma: private, include <dettrial/search.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../../detail/jsonl.hpp"
#include "../../report/metrics_log.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// A validation record of a trial's metrics.jsonl, as the searcher reads it.
struct TrialValidation {
  std::int64_t batches = 0;
  /// The searcher metric (nullopt when the record lacks it, or holds null: a NaN).
  std::optional<double> metric;
  /// The searcher's time metric (the batches when the record lacks it).
  double time = 0;
};

/// Follows one trial's metrics.jsonl (a resumed trial rewrites it: it is then read from the start).
class ValidationTail {
 public:
  /// The validation records appended to `metrics_log` since the last call, in order, with the
  /// searcher metric `metric` and the time metric `time_metric`.
  std::vector<TrialValidation> read_new(const std::filesystem::path& metrics_log, const std::string& metric,
                                        const std::string& time_metric);

 private:
  JsonlTail tail_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../detail/json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE std::vector<TrialValidation> ValidationTail::read_new(const std::filesystem::path& metrics_log, const std::string& metric,
                                                                      const std::string& time_metric) {
  const auto number = [](const Json* metrics, const std::string& name) -> std::optional<double> {
    const Json* value = metrics ? json_find(*metrics, name) : nullptr;
    if (!value || !value->is_number()) return std::nullopt;
    return value->get<double>();
  };
  std::vector<TrialValidation> out;
  for (const Json& record : tail_.read_new(metrics_log)) {
    const Json* type = json_find(record, "type");
    if (!type || !type->is_string() || type->get_ref<const std::string&>() != "validation") continue;
    const auto batches = MetricsLog::batches_of_record(record);
    if (!batches) continue;
    const Json* metrics = json_find(record, "metrics");
    out.push_back({.batches = *batches,
                   .metric = number(metrics, metric),
                   .time = number(metrics, time_metric).value_or(static_cast<double>(*batches))});
  }
  return out;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
