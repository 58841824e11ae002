// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Python's `SequentialLR` (one scheduler after another, switching at milestones) and
/// `ChainedScheduler` (several stepped together), over dettrial::optim's epoch schedulers held by
/// value: each child keeps its own type, so stepping one is a direct call.
///
/// The children are given as a `std::tuple` made in place, so that they are constructed in order, as
/// Python's list is: like Python's, each constructor takes its first step on the optimizer, and the
/// composite then puts the rates where Python's would be (its `initial_lr` rules below).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "scheduler_base.hpp"

namespace dettrial::optim {

/// A scheduler SequentialLR and ChainedScheduler can hold: one of dettrial::optim's epoch schedulers
/// (derived from EpochLRScheduler, with `step()` and `restart_at_milestone()`).
template <class S>
concept ComposableLRScheduler = std::derived_from<S, EpochLRScheduler> && requires(S& s) {
  s.step();
  s.restart_at_milestone();
};

}  // namespace dettrial::optim

namespace dettrial::detail::composition {

/// Calls `f` with the tuple's element number `index`.
template <class Tuple, class F>
void visit_at(Tuple& t, std::size_t index, F&& f) {
  std::apply(
      [&](auto&... s) {
        std::size_t i = 0;
        ((i++ == index ? (f(s), 0) : 0), ...);
      },
      t);
}

template <class S>
concept WritesParamGroups = requires(const S& s, std::size_t g, c10::impl::GenericDict& d) { s.python_param_group(g, d); };
template <class S>
concept ReadsParamGroups =
    requires(S& s, std::size_t g, const c10::impl::GenericDict& d, const std::string& what) { s.load_python_param_group(g, d, what); };

inline void check_optimizer(const char* composite, std::size_t index, const optim::EpochLRScheduler& s,
                            const torch::optim::Optimizer& optimizer) {
  if (&s.optimizer() != &optimizer)
    throw ConfigError(std::string("dettrial::optim::") + composite + ": scheduler " + std::to_string(index) +
                      " drives another optimizer than the composite's (Python refuses it too)");
}

/// A Python list of the children's state dicts.
template <class Tuple>
c10::impl::GenericList python_children(const Tuple& children) {
  c10::impl::GenericList list(c10::AnyType::get());
  std::apply(
      [&](const auto&... s) {
        (([&] {
           c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
           s.python_state(d);
           list.push_back(d);
         }()),
         ...);
      },
      children);
  return list;
}

/// Restores the children from Python's `_schedulers` list.
template <class Tuple>
void load_python_children(Tuple& children, const c10::IValue& saved, const std::string& what) {
  constexpr std::size_t n = std::tuple_size_v<Tuple>;
  if (!saved.isList() || saved.toListRef().size() != n)
    throw CheckpointError(what + ": _schedulers is not a list of " + std::to_string(n) + " state dicts (one per scheduler)");
  std::size_t i = 0;
  std::apply(
      [&](auto&... s) {
        (([&] {
           const std::string name = what + ": _schedulers[" + std::to_string(i) + "]";
           // Named, not a temporary: GCC 13 warns of a reference into a temporary view as dangling.
           const c10::ArrayRef<c10::IValue> states = saved.toListRef();
           const c10::IValue& d = states[i++];
           if (!d.isGenericDict()) throw CheckpointError(name + " is not a state dict");
           s.load_python_state(d.toGenericDict(), name);
         }()),
         ...);
      },
      children);
}

/// Saves the children into dettrial's archive as nested archives "scheduler_0", ...
template <class Tuple>
void save_children(const Tuple& children, torch::serialize::OutputArchive& archive) {
  std::size_t i = 0;
  std::apply(
      [&](const auto&... s) {
        (([&] {
           torch::serialize::OutputArchive child;
           s.save(child);
           archive.write("scheduler_" + std::to_string(i++), child);
         }()),
         ...);
      },
      children);
}

template <class Tuple>
void load_children(Tuple& children, torch::serialize::InputArchive& archive, const std::string& what) {
  std::size_t i = 0;
  std::apply(
      [&](auto&... s) {
        (([&] {
           torch::serialize::InputArchive child;
           const std::string key = "scheduler_" + std::to_string(i++);
           if (!archive.try_read(key, child)) throw CheckpointError(what + " has no '" + key + "'");
           s.load(child);
         }()),
         ...);
      },
      children);
}

/// Python's entries in parameter group `group`, from every child that keeps some there.
template <class Tuple>
void python_param_group(const Tuple& children, std::size_t group, c10::impl::GenericDict& out) {
  std::apply(
      [&](const auto&... s) {
        (
            [&] {
              if constexpr (WritesParamGroups<std::remove_cvref_t<decltype(s)>>) s.python_param_group(group, out);
            }(),
            ...);
      },
      children);
}

template <class Tuple>
void load_python_param_group(Tuple& children, std::size_t group, const c10::impl::GenericDict& in, const std::string& what) {
  std::apply(
      [&](auto&... s) {
        (
            [&] {
              if constexpr (ReadsParamGroups<std::remove_cvref_t<decltype(s)>>) s.load_python_param_group(group, in, what);
            }(),
            ...);
      },
      children);
}

}  // namespace dettrial::detail::composition

