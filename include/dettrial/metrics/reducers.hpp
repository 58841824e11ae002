// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metric reduction: Determined's averaging of training metrics over a workload, validation
/// reducers (avg, sum, max, min) per metric, and user reducer types.
#pragma once

#include <algorithm>
#include <concepts>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// A built-in validation reducer. `avg` is the unweighted mean over batches (Determined's `np.average`).
enum class Reducer { avg, sum, max, min };

DETTRIAL_INLINE const char* to_string(Reducer r);

/// Which reducer each validation metric gets: one for all, or one per metric name (all names, exactly).
using ReducerChoice = std::variant<Reducer, std::map<std::string, Reducer>>;

/**
 * @brief The reducer `context.wrap_reducer(fn, name)` makes of a function (Determined's simple
 * reducer): the trial calls `update(value)`; at the end of a workload or validation the values of
 * all ranks, back in the order of the batches they came from, go to `fn(values)`.
 */
template <class T, class Fn>
class FunctionReducer {
 public:
  explicit FunctionReducer(Fn fn) : fn_(std::move(fn)) {}
  void update(T value) { values_.push_back(std::move(value)); }
  void reset() { values_.clear(); }
  /// This rank's values; tensors on the CPU (a pickled tensor comes back on the device it left, and
  /// every rank must be able to read every rank's values).
  std::vector<T> per_slot_reduce() const {
    if constexpr (std::same_as<T, torch::Tensor>) {
      std::vector<T> host;
      host.reserve(values_.size());
      for (const auto& t : values_) host.push_back(t.detach().cpu());
      return host;
    } else {
      return values_;
    }
  }
  /// Interleaves the ranks' lists (rank r's k-th value came from global batch k*n + r), then calls fn.
  auto cross_slot_reduce(const std::vector<std::vector<T>>& parts) {
    std::vector<T> all;
    std::size_t longest = 0, total = 0;
    for (const auto& p : parts) {
      longest = std::max(longest, p.size());
      total += p.size();
    }
    all.reserve(total);
    for (std::size_t k = 0; k < longest; ++k)
      for (const auto& p : parts)
        if (k < p.size()) all.push_back(p[k]);
    return fn_(std::as_const(all));
  }

 private:
  Fn fn_;
  std::vector<T> values_;
};

}  // namespace dettrial

namespace dettrial::detail {

/// Averages training metrics over the batches of one workload, unweighted, without syncing the
/// device per batch: tensors are summed in place on their device and read once at the end.
class WorkloadMeans {
 public:
  void reset();

  void add(const Metrics& m, std::int64_t batch_idx);

  std::int64_t batches() const { return batches_; }

  /// The means; this is the one device synchronisation per workload.
  MetricValues means() const;

 private:
  struct Slot {
    MetricKey key;
    torch::Tensor tensor_sum{};  // double scalar on the metric's device
    double number_sum = 0;
    bool averageable = true;
    void add(const MetricValue& v);
    double mean(std::int64_t n) const;
  };

  /// The slot of `key` (tried first at `hint`: the usual case is the same order every batch), or
  /// slots_.size() when the workload has no such metric.
  std::size_t slot_of(MetricKey key, std::size_t hint) const;
  TrialError mismatch(const Metrics& m, std::int64_t batch_idx) const;
  std::string slot_names() const;

  std::vector<Slot> slots_;
  std::int64_t batches_ = 0;
};

/// Reduces validation metrics batch by batch with a reducer per metric (Determined's per-slot step).
class ValidationReduction {
 public:
  explicit ValidationReduction(ReducerChoice choice = Reducer::avg) : choice_(std::move(choice)) {}

  void add(const Metrics& m, std::int64_t batch_idx);

  std::int64_t batches() const { return batches_; }

  /// A metric's total on this process: the sum over batches for avg and sum, else the max or min.
  struct Total {
    std::string name;
    Reducer reducer;
    double value;
  };
  /// The per-process totals, for combining across ranks (avg weighted by each rank's batch count).
  std::vector<Total> totals() const;

 private:
  struct Slot {
    std::string name;
    Reducer reducer;
    torch::Tensor tensor_acc{};
    double number_acc = 0;
    bool seen_number = false;
    void add(const MetricValue& v);
    double combine(double a, double b) const;
    double result(std::int64_t n) const;
  };

