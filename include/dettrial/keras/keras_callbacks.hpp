// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The Keras callbacks Keras users reach for, with Keras 3's rules: `EarlyStopping`,
/// `ReduceLROnPlateau`, `ModelCheckpoint`, `CSVLogger` and `TerminateOnNaN`. A Keras-style trial
/// returns them from `keras_callbacks()`; they are dettrial callbacks (any trial may use them) whose
/// state is checkpointed, so a resumed trial counts on.
///
/// Keras's "epoch end" is a validation here: `on_epoch_end(epoch, logs)` runs after each validation,
/// `epoch` counts validations from 0, and `logs` are the validation metrics (`val_...`) with the
/// training metrics since the previous validation (each reporting period's means, weighted by its
/// batches; Keras weighs a partial batch by its records).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../context/context.hpp"
#include "../vocabulary/metric_order.hpp"
#include "../vocabulary/metrics.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Keras 3's MonitorCallback: which way `monitor` improves (`mode` "min", "max", or "auto":
 * min for a loss, max for an accuracy, min for mse and mae, else refused as Keras refuses it) and
 * Keras's test `current -/+ min_delta` strictly better than the best so far (the first value always is).
 */
struct Monitor {
  std::string monitor;
  MetricOrder order;
  double min_delta = 0;

  DETTRIAL_INLINE static Monitor make(const char* who, std::string monitor, const std::string& mode, double min_delta);
  bool improved(double current, const std::optional<double>& best) const { return order.improves_by(current, best, min_delta); }
  /// The monitored value in `logs`; TrialError naming what is reported when it is absent.
  DETTRIAL_INLINE double value(const char* who, const MetricValues& logs) const;
};

/**
 * @brief Keras's epoch logs: the training metrics since the last validation (each reporting
 * period's means weighted by its batches) joined by the validation metrics, and the epoch count.
 */
class EpochLogs {
 public:
  void on_trial_startup(std::int64_t first_batch_idx) { last_batch_ = first_batch_idx; }
  /// A reporting period's means; `batches_completed` counts the trial's batches after it.
  DETTRIAL_INLINE void add_training(const MetricValues& means, std::int64_t batches_completed);
  /// The logs of the epoch a validation ends (and the training means start over).
  DETTRIAL_INLINE MetricValues finish(const MetricValues& validation);
  /// The means under way, for a checkpoint between validations (keys `logs.batches`, `logs.sum.<name>`).
  DETTRIAL_INLINE void save(c10::Dict<std::string, double>& state) const;
  DETTRIAL_INLINE void load(const c10::impl::GenericDict& state);

 private:
  std::vector<std::pair<std::string, double>> sums_;  // value x batches, in first-seen order
  double batches_ = 0;
  std::int64_t last_batch_ = 0;
};

/// Python's `repr(float)`: the shortest digits that read back the same, fixed notation for
/// exponents -4 to 15 (with ".0" when integral), else `1e-05` style; `nan`, `inf`.
DETTRIAL_INLINE std::string python_float(double value);

/// Python's `pattern.format(epoch=..., **logs)` for the fields Keras's file paths use: `{name}` and
/// `{name:[0][width][.precision][type]}` with types d (the epoch), f, e, g, %; `{{` and `}}`. A name
/// not in `logs` or a spec outside that is a ConfigError naming the pattern, as Keras's KeyError does.
DETTRIAL_INLINE std::string python_format(const std::string& pattern, std::int64_t epoch, const MetricValues& logs, const char* who);

}  // namespace dettrial::detail

namespace dettrial::keras {
/**
 * @brief Keras's `EarlyStopping`: asks the trial to stop once `monitor` (a validation metric) has not
 * improved by more than `min_delta` for `patience` epochs (validations), counting from
 * `start_from_epoch`; with a `baseline`, an improvement must also beat it to reset the count.
 */
class EarlyStopping {
 public:
  struct Options {
    std::string monitor = "val_loss";
    double min_delta = 0;
    std::int64_t patience = 0;
    /// "min", "max", or "auto" (Keras 3: a loss falls, an accuracy rises, mse and mae fall).
    std::string mode = "auto";
    std::optional<double> baseline{};
    std::int64_t start_from_epoch = 0;
  };
  DETTRIAL_INLINE EarlyStopping(Context& context, Options options);

