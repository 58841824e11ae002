// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Python's `OneCycleLR` and `CyclicLR`: the learning rate (and the momentum, or Adam's beta1)
/// cycled between bounds, with Python's arithmetic, its `state_dict()`, and the entries Python keeps
/// in the optimizer's parameter groups (`max_lr`, `min_lr`, `initial_lr`, `max_momentum`,
/// `base_momentum`), which a checkpoint writes into the optimizer's groups and reads from them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "scheduler_base.hpp"

namespace dettrial::optim {

/// What the cycling schedulers set besides the learning rate: Python's `group["momentum"]` (SGD,
/// RMSprop) or `group["betas"][0]` (Adam, AdamW), by the optimizer's type, chosen once.
enum class CycledMomentum { none, sgd, rmsprop, adam, adamw };

/// Python's `OneCycleLR` keyword arguments, with Python's defaults.
struct OneCycleLROptions {
  /// The peak learning rate: one for all groups, or one per group. Required.
  PerGroup max_lr = 0.0;
  /// The steps in the cycle; or, without it, `epochs` times `steps_per_epoch`.
  std::optional<std::int64_t> total_steps{};
  std::optional<std::int64_t> epochs{};
  std::optional<std::int64_t> steps_per_epoch{};
  /// The share of the cycle spent raising the rate, in [0, 1].
  double pct_start = 0.3;
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  /// Cycle the momentum (SGD, RMSprop) or beta1 (Adam, AdamW) inversely to the rate.
  bool cycle_momentum = true;
  PerGroup base_momentum = 0.85;
  PerGroup max_momentum = 0.95;
  /// The first rate is max_lr / div_factor; the last, that / final_div_factor.
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  /// Three phases (up, down to the first rate, then to the last) instead of two.
  bool three_phase = false;
};

/**
 * @brief Python's `OneCycleLR(optimizer, max_lr, total_steps, ...)`: the 1cycle policy, stepped once
 * per batch for `total_steps` steps (a step beyond is an error, as in Python).
 * @code{.cpp}
 * dettrial::optim::OneCycleLR sched(opt, {.max_lr = 0.1, .total_steps = 1000});
 * @endcode
 */
class OneCycleLR : public EpochLRScheduler {
 public:
  static constexpr InitialLr initial_lr = InitialLr::overwritten;
  OneCycleLR(torch::optim::Optimizer& optimizer, const OneCycleLROptions& options);
  void step();
  void restart_at_milestone();
  std::int64_t total_steps() const { return total_steps_; }
  const std::vector<double>& max_lrs() const { return max_lrs_; }
  const std::vector<double>& min_lrs() const { return min_lrs_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: total_steps, _schedule_phases, _anneal_func_type, cycle_momentum,
  /// use_beta1 (with cycle_momentum) and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);
  /// What Python's OneCycleLR keeps in the optimizer's parameter group `group` (initial_lr, max_lr,
  /// min_lr, and with cycle_momentum max_momentum and base_momentum), added to `out`.
  void python_param_group(std::size_t group, c10::impl::GenericDict& out) const;
  /// Reads those entries from Python's parameter group `group` of the optimizer's state (Python's
  /// OneCycleLR reads them there, not from its own state); checked before anything is changed.
  void load_python_param_group(std::size_t group, const c10::impl::GenericDict& in, const std::string& what);

 private:
  /// A value of a parameter group that a phase starts or ends at (Python names it by its group key).
  enum class GroupValue { initial_lr, max_lr, min_lr, max_momentum, base_momentum };
  struct Phase {
    double end_step;
    bool end_step_is_int;  // Python's total_steps - 1 is an int, the pct_start ends are floats
    GroupValue start_lr, end_lr, start_momentum, end_momentum;
  };
  static constexpr std::array<SchedulerField<OneCycleLR>, 6> fields() {
    return std::array{field("total_steps", &OneCycleLR::total_steps_, 1),
                      field("cycle_momentum", &OneCycleLR::cycle_momentum_),
                      field("max_lrs", &OneCycleLR::max_lrs_),
                      field("min_lrs", &OneCycleLR::min_lrs_),
                      field("max_momentums", &OneCycleLR::max_momentums_),
                      field("base_momentums", &OneCycleLR::base_momentums_)};
  }
  double group_value(GroupValue v, std::size_t group) const;
  /// Python's get_lr at `step`: each group's rate (returned) and momentum (set).
  /// The rates of step `step` (in next_rates_), and the momenta set.
  const std::vector<double>& rates_at(std::int64_t step);
  static std::vector<Phase> python_phases(const c10::IValue& saved, const std::string& what);

  std::int64_t total_steps_ = 1;
  std::vector<Phase> phases_;
  AnnealStrategy anneal_;
  bool cycle_momentum_;
  CycledMomentum momentum_ = CycledMomentum::none;
  std::vector<double> max_lrs_, min_lrs_, max_momentums_, base_momentums_;  // initial_lr is base_lrs_
};

/// How CyclicLR scales each cycle's amplitude (Python's `mode`).
enum class CyclicMode { triangular, triangular2, exp_range };
/// What CyclicLR's scale function is called with: the cycle's number or the step's (Python's `scale_mode`).
enum class ScaleMode { cycle, iterations };

/// Python's `CyclicLR` keyword arguments, with Python's defaults.
struct CyclicLROptions {
  /// The lower and upper bounds of the rate: one for all groups, or one per group. Required.
  PerGroup base_lr = 0.0;
  PerGroup max_lr = 0.0;
  /// Steps in the rising and the falling half of a cycle (the falling one is the rising one's when unset).
  double step_size_up = 2000;
  std::optional<double> step_size_down{};
  CyclicMode mode = CyclicMode::triangular;
  /// exp_range's factor: the amplitude times gamma ** step.
  double gamma = 1.0;
  /// A scale function of your own (Python's `scale_fn`), called with the cycle or the step as
  /// `scale_mode` says; it replaces `mode`'s.
  std::function<double(std::int64_t)> scale_fn{};
  ScaleMode scale_mode = ScaleMode::cycle;
  bool cycle_momentum = true;
  PerGroup base_momentum = 0.8;
  PerGroup max_momentum = 0.9;
};

/**
 * @brief Python's `CyclicLR(optimizer, base_lr, max_lr, ...)`: the rate cycles between `base_lr` and
 * `max_lr` (and the momentum the other way), in its three modes or with a scale function of your own.
 */
class CyclicLR : public EpochLRScheduler {
 public:
  static constexpr InitialLr initial_lr = InitialLr::own_base_lrs;
  CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options);
  void step();
  void restart_at_milestone();
  const std::vector<double>& max_lrs() const { return max_lrs_; }
  double total_size() const { return total_size_; }
  double step_ratio() const { return step_ratio_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: max_lrs, total_size, step_ratio, mode, gamma, scale_mode,
  /// cycle_momentum (with it use_beta1, base_momentums, max_momentums), the LRScheduler entries and
  /// _scale_fn_custom (None: a C++ function, as a Python function, saves nothing).
  void python_state(c10::impl::GenericDict& out) const;
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);
  /// What Python's CyclicLR writes into parameter group `group` with cycle_momentum: max_momentum and
  /// base_momentum (it reads its own state's, so nothing is read back).
  void python_param_group(std::size_t group, c10::impl::GenericDict& out) const;