  Reducer reducer_for(std::string_view name) const;
  void check_reducer_names(const Metrics& m) const;
  Slot* find(std::string_view name);

  ReducerChoice choice_;
  std::vector<Slot> slots_;
  std::int64_t batches_ = 0;
};

/// A user reducer registered with the context, type-erased once at wrap time.
struct WrappedReducer {
  void* object;
  void (*reset)(void*);
  /// This rank's part (a LocalReducer has none: it is reduced where it stands).
  c10::IValue (*per_slot)(void*);
  /// Reduces the parts of all ranks (rank order) into `out`.
  void (*cross_slot_into)(void*, const std::string& name, const std::vector<c10::IValue>& parts, MetricValues& out);
  std::string name;
  bool for_training;
  bool for_validation;
  /// Whether it reduces across ranks (a CrossSlotReducer); a LocalReducer sees one process only.
  bool cross_slot;

  template <class V>
  static void store(V&& value, const std::string& name, MetricValues& out) {
    if constexpr (std::same_as<std::remove_cvref_t<V>, MetricValues>) {
      for (const auto& [k, v] : value) out.set(k, v);
    } else {
      out.set(name, static_cast<double>(value));
    }
  }

  template <MetricReducer R>
  static WrappedReducer wrap(R& r, std::string name, bool for_training, bool for_validation) {
    if constexpr (CrossSlotReducer<R>) {
      return WrappedReducer{&r,
                            [](void* p) { static_cast<R*>(p)->reset(); },
                            [](void* p) { return c10::IValue(static_cast<R*>(p)->per_slot_reduce()); },
                            [](void* p, const std::string& n, const std::vector<c10::IValue>& parts, MetricValues& out) {
                              std::vector<per_slot_t<R>> typed;
                              typed.reserve(parts.size());
                              for (const auto& part : parts) typed.push_back(part.to<per_slot_t<R>>());
                              store(static_cast<R*>(p)->cross_slot_reduce(std::as_const(typed)), n, out);
                            },
                            std::move(name),
                            for_training,
                            for_validation,
                            true};
    } else {
      return WrappedReducer{&r,
                            [](void* p) { static_cast<R*>(p)->reset(); },
                            [](void*) { return c10::IValue(); },
                            [](void* p, const std::string& n, const std::vector<c10::IValue>&, MetricValues& out) {
                              store(static_cast<R*>(p)->reduce(), n, out);
                            },
                            std::move(name),
                            for_training,
                            for_validation,
                            false};
    }
  }
};

/// The workload a reducer reduces (Context::wrap_reducer's `for_training` and `for_validation`).
enum class ReducerRole { training, validation };

/**
 * @brief A trial's wrapped reducers as a fit drives them, by role: reset before a workload, this
 * rank's parts at its end, and every rank's parts merged into the workload's metrics, each in wrap
 * order. The one loop over them.
 */
class ReducerSet {
 public:
  /// Adds `reducer`; `owner` keeps alive what it points to when the set made it (wrap_reducer(fn)).
  void add(WrappedReducer reducer, std::shared_ptr<void> owner = {}) {
    reducers_.push_back(std::move(reducer));
    if (owner) owned_.push_back(std::move(owner));
  }
  bool empty() const { return reducers_.empty(); }
  void clear() {
    reducers_.clear();
    owned_.clear();
  }
  /// Whether `object` was wrapped.
  bool contains(const void* object) const {
    return std::any_of(reducers_.begin(), reducers_.end(), [&](const WrappedReducer& r) { return r.object == object; });
  }
  /// The first reducer of `role`, or null.
  const WrappedReducer* first(ReducerRole role) const {
    for (const auto& r : reducers_)
      if (serves(r, role)) return &r;
    return nullptr;
  }
  /// Before a workload of `role`: its reducers reset.
  void reset(ReducerRole role) {
    for (auto& r : reducers_)
      if (serves(r, role)) r.reset(r.object);
  }
  /// At its end: this rank's part of each reducer of `role` (none for a LocalReducer's), in wrap order.
  std::vector<c10::IValue> parts(ReducerRole role) {
    std::vector<c10::IValue> mine;
    for (auto& r : reducers_)
      if (serves(r, role)) mine.push_back(r.per_slot(r.object));
    return mine;
  }
  /// Every reducer of `role` reduced into `out`: `parts_of(i)` gives the i-th reducer's parts of
  /// every rank, in rank order.
  template <class PartsOf>
  void merge(ReducerRole role, PartsOf&& parts_of, MetricValues& out) {
    std::size_t index = 0;
    for (auto& r : reducers_)
      if (serves(r, role)) r.cross_slot_into(r.object, r.name, parts_of(index++), out);
  }