  DETTRIAL_INLINE void on_validation_end(const MetricValues& metrics);
  DETTRIAL_INLINE c10::IValue state_dict() const;
  DETTRIAL_INLINE void load_state_dict(const c10::IValue& state);
  /// Epochs since the last improvement, as Keras counts them.
  std::int64_t wait() const { return wait_; }
  std::optional<double> best() const { return best_; }

 private:
  Context* context_;
  Options options_;
  detail::Monitor monitor_;
  std::optional<double> best_;
  std::int64_t wait_ = 0;
  std::int64_t epoch_ = 0;
};

/**
 * @brief Keras's `ReduceLROnPlateau`: when `monitor` has not improved by more than `min_delta` for
 * `patience` epochs, every optimizer's learning rate (each group's) becomes `max(lr * factor,
 * min_lr)`, kept as a float32 as Keras keeps it, unless it is at `min_lr` already; `cooldown` epochs
 * follow in which no wait is counted. A `factor` of 1 or more is refused, as Keras refuses it.
 */
class ReduceLROnPlateau {
 public:
  struct Options {
    std::string monitor = "val_loss";
    double factor = 0.1;
    std::int64_t patience = 10;
    std::string mode = "auto";
    double min_delta = 1e-4;
    std::int64_t cooldown = 0;
    double min_lr = 0;
    /// 1: a line on the chief at each reduction (Keras's message).
    int verbose = 0;
  };
  DETTRIAL_INLINE ReduceLROnPlateau(Context& context, Options options);

  DETTRIAL_INLINE void on_validation_end(const MetricValues& metrics);
  DETTRIAL_INLINE c10::IValue state_dict() const;
  DETTRIAL_INLINE void load_state_dict(const c10::IValue& state);
  std::int64_t wait() const { return wait_; }
  std::int64_t cooldown_counter() const { return cooldown_counter_; }
  std::optional<double> best() const { return best_; }

 private:
  Context* context_;
  Options options_;
  detail::Monitor monitor_;
  std::optional<double> best_;
  std::int64_t wait_ = 0;
  std::int64_t cooldown_counter_ = 0;
  std::int64_t epoch_ = 0;
};

/**
 * @brief Keras's `ModelCheckpoint`: after each epoch (validation), the chief writes the trial's
 * first model's weights to `filepath` formatted as Keras formats it (`{epoch:02d}` counts from 1,
 * `{val_loss:.3f}` and any other logged metric), folders made as needed; with `save_best_only`, only
 * when `monitor` improved. The file is a state dict as Python's `torch.save(model.state_dict())`
 * writes it (torch.load reads it; so does dettrial::load_weights), replaced atomically. The run's own
 * checkpoints are not affected.
 */
class ModelCheckpoint {
 public:
  struct Options {
    std::string filepath;
    std::string monitor = "val_loss";
    bool save_best_only = false;
    std::string mode = "auto";
    /// Keras's `initial_value_threshold`: a first value must beat it to be saved.
    std::optional<double> initial_value_threshold{};
    int verbose = 0;
  };
  DETTRIAL_INLINE ModelCheckpoint(Context& context, Options options);

  void on_trial_startup(std::int64_t first_batch_idx, const std::string&) { logs_.on_trial_startup(first_batch_idx); }
  void on_training_workload_end(const MetricValues& means) { logs_.add_training(means, context_->current_train_batch() + 1); }
  DETTRIAL_INLINE void on_validation_end(const MetricValues& metrics);
  DETTRIAL_INLINE c10::IValue state_dict() const;
  DETTRIAL_INLINE void load_state_dict(const c10::IValue& state);
  /// The files written, in order (this process's).
  const std::vector<std::filesystem::path>& saved() const { return saved_; }

