// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Python's `ReduceLROnPlateau`, stepped with a metric: its rules and arithmetic, exact resume,
/// and Python's `state_dict()` layout.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "scheduler_base.hpp"

namespace dettrial::optim {

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
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "../error.hpp"

namespace dettrial::optim {

DETTRIAL_INLINE ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(&optimizer), options_(std::move(options)) {
  const auto invalid = [](const char* argument, const std::string& rule, const std::string& value) {
    detail::throw_invalid_argument("dettrial::optim::ReduceLROnPlateau", argument, rule, value);
  };
  const auto& o = options_;
  if (o.mode != "min" && o.mode != "max") invalid("mode", "\"min\" or \"max\"", '"' + o.mode + '"');
  if (!(o.factor >= 0 && o.factor < 1)) invalid("factor", "in [0, 1)", detail::number_text(o.factor));
  if (o.patience < 0) invalid("patience", "at least 0", std::to_string(o.patience));
  if (!(o.threshold >= 0)) invalid("threshold", "at least 0", detail::number_text(o.threshold));
  if (o.threshold_mode != "rel" && o.threshold_mode != "abs") invalid("threshold_mode", "\"rel\" or \"abs\"", '"' + o.threshold_mode + '"');
  if (o.cooldown < 0) invalid("cooldown", "at least 0", std::to_string(o.cooldown));
  if (!(o.eps >= 0)) invalid("eps", "at least 0", detail::number_text(o.eps));
  const std::size_t groups = optimizer.param_groups().size();
  if (const auto* per_group = std::get_if<std::vector<double>>(&o.min_lr)) {
    if (per_group->size() != groups)
      invalid("min_lr", "one value per parameter group (" + std::to_string(groups) + ")", std::to_string(per_group->size()) + " values");
    min_lrs_ = *per_group;
  } else {
    min_lrs_.assign(groups, std::get<double>(o.min_lr));
  }
  for (const double m : min_lrs_)
    if (!(m >= 0)) invalid("min_lr", "at least 0", detail::number_text(m));
  min_mode_ = o.mode == "min";
  rel_threshold_ = o.threshold_mode == "rel";
  last_lr_ = detail::scheduler_base::group_lrs(optimizer);
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
  last_lr_ = detail::scheduler_base::group_lrs(*optimizer_);
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
  const detail::scheduler_base::SchedulerArchive in(archive, "ReduceLROnPlateau", "dettrial::optim::ReduceLROnPlateau's saved state");
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
  out.insert("min_lrs", python::list(min_lrs_));
  out.insert("patience", options_.patience);
  out.insert("cooldown", options_.cooldown);
  out.insert("eps", options_.eps);
  out.insert("verbose", false);  // torch < 2.2 has it
  out.insert("last_epoch", last_epoch_);
  out.insert("_last_lr", python::list(last_lr_));
  out.insert("mode_worse", mode_worse());
  out.insert("mode", options_.mode);
  out.insert("threshold", options_.threshold);
  out.insert("threshold_mode", options_.threshold_mode);
  out.insert("best", best_);
  out.insert("cooldown_counter", cooldown_counter_);
  out.insert("num_bad_epochs", num_bad_epochs_);
}

DETTRIAL_INLINE void ReduceLROnPlateau::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
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
  o.factor = python::number(field("factor"), what + ": factor");
  o.patience = static_cast<std::int64_t>(python::number(field("patience"), what + ": patience"));
  o.cooldown = static_cast<std::int64_t>(python::number(field("cooldown"), what + ": cooldown"));
  o.threshold = python::number(field("threshold"), what + ": threshold");
  o.eps = python::number(field("eps"), what + ": eps");
  std::vector<double> min_lrs = python::numbers(field("min_lrs"), what + ": min_lrs");
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
  last_epoch_ = static_cast<std::int64_t>(python::number(field("last_epoch"), what + ": last_epoch"));
  if (const auto it = in.find("_last_lr"); it != in.end()) last_lr_ = python::numbers(it->value(), what + ": _last_lr");
  best_ = python::number(field("best"), what + ": best");
  cooldown_counter_ = static_cast<std::int64_t>(python::number(field("cooldown_counter"), what + ": cooldown_counter"));
  num_bad_epochs_ = static_cast<std::int64_t>(python::number(field("num_bad_epochs"), what + ": num_bad_epochs"));
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