 private:
  static bool serves(const WrappedReducer& r, ReducerRole role) {
    return role == ReducerRole::training ? r.for_training : r.for_validation;
  }
  std::vector<WrappedReducer> reducers_;
  std::vector<std::shared_ptr<void>> owned_;  // the FunctionReducers wrap_reducer(fn) made
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

DETTRIAL_INLINE const char* to_string(Reducer r) {
  switch (r) {
    case Reducer::avg: return "avg";
    case Reducer::sum: return "sum";
    case Reducer::max: return "max";
    case Reducer::min: return "min";
  }
  return "?";
}

}  // namespace dettrial

namespace dettrial::detail {

DETTRIAL_INLINE void WorkloadMeans::reset() {
  slots_.clear();
  batches_ = 0;
}

DETTRIAL_INLINE void WorkloadMeans::add(const Metrics& m, std::int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  if (batches_ == 0) {
    slots_.reserve(m.size());
    for (const auto& e : m) slots_.push_back(Slot{e.key});
  } else if (m.size() != slots_.size()) {
    throw mismatch(m, batch_idx);
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::size_t slot = slot_of(m[i].key, i);
    if (slot == slots_.size()) throw mismatch(m, batch_idx);
    slots_[slot].add(m[i].value);
  }
  ++batches_;
}

DETTRIAL_INLINE MetricValues WorkloadMeans::means() const {
  MetricValues out;
  for (const auto& s : slots_) out.set(std::string(s.key.view()), s.mean(batches_));
  return out;
}

DETTRIAL_INLINE void WorkloadMeans::Slot::add(const MetricValue& v) {
  if (!v.is_tensor()) {
    number_sum += v.to_double();
    return;
  }
  const torch::Tensor& t = v.tensor();
  if (t.numel() != 1) {
    averageable = false;
    return;
  }
  if (!tensor_sum.defined()) tensor_sum = torch::zeros({}, t.options().dtype(torch::kDouble).requires_grad(false));
  if (t.dim() == 0) tensor_sum.add_(t);
  else tensor_sum.add_(t.reshape({}));  // a one-element tensor of higher rank
}

DETTRIAL_INLINE double WorkloadMeans::Slot::mean(std::int64_t n) const {
  if (!averageable || n == 0) return std::numeric_limits<double>::quiet_NaN();
  const double total = number_sum + (tensor_sum.defined() ? tensor_sum.item<double>() : 0.0);
  return total / static_cast<double>(n);
}

DETTRIAL_INLINE std::size_t WorkloadMeans::slot_of(MetricKey key, std::size_t hint) const {
  if (hint < slots_.size() && slots_[hint].key == key) return hint;
  for (std::size_t j = 0; j < slots_.size(); ++j)
    if (slots_[j].key == key) return j;
  return slots_.size();
}

DETTRIAL_INLINE TrialError WorkloadMeans::mismatch(const Metrics& m, std::int64_t batch_idx) const {
  return TrialError("train_batch returned the metrics {" + m.names() + "} at batch " + std::to_string(batch_idx) + " but {" + slot_names() +
                    "} earlier in the workload; every batch must return the same metrics");
}

DETTRIAL_INLINE std::string WorkloadMeans::slot_names() const {
  std::string s;
  for (const auto& slot : slots_) s += (s.empty() ? "" : ", ") + std::string(slot.key.view());
  return s;
}

DETTRIAL_INLINE void ValidationReduction::add(const Metrics& m, std::int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  if (batches_ == 0) {
    check_reducer_names(m);
    for (const auto& e : m) slots_.push_back(Slot{std::string(e.key.view()), reducer_for(e.key.view())});
  } else if (m.size() != slots_.size()) {
    throw TrialError("evaluate_batch returned the metrics {" + m.names() + "} at batch " + std::to_string(batch_idx) +
                     ", unlike the first batch; every batch must return the same metrics");
  }
  for (const auto& e : m) {
    Slot* slot = find(e.key.view());
    if (!slot)
      throw TrialError("evaluate_batch returned metric '" + std::string(e.key.view()) + "' at batch " + std::to_string(batch_idx) +
                       ", which the first batch did not; every batch must return the same metrics");
    slot->add(e.value);
  }
  ++batches_;
}

DETTRIAL_INLINE std::vector<ValidationReduction::Total> ValidationReduction::totals() const {
  std::vector<Total> out;
  for (const auto& s : slots_) out.push_back(Total{s.name, s.reducer, s.result(1)});
  return out;
}

DETTRIAL_INLINE void ValidationReduction::Slot::add(const MetricValue& v) {
  if (v.is_tensor() && v.tensor().numel() != 1)
    throw TrialError("validation metric '" + name + "' has " + std::to_string(v.tensor().numel()) +
                     " elements; dettrial reduces scalar validation metrics (return one number per batch)");
  if (!v.is_tensor()) {
    const double x = v.to_double();
    if (!seen_number) number_acc = (reducer == Reducer::avg || reducer == Reducer::sum) ? 0.0 : x;
    number_acc = combine(number_acc, x);
    seen_number = true;
    return;
  }
  const torch::Tensor t = v.tensor().detach().reshape({}).to(torch::kDouble);
  if (!tensor_acc.defined()) {
    tensor_acc = t.clone();
    return;
  }
  switch (reducer) {
    case Reducer::avg:
    case Reducer::sum: tensor_acc.add_(t); break;
    case Reducer::max: tensor_acc = torch::maximum(tensor_acc, t); break;
    case Reducer::min: tensor_acc = torch::minimum(tensor_acc, t); break;
  }
}

DETTRIAL_INLINE double ValidationReduction::Slot::combine(double a, double b) const {
  if ((reducer == Reducer::max || reducer == Reducer::min) && (std::isnan(a) || std::isnan(b)))
    return std::numeric_limits<double>::quiet_NaN();  // like np.max / torch::maximum
  switch (reducer) {
    case Reducer::max: return std::max(a, b);
    case Reducer::min: return std::min(a, b);
    default: return a + b;
  }
}

DETTRIAL_INLINE double ValidationReduction::Slot::result(std::int64_t n) const {
  double value;
  if (tensor_acc.defined() && seen_number) value = combine(tensor_acc.item<double>(), number_acc);
  else if (tensor_acc.defined()) value = tensor_acc.item<double>();
  else value = number_acc;
  return reducer == Reducer::avg ? value / static_cast<double>(n) : value;
}

DETTRIAL_INLINE Reducer ValidationReduction::reducer_for(std::string_view name) const {
  if (const auto* one = std::get_if<Reducer>(&choice_)) return *one;
  return std::get<std::map<std::string, Reducer>>(choice_).at(std::string(name));
}

DETTRIAL_INLINE void ValidationReduction::check_reducer_names(const Metrics& m) const {
  const auto* per_metric = std::get_if<std::map<std::string, Reducer>>(&choice_);
  if (!per_metric) return;
  std::string missing, extra;
  for (const auto& e : m)
    if (!per_metric->count(std::string(e.key.view()))) missing += (missing.empty() ? "" : ", ") + std::string(e.key.view());
  for (const auto& [name, r] : *per_metric)
    if (!m.contains(name)) extra += (extra.empty() ? "" : ", ") + name;
  if (!missing.empty() || !extra.empty())
    throw TrialError("evaluation_reducer() must name exactly the metrics evaluate_batch returns (" + m.names() + ")" +
                     (missing.empty() ? "" : "; it has no reducer for: " + missing) +
                     (extra.empty() ? "" : "; it names metrics that are not returned: " + extra));
}

DETTRIAL_INLINE ValidationReduction::Slot* ValidationReduction::find(std::string_view name) {
  for (auto& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
