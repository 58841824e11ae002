// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Learning-rate schedulers with PyTorch's (Python's) semantics: StepLR, MultiStepLR,
/// ExponentialLR, LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR,
/// CosineAnnealingWarmRestarts and ReduceLROnPlateau, exact resume, and Python's
/// `scheduler.state_dict()` layout.
///
/// LibTorch's own `torch::optim::StepLR` decays one step later than Python's (it does not count the
/// step Python's constructor takes), so a schedule ported from Python drifts by one step. These follow
/// Python's `torch.optim.lr_scheduler` to the bit: after k `step()` calls the learning rates are
/// Python's after k calls, computed as Python's `step()` computes them (its chainable, step-to-step
/// `get_lr`, not the closed form that `step(epoch)` uses), in Python's order of float operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"

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

 protected:
  EpochLRScheduler(torch::optim::Optimizer& optimizer, const char* name);
  /// One Python `step()`: `last_epoch` and the step count advance, and each group's learning rate is
  /// multiplied by `factor` when `decay` (Python's `group["lr"] * ...`), else left as it is.
  void advance(bool decay, double factor);
  /// One Python `step()` whose new rates Python's `get_lr` computes: `last_epoch` and the step count
  /// advance, then group i's learning rate becomes `rate(i, its current rate)`.
  void advance_each(const std::function<double(std::size_t, double)>& rate);
  /// Sets group i's learning rate to `rate(i, its current rate)` and records the rates as the last.
  void set_rates(const std::function<double(std::size_t, double)>& rate);
  /// The state every scheduler saves (with its type's name, checked on load).
  void save_common(torch::serialize::OutputArchive& archive) const;
  void load_common(torch::serialize::InputArchive& archive);
  /// Python's LRScheduler entries of `state_dict()`, after the subclass's own.
  void python_common(c10::impl::GenericDict& out) const;
  /// Reads Python's `state_dict()` of this type: checks that every entry is one of `own` or of
  /// Python's LRScheduler (another type's is a CheckpointError naming the entry), then sets the
  /// common state. Returns the entries of `own`, which the subclass sets.
  std::map<std::string, c10::IValue> load_python_common(const c10::impl::GenericDict& in, std::initializer_list<const char*> own,
                                                        const std::string& what);
  /// A ConfigError naming the class, the argument, the rule and the value.
  [[noreturn]] void invalid(const char* argument, const std::string& rule, const std::string& value) const;

  torch::optim::Optimizer* optimizer_;
  const char* name_;  // "StepLR", ...
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  std::vector<double> last_lr_;
};

/// Python's `StepLR(optimizer, step_size, gamma=0.1)`: multiplies each group's learning rate by
/// `gamma` on every `step_size`-th step.
class StepLR : public EpochLRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);
  void step();
  std::int64_t step_size() const { return step_size_; }
  double gamma() const { return gamma_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: step_size, gamma, base_lrs, last_epoch, verbose, _step_count,
  /// _get_lr_called_within_step, _is_initial, _last_lr.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's StepLR.state_dict() (or python_state) holds; `what` names it in errors.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  std::int64_t step_size_;
  double gamma_;
};

/// Python's `MultiStepLR(optimizer, milestones, gamma=0.1)`: multiplies each group's learning rate by
/// `gamma` when `last_epoch` reaches a milestone (by `gamma` to the n-th power for a milestone given n
/// times, as Python's Counter does).
class MultiStepLR : public EpochLRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, const std::vector<std::int64_t>& milestones, double gamma = 0.1);
  void step();
  /// Each milestone with the number of times it was given.
  const std::map<std::int64_t, std::int64_t>& milestones() const { return milestones_; }
  double gamma() const { return gamma_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: milestones (a dict milestone -> count, as Python's Counter pickles
  /// into one), gamma, and the LRScheduler entries as StepLR's.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's MultiStepLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  std::map<std::int64_t, std::int64_t> milestones_;
  double gamma_;
};

/// Python's `ExponentialLR(optimizer, gamma)`: multiplies each group's learning rate by `gamma` on
/// every step.
class ExponentialLR : public EpochLRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  void step();
  double gamma() const { return gamma_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: gamma and the LRScheduler entries as StepLR's.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's ExponentialLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  double gamma_;
};

/// Python's `LinearLR(optimizer, start_factor=1/3, end_factor=1.0, total_iters=5)`: the learning
/// rates start at `start_factor` times the groups' rates and change linearly, by Python's chainable
/// (step-to-step) factors, to `end_factor` times them after `total_iters` steps, then stay.
class LinearLR : public EpochLRScheduler {
 public:
  explicit LinearLR(torch::optim::Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    std::int64_t total_iters = 5);
  void step();
  double start_factor() const { return start_factor_; }
  double end_factor() const { return end_factor_; }
  std::int64_t total_iters() const { return total_iters_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: start_factor, end_factor, total_iters and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's LinearLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  double start_factor_;
  double end_factor_;
  std::int64_t total_iters_;
};

/// Python's `ConstantLR(optimizer, factor=1/3, total_iters=5)`: the learning rates are multiplied by
/// `factor` for the first `total_iters` steps and by `1 / factor` at step `total_iters`.
class ConstantLR : public EpochLRScheduler {
 public:
  explicit ConstantLR(torch::optim::Optimizer& optimizer, double factor = 1.0 / 3, std::int64_t total_iters = 5);
  void step();
  double factor() const { return factor_; }
  std::int64_t total_iters() const { return total_iters_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: factor, total_iters and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's ConstantLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  double factor_;
  std::int64_t total_iters_;
};

/// Python's `CosineAnnealingLR(optimizer, T_max, eta_min=0)`: cosine annealing from the groups' rates
/// to `eta_min` over `T_max` steps and back over the next `T_max`, computed as Python's `step()` does,
/// step to step (its recursive form, not the closed form, which differs in the last bits).
class CosineAnnealingLR : public EpochLRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, std::int64_t T_max, double eta_min = 0.0);
  void step();
  std::int64_t T_max() const { return T_max_; }
  double eta_min() const { return eta_min_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: T_max, eta_min and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's CosineAnnealingLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  std::int64_t T_max_;
  double eta_min_;
};

/// A learning-rate factor as a function of `last_epoch` (Python's `lr_lambda`).
using LRLambda = std::function<double(std::int64_t)>;

/**
 * @brief What LambdaLR and MultiplicativeLR share: one function per parameter group, and Python's
 * `lr_lambdas` entry, a list of None (Python saves no plain function, and C++ functions have no state).
 */
class LambdaScheduler : public EpochLRScheduler {
 public:
  void save(torch::serialize::OutputArchive& archive) const { save_common(archive); }
  void load(torch::serialize::InputArchive& archive) { load_common(archive); }
  /// Python's `state_dict()`: the LRScheduler entries and lr_lambdas, one None per group.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores Python's state; an `lr_lambdas` entry holding a callable object's attributes is a
  /// CheckpointError (a C++ function cannot take them).
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 protected:
  LambdaScheduler(torch::optim::Optimizer& optimizer, const char* name, std::vector<LRLambda> lr_lambdas);
  /// One function for every group, shared as Python's `[lr_lambda] * len(param_groups)` shares it (a
  /// stateful function is called once per group per step, on one state).
  static std::vector<LRLambda> one_per_group(LRLambda lr_lambda, const torch::optim::Optimizer& optimizer);
  std::vector<LRLambda> lr_lambdas_;
};

/// Python's `LambdaLR(optimizer, lr_lambda)`: each group's rate is its initial rate times
/// `lr_lambda(last_epoch)` (one function for all groups, or one per group).
class LambdaLR : public LambdaScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, LRLambda lr_lambda);
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LRLambda> lr_lambdas);
  void step();
};

