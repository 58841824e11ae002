// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Learning-rate schedulers with PyTorch's (Python's) semantics, exact resume, and Python's
/// `scheduler.state_dict()` layout: StepLR, MultiStepLR, ExponentialLR, LinearLR, ConstantLR,
/// CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR and CosineAnnealingWarmRestarts here;
/// OneCycleLR and CyclicLR (cyclic_schedulers.hpp), SequentialLR and ChainedScheduler
/// (scheduler_composition.hpp) and ReduceLROnPlateau (reduce_lr_on_plateau.hpp) come with it.
///
/// LibTorch's own `torch::optim::StepLR` decays one step later than Python's (it does not count the
/// step Python's constructor takes), so a schedule ported from Python drifts by one step. These follow
/// Python's `torch.optim.lr_scheduler` to the bit: after k `step()` calls the learning rates are
/// Python's after k calls, computed as Python's `step()` computes them (its chainable, step-to-step
/// `get_lr`, not the closed form that `step(epoch)` uses), in Python's order of float operations.
///
/// Each scheduler also has `restart_at_milestone()`: Python's `_update_lr(0)`, which SequentialLR
/// calls when a milestone hands the rates to it (the closed form at step 0 where Python's class has
/// one, else its `get_lr` at step 0).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "cyclic_schedulers.hpp"
#include "reduce_lr_on_plateau.hpp"
#include "scheduler_base.hpp"
#include "scheduler_composition.hpp"

namespace dettrial::optim {

/// Python's `StepLR(optimizer, step_size, gamma=0.1)`: multiplies each group's learning rate by
/// `gamma` on every `step_size`-th step.
class StepLR : public EpochLRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);
  void step();
  void restart_at_milestone();
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
  static constexpr std::array<SchedulerField<StepLR>, 2> fields() {
    return std::array{field("step_size", &StepLR::step_size_, 1), field("gamma", &StepLR::gamma_)};
  }
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
  void restart_at_milestone();
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
  void restart_at_milestone();
  double gamma() const { return gamma_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: gamma and the LRScheduler entries as StepLR's.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's ExponentialLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  static constexpr std::array<SchedulerField<ExponentialLR>, 1> fields() { return std::array{field("gamma", &ExponentialLR::gamma_)}; }
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
  void restart_at_milestone();
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
  static constexpr std::array<SchedulerField<LinearLR>, 3> fields() {
    return std::array{field("start_factor", &LinearLR::start_factor_), field("end_factor", &LinearLR::end_factor_),
                      field("total_iters", &LinearLR::total_iters_, 0)};
  }
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
  void restart_at_milestone();
  double factor() const { return factor_; }
  std::int64_t total_iters() const { return total_iters_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: factor, total_iters and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's ConstantLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  static constexpr std::array<SchedulerField<ConstantLR>, 2> fields() {
    return std::array{field("factor", &ConstantLR::factor_), field("total_iters", &ConstantLR::total_iters_, 0)};
  }
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
  void restart_at_milestone();
  std::int64_t T_max() const { return T_max_; }
  double eta_min() const { return eta_min_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: T_max, eta_min and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's CosineAnnealingLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  static constexpr std::array<SchedulerField<CosineAnnealingLR>, 2> fields() {
    return std::array{field("T_max", &CosineAnnealingLR::T_max_, 1), field("eta_min", &CosineAnnealingLR::eta_min_)};
  }
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
  void restart_at_milestone();
};

/// Python's `MultiplicativeLR(optimizer, lr_lambda)`: each step multiplies each group's rate by
/// `lr_lambda(last_epoch)` (one function for all groups, or one per group); the constructor's step
/// leaves the rates as they are.
class MultiplicativeLR : public LambdaScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, LRLambda lr_lambda);
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<LRLambda> lr_lambdas);
  void step();
  void restart_at_milestone();
};

