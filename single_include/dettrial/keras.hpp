// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
#include "dettrial.hpp"
// ---- begin dettrial/keras.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Keras-style trials for dettrial (Determined's TFKerasTrial): `build_model()` returning
/// `keras::compile(...)`'s model, in-memory sequences, losses, metrics and optimizers by name, and
/// Keras's callbacks; `Trainer` and `dettrial::main` run such a trial through keras::TrialAdapter.
/// Opt-in, next to <dettrial/dettrial.hpp>.


// ---- begin dettrial/keras/keras_callbacks.hpp
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

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>


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
// ---- end dettrial/keras/keras_callbacks.hpp
// ---- begin dettrial/keras/keras.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The TFKerasTrial style: a compiled model (optimizer, loss and metrics by name, as
/// `model.compile` takes them) and in-memory data; dettrial writes the training and validation steps.
///
/// A Keras-style trial has `build_model()` returning `dettrial::keras::compile(...)`'s result and
/// `build_training_data_loader()` / `build_validation_data_loader()` returning an `InMemorySequence`,
/// `WeightedSequence`, `MultiInputSequence`, `DictInputSequence` (or any dettrial loader of
/// `(inputs, labels)` batches); `Trainer<MyKerasTrial>` runs it through
/// `keras::TrialAdapter`, under the same loop, checkpoints, searchers and data parallel as any trial.
/// Training metrics are `loss` and the compiled metrics; validation metrics carry Keras's `val_`
/// prefix (`val_loss`, `val_accuracy`). Keras's callbacks are in keras_callbacks.hpp.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>