/// Python's `MultiplicativeLR(optimizer, lr_lambda)`: each step multiplies each group's rate by
/// `lr_lambda(last_epoch)` (one function for all groups, or one per group); the constructor's step
/// leaves the rates as they are.
class MultiplicativeLR : public LambdaScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, LRLambda lr_lambda);
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<LRLambda> lr_lambdas);
  void step();
};

/// Python's `PolynomialLR(optimizer, total_iters=5, power=1.0)`: the rates decay as
/// `(1 - last_epoch / total_iters) ** power` times the initial ones, by Python's step-to-step factors,
/// reaching 0 at `total_iters` and staying there.
class PolynomialLR : public EpochLRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters = 5, double power = 1.0);
  void step();
  std::int64_t total_iters() const { return total_iters_; }
  double power() const { return power_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: total_iters, power and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's PolynomialLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  std::int64_t total_iters_;
  double power_;
};

/**
 * @brief Python's `CosineAnnealingWarmRestarts(optimizer, T_0, T_mult=1, eta_min=0)`: cosine annealing
 * from the initial rates towards `eta_min` over `T_i` steps, then a restart at the initial rates, with
 * `T_i` starting at `T_0` and multiplied by `T_mult` at each restart. As in Python, its step count
 * (`_step_count`) stays 0: Python's own `step()` does not count.
 */
class CosineAnnealingWarmRestarts : public EpochLRScheduler {
 public:
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, std::int64_t T_0, std::int64_t T_mult = 1, double eta_min = 0.0);
  void step();
  std::int64_t T_0() const { return T_0_; }
  /// The length of the current cycle.
  std::int64_t T_i() const { return T_i_; }
  std::int64_t T_mult() const { return T_mult_; }
  double eta_min() const { return eta_min_; }
  /// Steps since the last restart.
  std::int64_t T_cur() const { return T_cur_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: T_0, T_i, T_mult, eta_min, T_cur and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's CosineAnnealingWarmRestarts.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  std::int64_t T_0_;
  std::int64_t T_i_;
  std::int64_t T_mult_;
  double eta_min_;
  std::int64_t T_cur_ = -1;  // Python's T_cur starts at last_epoch
};

/// ReduceLROnPlateau's options, with Python's defaults.
struct ReduceLROnPlateauOptions {
  /// "min": the metric should go down (a loss); "max": up (an accuracy).
  std::string mode = "min";
  /// The learning rate is multiplied by it on a plateau; in [0, 1).
  double factor = 0.1;
  /// Epochs without improvement tolerated; the rate drops on the next one.
  std::int64_t patience = 10;
  /// How much better than the best a metric must be to count as an improvement.
  double threshold = 1e-4;
  /// "rel": better than best * (1 -/+ threshold); "abs": better than best -/+ threshold.
  std::string threshold_mode = "rel";
  /// Epochs after a drop during which bad epochs are not counted.
  std::int64_t cooldown = 0;
  /// The lowest learning rate: one for all groups, or one per group.
  std::variant<double, std::vector<double>> min_lr = 0.0;
  /// A drop smaller than this is not made.
  double eps = 1e-8;
};

/**
 * @brief Python's `ReduceLROnPlateau`: `step(metric)` once per evaluation; when the metric has not
 * improved (by `threshold`) for more than `patience` steps, each group's learning rate becomes
 * `max(lr * factor, min_lr)` (unless that lowers it by `eps` or less), and `cooldown` steps follow in
 * which bad epochs are not counted. Python's rules and arithmetic, exactly.
 */
class ReduceLROnPlateau {
 public:
  using Options = ReduceLROnPlateauOptions;
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {});

  void step(double metric);
  /// A 0-dim tensor metric (read once: one synchronisation with its device).
  void step(const torch::Tensor& metric) { step(metric.item<double>()); }

  /// The number of `step` calls.
  std::int64_t last_epoch() const { return last_epoch_; }
  std::vector<double> get_last_lr() const { return last_lr_; }
  /// The best metric so far (+inf in "min" mode, -inf in "max" mode before any).
  double best() const { return best_; }
  std::int64_t num_bad_epochs() const { return num_bad_epochs_; }
  std::int64_t cooldown_counter() const { return cooldown_counter_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }
  const std::vector<double>& min_lrs() const { return min_lrs_; }
  const ReduceLROnPlateauOptions& options() const { return options_; }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: factor, default_min_lr, min_lrs, patience, cooldown, eps, verbose,
  /// last_epoch, _last_lr, mode_worse, mode, threshold, threshold_mode, best, cooldown_counter,
  /// num_bad_epochs.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's ReduceLROnPlateau.state_dict() (or python_state) holds: the options and
  /// where the plateau stands. Another scheduler's state is a CheckpointError naming the entry.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  bool is_better(double a, double best) const;
  void reduce_lr();
  double mode_worse() const;

  torch::optim::Optimizer* optimizer_;
  ReduceLROnPlateauOptions options_;
  bool min_mode_ = true;       // options_.mode == "min"
  bool rel_threshold_ = true;  // options_.threshold_mode == "rel"
  std::vector<double> min_lrs_;
  std::int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
  double best_;
  std::int64_t num_bad_epochs_ = 0;
  std::int64_t cooldown_counter_ = 0;
};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <set>

namespace dettrial::detail {

DETTRIAL_INLINE std::string scheduler_number(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

DETTRIAL_INLINE std::vector<double> scheduler_group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

/// A Python list of numbers: typed Any, as Python's weights-only loader wants lists.
DETTRIAL_INLINE c10::impl::GenericList scheduler_python_list(const std::vector<double>& values) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const double v : values) list.push_back(v);
  return list;
}

/// Reads one saved entry of a scheduler; absent or of another type is a CheckpointError.
struct SchedulerArchive {
  torch::serialize::InputArchive& archive;
  std::string owner;  // "dettrial::optim::StepLR's saved state"

