// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What dettrial's LR schedulers share: Python's `LRScheduler` state (EpochLRScheduler), the
/// table of each scheduler's own arguments that its four state functions are written from (dettrial's
/// archive and Python's `state_dict()`, each both ways).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "../detail/text.hpp"
#include "python_layout.hpp"

namespace dettrial::optim {

/// One value for every parameter group, or one per group (Python's float-or-list arguments).
using PerGroup = std::variant<double, std::vector<double>>;

/// How OneCycleLR and SWALR move between two values (Python's `anneal_strategy`).
enum class AnnealStrategy { cos, linear };

template <class... Schedulers>
class ComposedSchedulers;
template <class... Schedulers>
class SequentialLR;

}  // namespace dettrial::optim

namespace dettrial::optim {
/**
 * @brief One of a scheduler's own arguments or counters as it is saved: its name (the key of Python's
 * `state_dict()` and of dettrial's archive) and the member of `S` that holds it. Exactly one member
 * pointer is set; `field(...)` makes one from the member's type.
 */
template <class S>
struct SchedulerField {
  const char* name;
  std::int64_t S::* count = nullptr;  ///< a whole number of at least `minimum`
  std::int64_t minimum = 0;
  double S::* number = nullptr;
  bool S::* flag = nullptr;
  std::vector<double> S::* per_group = nullptr;  ///< one number per parameter group (or none, unused)

  /// The value as dettrial's archive and Python's state dict hold it.
  c10::IValue value(const S& s, bool python) const {
    if (count) return s.*count;
    if (number) return s.*number;
    if (flag) return s.*flag;
    return python ? c10::IValue(python::list(s.*per_group)) : c10::IValue(s.*per_group);
  }
  /// `saved` read and checked (`groups`: the optimizer's parameter groups), in the form `assign` takes.
  c10::IValue checked(const c10::IValue& saved, const std::string& what, std::size_t groups) const {
    if (count) return python::count(saved, what, minimum);
    if (number) return python::number(saved, what);
    if (flag) return python::number(saved, what) != 0;
    std::vector<double> values = python::numbers(saved, what);
    if (!values.empty() && values.size() != groups)  // empty: a per-group value the scheduler does not use
      throw CheckpointError(what + " has " + std::to_string(values.size()) + " value(s), but the optimizer " + std::to_string(groups) +
                            " parameter group(s)");
    return values;
  }
  void assign(S& s, const c10::IValue& v) const {
    if (count) s.*count = v.toInt();
    else if (number) s.*number = v.toDouble();
    else if (flag) s.*flag = v.toBool();
    else s.*per_group = v.toDoubleVector();
  }
};

template <class S>
constexpr SchedulerField<S> field(const char* name, std::int64_t S::* count, std::int64_t minimum) {
  return {.name = name, .count = count, .minimum = minimum};
}
template <class S>
constexpr SchedulerField<S> field(const char* name, double S::* number) {
  return {.name = name, .number = number};
}
template <class S>
constexpr SchedulerField<S> field(const char* name, bool S::* flag) {
  return {.name = name, .flag = flag};
}
template <class S>
constexpr SchedulerField<S> field(const char* name, std::vector<double> S::* per_group) {
  return {.name = name, .per_group = per_group};
}

}  // namespace dettrial::optim

namespace dettrial::detail::scheduler_base {
/// The groups' learning rates, in order.
DETTRIAL_INLINE std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer);

/// Python's _format_param: one value per group, from one for all or a list of exactly one per group.
DETTRIAL_INLINE std::vector<double> per_group(const char* scheduler, const char* name, const optim::PerGroup& value,
                                              const torch::optim::Optimizer& optimizer);
/// The entry `key` of dettrial's archive or Python's dict, as text.
DETTRIAL_INLINE std::string text_of(const c10::IValue& v, const std::string& what);

/// One scheduler's entries in dettrial's archive, read checked: made only if the archive says the
/// scheduler type `type` wrote it; an absent or mistyped entry is a CheckpointError naming it.
struct SchedulerArchive {
  SchedulerArchive(torch::serialize::InputArchive& archive, const std::string& type, std::string owner);
  c10::IValue entry(const char* key) const;
  std::int64_t integer(const char* key) const;
  double number(const char* key) const;
  std::string text(const char* key) const;
  /// A list of numbers with one entry per parameter group of `optimizer`.
  std::vector<double> per_group(const char* key, const torch::optim::Optimizer& optimizer) const;