namespace dettrial::keras {

/**
 * @brief Supervised data held in memory, in batches (Determined's `InMemorySequence`): inputs,
 * labels with as many rows, and the batch size of this process's loader.
 * @code{.cpp}
 * return dettrial::keras::InMemorySequence{.data = images, .labels = labels, .batch_size = 32};
 * @endcode
 */
struct InMemorySequence {
  torch::Tensor data;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  /// Training batches are drawn in a new order every epoch (Keras's `fit(shuffle=True)`), from the
  /// trial's seed; validation batches come in order.
  bool shuffle = true;
};

/**
 * @brief An InMemorySequence with weights: a weight per sample (Keras's `fit(sample_weight=...)`, or a
 * Sequence yielding `(x, y, sample_weight)`) and/or per class (`class_weight`, Determined's
 * `context.configure_fit(class_weight=...)`), multiplied together. A batch's loss is then Keras's
 * weighted loss, the sum of weight x loss over the batch divided by its size; metrics are not
 * weighted (Keras weights only `weighted_metrics`). For validation, `class_weight` is refused, as
 * Keras's `evaluate` takes none.
 */
struct WeightedSequence {
  torch::Tensor data;
  torch::Tensor labels;
  /// One weight per sample (shape (N)); undefined: 1 each.
  torch::Tensor sample_weights{};
  /// A weight per integer class label; a label without one weighs 1.
  std::map<std::int64_t, double> class_weight{};
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/**
 * @brief Several inputs held in memory, as a list: Keras's `fit(x=[a, b], y)` for a model of several
 * inputs. Batches are `(std::vector<torch::Tensor>, labels)`; the model's `forward` takes
 * `const std::vector<torch::Tensor>&`, in the same order.
 */
struct MultiInputSequence {
  std::vector<torch::Tensor> inputs;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/**
 * @brief Several inputs held in memory, by name: Keras's `fit(x={"image": a, "meta": b}, y)`. Batches
 * are `(std::map<std::string, torch::Tensor>, labels)`; the model's `forward` takes
 * `const std::map<std::string, torch::Tensor>&`.
 */
struct DictInputSequence {
  std::map<std::string, torch::Tensor> inputs;
  torch::Tensor labels;
  std::int64_t batch_size = 32;
  bool shuffle = true;
};

/// Loss functions with Keras's names and semantics (the mean over the batch).
}  // namespace dettrial::keras

namespace dettrial::keras::losses {
/// Integer class labels against logits (`from_logits`) or probabilities.
struct SparseCategoricalCrossentropy {
  bool from_logits = false;
};
/// One-hot (or soft) labels against logits or probabilities.
struct CategoricalCrossentropy {
  bool from_logits = false;
};
/// 0/1 labels against logits or probabilities, element-wise.
struct BinaryCrossentropy {
  bool from_logits = false;
};
struct MeanSquaredError {};
struct MeanAbsoluteError {};
/// A loss of one's own: `(y_pred, y_true) -> scalar tensor`.
using Custom = std::function<torch::Tensor(const torch::Tensor& y_pred, const torch::Tensor& y_true)>;

inline SparseCategoricalCrossentropy sparse_categorical_crossentropy(bool from_logits = false) { return {from_logits}; }
inline CategoricalCrossentropy categorical_crossentropy(bool from_logits = false) { return {from_logits}; }
inline BinaryCrossentropy binary_crossentropy(bool from_logits = false) { return {from_logits}; }
}  // namespace dettrial::keras::losses

namespace dettrial::keras {
/// The losses `compile` takes: one of Keras's (chosen once; a switch per batch) or one's own.
using Loss = std::variant<losses::SparseCategoricalCrossentropy, losses::CategoricalCrossentropy, losses::BinaryCrossentropy,
                          losses::MeanSquaredError, losses::MeanAbsoluteError, losses::Custom>;

/// An optimizer by Keras's name (`"adam"`, `"sgd"`, `"rmsprop"`, `"adamw"`, `"adagrad"`, with
/// Keras's default settings) or one already made over the model's parameters.
using OptimizerChoice = std::variant<std::string, std::shared_ptr<torch::optim::Optimizer>>;

/// What `model.compile` takes. Keras's defaults: RMSprop, no metrics.
struct CompileOptions {
  OptimizerChoice optimizer = std::string("rmsprop");
  Loss loss = losses::SparseCategoricalCrossentropy{};
  /// Metric names: `accuracy` (resolved from the loss as Keras does), `sparse_categorical_accuracy`,
  /// `categorical_accuracy`, `binary_accuracy`, `mse`/`mean_squared_error`, `mae`/`mean_absolute_error`.
  std::vector<std::string> metrics;
};

/// A metric `compile` resolved from its name; the name is what the reports show.
struct CompiledMetric {
  enum class Kind { sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, mean_squared_error, mean_absolute_error };
  Kind kind;
  MetricKey name;
  MetricKey validation_name;  // with Keras's "val_" prefix
};

/// A model with its optimizer, loss and metrics: what a Keras-style trial's `build_model()` returns.
template <ModelHandle M>
struct CompiledModel {
  M model;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  Loss loss;
  std::vector<CompiledMetric> metrics;
};

}  // namespace dettrial::keras

namespace dettrial::detail {
/// Keras's optimizer of that name over `parameters`, with Keras's defaults (Adam: lr 0.001, eps 1e-7; SGD:
/// lr 0.01; RMSprop: lr 0.001, rho 0.9, eps 1e-7; AdamW: lr 0.001, weight decay 0.004, eps 1e-7;
/// Adagrad: lr 0.001, initial accumulator 0.1, eps 1e-7). An unknown name is a ConfigError with a suggestion.
DETTRIAL_INLINE std::shared_ptr<torch::optim::Optimizer> optimizer_named(const std::string& name,
                                                                         const std::vector<torch::Tensor>& parameters);
/// The metrics of `names`, `accuracy` resolved by `loss` as Keras resolves it.
DETTRIAL_INLINE std::vector<keras::CompiledMetric> metrics_named(const std::vector<std::string>& names, const keras::Loss& loss);
/// The loss of a batch (the mean over its rows).
DETTRIAL_INLINE torch::Tensor loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// One metric of a batch, as a tensor on the batch's device (no synchronisation).
DETTRIAL_INLINE torch::Tensor metric_value(keras::CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's loss of each sample (its values averaged over the last axis where Keras averages), for weighting.
DETTRIAL_INLINE torch::Tensor per_sample_loss(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's weighted loss: sum(weight x per-sample loss) / the number of per-sample values.
DETTRIAL_INLINE torch::Tensor weighted_loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights);
/// The weights of a WeightedSequence: sample weights times class weights, one per sample, as float.
DETTRIAL_INLINE torch::Tensor combined_weights(const keras::WeightedSequence& s);

/// The records of several inputs (a vector or a string-keyed map of tensors) and their labels,
/// gathered together: a batch is `(inputs, labels)`.
template <class Inputs>
class InputsDataset {
 public:
  InputsDataset(Inputs inputs, torch::Tensor labels, const char* who) : inputs_(std::move(inputs)), labels_(std::move(labels)) {
    if (!labels_.defined() || labels_.dim() == 0) throw TrialError(std::string(who) + " needs labels with a first (record) dimension");
    if (inputs_.empty()) throw TrialError(std::string(who) + " has no inputs");
    for (const auto& [name, t] : named()) {
      if (!t.defined() || t.dim() == 0) throw TrialError(std::string(who) + ": input " + name + " has no first (record) dimension");
      if (t.size(0) != labels_.size(0))
        throw TrialError(std::string(who) + ": input " + name + " has " + std::to_string(t.size(0)) + " records but there are " +
                         std::to_string(labels_.size(0)) + " labels");
    }
  }
  std::int64_t size() const { return labels_.size(0); }
  std::tuple<Inputs, torch::Tensor> get_batch(const torch::Tensor& indices) const {
    const torch::Tensor at = indices.to(labels_.device());
    Inputs batch = inputs_;
    if constexpr (requires { batch.begin()->second; })
      for (auto& [name, t] : batch) t = t.index_select(0, at);
    else
      for (auto& t : batch) t = t.index_select(0, at);
    return {std::move(batch), labels_.index_select(0, at)};
  }

 private:
  /// (name, tensor) pairs for messages: the key, or "#i" in a list.
  std::vector<std::pair<std::string, torch::Tensor>> named() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    if constexpr (requires { inputs_.begin()->second; })
      for (const auto& [name, t] : inputs_) out.emplace_back("'" + name + "'", t);
    else
      for (std::size_t i = 0; i < inputs_.size(); ++i) out.emplace_back("#" + std::to_string(i), inputs_[i]);
    return out;
  }
  Inputs inputs_;
  torch::Tensor labels_;
};
}  // namespace dettrial::detail

namespace dettrial::keras {
/**
 * @brief `model.compile(optimizer, loss, metrics)`: the model with an optimizer over its parameters
 * (by name with Keras's defaults, or given), a loss and metrics. Bad names are a ConfigError naming them.
 * @code{.cpp}
 * return dettrial::keras::compile(context.wrap_model(model), {.optimizer = "adam",
 *     .loss = dettrial::keras::losses::sparse_categorical_crossentropy(true), .metrics = {"accuracy"}});
 * @endcode
 */
template <ModelHandle M>
CompiledModel<M> compile(M model, CompileOptions options) {
  auto optimizer = std::visit(
      [&](auto& choice) -> std::shared_ptr<torch::optim::Optimizer> {
        if constexpr (std::is_same_v<std::decay_t<decltype(choice)>, std::string>)
          return detail::optimizer_named(choice, model->parameters());
        else return choice;
      },
      options.optimizer);
  if (!optimizer) throw ConfigError("keras::compile was given no optimizer");
  auto metrics = detail::metrics_named(options.metrics, options.loss);
  return CompiledModel<M>{std::move(model), std::move(optimizer), std::move(options.loss), std::move(metrics)};
}

/// Initialises a model's Linear and Conv layers as Keras's Dense and Conv layers are (Glorot-uniform
/// weights, zero biases) instead of LibTorch's defaults, so a port starts where the Keras model starts.
DETTRIAL_INLINE void initialize_like_keras(torch::nn::Module& model);

/// A type whose `build_model()` returns a keras::CompiledModel: a Keras-style trial.
template <class T>
struct is_compiled_model : std::false_type {};
template <class M>
struct is_compiled_model<CompiledModel<M>> : std::true_type {};

template <class K>
concept KerasTrial = requires(K& k) {
  requires is_compiled_model<std::remove_cvref_t<decltype(k.build_model())>>::value;
  k.build_training_data_loader();
  k.build_validation_data_loader();
};

}  // namespace dettrial::keras

namespace dettrial::detail {
/**
 * @brief Validation means as Keras's `evaluate` takes them: each batch's loss and metrics weighted
 * by its records, so a partial last batch counts by its size (Determined's own averaging counts
 * every batch once). The weighted sums stay on the model's device until the validation ends, and
 * are combined across ranks as one process over the whole set would take them.
 */
struct RecordWeightedMeans {
  std::vector<std::string> names;
  torch::Tensor sums;  // one per name: the sum over batches of value x records
  double records = 0;