namespace dettrial::optim {
/**
 * @brief What SequentialLR and ChainedScheduler share: the children, held by value, and Python's
 * `initial_lr` rules, which set each child's `base_lrs` as Python's constructors leave them (the
 * rates when the first scheduler was made; OneCycleLR overwrites them with max_lr / div_factor;
 * CyclicLR keeps its own `base_lr`).
 */
template <class... Schedulers>
class ComposedSchedulers {
 public:
  /// Child `I`, as its own type.
  template <std::size_t I>
  auto& scheduler() {
    return std::get<I>(children_);
  }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  /// Python's `get_last_lr()`.
  std::vector<double> get_last_lr() const { return last_lr_; }
  /// What the children keep in the optimizer's parameter group `group` in Python (OneCycleLR's
  /// max_lr, ...), added to `out`; and read back from there.
  void python_param_group(std::size_t group, c10::impl::GenericDict& out) const {
    detail::composition::python_param_group(children_, group, out);
  }
  void load_python_param_group(std::size_t group, const c10::impl::GenericDict& in, const std::string& what) {
    detail::composition::load_python_param_group(children_, group, in, what);
  }

 protected:
  ComposedSchedulers(const char* name, torch::optim::Optimizer& optimizer, std::tuple<Schedulers...> children)
      : children_(std::move(children)), optimizer_(&optimizer) {
    std::size_t i = 0;
    std::apply([&](const auto&... s) { (detail::composition::check_optimizer(name, i++, s, optimizer), ...); }, children_);
    // The children's constructors again, in order, from the rates the first one found, each with
    // the base rates Python's would have had: a child's first step can depend on them (LambdaLR's).
    const std::vector<double>& start = static_cast<EpochLRScheduler&>(std::get<0>(children_)).base_lrs_;
    auto& groups = optimizer.param_groups();
    for (std::size_t g = 0; g < groups.size() && g < start.size(); ++g) groups[g].options().set_lr(start[g]);
    std::apply([&](auto&... s) { (construct_again(s), ...); }, children_);
  }

  /// Python's constructor of child `s`, as it runs after the children before it: its base rates by
  /// Python's `initial_lr` rules (see the class comment), then its first step. (A stateful
  /// LambdaLR function is called once more for it.)
  template <class S>
  void construct_again(S& s) {
    EpochLRScheduler& base = s;
    if constexpr (S::initial_lr == EpochLRScheduler::InitialLr::overwritten) initial_lrs_ = base.base_lrs_;
    else if (initial_lrs_.empty()) initial_lrs_ = base.base_lrs_;
    else if constexpr (S::initial_lr == EpochLRScheduler::InitialLr::recorded_if_unset) base.base_lrs_ = initial_lrs_;
    base.last_epoch_ = -1;
    base.step_count_ = 0;
    s.step();
  }

