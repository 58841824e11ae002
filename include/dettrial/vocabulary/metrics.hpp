// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The metrics vocabulary: the Metrics a trial returns per batch, the reduced MetricValues
/// dettrial reports, and what a metric reducer is (concepts; the reducers are in metrics/).
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/util/SmallVector.h>
#include <torch/torch.h>

#include "../error.hpp"
#include "metric_order.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief A metric name with static storage: string literals are taken as they are (no copy, no
 * hashing), any other string is interned once, so a per-batch Metrics never allocates for its names.
 */
class MetricKey {
 public:
  template <std::size_t N>
  consteval MetricKey(const char (&literal)[N]) : name_(literal, N - 1) {}  // NOLINT: implicit by design
  MetricKey(const std::string& name) : name_(intern(name)) {}               // NOLINT: implicit by design
  explicit MetricKey(std::string_view name) : name_(intern(std::string(name))) {}

  constexpr std::string_view view() const { return name_; }
  friend constexpr bool operator==(MetricKey a, MetricKey b) { return a.name_.data() == b.name_.data() || a.name_ == b.name_; }

 private:
  static std::string_view intern(const std::string& name);
  std::string_view name_;
};

/// One metric value: a tensor (kept on its device, no sync) or a plain number.
class MetricValue {
 public:
  MetricValue(torch::Tensor t) : tensor_(std::move(t)) {}           // NOLINT: implicit by design
  MetricValue(double v) : number_(v) {}                             // NOLINT
  MetricValue(float v) : number_(v) {}                              // NOLINT
  MetricValue(int v) : number_(v) {}                                // NOLINT
  MetricValue(std::int64_t v) : number_(static_cast<double>(v)) {}  // NOLINT

  bool is_tensor() const { return tensor_.defined(); }
  const torch::Tensor& tensor() const { return tensor_; }
  /// The value as a double; for a tensor this synchronises with its device (scalar tensors only).
  double to_double() const;

 private:
  torch::Tensor tensor_;
  double number_ = 0;
};

/**
 * @brief What `train_batch` and `evaluate_batch` return: named values, at least `loss` for training.
 *
 * Stored inline for up to 8 entries (no allocation), in the order given.
 * @code{.cpp}
 * return dettrial::Metrics{{"loss", loss}, {"train_error", error}};
 * @endcode
 */
class Metrics {
 public:
  struct Entry {
    MetricKey key;
    MetricValue value;
  };

  Metrics() = default;
  Metrics(std::initializer_list<Entry> entries) : entries_(entries.begin(), entries.end()) {}

  /// Adds or replaces `key`.
  Metrics& set(MetricKey key, MetricValue value);
  /// The value of `name`, or nullptr.
  const MetricValue* find(std::string_view name) const;
  /// The value of `name`; throws TrialError naming the missing metric and those present.
  const MetricValue& at(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  const Entry& operator[](std::size_t i) const { return entries_[i]; }

  /// The names, comma-separated, for messages.
  std::string names() const;

 private:
  c10::SmallVector<Entry, 8> entries_;
};

/// How a trial may return training metrics: Metrics, or a bare loss tensor (taken as `{"loss": t}`).
template <class R>
concept MetricsResult = std::same_as<std::remove_cvref_t<R>, Metrics> || std::same_as<std::remove_cvref_t<R>, torch::Tensor>;

/// Turns a trial's return value into Metrics.
inline Metrics as_metrics(Metrics m) { return m; }
inline Metrics as_metrics(torch::Tensor loss) { return Metrics{{"loss", std::move(loss)}}; }

/**
 * @brief Reduced metrics as reported: names in first-seen order with plain numbers. A metric that
 * cannot be averaged (a non-scalar training metric) is NaN, written as null in metrics.jsonl.
 */
class MetricValues {
 public:
  void set(std::string name, double value);
  std::optional<double> get(std::string_view name) const;
  /// The value of `name`; throws naming the missing metric.
  double at(std::string_view name) const;
  bool contains(std::string_view name) const { return get(name).has_value(); }
  std::size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }

 private:
  std::vector<std::pair<std::string, double>> values_;
};

// ---- metric reducers --------------------------------------------------------------------------

/// A value a reducer's per-slot part may be, so that it can cross processes (pickled, LibTorch's
/// serialization): a number, a tensor, a string, or a std::vector / std::tuple of those.
template <class P>
concept SlotValue = std::copy_constructible<P> && requires(const P& p, const c10::IValue& v) {
  c10::IValue(p);
  { v.to<P>() } -> std::convertible_to<P>;
};