  c10::IValue entry(const char* key) const {
    c10::IValue value;
    if (!archive.try_read(key, value)) throw CheckpointError(owner + " has no '" + key + "'");
    return value;
  }
  [[noreturn]] void mistyped(const char* key, const char* type) const { throw CheckpointError(owner + ": '" + key + "' is not " + type); }
  std::int64_t integer(const char* key) const {
    const c10::IValue v = entry(key);
    if (!v.isInt()) mistyped(key, "an integer");
    return v.toInt();
  }
  double number(const char* key) const {
    const c10::IValue v = entry(key);
    if (!v.isDouble()) mistyped(key, "a number");
    return v.toDouble();
  }
  std::string text(const char* key) const {
    const c10::IValue v = entry(key);
    if (!v.isString()) mistyped(key, "a string");
    return v.toStringRef();
  }
  std::vector<double> numbers(const char* key) const {
    const c10::IValue v = entry(key);
    if (!v.isDoubleList()) mistyped(key, "a list of numbers");
    return v.toDoubleVector();
  }
  std::vector<std::int64_t> integers(const char* key) const {
    const c10::IValue v = entry(key);
    if (!v.isIntList()) mistyped(key, "a list of integers");
    return v.toIntVector();
  }
  /// A list with one entry per parameter group of `optimizer`.
  std::vector<double> per_group(const char* key, const torch::optim::Optimizer& optimizer) const {
    std::vector<double> values = numbers(key);
    if (values.size() != optimizer.param_groups().size())
      throw CheckpointError(owner + " has " + std::to_string(values.size()) + " value(s) in '" + key + "', but the optimizer has " +
                            std::to_string(optimizer.param_groups().size()) + " parameter group(s)");
    return values;
  }
};

DETTRIAL_INLINE void check_scheduler_type(const SchedulerArchive& in, const std::string& name) {
  const std::string saved = in.text("scheduler");
  if (saved != name) throw CheckpointError(in.owner + " was written by a " + saved + ": is the checkpoint from another trial?");
}

}  // namespace dettrial::detail

namespace dettrial::optim {

// ------------------------------------------------------------------------------------------------
// EpochLRScheduler

DETTRIAL_INLINE EpochLRScheduler::EpochLRScheduler(torch::optim::Optimizer& optimizer, const char* name)
    : optimizer_(&optimizer), name_(name), base_lrs_(detail::scheduler_group_lrs(optimizer)), last_lr_(base_lrs_) {}

DETTRIAL_INLINE void EpochLRScheduler::advance(bool decay, double factor) {
  ++step_count_;
  ++last_epoch_;
  if (decay)
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(group.options().get_lr() * factor);
  last_lr_ = detail::scheduler_group_lrs(*optimizer_);
}

DETTRIAL_INLINE void EpochLRScheduler::advance_each(const std::function<double(std::size_t, double)>& rate) {
  ++step_count_;
  ++last_epoch_;
  set_rates(rate);
}

DETTRIAL_INLINE void EpochLRScheduler::set_rates(const std::function<double(std::size_t, double)>& rate) {
  auto& groups = optimizer_->param_groups();
  if (groups.size() != base_lrs_.size())  // Python's zip(strict=True) refuses it too
    throw TrialError(std::string("dettrial::optim::") + name_ + ": the optimizer has " + std::to_string(groups.size()) +
                     " parameter groups but the scheduler " + std::to_string(base_lrs_.size()) +
                     " (was a group added after the scheduler was made?)");
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(rate(i, groups[i].options().get_lr()));
  last_lr_ = detail::scheduler_group_lrs(*optimizer_);
}

DETTRIAL_INLINE void EpochLRScheduler::invalid(const char* argument, const std::string& rule, const std::string& value) const {
  throw ConfigError(std::string("dettrial::optim::") + name_ + ": " + argument + " must be " + rule + ", not " + value);
}

DETTRIAL_INLINE void EpochLRScheduler::save_common(torch::serialize::OutputArchive& archive) const {
  archive.write("scheduler", c10::IValue(std::string(name_)));
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("step_count", c10::IValue(step_count_));
  archive.write("base_lrs", c10::IValue(base_lrs_));
  archive.write("last_lr", c10::IValue(last_lr_));
}

DETTRIAL_INLINE void EpochLRScheduler::load_common(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, std::string("dettrial::optim::") + name_ + "'s saved state"};
  detail::check_scheduler_type(in, name_);
  // Everything read before anything is changed: a mismatch leaves the scheduler as it was.
  const std::int64_t last_epoch = in.integer("last_epoch");
  const std::int64_t step_count = in.integer("step_count");
  std::vector<double> base_lrs = in.per_group("base_lrs", *optimizer_);
  std::vector<double> last_lr = in.per_group("last_lr", *optimizer_);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base_lrs);
  last_lr_ = std::move(last_lr);
}

DETTRIAL_INLINE void EpochLRScheduler::python_common(c10::impl::GenericDict& out) const {
  out.insert("base_lrs", detail::scheduler_python_list(base_lrs_));
  out.insert("last_epoch", last_epoch_);
  out.insert("verbose", false);  // torch < 2.2 has it
  out.insert("_step_count", step_count_);
  out.insert("_get_lr_called_within_step", false);
  out.insert("_is_initial", false);  // torch >= 2.6 has it
  out.insert("_last_lr", detail::scheduler_python_list(last_lr_));
}

namespace python_state_detail {
/// A number from a Python state dict: Python writes counts as numbers or as 0-dim tensors, flags as bools.
inline double python_number(const c10::IValue& v, const std::string& what) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  throw CheckpointError(what + " is not a number");
}
/// A count from a Python state dict (an int, or a float with no fraction), at least `minimum`.
inline std::int64_t python_count(const c10::IValue& v, const std::string& what, std::int64_t minimum) {
  const double number = python_number(v, what);
  if (!(number >= static_cast<double>(minimum)) || number != std::floor(number) || number > 9.0e18)
    throw CheckpointError(what + " is " + std::to_string(number) + ", not a whole number of at least " + std::to_string(minimum));
  return static_cast<std::int64_t>(number);
}
inline std::vector<double> python_numbers(const c10::IValue& v, const std::string& what) {
  std::vector<double> out;
  if (!v.isList() && !v.isTuple() && !v.isDoubleList()) throw CheckpointError(what + " is not a list");
  const std::vector<c10::IValue> items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  for (const auto& i : items) out.push_back(python_number(i, what));
  return out;
}
}  // namespace python_state_detail