 private:
  Context* context_;
  Options options_;
  detail::Monitor monitor_;
  detail::EpochLogs logs_;
  std::optional<double> best_;
  std::int64_t epoch_ = 0;
  std::vector<std::filesystem::path> saved_;
};

/**
 * @brief Keras's `CSVLogger`: one row per epoch (validation) in `filename`, written by the chief:
 * `epoch` then the logged metrics in sorted order (fixed by the first row; `NA` where one is
 * missing), floats as Python writes them, Excel's CSV dialect (`\r\n`, quotes where needed). With
 * `append`, rows go after an existing file's (no second header). A resumed trial cuts the file back
 * to its checkpoint's rows and goes on, so no row is written twice.
 */
class CSVLogger {
 public:
  struct Options {
    std::filesystem::path filename;
    std::string separator = ",";
    bool append = false;
  };
  DETTRIAL_INLINE CSVLogger(Context& context, Options options);

  void on_trial_startup(std::int64_t first_batch_idx, const std::string&) { logs_.on_trial_startup(first_batch_idx); }
  /// After a resume's state is loaded: opens the file (cut back, appended to or made anew).
  DETTRIAL_INLINE void on_training_start();
  void on_training_workload_end(const MetricValues& means) { logs_.add_training(means, context_->current_train_batch() + 1); }
  DETTRIAL_INLINE void on_validation_end(const MetricValues& metrics);
  DETTRIAL_INLINE c10::IValue state_dict() const;
  DETTRIAL_INLINE void load_state_dict(const c10::IValue& state);

 private:
  DETTRIAL_INLINE std::string row(const std::vector<std::string>& fields) const;

  Context* context_;
  Options options_;
  detail::EpochLogs logs_;
  std::vector<std::string> keys_;  // fixed by the first row
  std::int64_t epoch_ = 0;
  std::uintmax_t bytes_ = 0;  // the file's size after the last row
  bool restored_ = false;
};

/**
 * @brief Keras's `TerminateOnNaN`: asks the trial to stop when the training loss is NaN or infinite.
 * Keras looks at every batch; dettrial looks at each reported training mean (a non-finite batch
 * loss makes its period's mean non-finite), so no batch waits for the device: the stop comes at the
 * end of that reporting period (a shorter `reporting_period` stops sooner). With `raise_error`,
 * the fit ends with a TrialError instead.
 */
class TerminateOnNaN {
 public:
  struct Options {
    bool raise_error = false;
  };
  explicit TerminateOnNaN(Context& context) : context_(&context) {}
  TerminateOnNaN(Context& context, Options options) : context_(&context), options_(options) {}
  DETTRIAL_INLINE void on_training_workload_end(const MetricValues& means);

 private:
  Context* context_;
  Options options_;
};

}  // namespace dettrial::keras

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "../checkpoint/state_dict.hpp"
#include "../detail/atomic_file.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE Monitor Monitor::make(const char* who, std::string monitor, const std::string& mode, double min_delta) {
  Monitor m{std::move(monitor), MetricOrder{true}, std::abs(min_delta)};
  if (mode == "min") m.order.smaller_is_better = true;
  else if (mode == "max") m.order.smaller_is_better = false;
  else if (mode == "auto") {
    const std::string name = m.monitor.rfind("val_", 0) == 0 ? m.monitor.substr(4) : m.monitor;
    static const char* const rising[] = {"accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy"};
    static const char* const falling[] = {"loss", "mse", "mean_squared_error", "mae", "mean_absolute_error"};
    if (std::find(std::begin(rising), std::end(rising), name) != std::end(rising)) m.order.smaller_is_better = false;
    else if (std::find(std::begin(falling), std::end(falling), name) != std::end(falling)) m.order.smaller_is_better = true;
    else
      throw ConfigError(std::string(who) + ": cannot tell whether '" + m.monitor +
                        "' should be maximized or minimized (mode auto knows losses, accuracies, mse and mae); give mode max or min");
  } else throw ConfigError(std::string(who) + ": mode is '" + mode + "'; expected min, max or auto");
  return m;
}