 private:
  static constexpr std::array<SchedulerField<CyclicLR>, 7> fields() {
    return std::array{field("max_lrs", &CyclicLR::max_lrs_),
                      field("total_size", &CyclicLR::total_size_),
                      field("step_ratio", &CyclicLR::step_ratio_),
                      field("gamma", &CyclicLR::gamma_),
                      field("cycle_momentum", &CyclicLR::cycle_momentum_),
                      field("base_momentums", &CyclicLR::base_momentums_),
                      field("max_momentums", &CyclicLR::max_momentums_)};
  }
  /// The mode's scale function, or the user's.
  double scale(std::int64_t x) const;
  /// Python's get_lr at last_epoch: each group's rate (returned) and momentum (set).
  /// The rates of this step (in next_rates_), and the momenta set.
  const std::vector<double>& rates_now();

  std::vector<double> max_lrs_;
  double total_size_;
  double step_ratio_;
  CyclicMode mode_;
  double gamma_;
  std::function<double(std::int64_t)> scale_fn_;
  ScaleMode scale_mode_;
  bool cycle_momentum_;
  CycledMomentum momentum_ = CycledMomentum::none;
  std::vector<double> base_momentums_, max_momentums_;
};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <numbers>
#include <utility>

#include "../error.hpp"

namespace dettrial::detail::cyclic {

/// Which momentum the optimizer has (Python: "momentum" or "betas" in its defaults); cycling a
/// momentum on an optimizer with neither is a ConfigError, as in Python.
DETTRIAL_INLINE optim::CycledMomentum cycled_momentum(const char* scheduler, torch::optim::Optimizer& optimizer) {
  auto& defaults = optimizer.defaults();
  if (dynamic_cast<torch::optim::SGDOptions*>(&defaults)) return optim::CycledMomentum::sgd;
  if (dynamic_cast<torch::optim::RMSpropOptions*>(&defaults)) return optim::CycledMomentum::rmsprop;
  if (dynamic_cast<torch::optim::AdamWOptions*>(&defaults)) return optim::CycledMomentum::adamw;
  if (dynamic_cast<torch::optim::AdamOptions*>(&defaults)) return optim::CycledMomentum::adam;
  throw ConfigError(std::string("dettrial::optim::") + scheduler +
                    ": cycle_momentum needs an optimizer with a momentum (SGD, RMSprop) or beta1 (Adam, AdamW); pass "
                    "cycle_momentum = false for this one");
}

DETTRIAL_INLINE bool uses_beta1(optim::CycledMomentum m) { return m == optim::CycledMomentum::adam || m == optim::CycledMomentum::adamw; }

/// Sets Python's group["momentum"] or group["betas"][0].
DETTRIAL_INLINE void set_momentum(optim::CycledMomentum kind, torch::optim::OptimizerOptions& options, double momentum) {
  switch (kind) {
    case optim::CycledMomentum::sgd: static_cast<torch::optim::SGDOptions&>(options).momentum(momentum); break;
    case optim::CycledMomentum::rmsprop: static_cast<torch::optim::RMSpropOptions&>(options).momentum(momentum); break;
    case optim::CycledMomentum::adam: {
      auto& adam = static_cast<torch::optim::AdamOptions&>(options);
      adam.betas({momentum, std::get<1>(adam.betas())});
      break;
    }
    case optim::CycledMomentum::adamw: {
      auto& adamw = static_cast<torch::optim::AdamWOptions&>(options);
      adamw.betas({momentum, std::get<1>(adamw.betas())});
      break;
    }
    case optim::CycledMomentum::none: break;
  }
}

/// Python's annealing functions, term for term.
DETTRIAL_INLINE double anneal(optim::AnnealStrategy strategy, double start, double end, double pct) {
  if (strategy == optim::AnnealStrategy::linear) return (end - start) * pct + start;
  const double cos_out = std::cos(std::numbers::pi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}

}  // namespace dettrial::detail::cyclic

namespace dettrial::optim {
// ------------------------------------------------------------------------------------------------
// OneCycleLR

DETTRIAL_INLINE OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, const OneCycleLROptions& o)
    : EpochLRScheduler(optimizer, "OneCycleLR"), anneal_(o.anneal_strategy), cycle_momentum_(o.cycle_momentum) {
  if (o.total_steps) {
    if (*o.total_steps < 1) invalid("total_steps", "a positive number of steps", std::to_string(*o.total_steps));
    total_steps_ = *o.total_steps;
  } else if (o.epochs && o.steps_per_epoch) {
    if (*o.epochs < 1) invalid("epochs", "positive", std::to_string(*o.epochs));
    if (*o.steps_per_epoch < 1) invalid("steps_per_epoch", "positive", std::to_string(*o.steps_per_epoch));
    total_steps_ = *o.epochs * *o.steps_per_epoch;
  } else {
    invalid("total_steps", "given (or epochs and steps_per_epoch)", "missing");
  }
  if (!(o.pct_start >= 0 && o.pct_start <= 1)) invalid("pct_start", "in [0, 1]", detail::number_text(o.pct_start));
  if (!(o.div_factor > 0)) invalid("div_factor", "positive", detail::number_text(o.div_factor));
  if (!(o.final_div_factor > 0)) invalid("final_div_factor", "positive", detail::number_text(o.final_div_factor));
  const double total = static_cast<double>(total_steps_);
  using G = GroupValue;
  const Phase up{o.pct_start * total - 1, false, G::initial_lr, G::max_lr, G::max_momentum, G::base_momentum};
  if (o.three_phase)
    phases_ = {up,
               {2 * o.pct_start * total - 2, false, G::max_lr, G::initial_lr, G::base_momentum, G::max_momentum},
               {total - 1, true, G::initial_lr, G::min_lr, G::max_momentum, G::max_momentum}};
  else phases_ = {up, {total - 1, true, G::max_lr, G::min_lr, G::base_momentum, G::max_momentum}};
  max_lrs_ = detail::scheduler_base::per_group("OneCycleLR", "max_lr", o.max_lr, optimizer);
  for (const double m : max_lrs_)
    if (!(m > 0)) invalid("max_lr", "positive (is it set?)", detail::number_text(m));
  for (std::size_t i = 0; i < max_lrs_.size(); ++i) {
    base_lrs_[i] = max_lrs_[i] / o.div_factor;  // Python's group["initial_lr"]
    min_lrs_.push_back(base_lrs_[i] / o.final_div_factor);
  }
  if (cycle_momentum_) {
    momentum_ = detail::cyclic::cycled_momentum("OneCycleLR", optimizer);
    max_momentums_ = detail::scheduler_base::per_group("OneCycleLR", "max_momentum", o.max_momentum, optimizer);
    base_momentums_ = detail::scheduler_base::per_group("OneCycleLR", "base_momentum", o.base_momentum, optimizer);
  }
  step();  // Python's constructor steps once: step 0 of the cycle
}

DETTRIAL_INLINE double OneCycleLR::group_value(GroupValue v, std::size_t group) const {
  switch (v) {
    case GroupValue::initial_lr: return base_lrs_[group];
    case GroupValue::max_lr: return max_lrs_[group];
    case GroupValue::min_lr: return min_lrs_[group];
    case GroupValue::max_momentum: return max_momentums_[group];
    case GroupValue::base_momentum: return base_momentums_[group];
  }
  return 0.0;
}

DETTRIAL_INLINE const std::vector<double>& OneCycleLR::rates_at(std::int64_t step) {
  if (step > total_steps_)  // Python raises ValueError here
    throw TrialError("dettrial::optim::OneCycleLR: tried to step " + std::to_string(step) + " times; the cycle has total_steps " +
                     std::to_string(total_steps_));
  auto& groups = optimizer_->param_groups();
  std::vector<double>& rates = next_rates_;
  rates.clear();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    double start_step = 0.0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (static_cast<double>(step) <= phase.end_step || i + 1 == phases_.size()) {
        const double span = phase.end_step - start_step;
        if (span == 0) throw TrialError("dettrial::optim::OneCycleLR: a phase of 0 steps (Python divides by zero here)");
        const double pct = (static_cast<double>(step) - start_step) / span;
        rates.push_back(detail::cyclic::anneal(anneal_, group_value(phase.start_lr, g), group_value(phase.end_lr, g), pct));
        if (cycle_momentum_)
          detail::cyclic::set_momentum(
              momentum_, groups[g].options(),
              detail::cyclic::anneal(anneal_, group_value(phase.start_momentum, g), group_value(phase.end_momentum, g), pct));
        break;
      }
      start_step = phase.end_step;
    }
  }
  return rates;
}