  std::tuple<Schedulers...> children_;
  torch::optim::Optimizer* optimizer_;
  std::vector<double> initial_lrs_;
  std::vector<double> last_lr_;
};

/**
 * @brief Python's `SequentialLR(optimizer, schedulers, milestones)`: the first scheduler until the
 * first milestone, then the next, ...; at a milestone the next one starts over (Python's
 * `_update_lr(0)`: see `restart_at_milestone`).
 * @code{.cpp}
 * dettrial::optim::SequentialLR sched(opt,
 *     std::tuple{dettrial::optim::LinearLR(opt, 0.01, 1.0, 5), dettrial::optim::CosineAnnealingLR(opt, 95)}, {5});
 * @endcode
 */
template <class... Schedulers>
class SequentialLR : public ComposedSchedulers<Schedulers...> {
  static_assert(sizeof...(Schedulers) >= 1, "dettrial::optim::SequentialLR needs at least one scheduler");
  static_assert((ComposableLRScheduler<Schedulers> && ...),
                "dettrial::optim::SequentialLR's schedulers must be dettrial::optim's epoch schedulers (StepLR, LinearLR, "
                "CosineAnnealingLR, OneCycleLR, ...): not ReduceLROnPlateau, which Python refuses here too, nor a composite");
  using Base = ComposedSchedulers<Schedulers...>;

 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::tuple<Schedulers...> schedulers, std::vector<std::int64_t> milestones)
      : Base("SequentialLR", optimizer, std::move(schedulers)), milestones_(std::move(milestones)) {
    check_milestones(milestones_, [](const std::string& m) { throw ConfigError("dettrial::optim::SequentialLR: " + m); });
    // Python's constructor: the rates back to initial_lr, every child's step undone, and the child
    // for step 0 takes its first step again.
    auto& groups = optimizer.param_groups();
    for (std::size_t g = 0; g < groups.size() && g < this->initial_lrs_.size(); ++g) groups[g].options().set_lr(this->initial_lrs_[g]);
    std::apply([](auto&... s) { ((--static_cast<EpochLRScheduler&>(s).last_epoch_), ...); }, this->children_);
    detail::composition::visit_at(this->children_, current(), [this](auto& s) {
      static_cast<EpochLRScheduler&>(s).step_count_ = 0;
      s.step();
      this->last_lr_ = s.get_last_lr();
    });
  }

  void step() {
    ++last_epoch_;
    const std::size_t i = current();
    detail::composition::visit_at(this->children_, i, [&](auto& s) {
      if (i > 0 && milestones_[i - 1] == last_epoch_) s.restart_at_milestone();
      else s.step();
      this->last_lr_ = s.get_last_lr();
    });
  }

  /// Python's `last_epoch`: the number of `step()` calls since construction.
  std::int64_t last_epoch() const { return last_epoch_; }
  const std::vector<std::int64_t>& milestones() const { return milestones_; }

  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("scheduler", c10::IValue(std::string("SequentialLR")));
    archive.write("milestones", c10::IValue(milestones_));
    archive.write("last_epoch", c10::IValue(last_epoch_));
    archive.write("last_lr", c10::IValue(this->last_lr_));
    detail::composition::save_children(this->children_, archive);
  }
  void load(torch::serialize::InputArchive& archive) {
    const std::string what = "dettrial::optim::SequentialLR's saved state";
    const detail::scheduler_base::SchedulerArchive in(archive, "SequentialLR", what);
    SequentialLR copy = *this;  // loaded whole, then kept: a bad child leaves this one as it was
    const c10::IValue milestones = in.entry("milestones");
    if (!milestones.isIntList()) throw CheckpointError(what + ": 'milestones' is not a list of integers");
    copy.milestones_ = milestones.toIntVector();
    check_milestones(copy.milestones_, [&](const std::string& m) { throw CheckpointError(what + ": " + m); });
    copy.last_epoch_ = python::count(in.entry("last_epoch"), what, 0);
    copy.last_lr_ = python::numbers(in.entry("last_lr"), what);
    detail::composition::load_children(copy.children_, archive, what);
    *this = std::move(copy);
  }
  /// Python's `state_dict()`: _milestones, last_epoch, _last_lr and _schedulers (each child's).
  void python_state(c10::impl::GenericDict& out) const {
    c10::impl::GenericList milestones(c10::AnyType::get());
    for (const std::int64_t m : milestones_) milestones.push_back(m);
    out.insert("_milestones", milestones);
    out.insert("last_epoch", last_epoch_);
    out.insert("_last_lr", python::list(this->last_lr_));
    out.insert("_schedulers", detail::composition::python_children(this->children_));
  }
  /// Restores what Python's SequentialLR.state_dict() holds, every child's included.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
    SequentialLR copy = *this;
    for (const auto& entry : in) {
      const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
      if (key == "_milestones") {
        copy.milestones_.clear();
        for (const double m : python::numbers(entry.value(), what + ": _milestones"))
          copy.milestones_.push_back(python::count(m, what + ": a milestone", 0));
        check_milestones(copy.milestones_, [&](const std::string& m) { throw CheckpointError(what + ": " + m); });
      } else if (key == "last_epoch") {
        copy.last_epoch_ = python::count(entry.value(), what + ": last_epoch", 0);
      } else if (key == "_last_lr") {
        copy.last_lr_ = python::numbers(entry.value(), what + ": _last_lr");
      } else if (key == "_schedulers") {
        detail::composition::load_python_children(copy.children_, entry.value(), what);
      } else if (key != "verbose" && key != "_get_lr_called_within_step" && key != "_is_initial") {
        throw CheckpointError(what + " has '" + key +
                              "', which Python's SequentialLR does not have: the checkpoint's scheduler is another type");
      }
    }
    for (const char* key : {"_milestones", "last_epoch", "_schedulers"})
      if (!in.contains(key)) throw CheckpointError(what + " has no '" + std::string(key) + "': it is not Python's SequentialLR state");
    *this = std::move(copy);
  }

 private:
  /// The child for `last_epoch` (Python's bisect_right over the milestones).
  std::size_t current() const {
    return static_cast<std::size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  }
  template <class Fail>
  static void check_milestones(const std::vector<std::int64_t>& milestones, Fail fail) {
    if (milestones.size() + 1 != sizeof...(Schedulers))
      fail("milestones must be one fewer than the schedulers (" + std::to_string(sizeof...(Schedulers) - 1) + "), not " +
           std::to_string(milestones.size()));
    for (std::size_t i = 1; i < milestones.size(); ++i)
      if (milestones[i] < milestones[i - 1])
        fail("milestones must not decrease, but " + std::to_string(milestones[i]) + " follows " + std::to_string(milestones[i - 1]));
  }

  std::vector<std::int64_t> milestones_;
  std::int64_t last_epoch_ = 0;
};

