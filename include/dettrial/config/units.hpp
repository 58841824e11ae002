// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Training lengths and periods: Batch, Epoch and Record, with Determined's boundary rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// The unit a length or a period is counted in.
enum class Unit { batches, epochs, records };

DETTRIAL_INLINE const char* to_string(Unit u);

/**
 * @brief A length or a period: an integer count of a unit, or an explicit schedule of points.
 *
 * As in Determined, a period `p` is reached after `n` units when `n % p == 0`; `n == 0` never reaches
 * it, a period below 1 is reached on every unit, and a schedule is reached exactly at its points.
 * Use the named forms: `Batch{100}`, `Epoch{2}`, `Record{60000}`, `Batch::at({10, 50})`.
 */
class TrainUnit {
 public:
  static constexpr std::int64_t never_value = std::numeric_limits<std::int64_t>::max();

  constexpr TrainUnit(Unit unit, std::int64_t value) : unit_(unit), value_(value) {}
  TrainUnit(Unit unit, std::vector<std::int64_t> points);

  constexpr Unit unit() const { return unit_; }
  /// The period (or, for a schedule, its last point).
  constexpr std::int64_t value() const { return value_; }
  bool is_schedule() const { return !points_.empty(); }
  const std::vector<std::int64_t>& points() const { return points_; }
  bool is_never() const { return points_.empty() && value_ == never_value; }

  /// Determined's `should_stop(n)`: is the boundary reached after `n` completed units?
  bool reached(std::int64_t n) const;

  /// Records become batches of `global_batch_size`, at least one (Determined's `_from_values`).
  TrainUnit in_batches_if_records(std::int64_t global_batch_size) const;

  std::string to_string() const;

  friend bool operator==(const TrainUnit&, const TrainUnit&) = default;

 private:
  Unit unit_;
  std::int64_t value_ = never_value;
  std::vector<std::int64_t> points_;
};

/// A count or period in batches (optimizer-agnostic: one batch is one call of `train_batch`).
struct Batch : TrainUnit {
  constexpr explicit Batch(std::int64_t n) : TrainUnit(Unit::batches, n) {}
  static TrainUnit at(std::vector<std::int64_t> points) { return TrainUnit(Unit::batches, std::move(points)); }
};
/// A count or period in epochs (an epoch is the training loader's length, in batches).
struct Epoch : TrainUnit {
  constexpr explicit Epoch(std::int64_t n) : TrainUnit(Unit::epochs, n) {}
  static TrainUnit at(std::vector<std::int64_t> points) { return TrainUnit(Unit::epochs, std::move(points)); }
};
/// A count or period in records, converted to batches of the global batch size at the start of fit.
struct Record : TrainUnit {
  constexpr explicit Record(std::int64_t n) : TrainUnit(Unit::records, n) {}
};

/// A period that is never reached.
inline TrainUnit never() { return Batch(TrainUnit::never_value); }

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* to_string(Unit u) {
  switch (u) {
    case Unit::batches: return "batches";
    case Unit::epochs: return "epochs";
    case Unit::records: return "records";
  }
  return "?";
}

DETTRIAL_INLINE TrainUnit::TrainUnit(Unit unit, std::vector<std::int64_t> points) : unit_(unit), points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
  value_ = points_.empty() ? never_value : points_.back();
}

DETTRIAL_INLINE bool TrainUnit::reached(std::int64_t n) const {
  if (!points_.empty()) return std::binary_search(points_.begin(), points_.end(), n);
  if (n == 0) return false;
  if (value_ < 1) return true;
  return n % value_ == 0;
}

DETTRIAL_INLINE TrainUnit TrainUnit::in_batches_if_records(std::int64_t global_batch_size) const {
  if (unit_ != Unit::records) return *this;
  if (global_batch_size < 1) throw ConfigError("a length in records needs a global_batch_size of at least 1");
  if (!points_.empty()) {
    std::vector<std::int64_t> pts;
    for (auto p : points_) pts.push_back(std::max<std::int64_t>(p / global_batch_size, 1));
    return TrainUnit(Unit::batches, std::move(pts));
  }
  if (value_ == never_value) return TrainUnit(Unit::batches, never_value);
  return TrainUnit(Unit::batches, std::max<std::int64_t>(value_ / global_batch_size, 1));
}

DETTRIAL_INLINE std::string TrainUnit::to_string() const {
  if (is_never()) return "never";
  if (!points_.empty()) {
    std::string s = std::string(dettrial::to_string(unit_)) + " at [";
    for (std::size_t i = 0; i < points_.size(); ++i) s += (i ? ", " : "") + std::to_string(points_[i]);
    return s + "]";
  }
  return std::to_string(value_) + " " + dettrial::to_string(unit_);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