DETTRIAL_INLINE void OneCycleLR::step() {
  const std::vector<double>& rates = rates_at(last_epoch_ + 1);  // checked before anything moves
  advance_each([&rates](std::size_t i, double) { return rates[i]; });
}

DETTRIAL_INLINE void OneCycleLR::restart_at_milestone() {
  const std::vector<double>& rates = rates_at(0);
  restart_with([&rates](std::size_t i, double) { return rates[i]; });
}

DETTRIAL_INLINE void OneCycleLR::save(torch::serialize::OutputArchive& archive) const {
  save_fields(*this, archive, fields());
  archive.write("anneal_strategy", c10::IValue(std::string(anneal_ == AnnealStrategy::cos ? "cos" : "linear")));
  std::vector<double> ends;
  for (const Phase& p : phases_) ends.push_back(p.end_step);
  archive.write("phase_ends", c10::IValue(ends));  // the phases' kinds follow from their number
}

DETTRIAL_INLINE void OneCycleLR::load(torch::serialize::InputArchive& archive) {
  const std::string anneal = detail::scheduler_base::text_of(archived(archive, "anneal_strategy"), archive_owner() + ": 'anneal_strategy'");
  if (anneal != "cos" && anneal != "linear")
    throw CheckpointError(archive_owner() + ": anneal_strategy '" + anneal + "' is not cos or linear");
  const std::vector<double> ends = python::numbers(archived(archive, "phase_ends"), archive_owner() + ": 'phase_ends'");
  if (ends.size() != phases_.size())
    throw CheckpointError(archive_owner() + " has " + std::to_string(ends.size()) + " phases, the trial's OneCycleLR " +
                          std::to_string(phases_.size()) + " (three_phase differs)");
  load_fields(*this, archive, fields());
  anneal_ = anneal == "cos" ? AnnealStrategy::cos : AnnealStrategy::linear;
  for (std::size_t i = 0; i < ends.size(); ++i) phases_[i].end_step = ends[i];
}