/// Python's `PolynomialLR(optimizer, total_iters=5, power=1.0)`: the rates decay as
/// `(1 - last_epoch / total_iters) ** power` times the initial ones, by Python's step-to-step factors,
/// reaching 0 at `total_iters` and staying there.
class PolynomialLR : public EpochLRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters = 5, double power = 1.0);
  void step();
  void restart_at_milestone();
  std::int64_t total_iters() const { return total_iters_; }
  double power() const { return power_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: total_iters, power and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  /// Restores what Python's PolynomialLR.state_dict() (or python_state) holds.
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  static constexpr std::array<SchedulerField<PolynomialLR>, 2> fields() {
    return std::array{field("total_iters", &PolynomialLR::total_iters_, 0), field("power", &PolynomialLR::power_)};
  }
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
  void restart_at_milestone();
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
  /// Restores what Python's CosineAnnealingWarmRestarts.state_dict() (or python_state) holds. (A
  /// fractional T_cur, from Python's step(epoch) with a fractional epoch, which dettrial does not do,
  /// is refused.)
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);

 private:
  using Self = CosineAnnealingWarmRestarts;
  static constexpr std::array<SchedulerField<CosineAnnealingWarmRestarts>, 5> fields() {
    return std::array{field("T_0", &Self::T_0_, 1), field("T_i", &Self::T_i_, 1), field("T_mult", &Self::T_mult_, 1),
                      field("eta_min", &Self::eta_min_), field("T_cur", &Self::T_cur_, 0)};
  }
  /// Python's get_lr: the cosine at T_cur of T_i.
  void set_cosine_rates();
  std::int64_t T_0_;
  std::int64_t T_i_;
  std::int64_t T_mult_;
  double eta_min_;
  std::int64_t T_cur_ = -1;  // Python's T_cur starts at last_epoch
};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <utility>

#include "../error.hpp"

namespace dettrial::detail::schedulers {
using detail::number_text;
}  // namespace dettrial::detail::schedulers

namespace dettrial::optim {
// ------------------------------------------------------------------------------------------------
// StepLR

DETTRIAL_INLINE StepLR::StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma)
    : EpochLRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1) invalid("step_size", "at least 1", std::to_string(step_size));
  if (!(gamma > 0)) invalid("gamma", "positive", detail::schedulers::number_text(gamma));
  step();  // Python's constructor steps once: last_epoch 0, no decay
}

DETTRIAL_INLINE void StepLR::step() {
  const std::int64_t epoch = last_epoch_ + 1;
  advance(epoch != 0 && epoch % step_size_ == 0, gamma_);
}

DETTRIAL_INLINE void StepLR::restart_at_milestone() {
  // Python's closed form at 0: base_lr * gamma ** (0 // step_size).
  restart_with([this](std::size_t i, double) { return base_lrs_[i] * std::pow(gamma_, 0.0); });
}

// ------------------------------------------------------------------------------------------------
// MultiStepLR

DETTRIAL_INLINE MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, const std::vector<std::int64_t>& milestones, double gamma)
    : EpochLRScheduler(optimizer, "MultiStepLR"), gamma_(gamma) {
  for (const std::int64_t m : milestones) {
    if (m < 0) invalid("milestones", "at least 0", std::to_string(m));
    ++milestones_[m];
  }
  if (!(gamma > 0)) invalid("gamma", "positive", detail::schedulers::number_text(gamma));
  step();  // Python's constructor steps once: last_epoch 0 (a decay only if 0 is a milestone)
}

DETTRIAL_INLINE void MultiStepLR::step() {
  const auto it = milestones_.find(last_epoch_ + 1);
  // Python: group["lr"] * gamma ** count (the power first, as Python's float pow computes it).
  advance(it != milestones_.end(), it != milestones_.end() ? std::pow(gamma_, static_cast<double>(it->second)) : 1.0);
}

DETTRIAL_INLINE void MultiStepLR::restart_at_milestone() {
  // Python's closed form at 0: base_lr * gamma ** bisect_right(sorted milestones, 0).
  const auto at_zero = milestones_.find(0);
  const double passed = at_zero == milestones_.end() ? 0.0 : static_cast<double>(at_zero->second);
  restart_with([this, passed](std::size_t i, double) { return base_lrs_[i] * std::pow(gamma_, passed); });
}

DETTRIAL_INLINE void MultiStepLR::save(torch::serialize::OutputArchive& archive) const {
  save_common(archive);
  std::vector<std::int64_t> milestones;  // each as often as it was given
  for (const auto& [m, count] : milestones_) milestones.insert(milestones.end(), static_cast<std::size_t>(count), m);
  archive.write("milestones", c10::IValue(milestones));
  archive.write("gamma", c10::IValue(gamma_));
}