DETTRIAL_INLINE double Monitor::value(const char* who, const MetricValues& logs) const {
  if (const std::optional<double> v = logs.get(monitor)) return *v;
  std::string names;
  for (const auto& [name, v] : logs) names += (names.empty() ? "" : ", ") + name;
  throw TrialError(std::string(who) + " monitors '" + monitor + "', which validation does not report (it reports " + names + ")");
}

DETTRIAL_INLINE void EpochLogs::add_training(const MetricValues& means, std::int64_t batches_completed) {
  // The trainer's means carry the progress ("batches", "epochs"): the count, not a metric to log.
  if (const std::optional<double> done = means.get("batches")) batches_completed = static_cast<std::int64_t>(*done);
  const double batches = static_cast<double>(std::max<std::int64_t>(batches_completed - last_batch_, 1));
  last_batch_ = batches_completed;
  for (const auto& [name, value] : means) {
    if (name == "batches" || name == "epochs") continue;
    auto it = std::find_if(sums_.begin(), sums_.end(), [&](const auto& s) { return s.first == name; });
    if (it == sums_.end()) sums_.emplace_back(name, value * batches);
    else it->second += value * batches;
  }
  batches_ += batches;
}

DETTRIAL_INLINE MetricValues EpochLogs::finish(const MetricValues& validation) {
  MetricValues logs;
  for (const auto& [name, sum] : sums_) logs.set(name, sum / batches_);
  for (const auto& [name, value] : validation) logs.set(name, value);
  sums_.clear();
  batches_ = 0;
  return logs;
}

DETTRIAL_INLINE void EpochLogs::save(c10::Dict<std::string, double>& state) const {
  state.insert("logs.batches", batches_);
  for (const auto& [name, sum] : sums_) state.insert("logs.sum." + name, sum);
}

DETTRIAL_INLINE void EpochLogs::load(const c10::impl::GenericDict& state) {
  sums_.clear();
  batches_ = 0;
  for (const auto& entry : state) {
    const std::string& key = entry.key().toStringRef();
    if (key == "logs.batches") batches_ = entry.value().toDouble();
    else if (key.rfind("logs.sum.", 0) == 0) sums_.emplace_back(key.substr(9), entry.value().toDouble());
  }
}

/// A callback's state dict of numbers by name; CheckpointError naming `who` when `key` is absent.
inline double state_number(const c10::impl::GenericDict& state, const std::string& key, const char* who) {
  const auto it = state.find(key);
  if (it == state.end()) throw CheckpointError(std::string(who) + ": its checkpointed state has no '" + key + "'");
  return it->value().toDouble();
}

DETTRIAL_INLINE std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string sci(buf, end);  // [-]d[.ddd]e[+-]XX: the shortest digits that round-trip
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    else {
      const auto point = static_cast<std::size_t>(exponent) + 1;
      if (digits.size() <= point) out += digits + std::string(point - digits.size(), '0') + ".0";
      else out += digits.substr(0, point) + "." + digits.substr(point);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return out;
}

/// The ConfigError of python_format: `who` cannot format `pattern`, and why.
DETTRIAL_INLINE ConfigError python_format_error(const char* who, const std::string& pattern, const std::string& why) {
  return ConfigError(std::string(who) + ": cannot format '" + pattern + "': " + why);
}