DETTRIAL_INLINE void OneCycleLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("total_steps", total_steps_);
  static constexpr std::array<const char*, 5> names = {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"};
  const auto name = [](GroupValue v) { return std::string(names[static_cast<std::size_t>(v)]); };
  c10::impl::GenericList phases(c10::AnyType::get());
  for (const Phase& p : phases_) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("end_step", p.end_step_is_int ? c10::IValue(static_cast<std::int64_t>(p.end_step)) : c10::IValue(p.end_step));
    d.insert("start_lr", name(p.start_lr));
    d.insert("end_lr", name(p.end_lr));
    d.insert("start_momentum", name(p.start_momentum));
    d.insert("end_momentum", name(p.end_momentum));
    phases.push_back(d);
  }
  out.insert("_schedule_phases", phases);
  out.insert("_anneal_func_type", std::string(anneal_ == AnnealStrategy::cos ? "cos" : "linear"));
  out.insert("cycle_momentum", cycle_momentum_);
  if (cycle_momentum_) out.insert("use_beta1", detail::cyclic::uses_beta1(momentum_));
  python_common(out);
}

DETTRIAL_INLINE std::vector<OneCycleLR::Phase> OneCycleLR::python_phases(const c10::IValue& saved, const std::string& what) {
  if (!saved.isList()) throw CheckpointError(what + ": _schedule_phases is not a list");
  static const std::map<std::string, GroupValue> values = {{"initial_lr", GroupValue::initial_lr},
                                                           {"max_lr", GroupValue::max_lr},
                                                           {"min_lr", GroupValue::min_lr},
                                                           {"max_momentum", GroupValue::max_momentum},
                                                           {"base_momentum", GroupValue::base_momentum}};
  std::vector<Phase> phases;
  for (const c10::IValue& entry : saved.toListRef()) {
    if (!entry.isGenericDict()) throw CheckpointError(what + ": a phase of _schedule_phases is not a dict");
    const auto d = entry.toGenericDict();
    const auto value = [&](const char* key) {
      const auto it = d.find(key);
      const std::string name =
          it == d.end() ? std::string("(none)") : detail::scheduler_base::text_of(it->value(), what + ": a phase's " + key);
      const auto known = values.find(name);
      if (known == values.end())
        throw CheckpointError(what + ": a phase's " + key + " is '" + name + "', not a group value OneCycleLR has");
      return known->second;
    };
    const auto end = d.find("end_step");
    if (end == d.end()) throw CheckpointError(what + ": a phase of _schedule_phases has no end_step");
    phases.push_back({python::number(end->value(), what + ": end_step"), end->value().isInt(), value("start_lr"), value("end_lr"),
                      value("start_momentum"), value("end_momentum")});
  }
  if (phases.empty()) throw CheckpointError(what + ": _schedule_phases is empty");
  return phases;
}