DETTRIAL_INLINE std::map<std::string, c10::IValue> EpochLRScheduler::load_python_common(const c10::impl::GenericDict& in,
                                                                                        std::initializer_list<const char*> own,
                                                                                        const std::string& what) {
  static const std::set<std::string> common = {"base_lrs",    "last_epoch", "verbose", "_step_count", "_get_lr_called_within_step",
                                               "_is_initial", "_last_lr"};
  std::map<std::string, c10::IValue> mine;
  for (const auto& entry : in) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (common.count(key)) continue;
    if (std::find_if(own.begin(), own.end(), [&](const char* k) { return key == k; }) == own.end())
      throw CheckpointError(what + " has '" + key + "', which Python's " + name_ +
                            " does not have: the checkpoint's scheduler is another type than the trial's " + name_);
    mine[key] = entry.value();
  }
  for (const char* k : own)
    if (!mine.count(k)) throw CheckpointError(what + " has no '" + k + "': it is not Python's " + name_ + " state");
  const auto field = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end()) throw CheckpointError(what + " has no '" + key + "': it is not a Python LR scheduler's state");
    return it->value();
  };
  std::vector<double> base = python_state_detail::python_numbers(field("base_lrs"), what + ": base_lrs");
  if (base.size() != optimizer_->param_groups().size())
    throw CheckpointError(what + " has " + std::to_string(base.size()) + " base learning rate(s), but the optimizer " +
                          std::to_string(optimizer_->param_groups().size()) + " group(s)");
  const std::int64_t last_epoch = static_cast<std::int64_t>(python_state_detail::python_number(field("last_epoch"), what + ": last_epoch"));
  const auto step_count = in.find("_step_count");
  std::vector<double> last_lr = base;
  if (const auto it = in.find("_last_lr"); it != in.end()) last_lr = python_state_detail::python_numbers(it->value(), what + ": _last_lr");
  base_lrs_ = std::move(base);
  last_epoch_ = last_epoch;
  step_count_ =
      step_count != in.end() ? static_cast<std::int64_t>(python_state_detail::python_number(step_count->value(), what)) : last_epoch + 1;
  last_lr_ = std::move(last_lr);
  return mine;
}

// ------------------------------------------------------------------------------------------------
// StepLR

DETTRIAL_INLINE StepLR::StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma)
    : EpochLRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1) invalid("step_size", "at least 1", std::to_string(step_size));
  if (!(gamma > 0)) invalid("gamma", "positive", detail::scheduler_number(gamma));
  step();  // Python's constructor steps once: last_epoch 0, no decay
}

DETTRIAL_INLINE void StepLR::step() {
  const std::int64_t epoch = last_epoch_ + 1;
  advance(epoch != 0 && epoch % step_size_ == 0, gamma_);
}

DETTRIAL_INLINE void StepLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("step_size", c10::IValue(step_size_));
  archive.write("gamma", c10::IValue(gamma_));
}

DETTRIAL_INLINE void StepLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::StepLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const std::int64_t step_size = in.integer("step_size");
  const double gamma = in.number("gamma");
  load_common(archive);
  step_size_ = step_size;
  gamma_ = gamma;
}

DETTRIAL_INLINE void StepLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("step_size", step_size_);
  out.insert("gamma", gamma_);
  python_common(out);
}

DETTRIAL_INLINE void StepLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"step_size", "gamma"}, what);
  step_size_ = static_cast<std::int64_t>(python_state_detail::python_number(own["step_size"], what + ": step_size"));
  gamma_ = python_state_detail::python_number(own["gamma"], what + ": gamma");
}

// ------------------------------------------------------------------------------------------------
// MultiStepLR

DETTRIAL_INLINE MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, const std::vector<std::int64_t>& milestones, double gamma)
    : EpochLRScheduler(optimizer, "MultiStepLR"), gamma_(gamma) {
  for (const std::int64_t m : milestones) {
    if (m < 0) invalid("milestones", "at least 0", std::to_string(m));
    ++milestones_[m];
  }
  if (!(gamma > 0)) invalid("gamma", "positive", detail::scheduler_number(gamma));
  step();  // Python's constructor steps once: last_epoch 0 (a decay only if 0 is a milestone)
}

DETTRIAL_INLINE void MultiStepLR::step() {
  const auto it = milestones_.find(last_epoch_ + 1);
  // Python: group["lr"] * gamma ** count (the power first, as Python's float pow computes it).
  advance(it != milestones_.end(), it != milestones_.end() ? std::pow(gamma_, static_cast<double>(it->second)) : 1.0);
}

DETTRIAL_INLINE void MultiStepLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  std::vector<std::int64_t> milestones;  // each as often as it was given
  for (const auto& [m, count] : milestones_) milestones.insert(milestones.end(), static_cast<std::size_t>(count), m);
  archive.write("milestones", c10::IValue(milestones));
  archive.write("gamma", c10::IValue(gamma_));
}

DETTRIAL_INLINE void MultiStepLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::MultiStepLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const std::vector<std::int64_t> milestones = in.integers("milestones");
  const double gamma = in.number("gamma");
  load_common(archive);
  milestones_.clear();
  for (const std::int64_t m : milestones) ++milestones_[m];
  gamma_ = gamma;
}

DETTRIAL_INLINE void MultiStepLR::python_state(c10::impl::GenericDict& out) const {
  // Python's Counter is a dict subclass; a plain dict of the same entries is what its
  // load_state_dict and get_lr need.
  c10::impl::GenericDict milestones(c10::IntType::get(), c10::AnyType::get());
  for (const auto& [m, count] : milestones_) milestones.insert(m, count);
  out.insert("milestones", milestones);
  out.insert("gamma", gamma_);
  python_common(out);
}

DETTRIAL_INLINE void MultiStepLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"milestones", "gamma"}, what);
  if (!own["milestones"].isGenericDict()) throw CheckpointError(what + ": milestones is not a dict (Python's Counter)");
  milestones_.clear();
  for (const auto& m : own["milestones"].toGenericDict())
    milestones_[static_cast<std::int64_t>(python_state_detail::python_number(m.key(), what + ": a milestone"))] =
        static_cast<std::int64_t>(python_state_detail::python_number(m.value(), what + ": a milestone's count"));
  gamma_ = python_state_detail::python_number(own["gamma"], what + ": gamma");
}

// ------------------------------------------------------------------------------------------------
// ExponentialLR

DETTRIAL_INLINE ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma)
    : EpochLRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  if (!(gamma > 0)) invalid("gamma", "positive", detail::scheduler_number(gamma));
  step();  // Python's constructor steps once: last_epoch 0, no decay
}

DETTRIAL_INLINE void ExponentialLR::step() { advance(last_epoch_ + 1 != 0, gamma_); }

DETTRIAL_INLINE void ExponentialLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("gamma", c10::IValue(gamma_));
}

DETTRIAL_INLINE void ExponentialLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::ExponentialLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const double gamma = in.number("gamma");
  load_common(archive);
  gamma_ = gamma;
}

DETTRIAL_INLINE void ExponentialLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("gamma", gamma_);
  python_common(out);
}

DETTRIAL_INLINE void ExponentialLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"gamma"}, what);
  gamma_ = python_state_detail::python_number(own["gamma"], what + ": gamma");
}

// ------------------------------------------------------------------------------------------------
// LinearLR