/// One replacement field of python_format, `name` or `name:spec`, as text.
DETTRIAL_INLINE std::string python_format_field(const std::string& field, std::int64_t epoch, const MetricValues& logs, const char* who,
                                                const std::string& pattern) {
  const auto refuse = [&](const std::string& why) { return python_format_error(who, pattern, why); };
  const std::size_t colon = field.find(':');
  const std::string name = field.substr(0, colon);
  const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
  std::optional<double> number;
  const bool is_epoch = name == "epoch";
  if (!is_epoch) {
    number = logs.get(name);
    if (!number) {
      std::string names = "epoch";
      for (const auto& [n, v] : logs) names += ", " + n;
      throw refuse("no value named '" + name + "' (there are " + names + ")");
    }
  }
  // [0][width][.precision][type]
  std::size_t p = 0;
  const bool zero = p < spec.size() && spec[p] == '0';
  if (zero) ++p;
  std::string width, precision;
  while (p < spec.size() && std::isdigit(static_cast<unsigned char>(spec[p]))) width += spec[p++];
  if (p < spec.size() && spec[p] == '.') {
    ++p;
    while (p < spec.size() && std::isdigit(static_cast<unsigned char>(spec[p]))) precision += spec[p++];
    if (precision.empty()) throw refuse("'{" + field + "}' has a '.' without a precision");
  }
  const std::string type = spec.substr(p);
  if (type.size() > 1 || (!type.empty() && std::string("dfeg%").find(type) == std::string::npos))
    throw refuse("'{" + field + "}' has a format spec other than [0][width][.precision][d|f|e|g|%]");
  if (!is_epoch && type == "d") throw refuse("'{" + field + "}': Unknown format code 'd' for a float value ('" + name + "')");
  const std::string flags = std::string("%") + (zero ? "0" : "") + width;
  char buf[128];
  if (is_epoch && precision.empty() && (type.empty() || type == "d")) {
    std::snprintf(buf, sizeof buf, (flags + "lld").c_str(), static_cast<long long>(epoch));
    return buf;
  }
  if (!is_epoch && type.empty() && precision.empty()) {
    std::string text = python_float(*number);
    if (!width.empty() && text.size() < std::stoul(width)) text = std::string(std::stoul(width) - text.size(), zero ? '0' : ' ') + text;
    return text;
  }
  // A float conversion: the epoch's with a precision or a float type (a bare precision is f), a value's (a bare precision is g).
  const std::string conv = type.empty() || type == "d" ? (is_epoch ? "f" : "g") : type == "%" ? "f" : type;
  const std::string f = flags + "." + (precision.empty() ? "6" : precision) + conv;
  std::snprintf(buf, sizeof buf, f.c_str(), (is_epoch ? static_cast<double>(epoch) : *number) * (type == "%" ? 100.0 : 1.0));
  return buf + std::string(type == "%" ? "%" : "");
}

DETTRIAL_INLINE std::string python_format(const std::string& pattern, std::int64_t epoch, const MetricValues& logs, const char* who) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '}') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '}') ++i;
      else throw python_format_error(who, pattern, "a single '}'");
      out += '}';
    } else if (c != '{') {
      out += c;
    } else if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      out += '{';
      ++i;
    } else {
      const std::size_t close = pattern.find('}', i);
      if (close == std::string::npos) throw python_format_error(who, pattern, "a '{' without its '}'");
      out += python_format_field(pattern.substr(i + 1, close - i - 1), epoch, logs, who, pattern);
      i = close;
    }
  }
  return out;
}

}  // namespace dettrial::detail