  torch::serialize::InputArchive& archive;
  std::string owner;  // "dettrial::optim::StepLR's saved state"

 private:
  [[noreturn]] void mistyped(const char* key, const char* type) const;
};
}  // namespace dettrial::detail::scheduler_base

namespace dettrial::optim {
/**
 * @brief What the schedulers stepped without a metric share: Python's `LRScheduler` state (`base_lrs`,
 * `last_epoch`, `_step_count`, `_last_lr`). Constructing one does what Python's constructor does:
 * it records the groups' current learning rates as `base_lrs` and takes one step, so `last_epoch`
 * starts at 0 and the step count at 1.
 */
class EpochLRScheduler {
 public:
  /// Python's `last_epoch`: the number of `step()` calls since construction.
  std::int64_t last_epoch() const { return last_epoch_; }
  /// Python's `_step_count`: `last_epoch() + 1` (the constructor's own step counts); 0 for
  /// CosineAnnealingWarmRestarts, whose Python `step()` does not count.
  std::int64_t step_count() const { return step_count_; }
  /// The groups' learning rates when the scheduler was made.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The groups' learning rates after the last step (Python's `get_last_lr()`).
  std::vector<double> get_last_lr() const { return last_lr_; }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }

  /// How a scheduler's constructor treats Python's `initial_lr` of the groups, which SequentialLR
  /// restores: most record the current rates unless a scheduler made before recorded them.
  enum class InitialLr {
    recorded_if_unset,  ///< `group.setdefault("initial_lr", group["lr"])`, and base_lrs are those
    own_base_lrs,       ///< CyclicLR: base_lrs are its `base_lr`, recorded as initial_lr if unset
    overwritten,        ///< OneCycleLR: initial_lr (and base_lrs) become max_lr / div_factor
  };
  static constexpr InitialLr initial_lr = InitialLr::recorded_if_unset;

 protected:
  // The composites set their children's base_lrs and step counts as Python's constructors leave them.
  template <class... Schedulers>
  friend class ComposedSchedulers;
  template <class... Schedulers>
  friend class SequentialLR;

  EpochLRScheduler(torch::optim::Optimizer& optimizer, const char* name);
  /// One Python `step()`: `last_epoch` and the step count advance, and each group's learning rate is
  /// multiplied by `factor` when `decay` (Python's `group["lr"] * ...`), else left as it is.
  void advance(bool decay, double factor);
  /// One Python `step()` whose new rates Python's `get_lr` computes: `last_epoch` and the step count
  /// advance, then group i's learning rate becomes `rate(i, its current rate)`.
  void advance_each(const std::function<double(std::size_t, double)>& rate);
  /// Sets group i's learning rate to `rate(i, its current rate)` and records the rates as the last.
  void set_rates(const std::function<double(std::size_t, double)>& rate);
  /// Python's `_update_lr(0)`, which SequentialLR calls at a milestone: `last_epoch` becomes 0 (the
  /// step count stays) and group i's rate `rate(i, its current rate)`.
  void restart_with(const std::function<double(std::size_t, double)>& rate);
  /// Records the groups' current learning rates as the last ones, in place.
  void refresh_last_lr();
  /// The state every scheduler saves (with its type's name, checked on load).
  void save_common(torch::serialize::OutputArchive& archive) const;
  void load_common(torch::serialize::InputArchive& archive);
  /// Python's LRScheduler entries of `state_dict()`, after the subclass's own.
  void python_common(c10::impl::GenericDict& out) const;
  /// Reads Python's `state_dict()` of this type: checks that every entry is one of `own` or of
  /// Python's LRScheduler (another type's is a CheckpointError naming the entry), then sets the
  /// common state. Returns the entries of `own`, which the subclass sets.
  std::map<std::string, c10::IValue> load_python_common(const c10::impl::GenericDict& in, const std::vector<std::string>& own,
                                                        const std::string& what);
  /// The key check of load_python_common alone: an entry neither `own` nor Python's LRScheduler's
  /// names another type (a CheckpointError naming it); one of `own` missing says it is not this type's.
  void check_python_keys(const c10::impl::GenericDict& in, const std::vector<std::string>& own, const std::string& what) const;
  /// "dettrial::optim::StepLR's saved state", for errors.
  std::string archive_owner() const;
  /// Reads `key` from dettrial's archive of this scheduler (after checking its type's name).
  c10::IValue archived(torch::serialize::InputArchive& archive, const char* key) const;
  /// A ConfigError naming the class, the argument, the rule and the value.
  [[noreturn]] void invalid(const char* argument, const std::string& rule, const std::string& value) const;