  void reset() {
    sums = torch::Tensor();
    records = 0;
  }
  void add(const std::vector<torch::Tensor>& values, std::int64_t batch_records) {
    const torch::Tensor weighted = torch::stack(values).to(torch::kDouble) * static_cast<double>(batch_records);
    sums = sums.defined() ? sums + weighted : weighted;
    records += static_cast<double>(batch_records);
  }
  std::vector<double> per_slot_reduce() const {
    std::vector<double> parts(names.size(), 0.0);
    if (sums.defined()) {
      const torch::Tensor host = sums.cpu();
      for (std::size_t i = 0; i < names.size(); ++i) parts[i] = host[static_cast<std::int64_t>(i)].item<double>();
    }
    parts.push_back(records);
    return parts;
  }
  MetricValues cross_slot_reduce(const std::vector<std::vector<double>>& parts) const {
    std::vector<double> total(names.size() + 1, 0.0);
    for (const auto& p : parts)
      for (std::size_t i = 0; i < total.size() && i < p.size(); ++i) total[i] += p[i];
    MetricValues out;
    for (std::size_t i = 0; i < names.size(); ++i) out.set(names[i], total[i] / total.back());
    return out;
  }
};
}  // namespace dettrial::detail

namespace dettrial::keras {
/**
 * @brief A Keras-style trial as a dettrial trial: builds the user's trial, its compiled model (wrapped
 * in the context unless `build_model` did) and optimizer, and writes `train_batch` (forward, loss,
 * backward, optimizer step, metrics) and `evaluate_batch` (the same without the step, `val_` names,
 * averaged over records as Keras's `evaluate` averages: see detail::RecordWeightedMeans).
 * `Trainer<K>` uses it for every KerasTrial K.
 */
template <KerasTrial K>
class TrialAdapter {
  static auto make_loader(InMemorySequence s, bool training) {
    if (!s.data.defined() || !s.labels.defined()) throw TrialError("keras::InMemorySequence needs both data and labels");
    if (s.data.size(0) != s.labels.size(0))
      throw TrialError("keras::InMemorySequence has " + std::to_string(s.data.size(0)) + " inputs but " + std::to_string(s.labels.size(0)) +
                       " labels");
    return DataLoader(TensorDataset(std::move(s.data), std::move(s.labels)),
                      {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(WeightedSequence s, bool training) {
    if (!s.data.defined() || !s.labels.defined()) throw TrialError("keras::WeightedSequence needs both data and labels");
    if (!training && !s.class_weight.empty())
      throw TrialError(
          "keras::WeightedSequence: class_weight applies to training only (Keras's evaluate takes none); "
          "give the validation sequence sample_weights");
    torch::Tensor weights = detail::combined_weights(s);
    return DataLoader(TensorDataset(std::move(s.data), std::move(s.labels), std::move(weights)),
                      {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(MultiInputSequence s, bool training) {
    return DataLoader(
        detail::InputsDataset<std::vector<torch::Tensor>>(std::move(s.inputs), std::move(s.labels), "keras::MultiInputSequence"),
        {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  static auto make_loader(DictInputSequence s, bool training) {
    return DataLoader(
        detail::InputsDataset<std::map<std::string, torch::Tensor>>(std::move(s.inputs), std::move(s.labels), "keras::DictInputSequence"),
        {.batch_size = s.batch_size, .shuffle = training && s.shuffle});
  }
  template <class L>
  static constexpr bool is_sequence = std::is_same_v<L, InMemorySequence> || std::is_same_v<L, WeightedSequence> ||
                                      std::is_same_v<L, MultiInputSequence> || std::is_same_v<L, DictInputSequence>;
  template <class L>
  static auto as_loader(L loader, bool training) {
    if constexpr (is_sequence<std::remove_cvref_t<L>>) return make_loader(std::move(loader), training);
    else return loader;
  }
  /// The model's output for a batch's inputs, with one sentence when its forward cannot take them.
  template <class X>
  torch::Tensor forward(X& x) {
    static_assert(
        requires { compiled_.model->forward(x); },
        "dettrial: the Keras-style model's forward cannot take this batch's inputs: a MultiInputSequence needs "
        "forward(const std::vector<torch::Tensor>&), a DictInputSequence forward(const std::map<std::string, torch::Tensor>&)");
    return compiled_.model->forward(x);
  }
  /// Whether a batch is (inputs, labels, sample_weights): a tuple-like of three.
  template <class Batch>
  static consteval bool weighted_batch() {
    if constexpr (requires { std::tuple_size<std::remove_cvref_t<Batch>>::value; })
      return std::tuple_size_v<std::remove_cvref_t<Batch>> == 3;
    else return false;
  }
  /// Calls `step(inputs, labels, weights or null)` on a batch of two or three parts.
  template <class Batch, class Step>
  static decltype(auto) with_parts(Batch& batch, Step&& step) {
    if constexpr (weighted_batch<Batch>()) {
      auto& [x, y, w] = batch;
      return step(x, y, static_cast<const torch::Tensor*>(&w));
    } else {
      auto& [x, y] = batch;
      return step(x, y, static_cast<const torch::Tensor*>(nullptr));
    }
  }
  torch::Tensor batch_loss(const torch::Tensor& y_pred, const torch::Tensor& y, const torch::Tensor* weights) const {
    return weights ? detail::weighted_loss_value(compiled_.loss, y_pred, y, *weights) : detail::loss_value(compiled_.loss, y_pred, y);
  }

 public:
  using Compiled = std::remove_cvref_t<decltype(std::declval<K&>().build_model())>;
  /// Its epochs are records_per_epoch's, where the config sets it, as Determined's TFKerasTrial
  /// counts them (its workload sequencer's records_per_epoch // global_batch_size); a PyTorch-style
  /// trial's are its loader's.
  static constexpr bool epochs_follow_records_per_epoch = true;

  template <class... Args>
  explicit TrialAdapter(Context& context, Args&&... args)
      : context_(context), trial_(make_trial(context, std::forward<Args>(args)...)), compiled_(trial_.build_model()) {
    const auto module = module_of(compiled_.model);
    bool wrapped = false;
    for (const auto& m : context.models()) wrapped = wrapped || m.get() == module.get();
    if (!wrapped) compiled_.model = context.wrap_model(compiled_.model);
    bool optimizer_wrapped = false;
    for (std::size_t i = 0; i < context.num_optimizers(); ++i)
      optimizer_wrapped = optimizer_wrapped || &context.optimizer(i) == compiled_.optimizer.get();
    if (!optimizer_wrapped) context.wrap_optimizer(*compiled_.optimizer);
    validation_means_.names.push_back("val_loss");
    for (const CompiledMetric& m : compiled_.metrics) validation_means_.names.emplace_back(m.validation_name.view());
    context.wrap_reducer(validation_means_, {}, /*for_training=*/false);
  }

  K& trial() { return trial_; }
  Compiled& compiled() { return compiled_; }

  auto build_training_data_loader() { return as_loader(trial_.build_training_data_loader(), /*training=*/true); }
  auto build_validation_data_loader() { return as_loader(trial_.build_validation_data_loader(), /*training=*/false); }

  auto build_callbacks() {
    if constexpr (requires(K& k) { k.keras_callbacks(); }) return trial_.keras_callbacks();
    else return std::tuple<>{};
  }

  template <class Batch>
  Metrics train_batch(Batch& batch, std::int64_t, std::int64_t) {
    return with_parts(batch, [&](auto& x, const torch::Tensor& y, const torch::Tensor* weights) {
      const torch::Tensor y_pred = forward(x);
      const torch::Tensor loss = batch_loss(y_pred, y, weights);
      context_.backward(loss);
      context_.step_optimizer(*compiled_.optimizer);
      Metrics out{{"loss", loss.detach()}};
      const torch::Tensor seen = y_pred.detach();
      for (const CompiledMetric& m : compiled_.metrics) out.set(m.name, detail::metric_value(m.kind, seen, y));
      return out;
    });
  }

  template <class Batch>
  Metrics evaluate_batch(Batch& batch) {
    torch::NoGradGuard no_grad;
    return with_parts(batch, [&](auto& x, const torch::Tensor& y, const torch::Tensor* weights) {
      const torch::Tensor y_pred = forward(x);
      values_.clear();
      values_.push_back(batch_loss(y_pred, y, weights));
      for (const CompiledMetric& m : compiled_.metrics) values_.push_back(detail::metric_value(m.kind, y_pred, y));
      validation_means_.add(values_, y_pred.size(0));
      return Metrics{};  // the means are validation_means_'s
    });
  }

 private:
  template <class... Args>
  static K make_trial(Context& context, Args&&... args) {
    if constexpr (std::constructible_from<K, Context&, Args...>) return K(context, std::forward<Args>(args)...);
    else return K(std::forward<Args>(args)...);
  }

  Context& context_;
  K trial_;
  Compiled compiled_;
  detail::RecordWeightedMeans validation_means_;
  std::vector<torch::Tensor> values_;  // a batch's loss and metrics, kept to spare an allocation a batch
};

}  // namespace dettrial::keras

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <limits>

namespace dettrial::detail {

DETTRIAL_INLINE std::shared_ptr<torch::optim::Optimizer> optimizer_named(const std::string& name,
                                                                         const std::vector<torch::Tensor>& parameters) {
  namespace optim = torch::optim;
  if (name == "adam") return std::make_shared<optim::Adam>(parameters, optim::AdamOptions(1e-3).eps(1e-7));
  if (name == "sgd") return std::make_shared<optim::SGD>(parameters, optim::SGDOptions(1e-2));
  if (name == "rmsprop") return std::make_shared<optim::RMSprop>(parameters, optim::RMSpropOptions(1e-3).alpha(0.9).eps(1e-7));
  if (name == "adamw") return std::make_shared<optim::AdamW>(parameters, optim::AdamWOptions(1e-3).eps(1e-7).weight_decay(0.004));
  if (name == "adagrad")
    return std::make_shared<optim::Adagrad>(parameters, optim::AdagradOptions(1e-3).initial_accumulator_value(0.1).eps(1e-7));
  throw ConfigError("keras::compile: unknown optimizer '" + name + "'" +
                    detail::suggestion(name, {"adam", "sgd", "rmsprop", "adamw", "adagrad"}) +
                    " (by name: adam, sgd, rmsprop, adamw, adagrad; or pass an optimizer)");
}

DETTRIAL_INLINE std::vector<keras::CompiledMetric> metrics_named(const std::vector<std::string>& names, const keras::Loss& loss) {
  using Kind = keras::CompiledMetric::Kind;
  std::vector<keras::CompiledMetric> out;
  for (const std::string& name : names) {
    if (name == "loss") throw ConfigError("keras::compile: 'loss' is always reported; it is not a metric to ask for");
    Kind kind;
    if (name == "accuracy" || name == "acc") {
      // Keras picks the accuracy that fits the loss.
      if (std::holds_alternative<keras::losses::CategoricalCrossentropy>(loss)) kind = Kind::categorical_accuracy;
      else if (std::holds_alternative<keras::losses::BinaryCrossentropy>(loss)) kind = Kind::binary_accuracy;
      else kind = Kind::sparse_categorical_accuracy;
    } else if (name == "sparse_categorical_accuracy") kind = Kind::sparse_categorical_accuracy;
    else if (name == "categorical_accuracy") kind = Kind::categorical_accuracy;
    else if (name == "binary_accuracy") kind = Kind::binary_accuracy;
    else if (name == "mse" || name == "mean_squared_error") kind = Kind::mean_squared_error;
    else if (name == "mae" || name == "mean_absolute_error") kind = Kind::mean_absolute_error;
    else
      throw ConfigError(
          "keras::compile: unknown metric '" + name + "'" +
          detail::suggestion(name, {"accuracy", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy", "mse", "mae"}));
    out.push_back({kind, MetricKey(name), MetricKey("val_" + name)});
  }
  return out;
}

// Keras clips probabilities to [eps, 1 - eps] before the logarithm. Losses are computed in float32:
// under autocast the outputs may be fp16/bf16, and some losses (binary cross-entropy on
// probabilities) refuse to autocast. Both the batch loss and the per-sample one start here.
constexpr double keras_epsilon = 1e-7;
inline torch::Tensor loss_input(const torch::Tensor& output) {
  const bool low = output.scalar_type() == torch::kHalf || output.scalar_type() == torch::kBFloat16;
  return low ? output.to(torch::kFloat) : output;
}
/// Log-probabilities over the last axis, from logits or from (clipped) probabilities.
inline torch::Tensor log_probabilities(bool from_logits, const torch::Tensor& y_pred) {
  return from_logits ? torch::log_softmax(y_pred, -1) : y_pred.clamp(keras_epsilon, 1 - keras_epsilon).log();
}

DETTRIAL_INLINE torch::Tensor loss_value(const keras::Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        if constexpr (std::is_same_v<L, keras::losses::SparseCategoricalCrossentropy>) {
          // Classes on the last axis; labels of shape (N) or (N, 1) (Keras squeezes the last axis).
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return torch::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}));
        } else if constexpr (std::is_same_v<L, keras::losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1).mean();
        } else if constexpr (std::is_same_v<L, keras::losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          if (l.from_logits) return torch::binary_cross_entropy_with_logits(y_pred, target);
          return torch::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanSquaredError>) {
          return torch::mse_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else if constexpr (std::is_same_v<L, keras::losses::MeanAbsoluteError>) {
          return torch::l1_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else {
          if (!l) throw TrialError("keras::compile was given an empty custom loss");
          return l(y_pred, y_true);
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor per_sample_loss(const keras::Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        namespace F = torch::nn::functional;
        if constexpr (std::is_same_v<L, keras::losses::SparseCategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return F::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}),
                             F::NLLLossFuncOptions().reduction(torch::kNone));
        } else if constexpr (std::is_same_v<L, keras::losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          const torch::Tensor each =
              l.from_logits
                  ? F::binary_cross_entropy_with_logits(y_pred, target,
                                                        F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone))
                  : F::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target, F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
          return each.mean(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanSquaredError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).square().mean(-1);
        } else if constexpr (std::is_same_v<L, keras::losses::MeanAbsoluteError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).abs().mean(-1);
        } else {
          throw TrialError(
              "keras: a custom loss returns one number for the batch, so sample or class weights cannot weigh its "
              "samples; use one of Keras's losses, or weigh inside the custom loss");
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor weighted_loss_value(const keras::Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights) {
  const torch::Tensor each = per_sample_loss(loss, y_pred, y_true);
  // One weight per sample, broadcast over any further axes of the per-sample losses.
  std::vector<std::int64_t> shape(static_cast<std::size_t>(each.dim()), 1);
  shape[0] = each.size(0);
  const torch::Tensor weights = sample_weights.to(each.dtype()).reshape(shape);
  return (each * weights).sum() / static_cast<double>(each.numel());
}

DETTRIAL_INLINE torch::Tensor combined_weights(const keras::WeightedSequence& s) {
  const std::int64_t n = s.data.size(0);
  if (s.labels.size(0) != n)
    throw TrialError("keras::WeightedSequence has " + std::to_string(n) + " inputs but " + std::to_string(s.labels.size(0)) + " labels");
  torch::Tensor weights = torch::ones({n}, torch::kFloat);
  if (s.sample_weights.defined()) {
    if (s.sample_weights.numel() != n)
      throw TrialError("keras::WeightedSequence has " + std::to_string(n) + " inputs but " + std::to_string(s.sample_weights.numel()) +
                       " sample weights");
    weights = s.sample_weights.reshape({n}).to(torch::kFloat).cpu().clone();
  }
  if (!s.class_weight.empty()) {
    if (s.labels.dim() > 2 || (s.labels.dim() == 2 && s.labels.size(1) != 1))
      throw TrialError("keras::WeightedSequence: class_weight needs one integer label per sample (Keras's rule), not labels of shape " +
                       c10::str(s.labels.sizes()));
    const torch::Tensor labels = s.labels.reshape({n}).to(torch::kLong).cpu().contiguous();
    const auto* label = labels.data_ptr<std::int64_t>();
    auto* w = weights.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      if (const auto found = s.class_weight.find(label[i]); found != s.class_weight.end()) w[i] *= static_cast<float>(found->second);
  }
  return weights.to(s.data.device());
}

DETTRIAL_INLINE torch::Tensor metric_value(keras::CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true) {
  using Kind = keras::CompiledMetric::Kind;
  switch (kind) {
    case Kind::sparse_categorical_accuracy:
      return y_pred.argmax(-1).reshape({-1}).eq(y_true.to(torch::kLong).reshape({-1})).to(torch::kFloat).mean();
    case Kind::categorical_accuracy: return y_pred.argmax(-1).eq(y_true.argmax(-1)).to(torch::kFloat).mean();
    case Kind::binary_accuracy:
      // Keras's threshold: 0.5.
      return y_pred.gt(0.5).eq(y_true.reshape(y_pred.sizes()).gt(0.5)).to(torch::kFloat).mean();
    case Kind::mean_squared_error: return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).pow(2).mean();
    case Kind::mean_absolute_error: return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).abs().mean();
  }
  throw TrialError("keras: unknown metric kind");
}

}  // namespace dettrial::detail

namespace dettrial::keras {
DETTRIAL_INLINE void initialize_like_keras(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* linear = m->as<torch::nn::LinearImpl>()) {
      torch::nn::init::xavier_uniform_(linear->weight);
      if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
    } else if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
      torch::nn::init::xavier_uniform_(conv->weight);
      if (conv->bias.defined()) torch::nn::init::zeros_(conv->bias);
    } else if (auto* conv1 = m->as<torch::nn::Conv1dImpl>()) {
      torch::nn::init::xavier_uniform_(conv1->weight);
      if (conv1->bias.defined()) torch::nn::init::zeros_(conv1->bias);
    }
  }
}

}  // namespace dettrial::keras

#endif  // DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

/**
 * @brief A Keras-style trial (keras::KerasTrial: `build_model()` returns `keras::compile(...)`) runs
 * as the trial keras::TrialAdapter writes for it: the same loop, checkpoints, searchers and data
 * parallel; `trial()` is the user's trial.
 */
template <class K>
  requires keras::KerasTrial<K>
class Trainer<K> : public Trainer<keras::TrialAdapter<K>> {
  using Adapted = Trainer<keras::TrialAdapter<K>>;

 public:
  using Adapted::Adapted;
  K& trial() { return Adapted::trial().trial(); }
};

}  // namespace dettrial
// ---- end dettrial/keras/keras.hpp
// ---- end dettrial/keras.hpp