namespace dettrial::keras {
// ---- EarlyStopping -------------------------------------------------------------------------------

DETTRIAL_INLINE EarlyStopping::EarlyStopping(Context& context, Options options)
    : context_(&context),
      options_(std::move(options)),
      monitor_(detail::Monitor::make("keras::EarlyStopping", options_.monitor, options_.mode, options_.min_delta)) {
  if (options_.patience < 0) throw ConfigError("keras::EarlyStopping: patience must not be negative");
}

DETTRIAL_INLINE void EarlyStopping::on_validation_end(const MetricValues& metrics) {
  const double current = monitor_.value("keras::EarlyStopping", metrics);
  const std::int64_t epoch = epoch_++;
  if (epoch < options_.start_from_epoch) return;
  ++wait_;
  if (monitor_.improved(current, best_)) {
    best_ = current;
    if (!options_.baseline || monitor_.improved(current, options_.baseline)) wait_ = 0;
    return;
  }
  if (wait_ >= options_.patience && epoch > 0) context_->set_stop_requested(true);
}

DETTRIAL_INLINE c10::IValue EarlyStopping::state_dict() const {
  return c10::IValue(std::vector<double>{best_.value_or(std::nan("")), static_cast<double>(wait_), static_cast<double>(epoch_)});
}

DETTRIAL_INLINE void EarlyStopping::load_state_dict(const c10::IValue& state) {
  const std::vector<double> v = state.toDoubleVector();
  // Two values: the state before Keras 3's rules (best, wait), where +-inf meant "none yet".
  if (v.size() != 2 && v.size() != 3)
    throw CheckpointError("keras::EarlyStopping: its checkpointed state has " + std::to_string(v.size()) + " values, not 3");
  best_ = std::isfinite(v[0]) ? std::optional<double>(v[0]) : std::nullopt;
  wait_ = static_cast<std::int64_t>(v[1]);
  epoch_ = v.size() == 3 ? static_cast<std::int64_t>(v[2]) : wait_ + (best_ ? 1 : 0);
}

// ---- ReduceLROnPlateau ---------------------------------------------------------------------------

DETTRIAL_INLINE ReduceLROnPlateau::ReduceLROnPlateau(Context& context, Options options)
    : context_(&context),
      options_(std::move(options)),
      monitor_(detail::Monitor::make("keras::ReduceLROnPlateau", options_.monitor, options_.mode, options_.min_delta)) {
  if (options_.factor >= 1.0)
    throw ConfigError("keras::ReduceLROnPlateau does not support a factor >= 1.0 (factor is " + detail::python_float(options_.factor) +
                      ")");
  if (options_.patience < 0 || options_.cooldown < 0)
    throw ConfigError("keras::ReduceLROnPlateau: patience and cooldown must not be negative");
}

DETTRIAL_INLINE void ReduceLROnPlateau::on_validation_end(const MetricValues& metrics) {
  const double current = monitor_.value("keras::ReduceLROnPlateau", metrics);
  const std::int64_t epoch = epoch_++;
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    wait_ = 0;
  }
  if (monitor_.improved(current, best_)) {
    best_ = current;
    wait_ = 0;
    return;
  }
  if (cooldown_counter_ > 0 || ++wait_ < options_.patience) return;
  bool reduced = false;
  for (std::size_t i = 0; i < context_->num_optimizers(); ++i)
    for (auto& group : context_->optimizer(i).param_groups()) {
      const double old_lr = group.options().get_lr();
      // Keras keeps the rate in a float32 variable and compares it with the float32 min_lr.
      if (static_cast<double>(static_cast<float>(old_lr)) <= static_cast<double>(static_cast<float>(options_.min_lr))) continue;
      const double new_lr = static_cast<double>(static_cast<float>(std::max(old_lr * options_.factor, options_.min_lr)));
      group.options().set_lr(new_lr);
      reduced = true;
      if (options_.verbose > 0 && context_->distributed().is_chief())
        std::fprintf(stderr, "\nEpoch %lld: ReduceLROnPlateau reducing learning rate to %s.\n", static_cast<long long>(epoch + 1),
                     detail::python_float(new_lr).c_str());
    }
  if (reduced) {
    cooldown_counter_ = options_.cooldown;
    wait_ = 0;
  }
}

DETTRIAL_INLINE c10::IValue ReduceLROnPlateau::state_dict() const {
  return c10::IValue(std::vector<double>{best_.value_or(std::nan("")), static_cast<double>(wait_), static_cast<double>(cooldown_counter_),
                                         static_cast<double>(epoch_)});
}

DETTRIAL_INLINE void ReduceLROnPlateau::load_state_dict(const c10::IValue& state) {
  const std::vector<double> v = state.toDoubleVector();
  if (v.size() != 4)
    throw CheckpointError("keras::ReduceLROnPlateau: its checkpointed state has " + std::to_string(v.size()) + " values, not 4");
  best_ = std::isnan(v[0]) ? std::nullopt : std::optional<double>(v[0]);
  wait_ = static_cast<std::int64_t>(v[1]);
  cooldown_counter_ = static_cast<std::int64_t>(v[2]);
  epoch_ = static_cast<std::int64_t>(v[3]);
}