  // The four state functions of a scheduler whose own state is a table of fields (`fields`): each
  // reads everything and checks it before it changes anything.
  template <class S, std::size_t N>
  static void save_fields(const S& self, torch::serialize::OutputArchive& archive, const std::array<SchedulerField<S>, N>& fields) {
    self.save_common(archive);
    for (const auto& f : fields) archive.write(f.name, f.value(self, false));
  }
  template <class S, std::size_t N>
  static void load_fields(S& self, torch::serialize::InputArchive& archive, const std::array<SchedulerField<S>, N>& fields) {
    std::array<c10::IValue, N> values;
    for (std::size_t i = 0; i < N; ++i)
      values[i] = fields[i].checked(self.archived(archive, fields[i].name), self.archive_owner() + ": '" + fields[i].name + "'",
                                    self.optimizer_->param_groups().size());
    self.load_common(archive);
    for (std::size_t i = 0; i < N; ++i) fields[i].assign(self, values[i]);
  }
  template <class S, std::size_t N>
  static void python_fields(const S& self, c10::impl::GenericDict& out, const std::array<SchedulerField<S>, N>& fields) {
    for (const auto& f : fields) out.insert(f.name, f.value(self, true));
    self.python_common(out);
  }
  template <class S, std::size_t N>
  static void load_python_fields(S& self, const c10::impl::GenericDict& in, const std::string& what,
                                 const std::array<SchedulerField<S>, N>& fields) {
    std::vector<std::string> names;
    for (const auto& f : fields) names.emplace_back(f.name);
    self.check_python_keys(in, names, what);
    // The fields are checked on a copy of the entries first: a bad one leaves the scheduler as it was.
    std::array<c10::IValue, N> values;
    for (std::size_t i = 0; i < N; ++i) {
      const auto it = in.find(fields[i].name);
      if (it == in.end()) throw CheckpointError(what + " has no '" + fields[i].name + "': it is not Python's " + self.name_ + " state");
      values[i] = fields[i].checked(it->value(), what + ": " + fields[i].name, self.optimizer_->param_groups().size());
    }
    self.load_python_common(in, names, what);
    for (std::size_t i = 0; i < N; ++i) fields[i].assign(self, values[i]);
  }

  torch::optim::Optimizer* optimizer_;
  const char* name_;  // "StepLR", ...
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  std::vector<double> last_lr_;
  /// The rates the next step sets, for the schedulers that compute them all first (OneCycleLR,
  /// CyclicLR, SWALR): kept, so that a step allocates nothing after the first.
  std::vector<double> next_rates_;
};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cmath>
#include <set>