DETTRIAL_INLINE LinearLR::LinearLR(torch::optim::Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters)
    : EpochLRScheduler(optimizer, "LinearLR"), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  if (!(start_factor > 0 && start_factor <= 1)) invalid("start_factor", "in (0, 1]", detail::scheduler_number(start_factor));
  if (!(end_factor >= 0 && end_factor <= 1)) invalid("end_factor", "in [0, 1]", detail::scheduler_number(end_factor));
  if (total_iters < 0) invalid("total_iters", "at least 0", std::to_string(total_iters));
  step();  // Python's constructor steps once: last_epoch 0, the rates times start_factor
}

DETTRIAL_INLINE void LinearLR::step() {
  advance_each([this](std::size_t, double lr) {
    if (last_epoch_ == 0) return lr * start_factor_;
    if (last_epoch_ > total_iters_) return lr;
    // Python's chainable factor: the ratio of this step's closed-form factor to the last one's.
    const double slope = end_factor_ - start_factor_;
    return lr * (1.0 + slope / (static_cast<double>(total_iters_) * start_factor_ + static_cast<double>(last_epoch_ - 1) * slope));
  });
}

DETTRIAL_INLINE void LinearLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("start_factor", c10::IValue(start_factor_));
  archive.write("end_factor", c10::IValue(end_factor_));
  archive.write("total_iters", c10::IValue(total_iters_));
}

DETTRIAL_INLINE void LinearLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::LinearLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const double start_factor = in.number("start_factor");
  const double end_factor = in.number("end_factor");
  const std::int64_t total_iters = in.integer("total_iters");
  load_common(archive);
  start_factor_ = start_factor;
  end_factor_ = end_factor;
  total_iters_ = total_iters;
}

DETTRIAL_INLINE void LinearLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("start_factor", start_factor_);
  out.insert("end_factor", end_factor_);
  out.insert("total_iters", total_iters_);
  python_common(out);
}

DETTRIAL_INLINE void LinearLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"start_factor", "end_factor", "total_iters"}, what);
  start_factor_ = python_state_detail::python_number(own["start_factor"], what + ": start_factor");
  end_factor_ = python_state_detail::python_number(own["end_factor"], what + ": end_factor");
  total_iters_ = python_state_detail::python_count(own["total_iters"], what + ": total_iters", 0);
}

// ------------------------------------------------------------------------------------------------
// ConstantLR

DETTRIAL_INLINE ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, double factor, std::int64_t total_iters)
    : EpochLRScheduler(optimizer, "ConstantLR"), factor_(factor), total_iters_(total_iters) {
  // Python accepts 0 too, then divides by it at total_iters (a ZeroDivisionError).
  if (!(factor > 0 && factor <= 1)) invalid("factor", "in (0, 1]", detail::scheduler_number(factor));
  if (total_iters < 0) invalid("total_iters", "at least 0", std::to_string(total_iters));
  step();  // Python's constructor steps once: last_epoch 0, the rates times factor
}

DETTRIAL_INLINE void ConstantLR::step() {
  advance_each([this](std::size_t, double lr) {
    if (last_epoch_ == 0) return lr * factor_;
    if (last_epoch_ != total_iters_) return lr;
    return lr * (1.0 / factor_);  // Python's order: the reciprocal first
  });
}

DETTRIAL_INLINE void ConstantLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("factor", c10::IValue(factor_));
  archive.write("total_iters", c10::IValue(total_iters_));
}

DETTRIAL_INLINE void ConstantLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::ConstantLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const double factor = in.number("factor");
  const std::int64_t total_iters = in.integer("total_iters");
  load_common(archive);
  factor_ = factor;
  total_iters_ = total_iters;
}

DETTRIAL_INLINE void ConstantLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("factor", factor_);
  out.insert("total_iters", total_iters_);
  python_common(out);
}

DETTRIAL_INLINE void ConstantLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"factor", "total_iters"}, what);
  factor_ = python_state_detail::python_number(own["factor"], what + ": factor");
  total_iters_ = python_state_detail::python_count(own["total_iters"], what + ": total_iters", 0);
}

// ------------------------------------------------------------------------------------------------
// CosineAnnealingLR

DETTRIAL_INLINE CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, std::int64_t T_max, double eta_min)
    : EpochLRScheduler(optimizer, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
  if (T_max < 1) invalid("T_max", "at least 1", std::to_string(T_max));
  if (!(eta_min >= 0)) invalid("eta_min", "at least 0", detail::scheduler_number(eta_min));
  step();  // Python's constructor steps once: last_epoch 0, the rates as they are
}

DETTRIAL_INLINE void CosineAnnealingLR::step() {
  advance_each([this](std::size_t i, double lr) {
    // Python's _is_initial: only the constructor's step reaches last_epoch 0. (Its branch for a
    // scheduler made with last_epoch > 0 has no counterpart: dettrial's start at -1.)
    if (last_epoch_ == 0) return lr;
    const double pi = std::numbers::pi;  // math.pi, the same double
    const double t_max = static_cast<double>(T_max_);
    // At the bottom of the cosine the ratio below would divide by 1 + cos(pi) = 0: Python adds the
    // first step of the climb back instead.
    if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0) return lr + (base_lrs_[i] - eta_min_) * (1 - std::cos(pi / t_max)) / 2;
    return (1 + std::cos(pi * static_cast<double>(last_epoch_) / t_max)) /
               (1 + std::cos(pi * static_cast<double>(last_epoch_ - 1) / t_max)) * (lr - eta_min_) +
           eta_min_;
  });
}

DETTRIAL_INLINE void CosineAnnealingLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("T_max", c10::IValue(T_max_));
  archive.write("eta_min", c10::IValue(eta_min_));
}

DETTRIAL_INLINE void CosineAnnealingLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::CosineAnnealingLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const std::int64_t T_max = in.integer("T_max");
  const double eta_min = in.number("eta_min");
  if (T_max < 1) throw CheckpointError(in.owner + " has T_max " + std::to_string(T_max) + ", not at least 1");
  load_common(archive);
  T_max_ = T_max;
  eta_min_ = eta_min;
}

DETTRIAL_INLINE void CosineAnnealingLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("T_max", T_max_);
  out.insert("eta_min", eta_min_);
  python_common(out);
}

DETTRIAL_INLINE void CosineAnnealingLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"T_max", "eta_min"}, what);
  T_max_ = python_state_detail::python_count(own["T_max"], what + ": T_max", 1);
  eta_min_ = python_state_detail::python_number(own["eta_min"], what + ": eta_min");
}

// ------------------------------------------------------------------------------------------------
// LambdaLR and MultiplicativeLR