// ---- ModelCheckpoint -----------------------------------------------------------------------------

DETTRIAL_INLINE ModelCheckpoint::ModelCheckpoint(Context& context, Options options)
    : context_(&context),
      options_(std::move(options)),
      monitor_(detail::Monitor::make("keras::ModelCheckpoint", options_.monitor, options_.mode, 0.0)),
      best_(options_.initial_value_threshold) {
  if (options_.filepath.empty()) throw ConfigError("keras::ModelCheckpoint needs a filepath");
}

DETTRIAL_INLINE void ModelCheckpoint::on_validation_end(const MetricValues& metrics) {
  const MetricValues logs = logs_.finish(metrics);
  const std::int64_t epoch = epoch_++;
  const std::filesystem::path path = detail::python_format(options_.filepath, epoch + 1, logs, "keras::ModelCheckpoint");
  if (options_.save_best_only) {
    const double current = monitor_.value("keras::ModelCheckpoint", logs);
    if (!monitor_.improved(current, best_)) {
      if (options_.verbose > 0 && context_->distributed().is_chief())
        std::fprintf(stderr, "\nEpoch %lld: %s did not improve from %.5f\n", static_cast<long long>(epoch + 1), options_.monitor.c_str(),
                     best_.value_or(std::nan("")));
      return;
    }
    best_ = current;
  }
  if (!context_->distributed().is_chief()) return;
  if (context_->models().empty()) throw TrialError("keras::ModelCheckpoint: the trial wraps no model to save");
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  if (std::filesystem::is_directory(path)) throw TrialError("keras::ModelCheckpoint: give a file path, not a directory: " + path.string());
  detail::write_atomically(path, detail::pickle_archive(module_state_dict(*context_->models().front())));
  saved_.push_back(path);
  if (options_.verbose > 0)
    std::fprintf(stderr, "\nEpoch %lld: finished saving model to %s\n", static_cast<long long>(epoch + 1), path.c_str());
}

DETTRIAL_INLINE c10::IValue ModelCheckpoint::state_dict() const {
  c10::Dict<std::string, double> state;
  state.insert("epoch", static_cast<double>(epoch_));
  state.insert("best", best_.value_or(std::nan("")));
  logs_.save(state);
  return c10::IValue(state);
}

DETTRIAL_INLINE void ModelCheckpoint::load_state_dict(const c10::IValue& state) {
  const c10::impl::GenericDict dict = state.toGenericDict();
  epoch_ = static_cast<std::int64_t>(detail::state_number(dict, "epoch", "keras::ModelCheckpoint"));
  const double best = detail::state_number(dict, "best", "keras::ModelCheckpoint");
  best_ = std::isnan(best) ? std::nullopt : std::optional<double>(best);
  logs_.load(dict);
}

// ---- CSVLogger -----------------------------------------------------------------------------------

DETTRIAL_INLINE CSVLogger::CSVLogger(Context& context, Options options) : context_(&context), options_(std::move(options)) {
  if (options_.filename.empty()) throw ConfigError("keras::CSVLogger needs a filename");
  if (options_.separator.size() != 1)
    throw ConfigError("keras::CSVLogger: the separator must be one character, not '" + options_.separator + "'");
}