namespace dettrial::detail::scheduler_base {

DETTRIAL_INLINE std::vector<double> per_group(const char* scheduler, const char* name, const optim::PerGroup& value,
                                              const torch::optim::Optimizer& optimizer) {
  const std::size_t groups = optimizer.param_groups().size();
  if (const auto* one = std::get_if<double>(&value)) return std::vector<double>(groups, *one);
  const auto& each = std::get<std::vector<double>>(value);
  if (each.size() != groups)
    throw ConfigError(std::string("dettrial::optim::") + scheduler + ": " + name + " must have one value per parameter group (" +
                      std::to_string(groups) + "), not " + std::to_string(each.size()));
  return each;
}

DETTRIAL_INLINE std::string text_of(const c10::IValue& v, const std::string& what) {
  if (!v.isString()) throw CheckpointError(what + " is not a string");
  return v.toStringRef();
}
DETTRIAL_INLINE std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

DETTRIAL_INLINE SchedulerArchive::SchedulerArchive(torch::serialize::InputArchive& archive, const std::string& type, std::string owner)
    : archive(archive), owner(std::move(owner)) {
  c10::IValue saved;
  if (!archive.try_read("scheduler", saved) || !saved.isString())
    throw CheckpointError(this->owner + " has no 'scheduler' (the type that wrote it)");
  if (saved.toStringRef() != type)
    throw CheckpointError(this->owner + " was written by a " + saved.toStringRef() + ": is the checkpoint from another trial?");
}

DETTRIAL_INLINE c10::IValue SchedulerArchive::entry(const char* key) const {
  c10::IValue value;
  if (!archive.try_read(key, value)) throw CheckpointError(owner + " has no '" + key + "'");
  return value;
}

DETTRIAL_INLINE void SchedulerArchive::mistyped(const char* key, const char* type) const {
  throw CheckpointError(owner + ": '" + key + "' is not " + type);
}

DETTRIAL_INLINE std::int64_t SchedulerArchive::integer(const char* key) const {
  const c10::IValue v = entry(key);
  if (!v.isInt()) mistyped(key, "an integer");
  return v.toInt();
}

DETTRIAL_INLINE double SchedulerArchive::number(const char* key) const {
  const c10::IValue v = entry(key);
  if (!v.isDouble()) mistyped(key, "a number");
  return v.toDouble();
}

DETTRIAL_INLINE std::string SchedulerArchive::text(const char* key) const {
  const c10::IValue v = entry(key);
  if (!v.isString()) mistyped(key, "a string");
  return v.toStringRef();
}

DETTRIAL_INLINE std::vector<double> SchedulerArchive::per_group(const char* key, const torch::optim::Optimizer& optimizer) const {
  const c10::IValue v = entry(key);
  if (!v.isDoubleList()) mistyped(key, "a list of numbers");
  std::vector<double> values = v.toDoubleVector();
  if (values.size() != optimizer.param_groups().size())
    throw CheckpointError(owner + " has " + std::to_string(values.size()) + " value(s) in '" + key + "', but the optimizer has " +
                          std::to_string(optimizer.param_groups().size()) + " parameter group(s)");
  return values;
}
}  // namespace dettrial::detail::scheduler_base

namespace dettrial::optim {
DETTRIAL_INLINE EpochLRScheduler::EpochLRScheduler(torch::optim::Optimizer& optimizer, const char* name)
    : optimizer_(&optimizer), name_(name), base_lrs_(detail::scheduler_base::group_lrs(optimizer)), last_lr_(base_lrs_) {}

DETTRIAL_INLINE void EpochLRScheduler::advance(bool decay, double factor) {
  ++step_count_;
  ++last_epoch_;
  if (decay)
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(group.options().get_lr() * factor);
  refresh_last_lr();
}

DETTRIAL_INLINE void EpochLRScheduler::refresh_last_lr() {
  const auto& groups = optimizer_->param_groups();
  last_lr_.resize(groups.size());  // the same size every step: no allocation after the first
  for (std::size_t i = 0; i < groups.size(); ++i) last_lr_[i] = groups[i].options().get_lr();
}

DETTRIAL_INLINE void EpochLRScheduler::advance_each(const std::function<double(std::size_t, double)>& rate) {
  ++step_count_;
  ++last_epoch_;
  set_rates(rate);
}

DETTRIAL_INLINE void EpochLRScheduler::restart_with(const std::function<double(std::size_t, double)>& rate) {
  last_epoch_ = 0;
  set_rates(rate);
}

DETTRIAL_INLINE void EpochLRScheduler::set_rates(const std::function<double(std::size_t, double)>& rate) {
  auto& groups = optimizer_->param_groups();
  if (groups.size() != base_lrs_.size())  // Python's zip(strict=True) refuses it too
    throw TrialError(std::string("dettrial::optim::") + name_ + ": the optimizer has " + std::to_string(groups.size()) +
                     " parameter groups but the scheduler " + std::to_string(base_lrs_.size()) +
                     " (was a group added after the scheduler was made?)");
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(rate(i, groups[i].options().get_lr()));
  refresh_last_lr();
}

DETTRIAL_INLINE void EpochLRScheduler::invalid(const char* argument, const std::string& rule, const std::string& value) const {
  detail::throw_invalid_argument(std::string("dettrial::optim::") + name_, argument, rule, value);
}

DETTRIAL_INLINE std::string EpochLRScheduler::archive_owner() const { return std::string("dettrial::optim::") + name_ + "'s saved state"; }

DETTRIAL_INLINE c10::IValue EpochLRScheduler::archived(torch::serialize::InputArchive& archive, const char* key) const {
  return detail::scheduler_base::SchedulerArchive(archive, name_, archive_owner()).entry(key);
}

DETTRIAL_INLINE void EpochLRScheduler::save_common(torch::serialize::OutputArchive& archive) const {
  archive.write("scheduler", c10::IValue(std::string(name_)));
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("step_count", c10::IValue(step_count_));
  archive.write("base_lrs", c10::IValue(base_lrs_));
  archive.write("last_lr", c10::IValue(last_lr_));
}

DETTRIAL_INLINE void EpochLRScheduler::load_common(torch::serialize::InputArchive& archive) {
  const std::string owner = archive_owner();
  const std::size_t groups = optimizer_->param_groups().size();
  const auto per_group = [&](const char* key) {
    std::vector<double> values = python::numbers(archived(archive, key), owner + ": '" + key + "'");
    if (values.size() != groups)
      throw CheckpointError(owner + " has " + std::to_string(values.size()) + " value(s) in '" + key + "', but the optimizer has " +
                            std::to_string(groups) + " parameter group(s)");
    return values;
  };
  // Everything read before anything is changed: a mismatch leaves the scheduler as it was.
  const std::int64_t last_epoch = python::count(archived(archive, "last_epoch"), owner + ": 'last_epoch'", -1);
  const std::int64_t step_count = python::count(archived(archive, "step_count"), owner + ": 'step_count'", 0);
  std::vector<double> base_lrs = per_group("base_lrs");
  std::vector<double> last_lr = per_group("last_lr");
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base_lrs);
  last_lr_ = std::move(last_lr);
}