DETTRIAL_INLINE void OneCycleLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  const auto entry = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end()) throw CheckpointError(what + " has no '" + key + "': it is not Python's OneCycleLR state");
    return it->value();
  };
  // Read and checked before anything is changed.
  const std::int64_t total_steps = python::count(entry("total_steps"), what + ": total_steps", 1);
  std::vector<Phase> phases = python_phases(entry("_schedule_phases"), what);
  const std::string anneal = detail::scheduler_base::text_of(entry("_anneal_func_type"), what + ": _anneal_func_type");
  if (anneal != "cos" && anneal != "linear") throw CheckpointError(what + ": _anneal_func_type '" + anneal + "' is not cos or linear");
  const bool cycle_momentum = python::number(entry("cycle_momentum"), what + ": cycle_momentum") != 0;
  if (cycle_momentum != cycle_momentum_)
    throw CheckpointError(what + " has cycle_momentum " + (cycle_momentum ? "True" : "False") + ", the trial's OneCycleLR " +
                          (cycle_momentum_ ? "true" : "false"));
  std::vector<std::string> own = {"total_steps", "_schedule_phases", "_anneal_func_type", "cycle_momentum"};
  if (cycle_momentum) {
    own.emplace_back("use_beta1");
    if ((python::number(entry("use_beta1"), what + ": use_beta1") != 0) != detail::cyclic::uses_beta1(momentum_))
      throw CheckpointError(what + ": use_beta1 says another optimizer family (Adam's beta1 against a momentum) than the trial's");
  }
  load_python_common(in, own, what);
  total_steps_ = total_steps;
  phases_ = std::move(phases);
  anneal_ = anneal == "cos" ? AnnealStrategy::cos : AnnealStrategy::linear;
}