DETTRIAL_INLINE std::vector<LRLambda> LambdaScheduler::one_per_group(LRLambda lr_lambda, const torch::optim::Optimizer& optimizer) {
  if (!lr_lambda) return std::vector<LRLambda>(optimizer.param_groups().size());  // refused by the constructor
  auto shared = std::make_shared<LRLambda>(std::move(lr_lambda));
  return std::vector<LRLambda>(optimizer.param_groups().size(), [shared](std::int64_t epoch) { return (*shared)(epoch); });
}

DETTRIAL_INLINE LambdaScheduler::LambdaScheduler(torch::optim::Optimizer& optimizer, const char* name, std::vector<LRLambda> lr_lambdas)
    : EpochLRScheduler(optimizer, name), lr_lambdas_(std::move(lr_lambdas)) {
  const std::size_t groups = optimizer.param_groups().size();
  if (lr_lambdas_.size() != groups)
    invalid("lr_lambda", "one function per parameter group (" + std::to_string(groups) + ")",
            std::to_string(lr_lambdas_.size()) + " functions");
  for (const LRLambda& f : lr_lambdas_)
    if (!f) invalid("lr_lambda", "a function", "an empty std::function");
}

DETTRIAL_INLINE void LambdaScheduler::python_state(c10::impl::GenericDict& out) const {
  python_common(out);
  // Python saves None for a plain function (and a callable object's attributes, which no C++
  // function has).
  c10::impl::GenericList none_each(c10::AnyType::get());
  for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) none_each.push_back(c10::IValue());
  out.insert("lr_lambdas", none_each);
}

DETTRIAL_INLINE void LambdaScheduler::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  const auto it = in.find("lr_lambdas");
  if (it != in.end()) {  // checked before anything is changed
    const c10::IValue& saved = it->value();
    if (!saved.isList() || saved.toListRef().size() != lr_lambdas_.size())
      throw CheckpointError(what + ": lr_lambdas is not a list of " + std::to_string(lr_lambdas_.size()) +
                            " entries (one per parameter group)");
    for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) {
      const c10::IValue& fn = saved.toListRef()[i];
      if (!fn.isNone() && !(fn.isGenericDict() && fn.toGenericDict().empty()))
        throw CheckpointError(what + ": lr_lambdas[" + std::to_string(i) +
                              "] holds the attributes of a Python callable object, which a C++ function cannot take");
    }
  }
  load_python_common(in, {"lr_lambdas"}, what);
}

DETTRIAL_INLINE LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, LRLambda lr_lambda)
    : LambdaLR(optimizer, one_per_group(std::move(lr_lambda), optimizer)) {}

DETTRIAL_INLINE LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LRLambda> lr_lambdas)
    : LambdaScheduler(optimizer, "LambdaLR", std::move(lr_lambdas)) {
  step();  // Python's constructor steps once: last_epoch 0, the rates times lr_lambda(0)
}

DETTRIAL_INLINE void LambdaLR::step() {
  advance_each([this](std::size_t i, double) { return base_lrs_[i] * lr_lambdas_[i](last_epoch_); });
}

DETTRIAL_INLINE MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, LRLambda lr_lambda)
    : MultiplicativeLR(optimizer, one_per_group(std::move(lr_lambda), optimizer)) {}

DETTRIAL_INLINE MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<LRLambda> lr_lambdas)
    : LambdaScheduler(optimizer, "MultiplicativeLR", std::move(lr_lambdas)) {
  step();  // Python's constructor steps once: last_epoch 0, the rates as they are
}

DETTRIAL_INLINE void MultiplicativeLR::step() {
  // Python's _is_initial: only the constructor's step reaches last_epoch 0, and calls no function.
  advance_each([this](std::size_t i, double lr) { return last_epoch_ == 0 ? lr : lr * lr_lambdas_[i](last_epoch_); });
}

// ------------------------------------------------------------------------------------------------
// PolynomialLR

DETTRIAL_INLINE PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters, double power)
    : EpochLRScheduler(optimizer, "PolynomialLR"), total_iters_(total_iters), power_(power) {
  if (total_iters < 0) invalid("total_iters", "at least 0", std::to_string(total_iters));
  // Python accepts a negative power, then divides by zero at total_iters.
  if (!(power >= 0)) invalid("power", "at least 0", detail::scheduler_number(power));
  step();  // Python's constructor steps once: last_epoch 0, the rates as they are
}

DETTRIAL_INLINE void PolynomialLR::step() {
  advance_each([this](std::size_t, double lr) {
    // Python's _is_initial: only the constructor's step reaches last_epoch 0.
    if (last_epoch_ == 0 || last_epoch_ > total_iters_) return lr;
    const double total = static_cast<double>(total_iters_);
    const double decay_factor =
        std::pow((1.0 - static_cast<double>(last_epoch_) / total) / (1.0 - static_cast<double>(last_epoch_ - 1) / total), power_);
    return lr * decay_factor;
  });
}

DETTRIAL_INLINE void PolynomialLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("total_iters", c10::IValue(total_iters_));
  archive.write("power", c10::IValue(power_));
}

DETTRIAL_INLINE void PolynomialLR::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::PolynomialLR's saved state"};
  detail::check_scheduler_type(in, name_);
  const std::int64_t total_iters = in.integer("total_iters");
  const double power = in.number("power");
  load_common(archive);
  total_iters_ = total_iters;
  power_ = power;
}

DETTRIAL_INLINE void PolynomialLR::python_state(c10::impl::GenericDict& out) const {
  out.insert("total_iters", total_iters_);
  out.insert("power", power_);
  python_common(out);
}

DETTRIAL_INLINE void PolynomialLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"total_iters", "power"}, what);
  total_iters_ = python_state_detail::python_count(own["total_iters"], what + ": total_iters", 0);
  power_ = python_state_detail::python_number(own["power"], what + ": power");
}

// ------------------------------------------------------------------------------------------------
// CosineAnnealingWarmRestarts