/**
 * @brief Python's `ChainedScheduler(schedulers)`: every child stepped in order at each step, their
 * factors multiplying (for chainable schedulers).
 * @code{.cpp}
 * dettrial::optim::ChainedScheduler sched(std::tuple{dettrial::optim::ConstantLR(opt, 0.1, 4), dettrial::optim::ExponentialLR(opt, 0.9)});
 * @endcode
 */
template <class... Schedulers>
class ChainedScheduler : public ComposedSchedulers<Schedulers...> {
  static_assert(sizeof...(Schedulers) >= 1, "dettrial::optim::ChainedScheduler needs at least one scheduler");
  static_assert((ComposableLRScheduler<Schedulers> && ...),
                "dettrial::optim::ChainedScheduler's schedulers must be dettrial::optim's epoch schedulers (StepLR, LinearLR, "
                "CosineAnnealingLR, OneCycleLR, ...): not ReduceLROnPlateau, which Python refuses here too, nor a composite");
  using Base = ComposedSchedulers<Schedulers...>;

 public:
  explicit ChainedScheduler(std::tuple<Schedulers...> schedulers)
      : Base("ChainedScheduler", std::get<0>(schedulers).optimizer(), std::move(schedulers)) {
    this->last_lr_ = detail::scheduler_base::group_lrs(*this->optimizer_);
  }

  void step() {
    std::apply([](auto&... s) { (s.step(), ...); }, this->children_);
    this->last_lr_ = detail::scheduler_base::group_lrs(*this->optimizer_);
  }

  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("scheduler", c10::IValue(std::string("ChainedScheduler")));
    archive.write("last_lr", c10::IValue(this->last_lr_));
    detail::composition::save_children(this->children_, archive);
  }
  void load(torch::serialize::InputArchive& archive) {
    const std::string what = "dettrial::optim::ChainedScheduler's saved state";
    const detail::scheduler_base::SchedulerArchive in(archive, "ChainedScheduler", what);
    ChainedScheduler copy = *this;
    copy.last_lr_ = python::numbers(in.entry("last_lr"), what);
    detail::composition::load_children(copy.children_, archive, what);
    *this = std::move(copy);
  }
  /// Python's `state_dict()`: _last_lr and _schedulers (each child's).
  void python_state(c10::impl::GenericDict& out) const {
    out.insert("_last_lr", python::list(this->last_lr_));
    out.insert("_schedulers", detail::composition::python_children(this->children_));
  }
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
    ChainedScheduler copy = *this;
    for (const auto& entry : in) {
      const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
      if (key == "_last_lr") copy.last_lr_ = python::numbers(entry.value(), what + ": _last_lr");
      else if (key == "_schedulers") detail::composition::load_python_children(copy.children_, entry.value(), what);
      else if (key != "verbose" && key != "_get_lr_called_within_step" && key != "_is_initial")
        throw CheckpointError(what + " has '" + key +
                              "', which Python's ChainedScheduler does not have: the checkpoint's scheduler is another type");
    }
    if (!in.contains("_schedulers")) throw CheckpointError(what + " has no '_schedulers': it is not Python's ChainedScheduler state");
    *this = std::move(copy);
  }
};

}  // namespace dettrial::optim