DETTRIAL_INLINE void OneCycleLR::python_param_group(std::size_t group, c10::impl::GenericDict& out) const {
  out.insert_or_assign("initial_lr", base_lrs_.at(group));
  out.insert_or_assign("max_lr", max_lrs_.at(group));
  out.insert_or_assign("min_lr", min_lrs_.at(group));
  if (!cycle_momentum_) return;
  out.insert_or_assign("max_momentum", max_momentums_.at(group));
  out.insert_or_assign("base_momentum", base_momentums_.at(group));
}

DETTRIAL_INLINE void OneCycleLR::load_python_param_group(std::size_t group, const c10::impl::GenericDict& in, const std::string& what) {
  const auto value = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end())
      throw CheckpointError(what + " has no '" + key + "', which Python's OneCycleLR keeps there: was the checkpoint's scheduler another?");
    return python::number(it->value(), what + ": " + key);
  };
  const double initial = value("initial_lr"), max_lr = value("max_lr"), min_lr = value("min_lr");
  const double max_m = cycle_momentum_ ? value("max_momentum") : 0.0, base_m = cycle_momentum_ ? value("base_momentum") : 0.0;
  base_lrs_.at(group) = initial;
  max_lrs_.at(group) = max_lr;
  min_lrs_.at(group) = min_lr;
  if (!cycle_momentum_) return;
  max_momentums_.at(group) = max_m;
  base_momentums_.at(group) = base_m;
}

// ------------------------------------------------------------------------------------------------
// CyclicLR

DETTRIAL_INLINE CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions o)
    : EpochLRScheduler(optimizer, "CyclicLR"),
      mode_(o.mode),
      gamma_(o.gamma),
      scale_fn_(std::move(o.scale_fn)),
      scale_mode_(o.scale_mode),
      cycle_momentum_(o.cycle_momentum) {
  if (!(o.step_size_up > 0)) invalid("step_size_up", "positive", detail::number_text(o.step_size_up));
  const double down = o.step_size_down.value_or(o.step_size_up);
  if (!(down >= 0)) invalid("step_size_down", "at least 0", detail::number_text(down));
  base_lrs_ = detail::scheduler_base::per_group("CyclicLR", "base_lr", o.base_lr, optimizer);
  max_lrs_ = detail::scheduler_base::per_group("CyclicLR", "max_lr", o.max_lr, optimizer);
  for (const double m : max_lrs_)
    if (!(m > 0)) invalid("max_lr", "positive (is it set?)", detail::number_text(m));
  total_size_ = o.step_size_up + down;
  step_ratio_ = o.step_size_up / total_size_;
  // Python's _init_scale_fn: a built-in mode chooses its own scale mode.
  if (!scale_fn_) scale_mode_ = mode_ == CyclicMode::exp_range ? ScaleMode::iterations : ScaleMode::cycle;
  if (cycle_momentum_) {
    momentum_ = detail::cyclic::cycled_momentum("CyclicLR", optimizer);
    base_momentums_ = detail::scheduler_base::per_group("CyclicLR", "base_momentum", o.base_momentum, optimizer);
    max_momentums_ = detail::scheduler_base::per_group("CyclicLR", "max_momentum", o.max_momentum, optimizer);
  }
  step();  // Python's constructor steps once: the rates at base_lr, the momentum at max_momentum
}