DETTRIAL_INLINE void EpochLRScheduler::python_common(c10::impl::GenericDict& out) const {
  out.insert("base_lrs", python::list(base_lrs_));
  out.insert("last_epoch", last_epoch_);
  out.insert("verbose", false);  // torch < 2.2 has it
  out.insert("_step_count", step_count_);
  out.insert("_get_lr_called_within_step", false);
  out.insert("_is_initial", false);  // torch >= 2.6 has it
  out.insert("_last_lr", python::list(last_lr_));
}

DETTRIAL_INLINE void EpochLRScheduler::check_python_keys(const c10::impl::GenericDict& in, const std::vector<std::string>& own,
                                                         const std::string& what) const {
  static const std::set<std::string> common = {"base_lrs",    "last_epoch", "verbose", "_step_count", "_get_lr_called_within_step",
                                               "_is_initial", "_last_lr"};
  for (const auto& entry : in) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (!common.count(key) && std::find(own.begin(), own.end(), key) == own.end())
      throw CheckpointError(what + " has '" + key + "', which Python's " + name_ +
                            " does not have: the checkpoint's scheduler is another type than the trial's " + name_);
  }
  for (const std::string& k : own)
    if (!in.contains(k)) throw CheckpointError(what + " has no '" + k + "': it is not Python's " + name_ + " state");
}

DETTRIAL_INLINE std::map<std::string, c10::IValue> EpochLRScheduler::load_python_common(const c10::impl::GenericDict& in,
                                                                                        const std::vector<std::string>& own,
                                                                                        const std::string& what) {
  check_python_keys(in, own, what);
  std::map<std::string, c10::IValue> mine;
  for (const std::string& k : own) mine[k] = in.at(k);
  const auto field = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end()) throw CheckpointError(what + " has no '" + key + "': it is not a Python LR scheduler's state");
    return it->value();
  };
  std::vector<double> base = python::numbers(field("base_lrs"), what + ": base_lrs");
  if (base.size() != optimizer_->param_groups().size())
    throw CheckpointError(what + " has " + std::to_string(base.size()) + " base learning rate(s), but the optimizer " +
                          std::to_string(optimizer_->param_groups().size()) + " group(s)");
  const std::int64_t last_epoch = python::count(field("last_epoch"), what + ": last_epoch", -1);
  const auto step_count = in.find("_step_count");
  std::vector<double> last_lr = base;
  if (const auto it = in.find("_last_lr"); it != in.end()) last_lr = python::numbers(it->value(), what + ": _last_lr");
  base_lrs_ = std::move(base);
  last_epoch_ = last_epoch;
  step_count_ = step_count != in.end() ? python::count(step_count->value(), what + ": _step_count", 0) : last_epoch + 1;
  last_lr_ = std::move(last_lr);
  return mine;
}

}  // namespace dettrial::optim

#endif  // DETTRIAL_HEADER_DEFINITIONS