/// What a reducer's final step may return: a number (stored under the reducer's name) or
/// MetricValues (merged by their own names).
template <class T>
concept ReducedMetrics = std::convertible_to<T, double> || std::same_as<std::remove_cvref_t<T>, MetricValues>;

/**
 * @brief A reducer for one process: dettrial calls `reset()` before every training workload and
 * every validation and `reduce()` at their end; the trial feeds it through its own `update(...)`.
 * It cannot see other ranks' data, so a data-parallel job needs a CrossSlotReducer instead.
 */
template <class R>
concept LocalReducer = requires(R& r) {
  r.reset();
  { r.reduce() } -> ReducedMetrics;
};

/// The type of a CrossSlotReducer's per-slot part.
template <class R>
using per_slot_t = std::remove_cvref_t<decltype(std::declval<R&>().per_slot_reduce())>;

/**
 * @brief Determined's MetricReducer, correct in any number of ranks: `per_slot_reduce()` on every
 * rank at the end of a workload or validation (a SlotValue), then `cross_slot_reduce(parts)` with
 * the parts of all ranks in rank order (one process: a list of one).
 */
template <class R>
concept CrossSlotReducer = requires(R& r) {
  r.reset();
  r.per_slot_reduce();
} && SlotValue<per_slot_t<R>> && requires(R& r, const std::vector<per_slot_t<R>>& parts) {
  { r.cross_slot_reduce(parts) } -> ReducedMetrics;
};

/// A user reducer: a LocalReducer or a CrossSlotReducer (see Context::wrap_reducer).
template <class R>
concept MetricReducer = LocalReducer<R> || CrossSlotReducer<R>;

}  // namespace dettrial

namespace dettrial::detail {
template <MetricReducer R>
constexpr auto reduced_metrics_type() {
  if constexpr (CrossSlotReducer<R>)
    return std::type_identity<decltype(std::declval<R&>().cross_slot_reduce(std::declval<const std::vector<per_slot_t<R>>&>()))>{};
  else return std::type_identity<decltype(std::declval<R&>().reduce())>{};
}
}  // namespace dettrial::detail

namespace dettrial {
/// What a reducer's last step returns: a number or MetricValues.
template <MetricReducer R>
using reduced_metrics_t = std::remove_cvref_t<typename decltype(detail::reduced_metrics_type<R>())::type>;

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

DETTRIAL_INLINE std::string_view MetricKey::intern(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;  // node-based: element addresses are stable
  std::lock_guard lock(mutex);
  return *names.insert(name).first;
}

DETTRIAL_INLINE double MetricValue::to_double() const {
  if (!tensor_.defined()) return number_;
  if (tensor_.numel() != 1) return std::nan("");
  return tensor_.detach().item<double>();
}

DETTRIAL_INLINE Metrics& Metrics::set(MetricKey key, MetricValue value) {
  for (auto& e : entries_)
    if (e.key == key) {
      e.value = std::move(value);
      return *this;
    }
  entries_.push_back(Entry{key, std::move(value)});
  return *this;
}

DETTRIAL_INLINE const MetricValue* Metrics::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.key.view() == name) return &e.value;
  return nullptr;
}

DETTRIAL_INLINE const MetricValue& Metrics::at(std::string_view name) const {
  if (const auto* v = find(name)) return *v;
  throw TrialError("metric '" + std::string(name) + "' is missing; the metrics are: " + names());
}

DETTRIAL_INLINE std::string Metrics::names() const {
  std::string s;
  for (const auto& e : entries_) s += (s.empty() ? "" : ", ") + std::string(e.key.view());
  return s.empty() ? "(none)" : s;
}

DETTRIAL_INLINE void MetricValues::set(std::string name, double value) {
  for (auto& kv : values_)
    if (kv.first == name) {
      kv.second = value;
      return;
    }
  values_.emplace_back(std::move(name), value);
}

DETTRIAL_INLINE std::optional<double> MetricValues::get(std::string_view name) const {
  for (const auto& kv : values_)
    if (kv.first == name) return kv.second;
  return std::nullopt;
}

DETTRIAL_INLINE double MetricValues::at(std::string_view name) const {
  if (auto v = get(name)) return *v;
  std::string known;
  for (const auto& kv : values_) known += (known.empty() ? "" : ", ") + kv.first;
  throw TrialError("metric '" + std::string(name) + "' is not among the reported metrics (" + known + ")");
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