DETTRIAL_INLINE CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, std::int64_t T_0,
                                                                         std::int64_t T_mult, double eta_min)
    : EpochLRScheduler(optimizer, "CosineAnnealingWarmRestarts"), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), eta_min_(eta_min) {
  if (T_0 < 1) invalid("T_0", "at least 1", std::to_string(T_0));
  if (T_mult < 1) invalid("T_mult", "at least 1", std::to_string(T_mult));
  if (!(eta_min >= 0)) invalid("eta_min", "at least 0", detail::scheduler_number(eta_min));
  step();  // Python's constructor steps once: last_epoch 0, T_cur 0
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::step() {
  // Python's own step(), which counts no step (_step_count stays 0).
  if (last_epoch_ < 0) {  // the constructor's: Python's step(epoch=0)
    T_i_ = T_0_;
    T_cur_ = 0;
    last_epoch_ = 0;
  } else {
    ++last_epoch_;
    ++T_cur_;
    if (T_cur_ >= T_i_) {  // a restart
      T_cur_ %= T_i_;
      T_i_ *= T_mult_;
    }
  }
  set_rates([this](std::size_t i, double) {
    const double pi = std::numbers::pi;  // math.pi, the same double
    return eta_min_ + (base_lrs_[i] - eta_min_) * (1 + std::cos(pi * static_cast<double>(T_cur_) / static_cast<double>(T_i_))) / 2;
  });
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  archive.write("T_0", c10::IValue(T_0_));
  archive.write("T_i", c10::IValue(T_i_));
  archive.write("T_mult", c10::IValue(T_mult_));
  archive.write("eta_min", c10::IValue(eta_min_));
  archive.write("T_cur", c10::IValue(T_cur_));
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::load(torch::serialize::InputArchive& archive) {
  const detail::SchedulerArchive in{archive, "dettrial::optim::CosineAnnealingWarmRestarts's saved state"};
  detail::check_scheduler_type(in, name_);
  const std::int64_t T_0 = in.integer("T_0");
  const std::int64_t T_i = in.integer("T_i");
  const std::int64_t T_mult = in.integer("T_mult");
  const double eta_min = in.number("eta_min");
  const std::int64_t T_cur = in.integer("T_cur");
  if (T_0 < 1 || T_i < 1 || T_mult < 1 || T_cur < 0)
    throw CheckpointError(in.owner + " has T_0 " + std::to_string(T_0) + ", T_i " + std::to_string(T_i) + ", T_mult " +
                          std::to_string(T_mult) + " and T_cur " + std::to_string(T_cur) +
                          ": expected T_0, T_i and T_mult at least 1, T_cur at least 0");
  load_common(archive);
  T_0_ = T_0;
  T_i_ = T_i;
  T_mult_ = T_mult;
  eta_min_ = eta_min;
  T_cur_ = T_cur;
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::python_state(c10::impl::GenericDict& out) const {
  out.insert("T_0", T_0_);
  out.insert("T_i", T_i_);
  out.insert("T_mult", T_mult_);
  out.insert("eta_min", eta_min_);
  out.insert("T_cur", T_cur_);
  python_common(out);
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  auto own = load_python_common(in, {"T_0", "T_i", "T_mult", "eta_min", "T_cur"}, what);
  namespace pd = python_state_detail;
  T_0_ = pd::python_count(own["T_0"], what + ": T_0", 1);
  T_i_ = pd::python_count(own["T_i"], what + ": T_i", 1);
  T_mult_ = pd::python_count(own["T_mult"], what + ": T_mult", 1);
  eta_min_ = pd::python_number(own["eta_min"], what + ": eta_min");
  // A fraction here comes from Python's step(epoch) with a fractional epoch, which dettrial does not do.
  T_cur_ = pd::python_count(own["T_cur"], what + ": T_cur", 0);
}

// ------------------------------------------------------------------------------------------------
// ReduceLROnPlateau

DETTRIAL_INLINE ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(&optimizer), options_(std::move(options)) {
  const auto invalid = [](const char* argument, const std::string& rule, const std::string& value) {
    throw ConfigError(std::string("dettrial::optim::ReduceLROnPlateau: ") + argument + " must be " + rule + ", not " + value);
  };
  const auto& o = options_;
  if (o.mode != "min" && o.mode != "max") invalid("mode", "\"min\" or \"max\"", '"' + o.mode + '"');
  if (!(o.factor >= 0 && o.factor < 1)) invalid("factor", "in [0, 1)", dettrial::detail::scheduler_number(o.factor));
  if (o.patience < 0) invalid("patience", "at least 0", std::to_string(o.patience));
  if (!(o.threshold >= 0)) invalid("threshold", "at least 0", dettrial::detail::scheduler_number(o.threshold));
  if (o.threshold_mode != "rel" && o.threshold_mode != "abs") invalid("threshold_mode", "\"rel\" or \"abs\"", '"' + o.threshold_mode + '"');
  if (o.cooldown < 0) invalid("cooldown", "at least 0", std::to_string(o.cooldown));
  if (!(o.eps >= 0)) invalid("eps", "at least 0", dettrial::detail::scheduler_number(o.eps));
  const std::size_t groups = optimizer.param_groups().size();
  if (const auto* per_group = std::get_if<std::vector<double>>(&o.min_lr)) {
    if (per_group->size() != groups)
      invalid("min_lr", "one value per parameter group (" + std::to_string(groups) + ")", std::to_string(per_group->size()) + " values");
    min_lrs_ = *per_group;
  } else {
    min_lrs_.assign(groups, std::get<double>(o.min_lr));
  }
  for (const double m : min_lrs_)
    if (!(m >= 0)) invalid("min_lr", "at least 0", dettrial::detail::scheduler_number(m));
  min_mode_ = o.mode == "min";
  rel_threshold_ = o.threshold_mode == "rel";
  last_lr_ = dettrial::detail::scheduler_group_lrs(optimizer);
  best_ = mode_worse();
}

DETTRIAL_INLINE double ReduceLROnPlateau::mode_worse() const {
  return min_mode_ ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

DETTRIAL_INLINE bool ReduceLROnPlateau::is_better(double a, double best) const {
  // Python's _is_better, term for term.
  if (min_mode_ && rel_threshold_) return a < best * (1. - options_.threshold);
  if (min_mode_) return a < best - options_.threshold;
  if (rel_threshold_) return a > best * (options_.threshold + 1.);
  return a > best + options_.threshold;
}

DETTRIAL_INLINE void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown are not counted
  }
  if (num_bad_epochs_ > options_.patience) {
    reduce_lr();
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = dettrial::detail::scheduler_group_lrs(*optimizer_);
}

DETTRIAL_INLINE void ReduceLROnPlateau::reduce_lr() {
  auto& groups = optimizer_->param_groups();
  if (groups.size() != min_lrs_.size()) {
    // Python: a group added since construction gets the one min_lr, or it is an error.
    if (!std::holds_alternative<double>(options_.min_lr))
      throw TrialError("dettrial::optim::ReduceLROnPlateau: the optimizer has " + std::to_string(groups.size()) +
                       " parameter groups but min_lr has " + std::to_string(min_lrs_.size()) +
                       " values (was a group added after the scheduler was made?)");
    min_lrs_.assign(groups.size(), std::get<double>(options_.min_lr));
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double old_lr = groups[i].options().get_lr();
    const double new_lr = std::max(old_lr * options_.factor, min_lrs_[i]);
    if (old_lr - new_lr > options_.eps) groups[i].options().set_lr(new_lr);
  }
}

DETTRIAL_INLINE void ReduceLROnPlateau::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scheduler", c10::IValue(std::string("ReduceLROnPlateau")));
  archive.write("mode", c10::IValue(options_.mode));
  archive.write("factor", c10::IValue(options_.factor));
  archive.write("patience", c10::IValue(options_.patience));
  archive.write("threshold", c10::IValue(options_.threshold));
  archive.write("threshold_mode", c10::IValue(options_.threshold_mode));
  archive.write("cooldown", c10::IValue(options_.cooldown));
  // The one min_lr, when there is one (Python's default_min_lr), and the per-group values.
  if (const auto* one = std::get_if<double>(&options_.min_lr)) archive.write("default_min_lr", c10::IValue(*one));
  archive.write("min_lrs", c10::IValue(min_lrs_));
  archive.write("eps", c10::IValue(options_.eps));
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("last_lr", c10::IValue(last_lr_));
  archive.write("best", c10::IValue(best_));
  archive.write("num_bad_epochs", c10::IValue(num_bad_epochs_));
  archive.write("cooldown_counter", c10::IValue(cooldown_counter_));
}

DETTRIAL_INLINE void ReduceLROnPlateau::load(torch::serialize::InputArchive& archive) {
  const dettrial::detail::SchedulerArchive in{archive, "dettrial::optim::ReduceLROnPlateau's saved state"};
  dettrial::detail::check_scheduler_type(in, "ReduceLROnPlateau");
  // Everything read and checked before anything is changed.
  ReduceLROnPlateauOptions options;
  options.mode = in.text("mode");
  options.factor = in.number("factor");
  options.patience = in.integer("patience");
  options.threshold = in.number("threshold");
  options.threshold_mode = in.text("threshold_mode");
  options.cooldown = in.integer("cooldown");
  options.eps = in.number("eps");
  if ((options.mode != "min" && options.mode != "max") || (options.threshold_mode != "rel" && options.threshold_mode != "abs"))
    throw CheckpointError(in.owner + " has mode '" + options.mode + "' and threshold_mode '" + options.threshold_mode +
                          "': expected min or max, and rel or abs");
  std::vector<double> min_lrs = in.per_group("min_lrs", *optimizer_);
  c10::IValue default_min_lr;
  if (archive.try_read("default_min_lr", default_min_lr) && default_min_lr.isDouble()) options.min_lr = default_min_lr.toDouble();
  else options.min_lr = min_lrs;
  const std::int64_t last_epoch = in.integer("last_epoch");
  std::vector<double> last_lr = in.per_group("last_lr", *optimizer_);
  const double best = in.number("best");
  const std::int64_t num_bad_epochs = in.integer("num_bad_epochs");
  const std::int64_t cooldown_counter = in.integer("cooldown_counter");

  options_ = std::move(options);
  min_mode_ = options_.mode == "min";
  rel_threshold_ = options_.threshold_mode == "rel";
  min_lrs_ = std::move(min_lrs);
  last_epoch_ = last_epoch;
  last_lr_ = std::move(last_lr);
  best_ = best;
  num_bad_epochs_ = num_bad_epochs;
  cooldown_counter_ = cooldown_counter;
}

DETTRIAL_INLINE void ReduceLROnPlateau::python_state(c10::impl::GenericDict& out) const {
  out.insert("factor", options_.factor);
  // None when min_lr was given per group (Python's default_min_lr).
  if (const auto* one = std::get_if<double>(&options_.min_lr)) out.insert("default_min_lr", *one);
  else out.insert("default_min_lr", c10::IValue());
  out.insert("min_lrs", dettrial::detail::scheduler_python_list(min_lrs_));
  out.insert("patience", options_.patience);
  out.insert("cooldown", options_.cooldown);
  out.insert("eps", options_.eps);
  out.insert("verbose", false);  // torch < 2.2 has it
  out.insert("last_epoch", last_epoch_);
  out.insert("_last_lr", dettrial::detail::scheduler_python_list(last_lr_));
  out.insert("mode_worse", mode_worse());
  out.insert("mode", options_.mode);
  out.insert("threshold", options_.threshold);
  out.insert("threshold_mode", options_.threshold_mode);
  out.insert("best", best_);
  out.insert("cooldown_counter", cooldown_counter_);
  out.insert("num_bad_epochs", num_bad_epochs_);
}

DETTRIAL_INLINE void ReduceLROnPlateau::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  namespace pd = python_state_detail;
  static const std::set<std::string> known = {
      "factor",   "default_min_lr", "min_lrs", "patience",  "cooldown",       "eps",  "verbose",          "last_epoch",
      "_last_lr", "mode_worse",     "mode",    "threshold", "threshold_mode", "best", "cooldown_counter", "num_bad_epochs"};
  for (const auto& entry : in) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (!known.count(key))
      throw CheckpointError(
          what + " has '" + key +
          "', which Python's ReduceLROnPlateau does not have: the checkpoint's scheduler is another type than the trial's");
  }
  const auto field = [&](const char* key) {
    const auto it = in.find(key);
    if (it == in.end()) throw CheckpointError(what + " has no '" + key + "': it is not Python's ReduceLROnPlateau state");
    return it->value();
  };
  const auto text = [&](const char* key) {
    const c10::IValue v = field(key);
    if (!v.isString()) throw CheckpointError(what + ": " + key + " is not a string");
    return v.toStringRef();
  };
  ReduceLROnPlateauOptions o = options_;
  o.mode = text("mode");
  o.threshold_mode = text("threshold_mode");
  o.factor = pd::python_number(field("factor"), what + ": factor");
  o.patience = static_cast<std::int64_t>(pd::python_number(field("patience"), what + ": patience"));
  o.cooldown = static_cast<std::int64_t>(pd::python_number(field("cooldown"), what + ": cooldown"));
  o.threshold = pd::python_number(field("threshold"), what + ": threshold");
  o.eps = pd::python_number(field("eps"), what + ": eps");
  std::vector<double> min_lrs = pd::python_numbers(field("min_lrs"), what + ": min_lrs");
  if (min_lrs.size() != optimizer_->param_groups().size())
    throw CheckpointError(what + " has " + std::to_string(min_lrs.size()) + " min_lrs, but the optimizer " +
                          std::to_string(optimizer_->param_groups().size()) + " group(s)");
  o.min_lr = min_lrs;
  std::optional<ReduceLROnPlateau> checked;
  try {
    checked.emplace(*optimizer_, o);  // the constructor's checks, on the file's options
  } catch (const ConfigError& e) {
    throw CheckpointError(what + ": " + e.what());
  }
  options_ = std::move(o);
  min_mode_ = checked->min_mode_;
  rel_threshold_ = checked->rel_threshold_;
  min_lrs_ = std::move(min_lrs);
  last_epoch_ = static_cast<std::int64_t>(pd::python_number(field("last_epoch"), what + ": last_epoch"));
  if (const auto it = in.find("_last_lr"); it != in.end()) last_lr_ = pd::python_numbers(it->value(), what + ": _last_lr");
  best_ = pd::python_number(field("best"), what + ": best");
  cooldown_counter_ = static_cast<std::int64_t>(pd::python_number(field("cooldown_counter"), what + ": cooldown_counter"));
  num_bad_epochs_ = static_cast<std::int64_t>(pd::python_number(field("num_bad_epochs"), what + ": num_bad_epochs"));
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