DETTRIAL_INLINE void MultiStepLR::load(torch::serialize::InputArchive& archive) {
  const c10::IValue milestones = archived(archive, "milestones");
  if (!milestones.isIntList()) throw CheckpointError(archive_owner() + ": 'milestones' is not a list of integers");
  const double gamma = python::number(archived(archive, "gamma"), archive_owner() + ": 'gamma'");
  load_common(archive);
  milestones_.clear();
  for (const std::int64_t m : milestones.toIntVector()) ++milestones_[m];
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
  const auto saved = in.find("milestones");
  if (saved != in.end() && !saved->value().isGenericDict()) throw CheckpointError(what + ": milestones is not a dict (Python's Counter)");
  std::map<std::int64_t, std::int64_t> milestones;  // read before anything is changed
  if (saved != in.end())
    for (const auto& m : saved->value().toGenericDict())
      milestones[python::count(m.key(), what + ": a milestone", 0)] = python::count(m.value(), what + ": a milestone's count", 1);
  const auto gamma = in.find("gamma");
  const double new_gamma = gamma != in.end() ? python::number(gamma->value(), what + ": gamma") : gamma_;
  load_python_common(in, {"milestones", "gamma"}, what);
  milestones_ = std::move(milestones);
  gamma_ = new_gamma;
}

// ------------------------------------------------------------------------------------------------
// ExponentialLR

DETTRIAL_INLINE ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma)
    : EpochLRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  if (!(gamma > 0)) invalid("gamma", "positive", detail::schedulers::number_text(gamma));
  step();  // Python's constructor steps once: last_epoch 0, no decay
}

DETTRIAL_INLINE void ExponentialLR::step() { advance(last_epoch_ + 1 != 0, gamma_); }

DETTRIAL_INLINE void ExponentialLR::restart_at_milestone() {
  restart_with([this](std::size_t i, double) { return base_lrs_[i] * std::pow(gamma_, 0.0); });  // base_lr * gamma ** 0
}

// ------------------------------------------------------------------------------------------------
// LinearLR

DETTRIAL_INLINE LinearLR::LinearLR(torch::optim::Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters)
    : EpochLRScheduler(optimizer, "LinearLR"), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  if (!(start_factor > 0 && start_factor <= 1)) invalid("start_factor", "in (0, 1]", detail::schedulers::number_text(start_factor));
  if (!(end_factor >= 0 && end_factor <= 1)) invalid("end_factor", "in [0, 1]", detail::schedulers::number_text(end_factor));
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

DETTRIAL_INLINE void LinearLR::restart_at_milestone() {
  // Python divides by total_iters here: with 0 it raises ZeroDivisionError.
  if (total_iters_ == 0) throw TrialError("dettrial::optim::LinearLR: total_iters 0 cannot follow a SequentialLR milestone");
  // Python's closed form at 0: base_lr * (start + (end - start) * min(total_iters, 0) / total_iters).
  const double factor = start_factor_ + (end_factor_ - start_factor_) * 0.0 / static_cast<double>(total_iters_);
  restart_with([this, factor](std::size_t i, double) { return base_lrs_[i] * factor; });
}

// ------------------------------------------------------------------------------------------------
// ConstantLR