DETTRIAL_INLINE double CyclicLR::scale(std::int64_t x) const {
  if (scale_fn_) return scale_fn_(x);
  switch (mode_) {
    case CyclicMode::triangular: return 1.0;
    case CyclicMode::triangular2: return 1 / std::pow(2.0, static_cast<double>(x - 1));
    case CyclicMode::exp_range: return std::pow(gamma_, static_cast<double>(x));
  }
  return 1.0;
}

DETTRIAL_INLINE const std::vector<double>& CyclicLR::rates_now() {
  const double epoch = static_cast<double>(last_epoch_);
  const auto cycle = static_cast<std::int64_t>(std::floor(1 + epoch / total_size_));
  const double x = 1.0 + epoch / total_size_ - static_cast<double>(cycle);
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double scaled = scale(scale_mode_ == ScaleMode::cycle ? cycle : last_epoch_);
  std::vector<double>& rates = next_rates_;
  rates.clear();
  for (std::size_t i = 0; i < max_lrs_.size(); ++i) rates.push_back(base_lrs_[i] + (max_lrs_[i] - base_lrs_[i]) * scale_factor * scaled);
  if (cycle_momentum_) {
    auto& groups = optimizer_->param_groups();
    for (std::size_t i = 0; i < groups.size() && i < max_momentums_.size(); ++i)
      detail::cyclic::set_momentum(momentum_, groups[i].options(),
                                   max_momentums_[i] - (max_momentums_[i] - base_momentums_[i]) * scale_factor * scaled);
  }
  return rates;
}

DETTRIAL_INLINE void CyclicLR::step() {
  ++step_count_;
  ++last_epoch_;
  const std::vector<double>& rates = rates_now();
  set_rates([&rates](std::size_t i, double) { return rates[i]; });
}

DETTRIAL_INLINE void CyclicLR::restart_at_milestone() {
  last_epoch_ = 0;
  const std::vector<double>& rates = rates_now();
  set_rates([&rates](std::size_t i, double) { return rates[i]; });
}

}  // namespace dettrial::optim

namespace dettrial::detail::cyclic {
DETTRIAL_INLINE const char* mode_name(optim::CyclicMode m) {
  return m == optim::CyclicMode::triangular ? "triangular" : m == optim::CyclicMode::triangular2 ? "triangular2" : "exp_range";
}
DETTRIAL_INLINE optim::CyclicMode mode_named(const std::string& name, const std::string& what) {
  if (name == "triangular") return optim::CyclicMode::triangular;
  if (name == "triangular2") return optim::CyclicMode::triangular2;
  if (name == "exp_range") return optim::CyclicMode::exp_range;
  throw CheckpointError(what + ": mode '" + name + "' is not triangular, triangular2 or exp_range");
}
DETTRIAL_INLINE optim::ScaleMode scale_mode_named(const std::string& name, const std::string& what) {
  if (name == "cycle") return optim::ScaleMode::cycle;
  if (name == "iterations") return optim::ScaleMode::iterations;
  throw CheckpointError(what + ": scale_mode '" + name + "' is not cycle or iterations");
}
}  // namespace dettrial::detail::cyclic

namespace dettrial::optim {
DETTRIAL_INLINE void CyclicLR::save(torch::serialize::OutputArchive& archive) const {
  save_fields(*this, archive, fields());
  archive.write("mode", c10::IValue(std::string(detail::cyclic::mode_name(mode_))));
  archive.write("scale_mode", c10::IValue(std::string(scale_mode_ == ScaleMode::cycle ? "cycle" : "iterations")));
}

DETTRIAL_INLINE void CyclicLR::load(torch::serialize::InputArchive& archive) {
  const std::string owner = archive_owner();
  const CyclicMode mode = detail::cyclic::mode_named(detail::scheduler_base::text_of(archived(archive, "mode"), owner + ": 'mode'"), owner);
  const ScaleMode scale_mode =
      detail::cyclic::scale_mode_named(detail::scheduler_base::text_of(archived(archive, "scale_mode"), owner + ": 'scale_mode'"), owner);
  load_fields(*this, archive, fields());
  mode_ = mode;
  scale_mode_ = scale_mode;
}

DETTRIAL_INLINE void CyclicLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("max_lrs", python::list(max_lrs_));
  out.insert("total_size", total_size_);
  out.insert("step_ratio", step_ratio_);
  out.insert("mode", std::string(detail::cyclic::mode_name(mode_)));
  out.insert("gamma", gamma_);
  out.insert("scale_mode", std::string(scale_mode_ == ScaleMode::cycle ? "cycle" : "iterations"));
  out.insert("cycle_momentum", cycle_momentum_);
  if (cycle_momentum_) {
    out.insert("use_beta1", detail::cyclic::uses_beta1(momentum_));
    out.insert("base_momentums", python::list(base_momentums_));
    out.insert("max_momentums", python::list(max_momentums_));
  }
  python_common(out);
  out.insert("_scale_fn_custom", c10::IValue());
}