DETTRIAL_INLINE void CSVLogger::on_training_start() {
  if (!context_->distributed().is_chief()) return;
  namespace fs = std::filesystem;
  const fs::path& file = options_.filename;
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  if (restored_) {
    // Resumed: the rows written after the checkpoint are written again, so they go first.
    std::error_code ec;
    const std::uintmax_t size = fs::exists(file) ? fs::file_size(file) : 0;
    if (size > bytes_) fs::resize_file(file, bytes_, ec);
    if (ec) throw TrialError("keras::CSVLogger: cannot cut '" + file.string() + "' back to its checkpointed rows: " + ec.message());
    if (size < bytes_) bytes_ = size;  // shortened by hand: go on from what is there
  } else if (!options_.append || !fs::exists(file)) {
    std::ofstream(file, std::ios::binary | std::ios::trunc);
    bytes_ = 0;
  } else {
    bytes_ = fs::file_size(file);
  }
  // Appending to rows already there (Keras's append, or a resume): the header is the first line's.
  if (keys_.empty() && bytes_ > 0) {
    std::ifstream in(file, std::ios::binary);
    std::string header;
    std::getline(in, header);
    if (!header.empty() && header.back() == '\r') header.pop_back();
    std::size_t start = 0;
    for (;;) {
      const std::size_t sep = header.find(options_.separator[0], start);
      keys_.push_back(header.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
      if (sep == std::string::npos) break;
      start = sep + 1;
    }
    if (!keys_.empty() && keys_.front() == "epoch") keys_.erase(keys_.begin());
  }
}

DETTRIAL_INLINE std::string CSVLogger::row(const std::vector<std::string>& fields) const {
  const char sep = options_.separator[0];
  std::string out;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += sep;
    const std::string& f = fields[i];
    if (f.find_first_of(std::string(1, sep) + "\"\r\n") == std::string::npos) {
      out += f;
      continue;
    }
    out += '"';  // Excel's dialect: quotes doubled inside a quoted field
    for (const char c : f) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    out += '"';
  }
  return out + "\r\n";
}

DETTRIAL_INLINE void CSVLogger::on_validation_end(const MetricValues& metrics) {
  const MetricValues logs = logs_.finish(metrics);
  const std::int64_t epoch = epoch_++;
  if (!context_->distributed().is_chief()) return;
  std::string text;
  if (keys_.empty()) {
    for (const auto& [name, v] : logs) keys_.push_back(name);
    std::sort(keys_.begin(), keys_.end());
    std::vector<std::string> header{"epoch"};
    header.insert(header.end(), keys_.begin(), keys_.end());
    text += row(header);
  }
  std::vector<std::string> fields{std::to_string(epoch)};
  for (const std::string& key : keys_) {
    const std::optional<double> v = logs.get(key);
    fields.push_back(v ? detail::python_float(*v) : "NA");
  }
  text += row(fields);
  std::ofstream out(options_.filename, std::ios::binary | std::ios::app);
  out << text;
  out.flush();
  if (!out) throw TrialError("keras::CSVLogger: cannot write to '" + options_.filename.string() + "'");
  bytes_ += text.size();
}

DETTRIAL_INLINE c10::IValue CSVLogger::state_dict() const {
  c10::Dict<std::string, double> state;
  state.insert("epoch", static_cast<double>(epoch_));
  state.insert("bytes", static_cast<double>(bytes_));
  logs_.save(state);
  return c10::IValue(state);
}

DETTRIAL_INLINE void CSVLogger::load_state_dict(const c10::IValue& state) {
  const c10::impl::GenericDict dict = state.toGenericDict();
  epoch_ = static_cast<std::int64_t>(detail::state_number(dict, "epoch", "keras::CSVLogger"));
  bytes_ = static_cast<std::uintmax_t>(detail::state_number(dict, "bytes", "keras::CSVLogger"));
  logs_.load(dict);
  restored_ = true;
}

// ---- TerminateOnNaN ------------------------------------------------------------------------------

DETTRIAL_INLINE void TerminateOnNaN::on_training_workload_end(const MetricValues& means) {
  const std::optional<double> loss = means.get("loss");
  if (!loss || std::isfinite(*loss)) return;
  const std::int64_t batch = context_->current_train_batch();
  if (options_.raise_error)
    throw TrialError("keras::TerminateOnNaN: NaN or Inf loss encountered by batch " + std::to_string(batch) +
                     " (the period's mean loss is " + detail::python_float(*loss) + "); terminating training");
  if (context_->distributed().is_chief())
    std::fprintf(stderr, "Batch %lld: Invalid loss, terminating training\n", static_cast<long long>(batch));
  context_->set_stop_requested(true);
}

}  // namespace dettrial::keras

#endif  // DETTRIAL_HEADER_DEFINITIONS