DETTRIAL_INLINE ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, double factor, std::int64_t total_iters)
    : EpochLRScheduler(optimizer, "ConstantLR"), factor_(factor), total_iters_(total_iters) {
  // Python accepts 0 too, then divides by it at total_iters (a ZeroDivisionError).
  if (!(factor > 0 && factor <= 1)) invalid("factor", "in (0, 1]", detail::schedulers::number_text(factor));
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

DETTRIAL_INLINE void ConstantLR::restart_at_milestone() {
  // Python's closed form at 0: base_lr * (factor + (0 >= total_iters) * (1 - factor)).
  const double factor = factor_ + (total_iters_ <= 0 ? 1.0 - factor_ : 0.0);
  restart_with([this, factor](std::size_t i, double) { return base_lrs_[i] * factor; });
}

// ------------------------------------------------------------------------------------------------
// CosineAnnealingLR

DETTRIAL_INLINE CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, std::int64_t T_max, double eta_min)
    : EpochLRScheduler(optimizer, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
  if (T_max < 1) invalid("T_max", "at least 1", std::to_string(T_max));
  if (!(eta_min >= 0)) invalid("eta_min", "at least 0", detail::schedulers::number_text(eta_min));
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

DETTRIAL_INLINE void CosineAnnealingLR::restart_at_milestone() {
  // Python's closed form at 0: eta_min + (base_lr - eta_min) * (1 + cos(pi * 0 / T_max)) / 2.
  const double cosine = 1 + std::cos(std::numbers::pi * 0.0 / static_cast<double>(T_max_));
  restart_with([this, cosine](std::size_t i, double) { return eta_min_ + (base_lrs_[i] - eta_min_) * cosine / 2; });
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
    // Named, not a temporary: GCC 13 warns of a reference into a temporary view as dangling.
    const c10::ArrayRef<c10::IValue> fns = saved.toListRef();
    for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) {
      const c10::IValue& fn = fns[i];
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

DETTRIAL_INLINE void LambdaLR::restart_at_milestone() {
  restart_with([this](std::size_t i, double) { return base_lrs_[i] * lr_lambdas_[i](0); });  // Python's get_lr at 0
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

DETTRIAL_INLINE void MultiplicativeLR::restart_at_milestone() {
  // Python's get_lr at 0, not in its initial step: the current rates times lr_lambda(0).
  restart_with([this](std::size_t i, double lr) { return lr * lr_lambdas_[i](0); });
}

// ------------------------------------------------------------------------------------------------
// PolynomialLR

DETTRIAL_INLINE PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters, double power)
    : EpochLRScheduler(optimizer, "PolynomialLR"), total_iters_(total_iters), power_(power) {
  if (total_iters < 0) invalid("total_iters", "at least 0", std::to_string(total_iters));
  // Python accepts a negative power, then divides by zero at total_iters.
  if (!(power >= 0)) invalid("power", "at least 0", detail::schedulers::number_text(power));
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

DETTRIAL_INLINE void PolynomialLR::restart_at_milestone() {
  // Python divides by total_iters here: with 0 it raises ZeroDivisionError.
  if (total_iters_ == 0) throw TrialError("dettrial::optim::PolynomialLR: total_iters 0 cannot follow a SequentialLR milestone");
  // Python's closed form at 0: base_lr * (1.0 - min(total_iters, 0) / total_iters) ** power.
  const double factor = std::pow(1.0 - 0.0 / static_cast<double>(total_iters_), power_);
  restart_with([this, factor](std::size_t i, double) { return base_lrs_[i] * factor; });
}

// ------------------------------------------------------------------------------------------------
// CosineAnnealingWarmRestarts

DETTRIAL_INLINE CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, std::int64_t T_0,
                                                                         std::int64_t T_mult, double eta_min)
    : EpochLRScheduler(optimizer, "CosineAnnealingWarmRestarts"), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), eta_min_(eta_min) {
  if (T_0 < 1) invalid("T_0", "at least 1", std::to_string(T_0));
  if (T_mult < 1) invalid("T_mult", "at least 1", std::to_string(T_mult));
  if (!(eta_min >= 0)) invalid("eta_min", "at least 0", detail::schedulers::number_text(eta_min));
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
  set_cosine_rates();
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::restart_at_milestone() {
  last_epoch_ = 0;  // Python's _update_lr(0) moves last_epoch only: get_lr reads T_cur and T_i as they are
  set_cosine_rates();
}

DETTRIAL_INLINE void CosineAnnealingWarmRestarts::set_cosine_rates() {
  set_rates([this](std::size_t i, double) {
    const double pi = std::numbers::pi;  // math.pi, the same double
    return eta_min_ + (base_lrs_[i] - eta_min_) * (1 + std::cos(pi * static_cast<double>(T_cur_) / static_cast<double>(T_i_))) / 2;
  });
}

// The state functions of each scheduler whose own state is a table of fields: compiled once, not in
// each translation unit that wraps a scheduler.
DETTRIAL_INLINE void StepLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void StepLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void StepLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void StepLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void ExponentialLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void ExponentialLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void ExponentialLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void ExponentialLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void LinearLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void LinearLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void LinearLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void LinearLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void ConstantLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void ConstantLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void ConstantLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void ConstantLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void CosineAnnealingLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void CosineAnnealingLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void CosineAnnealingLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void CosineAnnealingLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void PolynomialLR::save(torch::serialize::OutputArchive& archive) const { save_fields(*this, archive, fields()); }
DETTRIAL_INLINE void PolynomialLR::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void PolynomialLR::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void PolynomialLR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}
DETTRIAL_INLINE void CosineAnnealingWarmRestarts::save(torch::serialize::OutputArchive& archive) const {
  save_fields(*this, archive, fields());
}
DETTRIAL_INLINE void CosineAnnealingWarmRestarts::load(torch::serialize::InputArchive& archive) { load_fields(*this, archive, fields()); }
DETTRIAL_INLINE void CosineAnnealingWarmRestarts::python_state(c10::impl::GenericDict& out) const { python_fields(*this, out, fields()); }
DETTRIAL_INLINE void CosineAnnealingWarmRestarts::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  load_python_fields(*this, in, what, fields());
}

}  // namespace dettrial::optim

#endif  // DETTRIAL_HEADER_DEFINITIONS