DETTRIAL_INLINE void CyclicLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  const auto entry = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end()) throw CheckpointError(what + " has no '" + key + "': it is not Python's CyclicLR state");
    return it->value();
  };
  const std::size_t groups = optimizer_->param_groups().size();
  const auto per_group = [&](const char* key) {
    std::vector<double> v = python::numbers(entry(key), what + ": " + key);
    if (v.size() != groups)
      throw CheckpointError(what + " has " + std::to_string(v.size()) + " " + key + ", but the optimizer " + std::to_string(groups) +
                            " group(s)");
    return v;
  };
  // Read and checked before anything is changed.
  const c10::IValue custom = entry("_scale_fn_custom");
  if (!custom.isNone() && !(custom.isGenericDict() && custom.toGenericDict().empty()))
    throw CheckpointError(what + ": _scale_fn_custom holds the attributes of a Python callable object, which a C++ function cannot take");
  std::vector<double> max_lrs = per_group("max_lrs");
  const double total_size = python::number(entry("total_size"), what + ": total_size");
  const double step_ratio = python::number(entry("step_ratio"), what + ": step_ratio");
  const CyclicMode mode = detail::cyclic::mode_named(detail::scheduler_base::text_of(entry("mode"), what + ": mode"), what);
  const double gamma = python::number(entry("gamma"), what + ": gamma");
  ScaleMode scale_mode =
      detail::cyclic::scale_mode_named(detail::scheduler_base::text_of(entry("scale_mode"), what + ": scale_mode"), what);
  const bool cycle_momentum = python::number(entry("cycle_momentum"), what + ": cycle_momentum") != 0;
  if (cycle_momentum != cycle_momentum_)
    throw CheckpointError(what + " has cycle_momentum " + (cycle_momentum ? "True" : "False") + ", the trial's CyclicLR " +
                          (cycle_momentum_ ? "true" : "false"));
  std::vector<std::string> own = {"max_lrs", "total_size", "step_ratio",     "mode",
                                  "gamma",   "scale_mode", "cycle_momentum", "_scale_fn_custom"};
  std::vector<double> base_momentums, max_momentums;
  if (cycle_momentum) {
    own.insert(own.end(), {"use_beta1", "base_momentums", "max_momentums"});
    base_momentums = per_group("base_momentums");
    max_momentums = per_group("max_momentums");
  }
  load_python_common(in, own, what);
  max_lrs_ = std::move(max_lrs);
  total_size_ = total_size;
  step_ratio_ = step_ratio;
  mode_ = mode;
  gamma_ = gamma;
  // Python's load_state_dict re-runs _init_scale_fn: a built-in mode sets its scale mode again.
  if (!scale_fn_) scale_mode = mode_ == CyclicMode::exp_range ? ScaleMode::iterations : ScaleMode::cycle;
  scale_mode_ = scale_mode;
  base_momentums_ = std::move(base_momentums);
  max_momentums_ = std::move(max_momentums);
}

DETTRIAL_INLINE void CyclicLR::python_param_group(std::size_t group, c10::impl::GenericDict& out) const {
  if (!cycle_momentum_) return;
  out.insert_or_assign("max_momentum", max_momentums_.at(group));
  out.insert_or_assign("base_momentum", base_momentums_.at(group));
}

}  // namespace dettrial::optim

#endif  // DETTRIAL_HEADER_DEFINITIONS
