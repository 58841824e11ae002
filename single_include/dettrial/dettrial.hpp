// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
// ---- begin dettrial/dettrial.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial: Determined's trial API for LibTorch, composed at compile time. Include this header.
///
/// A trial is a plain type with hooks (build_training_data_loader, build_validation_data_loader,
/// train_batch, evaluate_batch, and either build_model/optimizer or a constructor that wraps them in
/// the Context). dettrial::Trainer<MyTrial> checks them with concepts and runs Determined's loop.
/// The command line (dettrial::main: the launcher, the experiment runner) is one more, opt-in header:
/// <dettrial/main.hpp>.

// ---- begin dettrial/version.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial's version: the one place it is written (CMake reads it from here).

#define DETTRIAL_VERSION_MAJOR 0
#define DETTRIAL_VERSION_MINOR 1
#define DETTRIAL_VERSION_PATCH 0
#define DETTRIAL_VERSION_STRING "0.1.0"

namespace dettrial {
inline constexpr const char* version = DETTRIAL_VERSION_STRING;
}  // namespace dettrial
// ---- end dettrial/version.hpp

// ---- begin dettrial/error.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The exceptions dettrial throws. Every message names the thing at fault.

#include <stdexcept>
#include <string>

namespace dettrial {

/// Base of every error dettrial reports; `what()` is one readable sentence.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// A broken, unreadable or inconsistent experiment configuration.
struct ConfigError : Error {
  using Error::Error;
};
/// A hyperparameter that is missing or has the wrong type.
struct HyperparameterError : Error {
  using Error::Error;
};
/// Data that cannot be read or does not have the expected shape.
struct DataError : Error {
  using Error::Error;
};
/// An image file that cannot be decoded: unreadable, truncated, corrupt, not an image, or of a kind
/// this build has no decoder for. The message names the file and the decoder's reason.
struct ImageError : DataError {
  using DataError::DataError;
};
/// A checkpoint that cannot be written or read: missing, truncated, corrupt, from another model or
/// from a newer dettrial. The message names the file and, for a mismatch, the entry.
struct CheckpointError : Error {
  using Error::Error;
};
/// A trial that breaks the contract at run time (metrics without `loss`, an unwrapped optimizer, ...).
struct TrialError : Error {
  using Error::Error;
};
/// A collective that failed or timed out: another rank died, hung or is unreachable.
struct DistributedError : Error {
  using Error::Error;
};
/// A run or experiment folder that another live process is writing into (it holds the folder's
/// lock); the message names that process's pid and host.
struct FolderInUseError : Error {
  using Error::Error;
};

}  // namespace dettrial
// ---- end dettrial/error.hpp
// ---- begin dettrial/layout.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The names dettrial gives its files and folders: one source of truth for the on-disk
/// layout of a run, a checkpoint and an experiment (the checkpoint's names are Determined's).

#include <cstdint>
#include <filesystem>
#include <string>

namespace dettrial::layout {

// A run's folder (`--output`).
/// Every report, one JSON object a line.
inline constexpr const char* metrics_log = "metrics.jsonl";
/// The training and validation reports as a table, one row each.
inline constexpr const char* metrics_csv = "metrics.csv";
/// The run's checkpoints, one folder each, named by uuid.
inline constexpr const char* checkpoints = "checkpoints";
/// TensorBoard's event files and the profiler's traces.
inline constexpr const char* tensorboard = "tensorboard";
/// The page `--report` writes (a run's, or an experiment's).
inline constexpr const char* report_page = "report.html";
/// The profiler's trace (the config's profiling section; rank r > 0 writes `trace.rank<r>.json`).
inline constexpr const char* trace = "trace.json";
/// A trial's output (its stdout and stderr), in an experiment.
inline constexpr const char* trial_log = "log.txt";

// A checkpoint's folder (Determined's names, and dettrial's own archive).
/// Models, optimizers, schedulers, callbacks and RNG states, as Python's torch.save writes them.
inline constexpr const char* state_dict = "state_dict.pth";
/// LibTorch's own archive of the optimizers (read where the Python layout cannot say everything).
inline constexpr const char* libtorch_state = "dettrial_state.pt";
/// Where the trial stands: batches and epochs trained, its data seeds, its last validation.
inline constexpr const char* trial_state = "trial_state.json";
/// Where the trial stands, as Determined's PyTorchTrial pickles it (its `_TrialState`): what
/// Determined reads to continue a checkpoint, and what dettrial reads in one Determined wrote.
inline constexpr const char* determined_trial_state = "trial_state.pkl";
/// The experiment config and hyperparameters the checkpoint was written under.
inline constexpr const char* load_data = "load_data.json";
/// The checkpoint's metadata (format, steps completed, files and their checksums).
inline constexpr const char* metadata = "metadata.json";

/// A run's or an experiment's lock: an advisory flock held while a process writes into the folder,
/// its text the holder's pid and host.
inline constexpr const char* lock = ".lock";

// An experiment's folder.
/// The experiment's config; each trial's folder holds its own.
inline constexpr const char* config = "config.yaml";
/// One folder per trial, named by its id.
inline constexpr const char* trials = "trials";
/// The searcher's events, one JSON object a line (an interrupted experiment continues from them).
inline constexpr const char* events_log = "events.jsonl";
/// Every trial's state and best metric at the end.
inline constexpr const char* summary = "summary.json";
/// The experiment's id (drawn when its folder is new, so a continued experiment keeps it).
inline constexpr const char* experiment_id = "experiment.json";

}  // namespace dettrial::layout

namespace dettrial {

/// A run's folder (`--output`, or a trial's folder in an experiment) and the paths of what dettrial
/// writes in it.
struct RunFolder {
  std::filesystem::path dir;

  std::filesystem::path metrics_log() const { return dir / layout::metrics_log; }
  std::filesystem::path metrics_csv() const { return dir / layout::metrics_csv; }
  std::filesystem::path checkpoints() const { return dir / layout::checkpoints; }
  std::filesystem::path tensorboard() const { return dir / layout::tensorboard; }
  std::filesystem::path report_page() const { return dir / layout::report_page; }
  /// Rank `rank`'s profiler trace.
  std::filesystem::path trace(int rank) const {
    return rank == 0 ? dir / layout::trace : dir / ("trace.rank" + std::to_string(rank) + ".json");
  }
  /// A trial's output, in an experiment.
  std::filesystem::path trial_log() const { return dir / layout::trial_log; }
  /// A trial's experiment config (written into its folder by the experiment).
  std::filesystem::path config() const { return dir / layout::config; }
  std::filesystem::path lock() const { return dir / layout::lock; }
};

/// A checkpoint's folder (Determined's layout) and the paths of its files.
struct CheckpointFolder {
  std::filesystem::path dir;

  std::filesystem::path state_dict() const { return dir / layout::state_dict; }
  std::filesystem::path libtorch_state() const { return dir / layout::libtorch_state; }
  std::filesystem::path trial_state() const { return dir / layout::trial_state; }
  std::filesystem::path determined_trial_state() const { return dir / layout::determined_trial_state; }
  std::filesystem::path load_data() const { return dir / layout::load_data; }
  std::filesystem::path metadata() const { return dir / layout::metadata; }
};

/// An experiment's folder and the paths of what its runner writes in it.
struct ExperimentFolder {
  std::filesystem::path dir;

  std::filesystem::path config() const { return dir / layout::config; }
  std::filesystem::path trials() const { return dir / layout::trials; }
  /// Trial `id`'s run folder.
  RunFolder trial(std::int64_t id) const { return {trials() / std::to_string(id)}; }
  std::filesystem::path events_log() const { return dir / layout::events_log; }
  std::filesystem::path summary() const { return dir / layout::summary; }
  std::filesystem::path report_page() const { return dir / layout::report_page; }
  std::filesystem::path experiment_id() const { return dir / layout::experiment_id; }
  std::filesystem::path lock() const { return dir / layout::lock; }
};

}  // namespace dettrial
// ---- end dettrial/layout.hpp

// ---- begin dettrial/config/experiment_config.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's experiment configuration (the fields a single machine gives meaning to).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>

#include <yaml-cpp/yaml.h>

// ---- begin dettrial/detail/yaml.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Small helpers over yaml-cpp: positions for messages, typed reads that name the value at fault.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <algorithm>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <yaml-cpp/yaml.h>

// ---- begin dettrial/detail/linkage.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Header-only (the default) or separate compilation: where dettrial's non-template code is compiled.
///
/// Header-only, every function is `inline` and compiled in each translation unit that uses it. With
/// `DETTRIAL_SEPARATE_COMPILATION` defined in every translation unit of a program (the CMake target
/// `dettrial::compiled` does it), the headers declare the non-template functions only and
/// <dettrial/src.hpp>, included in one source file, compiles them once: a trial's translation unit
/// then instantiates the loop for its own trial and nothing else (the way Asio and fmt offer it).

#define DETTRIAL_DETAIL_LINKAGE_INCLUDED 1

#if defined(DETTRIAL_SEPARATE_COMPILATION)
/// Marks a non-template function defined in a header's definitions section.
#define DETTRIAL_INLINE
#if defined(DETTRIAL_COMPILING_DEFINITIONS)
#define DETTRIAL_HEADER_DEFINITIONS 1
#else
#define DETTRIAL_HEADER_DEFINITIONS 0
#endif
#else
#define DETTRIAL_INLINE inline
/// 1 where a header's definitions section is compiled: always header-only, in <dettrial/src.hpp> otherwise.
#define DETTRIAL_HEADER_DEFINITIONS 1
#endif
// ---- end dettrial/detail/linkage.hpp

namespace dettrial::detail {

/**
 * @brief A YAML::Node data member that assignment rebinds. yaml-cpp's `Node::operator=` writes into
 * the node it refers to, and so into a document that other copies share; with members of this type
 * a class copies and assigns its nodes as values and keeps the compiler's copy assignment (no
 * hand-written one that a new member could be forgotten in).
 */
class YamlMember : public YAML::Node {
 public:
  using YAML::Node::Node;
  YamlMember() = default;
  YamlMember(const YAML::Node& node) : YAML::Node(node) {}  // implicit, as a Node is
  YamlMember(const YamlMember&) = default;
  YamlMember& operator=(const YamlMember& other) {
    reset(other);
    return *this;
  }
  YamlMember& operator=(const YAML::Node& other) {
    reset(other);
    return *this;
  }
};

/// "file:line:column" of a node (1-based), or just the source name when yaml-cpp has no position.
DETTRIAL_INLINE std::string where(const YAML::Node& node, const std::string& source);

/// A human name for the C++ type a value was read as.
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (
      requires {
        typename T::value_type;
        typename T::allocator_type;
      } && !requires { typename T::key_type; })
    return "list of " + type_name<typename T::value_type>();
  else if constexpr (requires {
                       typename T::key_type;
                       typename T::mapped_type;
                     })
    return "map of " + type_name<typename T::mapped_type>();
  else if constexpr (std::is_same_v<T, YAML::Node>) return "YAML node";
  else return typeid(T).name();
}

/// What a YAML node holds, for messages: `0.1`, `"abc"`, `a list`, `a map`.
DETTRIAL_INLINE std::string describe(const YAML::Node& node);

/// Reads `node` as T; integers are not silently truncated from fractions, and `1e3`-style
/// integers are accepted when exact. Returns false when the value does not convert.
template <class T>
bool try_read(const YAML::Node& node, T& out) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!node.IsScalar()) return false;
    if (YAML::convert<T>::decode(node, out)) return true;
    double d = 0;
    if (!YAML::convert<double>::decode(node, d) || !std::isfinite(d)) return false;
    if (d < static_cast<double>(std::numeric_limits<T>::lowest()) || d > static_cast<double>(std::numeric_limits<T>::max())) return false;
    const auto i = static_cast<T>(d);
    if (static_cast<double>(i) != d) return false;
    out = i;
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!node.IsScalar()) return false;
    out = node.Scalar();
    return true;
  } else {
    try {
      out = node.as<T>();
      return true;
    } catch (const YAML::Exception&) {
      return false;
    }
  }
}

/// Edit distance between two names (for "did you mean").
DETTRIAL_INLINE std::size_t edit_distance(const std::string& a, const std::string& b);

/// "; did you mean 'x'?" for the nearest of `names` (at most a third of the name's letters apart), else "".
DETTRIAL_INLINE std::string suggestion(const std::string& name, const std::vector<std::string>& names);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE std::string where(const YAML::Node& node, const std::string& source) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

DETTRIAL_INLINE std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "nothing";
  }
}

DETTRIAL_INLINE std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

DETTRIAL_INLINE std::string suggestion(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = name.size() / 3 + 1;
  for (const auto& n : names)
    if (const std::size_t d = edit_distance(name, n); d <= best_distance && (best.empty() || d < edit_distance(name, best))) best = n;
  return best.empty() ? std::string() : "; did you mean '" + best + "'?";
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/yaml.hpp
// ---- begin dettrial/config/units.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Training lengths and periods: Batch, Epoch and Record, with Determined's boundary rule.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>


namespace dettrial {

/// The unit a length or a period is counted in.
enum class Unit { batches, epochs, records };

DETTRIAL_INLINE const char* to_string(Unit u);

/**
 * @brief A length or a period: an integer count of a unit, or an explicit schedule of points.
 *
 * As in Determined, a period `p` is reached after `n` units when `n % p == 0`; `n == 0` never reaches
 * it, a period below 1 is reached on every unit, and a schedule is reached exactly at its points.
 * Use the named forms: `Batch{100}`, `Epoch{2}`, `Record{60000}`, `Batch::at({10, 50})`.
 */
class TrainUnit {
 public:
  static constexpr std::int64_t never_value = std::numeric_limits<std::int64_t>::max();

  constexpr TrainUnit(Unit unit, std::int64_t value) : unit_(unit), value_(value) {}
  TrainUnit(Unit unit, std::vector<std::int64_t> points);

  constexpr Unit unit() const { return unit_; }
  /// The period (or, for a schedule, its last point).
  constexpr std::int64_t value() const { return value_; }
  bool is_schedule() const { return !points_.empty(); }
  const std::vector<std::int64_t>& points() const { return points_; }
  bool is_never() const { return points_.empty() && value_ == never_value; }

  /// Determined's `should_stop(n)`: is the boundary reached after `n` completed units?
  bool reached(std::int64_t n) const;

  /// Records become batches of `global_batch_size`, at least one (Determined's `_from_values`).
  TrainUnit in_batches_if_records(std::int64_t global_batch_size) const;

  std::string to_string() const;

  friend bool operator==(const TrainUnit&, const TrainUnit&) = default;

 private:
  Unit unit_;
  std::int64_t value_ = never_value;
  std::vector<std::int64_t> points_;
};

/// A count or period in batches (optimizer-agnostic: one batch is one call of `train_batch`).
struct Batch : TrainUnit {
  constexpr explicit Batch(std::int64_t n) : TrainUnit(Unit::batches, n) {}
  static TrainUnit at(std::vector<std::int64_t> points) { return TrainUnit(Unit::batches, std::move(points)); }
};
/// A count or period in epochs (an epoch is the training loader's length, in batches).
struct Epoch : TrainUnit {
  constexpr explicit Epoch(std::int64_t n) : TrainUnit(Unit::epochs, n) {}
  static TrainUnit at(std::vector<std::int64_t> points) { return TrainUnit(Unit::epochs, std::move(points)); }
};
/// A count or period in records, converted to batches of the global batch size at the start of fit.
struct Record : TrainUnit {
  constexpr explicit Record(std::int64_t n) : TrainUnit(Unit::records, n) {}
};

/// A period that is never reached.
inline TrainUnit never() { return Batch(TrainUnit::never_value); }

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* to_string(Unit u) {
  switch (u) {
    case Unit::batches: return "batches";
    case Unit::epochs: return "epochs";
    case Unit::records: return "records";
  }
  return "?";
}

DETTRIAL_INLINE TrainUnit::TrainUnit(Unit unit, std::vector<std::int64_t> points) : unit_(unit), points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
  value_ = points_.empty() ? never_value : points_.back();
}

DETTRIAL_INLINE bool TrainUnit::reached(std::int64_t n) const {
  if (!points_.empty()) return std::binary_search(points_.begin(), points_.end(), n);
  if (n == 0) return false;
  if (value_ < 1) return true;
  return n % value_ == 0;
}

DETTRIAL_INLINE TrainUnit TrainUnit::in_batches_if_records(std::int64_t global_batch_size) const {
  if (unit_ != Unit::records) return *this;
  if (global_batch_size < 1) throw ConfigError("a length in records needs a global_batch_size of at least 1");
  if (!points_.empty()) {
    std::vector<std::int64_t> pts;
    for (auto p : points_) pts.push_back(std::max<std::int64_t>(p / global_batch_size, 1));
    return TrainUnit(Unit::batches, std::move(pts));
  }
  if (value_ == never_value) return TrainUnit(Unit::batches, never_value);
  return TrainUnit(Unit::batches, std::max<std::int64_t>(value_ / global_batch_size, 1));
}

DETTRIAL_INLINE std::string TrainUnit::to_string() const {
  if (is_never()) return "never";
  if (!points_.empty()) {
    std::string s = std::string(dettrial::to_string(unit_)) + " at [";
    for (std::size_t i = 0; i < points_.size(); ++i) s += (i ? ", " : "") + std::to_string(points_[i]);
    return s + "]";
  }
  return std::to_string(value_) + " " + dettrial::to_string(unit_);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/config/units.hpp
// ---- begin dettrial/config/hyperparameters.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A trial's hyperparameters: typed, nested, with errors that name the key and the value.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/**
 * @brief The hyperparameters of one trial, as a YAML map (Determined's `hyperparameters` section with
 * every value resolved).
 *
 * Nested values are reached with dotted paths (`optimizer.lr`); a key that itself contains a dot is
 * found first. Reads are typed: `get<double>("lr")` fails with a HyperparameterError that names the
 * key, the value found and where it was written when the value does not convert.
 * @code{.cpp}
 * auto hp = dettrial::Hyperparameters::parse("lr: 0.1\noptimizer: {momentum: 0.9}");
 * double lr = hp.get<double>("lr");
 * double m = hp.get<double>("optimizer.momentum");
 * @endcode
 */
class Hyperparameters {
 public:
  Hyperparameters() : root_(YAML::NodeType::Map) {}
  /// Wraps a YAML map; `source` names where it came from in messages (a file name, "--set").
  explicit Hyperparameters(YAML::Node map, std::string source = "hyperparameters");
  // yaml-cpp's Node::operator= writes through to the node it refers to (which others may share);
  // assigning Hyperparameters rebinds instead.
  Hyperparameters(const Hyperparameters&) = default;
  Hyperparameters& operator=(const Hyperparameters& other);

  /// Parses YAML text such as `"lr: 0.1\nglobal_batch_size: 64"`.
  static Hyperparameters parse(const std::string& yaml_text, std::string source = "hyperparameters");

  /// True when `path` names a value.
  bool contains(std::string_view path) const { return lookup(path).IsDefined(); }

  /// The value at `path` as T; throws HyperparameterError naming the key when it is missing or mistyped.
  template <class T>
  T get(std::string_view path) const;

  /// The value at `path` as T, or `fallback` when it is absent (a present but mistyped value still throws).
  template <class T>
  T get_or(std::string_view path, T fallback) const {
    return contains(path) ? get<T>(path) : std::move(fallback);
  }

  /// The nested hyperparameters under `path` (which must be a map).
  Hyperparameters nested(std::string_view path) const;

  /// The raw YAML node at `path`; throws when missing.
  YAML::Node node(std::string_view path) const { return require(path); }
  /// The whole map.
  const YAML::Node& yaml() const { return root_; }
  /// Top-level names, in file order.
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }

 private:
  YAML::Node lookup(std::string_view path) const;

  YAML::Node require(std::string_view path) const;

  YAML::Node root_;
  std::string source_ = "hyperparameters";
};

// Not inline, so that the explicit instantiations below keep a trial's translation unit from compiling it.
template <class T>
T Hyperparameters::get(std::string_view path) const {
  const YAML::Node node = require(path);
  T value{};
  if (!detail::try_read(node, value))
    throw HyperparameterError(detail::where(node, source_) + ": hyperparameter '" + std::string(path) + "' is " + detail::describe(node) +
                              ", which is not a " + detail::type_name<T>());
  return value;
}

// The common value types are read once, in dettrial::compiled (separate compilation): a trial's
// translation unit then compiles no YAML conversion for them.
#if defined(DETTRIAL_SEPARATE_COMPILATION)
#if DETTRIAL_HEADER_DEFINITIONS
#define DETTRIAL_HPARAM_TYPE(T) template T Hyperparameters::get<T>(std::string_view) const;
#else
#define DETTRIAL_HPARAM_TYPE(T) extern template T Hyperparameters::get<T>(std::string_view) const;
#endif
DETTRIAL_HPARAM_TYPE(double)
DETTRIAL_HPARAM_TYPE(float)
DETTRIAL_HPARAM_TYPE(int)
DETTRIAL_HPARAM_TYPE(std::int64_t)
DETTRIAL_HPARAM_TYPE(bool)
DETTRIAL_HPARAM_TYPE(std::string)
#undef DETTRIAL_HPARAM_TYPE
#endif

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE Hyperparameters::Hyperparameters(YAML::Node map, std::string source)
    : root_(map.IsDefined() && !map.IsNull() ? map : YAML::Node(YAML::NodeType::Map)), source_(std::move(source)) {
  if (!root_.IsMap())
    throw HyperparameterError(detail::where(root_, source_) + ": hyperparameters must be a map of name: value, found " +
                              detail::describe(root_));
}

DETTRIAL_INLINE Hyperparameters& Hyperparameters::operator=(const Hyperparameters& other) {
  root_.reset(other.root_);
  source_ = other.source_;
  return *this;
}

DETTRIAL_INLINE Hyperparameters Hyperparameters::parse(const std::string& yaml_text, std::string source) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    return Hyperparameters(std::move(root), source);
  } catch (const YAML::ParserException& e) {
    throw HyperparameterError(source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                              ": YAML syntax error: " + e.msg);
  }
}

DETTRIAL_INLINE Hyperparameters Hyperparameters::nested(std::string_view path) const {
  const YAML::Node node = require(path);
  if (!node.IsMap())
    throw HyperparameterError(detail::where(node, source_) + ": hyperparameter '" + std::string(path) + "' is " + detail::describe(node) +
                              ", not a nested map");
  return Hyperparameters(node, source_);
}

DETTRIAL_INLINE std::vector<std::string> Hyperparameters::names() const {
  std::vector<std::string> out;
  for (const auto& kv : root_) out.push_back(kv.first.Scalar());
  return out;
}

DETTRIAL_INLINE YAML::Node Hyperparameters::lookup(std::string_view path) const {
  // yaml-cpp's operator[] on a non-const node inserts; clone-free lookups go through const nodes.
  const YAML::Node& root = root_;
  if (YAML::Node whole = root[std::string(path)]; whole.IsDefined()) return whole;
  YAML::Node current(root_);  // shares root_'s data; reset() rebinds it without writing
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t dot = path.find('.', start);
    const std::string part(path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (!current.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& as_const = current;
    YAML::Node next = as_const[part];
    if (!next.IsDefined()) return next;
    current.reset(next);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return current;
}

DETTRIAL_INLINE YAML::Node Hyperparameters::require(std::string_view path) const {
  YAML::Node node = lookup(path);
  if (!node.IsDefined()) {
    std::string known;
    for (const auto& name : names()) known += (known.empty() ? "" : ", ") + name;
    throw HyperparameterError("hyperparameter '" + std::string(path) + "' is missing from " + source_ +
                              (known.empty() ? " (it defines none)" : " (it defines: " + known + ")"));
  }
  return node;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/config/hyperparameters.hpp
// ---- begin dettrial/config/searcher_settings.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The searcher section of an experiment config (`searcher:`), as one type: the config reads
/// it, the searchers and the experiment runner use it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// ---- begin dettrial/vocabulary/metric_order.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::MetricOrder, the one "is this metric better" rule; needs no LibTorch, so the report
/// pages use it too.

#include <optional>

namespace dettrial {

/**
 * @brief Which way a searcher metric improves: the one rule for "is this metric better", used by
 * `checkpoint_policy: best`, checkpoint retention's best checkpoints, a search's best trial and
 * checkpoint, the search's report page and Keras's monitoring callbacks. A tie is not an improvement.
 */
struct MetricOrder {
  bool smaller_is_better = true;
  /// Whether `a` is strictly better than `b`.
  bool better(double a, double b) const { return smaller_is_better ? a < b : a > b; }
  /// Whether `a` is better than `b` by more than `margin` (Keras's `min_delta`).
  bool better_by(double a, double b, double margin) const { return smaller_is_better ? a + margin < b : a - margin > b; }
  /// Whether `candidate` improves on `best` (with nothing so far, it does).
  bool improves(double candidate, const std::optional<double>& best) const { return !best || better(candidate, *best); }
  /// Whether `candidate` improves on `best` by more than `margin`.
  bool improves_by(double candidate, const std::optional<double>& best, double margin) const {
    return !best || better_by(candidate, *best, margin);
  }
};

}  // namespace dettrial
// ---- end dettrial/vocabulary/metric_order.hpp

namespace dettrial {

/// The searchers dettrial runs (Determined's `searcher.name`; `async_halving` is read as
/// adaptive_asha with one bracket).
enum class SearcherKind { single, random, grid, adaptive_asha };

/// The name Determined's configs give the searcher.
constexpr std::string_view to_string(SearcherKind kind) {
  switch (kind) {
    case SearcherKind::single: return "single";
    case SearcherKind::random: return "random";
    case SearcherKind::grid: return "grid";
    case SearcherKind::adaptive_asha: return "adaptive_asha";
  }
  return "single";
}

/// Every searcher dettrial runs, in the order its messages list them.
inline constexpr SearcherKind searcher_kinds[] = {SearcherKind::single, SearcherKind::random, SearcherKind::grid,
                                                  SearcherKind::adaptive_asha};

/// The searcher of that name, or nullopt for one dettrial does not run.
constexpr std::optional<SearcherKind> searcher_kind_named(std::string_view name) {
  for (SearcherKind kind : searcher_kinds)
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

/// The checked `searcher:` section of an experiment config.
struct SearcherSettings {
  SearcherKind kind = SearcherKind::single;
  std::string metric;
  bool smaller_is_better = true;
  /// `searcher.max_length`, or the legacy `max_steps` converted to batches.
  std::optional<TrainUnit> max_length;
  /// random, grid, adaptive_asha: how many trials, and how many run at once (0: no limit).
  std::int64_t max_trials = 1;
  std::int64_t max_concurrent_trials = 16;
  /// adaptive_asha: the time a trial gets (in `time_metric`, a validation metric such as
  /// `batches`), the rungs' divisor, the most rungs, the bracket mode and explicit bracket rungs.
  std::string time_metric = "batches";
  std::int64_t max_time = 0;
  double divisor = 4;
  std::int64_t max_rungs = 5;
  std::string mode = "standard";
  std::vector<std::int64_t> bracket_rungs;

  /// The searcher's name as configs write it.
  std::string_view name() const { return to_string(kind); }
  /// Which way `metric` improves.
  MetricOrder order() const { return MetricOrder{smaller_is_better}; }
  /// How long a single, random or grid trial trains, in `max_length`'s unit (0 without one).
  std::int64_t length() const { return max_length ? max_length->value() : 0; }
};

}  // namespace dettrial
// ---- end dettrial/config/searcher_settings.hpp
// ---- begin dettrial/config/precision.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The precision of a trial's forward passes (`optimizations.mixed_precision`).

#include <string>


namespace dettrial {

/// fp32 (autocast off), or autocast to bf16 or to fp16 (with a gradient scaler).
enum class Precision { fp32, bf16, fp16 };

DETTRIAL_INLINE const char* to_string(Precision p);

/// `optimizations.mixed_precision`: O0 / fp32 (off), bf16, fp16, and Apex's O1 read as fp16 autocast
/// (what O1 amounts to). Apex's O2 and O3 (fp16 master weights) and anything else are a ConfigError.
DETTRIAL_INLINE Precision parse_precision(const std::string& text);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

DETTRIAL_INLINE Precision parse_precision(const std::string& text) {
  if (text == "O0" || text == "fp32" || text == "off") return Precision::fp32;
  if (text == "bf16" || text == "bfloat16") return Precision::bf16;
  if (text == "fp16" || text == "float16" || text == "O1") return Precision::fp16;
  if (text == "O2" || text == "O3")
    throw ConfigError("mixed_precision '" + text +
                      "' is Apex's fp16 master weights, which dettrial does not do; "
                      "use O1 or fp16 (autocast with a gradient scaler), or bf16");
  throw ConfigError("mixed_precision is '" + text + "'; expected O0 (off), fp16 (or O1) or bf16");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/config/precision.hpp
// ---- begin dettrial/config/step_capture.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How the training step runs: eagerly, or captured once as a CUDA graph and replayed
/// (`optimizations.step_capture`, FitOptions::step_capture).

#include <cstdint>
#include <string>
#include <variant>


namespace dettrial {
namespace capture {

/// Every batch runs eagerly: the trial's hooks, backward and the optimizer step, kernel by kernel.
struct none {
  static constexpr const char* name = "none";
};

/**
 * @brief The whole training step (train_batch, backward, gradient clipping, the optimizer step) is
 * captured once in a CUDA graph after `warmup_batches` eager batches, and replayed for every later
 * batch of the same shapes; each batch is copied into the graph's input buffers first. Boundaries
 * (validation, checkpoints, reports, callbacks) run outside the graph.
 *
 * Needs a CUDA device, one process, aggregation_frequency 1, no fp16 gradient scaler (bf16 autocast
 * is fine) and optimizers that read their learning rate on the device (dettrial::optim::FusedSGD,
 * FusedAdam, FusedAdamW); the trainer refuses anything else at the start, in one sentence. A batch of
 * other shapes (the last, partial batch of an epoch) runs eagerly.
 */
struct cuda_graph {
  static constexpr const char* name = "cuda_graph";
  /// Eager batches before the capture, on the capture's stream (they make the optimizer's state and
  /// the libraries' workspaces, which a capture cannot). At least 1.
  std::int64_t warmup_batches = 3;
};

}  // namespace capture

/// capture::none or capture::cuda_graph.
using StepCapture = std::variant<capture::none, capture::cuda_graph>;

/// `optimizations.step_capture`: none, or cuda_graph (with `capture_warmup_batches` eager batches first).
DETTRIAL_INLINE StepCapture parse_step_capture(const std::string& text, std::int64_t warmup_batches);

/// The name of a step capture, for messages.
inline const char* to_string(const StepCapture& c) {
  return std::visit([](const auto& p) { return p.name; }, c);
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE StepCapture parse_step_capture(const std::string& text, std::int64_t warmup_batches) {
  if (warmup_batches < 1)
    throw ConfigError("capture_warmup_batches is " + std::to_string(warmup_batches) +
                      "; a capture needs at least 1 eager batch before it (it makes the optimizer's state)");
  if (text == "none" || text == "off") return capture::none{};
  if (text == "cuda_graph") return capture::cuda_graph{.warmup_batches = warmup_batches};
  throw ConfigError("step_capture is '" + text + "'; expected none or cuda_graph");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/config/step_capture.hpp
// ---- begin dettrial/config/tracking.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Where a run is tracked: the experiment config's `mlflow` section, completed by MLflow's
/// own environment variables.

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace dettrial {

namespace detail {
/// Environment variable `name`'s value, empty when unset.
inline std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}
}  // namespace detail

/**
 * @brief An MLflow tracking server and how a run appears in it (the `mlflow` section of an
 * experiment config). Tracking is on when `tracking_uri` is set, by the config or by
 * `MLFLOW_TRACKING_URI`.
 */
struct MlflowSettings {
  /// The server, `http://` or `https://` (MLFLOW_TRACKING_URI when the config gives none).
  std::string tracking_uri;
  /// The MLflow experiment the runs go into (MLFLOW_EXPERIMENT_NAME, else the experiment config's
  /// `name`, else "Default").
  std::string experiment_name;
  /// The run's name in MLflow (else the run folder's name, or "trial N" in a search).
  std::string run_name;
  /// Tags set on every run, besides dettrial's own.
  std::vector<std::pair<std::string, std::string>> tags;
  /// A search's run, whose child this run is (the runner passes it to its trials).
  std::string parent_run_id;
  /// The experiment config's text, kept as the run's artifact `config.yaml`.
  std::string config_text;

  bool enabled() const { return !tracking_uri.empty(); }

  /// Fills what the config left unset from MLflow's environment variables (and a search's parent
  /// run from its runner's).
  void complete_from_environment() {
    if (tracking_uri.empty()) tracking_uri = detail::environment_value("MLFLOW_TRACKING_URI");
    if (experiment_name.empty()) experiment_name = detail::environment_value("MLFLOW_EXPERIMENT_NAME");
    if (parent_run_id.empty()) parent_run_id = detail::environment_value(parent_run_variable);
    while (!tracking_uri.empty() && tracking_uri.back() == '/') tracking_uri.pop_back();
  }

  /// The variable a search's runner passes its MLflow run id to its trials in.
  static constexpr const char* parent_run_variable = "DETTRIAL_MLFLOW_PARENT_RUN_ID";
};

}  // namespace dettrial
// ---- end dettrial/config/tracking.hpp

namespace dettrial {

/// When to checkpoint right after a validation (Determined's `checkpoint_policy`).
enum class CheckpointPolicy { best, all, none };

DETTRIAL_INLINE const char* to_string(CheckpointPolicy p);

/**
 * @brief An experiment configuration in Determined's YAML schema.
 *
 * Reads the fields that mean something without a cluster, with Determined's defaults, including the
 * legacy `searcher.max_steps` (counted in steps of `scheduling_unit` batches). Errors carry
 * `file:line:column`.
 */
class ExperimentConfig {
 public:
  std::string name;
  std::string description;
  /// The search space or values, as written (`hyperparameters`).
  detail::YamlMember hyperparameters{YAML::NodeType::Map};
  /// The free-form `data` section.
  detail::YamlMember data{YAML::NodeType::Map};

  /// The `searcher:` section.
  SearcherSettings searcher;
  /// Fields that mean something only on a Determined cluster (entrypoint, environment, ...): accepted
  /// and ignored, listed here for one warning.
  std::vector<std::string> ignored_fields;

  std::int64_t scheduling_unit = 100;
  std::int64_t records_per_epoch = 0;
  std::optional<TrainUnit> min_validation_period;
  std::optional<TrainUnit> min_checkpoint_period;
  bool perform_initial_validation = false;
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  std::int64_t max_restarts = 5;
  std::int64_t slots_per_trial = 1;
  std::int64_t aggregation_frequency = 1;
  /// `optimizations.mixed_precision`: autocast (and for fp16 a gradient scaler) around forward passes.
  Precision mixed_precision = Precision::fp32;
  /// `optimizations.step_capture` (dettrial's): none, or cuda_graph to capture the training step once
  /// and replay it (with `optimizations.capture_warmup_batches` eager batches first, default 3).
  StepCapture step_capture = capture::none{};
  bool average_aggregated_gradients = true;
  std::optional<std::uint64_t> experiment_seed;
  /// `reproducibility.deterministic` (dettrial's): LibTorch's deterministic algorithms on, cuDNN's
  /// autotuner off, so that runs with one seed are bit-identical on a GPU too. Unset: LibTorch's defaults.
  std::optional<bool> deterministic;
  /// `reproducibility.rank_invariant` (dettrial's): gradients summed over the micro-batches of an
  /// update in the data stream's order, and each micro-batch's random draws seeded by its place in
  /// the stream, so that the same per-slot batch and seed give bit-identical parameters on CPU
  /// whatever the ranks x aggregation_frequency layout. See docs/distributed.md for its cost.
  bool rank_invariant = false;
  /// `checkpoint_storage`: where checkpoints go (`host_path`/`storage_path` of shared_fs, or
  /// `container_path` of directory storage; unset means the run's output directory) and how many are kept.
  struct CheckpointStorage {
    std::optional<std::filesystem::path> path;
    std::int64_t save_experiment_best = 0;
    std::int64_t save_trial_best = 1;
    std::int64_t save_trial_latest = 1;
    /// `async` (dettrial's): checkpoints are written by a background thread from a snapshot in host
    /// memory while training goes on; false writes them in the step loop.
    bool async = true;
  } checkpoint_storage;
  /// `profiling`: LibTorch's profiler over the global batches `begin_on_batch` to `end_after_batch`
  /// (inclusive; unset: to the end of training), written as a Chrome trace; `sync_timings` waits for
  /// the GPU at each phase so that per-phase timings are the GPU's, not the host's launch times.
  struct Profiling {
    bool enabled = false;
    std::int64_t begin_on_batch = 0;
    std::optional<std::int64_t> end_after_batch;
    bool sync_timings = true;
  } profiling;
  /// `slurm.sbatch_args`: the options a search run with `--launcher slurm` gives srun for each
  /// trial's job (--partition, --account, --time, --gres, ...).
  std::vector<std::string> slurm_args;
  /// `mlflow` (dettrial's): the MLflow server runs are tracked in (`tracking_uri`), their MLflow
  /// experiment (`experiment_name`, default the config's `name`), run name and extra `tags`.
  MlflowSettings mlflow;

  /// The whole document, for `get_experiment_config()`.
  detail::YamlMember yaml{YAML::NodeType::Map};
  /// Where it came from (file name or "<string>"), for messages.
  std::string source = "<string>";

  /// Reads and parses a file; a missing or unreadable file is a ConfigError naming it.
  static ExperimentConfig load_file(const std::filesystem::path& path);

  /// Parses YAML text; `source` names it in messages.
  static ExperimentConfig parse(const std::string& text, std::string source = "<string>");

  static ExperimentConfig from_yaml(const YAML::Node& root, std::string source);

  /// The names of dettrial's searchers, for "did you mean" hints.
  static std::vector<std::string> searcher_names() {
    std::vector<std::string> names;
    for (SearcherKind kind : searcher_kinds) names.emplace_back(to_string(kind));
    return names;
  }

  /// The searchers dettrial runs, and the names Determined removed.
  template <class R>  // the Reader, declared below
  static void read_search_fields(const YAML::Node& s, const std::string& source, const R& r, const std::string& name,
                                 SearcherSettings& out) {
    if (name == "adaptive" || name == "adaptive_simple" || name == "sync_halving")
      throw ConfigError(detail::where(s["name"], source) + ": searcher '" + name + "' was removed from Determined; use adaptive_asha");
    if (name != "async_halving" && !searcher_kind_named(name))
      throw ConfigError(detail::where(s["name"], source) + ": unknown searcher '" + name + "'" +
                        detail::suggestion(name, searcher_names()) + " (dettrial runs single, random, grid and adaptive_asha)");
    r.read(s, "max_trials", out.max_trials);
    r.read(s, "max_concurrent_trials", out.max_concurrent_trials);
    r.read(s, "time_metric", out.time_metric);
    r.read(s, "max_time", out.max_time);
    r.read(s, "divisor", out.divisor);
    r.read(s, "max_rungs", out.max_rungs);
    r.read(s, "num_rungs", out.max_rungs);  // async_halving
    r.read(s, "mode", out.mode);
    if (const YAML::Node b = s["bracket_rungs"]; b && !b.IsNull()) {
      if (!b.IsSequence()) throw ConfigError(detail::where(b, source) + ": searcher.bracket_rungs must be a list of rung counts");
      for (const auto& x : b) out.bracket_rungs.push_back(x.as<std::int64_t>());
    }
    out.kind = name == "async_halving" ? SearcherKind::adaptive_asha : *searcher_kind_named(name);
    if (name == "async_halving") out.bracket_rungs = {out.max_rungs};
    auto positive = [&](const char* key, double value) {
      if (s[key] && !(value >= 1)) throw ConfigError(detail::where(s[key], source) + ": searcher." + key + " must be at least 1");
    };
    positive("max_trials", static_cast<double>(out.max_trials));
    positive("max_rungs", static_cast<double>(out.max_rungs));
    if (out.max_concurrent_trials < 0)
      throw ConfigError(detail::where(s["max_concurrent_trials"], source) + ": searcher.max_concurrent_trials must not be negative");
    if (s["divisor"] && !(out.divisor > 1))
      throw ConfigError(detail::where(s["divisor"], source) + ": searcher.divisor must be greater than 1");
    if ((out.kind == SearcherKind::random || out.kind == SearcherKind::adaptive_asha) && !s["max_trials"])
      throw ConfigError(detail::where(s, source) + ": searcher '" + std::string(out.name()) + "' needs max_trials");
    if (out.kind == SearcherKind::adaptive_asha) {
      // Determined needs time_metric and max_time; its deprecated max_length stands for them.
      if (!s["max_time"] && out.max_length) {
        out.max_time = out.max_length->value();
        out.time_metric = out.max_length->unit() == Unit::epochs ? "epochs" : "batches";
      }
      if (out.max_time < 1)
        throw ConfigError(detail::where(s, source) + ": searcher 'adaptive_asha' needs max_time (and time_metric, default batches)");
    }
  }

  /**
   * @brief Every key must be one of the schema's: cluster-only ones are collected in `ignored` (one
   * warning), anything else is an error at its file:line:column with the nearest known name.
   */
  static void check_fields(const YAML::Node& root, const std::string& source, std::vector<std::string>& ignored);

  static void check_map(const YAML::Node& map, const std::string& prefix, const std::vector<std::string>& known,
                        const std::vector<std::string>& cluster, const std::string& source, std::vector<std::string>& ignored);

  /**
   * @brief The hyperparameters of the one trial this config describes: `const` entries and plain
   * values resolved, nested maps kept. A search space (int, double, log, categorical) has no single
   * value, so it is an error that names it.
   */
  Hyperparameters trial_hyperparameters() const { return Hyperparameters(resolve_constants(hyperparameters, ""), source); }

 private:
  YAML::Node resolve_constants(const YAML::Node& map, const std::string& prefix) const;

  struct Reader {
    const std::string& source;
    template <class T>
    void read(const YAML::Node& map, const char* key, T& out) const {
      const YAML::Node node = map[key];
      if (!node || node.IsNull()) return;
      if (!detail::try_read(node, out))
        throw ConfigError(detail::where(node, source) + ": '" + key + "' is " + detail::describe(node) + ", which is not a " +
                          detail::type_name<T>());
    }
    /// A length (`{batches: N}`, `{records: N}`, `{epochs: N}`). With `step_batches` > 0, a plain
    /// integer is also accepted: Determined's legacy form, N steps of `step_batches` batches.
    std::optional<TrainUnit> length(const YAML::Node& map, const char* key, bool zero_means_never, std::int64_t step_batches = 0) const;
  };

  // One reader per part of the document, called by from_yaml in this order.
  static void read_top_level(const YAML::Node& root, const Reader& r, ExperimentConfig& c);
  static void read_resources(const YAML::Node& res, const Reader& r, ExperimentConfig& c);
  static void read_optimizations(const YAML::Node& opt, const Reader& r, ExperimentConfig& c);
  static void read_reproducibility(const YAML::Node& rep, const Reader& r, ExperimentConfig& c);
  static void read_profiling(const YAML::Node& prof, const Reader& r, Profiling& p);
  static void read_slurm(const YAML::Node& slurm, const std::string& source, std::vector<std::string>& args);
  static void read_checkpoint_storage(const YAML::Node& cs, const Reader& r, CheckpointStorage& storage);
  static void read_searcher(const YAML::Node& s, const Reader& r, ExperimentConfig& c);
  static void read_mlflow(const YAML::Node& m, const Reader& r, MlflowSettings& mlflow);
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fstream>
#include <sstream>

namespace dettrial {

DETTRIAL_INLINE const char* to_string(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::best: return "best";
    case CheckpointPolicy::all: return "all";
    case CheckpointPolicy::none: return "none";
  }
  return "?";
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::load_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    throw ConfigError("cannot read experiment config '" + path.string() +
                      "': " + (exists ? "permission denied or not a file" : "no such file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path.string());
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::parse(const std::string& text, std::string source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                      ": YAML syntax error: " + e.msg);
  }
  return from_yaml(root, std::move(source));
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::from_yaml(const YAML::Node& root, std::string source) {
  ExperimentConfig c;
  c.source = std::move(source);
  if (!root.IsDefined() || root.IsNull()) throw ConfigError(c.source + ": the experiment config is empty");
  if (!root.IsMap()) throw ConfigError(detail::where(root, c.source) + ": the experiment config must be a map");
  c.yaml.reset(root);
  check_fields(root, c.source, c.ignored_fields);
  const Reader r{c.source};
  read_top_level(root, r, c);
  for (const char* section :
       {"resources", "optimizations", "reproducibility", "searcher", "checkpoint_storage", "profiling", "slurm", "mlflow"})
    if (const YAML::Node node = root[section]; node && !node.IsNull() && !node.IsMap())
      throw ConfigError(detail::where(node, c.source) + ": '" + section + "' must be a map, found " + detail::describe(node));
  if (const YAML::Node res = root["resources"]) read_resources(res, r, c);
  if (const YAML::Node opt = root["optimizations"]) read_optimizations(opt, r, c);
  if (const YAML::Node rep = root["reproducibility"]) read_reproducibility(rep, r, c);
  if (const YAML::Node prof = root["profiling"]; prof && prof.IsMap()) read_profiling(prof, r, c.profiling);
  if (const YAML::Node slurm = root["slurm"]) read_slurm(slurm, c.source, c.slurm_args);
  if (const YAML::Node cs = root["checkpoint_storage"]) read_checkpoint_storage(cs, r, c.checkpoint_storage);
  if (const YAML::Node s = root["searcher"]) read_searcher(s, r, c);
  if (const YAML::Node m = root["mlflow"]; m && m.IsMap()) read_mlflow(m, r, c.mlflow);
  if (c.mlflow.experiment_name.empty()) c.mlflow.experiment_name = c.name;
  YAML::Emitter text;  // the config as the run trains it (overrides applied): its MLflow artifact
  text << root;
  c.mlflow.config_text = std::string(text.c_str()) + "\n";
  return c;
}

DETTRIAL_INLINE void ExperimentConfig::read_top_level(const YAML::Node& root, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  r.read(root, "name", c.name);
  r.read(root, "description", c.description);
  if (root["hyperparameters"]) {
    c.hyperparameters.reset(root["hyperparameters"]);
    if (!c.hyperparameters.IsMap() && !c.hyperparameters.IsNull())
      throw ConfigError(detail::where(c.hyperparameters, source) + ": 'hyperparameters' must be a map");
  }
  if (root["data"]) c.data.reset(root["data"]);
  r.read(root, "scheduling_unit", c.scheduling_unit);
  if (c.scheduling_unit < 1) throw ConfigError(detail::where(root["scheduling_unit"], source) + ": scheduling_unit must be at least 1");
  r.read(root, "records_per_epoch", c.records_per_epoch);
  r.read(root, "perform_initial_validation", c.perform_initial_validation);
  r.read(root, "max_restarts", c.max_restarts);
  // The legacy integer form counts steps of scheduling_unit batches, as Determined reads it.
  c.min_validation_period = r.length(root, "min_validation_period", /*zero_means_never=*/true, c.scheduling_unit);
  c.min_checkpoint_period = r.length(root, "min_checkpoint_period", /*zero_means_never=*/true, c.scheduling_unit);
  if (const YAML::Node p = root["checkpoint_policy"]; p && !p.IsNull()) {  // null: the default, as the schema allows
    std::string s;
    r.read(root, "checkpoint_policy", s);
    if (s == "best") c.checkpoint_policy = CheckpointPolicy::best;
    else if (s == "all") c.checkpoint_policy = CheckpointPolicy::all;
    else if (s == "none") c.checkpoint_policy = CheckpointPolicy::none;
    else throw ConfigError(detail::where(p, source) + ": checkpoint_policy must be best, all or none, not '" + s + "'");
  }
}

DETTRIAL_INLINE void ExperimentConfig::read_resources(const YAML::Node& res, const Reader& r, ExperimentConfig& c) {
  r.read(res, "slots_per_trial", c.slots_per_trial);
  if (c.slots_per_trial < 0)
    throw ConfigError(detail::where(res["slots_per_trial"], r.source) + ": resources.slots_per_trial must not be negative");
  // 0 is a trial without a GPU slot on a cluster (the schema's minimum): here, one process.
  if (c.slots_per_trial == 0) c.slots_per_trial = 1;
}

DETTRIAL_INLINE void ExperimentConfig::read_optimizations(const YAML::Node& opt, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  if (const YAML::Node mp = opt["mixed_precision"]; mp && !mp.IsNull()) {
    std::string text;
    r.read(opt, "mixed_precision", text);
    try {
      c.mixed_precision = parse_precision(text);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::where(mp, source) + ": optimizations." + e.what());
    }
  }
  r.read(opt, "aggregation_frequency", c.aggregation_frequency);
  if (c.aggregation_frequency < 1)
    throw ConfigError(detail::where(opt["aggregation_frequency"], source) + ": optimizations.aggregation_frequency must be at least 1");
  r.read(opt, "average_aggregated_gradients", c.average_aggregated_gradients);
  if (const YAML::Node sc = opt["step_capture"]; sc && !sc.IsNull()) {
    std::string text;
    std::int64_t warmup = capture::cuda_graph{}.warmup_batches;
    r.read(opt, "step_capture", text);
    r.read(opt, "capture_warmup_batches", warmup);
    try {
      c.step_capture = parse_step_capture(text, warmup);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::where(sc, source) + ": optimizations." + e.what());
    }
  } else if (opt["capture_warmup_batches"]) {
    throw ConfigError(detail::where(opt["capture_warmup_batches"], source) +
                      ": optimizations.capture_warmup_batches is set but step_capture is not; set step_capture: cuda_graph");
  }
}

DETTRIAL_INLINE void ExperimentConfig::read_reproducibility(const YAML::Node& rep, const Reader& r, ExperimentConfig& c) {
  if (rep["experiment_seed"] && !rep["experiment_seed"].IsNull()) {
    std::uint64_t seed = 0;
    r.read(rep, "experiment_seed", seed);
    c.experiment_seed = seed;
  }
  if (rep["deterministic"] && !rep["deterministic"].IsNull()) {
    bool on = false;
    r.read(rep, "deterministic", on);
    c.deterministic = on;
  }
  r.read(rep, "rank_invariant", c.rank_invariant);
}

DETTRIAL_INLINE void ExperimentConfig::read_profiling(const YAML::Node& prof, const Reader& r, Profiling& p) {
  r.read(prof, "enabled", p.enabled);
  r.read(prof, "begin_on_batch", p.begin_on_batch);
  r.read(prof, "sync_timings", p.sync_timings);
  if (p.begin_on_batch < 0)
    throw ConfigError(detail::where(prof["begin_on_batch"], r.source) + ": profiling.begin_on_batch must not be negative");
  if (const YAML::Node end = prof["end_after_batch"]; end && !end.IsNull()) {
    std::int64_t last = 0;
    r.read(prof, "end_after_batch", last);
    if (last < p.begin_on_batch)
      throw ConfigError(detail::where(end, r.source) + ": profiling.end_after_batch (" + std::to_string(last) +
                        ") must not come before begin_on_batch (" + std::to_string(p.begin_on_batch) + ")");
    p.end_after_batch = last;
  }
}

DETTRIAL_INLINE void ExperimentConfig::read_slurm(const YAML::Node& slurm, const std::string& source, std::vector<std::string>& args) {
  const YAML::Node given = slurm.IsMap() ? slurm["sbatch_args"] : YAML::Node();
  if (!given || given.IsNull()) return;
  if (!given.IsSequence())
    throw ConfigError(detail::where(given, source) + ": slurm.sbatch_args must be a list of options, such as [--partition=gpu]");
  for (const auto& a : given) {
    if (!a.IsScalar())
      throw ConfigError(detail::where(a, source) + ": slurm.sbatch_args holds " + detail::describe(a) + "; each entry is one option");
    // dettrial starts each trial with srun, which takes sbatch's resource options but not these
    // (or reads them otherwise: srun's --output redirects the tasks', --wait is a timeout).
    const std::string option = a.Scalar().substr(0, a.Scalar().find('='));
    for (const char* batch_only :
         {"--array", "-a", "--wrap", "--parsable", "--wait", "-W", "--output", "-o", "--error", "-e", "--open-mode", "--test-only"})
      if (option == batch_only)
        throw ConfigError(detail::where(a, source) + ": slurm.sbatch_args: '" + a.Scalar() +
                          "' is an sbatch option that srun, which starts " +
                          "each trial, does not take the same way; leave it out (each trial's output goes to its log.txt)");
    args.push_back(a.Scalar());
  }
}

DETTRIAL_INLINE void ExperimentConfig::read_mlflow(const YAML::Node& m, const Reader& r, MlflowSettings& mlflow) {
  r.read(m, "tracking_uri", mlflow.tracking_uri);
  r.read(m, "experiment_name", mlflow.experiment_name);
  r.read(m, "run_name", mlflow.run_name);
  const std::string& uri = mlflow.tracking_uri;
  if (!uri.empty() && uri.rfind("http://", 0) != 0 && uri.rfind("https://", 0) != 0)
    throw ConfigError(detail::where(m["tracking_uri"], r.source) + ": mlflow.tracking_uri '" + uri +
                      "' is not a server's address (http:// or https://): dettrial logs to an MLflow server over its REST API");
  const YAML::Node tags = m["tags"];
  if (!tags || tags.IsNull()) return;
  if (!tags.IsMap())
    throw ConfigError(detail::where(tags, r.source) + ": mlflow.tags must be a map of names to values, found " + detail::describe(tags));
  for (const auto& kv : tags) {
    if (!kv.second.IsScalar())
      throw ConfigError(detail::where(kv.second, r.source) + ": mlflow.tags." + kv.first.Scalar() + " must be a single value, found " +
                        detail::describe(kv.second));
    mlflow.tags.emplace_back(kv.first.Scalar(), kv.second.Scalar());
  }
}

DETTRIAL_INLINE void ExperimentConfig::read_checkpoint_storage(const YAML::Node& cs, const Reader& r, CheckpointStorage& storage) {
  const std::pair<const char*, std::int64_t*> counts[] = {{"save_experiment_best", &storage.save_experiment_best},
                                                          {"save_trial_best", &storage.save_trial_best},
                                                          {"save_trial_latest", &storage.save_trial_latest}};
  for (const auto& [key, field_ptr] : counts) {
    std::int64_t& field = *field_ptr;
    r.read(cs, key, field);
    if (field < 0) throw ConfigError(detail::where(cs[key], r.source) + ": checkpoint_storage." + key + " must not be negative");
  }
  if (const YAML::Node type = cs["type"]; type && type.IsScalar() && type.Scalar() != "shared_fs" && type.Scalar() != "directory")
    throw ConfigError(detail::where(type, r.source) + ": checkpoint_storage type '" + type.Scalar() +
                      "' is not one dettrial writes (shared_fs or directory, on a local or mounted file system)");
  r.read(cs, "async", storage.async);
  std::string host_path, storage_path, container_path;
  r.read(cs, "host_path", host_path);
  r.read(cs, "storage_path", storage_path);
  r.read(cs, "container_path", container_path);
  if (!host_path.empty())
    storage.path = storage_path.empty() ? std::filesystem::path(host_path) : std::filesystem::path(host_path) / storage_path;
  else if (!container_path.empty()) storage.path = std::filesystem::path(container_path);
}

DETTRIAL_INLINE void ExperimentConfig::read_searcher(const YAML::Node& s, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  if (!s.IsMap()) throw ConfigError(detail::where(s, source) + ": 'searcher' must be a map");
  std::string name(to_string(SearcherKind::single));
  r.read(s, "name", name);
  r.read(s, "metric", c.searcher.metric);
  r.read(s, "smaller_is_better", c.searcher.smaller_is_better);
  if (const YAML::Node ml = s["max_length"]; ml && ml.IsScalar()) {
    // The schema's unitless form (searcher-length.json: an integer), read as batches.
    std::int64_t n = 0;
    r.read(s, "max_length", n);
    if (n < 0) throw ConfigError(detail::where(ml, source) + ": searcher.max_length must not be negative");
    c.searcher.max_length = Batch(n);
  } else if (s["max_length"]) {
    c.searcher.max_length = r.length(s, "max_length", /*zero_means_never=*/false);
  } else if (s["max_steps"]) {
    std::int64_t steps = 0;
    r.read(s, "max_steps", steps);
    if (steps < 0) throw ConfigError(detail::where(s["max_steps"], source) + ": searcher.max_steps must not be negative");
    c.searcher.max_length = Batch(steps * c.scheduling_unit);
  }
  read_search_fields(s, source, r, name, c.searcher);
}

DETTRIAL_INLINE void ExperimentConfig::check_fields(const YAML::Node& root, const std::string& source, std::vector<std::string>& ignored) {
  static const std::vector<std::string> top = {"name",
                                               "description",
                                               "hyperparameters",
                                               "searcher",
                                               "records_per_epoch",
                                               "min_validation_period",
                                               "min_checkpoint_period",
                                               "scheduling_unit",
                                               "perform_initial_validation",
                                               "checkpoint_policy",
                                               "max_restarts",
                                               "checkpoint_storage",
                                               "resources",
                                               "optimizations",
                                               "reproducibility",
                                               "data",
                                               "profiling",
                                               "slurm",
                                               "mlflow"};
  static const std::vector<std::string> top_cluster = {"entrypoint",
                                                       "environment",
                                                       "bind_mounts",
                                                       "labels",
                                                       "project",
                                                       "workspace",
                                                       "debug",
                                                       "tensorboard_storage",
                                                       "pbs",
                                                       "log_policies",
                                                       "retention_policy",
                                                       "integrations",
                                                       "data_layer",
                                                       "preemption_timeout",
                                                       "security",
                                                       "internal",
                                                       "notes"};
  static const std::vector<std::string> searcher = {
      "name",        "metric",   "smaller_is_better", "max_length", "max_steps", "max_trials", "max_concurrent_trials",
      "time_metric", "max_time", "divisor",           "max_rungs",  "num_rungs", "mode",       "bracket_rungs"};
  // budget, train_stragglers: the removed searchers' fields (refused by name, with the searcher); unit: custom's.
  static const std::vector<std::string> searcher_cluster = {"source_trial_id", "source_checkpoint_uuid", "stop_once",
                                                            "budget",          "train_stragglers",       "unit"};
  static const std::vector<std::string> resources = {"slots_per_trial"};
  static const std::vector<std::string> resources_cluster = {"slots",          "resource_pool", "max_slots", "priority",
                                                             "weight",         "shm_size",      "devices",   "native_parallel",
                                                             "is_single_node", "agent_label"};
  static const std::vector<std::string> optimizations = {"aggregation_frequency", "average_aggregated_gradients", "mixed_precision",
                                                         "step_capture", "capture_warmup_batches"};
  static const std::vector<std::string> optimizations_cluster = {"average_training_metrics", "gradient_compression",
                                                                 "tensor_fusion_threshold",  "tensor_fusion_cycle_time",
                                                                 "auto_tune_tensor_fusion",  "grad_updates_size_file"};
  static const std::vector<std::string> reproducibility = {"experiment_seed", "deterministic", "rank_invariant"};
  static const std::vector<std::string> profiling = {"enabled", "begin_on_batch", "end_after_batch", "sync_timings"};
  static const std::vector<std::string> slurm = {"sbatch_args"};
  static const std::vector<std::string> mlflow = {"tracking_uri", "experiment_name", "run_name", "tags"};
  static const std::vector<std::string> slurm_cluster = {"slots_per_node", "gpu_type"};
  static const std::vector<std::string> storage = {
      "type", "host_path", "storage_path", "container_path", "propagation", "save_experiment_best", "save_trial_best", "save_trial_latest",
      "async"};
  // Cloud storage, and shared_fs's legacy checkpoint_path / tensorboard_path (paths inside a task's container).
  static const std::vector<std::string> storage_cloud = {
      "checkpoint_path", "tensorboard_path", "bucket",     "access_key", "secret_key",  "endpoint_url",      "prefix",
      "region",          "credentials",      "credential", "user",       "account_url", "connection_string", "container"};
  check_map(root, "", top, top_cluster, source, ignored);
  const std::pair<const char*, std::pair<const std::vector<std::string>*, const std::vector<std::string>*>> sections[] = {
      {"searcher", {&searcher, &searcher_cluster}},
      {"resources", {&resources, &resources_cluster}},
      {"optimizations", {&optimizations, &optimizations_cluster}},
      {"reproducibility", {&reproducibility, nullptr}},
      {"profiling", {&profiling, nullptr}},
      {"slurm", {&slurm, &slurm_cluster}},
      {"mlflow", {&mlflow, nullptr}},
      {"checkpoint_storage", {&storage, &storage_cloud}}};
  for (const auto& [section, known] : sections)
    if (const YAML::Node node = root[section]; node && node.IsMap())
      check_map(node, std::string(section) + ".", *known.first, known.second ? *known.second : std::vector<std::string>{}, source, ignored);
}

DETTRIAL_INLINE void ExperimentConfig::check_map(const YAML::Node& map, const std::string& prefix, const std::vector<std::string>& known,
                                                 const std::vector<std::string>& cluster, const std::string& source,
                                                 std::vector<std::string>& ignored) {
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (std::find(cluster.begin(), cluster.end(), key) != cluster.end()) {
      ignored.push_back(prefix + key);
      continue;
    }
    std::vector<std::string> all = known;
    all.insert(all.end(), cluster.begin(), cluster.end());
    throw ConfigError(detail::where(kv.first, source) + ": unknown field '" + prefix + key + "'" + detail::suggestion(key, all));
  }
}

DETTRIAL_INLINE YAML::Node ExperimentConfig::resolve_constants(const YAML::Node& map, const std::string& prefix) const {
  YAML::Node out(YAML::NodeType::Map);
  if (!map.IsDefined() || map.IsNull()) return out;
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (v.IsMap() && v["type"]) {
      const std::string type = v["type"].Scalar();
      if (type == "const") {
        if (!v["val"]) throw ConfigError(detail::where(v, source) + ": hyperparameter '" + prefix + key + "' of type const has no 'val'");
        out[key] = v["val"];
      } else if (type == "int" || type == "double" || type == "log" || type == "categorical") {
        throw ConfigError(detail::where(v, source) + ": hyperparameter '" + prefix + key + "' is a search space (type: " + type +
                          "), which has no single value; give it a value (type: const) to train one trial");
      } else {
        throw ConfigError(detail::where(v["type"], source) + ": hyperparameter '" + prefix + key + "' has unknown type '" + type +
                          "' (expected const, int, double, log or categorical)");
      }
    } else if (v.IsMap()) {
      out[key] = resolve_constants(v, prefix + key + ".");
    } else {
      out[key] = v;
    }
  }
  return out;
}

DETTRIAL_INLINE std::optional<TrainUnit> ExperimentConfig::Reader::length(const YAML::Node& map, const char* key, bool zero_means_never,
                                                                          std::int64_t step_batches) const {
  const YAML::Node node = map[key];
  if (!node || node.IsNull()) return std::nullopt;
  if (step_batches > 0 && node.IsScalar()) {
    std::int64_t steps = 0;
    if (!detail::try_read(node, steps) || steps < 0)
      throw ConfigError(detail::where(node, source) + ": '" + key + "' is " + detail::describe(node) +
                        "; give a length such as {batches: 1000}, or a non-negative number of steps of scheduling_unit (" +
                        std::to_string(step_batches) + ") batches");
    if (zero_means_never && steps < 1) return TrainUnit(Unit::batches, TrainUnit::never_value);
    return TrainUnit(Unit::batches, steps * step_batches);
  }
  if (!node.IsMap() || node.size() != 1)
    throw ConfigError(detail::where(node, source) + ": '" + key +
                      "' must be a map with exactly one of batches, records or epochs, e.g. {batches: 1000}" +
                      (step_batches > 0 ? ", or a number of steps of scheduling_unit batches" : ""));
  const std::string unit_name = node.begin()->first.Scalar();
  Unit unit;
  if (unit_name == "batches") unit = Unit::batches;
  else if (unit_name == "epochs") unit = Unit::epochs;
  else if (unit_name == "records") unit = Unit::records;
  else
    throw ConfigError(detail::where(node.begin()->first, source) + ": '" + key + "' has unit '" + unit_name +
                      "'; expected batches, records or epochs");
  std::int64_t value = 0;
  if (!detail::try_read(node.begin()->second, value) || value < 0)
    throw ConfigError(detail::where(node.begin()->second, source) + ": '" + key + "." + unit_name +
                      "' must be a non-negative integer, found " + detail::describe(node.begin()->second));
  // Determined maps a configured period below 1 to "never".
  if (zero_means_never && value < 1) return TrainUnit(unit, TrainUnit::never_value);
  return TrainUnit(unit, value);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/config/experiment_config.hpp
// ---- begin dettrial/config/profiler_options.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What `Context::set_profiler` takes: `torch.profiler.profile`'s activities, schedule and
/// recording options, and the schedule's action at each step, as `torch.profiler.schedule` decides it.

#include <cstdint>
#include <string>
#include <vector>


namespace dettrial {

/// What the profiler records: operators on the CPU, kernels on a GPU (`torch.profiler.ProfilerActivity`).
enum class ProfilerActivity { cpu, cuda };

/**
 * @brief `torch.profiler.schedule(wait, warmup, active, repeat, skip_first)`. Steps are training
 * batches, counted from 0 at the first batch a fit trains (a resumed fit counts afresh, as a new
 * Python process does). After `skip_first` steps the schedule repeats cycles of `wait` steps off,
 * `warmup` steps on but discarded, and `active` steps recorded, whose trace is written when the
 * cycle's last active step ends; `repeat` cycles in all (0: until training ends).
 */
struct ProfilerSchedule {
  std::int64_t wait = 0;
  std::int64_t warmup = 0;
  std::int64_t active = 1;
  std::int64_t repeat = 0;
  std::int64_t skip_first = 0;
};

/**
 * @brief The arguments of `Context::set_profiler` (Determined's `set_profiler`, which takes
 * `torch.profiler.profile`'s). dettrial writes each cycle's trace where TensorBoard's profile plugin
 * reads it (`<output>/tensorboard/<host>_<pid>.<ms>.pt.trace.json`: Determined's `on_trace_ready`)
 * and steps the profiler after every training batch.
 */
struct ProfilerOptions {
  /// CUDA is recorded only when the trial runs on a GPU.
  std::vector<ProfilerActivity> activities{ProfilerActivity::cpu, ProfilerActivity::cuda};
  ProfilerSchedule schedule{};
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  bool with_modules = false;
};

namespace detail {

/// `torch.profiler.ProfilerAction`.
enum class ProfilerAction { none, warmup, record, record_and_save };

/// The action at `step`, exactly as `torch.profiler.schedule` returns it.
inline ProfilerAction profiler_action(const ProfilerSchedule& s, std::int64_t step) {
  if (step < s.skip_first) return ProfilerAction::none;
  step -= s.skip_first;
  const std::int64_t cycle = s.wait + s.warmup + s.active;
  if (s.repeat > 0 && step / cycle >= s.repeat) return ProfilerAction::none;
  const std::int64_t in_cycle = step % cycle;
  if (in_cycle < s.wait) return ProfilerAction::none;
  if (in_cycle < s.wait + s.warmup) return ProfilerAction::warmup;
  return in_cycle < cycle - 1 ? ProfilerAction::record : ProfilerAction::record_and_save;
}

/// Refuses what `torch.profiler.schedule` refuses, naming the argument.
inline void check_profiler_options(const ProfilerOptions& o) {
  const ProfilerSchedule& s = o.schedule;
  auto at_least = [](const char* name, std::int64_t value, std::int64_t least) {
    if (value < least)
      throw ConfigError(std::string("set_profiler: schedule ") + name + " is " + std::to_string(value) + "; it must be at least " +
                        std::to_string(least));
  };
  at_least("wait", s.wait, 0);
  at_least("warmup", s.warmup, 0);
  at_least("active", s.active, 1);
  at_least("repeat", s.repeat, 0);
  at_least("skip_first", s.skip_first, 0);
  if (o.activities.empty()) throw ConfigError("set_profiler: no activities to record (give ProfilerActivity::cpu, cuda or both)");
}

}  // namespace detail
}  // namespace dettrial
// ---- end dettrial/config/profiler_options.hpp
// ---- begin dettrial/data/data_loader.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batch-level datasets and the DataLoader the trainer iterates, epoch by epoch, in a
/// reproducible order.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

// ---- begin dettrial/vocabulary/data.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The data vocabulary: what a dataset and a data loader are to dettrial (concepts), and the
/// LoaderChain by which the trainer reads a loader.

#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

namespace dettrial {

/// How the trainer reads a loader: Determined's `get_data_loader(repeat, skip, num_replicas, rank)`.
struct LoaderChain {
  /// Endless epochs (training) or one pass (validation).
  bool repeat = false;
  /// Batches of this rank's stream to pass over (already trained); none of their records are read.
  std::int64_t skip = 0;
  /// Ranks sharing the data; rank `r` takes every `num_replicas`-th batch, starting at `r`.
  std::int64_t num_replicas = 1;
  std::int64_t rank = 0;
  /**
   * @brief The rank count whose global batches an endless stream keeps (0: `num_replicas`). A run
   * resumed on another rank count than it began with reads the global batches it would have read on
   * its first count: global batch `k` is that count's `k`-th batch of every rank, in rank order, and
   * rank `r` of `num_replicas` takes the `r`-th of `num_replicas` equal runs of its records (see
   * docs/distributed.md, "Elastic"). `skip` then counts global batches.
   */
  std::int64_t layout_replicas = 0;
};

/**
 * @brief Where a batch comes from in the loader's stream: its epoch and the loader's seed. A dataset
 * whose records are drawn at random as they are read (augmented images) keys its draws on it and on
 * the record index, so a record comes out the same whatever the workers, the ranks or a resume.
 */
struct BatchOrigin {
  std::int64_t epoch = 0;
  std::uint64_t seed = 0;
  /// The positions in the batch at which the next epoch begins: empty but for a batch regrouped
  /// across an epoch's end (LoaderChain::layout_replicas), whose records come from two epochs.
  std::span<const std::int64_t> epoch_starts{};
  /// The epoch of the batch's record at `position`.
  std::int64_t epoch_of(std::int64_t position) const {
    std::int64_t e = epoch;
    for (const std::int64_t start : epoch_starts) e += position >= start ? 1 : 0;
    return e;
  }
};

/// A dataset read one record at a time: `size()` records and `get(index)`.
template <class D>
concept ExampleDataset = requires(const D& d, std::int64_t i) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get(i);
};

/**
 * @brief A dataset read a batch at a time: `size()` records, and `get_batch(indices)` with a 1-D
 * int64 CPU tensor of record indices (vectorised: one gather per batch, not one call per record).
 * A dataset may also offer `get_range(begin, end)` for contiguous, unshuffled reads, and
 * `get_batch(indices, origin)` (BatchOrigin) to draw per-record randomness reproducibly; the loader
 * then calls that one. Either way a batch must not alias the dataset's storage: a trial may change
 * its batch in place.
 */
template <class D>
concept BatchDataset = requires(D& d, const torch::Tensor& indices) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get_batch(indices);
};

/**
 * @brief What the trainer needs of a data loader: `size()` batches per epoch, and `batches(chain)`,
 * the batches one rank reads under Determined's repeat / shard / skip chain (see LoaderChain).
 */
template <class L>
concept BatchLoader = requires(const L& l, const LoaderChain& chain) {
  { l.size() } -> std::convertible_to<std::int64_t>;
  { l.batches(chain) };
  requires std::ranges::input_range<decltype(l.batches(chain))>;
};

/// The batch type a loader yields.
template <BatchLoader L>
using batch_of = std::remove_cvref_t<std::ranges::range_reference_t<decltype(std::declval<const L&>().batches(LoaderChain{}))>>;

}  // namespace dettrial
// ---- end dettrial/vocabulary/data.hpp
// ---- begin dettrial/data/to_device.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Moving nested batches to a device: tensors, tuples, pairs, vectors, string-keyed maps, and
/// user types that teach dettrial how.

#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace dettrial {

namespace detail {
template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class V, class C, class A>
struct is_string_map<std::map<std::string, V, C, A>> : std::true_type {};
template <class V, class H, class E, class A>
struct is_string_map<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};
}  // namespace detail

namespace detail {
/// Calls `f(tensor&)` on every tensor inside a nested batch (tuples, pairs, vectors, string-keyed maps);
/// other values are skipped.
template <class T, class F>
void for_each_tensor(T& batch, F&& f) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    f(batch);
  } else if constexpr (is_tuple_like<U>::value) {
    std::apply([&](auto&... parts) { (for_each_tensor(parts, f), ...); }, batch);
  } else if constexpr (is_vector<U>::value) {
    for (auto& part : batch) for_each_tensor(part, f);
  } else if constexpr (is_string_map<U>::value) {
    for (auto& kv : batch) for_each_tensor(kv.second, f);
  }
}

/// A batch of tensors in tuples, pairs, vectors and string-keyed maps, and nothing else: every value
/// in it is a tensor that for_each_tensor reaches (what a CUDA graph can take as input, where a number
/// would be frozen at the captured batch's value, and what a side-stream copy can hand over safely).
template <class B>
constexpr bool tensors_only_batch() {
  using U = std::remove_cvref_t<B>;
  if constexpr (std::is_same_v<U, torch::Tensor>) return true;
  else if constexpr (is_tuple_like<U>::value)
    return []<class... Ts>(std::type_identity<std::tuple<Ts...>>) {
      return (tensors_only_batch<Ts>() && ...);
    }(std::type_identity<decltype(std::tuple_cat(std::declval<U>()))>{});
  else if constexpr (is_vector<U>::value) return tensors_only_batch<typename U::value_type>();
  else if constexpr (is_string_map<U>::value) return tensors_only_batch<typename U::mapped_type>();
  else return false;
}

}  // namespace detail

/**
 * @brief Moves every tensor inside `batch` to `device`, in place.
 *
 * Recurses through std::tuple, std::pair, std::vector and string-keyed std::map / std::unordered_map.
 * A user type is moved by its member `to_device(device, non_blocking)` if it has one, else by its
 * member `to(device)` (Determined moves "anything with .to"); anything else is left as it is.
 * Tensors already on `device` are not copied.
 */
struct to_device_in_place_fn {
  template <class T>
  void operator()(T& batch, const torch::Device& device, bool non_blocking = false) const {
    using U = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<U, torch::Tensor>) {
      if (batch.defined() && batch.device() != device) batch = batch.to(device, non_blocking);
    } else if constexpr (detail::is_tuple_like<U>::value) {
      std::apply([&](auto&... parts) { ((*this)(parts, device, non_blocking), ...); }, batch);
    } else if constexpr (detail::is_vector<U>::value) {
      for (auto& part : batch) (*this)(part, device, non_blocking);
    } else if constexpr (detail::is_string_map<U>::value) {
      for (auto& kv : batch) (*this)(kv.second, device, non_blocking);
    } else if constexpr (requires { batch.to_device(device, non_blocking); }) {
      batch.to_device(device, non_blocking);
    } else if constexpr (requires { batch = batch.to(device); }) {
      batch = batch.to(device);
    }
  }
};
inline constexpr to_device_in_place_fn to_device_in_place{};

/// Moves every tensor inside `batch` to `device` and returns it (see to_device_in_place).
template <class T>
std::remove_cvref_t<T> to_device(T&& batch, const torch::Device& device, bool non_blocking = false) {
  std::remove_cvref_t<T> moved(std::forward<T>(batch));
  to_device_in_place(moved, device, non_blocking);
  return moved;
}

/// The number of records in a batch: the first dimension of its first tensor (Determined's data_length).
template <class T>
std::int64_t batch_length(const T& batch) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    return batch.defined() && batch.dim() > 0 ? batch.size(0) : 1;
  } else if constexpr (detail::is_tuple_like<U>::value) {
    return batch_length(std::get<0>(batch));
  } else if constexpr (detail::is_vector<U>::value || detail::is_string_map<U>::value) {
    if (batch.empty()) return 0;
    if constexpr (detail::is_vector<U>::value) return batch_length(batch.front());
    else return batch_length(batch.begin()->second);
  } else if constexpr (requires {
                         { batch.size() } -> std::convertible_to<std::int64_t>;
                       }) {
    return static_cast<std::int64_t>(batch.size());
  } else {
    return 1;
  }
}

}  // namespace dettrial
// ---- end dettrial/data/to_device.hpp
// ---- begin dettrial/data/collate.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Per-example datasets: `get(index)` one record at a time, stacked into batches by a collate
/// function (nested tensors, tuples, vectors, string-keyed maps, numbers, strings).

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial {

/**
 * @brief The default collate: stacks a vector of examples into one batch of the same shape.
 * Tensors are stacked along a new first dimension; tuples, pairs, vectors and string-keyed maps are
 * collated element by element; numbers become a 1-D tensor; strings a vector of strings.
 */
struct collate_fn {
  template <class Example>
  auto operator()(const std::vector<Example>& examples) const {
    using E = std::remove_cvref_t<Example>;
    if constexpr (std::is_same_v<E, torch::Tensor>) {
      return torch::stack(examples);
    } else if constexpr (detail::is_tuple_like<E>::value) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple{(*this)(field<I>(examples))...};
      }(std::make_index_sequence<std::tuple_size_v<E>>{});
    } else if constexpr (detail::is_vector<E>::value) {
      using Inner = typename E::value_type;
      std::vector<decltype((*this)(std::declval<const std::vector<Inner>&>()))> out;
      const std::size_t width = examples.empty() ? 0 : examples.front().size();
      for (std::size_t j = 0; j < width; ++j) {
        std::vector<Inner> column;
        column.reserve(examples.size());
        for (const auto& e : examples) {
          if (e.size() != width) throw DataError("collate: examples are vectors of different lengths");
          column.push_back(e[j]);
        }
        out.push_back((*this)(column));
      }
      return out;
    } else if constexpr (detail::is_string_map<E>::value) {
      using Inner = typename E::mapped_type;
      std::map<std::string, decltype((*this)(std::declval<const std::vector<Inner>&>()))> out;
      if (examples.empty()) return out;
      for (const auto& [key, unused] : examples.front()) {
        std::vector<Inner> column;
        column.reserve(examples.size());
        for (const auto& e : examples) {
          auto it = e.find(key);
          if (it == e.end()) throw DataError("collate: an example has no key '" + key + "'");
          column.push_back(it->second);
        }
        out.emplace(key, (*this)(column));
      }
      return out;
    } else if constexpr (std::is_arithmetic_v<E>) {
      return torch::tensor(
                 std::vector<std::conditional_t<std::is_floating_point_v<E>, double, std::int64_t>>(examples.begin(), examples.end()))
          .to(std::is_floating_point_v<E> ? torch::kFloat : torch::kLong);
    } else {
      return examples;  // strings and other values: the list of them
    }
  }

 private:
  template <std::size_t I, class E>
  static auto field(const std::vector<E>& examples) {
    std::vector<std::remove_cvref_t<std::tuple_element_t<I, E>>> out;
    out.reserve(examples.size());
    for (const auto& e : examples) out.push_back(std::get<I>(e));
    return out;
  }
};

/// Turns a per-example dataset into a batch-level one: gathers the records of a batch and collates them.
template <class D, class Collate = collate_fn>
class ExampleBatches {
  static_assert(ExampleDataset<D>, "dettrial::ExampleBatches<D>: D must have size() and get(index) (a dettrial::ExampleDataset)");

 public:
  explicit ExampleBatches(D dataset, Collate collate = {}) : dataset_(std::move(dataset)), collate_(std::move(collate)) {}
  std::int64_t size() const { return static_cast<std::int64_t>(dataset_.size()); }
  auto get_batch(const torch::Tensor& indices) const {
    using Example = std::remove_cvref_t<decltype(dataset_.get(std::int64_t{}))>;
    std::vector<Example> examples;
    examples.reserve(static_cast<std::size_t>(indices.numel()));
    const torch::Tensor order = indices.to(torch::kLong).contiguous();
    const auto* idx = order.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < indices.numel(); ++i) examples.push_back(dataset_.get(idx[i]));
    return collate_(examples);
  }
  const D& dataset() const { return dataset_; }

 private:
  D dataset_;
  Collate collate_;
};

/// A per-example dataset with a custom collate function, for DataLoader.
template <class D, class Collate>
ExampleBatches<D, Collate> with_collate(D dataset, Collate collate) {
  return ExampleBatches<D, Collate>(std::move(dataset), std::move(collate));
}

}  // namespace dettrial
// ---- end dettrial/data/collate.hpp
// ---- begin dettrial/data/prefetch.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Background batch reading: worker threads fill a bounded ring of batches that the consumer
/// takes strictly in order, so the order never depends on the number of workers.

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace dettrial::detail {

/**
 * @brief Reads items `first, first+1, ..., end-1` with `workers` threads, at most `depth` ahead of the
 * consumer. Workers claim positions in turn and write them to slot `position % depth`; `take()` returns
 * them in position order. An exception in a worker is rethrown by the `take()` of its position.
 */
template <class T>
class Prefetcher {
 public:
  using Read = std::function<T(std::int64_t)>;

  Prefetcher(Read read, std::int64_t first, std::int64_t end, int workers, int depth)
      : read_(std::move(read)),
        next_claim_(first),
        next_take_(first),
        end_(end),
        slots_(static_cast<std::size_t>(std::max(depth, workers))) {
    threads_.reserve(static_cast<std::size_t>(workers));
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  ~Prefetcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// The next item, in order; waits for it if a worker is still reading it.
  T take() {
    std::unique_lock lock(mutex_);
    Slot& slot = slots_[index(next_take_)];
    changed_.wait(lock, [&] { return slot.position == next_take_ && (slot.value || slot.error); });
    std::exception_ptr error = slot.error;
    std::optional<T> value = std::move(slot.value);
    slot.value.reset();
    slot.error = nullptr;
    slot.position = -1;
    ++next_take_;
    lock.unlock();
    changed_.notify_all();
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }

 private:
  struct Slot {
    std::int64_t position = -1;
    std::optional<T> value;
    std::exception_ptr error;
  };

  std::size_t index(std::int64_t position) const { return static_cast<std::size_t>(position % static_cast<std::int64_t>(slots_.size())); }

  void work() {
    yield_to_compute();
    for (;;) {
      std::int64_t position;
      {
        std::unique_lock lock(mutex_);
        // Claim the next position once its slot is free: at most slots_.size() ahead of the consumer.
        changed_.wait(
            lock, [&] { return stopping_ || next_claim_ >= end_ || next_claim_ < next_take_ + static_cast<std::int64_t>(slots_.size()); });
        if (stopping_ || next_claim_ >= end_) return;
        position = next_claim_++;
      }
      std::optional<T> value;
      std::exception_ptr error;
      try {
        value.emplace(read_(position));
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        Slot& slot = slots_[index(position)];
        slot.position = position;
        slot.value = std::move(value);
        slot.error = error;
      }
      changed_.notify_all();
    }
  }

  /// Lowers this worker thread's scheduling priority (nice + 5): where the training step's threads
  /// already use every core, a worker waking to read ahead then yields to them instead of
  /// preempting one of an intra-op team, which stalls the whole team at its next barrier. A worker
  /// that has the cores to itself runs as fast as before.
  static void yield_to_compute() {
    const auto thread = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, thread);
    if (errno == 0) ::setpriority(PRIO_PROCESS, thread, std::min(nice + 5, 19));
  }

  Read read_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::int64_t next_claim_;
  std::int64_t next_take_;
  std::int64_t end_;
  bool stopping_ = false;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
};

}  // namespace dettrial::detail
// ---- end dettrial/data/prefetch.hpp
// ---- begin dettrial/data/sampler.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The sampler chain: which records make up each batch a rank reads, with Determined's order of
/// operations (an epoch's order, batch, repeat, shard by rank, skip) and O(1) random access. The
/// epoch's order is the built-in one (in order, or shuffled per epoch), a user's sampler's, or a
/// user's batch sampler's batches; the chain steps are those of samplers.hpp.

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/data/samplers.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `determined.pytorch.samplers`, for loaders and batch samplers a trial writes
/// itself: the reproducible shuffle, and the chain steps repeat, distribute (shard by rank) and skip
/// as range-v3 views with O(1) random access. dettrial's own loader reads its batches through them.

#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/range/traits.hpp>
#include <range/v3/view/all.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/torch.h>

// ---- begin dettrial/detail/random.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The 64-bit mixing function dettrial derives seeds with (trial seeds, per-epoch shuffles).

#include <cstdint>

namespace dettrial::detail {

/// The golden-ratio increment of splitmix64.
inline constexpr std::uint64_t golden_gamma = 0x9E3779B97F4A7C15ULL;

/// splitmix64's finaliser: a bijection that spreads every input bit over the output.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace dettrial::detail
// ---- end dettrial/detail/random.hpp

namespace dettrial {

/**
 * @brief A sampler: the record order of epoch `e` (Python's `DataLoader(sampler=...)`), a 1-D tensor
 * of record indices (int64; other integer types are converted). It may leave records out or repeat
 * them (weighted sampling), but every epoch must have the same length, and it must be a function of
 * the epoch (the same order whenever it is asked, and on every rank): skipping to a resumed position
 * recomputes an epoch instead of replaying the ones before it.
 */
using SamplerFunction = std::function<torch::Tensor(std::int64_t epoch)>;

/**
 * @brief A batch sampler: the batches of epoch `e` (Python's `DataLoader(batch_sampler=...)`), each a
 * 1-D tensor of record indices; batches may differ in size, but every epoch must have the same number
 * of them. Like a SamplerFunction, a function of the epoch.
 */
using BatchSamplerFunction = std::function<std::vector<torch::Tensor>(std::int64_t epoch)>;

/// Determined's `determined.pytorch.samplers`, with the epoch made explicit so that any batch of any
/// epoch can be computed on its own (O(1) skipping).
namespace samplers {

/**
 * @brief Determined's `ReproducibleShuffleSampler`: the record order of epoch `e` is a permutation
 * drawn from (seed, e) alone, the very permutation dettrial's `DataLoader{.shuffle = true, .seed = seed}`
 * uses. Usable directly as `DataLoaderOptions::sampler`; over an inner sampler it shuffles that
 * sampler's order of each epoch (Determined's `ReproducibleShuffleSampler(sampler, seed)`).
 * @code{.cpp}
 * dettrial::DataLoader loader(dataset, {.batch_size = 32,
 *                                       .sampler = dettrial::samplers::ReproducibleShuffleSampler(dataset.size(), seed)});
 * @endcode
 */
class ReproducibleShuffleSampler {
 public:
  /// Shuffles the records `0 .. records-1`.
  ReproducibleShuffleSampler(std::int64_t records, std::uint64_t seed);
  /// Shuffles `inner(e)`, the order another sampler gives epoch `e`.
  ReproducibleShuffleSampler(SamplerFunction inner, std::uint64_t seed);

  /// The record order of epoch `epoch` (CPU; int64, or the inner sampler's integer type).
  torch::Tensor operator()(std::int64_t epoch) const;
  std::uint64_t seed() const { return seed_; }

  /// The permutation of `0 .. n-1` for (seed, epoch): one CPU generator seeded from both, one randperm.
  static torch::Tensor permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

 private:
  std::int64_t records_ = 0;
  SamplerFunction inner_;
  std::uint64_t seed_;
};

/// Determined's `len(DistributedBatchSampler)`: of `length` items, rank `rank` of `num_replicas` takes
/// `length // num_replicas + (length % num_replicas > rank)`.
constexpr std::int64_t distributed_length(std::int64_t length, std::int64_t num_replicas, std::int64_t rank) {
  return length / num_replicas + (length % num_replicas > rank ? 1 : 0);
}

namespace detail {
/// Item `k` of a stream of epochs: `batch_of(k / batches_per_epoch, k % batches_per_epoch)`.
template <class BatchOf>
struct EpochBatch {
  std::int64_t batches_per_epoch;
  BatchOf batch_of;
  auto operator()(std::int64_t k) const { return batch_of(k / batches_per_epoch, k % batches_per_epoch); }
};

/// `end` items of the stream of epochs (the type repeat and one_epoch share).
template <class BatchOf>
auto epochs(std::int64_t batches_per_epoch, BatchOf batch_of, std::int64_t end) {
  return ranges::views::iota(std::int64_t{0}, end) | ranges::views::transform(EpochBatch<BatchOf>{batches_per_epoch, std::move(batch_of)});
}

/// A fixed sequence of batches, kept for repeat: a view of an lvalue (or the view itself), or the
/// container moved into shared ownership.
template <class R>
auto hold(R&& batches) {
  if constexpr (std::is_lvalue_reference_v<R> || ranges::view_<std::remove_cvref_t<R>>) return ranges::views::all(std::forward<R>(batches));
  else return std::make_shared<const std::remove_cvref_t<R>>(std::forward<R>(batches));
}

template <class T>
inline constexpr bool is_shared_ptr = false;
template <class T>
inline constexpr bool is_shared_ptr<std::shared_ptr<T>> = true;

/// Batch `index` of a held sequence, whatever the epoch (a copy: a tensor costs a reference count).
template <class Held, class Value>
struct HeldBatch {
  Held held;
  Value operator()(std::int64_t /*epoch*/, std::int64_t index) const {
    if constexpr (is_shared_ptr<Held>) return Value(ranges::begin(*held)[index]);
    else return Value(ranges::begin(held)[index]);
  }
};

DETTRIAL_INLINE void check_batches_per_epoch(std::int64_t batches_per_epoch, const char* who);
DETTRIAL_INLINE void check_replicas(std::int64_t num_replicas, std::int64_t rank);
DETTRIAL_INLINE void check_skip(std::int64_t skip);
}  // namespace detail

/**
 * @brief Determined's `RepeatBatchSampler` (and `RepeatSampler`): epoch after epoch, endlessly.
 * - `samplers::repeat(batches_per_epoch, batch_of)`: batch `k` of the stream is
 *   `batch_of(k / batches_per_epoch, k % batches_per_epoch)`, so each epoch may differ (a shuffle).
 * - `batches | samplers::repeat` (or `samplers::repeat(batches)`): a fixed sequence (random access,
 *   sized), the same every epoch. An lvalue is viewed (keep it alive), an rvalue container is kept.
 * Random access: position `k` costs one call, whatever `k`.
 */
struct repeat_fn {
  template <class BatchOf>
    requires std::invocable<const BatchOf&, std::int64_t, std::int64_t>
  auto operator()(std::int64_t batches_per_epoch, BatchOf batch_of) const {
    detail::check_batches_per_epoch(batches_per_epoch, "repeat");
    return detail::epochs(batches_per_epoch, std::move(batch_of), std::numeric_limits<std::int64_t>::max());
  }
  template <class R>
    requires ranges::random_access_range<R> && ranges::sized_range<R>
  auto operator()(R&& batches) const {
    const auto n = static_cast<std::int64_t>(ranges::size(batches));
    using Held = decltype(detail::hold(std::forward<R>(batches)));
    return (*this)(n, detail::HeldBatch<Held, ranges::range_value_t<R>>{detail::hold(std::forward<R>(batches))});
  }
  template <class R>
    requires ranges::random_access_range<R> && ranges::sized_range<R>
  friend auto operator|(R&& batches, const repeat_fn& self) {
    return self(std::forward<R>(batches));
  }
};
/// See repeat_fn.
inline constexpr repeat_fn repeat{};

/// One epoch of `batch_of(0, index)`: the chain without repeat (validation). The same view type as
/// `samplers::repeat(batches_per_epoch, batch_of)`, so either can be chosen at run time.
struct one_epoch_fn {
  template <class BatchOf>
    requires std::invocable<const BatchOf&, std::int64_t, std::int64_t>
  auto operator()(std::int64_t batches_per_epoch, BatchOf batch_of) const {
    detail::check_batches_per_epoch(batches_per_epoch, "one_epoch");
    return detail::epochs(batches_per_epoch, std::move(batch_of), batches_per_epoch);
  }
};
/// See one_epoch_fn.
inline constexpr one_epoch_fn one_epoch{};

/**
 * @brief Determined's `DistributedBatchSampler` (and `DistributedSampler`): rank `rank` of
 * `num_replicas` takes every `num_replicas`-th item, starting at item `rank`. A view adaptor:
 * `stream | samplers::distribute(num_replicas, rank)`; over a sized sequence its length is
 * `distributed_length(size, num_replicas, rank)`. Apply it after repeat (Determined's rule: shard the
 * endless stream, so ranks never drift apart at epoch ends).
 */
struct distribute_fn {
  auto operator()(std::int64_t num_replicas, std::int64_t rank) const {
    detail::check_replicas(num_replicas, rank);
    return ranges::views::drop(rank) | ranges::views::stride(num_replicas);
  }
};
/// See distribute_fn.
inline constexpr distribute_fn distribute{};

/**
 * @brief Determined's `SkipBatchSampler` (and `SkipSampler`): passes over the first `n` items. A view
 * adaptor: `stream | samplers::skip(n)`; on a random-access stream nothing of the skipped items is
 * computed. Apply it last, after repeat and distribute, counting this rank's batches (Determined's
 * `steps_completed`).
 */
struct skip_fn {
  auto operator()(std::int64_t n) const {
    detail::check_skip(n);
    return ranges::views::drop(n);
  }
};
/// See skip_fn.
inline constexpr skip_fn skip{};

}  // namespace samplers
}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

#include <ATen/CPUGeneratorImpl.h>

namespace dettrial::samplers {

DETTRIAL_INLINE ReproducibleShuffleSampler::ReproducibleShuffleSampler(std::int64_t records, std::uint64_t seed)
    : records_(records), seed_(seed) {
  if (records_ < 0) throw DataError("samplers::ReproducibleShuffleSampler: cannot shuffle " + std::to_string(records_) + " records");
}

DETTRIAL_INLINE ReproducibleShuffleSampler::ReproducibleShuffleSampler(SamplerFunction inner, std::uint64_t seed)
    : inner_(std::move(inner)), seed_(seed) {
  if (!inner_) throw DataError("samplers::ReproducibleShuffleSampler: the inner sampler is empty");
}

DETTRIAL_INLINE torch::Tensor ReproducibleShuffleSampler::operator()(std::int64_t epoch) const {
  if (!inner_) return permutation(records_, seed_, epoch);
  const torch::Tensor order = inner_(epoch);
  if (!order.defined() || order.dim() != 1)
    throw DataError("samplers::ReproducibleShuffleSampler: the inner sampler must return a 1-D tensor of record indices (epoch " +
                    std::to_string(epoch) + ")");
  return order.to(torch::kCPU).index_select(0, permutation(order.size(0), seed_, epoch));
}

DETTRIAL_INLINE torch::Tensor ReproducibleShuffleSampler::permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  const std::uint64_t mixed = dettrial::detail::mix64(seed ^ (static_cast<std::uint64_t>(epoch) * dettrial::detail::golden_gamma));
  auto generator = at::detail::createCPUGenerator(mixed);
  return torch::randperm(n, generator, torch::TensorOptions().dtype(torch::kLong));
}

namespace detail {
DETTRIAL_INLINE void check_batches_per_epoch(std::int64_t batches_per_epoch, const char* who) {
  if (batches_per_epoch < 1)
    throw DataError(std::string("samplers::") + who + ": an epoch needs at least one batch, not " + std::to_string(batches_per_epoch));
}
DETTRIAL_INLINE void check_replicas(std::int64_t num_replicas, std::int64_t rank) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw DataError("samplers::distribute: rank " + std::to_string(rank) + " is not among " + std::to_string(num_replicas) + " replicas");
}
DETTRIAL_INLINE void check_skip(std::int64_t skip) {
  if (skip < 0) throw DataError("samplers::skip: cannot skip a negative number of batches (" + std::to_string(skip) + ")");
}
}  // namespace detail

}  // namespace dettrial::samplers
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/data/samplers.hpp

namespace dettrial {

/**
 * @brief The shuffle seeds of the epochs of one pass, drawn from LibTorch's global CPU generator as
 * Python's `RandomSampler` draws them (one int64 `random_()` when the epoch's first batch is asked
 * for): the order Determined's `pytorch.DataLoader(shuffle=True)` reads, and every random draw after
 * it (dropout) as a Determined run makes them. The training thread draws; workers reading ahead wait.
 */
class EpochSeeds {
 public:
  /// A new pass (a new iterator in Python): nothing drawn yet.
  void reset();
  /// Draws, in order, the seeds of the epochs up to `epoch` that are not drawn yet.
  void draw_through(std::int64_t epoch);
  /// Epoch `epoch`'s seed, once it is drawn (blocks until then).
  std::uint64_t wait(std::int64_t epoch) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable drawn_;
  std::vector<std::uint64_t> seeds_;
};

/// The records of one batch: `count` positions of the epoch's order starting at `first`.
struct BatchSlice {
  std::int64_t epoch = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  /// The record indices (int64, CPU) when the order is shuffled or a user's sampler or batch sampler
  /// gives it; undefined for the identity order (records `first .. first+count-1`).
  torch::Tensor indices;
  /// A share of a regrouped global batch across an epoch's end: where in it each next epoch's records
  /// begin (`first` is then meaningless; `indices` holds the records). Empty otherwise.
  std::vector<std::int64_t> epoch_starts;
};

/**
 * @brief Record order and batching for one dataset size, with Determined's sampler semantics.
 *
 * Epoch `e`'s order is a permutation drawn from (seed, e) alone (or the identity without shuffling),
 * or what a user's sampler or batch sampler gives for `e`, so any batch of any epoch can be computed
 * on its own: that is what makes skipping O(1) and prefetching order-preserving. Batches of the
 * endless (repeated) stream are numbered globally and dealt out to ranks by stride, like Determined's
 * Repeat → DistributedBatch → Skip chain (samplers::repeat, samplers::distribute, samplers::skip).
 *
 * A shuffled or user-given epoch is computed once, on first use, and kept while it is read (the
 * last epochs used, enough for the loader's prefetch): a user's sampler is called at most once per
 * epoch read in order, never per batch, and never for epochs that a skip passes over whole (epoch 0
 * excepted, called by the constructor to learn the epoch's length).
 */
class BatchSampler {
 public:
  /// The built-in order: the records in order, or shuffled per epoch from (seed, epoch).
  BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle, std::uint64_t seed);
  /// A sampler's order of each epoch (Python's `sampler=`), cut into batches of `batch_size`.
  BatchSampler(std::int64_t records, SamplerFunction sampler, std::int64_t batch_size, bool drop_last, std::uint64_t seed);
  /// A batch sampler's batches of each epoch (Python's `batch_sampler=`).
  BatchSampler(std::int64_t records, BatchSamplerFunction batch_sampler, std::uint64_t seed);

  /// The dataset's records.
  std::int64_t records() const { return records_; }
  /// Records per batch (the last one of an epoch may be short); 0 with a batch sampler.
  std::int64_t batch_size() const { return batch_size_; }
  bool shuffle() const { return shuffle_; }
  bool has_sampler() const { return user_ && user_->sampler; }
  bool has_batch_sampler() const { return user_ && user_->batch_sampler; }
  std::uint64_t seed() const { return seed_; }
  /// Changes the shuffle seed (a resumed trial gets back the order it was trained with). A user's
  /// sampler does not depend on it: its cached epochs are kept.
  void set_seed(std::uint64_t seed);

  /// Batches in one epoch, before sharding.
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  /// Batches one rank reads per epoch: Determined's `len(DistributedBatchSampler)`, `len//n + (len%n > rank)`.
  std::int64_t batches_for(const LoaderChain& chain) const {
    return samplers::distributed_length(batches_per_epoch_, chain.num_replicas, chain.rank);
  }

  /// Batch `index` of epoch `epoch`.
  BatchSlice batch(std::int64_t epoch, std::int64_t index) const;
  /// Batch `global` of the endless stream of epochs (batch `global % len` of epoch `global / len`).
  BatchSlice global_batch(std::int64_t global) const;

  /// The same order cut into batches of `batch_size` (a batch sampler's batches are its own). It
  /// shares this sampler's epochs: a run resumed on another rank count reads the stream of the rank
  /// count it began with, whose batches are a different share of the same global batch.
  BatchSampler with_batch_size(std::int64_t batch_size) const;

  /**
   * @brief Rank `rank` of `ranks`' share of global batch `step` of the endless stream as `layout`
   * ranks read it: the records of this sampler's batches `step*layout .. step*layout+layout-1` (what
   * those ranks' batches `step` hold), in that order, cut into `ranks` contiguous runs whose sizes
   * differ by at most one (equal when `ranks` divides the batch), run `rank`. O(layout) whatever `step`.
   */
  BatchSlice share_of_global_batch(std::int64_t step, std::int64_t layout, std::int64_t ranks, std::int64_t rank) const;

  /// The fewest records any global batch of `layout` of this sampler's batches can hold: the size of
  /// a batch, less what the epochs' short last batches leave out. Unknown (0) for a batch sampler.
  std::int64_t fewest_records_per_global_batch(std::int64_t layout) const;

  /**
   * @brief The slices a rank reads under `chain`: Determined's chain, as views. The batches of the
   * epochs (endless when repeating, one epoch otherwise), this rank's share of them (every
   * `num_replicas`-th, from its rank on), without the first `skip` of those. A random-access view:
   * skipping costs nothing, and the loader's workers read any position of it.
   */
  auto slices(const LoaderChain& chain) const {
    auto batch_of = [self = *this](std::int64_t epoch, std::int64_t index) { return self.batch(epoch, index); };
    auto epochs = chain.repeat ? samplers::repeat(batches_per_epoch_, batch_of) : samplers::one_epoch(batches_per_epoch_, batch_of);
    return std::move(epochs) | samplers::distribute(chain.num_replicas, chain.rank) | samplers::skip(chain.skip);
  }

  /// The order of epoch `e`: the records of its batches, in order (int64, CPU). For a batch sampler,
  /// its batches concatenated.
  torch::Tensor order(std::int64_t epoch) const;

  /// Draws each epoch's shuffle seed from LibTorch's global generator, in Python's DataLoader's
  /// way (see EpochSeeds), instead of from (seed, epoch).
  void use_global_generator() { epoch_seeds_ = std::make_shared<EpochSeeds>(); }
  /// Whether the order draws from LibTorch's global generator (DataLoaderOptions::determined_order).
  bool draws_from_global_generator() const { return epoch_seeds_ != nullptr; }
  /// With the global generator: a new pass begins, whose epochs draw their seeds anew.
  void begin_pass() const;
  /// With the global generator and shuffling: draws the seeds of the epochs up to `epoch`.
  void draw_seeds_through(std::int64_t epoch) const {
    if (epoch_seeds_ && shuffle_) epoch_seeds_->draw_through(epoch);
  }

  /// Keeps enough epochs cached for a reader up to `batches_in_flight` of this rank's batches ahead
  /// under `chain` (the loader's prefetch), so no epoch is computed twice while it is being read.
  /// Only grows the cache (a few epoch orders: O(records) each).
  void keep_epochs_in_flight(std::int64_t batches_in_flight, const LoaderChain& chain) const;

 private:
  struct User {
    SamplerFunction sampler;
    BatchSamplerFunction batch_sampler;
  };
  /// One epoch's order, computed once.
  struct EpochOrder {
    std::int64_t epoch = -1;
    torch::Tensor order;
    /// A batch sampler's batch `i` is `order[offsets[i], offsets[i+1])`; empty otherwise.
    std::vector<std::int64_t> offsets;
    std::uint64_t used = 0;  // when last used, for least-recently-used replacement
  };
  // The last epochs used: at least the two live at an epoch boundary while prefetching, more when
  // the prefetch spans several epochs. Shared by copies of the sampler.
  struct Cache {
    std::mutex mutex;
    std::vector<EpochOrder> epochs;
    std::size_t capacity = 2;
    std::uint64_t clock = 0;
  };

  /// Epoch `epoch`'s order, from the cache or computed; the cache's mutex must be held.
  const EpochOrder& cached(std::int64_t epoch) const;
  /// Computes epoch `epoch`'s order: the permutation, or the user's sampler or batch sampler (checked).
  EpochOrder compute(std::int64_t epoch) const;
  /// Checks and converts what a user's sampler gave: 1-D, integer, within the dataset; an owned int64 copy.
  torch::Tensor user_indices(const torch::Tensor& given, const std::string& what, std::int64_t epoch) const;
  bool identity() const { return !user_ && !shuffle_; }

  std::int64_t records_;
  std::int64_t batch_size_;
  bool drop_last_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t batches_per_epoch_ = 0;
  std::int64_t order_length_ = -1;  // a sampler's epoch length, once known
  std::shared_ptr<const User> user_;
  std::shared_ptr<Cache> cache_;
  std::shared_ptr<EpochSeeds> epoch_seeds_;  // set by use_global_generator
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>

namespace dettrial {

DETTRIAL_INLINE void EpochSeeds::reset() {
  std::lock_guard lock(mutex_);
  seeds_.clear();
}

DETTRIAL_INLINE void EpochSeeds::draw_through(std::int64_t epoch) {
  {
    std::lock_guard lock(mutex_);
    while (static_cast<std::int64_t>(seeds_.size()) <= epoch)
      seeds_.push_back(static_cast<std::uint64_t>(torch::empty({}, torch::kLong).random_().item<std::int64_t>()));
  }
  drawn_.notify_all();
}

DETTRIAL_INLINE std::uint64_t EpochSeeds::wait(std::int64_t epoch) const {
  std::unique_lock lock(mutex_);
  drawn_.wait(lock, [&] { return static_cast<std::int64_t>(seeds_.size()) > epoch; });
  return seeds_[static_cast<std::size_t>(epoch)];
}

DETTRIAL_INLINE void BatchSampler::begin_pass() const {
  if (!epoch_seeds_) return;
  epoch_seeds_->reset();
  std::lock_guard lock(cache_->mutex);
  cache_->epochs.clear();  // the last pass's orders
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle, std::uint64_t seed)
    : records_(records), batch_size_(batch_size), drop_last_(drop_last), shuffle_(shuffle), seed_(seed), cache_(std::make_shared<Cache>()) {
  if (batch_size_ < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size_));
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  if (drop_last_ && batch_size_ > records_)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size_) + " is larger than the dataset's " + std::to_string(records_) +
                    " records, so drop_last leaves no batch");
  batches_per_epoch_ = drop_last_ ? records_ / batch_size_ : (records_ + batch_size_ - 1) / batch_size_;
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, SamplerFunction sampler, std::int64_t batch_size, bool drop_last,
                                           std::uint64_t seed)
    : records_(records),
      batch_size_(batch_size),
      drop_last_(drop_last),
      shuffle_(false),
      seed_(seed),
      user_(std::make_shared<const User>(User{std::move(sampler), {}})),
      cache_(std::make_shared<Cache>()) {
  if (!user_->sampler) throw DataError("DataLoader: the sampler is an empty function");
  if (batch_size_ < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size_));
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  {
    std::lock_guard lock(cache_->mutex);
    order_length_ = cached(0).order.size(0);
  }
  if (drop_last_ && batch_size_ > order_length_)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size_) + " is larger than the sampler's " +
                    std::to_string(order_length_) + " records, so drop_last leaves no batch");
  batches_per_epoch_ = drop_last_ ? order_length_ / batch_size_ : (order_length_ + batch_size_ - 1) / batch_size_;
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, BatchSamplerFunction batch_sampler, std::uint64_t seed)
    : records_(records),
      batch_size_(0),
      drop_last_(false),
      shuffle_(false),
      seed_(seed),
      user_(std::make_shared<const User>(User{{}, std::move(batch_sampler)})),
      cache_(std::make_shared<Cache>()) {
  if (!user_->batch_sampler) throw DataError("DataLoader: the batch_sampler is an empty function");
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  std::lock_guard lock(cache_->mutex);
  batches_per_epoch_ = static_cast<std::int64_t>(cached(0).offsets.size()) - 1;
}

DETTRIAL_INLINE void BatchSampler::set_seed(std::uint64_t seed) {
  seed_ = seed;
  if (!user_) cache_ = std::make_shared<Cache>();
}

DETTRIAL_INLINE BatchSlice BatchSampler::batch(std::int64_t epoch, std::int64_t index) const {
  BatchSlice s;
  s.epoch = epoch;
  if (identity()) {
    s.first = index * batch_size_;
    s.count = std::min(batch_size_, records_ - s.first);
    return s;
  }
  if (epoch_seeds_) epoch_seeds_->wait(epoch);  // before the cache's lock: the training thread draws
  std::lock_guard lock(cache_->mutex);
  const EpochOrder& e = cached(epoch);
  if (e.offsets.empty()) {
    s.first = index * batch_size_;
    s.count = std::min(batch_size_, e.order.size(0) - s.first);
  } else {
    s.first = e.offsets[static_cast<std::size_t>(index)];
    s.count = e.offsets[static_cast<std::size_t>(index) + 1] - s.first;
  }
  s.indices = e.order.narrow(0, s.first, s.count);
  return s;
}

DETTRIAL_INLINE BatchSlice BatchSampler::global_batch(std::int64_t global) const {
  return batch(global / batches_per_epoch_, global % batches_per_epoch_);
}

DETTRIAL_INLINE BatchSampler BatchSampler::with_batch_size(std::int64_t batch_size) const {
  if (batch_size == batch_size_ || has_batch_sampler()) return *this;
  if (batch_size < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size));
  BatchSampler other = *this;
  other.batch_size_ = batch_size;
  const std::int64_t length = has_sampler() ? order_length_ : records_;
  if (drop_last_ && batch_size > length)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size) + " is larger than the " + std::to_string(length) +
                    " records of an epoch, so drop_last leaves no batch");
  other.batches_per_epoch_ = drop_last_ ? length / batch_size : (length + batch_size - 1) / batch_size;
  return other;
}

DETTRIAL_INLINE BatchSlice BatchSampler::share_of_global_batch(std::int64_t step, std::int64_t layout, std::int64_t ranks,
                                                               std::int64_t rank) const {
  std::vector<BatchSlice> parts;
  parts.reserve(static_cast<std::size_t>(layout));
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < layout; ++j) {
    parts.push_back(global_batch(step * layout + j));
    total += parts.back().count;
  }
  const std::int64_t begin = rank * total / ranks, end = (rank + 1) * total / ranks;
  if (begin == end)
    throw DataError("DataLoader: global batch " + std::to_string(step) + " holds " + std::to_string(total) + " records, too few for " +
                    std::to_string(ranks) + " ranks to share (an epoch's short last batch); resume on " + std::to_string(layout) +
                    " rank(s), or set drop_last");
  // The runs of the parts that fall in [begin, end), in order.
  std::vector<BatchSlice> pieces;
  std::int64_t offset = 0;
  for (BatchSlice& part : parts) {
    const std::int64_t count = part.count;
    const std::int64_t from = std::max(begin, offset), to = std::min(end, offset + count);
    if (from < to) {
      BatchSlice piece = std::move(part);
      const std::int64_t skipped = from - offset;
      piece.first += skipped;
      piece.count = to - from;
      if (piece.indices.defined()) piece.indices = piece.indices.narrow(0, skipped, piece.count);
      pieces.push_back(std::move(piece));
    }
    offset += count;
  }
  if (pieces.size() == 1) return std::move(pieces.front());
  // Runs of several batches: their records, and where each later epoch's begin.
  BatchSlice share;
  share.epoch = pieces.front().epoch;
  share.first = pieces.front().first;
  share.count = end - begin;
  std::vector<torch::Tensor> records;
  records.reserve(pieces.size());
  std::int64_t position = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const BatchSlice& piece = pieces[i];
    if (i > 0 && piece.epoch != pieces[i - 1].epoch) share.epoch_starts.push_back(position);
    records.push_back(piece.indices.defined() ? piece.indices : torch::arange(piece.first, piece.first + piece.count, torch::kLong));
    position += piece.count;
  }
  share.indices = torch::cat(records);
  return share;
}

DETTRIAL_INLINE std::int64_t BatchSampler::fewest_records_per_global_batch(std::int64_t layout) const {
  if (has_batch_sampler()) return 0;
  const std::int64_t length = has_sampler() ? order_length_ : records_;
  const std::int64_t short_by = drop_last_ || length % batch_size_ == 0 ? 0 : batch_size_ - length % batch_size_;
  // `layout` consecutive batches hold at most ceil(layout / batches_per_epoch) epochs' last batches.
  const std::int64_t last_batches = (layout + batches_per_epoch_ - 1) / batches_per_epoch_;
  return layout * batch_size_ - last_batches * short_by;
}

DETTRIAL_INLINE torch::Tensor BatchSampler::order(std::int64_t epoch) const {
  if (identity()) return torch::arange(records_, torch::kLong);
  if (epoch_seeds_) epoch_seeds_->wait(epoch);
  std::lock_guard lock(cache_->mutex);
  return cached(epoch).order;
}

DETTRIAL_INLINE void BatchSampler::keep_epochs_in_flight(std::int64_t batches_in_flight, const LoaderChain& chain) const {
  // Read in order on one thread, one epoch is live (two at a boundary). With workers reading up to
  // `batches_in_flight` ahead, in any order within that window, an epoch may still be needed while
  // positions up to a window either side of it are read: the epochs of two windows, and the ends.
  const std::int64_t window_epochs = batches_in_flight * chain.num_replicas / batches_per_epoch_;
  const auto needed = static_cast<std::size_t>(batches_in_flight <= 1 ? 2 : 2 * window_epochs + 4);
  std::lock_guard lock(cache_->mutex);
  cache_->capacity = std::max(cache_->capacity, needed);
}

DETTRIAL_INLINE const BatchSampler::EpochOrder& BatchSampler::cached(std::int64_t epoch) const {
  Cache& cache = *cache_;
  const std::uint64_t now = ++cache.clock;
  for (EpochOrder& e : cache.epochs)
    if (e.epoch == epoch) {
      e.used = now;
      return e;
    }
  EpochOrder fresh = compute(epoch);
  fresh.used = now;
  if (cache.epochs.size() < cache.capacity) return cache.epochs.emplace_back(std::move(fresh));
  auto oldest =
      std::min_element(cache.epochs.begin(), cache.epochs.end(), [](const EpochOrder& a, const EpochOrder& b) { return a.used < b.used; });
  *oldest = std::move(fresh);
  return *oldest;
}

DETTRIAL_INLINE BatchSampler::EpochOrder BatchSampler::compute(std::int64_t epoch) const {
  EpochOrder e;
  e.epoch = epoch;
  const std::string in_epoch = " in epoch " + std::to_string(epoch);
  if (!user_ && epoch_seeds_) {
    // Python's RandomSampler: torch.randperm(n, generator=torch.Generator().manual_seed(seed)).
    e.order = torch::randperm(records_, at::detail::createCPUGenerator(epoch_seeds_->wait(epoch)), torch::kLong);
  } else if (!user_) {
    e.order = samplers::ReproducibleShuffleSampler::permutation(records_, seed_, epoch);
  } else if (user_->sampler) {
    e.order = user_indices(user_->sampler(epoch), "the sampler", epoch);
    const std::int64_t length = e.order.size(0);
    if (length == 0) throw DataError("DataLoader: the sampler gave no records" + in_epoch);
    if (order_length_ >= 0 && length != order_length_)
      throw DataError("DataLoader: the sampler gave " + std::to_string(length) + " records" + in_epoch + " but " +
                      std::to_string(order_length_) +
                      " in epoch 0; every epoch must have the same length (repeat, "
                      "shard and skip count on it)");
  } else {
    std::vector<torch::Tensor> batches = user_->batch_sampler(epoch);
    const auto count = static_cast<std::int64_t>(batches.size());
    if (count == 0) throw DataError("DataLoader: the batch_sampler gave no batches" + in_epoch);
    if (batches_per_epoch_ > 0 && count != batches_per_epoch_)
      throw DataError("DataLoader: the batch_sampler gave " + std::to_string(count) + " batches" + in_epoch + " but " +
                      std::to_string(batches_per_epoch_) +
                      " in epoch 0; every epoch must have the same number of batches "
                      "(repeat, shard and skip count on it)");
    e.offsets.reserve(batches.size() + 1);
    e.offsets.push_back(0);
    for (std::size_t i = 0; i < batches.size(); ++i) {
      batches[i] = user_indices(batches[i], "batch " + std::to_string(i) + " of the batch_sampler", epoch);
      if (batches[i].size(0) == 0) throw DataError("DataLoader: batch " + std::to_string(i) + " of the batch_sampler is empty" + in_epoch);
      e.offsets.push_back(e.offsets.back() + batches[i].size(0));
    }
    e.order = torch::cat(batches);
  }
  return e;
}

DETTRIAL_INLINE torch::Tensor BatchSampler::user_indices(const torch::Tensor& given, const std::string& what, std::int64_t epoch) const {
  const std::string in_epoch = " in epoch " + std::to_string(epoch);
  if (!given.defined() || given.dim() != 1)
    throw DataError("DataLoader: " + what + " must give a 1-D tensor of record indices, not " +
                    (given.defined() ? "a " + std::to_string(given.dim()) + "-D tensor" : std::string("an undefined tensor")) + in_epoch);
  if (!c10::isIntegralType(given.scalar_type(), /*includeBool=*/false))
    throw DataError("DataLoader: " + what + " must give integer record indices, not " + std::string(c10::toString(given.scalar_type())) +
                    in_epoch);
  torch::Tensor indices = given.to(torch::kCPU, torch::kLong, /*non_blocking=*/false, /*copy=*/true).contiguous();
  if (indices.numel() > 0) {
    const std::int64_t low = indices.min().item<std::int64_t>();
    const std::int64_t high = indices.max().item<std::int64_t>();
    if (low < 0 || high >= records_)
      throw DataError("DataLoader: " + what + " gave record index " + std::to_string(low < 0 ? low : high) + in_epoch +
                      ", but the dataset has " + std::to_string(records_) + " records");
  }
  return indices;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/data/sampler.hpp

namespace dettrial {

/**
 * @brief Tensors indexed together along their first dimension (features, labels, ...).
 * Batches are `std::tuple<torch::Tensor, ...>`, one element per tensor.
 */
template <std::size_t N>
class TensorDataset {
 public:
  template <class... Ts>
    requires(sizeof...(Ts) == N && (std::same_as<std::remove_cvref_t<Ts>, torch::Tensor> && ...))
  explicit TensorDataset(Ts&&... tensors) : tensors_{std::forward<Ts>(tensors)...} {
    for (const auto& t : tensors_) {
      if (!t.defined() || t.dim() == 0) throw DataError("TensorDataset needs tensors with a first (record) dimension");
      if (t.size(0) != tensors_[0].size(0))
        throw DataError("TensorDataset tensors disagree on the number of records: " + std::to_string(tensors_[0].size(0)) + " and " +
                        std::to_string(t.size(0)));
    }
  }

  std::int64_t size() const { return tensors_[0].size(0); }

  /// The records at `indices`, gathered where the tensors are: on a GPU for a dataset moved there
  /// (see to()), with the indices copied to it first (pinned, without waiting for the device).
  auto get_batch(const torch::Tensor& indices) const {
    const torch::Tensor on_device = indices.device() == tensors_[0].device() ? indices : device_indices(indices);
    return make([&](const torch::Tensor& t) { return t.index_select(0, on_device); });
  }
  /**
   * @brief The same records on `device`: kept there, each shuffled batch is gathered on the device
   * (the same records in the same order as on the CPU, for the same seed), and nothing is copied per
   * batch but its indices.
   * @code{.cpp}
   * dettrial::TensorDataset(images, labels).to(context.device())
   * @endcode
   */
  TensorDataset to(const torch::Device& device) const {
    TensorDataset moved = *this;
    for (auto& t : moved.tensors_) t = t.to(device);
    return moved;
  }
  torch::Device device() const { return tensors_[0].device(); }
  /// Records [begin, end) as fresh tensors (one contiguous copy each), so in-place changes to a batch
  /// never reach the dataset.
  auto get_range(std::int64_t begin, std::int64_t end) const {
    return make([&](const torch::Tensor& t) { return t.narrow(0, begin, end - begin).clone(); });
  }
  const torch::Tensor& tensor(std::size_t i) const { return tensors_[i]; }

 private:
  torch::Tensor device_indices(const torch::Tensor& indices) const {
    // A copy from pageable memory would wait for the device's queue; from pinned memory it does not.
    const bool pin = tensors_[0].is_cuda() && indices.device().is_cpu();
    return (pin ? indices.pin_memory() : indices).to(tensors_[0].device(), /*non_blocking=*/pin);
  }
  template <class F>
  auto make(F&& f) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::tuple{f(tensors_[I])...}; }(std::make_index_sequence<N>{});
  }
  std::array<torch::Tensor, N> tensors_;
};

template <class... Ts>
TensorDataset(Ts&&...) -> TensorDataset<sizeof...(Ts)>;

/// Options of a DataLoader.
struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  /// A different, reproducible order every epoch.
  bool shuffle = false;
  /// Drop the last, short batch of an epoch.
  bool drop_last = false;
  /// A sampler (Python's `sampler=`): the record order of each epoch, `torch::Tensor(std::int64_t epoch)`
  /// (1-D, integer record indices), cut into batches by batch_size and drop_last. Every epoch must
  /// have the same length. Mutually exclusive with shuffle: shuffle in the sampler
  /// (samplers::ReproducibleShuffleSampler). Called once per epoch, never per batch (under the
  /// loader's lock, possibly on a worker thread); it must be a function of the epoch, the same on
  /// every rank, since a resumed run recomputes the epoch it resumes in.
  SamplerFunction sampler{};
  /// A batch sampler (Python's `batch_sampler=`): the batches of each epoch,
  /// `std::vector<torch::Tensor>(std::int64_t epoch)`, of any sizes; every epoch must have the same
  /// number of them. batch_size, shuffle, drop_last and sampler must then be left at their defaults.
  /// Called like a sampler: once per epoch, a function of the epoch.
  BatchSamplerFunction batch_sampler{};
  /// The shuffle seed; unset means one drawn from LibTorch's global generator (which the trial
  /// seed has seeded), so the order follows the trial seed.
  std::optional<std::uint64_t> seed{};
  /// Threads reading batches in the background (0: read on the training thread). The order of
  /// batches is the same whatever the number. The dataset's get_batch must then be thread-safe.
  /// Unset: what the dataset asks for with `default_workers()` (image datasets: the process's share
  /// of the CPUs), else 0.
  std::optional<int> workers{};
  /// Batches read ahead per worker (the bounded queue's depth is workers x prefetch).
  int prefetch = 2;
  /// Read in the order Determined 0.38's `pytorch.DataLoader` (Python's DataLoader) reads, drawing
  /// from LibTorch's global CPU generator as it does: one int64 when a pass starts (the iterator's
  /// base seed; a resumed training pass draws none, as Determined draws it before it restores the
  /// generator) and, with shuffle, one when each epoch's first batch is read (RandomSampler's seed,
  /// its order `randperm(records, seed)`). A run continued from a Determined checkpoint then reads
  /// the records Determined would, and its dropout masks match. Not with sampler, batch_sampler or seed.
  bool determined_order = false;
  /// Copy batches into pinned (page-locked) memory, so copies to the GPU can be non-blocking.
  /// Unset: when LibTorch has CUDA and a GPU is present.
  std::optional<bool> pin_memory{};
};

namespace detail {
template <class D>
auto as_batch_dataset(D dataset) {
  if constexpr (BatchDataset<D>) return dataset;
  else return ExampleBatches<D>(std::move(dataset));
}
/// The loader's record order and batching for its options: built-in, a sampler's or a batch
/// sampler's. Throws DataError naming an option that conflicts with a sampler or batch sampler.
DETTRIAL_INLINE BatchSampler make_batch_sampler(std::int64_t records, const DataLoaderOptions& options, std::uint64_t seed);
/// See DataLoader::layout_sampler.
DETTRIAL_INLINE BatchSampler layout_sampler(const BatchSampler& sampler, const LoaderChain& chain);
}  // namespace detail

/**
 * @brief Reads a dataset in batches, in a reproducible order, optionally on background threads.
 *
 * Takes a batch-level dataset (`get_batch(indices)`, vectorised: dettrial::TensorDataset) or a
 * per-example one (`get(index)`, collated by dettrial::collate_fn or by `with_collate`). The trainer
 * reads it through `batches(chain)`, which applies Determined's repeat, shard and skip; iterating the
 * loader itself is one unsharded pass (what `evaluate_full_dataset` sees). The order of an epoch is the
 * built-in one (`shuffle`), or a user's `sampler` or `batch_sampler` (see DataLoaderOptions), with the
 * same repeat, shard and skip on top.
 * @code{.cpp}
 * dettrial::DataLoader loader(dettrial::TensorDataset(images, labels),
 *                             {.batch_size = ctx.get_per_slot_batch_size(), .shuffle = true, .workers = 2});
 * @endcode
 */
template <class D>
class DataLoader {
  static_assert(BatchDataset<D> || ExampleDataset<D>,
                "dettrial::DataLoader<D>: D must be a dettrial::BatchDataset (size() and get_batch(indices) taking a "
                "1-D int64 tensor of record indices, like dettrial::TensorDataset) or a dettrial::ExampleDataset "
                "(size() and get(index))");

 public:
  using dataset_type = decltype(detail::as_batch_dataset(std::declval<D>()));
  using batch_type = std::remove_cvref_t<decltype(std::declval<const dataset_type&>().get_batch(std::declval<const torch::Tensor&>()))>;

  DataLoader(D dataset, DataLoaderOptions options)
      : dataset_(std::make_shared<const dataset_type>(detail::as_batch_dataset(std::move(dataset)))),
        options_(options),
        sampler_(detail::make_batch_sampler(static_cast<std::int64_t>(dataset_->size()), options_,
                                            options.seed || options.determined_order ? options.seed.value_or(0) : draw_seed())) {
    if (options_.workers && *options_.workers < 0) throw DataError("DataLoader workers must not be negative");
    if (options_.prefetch < 1) throw DataError("DataLoader prefetch must be at least 1");
    workers_ = options_.workers.value_or(default_workers(*dataset_));
    pin_ = options_.pin_memory.value_or(torch::cuda::is_available());
  }

  /// Batches per epoch (one process).
  std::int64_t size() const { return sampler_.batches_per_epoch(); }
  /// Batches one rank reads per epoch under `chain` (Determined's sharded length; with a layout
  /// of other ranks, that layout's chief's).
  std::int64_t batches_for(const LoaderChain& chain) const {
    if (regroups(chain)) return samplers::distributed_length(layout_sampler(chain).batches_per_epoch(), chain.layout_replicas, 0);
    return sampler_.batches_for(chain);
  }
  /// Keeps the global batches of another rank count (LoaderChain::layout_replicas).
  static constexpr bool keeps_global_batches = true;

  /**
   * @brief The sampler of the stream `chain.layout_replicas` ranks read, when it is not this job's:
   * batches of `batch_size * num_replicas / layout_replicas` records (the loader's batch size is a
   * rank's share of the global batch, `get_per_slot_batch_size()`). Throws when the global batch
   * does not divide among the layout's ranks, or when a global batch could hold fewer records than
   * this job has ranks.
   */
  BatchSampler layout_sampler(const LoaderChain& chain) const { return detail::layout_sampler(sampler_, chain); }
  std::int64_t num_records() const { return sampler_.records(); }
  const DataLoaderOptions& options() const { return options_; }
  /// The threads reading batches in the background (the option, or the dataset's default).
  int workers() const { return workers_; }
  /// What the trainer's start line says of this loader: "60000 records in batches of 64, shuffled,
  /// read by 2 worker threads (the dataset's default), 4 batches ahead".
  std::string describe() const {
    std::string text =
        std::to_string(num_records()) + " records in " +
        (sampler_.has_batch_sampler() ? std::string("a batch sampler's batches") : "batches of " + std::to_string(sampler_.batch_size())) +
        (sampler_.draws_from_global_generator() ? (sampler_.shuffle() ? ", shuffled in Determined's order" : ", in Determined's order")
         : sampler_.shuffle()                   ? ", shuffled"
         : sampler_.has_sampler()               ? ", in a sampler's order"
                                                : "");
    if (workers_ == 0) return text + ", read on the training thread";
    return text + ", read by " + std::to_string(workers_) + " worker thread" + (workers_ == 1 ? "" : "s") +
           (options_.workers ? "" : " (the dataset's default)") + ", " + std::to_string(workers_ * options_.prefetch) + " batches ahead";
  }
  std::uint64_t seed() const { return sampler_.seed(); }
  /// Changes the shuffle seed; streams made before keep the old one. (A user's sampler ignores it.)
  void set_seed(std::uint64_t seed) { sampler_.set_seed(seed); }
  const dataset_type& dataset() const { return *dataset_; }
  const BatchSampler& sampler() const { return sampler_; }

  /// Reads the records of one slice (thread-safe when the dataset is).
  batch_type read(const BatchSlice& slice) const {
    batch_type batch = [&] {
      const auto in_order = [&] { return torch::arange(slice.first, slice.first + slice.count, torch::kLong); };
      if constexpr (requires { dataset_->get_batch(slice.indices, BatchOrigin{}); }) {
        return dataset_->get_batch(slice.indices.defined() ? slice.indices : in_order(),
                                   BatchOrigin{slice.epoch, sampler_.seed(), slice.epoch_starts});
      } else {
        if (slice.indices.defined()) return dataset_->get_batch(slice.indices);
        if constexpr (requires { dataset_->get_range(slice.first, slice.first + slice.count); })
          return dataset_->get_range(slice.first, slice.first + slice.count);
        else return dataset_->get_batch(in_order());
      }
    }();
    if (pin_) pin_in_place(batch);
    return batch;
  }

  /// The batches a rank reads under `chain`, in order, prefetched by the loader's workers.
  class Stream {
   public:
    class iterator {
     public:
      using value_type = batch_type;
      using difference_type = std::ptrdiff_t;
      iterator() = default;
      explicit iterator(Stream* stream) : stream_(stream) {}
      /// Reads the batch here when first asked for, not before: a batch is read when the training
      /// loop takes it, never one ahead (what it reads may draw from the global generator).
      batch_type& operator*() const {
        if (!current_) current_.emplace(stream_->next());
        return *current_;
      }
      iterator& operator++() {
        advance();
        return *this;
      }
      void operator++(int) { advance(); }
      friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.at_end(); }

     private:
      bool at_end() const { return !current_ && (!stream_ || stream_->exhausted()); }
      void advance() {
        if (!current_ && stream_ && !stream_->exhausted()) stream_->next();  // passed over unread
        current_.reset();
      }
      Stream* stream_ = nullptr;
      mutable std::optional<batch_type> current_;
    };

    Stream(const DataLoader& loader, LoaderChain chain)
        : loader_(&loader),
          slice_at_(loader, chain),
          chain_(chain),
          position_(chain.skip),
          end_(chain.repeat ? std::numeric_limits<std::int64_t>::max() : loader.batches_for(chain)) {
      if (loader.sampler_.draws_from_global_generator()) {
        loader.sampler_.begin_pass();
        // Python's iterator draws its base seed when made; Determined makes its training iterator
        // before it restores a checkpoint's generator, so a resumed pass (skip > 0) shows no draw.
        if (chain.skip == 0) torch::empty({}, torch::kLong).random_();
      }
      const int workers = loader.workers_;
      const std::int64_t in_flight = workers > 0 ? std::max(workers * loader.options_.prefetch, workers) : 1;
      if (slice_at_.layout) slice_at_.layout->keep_epochs_in_flight(in_flight * chain.layout_replicas, LoaderChain{.repeat = true});
      else loader.sampler_.keep_epochs_in_flight(in_flight, chain);
      if (workers > 0 && position_ < end_)
        prefetcher_ = std::make_unique<detail::Prefetcher<batch_type>>(
            [loader = loader_, slice_at = slice_at_](std::int64_t k) { return loader->read(slice_at(k)); }, position_, end_, workers,
            workers * loader.options_.prefetch);
    }
    Stream(Stream&&) = default;

    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() const { return {}; }
    /// The position (in this rank's batches) of the next batch.
    std::int64_t position() const { return position_; }

   private:
    bool exhausted() const { return position_ >= end_; }
    batch_type next() {
      const std::int64_t k = position_++;
      // The epoch of this rank's batch k in the stream of all ranks' batches: its seed is drawn
      // now, on the training thread, as Python's sampler draws it when that epoch's first batch is asked for.
      if (loader_->sampler_.draws_from_global_generator()) {
        if (slice_at_.layout)  // the last of the layout's batches that make up global batch k
          slice_at_.layout->draw_seeds_through(((k + 1) * chain_.layout_replicas - 1) / slice_at_.layout->batches_per_epoch());
        else loader_->sampler_.draw_seeds_through((chain_.rank + chain_.num_replicas * k) / loader_->sampler_.batches_per_epoch());
      }
      if (prefetcher_) return prefetcher_->take();
      return loader_->read(slice_at_(k));
    }

    using Slices = decltype(std::declval<const BatchSampler&>().slices(std::declval<const LoaderChain&>()));
    /// The slice of this rank's batch `k`: Determined's chain, or a share of the layout's global batch `k`.
    struct SliceAt {
      SliceAt(const DataLoader& loader, const LoaderChain& chain)
          : slices(loader.sampler_.slices(chain)),
            chain(chain),
            layout(loader.regroups(chain) ? std::optional(loader.layout_sampler(chain)) : std::nullopt) {}
      BatchSlice operator()(std::int64_t k) const {
        if (layout) return layout->share_of_global_batch(k, chain.layout_replicas, chain.num_replicas, chain.rank);
        return slices[k - chain.skip];
      }
      Slices slices;  // the sampler chain this stream reads
      LoaderChain chain;
      std::optional<BatchSampler> layout;  // the layout's stream, when the job regroups its global batches
    };
    const DataLoader* loader_;
    SliceAt slice_at_;
    LoaderChain chain_;
    std::int64_t position_;
    std::int64_t end_;
    std::unique_ptr<detail::Prefetcher<batch_type>> prefetcher_;
  };

  /// Determined's `get_data_loader(repeat, skip, num_replicas, rank)`: the batches this rank reads.
  Stream batches(const LoaderChain& chain) const {
    if (chain.num_replicas < 1 || chain.rank < 0 || chain.rank >= chain.num_replicas)
      throw DataError("DataLoader: rank " + std::to_string(chain.rank) + " is not among " + std::to_string(chain.num_replicas) +
                      " replicas");
    if (chain.skip < 0) throw DataError("DataLoader: cannot skip a negative number of batches");
    return Stream(*this, chain);
  }

  /// One unsharded pass over the data (epoch 0's order).
  class PassIterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    PassIterator() = default;
    explicit PassIterator(const DataLoader& loader)
        : stream_(std::make_shared<Stream>(loader.batches(LoaderChain{}))), it_(stream_->begin()) {}
    batch_type& operator*() const { return *it_; }
    PassIterator& operator++() {
      ++it_;
      return *this;
    }
    void operator++(int) { ++it_; }
    friend bool operator==(const PassIterator& p, std::default_sentinel_t s) { return !p.stream_ || p.it_ == s; }

   private:
    std::shared_ptr<Stream> stream_;  // shared: input iterators are copied by range algorithms
    typename Stream::iterator it_;
  };
  PassIterator begin() const { return PassIterator(*this); }
  std::default_sentinel_t end() const { return {}; }

 private:
  /// Whether `chain` reads the global batches of another rank count than its own.
  static bool regroups(const LoaderChain& chain) {
    return chain.repeat && chain.layout_replicas > 0 && chain.layout_replicas != chain.num_replicas;
  }
  static std::uint64_t draw_seed() {
    return static_cast<std::uint64_t>(torch::randint(0, std::numeric_limits<std::int64_t>::max(), {1}, torch::kLong).item<std::int64_t>());
  }
  static int default_workers(const dataset_type& dataset) {
    if constexpr (requires { dataset.default_workers(); }) return static_cast<int>(dataset.default_workers());
    else return 0;
  }
  static void pin_in_place(batch_type& batch) {
    detail::for_each_tensor(batch, [](torch::Tensor& t) {
      if (t.defined() && t.device().is_cpu() && !t.is_pinned()) t = t.pin_memory();
    });
  }

  std::shared_ptr<const dataset_type> dataset_;  // shared with worker threads of live streams
  DataLoaderOptions options_;
  BatchSampler sampler_;
  int workers_ = 0;
  bool pin_ = false;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE BatchSampler layout_sampler(const BatchSampler& sampler, const LoaderChain& chain) {
  const std::int64_t ranks = chain.num_replicas, layout = chain.layout_replicas;
  const std::string job = std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s");
  const std::string begun = "a run begun on " + std::to_string(layout) + " rank" + (layout == 1 ? "" : "s");
  BatchSampler stream = sampler;
  if (!sampler.has_batch_sampler()) {
    const std::int64_t global = sampler.batch_size() * ranks;
    if (global % layout != 0)
      throw DataError("DataLoader: the global batch of " + std::to_string(global) + " records (batch_size " +
                      std::to_string(sampler.batch_size()) + " on each of " + job + ") does not divide among the " +
                      std::to_string(layout) + " ranks of " + begun + ", whose global batches a resumed run keeps");
    stream = sampler.with_batch_size(global / layout);
  }
  if (const std::int64_t fewest = stream.fewest_records_per_global_batch(layout); fewest > 0 && fewest < ranks)
    throw DataError("DataLoader: " + begun + " has global batches of only " + std::to_string(fewest) + " record" +
                    (fewest == 1 ? "" : "s") + " at its epochs' ends (a short last batch), too few for " + job +
                    " to share; resume on at most " + std::to_string(fewest) + " rank" + (fewest == 1 ? "" : "s") + ", or set drop_last");
  return stream;
}

DETTRIAL_INLINE BatchSampler make_batch_sampler(std::int64_t records, const DataLoaderOptions& options, std::uint64_t seed) {
  if (options.determined_order) {
    const char* conflict = options.sampler ? "sampler" : options.batch_sampler ? "batch_sampler" : options.seed ? "seed" : nullptr;
    if (conflict)
      throw DataError(std::string("DataLoader: determined_order draws the order from LibTorch's global generator, as Determined does; "
                                  "it cannot be combined with ") +
                      conflict);
    BatchSampler sampler(records, options.batch_size, options.drop_last, options.shuffle, seed);
    sampler.use_global_generator();
    return sampler;
  }
  if (options.batch_sampler) {
    const char* conflict = options.sampler           ? "sampler"
                           : options.batch_size != 1 ? "batch_size"
                           : options.shuffle         ? "shuffle"
                           : options.drop_last       ? "drop_last"
                                                     : nullptr;
    if (conflict)
      throw DataError(std::string("DataLoader: the batch_sampler option is mutually exclusive with ") + conflict +
                      " (the batch sampler makes the batches: leave " + conflict + " at its default)");
    return BatchSampler(records, options.batch_sampler, seed);
  }
  if (options.sampler) {
    if (options.shuffle)
      throw DataError(
          "DataLoader: the sampler option is mutually exclusive with shuffle (shuffle in the sampler, with "
          "dettrial::samplers::ReproducibleShuffleSampler)");
    return BatchSampler(records, options.sampler, options.batch_size, options.drop_last, seed);
  }
  return BatchSampler(records, options.batch_size, options.drop_last, options.shuffle, seed);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/data/data_loader.hpp
// ---- begin dettrial/data/idx.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Reading IDX files (the MNIST format), raw or gzip-compressed, and MNIST-layout folders.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial {

/**
 * @brief Reads an IDX file (raw, or gzip: zlib reads both) into a tensor of its element type and
 * dimensions. Errors name the file and what is wrong with it.
 */
DETTRIAL_INLINE torch::Tensor read_idx(const std::filesystem::path& path);

/// Images (uint8, N x rows x cols) and labels (uint8, N) of one split of an MNIST-format folder.
struct MnistSplit {
  torch::Tensor images;
  torch::Tensor labels;
};

/**
 * @brief Loads split `train` or `t10k` of a folder in MNIST's layout (MNIST, Fashion-MNIST, ...):
 * `<split>-images-idx3-ubyte[.gz]` and `<split>-labels-idx1-ubyte[.gz]` (also `-images.idx3-ubyte`).
 */
DETTRIAL_INLINE MnistSplit load_mnist(const std::filesystem::path& dir, const std::string& split);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <zlib.h>

namespace dettrial {

DETTRIAL_INLINE torch::Tensor read_idx(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw DataError("cannot read IDX file '" + name + "': " + (std::filesystem::exists(path, ec) ? "not a file" : "no such file"));
  gzFile file = gzopen(name.c_str(), "rb");
  if (!file) throw DataError("cannot open IDX file '" + name + "': " + std::strerror(errno));
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{file};
  gzbuffer(file, 1 << 20);

  auto read_exact = [&](void* dst, std::size_t bytes, const char* what) {
    std::size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < bytes) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file, out + done, chunk);
      if (got < 0) {
        int code = 0;
        throw DataError("cannot read IDX file '" + name + "': " + gzerror(file, &code));
      }
      if (got == 0)
        throw DataError("IDX file '" + name + "' is truncated: its " + what + " needs " + std::to_string(bytes) + " bytes, found " +
                        std::to_string(done));
      done += static_cast<std::size_t>(got);
    }
  };

  std::array<unsigned char, 4> magic{};
  read_exact(magic.data(), 4, "header");
  if (magic[0] != 0 || magic[1] != 0) throw DataError("'" + name + "' is not an IDX file (its first two bytes are not zero)");
  torch::ScalarType dtype;
  std::size_t element_size;
  switch (magic[2]) {
    case 0x08: dtype = torch::kUInt8, element_size = 1; break;
    case 0x09: dtype = torch::kInt8, element_size = 1; break;
    case 0x0B: dtype = torch::kInt16, element_size = 2; break;
    case 0x0C: dtype = torch::kInt32, element_size = 4; break;
    case 0x0D: dtype = torch::kFloat32, element_size = 4; break;
    case 0x0E: dtype = torch::kFloat64, element_size = 8; break;
    default: {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02X", magic[2]);
      throw DataError("IDX file '" + name + "' has unknown element type " + code);
    }
  }
  const int rank = magic[3];
  if (rank < 1) throw DataError("IDX file '" + name + "' declares no dimensions");
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  std::size_t count = 1;
  for (auto& d : dims) {
    std::array<unsigned char, 4> b{};
    read_exact(b.data(), 4, "header");
    d = (std::int64_t{b[0]} << 24) | (std::int64_t{b[1]} << 16) | (std::int64_t{b[2]} << 8) | std::int64_t{b[3]};
    count *= static_cast<std::size_t>(d);
  }
  torch::Tensor out = torch::empty(dims, torch::TensorOptions().dtype(dtype));
  read_exact(out.data_ptr(), count * element_size, "data");
  if (element_size > 1) {  // IDX is big-endian
    auto* bytes = static_cast<unsigned char*>(out.data_ptr());
    for (std::size_t i = 0; i < count; ++i) std::reverse(bytes + i * element_size, bytes + (i + 1) * element_size);
  }
  return out;
}

DETTRIAL_INLINE MnistSplit load_mnist(const std::filesystem::path& dir, const std::string& split) {
  auto find = [&](const std::string& kind, const std::string& idx) {
    const std::array<std::string, 4> names = {split + "-" + kind + "-" + idx + "-ubyte.gz", split + "-" + kind + "-" + idx + "-ubyte",
                                              split + "-" + kind + "." + idx + "-ubyte.gz", split + "-" + kind + "." + idx + "-ubyte"};
    std::error_code ec;
    for (const auto& n : names)
      if (std::filesystem::is_regular_file(dir / n, ec)) return dir / n;
    throw DataError("no MNIST " + kind + " file for split '" + split + "' in '" + dir.string() + "' (looked for " + names[0] + ", " +
                    names[1] + ", " + names[2] + " and " + names[3] + ")");
  };
  MnistSplit s{read_idx(find("images", "idx3")), read_idx(find("labels", "idx1"))};
  if (s.images.dim() != 3 || s.labels.dim() != 1 || s.images.size(0) != s.labels.size(0))
    throw DataError("MNIST split '" + split + "' in '" + dir.string() + "' is inconsistent: images " + std::to_string(s.images.size(0)) +
                    " x ..., labels " + std::to_string(s.labels.size(0)));
  return s;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/data/idx.hpp
// ---- begin dettrial/vocabulary/metrics.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The metrics vocabulary: the Metrics a trial returns per batch, the reduced MetricValues
/// dettrial reports, and what a metric reducer is (concepts; the reducers are in metrics/).

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

namespace detail {
template <MetricReducer R>
constexpr auto reduced_metrics_type() {
  if constexpr (CrossSlotReducer<R>)
    return std::type_identity<decltype(std::declval<R&>().cross_slot_reduce(std::declval<const std::vector<per_slot_t<R>>&>()))>{};
  else return std::type_identity<decltype(std::declval<R&>().reduce())>{};
}
}  // namespace detail
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
// ---- end dettrial/vocabulary/metrics.hpp
// ---- begin dettrial/metrics/reducers.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metric reduction: Determined's averaging of training metrics over a workload, validation
/// reducers (avg, sum, max, min) per metric, and user reducer types.

#include <algorithm>
#include <concepts>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>


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

namespace detail {

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

}  // namespace detail
}  // namespace dettrial

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

namespace detail {

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

}  // namespace detail
}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/metrics/reducers.hpp
// ---- begin dettrial/optim/adadelta.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Adadelta, which LibTorch lacks: a `torch::optim::Optimizer` with Python's
/// `torch.optim.Adadelta` arithmetic, LibTorch's serialization, and Python's state-dict layout.

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/optim/handles.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a trial hands dettrial to train: a LibTorch model (a module holder or a shared
/// pointer to a module) and a LibTorch optimizer.

#include <concepts>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include <torch/torch.h>

// ---- begin dettrial/vocabulary/optim.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The optimization vocabulary: what a model, an optimizer, an LR scheduler, a step mode and
/// a clipping policy are to dettrial (concepts), and ScheduledLR, a scheduler with its step mode.

#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial {

/// A model as a trial holds it: a LibTorch module holder (`torch::nn::Sequential`, `MyNet`) or a
/// `std::shared_ptr` to a `torch::nn::Module`.
template <class M>
concept ModelHandle = requires(M& m) {
  { m.ptr() } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
} || requires(M& m) {
  { m.get() } -> std::convertible_to<torch::nn::Module*>;
  { std::shared_ptr<torch::nn::Module>(m) };
};

/// A LibTorch optimizer (torch::optim::SGD, Adam, ... or a user subclass of torch::optim::Optimizer).
template <class O>
concept TorchOptimizer = std::derived_from<std::remove_cvref_t<O>, torch::optim::Optimizer>;

/// Something with `step()`: LibTorch's schedulers (StepLR, ...) and any user type.
template <class S>
concept LRSchedulerLike = requires(S& s) { s.step(); };

/// A scheduler stepped with a metric (ReduceLROnPlateau): `step(double)`.
template <class S>
concept MetricLRSchedulerLike = requires(S& s, double metric) { s.step(metric); };

/// A step mode policy: a type with `steps_after(batch_idx, aggregation_frequency, epoch_len, frequency)`.
template <class M>
concept LRStepMode = requires(std::int64_t i) {
  { M::name } -> std::convertible_to<std::string_view>;
  { M::steps_after(i, i, i, i) } -> std::convertible_to<std::int64_t>;
};

/**
 * @brief A scheduler with its step mode and frequency: what a declarative trial's `lr_scheduler(opt)`
 * returns to choose a mode other than `every_batch`.
 * @code{.cpp}
 * auto lr_scheduler(torch::optim::SGD& opt) {
 *   return dettrial::scheduled(torch::optim::StepLR(opt, 1, 0.9), dettrial::lr_step::every_epoch{});
 * }
 * @endcode
 */
template <LRSchedulerLike S, LRStepMode Mode>
struct ScheduledLR {
  S scheduler;
  std::int64_t frequency = 1;
  using mode = Mode;
};

template <LRSchedulerLike S, LRStepMode Mode>
ScheduledLR<S, Mode> scheduled(S scheduler, Mode, std::int64_t frequency = 1) {
  if (frequency < 1) throw ConfigError("an LR scheduler's step frequency must be at least 1");
  return ScheduledLR<S, Mode>{std::move(scheduler), frequency};
}

/**
 * @brief An LR scheduler a checkpoint can restore exactly: a `torch::optim::LRScheduler` (StepLR,
 * ...; dettrial saves its step count), or any type with `save(torch::serialize::OutputArchive&) const`
 * and `load(torch::serialize::InputArchive&)`.
 */
template <class S>
concept CheckpointableLRScheduler = std::derived_from<S, torch::optim::LRScheduler> ||
                                    requires(S& s, const S& cs, torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
                                      cs.save(out);
                                      s.load(in);
                                    };

/// A clipping policy: called with the optimizer's parameters before the step.
template <class C>
concept GradientClipper = std::invocable<C&, std::vector<torch::Tensor>&>;

}  // namespace dettrial
// ---- end dettrial/vocabulary/optim.hpp

namespace dettrial {

/// The `std::shared_ptr<torch::nn::Module>` behind a model handle.
template <ModelHandle M>
std::shared_ptr<torch::nn::Module> module_of(M& m) {
  if constexpr (requires { m.ptr(); }) return m.ptr();
  else return std::shared_ptr<torch::nn::Module>(m);
}

namespace detail {
/// The key of a parameter in `Optimizer::state()`: LibTorch 1.x keys it by the TensorImpl's address
/// printed as a string, 2.x by the address itself. The state map's key type tells which.
template <class StateMap>
auto optimizer_state_key(const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return Key(p.unsafeGetTensorImpl());
  }
}
}  // namespace detail

}  // namespace dettrial
// ---- end dettrial/optim/handles.hpp

namespace dettrial::optim {

/// Adadelta's options, with Python's defaults (`torch.optim.Adadelta(params, lr=1.0, rho=0.9,
/// eps=1e-6, weight_decay=0, maximize=False)`), written the way LibTorch writes its optimizers' options.
struct AdadeltaOptions : torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  AdadeltaOptions(double lr = 1.0) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 1.0;
  TORCH_ARG(double, rho) = 0.9;
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AdadeltaOptions& lhs, const AdadeltaOptions& rhs);
  ~AdadeltaOptions() override = default;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// One parameter's Adadelta state: the step count and the running averages of squared gradients
/// (`square_avg`) and of squared updates (`acc_delta`), as Python's `optimizer.state[p]` holds them.
struct AdadeltaParamState : torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, square_avg);
  TORCH_ARG(torch::Tensor, acc_delta);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AdadeltaParamState& lhs, const AdadeltaParamState& rhs);
  ~AdadeltaParamState() override = default;
};

/**
 * @brief Adadelta (Zeiler 2012) as PyTorch's `torch.optim.Adadelta` computes it, operation for
 * operation (its single-tensor path; the multi-tensor one does the same operations in the same
 * order), so the parameters follow Python's bit for bit on the same device.
 *
 * The state of a parameter is made on its first step with a gradient (as Python's), `save` and `load`
 * work like LibTorch's optimizers (`torch::save(optimizer, ...)`, dettrial's native checkpoints), and
 * `load` restores the groups' options (learning rates) as well, on every LibTorch version.
 * @code{.cpp}
 * dettrial::optim::Adadelta opt(model->parameters(), dettrial::optim::AdadeltaOptions(1.0).rho(0.95));
 * @endcode
 * An invalid option (lr, eps or weight_decay negative, rho outside [0, 1]) is a ConfigError.
 */
class Adadelta : public torch::optim::Optimizer {
 public:
  explicit Adadelta(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdadeltaOptions defaults = {});
  explicit Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Adadelta);
  }
};

/// Writes one parameter's state as Python's `Adadelta.state_dict()["state"][i]` holds it: `step` (a
/// float32 0-dim tensor), `square_avg`, `acc_delta`.
DETTRIAL_INLINE void python_param_state(const AdadeltaParamState& state, c10::impl::GenericDict& out);
/// Writes a group's options as Python's `Adadelta.state_dict()["param_groups"][i]` holds them (less
/// `params`): lr, rho, eps, weight_decay, maximize, capturable, foreach (None), differentiable.
DETTRIAL_INLINE void python_group_options(const AdadeltaOptions& options, c10::impl::GenericDict& out);

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <charconv>

namespace dettrial::detail {

DETTRIAL_INLINE std::string adadelta_number(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

// Python's checks (torch.optim.Adadelta.__init__), as one sentence naming the option and its value.
DETTRIAL_INLINE void check_adadelta_options(const dettrial::optim::AdadeltaOptions& o, const std::string& where) {
  const auto invalid = [&](const char* name, double value, const char* rule) {
    throw ConfigError("dettrial::optim::Adadelta: " + where + name + " must be " + rule + ", not " + adadelta_number(value));
  };
  if (!(o.lr() >= 0)) invalid("lr", o.lr(), "at least 0");
  if (!(o.rho() >= 0 && o.rho() <= 1)) invalid("rho", o.rho(), "in [0, 1]");
  if (!(o.eps() >= 0)) invalid("eps", o.eps(), "at least 0");
  if (!(o.weight_decay() >= 0)) invalid("weight_decay", o.weight_decay(), "at least 0");
}

}  // namespace dettrial::detail

namespace dettrial::optim {

DETTRIAL_INLINE void AdadeltaOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rho);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

DETTRIAL_INLINE void AdadeltaOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, rho);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

DETTRIAL_INLINE bool operator==(const AdadeltaOptions& lhs, const AdadeltaOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.rho() == rhs.rho() && lhs.eps() == rhs.eps() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.maximize() == rhs.maximize();
}

DETTRIAL_INLINE void AdadeltaParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(square_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(acc_delta);
}

DETTRIAL_INLINE void AdadeltaParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, square_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, acc_delta);
}

DETTRIAL_INLINE bool operator==(const AdadeltaParamState& lhs, const AdadeltaParamState& rhs) {
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || torch::equal(a, b));
  };
  return lhs.step() == rhs.step() && same(lhs.square_avg(), rhs.square_avg()) && same(lhs.acc_delta(), rhs.acc_delta());
}

DETTRIAL_INLINE Adadelta::Adadelta(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdadeltaOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<AdadeltaOptions>(defaults)) {
  detail::check_adadelta_options(defaults, "");
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    // LibTorch 2.x merges a group's options with the defaults only for its own optimizers' option
    // types; for others it keeps the defaults alone. A group's own options stand, as in Python.
    if (i < param_groups.size() && param_groups[i].has_options()) param_groups_[i].set_options(param_groups[i].options().clone());
    const auto* options = dynamic_cast<const AdadeltaOptions*>(&param_groups_[i].options());
    if (!options)
      throw ConfigError("dettrial::optim::Adadelta: parameter group " + std::to_string(i) +
                        " has another optimizer's options; give it AdadeltaOptions or none");
    detail::check_adadelta_options(*options, "parameter group " + std::to_string(i) + "'s ");
  }
}

DETTRIAL_INLINE Adadelta::Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults)
    : Adadelta(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

DETTRIAL_INLINE torch::Tensor Adadelta::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  using StateMap = std::remove_cvref_t<decltype(state_)>;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdadeltaOptions&>(group.options());
    const double lr = options.lr(), rho = options.rho(), eps = options.eps(), weight_decay = options.weight_decay();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw TrialError("dettrial::optim::Adadelta does not support sparse gradients");
      auto& slot = state_[dettrial::detail::optimizer_state_key<StateMap>(p)];
      if (!slot) {
        auto fresh = std::make_unique<AdadeltaParamState>();
        fresh->step(0);
        fresh->square_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->acc_delta(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdadeltaParamState&>(*slot);
      state.step(state.step() + 1);

      // Python's _single_tensor_adadelta, operation for operation.
      torch::Tensor grad = options.maximize() ? -p.grad() : p.grad();
      if (weight_decay != 0) grad = grad.add(p, weight_decay);
      torch::Tensor square_avg = state.square_avg(), acc_delta = state.acc_delta();
      if (p.is_complex()) {
        square_avg = torch::view_as_real(square_avg);
        acc_delta = torch::view_as_real(acc_delta);
        grad = torch::view_as_real(grad);
      }
      square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho);
      const torch::Tensor stddev = square_avg.add(eps).sqrt_();
      torch::Tensor delta = acc_delta.add(eps).sqrt_();
      delta.div_(stddev).mul_(grad);
      acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
      if (p.is_complex()) delta = torch::view_as_complex(delta);
      p.add_(delta, -lr);
    }
  }
  return loss;
}

DETTRIAL_INLINE void Adadelta::save(torch::serialize::OutputArchive& archive) const { serialize(*this, archive); }

DETTRIAL_INLINE void Adadelta::load(torch::serialize::InputArchive& archive) {
  serialize(*this, archive);
  // LibTorch 1.x restores the per-parameter state only: the groups' options (learning rates a
  // scheduler changed) are read back here, on every version.
  torch::serialize::InputArchive groups;
  archive.read("param_groups", groups);
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    torch::serialize::InputArchive group, options;
    groups.read("param_groups/" + std::to_string(i), group);
    group.read("options", options);
    static_cast<AdadeltaOptions&>(param_groups_[i].options()).serialize(options);
  }
}

DETTRIAL_INLINE void python_param_state(const AdadeltaParamState& state, c10::impl::GenericDict& out) {
  // Python keeps the step as a float32 0-dim tensor on the CPU (not capturable).
  out.insert("step", torch::scalar_tensor(static_cast<double>(state.step()), torch::kFloat));
  if (state.square_avg().defined()) out.insert("square_avg", state.square_avg().detach());
  if (state.acc_delta().defined()) out.insert("acc_delta", state.acc_delta().detach());
}

DETTRIAL_INLINE void python_group_options(const AdadeltaOptions& options, c10::impl::GenericDict& out) {
  out.insert("lr", options.lr());
  out.insert("rho", options.rho());
  out.insert("eps", options.eps());
  out.insert("weight_decay", options.weight_decay());
  out.insert("maximize", options.maximize());
  out.insert("capturable", false);
  out.insert("foreach", c10::IValue());  // None: Python's default (it picks the implementation)
  out.insert("differentiable", false);
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/optim/adadelta.hpp
// ---- begin dettrial/optim/fused.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Optimizers whose step a CUDA graph can capture: SGD, Adam and AdamW with their learning
/// rates (and Adam's step counts) in device tensors, stepped by ATen's fused kernels.
///
/// LibTorch's own optimizers read the learning rate and compute Adam's bias corrections on the host,
/// so a replayed graph would train at the learning rate of the captured batch forever. These keep
/// LibTorch's options, state and serialization (a checkpoint of FusedSGD loads into torch::optim::SGD
/// and back), and write a group's learning rate into its device tensor only between steps, when a
/// scheduler changed it.
///
/// On LibTorch 2.4 and later the step is ATen's `_fused_sgd_` / `_fused_adam_` / `_fused_adamw_`
/// with a tensor learning rate (CPU and CUDA). Older LibTorch (Debian's 1.13) has no such kernels on
/// the CPU and none taking a tensor learning rate; there the same arithmetic runs as tensor operations,
/// which a graph captures as well.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/torch.h>


#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DETTRIAL_FUSED_KERNELS 1
#else
#define DETTRIAL_FUSED_KERNELS 0
#endif

namespace dettrial::optim {

/**
 * @brief What a trainer needs of an optimizer whose step a CUDA graph captures: the learning rates
 * live in device tensors, which `sync_learning_rates` updates from the param groups' options between
 * steps (a graph's replay runs no host code), and any device-side state can be brought to the host
 * for a checkpoint and back after one is loaded.
 */
class CapturableOptimizer {
 public:
  CapturableOptimizer() = default;
  CapturableOptimizer(CapturableOptimizer&&) = default;
  CapturableOptimizer& operator=(CapturableOptimizer&&) = default;
  virtual ~CapturableOptimizer() = default;

  /// Writes each group's learning rate into its device tensor where the host value changed since the
  /// last write (one small fill on the device, no synchronization). The optimizer's own step does it
  /// when it is not being captured; a trainer replaying a graph does it before each replay.
  void sync_learning_rates(std::vector<torch::optim::OptimizerParamGroup>& groups) {
    for (std::size_t g = 0; g < groups.size() && g < rates_.size(); ++g)
      if (rates_[g].tensor.defined()) rates_[g].write(groups[g].options().get_lr());
  }
  /// While true, a step writes nothing from the host (the trainer sets it around a capture).
  void set_capturing(bool capturing) { capturing_ = capturing; }
  /// Copies device-side state (Adam's step counts) into LibTorch's parameter state, for a checkpoint.
  virtual void pull_host_state() {}
  /// After a checkpoint was loaded into LibTorch's parameter state: rebuilds the device-side state.
  virtual void push_device_state() {}
  /**
   * @brief For a gradient scaler: steps unless `found_inf` (a float32 scalar on the parameters' device)
   * is nonzero, decided on the device, and returns true; returns false, without stepping, where this
   * optimizer cannot decide there (then the caller reads the flag and calls step() or not).
   */
  virtual bool step_unless_found_inf(const torch::Tensor& found_inf) {
    (void)found_inf;
    return false;
  }
  /// Whether its state is whole, so a capture makes none (state first made inside a graph would be
  /// made again on every replay). A trainer warms up until it is.
  virtual bool ready_for_capture() const { return true; }

 protected:
  /// Group `g`'s learning rate as a float scalar tensor on `like`'s device (made on first use).
  const torch::Tensor& device_lr(std::size_t g, double lr, const torch::Tensor& like) {
    if (rates_.size() <= g) rates_.resize(g + 1);
    Rate& r = rates_[g];
    if (!r.tensor.defined() || r.tensor.device() != like.device()) {
      if (capturing_) throw_new_state("parameter group " + std::to_string(g) + "'s learning rate");
      r.tensor = device_scalar(lr, like);
      r.written = lr;
    } else if (!capturing_) {
      r.write(lr);
    }
    return r.tensor;
  }
  bool capturing() const { return capturing_; }
  /// State made while capturing would be made again (zeroed, or set to the captured learning rate)
  /// on every replay: a parameter that had no gradient in the warm-up batches must not step first
  /// inside the graph.
  [[noreturn]] static void throw_new_state(const std::string& what) {
    throw TrialError(what +
                     " would be first made inside the CUDA graph (so reset on every replay): a parameter had no "
                     "gradient in any warm-up batch; raise capture_warmup_batches, or keep such parameters out of the optimizer");
  }
  /// The closure's loss (with gradients on), or an undefined tensor without one.
  template <class Closure>
  static torch::Tensor evaluate(Closure& closure) {
    if (!closure) return {};
    at::AutoGradMode enable_grad(true);
    return closure();
  }
  /// The parameters that have a gradient, in order.
  static std::vector<torch::Tensor> with_grad(const std::vector<torch::Tensor>& params) {
    std::vector<torch::Tensor> out;
    out.reserve(params.size());
    for (const auto& p : params)
      if (p.grad().defined()) out.push_back(p);
    return out;
  }
  /// A learning rate or step count as the fused kernels read it: a float scalar on `like`'s device.
  static torch::Tensor device_scalar(double value, const torch::Tensor& like) {
    return torch::full({}, value, torch::TensorOptions().dtype(torch::kFloat).device(like.device()));
  }

 private:
  struct Rate {
    torch::Tensor tensor{};
    double written = 0;
    /// Writes `lr` on the device when it differs from what was written last.
    void write(double lr) {
      if (written == lr) return;
      tensor.fill_(lr);
      written = lr;
    }
  };
  std::vector<Rate> rates_;
  bool capturing_ = false;
};

}  // namespace dettrial::optim

namespace dettrial::detail {

/// What a captured step keeps of a param group besides its learning rate: its parameters and the
/// options the kernels take as host values (momentum, dampening, weight decay, Nesterov, betas, eps,
/// amsgrad), to see when they change after a capture.
inline std::vector<double> captured_group_state(const torch::optim::OptimizerParamGroup& group) {
  std::vector<double> out;
  for (const auto& p : group.params()) out.push_back(static_cast<double>(reinterpret_cast<std::uintptr_t>(p.unsafeGetTensorImpl())));
  const auto& o = group.options();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o))
    out.insert(out.end(), {sgd->momentum(), sgd->dampening(), sgd->weight_decay(), double(sgd->nesterov())});
  else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&o))
    out.insert(out.end(),
               {std::get<0>(adam->betas()), std::get<1>(adam->betas()), adam->eps(), adam->weight_decay(), double(adam->amsgrad())});
  else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&o))
    out.insert(out.end(),
               {std::get<0>(adamw->betas()), std::get<1>(adamw->betas()), adamw->eps(), adamw->weight_decay(), double(adamw->amsgrad())});
  return out;
}

/// The parameters of one group that have gradients, split by (device, dtype) as fused kernels need.
struct FusedBucket {
  std::vector<torch::Tensor> params, grads, first, second, third, steps;
};

template <class Fn>
void for_each_bucket(const std::vector<torch::Tensor>& params, Fn&& fn) {
  // Usually one bucket: a model on one device in one dtype. Mixed groups are split, in order.
  std::vector<std::pair<std::pair<torch::Device, torch::ScalarType>, std::vector<std::size_t>>> buckets;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto key = std::pair(params[i].device(), params[i].scalar_type());
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const auto& b) { return b.first == key; });
    if (it == buckets.end()) buckets.push_back({key, {i}});
    else it->second.push_back(i);
  }
  for (const auto& b : buckets) fn(b.second);
}

}  // namespace dettrial::detail

namespace dettrial::optim {

/**
 * @brief SGD (LibTorch's options and state: momentum, dampening, weight decay, Nesterov) whose step
 * reads the learning rate from a device tensor, so that a CUDA graph can capture it.
 * @code{.cpp}
 * dettrial::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.03).momentum(0.9));
 * @endcode
 */
class FusedSGD : public torch::optim::SGD, public CapturableOptimizer {
 public:
  using torch::optim::SGD::SGD;

  /// With the fused kernel (LibTorch 2.4+, CUDA), once every momentum buffer exists: a new buffer is
  /// a copy of the first gradient, which a skipped first step must not leave behind.
  bool step_unless_found_inf(const torch::Tensor& found_inf) override;
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// False while a gradient scaler has skipped every step since a parameter needed its first
  /// momentum buffer (with an fp16 scaler the first steps often overflow).
  bool ready_for_capture() const override { return !buffers_pending_; }

 private:
  /// The step; with `found_inf`, the kernel skips it on the device when the flag is set.
  torch::Tensor step_with(LossClosure closure, const std::optional<torch::Tensor>& found_inf);
  void run_buckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& bufs, const torch::optim::SGDOptions& o,
                   const torch::Tensor& lr, bool first, const std::optional<torch::Tensor>& found_inf);
  bool has_buffer(const torch::Tensor& p);
  torch::Tensor buffer(const torch::Tensor& p, bool fresh);
  /// LibTorch's SGD arithmetic with the learning rate read from `lr`; `first`: the buffers are new.
  /// On a GPU, ATen's fused kernel (one launch for all); elsewhere LibTorch's own operations, one
  /// parameter at a time, which give LibTorch's SGD's results to the bit.
  static void run(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& bufs,
                  const torch::optim::SGDOptions& o, const torch::Tensor& lr, bool first, const std::optional<torch::Tensor>& found_inf);

  bool buffers_pending_ = false;
};

}  // namespace dettrial::optim

namespace dettrial::detail {

/// Adam and AdamW: LibTorch's options and state, with each parameter's step count also kept as a
/// float tensor on its device (what the fused kernels read and increment), mirrored into LibTorch's
/// `step` for checkpoints by pull_host_state.
template <class Base, class Options, class State, bool Decoupled>
class FusedAdamBase : public Base, public optim::CapturableOptimizer {
 public:
  using Base::Base;

  /// With the fused kernels (LibTorch 2.4+, CPU and CUDA): a skipped step leaves the moments as they
  /// were and takes back its increment of the step counts.
  bool step_unless_found_inf(const torch::Tensor& found_inf) override {
#if DETTRIAL_FUSED_KERNELS
    for (auto& group : this->param_groups())
      for (const auto& p : group.params())
        if (p.grad().defined() && p.device() != found_inf.device()) return false;
    step_with(nullptr, found_inf);
    return true;
#else
    return CapturableOptimizer::step_unless_found_inf(found_inf);
#endif
  }

  torch::Tensor step(typename Base::LossClosure closure = nullptr) override { return step_with(closure, std::nullopt); }

  void pull_host_state() override {
    if (steps_.empty()) return;
    // One read of the device for all step counts (a checkpoint's only synchronization here).
    std::vector<torch::Tensor> counts;
    counts.reserve(steps_.size());
    const torch::Device device = steps_.begin()->second.device();
    for (const auto& entry : steps_) counts.push_back(entry.second.to(device));
    const torch::Tensor host = torch::stack(counts).to(torch::kCPU, torch::kDouble).contiguous();
    const double* value = host.data_ptr<double>();
    for (const auto& entry : steps_) {
      auto it = this->state().find(entry.first);
      if (it != this->state().end()) static_cast<State&>(*it->second).step(static_cast<std::int64_t>(*value));
      ++value;
    }
  }
  void push_device_state() override {
    steps_.clear();
    for (auto& group : this->param_groups())
      for (const auto& p : group.params()) {
        auto it = this->state().find(key(p));
        if (it != this->state().end()) steps_[key(p)] = device_scalar(static_cast<double>(static_cast<State&>(*it->second).step()), p);
      }
  }

 private:
  /// The step; with `found_inf`, the kernels skip it on the device when the flag is set.
  torch::Tensor step_with(typename Base::LossClosure closure, const std::optional<torch::Tensor>& found_inf) {
    torch::NoGradGuard no_grad;
    torch::Tensor loss = evaluate(closure);
    for (std::size_t g = 0; g < this->param_groups().size(); ++g) {
      auto& group = this->param_groups()[g];
      const auto& o = static_cast<const Options&>(group.options());
      const std::vector<torch::Tensor> params = with_grad(group.params());
      if (params.empty()) continue;
      const torch::Tensor& lr = device_lr(g, o.lr(), params.front());
      for_each_bucket(params, [&](const std::vector<std::size_t>& idx) {
        FusedBucket b;
        for (auto i : idx) {
          const torch::Tensor& p = params[i];
          State& s = state_of(p, o);
          b.params.push_back(p);
          b.grads.push_back(p.grad());
          b.first.push_back(s.exp_avg());
          b.second.push_back(s.exp_avg_sq());
          if (o.amsgrad()) b.third.push_back(s.max_exp_avg_sq());
          b.steps.push_back(steps_.at(key(p)));
        }
        run(b, o, lr, found_inf);
      });
    }
    return loss;
  }

  using Key = typename std::decay_t<decltype(std::declval<Base&>().state())>::key_type;
  static Key key(const torch::Tensor& p) { return detail::optimizer_state_key<std::decay_t<decltype(std::declval<Base&>().state())>>(p); }

  State& state_of(const torch::Tensor& p, const Options& o) {
    const Key k = key(p);
    auto it = this->state().find(k);
    if ((it == this->state().end() || !steps_.count(k)) && capturing()) throw_new_state("Adam's state for a parameter");
    if (it == this->state().end()) {
      auto s = std::make_unique<State>();
      s->step(0);
      s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      it = this->state().insert_or_assign(k, std::move(s)).first;
    } else if (!steps_.count(k)) {
      // State loaded from a checkpoint (or made by LibTorch's Adam): its step count goes to the device.
      steps_[k] = device_scalar(static_cast<double>(static_cast<State&>(*it->second).step()), p);
    }
    if (!steps_.count(k)) steps_[k] = device_scalar(0, p);
    return static_cast<State&>(*it->second);
  }

  static void run(FusedBucket& b, const Options& o, const torch::Tensor& lr, const std::optional<torch::Tensor>& found_inf) {
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
#if DETTRIAL_FUSED_KERNELS
    torch::_foreach_add_(b.steps, 1);
    if constexpr (Decoupled)
      at::_fused_adamw_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    else
      at::_fused_adam_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                       /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    // A skipped step did not count (as PyTorch's fused Adam takes its increment back).
    if (found_inf) torch::_foreach_sub_(b.steps, std::vector<torch::Tensor>(b.steps.size(), *found_inf));
#else
    (void)found_inf;  // only the kernels take it (step_unless_found_inf says where)
    // Python's capturable Adam, one parameter at a time, every scalar that varies kept as a tensor.
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      torch::Tensor p = b.params[i], grad = b.grads[i], step = b.steps[i];
      step.add_(1);
      if (o.weight_decay() != 0) {
        if constexpr (Decoupled) p.mul_(lr.mul(-o.weight_decay()).add_(1));
        else grad = grad.add(p, o.weight_decay());
      }
      b.first[i].mul_(beta1).add_(grad, 1 - beta1);
      b.second[i].mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const torch::Tensor bias_correction1 = 1 - torch::pow(beta1, step);
      const torch::Tensor bias_correction2_sqrt = (1 - torch::pow(beta2, step)).sqrt();
      torch::Tensor second = b.second[i];
      if (o.amsgrad()) {
        torch::maximum_out(b.third[i], b.third[i], b.second[i]);
        second = b.third[i];
      }
      const torch::Tensor step_size_neg = (lr / bias_correction1).neg();
      const torch::Tensor denom = (second.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(o.eps() / step_size_neg);
      p.addcdiv_(b.first[i], denom);
    }
#endif
  }

  std::map<Key, torch::Tensor> steps_;
};

}  // namespace dettrial::detail

namespace dettrial::optim {

/// Adam (LibTorch's options and state) stepped with a device-resident learning rate and step count.
using FusedAdam = detail::FusedAdamBase<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
/// AdamW (decoupled weight decay) stepped with a device-resident learning rate and step count.
using FusedAdamW = detail::FusedAdamBase<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode
// (FusedSGD's virtual functions, and with them its vtable, then live in dettrial::compiled).
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::optim {

DETTRIAL_INLINE bool FusedSGD::step_unless_found_inf(const torch::Tensor& found_inf) {
#if DETTRIAL_FUSED_KERNELS
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda() || p.device() != found_inf.device()) return false;
      if (o.momentum() != 0 && !has_buffer(p)) {
        if (capturing()) throw_new_state("a momentum buffer");
        buffers_pending_ = true;  // until a step the host lets through makes them
        return false;
      }
    }
  }
  step_with(nullptr, found_inf);
  return true;
#else
  return CapturableOptimizer::step_unless_found_inf(found_inf);
#endif
}

DETTRIAL_INLINE torch::Tensor FusedSGD::step(LossClosure closure) { return step_with(closure, std::nullopt); }

DETTRIAL_INLINE torch::Tensor FusedSGD::step_with(LossClosure closure, const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = evaluate(closure);
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const std::vector<torch::Tensor> params = with_grad(group.params());
    if (params.empty()) continue;
    const torch::Tensor& lr = device_lr(g, o.lr(), params.front());
    if (o.momentum() == 0) {
      run_buckets(params, {}, o, lr, false, found_inf);
      continue;
    }
    // A parameter's first step makes its momentum buffer (a copy of its gradient); the kernel
    // takes that as one flag for all it steps, so new and old buffers go in separate calls.
    std::vector<torch::Tensor> fresh, stepped, fresh_bufs, stepped_bufs;
    for (const auto& p : params) {
      const bool is_new = !has_buffer(p);
      (is_new ? fresh : stepped).push_back(p);
      (is_new ? fresh_bufs : stepped_bufs).push_back(buffer(p, is_new));
    }
    if (!fresh.empty()) run_buckets(fresh, fresh_bufs, o, lr, true, found_inf);
    if (!stepped.empty()) run_buckets(stepped, stepped_bufs, o, lr, false, found_inf);
  }
  buffers_pending_ = false;
  return loss;
}

DETTRIAL_INLINE void FusedSGD::run_buckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& bufs,
                                           const torch::optim::SGDOptions& o, const torch::Tensor& lr, bool first,
                                           const std::optional<torch::Tensor>& found_inf) {
  detail::for_each_bucket(params, [&](const std::vector<std::size_t>& idx) {
    std::vector<torch::Tensor> ps, grads, bs;
    ps.reserve(idx.size());
    grads.reserve(idx.size());
    for (auto i : idx) {
      ps.push_back(params[i]);
      grads.push_back(params[i].grad());
      if (!bufs.empty()) bs.push_back(bufs[i]);
    }
    run(ps, grads, bs, o, lr, first, found_inf);
  });
}

DETTRIAL_INLINE bool FusedSGD::has_buffer(const torch::Tensor& p) {
  const auto it = state().find(detail::optimizer_state_key<std::decay_t<decltype(state())>>(p));
  return it != state().end() && static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().defined();
}

DETTRIAL_INLINE torch::Tensor FusedSGD::buffer(const torch::Tensor& p, bool fresh) {
  const auto key = detail::optimizer_state_key<std::decay_t<decltype(state())>>(p);
  if (fresh) {
    if (capturing()) throw_new_state("a momentum buffer");
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
    state()[key] = std::move(s);
  }
  return static_cast<torch::optim::SGDParamState&>(*state()[key]).momentum_buffer();
}

DETTRIAL_INLINE void FusedSGD::run(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                                   const std::vector<torch::Tensor>& bufs, const torch::optim::SGDOptions& o, const torch::Tensor& lr,
                                   bool first, const std::optional<torch::Tensor>& found_inf) {
#if DETTRIAL_FUSED_KERNELS
  if (params.front().is_cuda()) {
    at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), lr, o.dampening(), o.nesterov(),
                    /*maximize=*/false, first, /*grad_scale=*/std::nullopt, found_inf);
    return;
  }
#endif
  (void)found_inf;  // only the kernel takes it (step_unless_found_inf says where)
  const torch::Tensor neg_lr = lr.neg();
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i];
    torch::Tensor d_p = grads[i];
    if (o.weight_decay() != 0) d_p = d_p.add(p, o.weight_decay());
    if (o.momentum() != 0) {
      torch::Tensor buf = bufs[i];
      if (first) buf.copy_(d_p);
      else buf.mul_(o.momentum()).add_(d_p, 1 - o.dampening());
      d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
    }
    p.addcmul_(d_p, neg_lr);
  }
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/optim/fused.hpp
// ---- begin dettrial/optim/clip.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradient clipping policies for `step_optimizer`.

#include <concepts>
#include <limits>
#include <vector>

#include <torch/torch.h>


namespace dettrial {

namespace clip {

/// No clipping (the default).
struct none {
  void operator()(std::vector<torch::Tensor>&) const noexcept {}
};
/// Scales gradients so their total `norm_type`-norm is at most `max_norm`: torch's clip_grad_norm_,
/// the same operations, without reading the norm back to the host (which LibTorch's does to return
/// it), so that the step stays asynchronous and a CUDA graph can capture it.
struct by_norm {
  double max_norm;
  double norm_type = 2.0;
  void operator()(std::vector<torch::Tensor>& params) const {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    grads.reserve(params.size());
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    if (grads.empty()) return;
    torch::Tensor total;
    if (norm_type == std::numeric_limits<double>::infinity()) {
      std::vector<torch::Tensor> norms;
      norms.reserve(grads.size());
      for (const auto& g : grads) norms.push_back(g.abs().max());
      total = norms.size() == 1 ? norms[0] : torch::max(torch::stack(norms));
    } else if (norm_type == 0) {
      total = torch::full({}, static_cast<double>(grads.size()));
    } else {
      std::vector<torch::Tensor> norms;
      norms.reserve(grads.size());
      for (const auto& g : grads) norms.push_back(g.norm(norm_type));
      total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(norm_type);
    }
    const torch::Tensor coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
    for (auto& g : grads) g.mul_(coef);
  }
};
/// Clamps every gradient element to [-clip_value, clip_value] (torch's clip_grad_value_).
struct by_value {
  double clip_value;
  void operator()(std::vector<torch::Tensor>& params) const { torch::nn::utils::clip_grad_value_(params, clip_value); }
};

}  // namespace clip
}  // namespace dettrial
// ---- end dettrial/optim/clip.hpp
// ---- begin dettrial/optim/lr_state.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Saving and restoring LR schedulers in checkpoints. LibTorch's schedulers have no
/// serialization; their whole state is the step count (the optimizer keeps the learning rates).

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/torch.h>


namespace dettrial {

namespace detail {

/// Reaches LRScheduler's protected step count (the usual derived-class member-pointer route).
struct LRSchedulerAccess : torch::optim::LRScheduler {
  static unsigned& step_count(torch::optim::LRScheduler& s) { return s.*(&LRSchedulerAccess::step_count_); }
};

template <class S>
void save_lr_scheduler(void* scheduler, torch::serialize::OutputArchive& archive) {
  S& s = *static_cast<S*>(scheduler);
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>)
    archive.write("step_count", c10::IValue(static_cast<std::int64_t>(LRSchedulerAccess::step_count(s))));
  else std::as_const(s).save(archive);
}

template <class S>
void load_lr_scheduler(void* scheduler, torch::serialize::InputArchive& archive) {
  S& s = *static_cast<S*>(scheduler);
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>) {
    c10::IValue count;
    archive.read("step_count", count);
    LRSchedulerAccess::step_count(s) = static_cast<unsigned>(count.toInt());
  } else {
    s.load(archive);
  }
}

/// Steps taken, when the scheduler is a LibTorch one (for the Python-side state dict); else -1.
template <class S>
std::int64_t lr_scheduler_steps(void* scheduler) {
  if constexpr (std::derived_from<S, torch::optim::LRScheduler>) return LRSchedulerAccess::step_count(*static_cast<S*>(scheduler));
  else return -1;
}

/// A wrapped LR scheduler with its type erased: how to step, save and restore it, and when it steps.
struct WrappedScheduler {
  void* scheduler;
  void (*step)(void*);
  /// The step mode's rule (see dettrial::LRStepMode): steps due after batch_idx.
  std::int64_t (*steps_after)(std::int64_t batch_idx, std::int64_t aggregation_frequency, std::int64_t epoch_len, std::int64_t frequency);
  std::int64_t frequency;
  void (*save)(void*, torch::serialize::OutputArchive&);
  void (*load)(void*, torch::serialize::InputArchive&);
  /// Steps taken, for a LibTorch scheduler; -1 for others.
  std::int64_t (*steps_taken)(void*);
  /// Writes Python's `state_dict()` of the scheduler, when it has `python_state` (dettrial::optim's); else null.
  void (*python_state)(void*, c10::impl::GenericDict&) = nullptr;
  /// Restores the scheduler from Python's `state_dict()` when it can (dettrial::optim's); else null.
  void (*load_python_state)(void*, const c10::impl::GenericDict&, const std::string&) = nullptr;
  /// For lr_step::on_validation: `step(metric)` with the validation's value of `metric`.
  void (*step_with_metric)(void*, double) = nullptr;
  std::string metric{};
  /// The scheduler's C++ type, for messages ("dettrial::optim::MultiStepLR").
  std::string type{};
};

/// The scheduler's own Python state dict writer, when it has one.
template <class S>
auto python_state_writer() -> void (*)(void*, c10::impl::GenericDict&) {
  if constexpr (requires(const S& s, c10::impl::GenericDict& d) { s.python_state(d); })
    return [](void* s, c10::impl::GenericDict& d) { static_cast<const S*>(s)->python_state(d); };
  else return nullptr;
}

/// The scheduler's own Python state dict reader, when it has one.
template <class S>
auto python_state_reader() -> void (*)(void*, const c10::impl::GenericDict&, const std::string&) {
  if constexpr (requires(S& s, const c10::impl::GenericDict& d, const std::string& what) { s.load_python_state(d, what); })
    return [](void* s, const c10::impl::GenericDict& d, const std::string& what) { static_cast<S*>(s)->load_python_state(d, what); };
  else return nullptr;
}

}  // namespace detail
}  // namespace dettrial
// ---- end dettrial/optim/lr_state.hpp
// ---- begin dettrial/optim/lr_step.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LR step modes as policy types: when dettrial steps a wrapped learning-rate scheduler.

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>


namespace dettrial {

/**
 * @brief The step modes, as Determined defines them. dettrial steps schedulers after `train_batch`,
 * only on update batches (every `aggregation_frequency`-th batch); each mode says how many `step()`
 * calls that update batch makes.
 */
namespace lr_step {

/// After every batch (batches skipped by gradient aggregation are caught up on the update batch).
struct every_batch {
  static constexpr std::string_view name = "every_batch";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t /*epoch_len*/, std::int64_t freq);
};
/// After the last batch of every epoch (more precisely: when the next update lands in a new epoch).
struct every_epoch {
  static constexpr std::string_view name = "every_epoch";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t epoch_len, std::int64_t freq);
};
/// On update batches whose batch count is a multiple of the frequency. Like Determined, the frequency
/// counts batches, not optimizer steps.
struct every_optimizer_step {
  static constexpr std::string_view name = "every_optimizer_step";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t, std::int64_t, std::int64_t freq) {
    return (batch_idx + 1) % freq == 0 ? 1 : 0;
  }
};
/// Never stepped by dettrial: the trial calls `step()` itself (its state is still checkpointed).
struct manual {
  static constexpr std::string_view name = "manual";
  static std::int64_t steps_after(std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0; }
};

/**
 * @brief After every validation, with that validation's value of `metric` (after the trial's
 * callbacks' on_validation_end): for schedulers stepped with a metric, `step(double)`, such as
 * dettrial::optim::ReduceLROnPlateau. Never stepped by batches.
 * @code{.cpp}
 * context.wrap_lr_scheduler(plateau, dettrial::lr_step::on_validation{"validation_loss"});
 * @endcode
 */
struct on_validation {
  static constexpr std::string_view name = "on_validation";
  static std::int64_t steps_after(std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0; }
  /// The validation metric passed to the scheduler's step.
  std::string metric;
};

}  // namespace lr_step

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::lr_step {

DETTRIAL_INLINE std::int64_t every_batch::steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t /*epoch_len*/,
                                                      std::int64_t freq) {
  std::int64_t n = 0;
  for (std::int64_t i = batch_idx - agg + 1; i <= batch_idx; ++i) n += ((i + 1) % freq == 0);
  return n;
}

DETTRIAL_INLINE std::int64_t every_epoch::steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t epoch_len, std::int64_t freq) {
  std::int64_t n = 0;
  for (std::int64_t e = batch_idx / epoch_len; e < (batch_idx + agg) / epoch_len; ++e) n += ((e + 1) % freq == 0);
  return n;
}

}  // namespace dettrial::lr_step
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/optim/lr_step.hpp
// ---- begin dettrial/optim/schedulers.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Learning-rate schedulers with PyTorch's (Python's) semantics: StepLR, MultiStepLR,
/// ExponentialLR and ReduceLROnPlateau, exact resume, and Python's `scheduler.state_dict()` layout.
///
/// LibTorch's own `torch::optim::StepLR` decays one step later than Python's (it does not count the
/// step Python's constructor takes), so a schedule ported from Python drifts by one step. These follow
/// Python's `torch.optim.lr_scheduler` to the bit: after k `step()` calls the learning rates are
/// Python's after k calls, computed with Python's chainable (multiplicative) arithmetic.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>


namespace dettrial::optim {

/**
 * @brief What StepLR, MultiStepLR and ExponentialLR share: Python's `LRScheduler` state (`base_lrs`,
 * `last_epoch`, `_step_count`, `_last_lr`). Constructing one does what Python's constructor does:
 * it records the groups' current learning rates as `base_lrs` and takes one step, so `last_epoch`
 * starts at 0 and the step count at 1.
 */
class EpochLRScheduler {
 public:
  /// Python's `last_epoch`: the number of `step()` calls since construction.
  std::int64_t last_epoch() const { return last_epoch_; }
  /// Python's `_step_count`: `last_epoch() + 1` (the constructor's own step counts).
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
// ---- end dettrial/optim/schedulers.hpp
// ---- begin dettrial/tensorboard/event_file.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief TensorBoard event files: scalars, histograms and hyperparameters, written as TensorBoard
/// reads them (TFRecord framing of `Event` protocol buffers) while training runs.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

// ---- begin dettrial/detail/atomic_file.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A file replaced whole: written beside itself, then renamed over the old one, so a reader
/// (TensorBoard, a browser, a resumed run) never sees half of it.

#include <filesystem>
#include <string_view>


namespace dettrial::detail {

/// Writes `bytes` to `path` through a temporary in the same folder (named with this process's id,
/// so two writers never share one) renamed over it; throws dettrial::Error naming the file.
DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <fstream>
#include <string>
#include <system_error>

namespace dettrial::detail {

DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path temporary = path.parent_path() / ("." + path.filename().string() + "." + std::to_string(::getpid()) + ".tmp");
  std::error_code ignored;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::filesystem::remove(temporary, ignored);
      throw Error("cannot write '" + temporary.string() + "'");
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::filesystem::remove(temporary, ignored);
    throw Error("cannot replace '" + path.string() + "': " + ec.message());
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/atomic_file.hpp

namespace dettrial::detail::tensorboard {

/// CRC-32C (Castagnoli), the checksum of TFRecord framing.
DETTRIAL_INLINE std::uint32_t crc32c(std::string_view bytes);
/// TFRecord's masked CRC-32C (rotated and offset, so that a CRC of CRCs is not trivially zero).
inline std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/**
 * @brief The protocol-buffer wire format for the few field kinds an `Event` uses.
 *
 * Not libprotobuf: that would make a header-only library link a generated message library (and
 * match its protoc version) for eight small messages whose field numbers are fixed by TensorBoard.
 */
class Message {
 public:
  /// int32, int64, enum and bool fields.
  Message& varint(int field, std::uint64_t value);
  /// A double field (fixed 64 bits).
  Message& fixed64(int field, double value);
  /// A float field (fixed 32 bits).
  Message& fixed32(int field, float value);
  /// string, bytes and embedded-message fields.
  Message& bytes(int field, std::string_view value);
  Message& message(int field, const Message& m) { return bytes(field, m.str()); }
  /// A packed repeated double field.
  Message& packed_doubles(int field, const std::vector<double>& values);
  const std::string& str() const { return out_; }

 private:
  void put_varint(std::uint64_t value);
  void put_key(int field, int wire_type) { put_varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type)); }
  std::string out_;
};

/// One TFRecord: the length (8 bytes), its masked CRC, the data, the data's masked CRC.
DETTRIAL_INLINE std::string frame(std::string_view data);

/// The complete records of an event file, in order. `torn` when it ends in a partial record or one
/// whose checksum fails (a crash mid-write): that tail is left out.
struct Records {
  std::vector<std::string> records;
  bool torn = false;
};
DETTRIAL_INLINE Records read_records(const std::filesystem::path& file);

/// An Event's `step` (0 when absent, as protocol buffers read a missing field).
DETTRIAL_INLINE std::int64_t event_step(std::string_view event);

/// The event files of a folder (`events.out.tfevents.*`), oldest name first.
DETTRIAL_INLINE std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir);

}  // namespace dettrial::detail::tensorboard

namespace dettrial {

/// A hyperparameter's value as TensorBoard's hparams plugin shows it.
using HParamValue = std::variant<double, std::string, bool>;

/**
 * @brief Writes one TensorBoard event file (`<dir>/events.out.tfevents.<time>.<host>.<pid>`), as
 * PyTorch's `SummaryWriter` does: scalars, histograms, and the run's hyperparameters for the
 * hparams dashboard.
 *
 * The trainer writes every training and validation metric into the run's `tensorboard/` folder;
 * a trial adds its own through `context.get_tensorboard_writer()`. Records are buffered and flushed
 * at every report, so a crash loses at most the scalars since the last one. A default-constructed
 * writer (every rank but the chief) writes nothing.
 */
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  /**
   * Starts a new event file in `dir`. Resuming a trial from its checkpoint at `resumed_at` batches,
   * the events the stopped run wrote after that batch describe training that is about to be done
   * again: they are removed from the folder's earlier files first, with a torn last record, so that
   * TensorBoard shows each step once.
   */
  explicit TensorBoardWriter(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at = std::nullopt);
  TensorBoardWriter(TensorBoardWriter&&) = default;
  TensorBoardWriter& operator=(TensorBoardWriter&&) = default;
  ~TensorBoardWriter() { flush(); }

  bool enabled() const { return out_.is_open(); }
  /// The folder, and this writer's event file in it (empty when disabled).
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& file() const { return file_; }
  /// How many events opening it for a resume removed from earlier files.
  std::size_t dropped() const { return dropped_; }
  /// Whether the folder's earlier files already start an hparams session (a resumed run's do).
  bool has_session() const { return has_session_; }

  /// Removes the events after batch `batch` (and any session end) from the event files in `dir`, a
  /// torn last record too; a file left with nothing but its version record is deleted. Returns how
  /// many events went. `batch` -1 empties the folder of events (a run started afresh there).
  static std::size_t drop_events_after(const std::filesystem::path& dir, std::int64_t batch);

  /// A scalar at `step` (TensorBoard stores it as a 32-bit float).
  void add_scalar(std::string_view tag, double value, std::int64_t step);
  /// A histogram of `values` (any shape, any device; non-finite values are left out) in `bins`
  /// equal-width buckets between their minimum and maximum.
  void add_histogram(std::string_view tag, const torch::Tensor& values, std::int64_t step, std::int64_t bins = 30);
  /// The run's hyperparameters (TensorBoard's hparams dashboard: one session per run folder, its
  /// metrics the run's scalars). `group` names the session's group (a search's trial).
  void add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams, std::string_view group = {});
  /// Marks the hparams session ended, successfully or not.
  void end_session(bool success);
  /// Writes what is buffered to the file.
  void flush();

 private:
  void write_event(std::int64_t step, const detail::tensorboard::Message& summary);
  void write_hparams_data(std::string_view tag, const detail::tensorboard::Message& plugin_data);

  std::filesystem::path dir_{}, file_{};
  std::ofstream out_{};
  std::size_t dropped_ = 0;
  bool has_session_ = false;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

namespace dettrial::detail::tensorboard {

/// The byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;  // reflected Castagnoli
    table[i] = crc;
  }
  return table;
}
inline constexpr std::array<std::uint32_t, 256> kCrc32cTable = crc32c_table();

/// Little-endian fixed-width integers, as both TFRecord framing and protocol buffers store them.
DETTRIAL_INLINE void put_fixed(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}
DETTRIAL_INLINE std::uint64_t get_fixed(const char* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return value;
}

DETTRIAL_INLINE std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (const char c : bytes) crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

DETTRIAL_INLINE void Message::put_varint(std::uint64_t value) {
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

DETTRIAL_INLINE Message& Message::varint(int field, std::uint64_t value) {
  put_key(field, 0);
  put_varint(value);
  return *this;
}

DETTRIAL_INLINE Message& Message::fixed64(int field, double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(field, 1);
  put_fixed(out_, bits, 8);
  return *this;
}

DETTRIAL_INLINE Message& Message::fixed32(int field, float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(field, 5);
  put_fixed(out_, bits, 4);
  return *this;
}

DETTRIAL_INLINE Message& Message::bytes(int field, std::string_view value) {
  put_key(field, 2);
  put_varint(value.size());
  out_.append(value);
  return *this;
}

DETTRIAL_INLINE Message& Message::packed_doubles(int field, const std::vector<double>& values) {
  std::string packed;
  packed.reserve(values.size() * 8);
  for (const double v : values) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    put_fixed(packed, bits, 8);
  }
  return bytes(field, packed);
}

DETTRIAL_INLINE std::string frame(std::string_view data) {
  std::string length;
  put_fixed(length, data.size(), 8);
  std::string out = length;
  put_fixed(out, masked_crc32c(length), 4);
  out.append(data);
  put_fixed(out, masked_crc32c(data), 4);
  return out;
}

DETTRIAL_INLINE Records read_records(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Records out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) return out.torn = true, out;
    const std::string_view length_bytes(bytes.data() + at, 8);
    if (get_fixed(bytes.data() + at + 8, 4) != masked_crc32c(length_bytes)) return out.torn = true, out;
    const std::uint64_t length = get_fixed(bytes.data() + at, 8);
    if (bytes.size() - at - 12 < 4 || length > bytes.size() - at - 16) return out.torn = true, out;  // no overflow
    const std::string_view data(bytes.data() + at + 12, length);
    if (get_fixed(bytes.data() + at + 12 + length, 4) != masked_crc32c(data)) return out.torn = true, out;
    out.records.emplace_back(data);
    at += 12 + length + 4;
  }
  return out;
}

DETTRIAL_INLINE std::int64_t event_step(std::string_view event) {
  std::size_t at = 0;
  auto varint = [&](std::uint64_t& value) {
    value = 0;
    for (int shift = 0; at < event.size() && shift < 64; shift += 7) {
      const auto byte = static_cast<unsigned char>(event[at++]);
      value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (at < event.size()) {
    std::uint64_t key = 0, value = 0;
    if (!varint(key)) return 0;
    const int field = static_cast<int>(key >> 3);
    switch (key & 7) {
      case 0:
        if (!varint(value)) return 0;
        if (field == 2) return static_cast<std::int64_t>(value);
        break;
      case 1: at += 8; break;  // past the end: the loop ends
      case 5: at += 4; break;
      case 2:
        if (!varint(value) || value > event.size() - at) return 0;
        at += value;
        break;
      default: return 0;  // groups: never in an Event
    }
  }
  return 0;
}

DETTRIAL_INLINE std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.is_regular_file(ec) && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace dettrial::detail::tensorboard

namespace dettrial {

namespace detail::tensorboard {
/// An Event's wall_time: seconds since the epoch.
DETTRIAL_INLINE double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace detail::tensorboard

DETTRIAL_INLINE std::size_t TensorBoardWriter::drop_events_after(const std::filesystem::path& dir, std::int64_t batch) {
  namespace tb = detail::tensorboard;
  std::size_t dropped = 0;
  std::error_code ec;
  for (const auto& path : tb::event_files(dir)) {
    tb::Records read = tb::read_records(path);
    // The stopped run's session end goes too: the resumed run ends the session again.
    const auto past = std::remove_if(read.records.begin(), read.records.end(), [&](const std::string& event) {
      return tb::event_step(event) > batch || event.find("_hparams_/session_end_info") != std::string::npos;
    });
    const auto removed = static_cast<std::size_t>(read.records.end() - past) + (read.torn ? 1 : 0);
    if (removed == 0) continue;
    read.records.erase(past, read.records.end());
    dropped += removed;
    if (read.records.size() <= 1) {  // nothing but the version record
      std::filesystem::remove(path, ec);
      continue;
    }
    std::string kept;
    for (const auto& event : read.records) kept += tb::frame(event);
    detail::write_atomically(path, kept);
  }
  return dropped;
}

DETTRIAL_INLINE TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at) : dir_(dir) {
  namespace tb = detail::tensorboard;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create TensorBoard folder '" + dir.string() + "': " + ec.message());
  if (resumed_at) dropped_ = drop_events_after(dir, *resumed_at);
  for (const auto& path : tb::event_files(dir)) {
    for (const auto& event : tb::read_records(path).records)
      if (event.find("_hparams_/session_start_info") != std::string::npos) has_session_ = true;
    if (has_session_) break;
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  // TensorBoard reads a folder's files in name order: the time first, then a counter so that two
  // writers started in one second (a quick resume) still sort by start.
  const auto seconds = static_cast<long long>(detail::tensorboard::wall_time_now());
  for (int n = 0;; ++n) {
    file_ =
        dir / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid()) + "." + std::to_string(n));
    if (!std::filesystem::exists(file_, ec)) break;
  }
  out_.open(file_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("cannot write TensorBoard event file '" + file_.string() + "'");
  tb::Message version;
  version.fixed64(1, detail::tensorboard::wall_time_now()).bytes(3, "brain.Event:2");
  out_ << tb::frame(version.str());
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::write_event(std::int64_t step, const detail::tensorboard::Message& summary) {
  if (!out_.is_open()) return;
  detail::tensorboard::Message event;
  event.fixed64(1, detail::tensorboard::wall_time_now()).varint(2, static_cast<std::uint64_t>(step)).message(5, summary);
  out_ << detail::tensorboard::frame(event.str());
}

DETTRIAL_INLINE void TensorBoardWriter::add_scalar(std::string_view tag, double value, std::int64_t step) {
  if (!out_.is_open()) return;
  detail::tensorboard::Message v, summary;
  v.bytes(1, tag).fixed32(2, static_cast<float>(value));
  summary.message(1, v);
  write_event(step, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::add_histogram(std::string_view tag, const torch::Tensor& values, std::int64_t step,
                                                      std::int64_t bins) {
  if (!out_.is_open()) return;
  if (bins < 1) throw Error("add_histogram('" + std::string(tag) + "'): bins must be at least 1, not " + std::to_string(bins));
  const torch::NoGradGuard no_grad;
  torch::Tensor x = values.detach().to(torch::kCPU, torch::kDouble).flatten();
  x = x.index({torch::isfinite(x)});
  detail::tensorboard::Message histo;
  if (x.numel() == 0) {
    histo.fixed64(1, 0).fixed64(2, 0).fixed64(3, 0).fixed64(4, 0).fixed64(5, 0);
  } else {
    const double lo = x.min().item<double>(), hi = x.max().item<double>();
    const torch::Tensor counts =
        lo == hi ? torch::full({1}, static_cast<double>(x.numel()), torch::kDouble) : torch::histc(x, bins, lo, hi);
    std::vector<double> limits, buckets;
    const std::int64_t n = counts.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      limits.push_back(i + 1 == n ? hi : lo + (hi - lo) * static_cast<double>(i + 1) / static_cast<double>(n));
      buckets.push_back(counts[i].item<double>());
    }
    histo.fixed64(1, lo)
        .fixed64(2, hi)
        .fixed64(3, static_cast<double>(x.numel()))
        .fixed64(4, x.sum().item<double>())
        .fixed64(5, (x * x).sum().item<double>())
        .packed_doubles(6, limits)
        .packed_doubles(7, buckets);
  }
  detail::tensorboard::Message v, summary;
  v.bytes(1, tag).message(5, histo);
  summary.message(1, v);
  write_event(step, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::write_hparams_data(std::string_view tag, const detail::tensorboard::Message& plugin_data) {
  namespace tb = detail::tensorboard;
  // SummaryMetadata{plugin_data{plugin_name "hparams", content}}, and the empty float tensor the
  // plugin's own writer attaches (TensorBoard reads plugin summaries as tensors).
  tb::Message plugin, metadata, shape, null_tensor, v, summary;
  plugin.bytes(1, "hparams").bytes(2, plugin_data.str());
  metadata.message(1, plugin);
  shape.message(2, tb::Message{});             // one dimension of size 0
  null_tensor.varint(1, 1).message(2, shape);  // DT_FLOAT
  v.bytes(1, tag).message(9, metadata).message(8, null_tensor);
  summary.message(1, v);
  write_event(0, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                                    std::string_view group) {
  if (!out_.is_open()) return;
  namespace tb = detail::tensorboard;
  tb::Message start;
  for (const auto& [name, value] : hparams) {
    tb::Message proto_value, entry;  // google.protobuf.Value: number 2, string 3, bool 4
    if (const auto* number = std::get_if<double>(&value)) proto_value.fixed64(2, *number);
    else if (const auto* text = std::get_if<std::string>(&value)) proto_value.bytes(3, *text);
    else proto_value.varint(4, std::get<bool>(value) ? 1 : 0);
    entry.bytes(1, name).message(2, proto_value);  // a map entry: key 1, value 2
    start.message(1, entry);
  }
  if (!group.empty()) start.bytes(4, group);
  start.fixed64(5, detail::tensorboard::wall_time_now());
  tb::Message data;  // HParamsPluginData{version 0, session_start_info 3}
  data.message(3, start);
  write_hparams_data("_hparams_/session_start_info", data);
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::end_session(bool success) {
  if (!out_.is_open()) return;
  namespace tb = detail::tensorboard;
  tb::Message end, data;
  end.varint(1, success ? 1 : 2).fixed64(2, detail::tensorboard::wall_time_now());  // STATUS_SUCCESS, STATUS_FAILURE
  data.message(4, end);
  write_hparams_data("_hparams_/session_end_info", data);
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::flush() {
  if (out_.is_open()) out_.flush();
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/tensorboard/event_file.hpp
// ---- begin dettrial/distributed/agreement.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the ranks of a job must agree on, and how they come to agree: the chief's weights, the
/// settings that place every boundary, and decisions every rank acts on together.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/distributed/communicator.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The process group of a data-parallel job, on PyTorch's c10d: a TCPStore rendezvous and a
/// Gloo (CPU) or NCCL (CUDA) backend chosen by a policy type, with the few collectives dettrial uses.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>
// The backends' base class and collectives' types; the stores and the Gloo and NCCL backends are
// needed only where the process group is made (the definitions below), so a trial's translation
// unit in separate-compilation mode does not parse them.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
// Gloo comes with LibTorch's c10d when it was built with it (USE_C10D_GLOO) and its headers are
// installed (Debian: libgloo-dev); NCCL when LibTorch is CUDA-built and dettrial's CMake found nccl.h.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define DETTRIAL_HAS_GLOO 1
#endif

// ---- begin dettrial/detail/text.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Small text helpers for error messages.

#include <string>


namespace dettrial::detail {
/// The first line of a message (LibTorch's errors append a backtrace).
DETTRIAL_INLINE std::string first_line(std::string text);
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE std::string first_line(std::string text) {
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/text.hpp
// ---- begin dettrial/distributed/launch_environment.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Where this process sits in a data-parallel job, read from the launcher's environment:
/// torchrun, Slurm (`srun`), Open MPI / PMI (`mpirun`), plain RANK/WORLD_SIZE, else one process.

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>


namespace dettrial {

/// The launcher a LaunchEnvironment was read from.
enum class Launcher { single, torchrun, slurm, mpi, env };

DETTRIAL_INLINE const char* launcher_name(Launcher l);

/**
 * @brief Rank, world size and rendezvous address of this process, as its launcher set them.
 *
 * Checked in this order (Lightning's and Determined's): torchrun (RANK, GROUP_RANK, LOCAL_RANK and
 * LOCAL_WORLD_SIZE all set; with TORCHELASTIC_USE_AGENT_STORE=True the agent hosts the store and
 * every rank is a client under the prefix `/worker/attempt_<restart>`), Slurm (SLURM_PROCID,
 * SLURM_NTASKS; the first node of the job's node list hosts the store, on MASTER_PORT or a port
 * derived from the job id), Open MPI (OMPI_COMM_WORLD_RANK/SIZE) or PMI (PMI_RANK/SIZE), plain
 * RANK and WORLD_SIZE, else one process. MASTER_ADDR and MASTER_PORT override the address.
 */
struct LaunchEnvironment {
  Launcher launcher = Launcher::single;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// torchrun's agent already hosts the TCPStore: every rank connects as a client.
  bool agent_store = false;
  /// The key prefix every store access takes (torchrun's per-restart prefix), or empty.
  std::string store_prefix;
  /// How many times a launcher restarted this job (0: its first start): torchrun's
  /// TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT (a requeued job), the built-in
  /// launcher's DETTRIAL_RESTART. A restarted job continues from its run folder's latest checkpoint.
  int restart = 0;
  /// The restarts the launcher allows (torchrun's TORCHELASTIC_MAX_RESTARTS), when it says.
  std::optional<int> max_restarts;

  bool distributed() const { return size > 1; }

  using Getenv = std::function<const char*(const char*)>;

  /// The integer in environment variable `name` (at least `least`), or nullopt when it is unset or
  /// empty; throws ConfigError naming the variable when it is not such an integer.
  static std::optional<int> env_integer(const Getenv& getenv, const char* name, int least);

  static LaunchEnvironment detect(const Getenv& getenv = [](const char* name) { return std::getenv(name); });

  /// The tasks on node `node` of a Slurm task layout: "2(x3),1" gives 2 for nodes 0-2 and 1 for node 3
  /// (1 when the layout is unreadable or shorter).
  static int slurm_tasks_on_node(std::string_view layout, int node);

  /// The first host of a Slurm node list: "node[03-05,9],gpu1" gives "node03".
  static std::string first_slurm_host(std::string_view list);
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::torchrun: return "torchrun";
    case Launcher::slurm: return "Slurm";
    case Launcher::mpi: return "MPI";
    case Launcher::env: return "RANK/WORLD_SIZE";
    case Launcher::single: break;
  }
  return "single process";
}

DETTRIAL_INLINE std::optional<int> LaunchEnvironment::env_integer(const Getenv& getenv, const char* name, int least) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  int value = 0;
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < least)
    throw ConfigError(std::string("environment variable ") + name + "='" + text + "' is not " +
                      (least > 0 ? "a positive integer" : "a non-negative integer"));
  return value;
}

DETTRIAL_INLINE LaunchEnvironment LaunchEnvironment::detect(const Getenv& getenv) {
  auto has = [&](const char* name) { return getenv(name) != nullptr && *getenv(name) != '\0'; };
  auto integer = [&](const char* name, int fallback) { return env_integer(getenv, name, 0).value_or(fallback); };
  LaunchEnvironment e;
  e.restart = std::max({integer("TORCHELASTIC_RESTART_COUNT", 0), integer("SLURM_RESTART_COUNT", 0), integer("DETTRIAL_RESTART", 0)});
  e.max_restarts = env_integer(getenv, "TORCHELASTIC_MAX_RESTARTS", 0);
  if (has("RANK") && has("GROUP_RANK") && has("LOCAL_RANK") && has("LOCAL_WORLD_SIZE")) {
    e.launcher = Launcher::torchrun;
    e.rank = integer("RANK", 0);
    e.size = integer("WORLD_SIZE", 1);
    e.local_rank = integer("LOCAL_RANK", 0);
    e.local_size = integer("LOCAL_WORLD_SIZE", 1);
    if (const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE"); agent && std::string_view(agent) == "True") {
      e.agent_store = true;
      e.store_prefix = "/worker/attempt_" + std::to_string(integer("TORCHELASTIC_RESTART_COUNT", 0));
    }
  } else if (has("SLURM_PROCID") && (has("SLURM_NTASKS") || has("SLURM_NPROCS"))) {
    e.launcher = Launcher::slurm;
    e.rank = integer("SLURM_PROCID", 0);
    e.size = has("SLURM_NTASKS") ? integer("SLURM_NTASKS", 1) : integer("SLURM_NPROCS", 1);
    e.local_rank = integer("SLURM_LOCALID", 0);
    // Tasks on this node: SLURM_NTASKS_PER_NODE when given, else this node's entry of the step's
    // (or job's) task layout, such as "2(x3),1".
    const char* layout = has("SLURM_STEP_TASKS_PER_NODE") ? getenv("SLURM_STEP_TASKS_PER_NODE") : getenv("SLURM_TASKS_PER_NODE");
    e.local_size = has("SLURM_NTASKS_PER_NODE") ? integer("SLURM_NTASKS_PER_NODE", 1)
                   : layout                     ? slurm_tasks_on_node(layout, integer("SLURM_NODEID", 0))
                                                : 1;
    const char* nodes = has("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST") : getenv("SLURM_JOB_NODELIST");
    if (nodes) e.master_addr = first_slurm_host(nodes);
    // Slurm sets no port: one derived from the job id keeps concurrent jobs on a node apart.
    e.master_port = 10000 + integer("SLURM_JOB_ID", 0) % 20000;
  } else if (has("OMPI_COMM_WORLD_RANK") && has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::mpi;
    e.rank = integer("OMPI_COMM_WORLD_RANK", 0);
    e.size = integer("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_size = integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (has("PMI_RANK") && has("PMI_SIZE")) {
    e.launcher = Launcher::mpi;
    e.rank = integer("PMI_RANK", 0);
    e.size = integer("PMI_SIZE", 1);
    e.local_rank = integer("MPI_LOCALRANKID", 0);
    e.local_size = integer("MPI_LOCALNRANKS", 1);
  } else if (has("RANK") && has("WORLD_SIZE")) {
    e.launcher = Launcher::env;
    e.rank = integer("RANK", 0);
    e.size = integer("WORLD_SIZE", 1);
    e.local_rank = integer("LOCAL_RANK", e.rank);
    e.local_size = integer("LOCAL_WORLD_SIZE", e.size);
  } else {
    return e;
  }
  if (has("MASTER_ADDR")) e.master_addr = getenv("MASTER_ADDR");
  e.master_port = integer("MASTER_PORT", e.master_port);
  if (e.size < 1) throw ConfigError(std::string(launcher_name(e.launcher)) + " gives a world size of 0");
  if (e.rank >= e.size)
    throw ConfigError(std::string(launcher_name(e.launcher)) + " gives rank " + std::to_string(e.rank) + " in a world of " +
                      std::to_string(e.size));
  if (e.master_port < 1 || e.master_port > 65535) throw ConfigError("MASTER_PORT " + std::to_string(e.master_port) + " is not a TCP port");
  return e;
}

DETTRIAL_INLINE int LaunchEnvironment::slurm_tasks_on_node(std::string_view layout, int node) {
  int seen = 0;
  while (!layout.empty()) {
    const std::size_t comma = layout.find(',');
    const std::string_view entry = layout.substr(0, comma);
    int tasks = 0, repeat = 1;
    const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), tasks);
    if (ec != std::errc()) return 1;
    if (const std::string_view rest(end, static_cast<std::size_t>(entry.data() + entry.size() - end)); rest.starts_with("(x"))
      std::from_chars(rest.data() + 2, rest.data() + rest.size(), repeat);
    if (node < seen + repeat) return std::max(tasks, 1);
    seen += repeat;
    if (comma == std::string_view::npos) break;
    layout.remove_prefix(comma + 1);
  }
  return 1;
}

DETTRIAL_INLINE std::string LaunchEnvironment::first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      std::size_t j = i + 1;
      while (j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']') host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/launch_environment.hpp

namespace dettrial {

/// Distributed backends as policy types (`Communicator::create<backend::gloo>(...)`).
namespace backend {
/// Gloo over TCP: CPU tensors (any machine).
struct gloo {
  static constexpr const char* name = "gloo";
};
/// NCCL: CUDA tensors. Only when LibTorch is CUDA-built and dettrial was configured with NCCL.
struct nccl {
  static constexpr const char* name = "nccl";
};
/// Whether this build of dettrial has the Gloo backend.
inline constexpr bool has_gloo =
#if defined(DETTRIAL_HAS_GLOO)
    true;
#else
    false;
#endif
/// Whether this build of dettrial has the NCCL backend.
inline constexpr bool has_nccl =
#if defined(DETTRIAL_HAS_NCCL)
    true;
#else
    false;
#endif
}  // namespace backend

namespace detail {
// LibTorch 1.x backends derive from c10d::ProcessGroup; 2.x ones from c10d::Backend. Both have the
// same collective signatures, which are all dettrial calls.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif
}  // namespace detail

/**
 * @brief One process's handle on its job's process group. Every collective waits for its result and
 * turns a failure (a dead or hung peer, after `timeout`) into a DistributedError naming this rank.
 */
class Communicator {
 public:
  /// Joins the job `env` describes with backend `B` (rank 0 hosts the TCPStore unless torchrun's agent does).
  template <class B>
  static std::shared_ptr<Communicator> create(const LaunchEnvironment& env, std::chrono::milliseconds timeout, B = {}) {
    static_assert(std::is_same_v<B, backend::gloo> || std::is_same_v<B, backend::nccl>,
                  "dettrial: Communicator::create takes backend::gloo or backend::nccl (adopt() takes a backend of one's own)");
    return join(env, timeout, B::name);
  }

  /**
   * @brief A communicator over a c10d backend made elsewhere (one dettrial does not create, or a
   * test double), whose collectives take their tensors on `device`. `name` is the backend's name in
   * messages; the backend must be `env.size` ranks wide with this process as `env.rank`.
   */
  static std::shared_ptr<Communicator> adopt(c10::intrusive_ptr<detail::C10dBackend> backend, const LaunchEnvironment& env,
                                             std::chrono::milliseconds timeout, torch::Device device, const char* name);

  int rank() const { return env_.rank; }
  int size() const { return env_.size; }
  const LaunchEnvironment& environment() const { return env_; }
  const char* backend_name() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Sums (or takes the max of) `tensors` across ranks, in place.
  void allreduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);
  /// Starts an all-reduce and returns without waiting (see wait()).
  c10::intrusive_ptr<c10d::Work> allreduce_async(std::vector<torch::Tensor>& tensors);
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what = "all-reduce");
  /// Copies `tensors` from `root` to every rank.
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  /// Every rank's `tensor` (same shape on all), gathered on every rank in rank order.
  std::vector<torch::Tensor> allgather(const torch::Tensor& tensor);
  void barrier();

  /// Where this backend's collectives take their tensors: the CPU for Gloo, this rank's GPU for NCCL.
  /// Every collective dettrial issues passes tensors on this device.
  const torch::Device& device() const { return device_; }
  /// The c10d backend underneath, for collectives of one's own.
  const c10::intrusive_ptr<detail::C10dBackend>& backend() const { return backend_; }

  /// The chief's `values` on every rank (each rank passes as many).
  std::vector<std::int64_t> broadcast_values(const std::vector<std::int64_t>& values);
  /// The sum (or max, ...) of `values` over the ranks (each rank passes as many).
  std::vector<double> allreduce_values(const std::vector<double>& values, c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);

  /**
   * @brief Every rank's `value`, in rank order, on every rank (Determined's object allgather). The
   * values are pickled with LibTorch's serialization, so they may differ in size and shape between
   * ranks: numbers, strings, tensors, and lists, tuples and dicts of them.
   */
  std::vector<c10::IValue> allgather_object(const c10::IValue& value);

 private:
  Communicator(LaunchEnvironment env, std::chrono::milliseconds timeout, const char* backend_name);

  /// Joins the job with the backend named `backend_name` (backend::gloo::name or backend::nccl::name).
  static std::shared_ptr<Communicator> join(const LaunchEnvironment& env, std::chrono::milliseconds timeout, const char* backend_name);

  template <class F>
  void run(const char* what, F&& start) {
    try {
      start()->wait(timeout_);
    } catch (const std::exception& e) {
      throw failure(what, e);
    }
  }

  DistributedError failure(const char* what, const std::exception& e) const;

  LaunchEnvironment env_;
  std::chrono::milliseconds timeout_;
  const char* backend_name_;
  torch::Device device_{torch::kCPU};
  c10::intrusive_ptr<detail::C10dBackend> backend_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(DETTRIAL_HAS_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(DETTRIAL_HAS_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
namespace dettrial {

#if defined(DETTRIAL_HAS_GLOO)
namespace detail {
/// Gloo's transport device: the interface GLOO_SOCKET_IFNAME names, loopback for a job on one
/// machine, else the host name's address.
DETTRIAL_INLINE std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnvironment& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  // One machine (the built-in launcher, a local torchrun): loopback needs no name resolution.
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
}  // namespace detail
#endif

DETTRIAL_INLINE std::shared_ptr<Communicator> Communicator::join(const LaunchEnvironment& env, std::chrono::milliseconds timeout,
                                                                 const char* backend_name) {
  // NCCL cannot put two ranks on one GPU: say so before the rendezvous, not in NCCL's words after it.
  if (std::string_view(backend_name) == backend::nccl::name && backend::has_nccl) {
    const std::int64_t gpus = static_cast<std::int64_t>(torch::cuda::device_count());
    if (env.local_size > gpus)
      throw DistributedError("rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) +
                             ": the NCCL backend takes one GPU per rank, and this node runs " + std::to_string(env.local_size) +
                             " rank(s) but sees " + (gpus == 0 ? std::string("no GPU") : std::to_string(gpus) + " GPU(s)") +
                             "; start at most one rank per GPU, or use the Gloo backend (--backend gloo)");
  }
  auto comm = std::shared_ptr<Communicator>(new Communicator(env, timeout, backend_name));
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0 && !env.agent_store;
    if (!env.agent_store) options.numWorkers = static_cast<std::size_t>(env.size);
    options.waitWorkers = !env.agent_store;
    options.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    if (!env.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
    if (std::string_view(backend_name) == backend::gloo::name) {
#if defined(DETTRIAL_HAS_GLOO)
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_options->devices.push_back(detail::gloo_device(env));
      comm->backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.size, gloo_options);
#else
      throw DistributedError(
          "the Gloo backend is not in this build: LibTorch lacks c10d Gloo, or the gloo headers "
          "(Debian: libgloo-dev) are not installed");
#endif
    } else {
#if defined(DETTRIAL_HAS_NCCL)
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      comm->backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.size, nccl_options);
#else
      throw DistributedError(
          "the NCCL backend is not in this build: LibTorch is not CUDA-built, or dettrial was configured "
          "without NCCL (DETTRIAL_NCCL)");
#endif
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    // torchrun's agent hosts the store in its own release's protocol, which another release's client
    // does not speak (2.x's agent answers a 1.13 program with a broken pipe): the likely cause, named.
    const std::string agent_hint = env.agent_store
                                       ? "; torchrun's agent hosts the store here, so it must be the torchrun of this program's LibTorch " +
                                             std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                                             " (PyTorch releases' stores speak different protocols)"
                                       : "";
    throw DistributedError("rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) + ": cannot join the " + backend_name +
                           " process group at " + env.master_addr + ":" + std::to_string(env.master_port) + " (" +
                           launcher_name(env.launcher) + "): " + detail::first_line(e.what()) + agent_hint);
  }
  return comm;
}

DETTRIAL_INLINE std::shared_ptr<Communicator> Communicator::adopt(c10::intrusive_ptr<detail::C10dBackend> backend,
                                                                  const LaunchEnvironment& env, std::chrono::milliseconds timeout,
                                                                  torch::Device device, const char* name) {
  if (!backend) throw DistributedError("Communicator::adopt was given no backend");
  if (backend->getRank() != env.rank || backend->getSize() != env.size)
    throw DistributedError(std::string("the ") + name + " backend is rank " + std::to_string(backend->getRank()) + " of " +
                           std::to_string(backend->getSize()) + ", but the launch environment says rank " + std::to_string(env.rank) +
                           " of " + std::to_string(env.size));
  auto comm = std::shared_ptr<Communicator>(new Communicator(env, timeout, name));
  comm->device_ = device;
  comm->backend_ = std::move(backend);
  return comm;
}

DETTRIAL_INLINE void Communicator::allreduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp::RedOpType op) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  run("all-reduce", [&] { return backend_->allreduce(tensors, options); });
}

DETTRIAL_INLINE c10::intrusive_ptr<c10d::Work> Communicator::allreduce_async(std::vector<torch::Tensor>& tensors) {
  try {
    return backend_->allreduce(tensors);
  } catch (const std::exception& e) {
    throw failure("all-reduce", e);
  }
}

DETTRIAL_INLINE void Communicator::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw failure(what, e);
  }
}

DETTRIAL_INLINE void Communicator::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run("broadcast", [&] { return backend_->broadcast(tensors, options); });
}

DETTRIAL_INLINE std::vector<torch::Tensor> Communicator::allgather(const torch::Tensor& tensor) {
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(torch::empty_like(tensor));
  std::vector<torch::Tensor> in{tensor};
  run("all-gather", [&] { return backend_->allgather(out, in); });
  return out[0];
}

DETTRIAL_INLINE void Communicator::barrier() {
  run("barrier", [&] { return backend_->barrier(); });
}

DETTRIAL_INLINE std::vector<std::int64_t> Communicator::broadcast_values(const std::vector<std::int64_t>& values) {
  std::vector<torch::Tensor> t{torch::tensor(values, torch::kLong).to(device_)};
  broadcast(t);
  const torch::Tensor host = t[0].cpu();
  return {host.data_ptr<std::int64_t>(), host.data_ptr<std::int64_t>() + host.numel()};
}

DETTRIAL_INLINE std::vector<double> Communicator::allreduce_values(const std::vector<double>& values, c10d::ReduceOp::RedOpType op) {
  std::vector<torch::Tensor> t{torch::tensor(values, torch::kDouble).to(device_)};
  allreduce(t, op);
  const torch::Tensor host = t[0].cpu();
  return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
}

DETTRIAL_INLINE std::vector<c10::IValue> Communicator::allgather_object(const c10::IValue& value) {
  const std::vector<char> bytes = torch::pickle_save(value);
  const torch::Tensor size = torch::tensor({static_cast<std::int64_t>(bytes.size())}, torch::kLong);
  std::vector<std::int64_t> sizes;
  std::int64_t longest = 0;
  for (const torch::Tensor& s : allgather(size.to(device_))) {
    sizes.push_back(s.cpu().item<std::int64_t>());
    longest = std::max(longest, sizes.back());
  }
  torch::Tensor padded = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(padded.data_ptr<std::uint8_t>(), bytes.data(), bytes.size());
  const std::vector<torch::Tensor> all = allgather(padded.to(device_));
  std::vector<c10::IValue> out;
  out.reserve(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const torch::Tensor host = all[r].cpu();
    const auto* data = reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>());
    out.push_back(torch::pickle_load(std::vector<char>(data, data + sizes[r])));
  }
  return out;
}

DETTRIAL_INLINE Communicator::Communicator(LaunchEnvironment env, std::chrono::milliseconds timeout, const char* backend_name)
    : env_(std::move(env)), timeout_(timeout), backend_name_(backend_name) {
  // NCCL: one GPU per process, picked by the local rank (as the Context picks its device).
  if (std::string_view(backend_name_) == backend::nccl::name)
    device_ = torch::Device(
        torch::kCUDA,
        static_cast<c10::DeviceIndex>(env_.local_rank % std::max<std::int64_t>(static_cast<std::int64_t>(torch::cuda::device_count()), 1)));
}

DETTRIAL_INLINE DistributedError Communicator::failure(const char* what, const std::exception& e) const {
  return DistributedError("rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.size) + ": " + what + " over " +
                          backend_name_ + " failed; another rank has died, hung past the " + std::to_string(timeout_.count() / 1000) +
                          " s timeout, or is unreachable (" + detail::first_line(e.what()) + ")");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/communicator.hpp

namespace dettrial::detail {

/// The largest of `value` over the ranks (the value itself for one process): what every rank acts on.
DETTRIAL_INLINE int agreed_max(Communicator* comm, int value);

/// Copies rank 0's parameters and buffers of `modules` to every rank.
DETTRIAL_INLINE void broadcast_modules(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

/**
 * @brief Copies rank 0's buffers of `modules` (BatchNorm's running statistics and the like) to every
 * rank: one broadcast per dtype and device, none without buffers. DistributedDataParallel's
 * default (`broadcast_buffers=True`) does this before every training forward; the trainer does it
 * at the boundaries where buffers are read (before a validation, a checkpoint and the end of
 * training), which leaves every rank with exactly rank 0's buffers there at no cost per batch.
 */
DETTRIAL_INLINE void broadcast_buffers(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

/// A setting every rank must share, by name, with this rank's value as text.
struct RankSetting {
  const char* name;
  std::string value;
};

/**
 * @brief Checks that every rank holds the chief's `settings`. When one differs, every rank learns it
 * (one more collective), so all stop here together, with a ConfigError naming the setting and, on
 * the rank that differs, its value, rather than crossing collectives later.
 */
DETTRIAL_INLINE void require_same_settings(Communicator& comm, std::span<const RankSetting> settings);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE int agreed_max(Communicator* comm, int value) {
  if (!comm) return value;
  return static_cast<int>(comm->allreduce_values({static_cast<double>(value)}, c10d::ReduceOp::MAX)[0]);
}

DETTRIAL_INLINE void broadcast_modules(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> one(1);
  for (const auto& m : modules) {
    for (auto& p : m->parameters()) {
      one[0] = p.detach();
      comm.broadcast(one);
    }
    for (auto& b : m->buffers()) {
      one[0] = b;
      comm.broadcast(one);
    }
  }
}

DETTRIAL_INLINE void broadcast_buffers(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  torch::NoGradGuard no_grad;
  // Grouped by dtype and device, in the same (registration) order on every rank.
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& m : modules)
    for (const auto& b : m->buffers()) {
      if (!b.defined() || b.numel() == 0) continue;
      auto same = std::find_if(groups.begin(), groups.end(), [&](const std::vector<torch::Tensor>& g) {
        return g.front().scalar_type() == b.scalar_type() && g.front().device() == b.device();
      });
      if (same == groups.end()) groups.push_back({b});
      else same->push_back(b);
    }
  std::vector<torch::Tensor> one(1);
  for (auto& group : groups) {
    std::vector<torch::Tensor> flat;
    flat.reserve(group.size());
    for (const auto& b : group) flat.push_back(b.reshape({-1}));
    one[0] = torch::cat(flat);
    comm.broadcast(one);
    std::int64_t offset = 0;
    for (auto& b : group) {
      b.copy_(one[0].narrow(0, offset, b.numel()).view_as(b));
      offset += b.numel();
    }
  }
}

DETTRIAL_INLINE void require_same_settings(Communicator& comm, std::span<const RankSetting> settings) {
  std::vector<std::int64_t> mine;
  for (const auto& s : settings) mine.push_back(static_cast<std::int64_t>(std::hash<std::string>{}(s.value)));
  const std::vector<std::int64_t> chief = comm.broadcast_values(mine);
  int differs = -1;
  for (std::size_t i = 0; i < settings.size() && differs < 0; ++i)
    if (mine[i] != chief[i]) differs = static_cast<int>(i);
  const int any = agreed_max(&comm, differs);
  if (any < 0) return;
  const RankSetting& at_fault = settings[static_cast<std::size_t>(differs >= 0 ? differs : any)];
  throw ConfigError("the ranks of this job disagree on " + std::string(at_fault.name) +
                    (differs >= 0 ? " (rank " + std::to_string(comm.rank()) + " has " + at_fault.value + ")" : std::string()) +
                    "; every rank must be given the same config and fit options");
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/agreement.hpp
// ---- begin dettrial/distributed/gradient_buckets.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradient averaging across the ranks of a job, as PyTorch's DDP does it: flat buckets whose
/// all-reduces start during the backward pass.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/**
 * @brief The gradient buckets of one optimizer's parameters in a data-parallel job.
 *
 * Flat buckets (of one dtype and device, up to 25 MiB, PyTorch DDP's default, filled from the last
 * parameters back, the order the backward pass produces them) whose all-reduces start during the
 * backward pass as each bucket fills, in bucket order on every rank; `all_reduce` then waits for them
 * and divides by the world size. The buckets are allocated on the first step and reused: a step
 * allocates nothing. A backward pass not armed (not run through `context.backward`, or two backward
 * passes in one step), and parameters without a gradient (zeros), are handled in `all_reduce` after
 * the fact. The object must not move once it has hooks (the Context holds it by pointer).
 */
class GradientBuckets {
 public:
  static constexpr std::int64_t bucket_bytes = 25 << 20;

  GradientBuckets(Communicator& communicator, std::vector<torch::Tensor> params)
      : communicator_(communicator), params_(std::move(params)) {}
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets();

  /// Before a batch's backward pass: on update batches every bucket waits for all its parameters.
  void arm(bool update_batch);

  /// Replaces every parameter's gradient by its average over the ranks.
  void all_reduce();

 private:
  /// A flat buffer that carries the gradients of several parameters in one all-reduce.
  struct Bucket {
    torch::Tensor flat;
    std::vector<std::pair<std::size_t, std::int64_t>> members;  // (parameter index, offset)
  };

  void build();

  /// Puts parameter k's gradient for this step (its accumulated .grad plus `incoming`) into its slice.
  void fill_slice(std::size_t k, const torch::Tensor& incoming);

  /// Starts the all-reduces of the buckets that are full, strictly in bucket order (ranks must issue
  /// collectives in the same order).
  void start_ready_buckets();

  Communicator& communicator_;
  std::vector<torch::Tensor> params_;
  std::vector<Bucket> buckets_{};
  std::vector<std::size_t> bucket_of_{};                 // per parameter
  std::vector<std::int64_t> offset_of_{};                // per parameter, in its bucket
  std::vector<unsigned> hooks_{};                        // per parameter
  std::vector<char> filled_{};                           // per parameter: its slice holds this step's gradient
  std::vector<std::size_t> pending_{};                   // per bucket: parameters still to come
  std::vector<c10::intrusive_ptr<c10d::Work>> works_{};  // the all-reduces started, in bucket order
  std::vector<torch::Tensor> collective_arg_{1};         // c10d takes a vector: one, reused
  bool armed_ = false;                                   // this backward pass feeds the buckets
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE GradientBuckets::~GradientBuckets() {
  for (std::size_t k = 0; k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

DETTRIAL_INLINE void GradientBuckets::arm(bool update_batch) {
  armed_ = !buckets_.empty() && update_batch;
  if (!armed_) return;
  std::fill(filled_.begin(), filled_.end(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].members.size();
  works_.clear();
}

DETTRIAL_INLINE void GradientBuckets::all_reduce() {
  if (buckets_.empty()) build();
  torch::NoGradGuard no_grad;
  if (!armed_) {  // the hooks did not feed this step (or saw two backward passes): start over
    for (const auto& work : works_) communicator_.wait(work, "gradient all-reduce");
    std::fill(filled_.begin(), filled_.end(), 0);
    works_.clear();
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!filled_[i]) fill_slice(i, torch::Tensor());
  std::fill(pending_.begin(), pending_.end(), 0);
  start_ready_buckets();
  const double scale = 1.0 / static_cast<double>(communicator_.size());
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    communicator_.wait(works_[k], "gradient all-reduce");
    Bucket& b = buckets_[k];
    b.flat.mul_(scale);
    for (const auto& [i, offset] : b.members) {
      torch::Tensor& p = params_[i];
      const torch::Tensor slice = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(slice);
      else p.mutable_grad() = slice.clone();
    }
  }
  armed_ = false;
}

DETTRIAL_INLINE void GradientBuckets::build() {
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (std::size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (buckets_.empty() || buckets_.back().flat.scalar_type() != p.scalar_type() || buckets_.back().flat.device() != p.device() ||
        (buckets_.back().flat.numel() + p.numel()) * p.element_size() > bucket_bytes)
      buckets_.push_back(Bucket{torch::empty({0}, p.options()), {}});
    Bucket& b = buckets_.back();
    b.members.emplace_back(k, b.flat.numel());
    offset_of_[k] = b.flat.numel();
    b.flat = torch::empty({b.flat.numel() + p.numel()}, p.options());
    bucket_of_[k] = buckets_.size() - 1;
  }
  filled_.assign(params_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  works_.reserve(buckets_.size());
  for (std::size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(params_[k].register_hook([this, k](const torch::Tensor& grad) {
      if (!armed_) return;
      if (filled_[k]) {  // a second backward pass in this step: redone in all_reduce
        armed_ = false;
        return;
      }
      torch::NoGradGuard no_grad;
      fill_slice(k, grad);
      --pending_[bucket_of_[k]];
      start_ready_buckets();
    }));
}

DETTRIAL_INLINE void GradientBuckets::fill_slice(std::size_t k, const torch::Tensor& incoming) {
  const torch::Tensor& p = params_[k];
  torch::Tensor slice = buckets_[bucket_of_[k]].flat.narrow(0, offset_of_[k], p.numel());
  if (incoming.defined()) {
    slice.copy_(incoming.reshape({-1}));
    if (p.grad().defined()) slice.add_(p.grad().reshape({-1}));
  } else if (p.grad().defined()) {
    slice.copy_(p.grad().reshape({-1}));
  } else {
    slice.zero_();
  }
  filled_[k] = 1;
}

DETTRIAL_INLINE void GradientBuckets::start_ready_buckets() {
  while (works_.size() < buckets_.size() && pending_[works_.size()] == 0) {
    collective_arg_[0] = buckets_[works_.size()].flat;
    works_.push_back(communicator_.allreduce_async(collective_arg_));
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/gradient_buckets.hpp
// ---- begin dettrial/distributed/metrics.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metrics across ranks, as Determined reduces them: training means averaged over ranks;
/// validation reduced per rank, then across ranks (avg weighted by each rank's batch count); user
/// reducers per slot, then across slots; record counts of the whole job. Every rank computes the
/// same result from the same gathered shares, so every decision taken on them is agreed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/// What one rank contributes at the end of a training workload or a validation.
struct RankShare {
  /// Per metric: the training mean (training), or the per-rank total of its reducer (validation).
  std::vector<ValidationReduction::Total> totals{};
  std::int64_t batches = 0;
  std::int64_t records = 0;
  /// The per-slot parts of the user reducers taking part, in registration order.
  std::vector<c10::IValue> reducer_parts{};
};

DETTRIAL_INLINE c10::IValue to_ivalue(const RankShare& share);

DETTRIAL_INLINE RankShare from_ivalue(const c10::IValue& v);

/// Every rank's share, in rank order, on every rank (one all-gather); one process: its own.
DETTRIAL_INLINE std::vector<RankShare> gather_shares(RankShare mine, Communicator* comm);

DETTRIAL_INLINE std::int64_t total_records(const std::vector<RankShare>& shares);
DETTRIAL_INLINE std::int64_t total_batches(const std::vector<RankShare>& shares);

/// Each metric any rank reported (in the order first seen, chief first), with its reducer and the
/// values of the ranks that reported it.
struct MetricAcrossRanks {
  std::string name;
  Reducer reducer;
  std::vector<double> values;
};
DETTRIAL_INLINE std::vector<MetricAcrossRanks> by_metric(const std::vector<RankShare>& shares);

/// Training: each metric's mean over the ranks that report it (every rank trains as many batches
/// per workload, so this is Determined's per-batch mean over ranks, then over batches).
DETTRIAL_INLINE MetricValues combine_training(const std::vector<RankShare>& shares);

/// Validation: avg = the sum over all batches of all ranks / all batches (Determined's mean weighted
/// by each rank's batch count), sum, max and min over the ranks that validated any batch; a NaN
/// anywhere gives NaN, like np.max / np.sum.
DETTRIAL_INLINE MetricValues combine_validation(const std::vector<RankShare>& shares);

/// The parts of reducer `index` (among those taking part), one per rank in rank order.
DETTRIAL_INLINE std::vector<c10::IValue> reducer_parts(const std::vector<RankShare>& shares, std::size_t index);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE c10::IValue to_ivalue(const RankShare& share) {
  c10::List<std::string> names;
  c10::List<std::int64_t> kinds;
  c10::List<double> values;
  for (const auto& t : share.totals) {
    names.push_back(t.name);
    kinds.push_back(static_cast<std::int64_t>(t.reducer));
    values.push_back(t.value);
  }
  c10::impl::GenericList parts(c10::AnyType::get());
  for (const auto& p : share.reducer_parts) parts.push_back(p);
  return c10::ivalue::Tuple::create({names, kinds, values, share.batches, share.records, parts});
}

DETTRIAL_INLINE RankShare from_ivalue(const c10::IValue& v) {
  // Through an ArrayRef of checked size: indexing the tuple's elements directly past 3 (its inline
  // storage) is what GCC's -Warray-bounds cannot prove safe.
  const c10::ArrayRef<c10::IValue> e = v.toTupleRef().elements().asArrayRef();
  if (e.size() != 6)
    throw Error("a rank sent a metrics share of " + std::to_string(e.size()) +
                " fields, not 6 (ranks built from different dettrial versions?)");
  RankShare share;
  const auto names = e[0].toList();
  const auto kinds = e[1].toList();
  const auto values = e[2].toList();
  for (std::size_t i = 0; i < names.size(); ++i)
    share.totals.push_back({names.get(i).toStringRef(), static_cast<Reducer>(kinds.get(i).toInt()), values.get(i).toDouble()});
  share.batches = e[3].toInt();
  share.records = e[4].toInt();
  for (const auto& p : e[5].toList()) share.reducer_parts.push_back(p);
  return share;
}

DETTRIAL_INLINE std::vector<RankShare> gather_shares(RankShare mine, Communicator* comm) {
  if (comm == nullptr) return {std::move(mine)};
  std::vector<RankShare> out;
  for (const c10::IValue& v : comm->allgather_object(to_ivalue(mine))) out.push_back(from_ivalue(v));
  return out;
}

DETTRIAL_INLINE std::int64_t total_records(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.records;
  return n;
}

DETTRIAL_INLINE std::int64_t total_batches(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.batches;
  return n;
}

DETTRIAL_INLINE std::vector<MetricAcrossRanks> by_metric(const std::vector<RankShare>& shares) {
  std::vector<MetricAcrossRanks> out;
  for (const auto& share : shares)
    for (const auto& t : share.totals) {
      auto it = std::find_if(out.begin(), out.end(), [&](const MetricAcrossRanks& m) { return m.name == t.name; });
      if (it == out.end()) it = out.insert(out.end(), MetricAcrossRanks{t.name, t.reducer, {}});
      it->values.push_back(t.value);
    }
  return out;
}

DETTRIAL_INLINE MetricValues combine_training(const std::vector<RankShare>& shares) {
  MetricValues out;
  for (const auto& m : by_metric(shares))
    out.set(m.name, std::accumulate(m.values.begin(), m.values.end(), 0.0) / static_cast<double>(m.values.size()));
  return out;
}

DETTRIAL_INLINE MetricValues combine_validation(const std::vector<RankShare>& shares) {
  MetricValues out;
  const double all_batches = static_cast<double>(total_batches(shares));
  for (const auto& m : by_metric(shares)) {
    double value = m.reducer == Reducer::max   ? -std::numeric_limits<double>::infinity()
                   : m.reducer == Reducer::min ? std::numeric_limits<double>::infinity()
                                               : 0.0;
    for (const double v : m.values) {
      if (std::isnan(v) || std::isnan(value)) value = std::numeric_limits<double>::quiet_NaN();
      else value = m.reducer == Reducer::max ? std::max(value, v) : m.reducer == Reducer::min ? std::min(value, v) : value + v;
    }
    out.set(m.name, m.reducer == Reducer::avg ? value / all_batches : value);
  }
  return out;
}

DETTRIAL_INLINE std::vector<c10::IValue> reducer_parts(const std::vector<RankShare>& shares, std::size_t index) {
  std::vector<c10::IValue> parts;
  parts.reserve(shares.size());
  for (const auto& s : shares) {
    if (index >= s.reducer_parts.size())
      throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
    parts.push_back(s.reducer_parts[index]);
  }
  return parts;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/metrics.hpp
// ---- begin dettrial/distributed/sync_batch_norm.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batch normalization whose statistics are the job's: in training, the mean and variance
/// of each channel over the global batch (every rank's share), as PyTorch's SyncBatchNorm computes
/// them, with the backward pass reducing its two sums across the ranks too.

#include <cstdint>
#include <vector>

#include <torch/torch.h>


namespace dettrial::nn {

/**
 * @brief BatchNorm over the global batch of a data-parallel job (PyTorch's `nn.SyncBatchNorm`).
 *
 * In training, each channel's mean and (biased) variance come from every rank's batch: one
 * all-reduce of (sum, sum of squares, count) per forward, one of (sum of the gradient, sum of the
 * gradient times the centred input) per backward. So a per-slot batch of 8 on 4 ranks normalizes
 * as a batch of 32 does in one process, and the running statistics (updated with the unbiased
 * variance, as BatchNorm does) stay the same on every rank. In evaluation, or without a
 * communicator (one process), it is BatchNorm. Its parameters and buffers have BatchNorm's names,
 * so checkpoints move between the two and to Python's BatchNorm and SyncBatchNorm. Takes inputs of
 * shape (N, C, *): it serves BatchNorm1d, 2d and 3d.
 */
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(torch::nn::BatchNormOptions options, Communicator* communicator = nullptr);

  void reset() override;
  void reset_parameters();
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  torch::nn::BatchNormOptions options;
  /// The job's process group; null in one process (it then normalizes as BatchNorm).
  Communicator* communicator = nullptr;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

/**
 * @brief `model` with each BatchNorm1d, 2d and 3d replaced by a
 * SyncBatchNorm over `communicator` that holds the same options, parameters and running statistics
 * (PyTorch's `SyncBatchNorm.convert_sync_batchnorm`). The other layers are shared, not copied.
 * A BatchNorm held by a module of one's own cannot be swapped from outside (its forward calls its
 * member): declare that member a SyncBatchNorm instead.
 */
DETTRIAL_INLINE torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& model, Communicator* communicator);

}  // namespace dettrial::nn

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::nn {
namespace detail {

/// Every dimension but the channels' (1): the ones a channel's statistics are taken over.
inline std::vector<std::int64_t> non_channel_dims(const torch::Tensor& input) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

/// A per-channel vector shaped to broadcast over an (N, C, *) input.
inline torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& input) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return v.view(shape);
}

/// The autograd function of a synchronized batch norm in training. Statistics and sums are
/// accumulated in double, so the global mean and variance do not depend on how the batch is split.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input, torch::Tensor weight, torch::Tensor bias,
                               torch::Tensor running_mean, torch::Tensor running_var, double eps, double momentum,
                               std::int64_t communicator_address) {
    auto& comm = *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(communicator_address));
    const auto dims = non_channel_dims(input);
    const std::int64_t channels = input.size(1);
    const auto opts = input.options().dtype(torch::kDouble);
    std::vector<torch::Tensor> stats{
        torch::cat({input.sum(dims, false, torch::kDouble), input.square().sum(dims, false, torch::kDouble),
                    torch::full({1}, static_cast<double>(input.numel() / std::max<std::int64_t>(channels, 1)), opts)})};
    comm.allreduce(stats);
    const torch::Tensor count = stats[0].narrow(0, 2 * channels, 1);
    const torch::Tensor mean = stats[0].narrow(0, 0, channels) / count;
    const torch::Tensor var = (stats[0].narrow(0, channels, channels) / count - mean.square()).clamp_min(0);
    const torch::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.scalar_type()), momentum);
    }
    torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kDouble) : invstd;
    torch::Tensor output = (input - per_channel(mean.to(input.scalar_type()), input)) * per_channel(scale.to(input.scalar_type()), input);
    if (bias.defined()) output = output + per_channel(bias, input);
    ctx->save_for_backward({input, weight, mean, invstd, count});
    ctx->saved_data["communicator"] = communicator_address;
    ctx->saved_data["has_bias"] = bias.defined();
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3], &count = saved[4];
    const torch::Tensor& dy = grads[0];
    const auto dims = non_channel_dims(input);
    const std::int64_t channels = input.size(1);
    const torch::Tensor xmu = input - per_channel(mean.to(input.scalar_type()), input);
    const torch::Tensor sum_dy = dy.sum(dims, false, torch::kDouble);
    const torch::Tensor sum_dy_xmu = (dy * xmu).sum(dims, false, torch::kDouble);
    // The parameters' gradients are this rank's share; the trainer averages them as it does all.
    torch::Tensor grad_weight = weight.defined() ? (sum_dy_xmu * invstd).to(weight.scalar_type()) : torch::Tensor();
    torch::Tensor grad_bias = ctx->saved_data["has_bias"].toBool() ? sum_dy.to(dy.scalar_type()) : torch::Tensor();
    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      auto& comm = *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(ctx->saved_data["communicator"].toInt()));
      std::vector<torch::Tensor> sums{torch::cat({sum_dy, sum_dy_xmu})};
      comm.allreduce(sums);
      const torch::Tensor mean_dy = sums[0].narrow(0, 0, channels) / count;
      const torch::Tensor mean_dy_xmu = sums[0].narrow(0, channels, channels) / count;
      const torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kDouble) : invstd;
      const auto t = input.scalar_type();
      grad_input = (dy - per_channel(mean_dy.to(t), input) - xmu * per_channel((invstd.square() * mean_dy_xmu).to(t), input)) *
                   per_channel(scale.to(t), input);
    }
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

DETTRIAL_INLINE SyncBatchNormImpl::SyncBatchNormImpl(torch::nn::BatchNormOptions options_, Communicator* communicator_)
    : options(std::move(options_)), communicator(communicator_) {
  SyncBatchNormImpl::reset();
}

DETTRIAL_INLINE void SyncBatchNormImpl::reset() {
  const std::int64_t n = options.num_features();
  weight = options.affine() ? register_parameter("weight", torch::empty({n})) : register_parameter("weight", torch::Tensor(), false);
  bias = options.affine() ? register_parameter("bias", torch::empty({n})) : register_parameter("bias", torch::Tensor(), false);
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({n}));
    running_var = register_buffer("running_var", torch::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

DETTRIAL_INLINE void SyncBatchNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  if (running_mean.defined()) {
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
  if (options.affine()) {
    weight.fill_(1);
    bias.zero_();
  }
}

DETTRIAL_INLINE torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm expects an input of shape (N, C, *), got ", input.dim(), " dimensions");
  // BatchNorm's momentum: the given one, or (unset) the cumulative average over the batches tracked.
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();
  }
  const bool synchronized = is_training() && communicator != nullptr && communicator->size() > 1;
  if (!synchronized)
    return torch::batch_norm(input, weight, bias, running_mean, running_var, is_training() || !running_mean.defined(), momentum,
                             options.eps(), at::globalContext().userEnabledCuDNN());
  return detail::SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, options.eps(), momentum,
                                              static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(communicator)));
}

DETTRIAL_INLINE void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dettrial::nn::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

namespace detail {
template <class BatchNormImpl>
bool replace_batch_norm(const std::shared_ptr<torch::nn::Module>& module, Communicator* communicator, torch::nn::Sequential& out,
                        const std::string& name) {
  const auto bn = std::dynamic_pointer_cast<BatchNormImpl>(module);
  if (!bn) return false;
  SyncBatchNorm sync(bn->options, communicator);
  torch::NoGradGuard no_grad;
  if (bn->options.affine()) {
    sync->weight.copy_(bn->weight);
    sync->bias.copy_(bn->bias);
    sync->weight.set_requires_grad(bn->weight.requires_grad());
    sync->bias.set_requires_grad(bn->bias.requires_grad());
  }
  if (bn->options.track_running_stats()) {
    sync->running_mean.copy_(bn->running_mean);
    sync->running_var.copy_(bn->running_var);
    sync->num_batches_tracked.copy_(bn->num_batches_tracked);
  }
  if (!bn->is_training()) sync->eval();
  if (!bn->parameters().empty()) sync->to(bn->parameters().front().device(), bn->parameters().front().scalar_type());
  out->push_back(std::string(name), sync);
  return true;
}
}  // namespace detail

DETTRIAL_INLINE torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& model, Communicator* communicator) {
  torch::nn::Sequential out;
  const auto names = model->named_children().keys();
  std::size_t i = 0;
  for (const auto& any : *model) {
    const std::string& name = names.at(i++);
    const std::shared_ptr<torch::nn::Module> module = any.ptr();
    if (detail::replace_batch_norm<torch::nn::BatchNorm1dImpl>(module, communicator, out, name) ||
        detail::replace_batch_norm<torch::nn::BatchNorm2dImpl>(module, communicator, out, name) ||
        detail::replace_batch_norm<torch::nn::BatchNorm3dImpl>(module, communicator, out, name))
      continue;
    out->push_back(std::string(name), any);
  }
  if (!model->is_training()) out->eval();
  return out;
}

}  // namespace dettrial::nn
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/sync_batch_norm.hpp
// ---- begin dettrial/distributed/threads.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How many threads each process computes with: in a data-parallel job its share of the
/// cores, so that the ranks on a node do not each run an OpenMP team as large as the node; and the
/// same count for every pool that computes, LibTorch's intra-op pool and the BLAS library's own.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>


namespace dettrial {

/// The intra-op thread count a process trains with, and why (printed once at start).
struct ThreadChoice {
  int threads = 1;
  /// Where the number came from: "OMP_NUM_THREADS", "--threads", "SLURM_CPUS_PER_TASK", "CPUs ... bound
  /// to this rank by the launcher", "cores bound to this process", or "cores / ranks on this node".
  std::string source;
  /// Whether dettrial sets it (false: the user's OMP_NUM_THREADS, which LibTorch applies itself).
  bool set_by_dettrial = true;
};

/// What a process computes with when neither `--threads` nor OMP_NUM_THREADS says.
enum class ThreadDefault {
  /// Its share of the cores (all of them for one process): the fastest, and the thread count then
  /// follows the rank count.
  share_of_cores,
  /// One thread per rank, however many ranks: reproducibility.rank_invariant's, whose results must
  /// not depend on the rank count, and a matrix product's rounding depends on its thread count.
  one_per_rank,
};

/// The CPUs this process may run on (its affinity mask), in increasing order.
DETTRIAL_INLINE std::vector<int> allowed_cpus();

/// Sets the calling thread's CPU affinity (inherited by the processes it starts); whether it could.
DETTRIAL_INLINE bool set_thread_cpus(const std::vector<int>& cpus);

/// The cores this process may run on (its affinity mask) and the cores the machine has online.
struct CoreCount {
  int available = 1;
  int online = 1;

  static CoreCount of_this_process();
};

/// The environment variable in which the built-in launcher tells a rank the CPUs it bound it to.
inline constexpr const char* rank_cpus_variable = "DETTRIAL_RANK_CPUS";

/// Rank `rank`'s share when `ranks` processes split `cpus`: contiguous runs whose sizes differ by at
/// most one (the first ranks take the extra CPUs). Empty when there are fewer CPUs than ranks.
DETTRIAL_INLINE std::vector<int> share_of_cpus(const std::vector<int>& cpus, int ranks, int rank);

/// A CPU list as Linux writes one ("0-3,8,10-11").
DETTRIAL_INLINE std::string cpu_list_text(const std::vector<int>& cpus);

namespace detail {
/// The thread count OpenMP takes from OMP_NUM_THREADS: its leading integer ("4", " 8", "4,2" for
/// nested teams); nullopt when unset or unreadable (OpenMP then warns and ignores it itself).
DETTRIAL_INLINE std::optional<int> omp_num_threads(const LaunchEnvironment::Getenv& getenv);
}  // namespace detail

/// What each thread pool of this process was left with, for the run's first line.
struct ThreadPools {
  /// LibTorch's intra-op pool (OpenMP or its native pool), which its own kernels split work over.
  int intra_op = 1;
  /// The BLAS library's own pool and where its size came from: "OpenBLAS 2", "OpenBLAS 4 from
  /// OPENBLAS_NUM_THREADS", "MKL 2 following the intra-op pool" (LibTorch sizes an MKL it built in), "BLIS 2"; empty
  /// when the BLAS has no pool dettrial can see (the reference BLAS is single-threaded).
  std::string blas;
  /// LibTorch's inter-op pool (torch::jit::fork and friends; dettrial's loop does not use it).
  int inter_op = 1;

  /// "intra-op 2, OpenBLAS 2, inter-op 2".
  std::string text() const;
};

/**
 * @brief Gives every pool that computes `choice.threads` threads: LibTorch's intra-op pool (unless
 * the count is the user's OMP_NUM_THREADS, which LibTorch applied itself at start), and the BLAS
 * library's own pool, which LibTorch does not size for a BLAS it did not build in: OpenBLAS (whose
 * pthread build otherwise starts one thread per CPU it sees, whatever the launcher decided) and
 * BLIS through their APIs, found at run time; an MKL built into LibTorch follows the intra-op pool
 * by itself. A user's own OPENBLAS_NUM_THREADS or BLIS_NUM_THREADS is left as it is, and named.
 */
DETTRIAL_INLINE ThreadPools
apply_threads(const ThreadChoice& choice, const LaunchEnvironment::Getenv& getenv = [](const char* name) { return std::getenv(name); });

/**
 * @brief The threads per rank: the user's choice wins (`requested`, from `--threads` or
 * ContextOptions, then OMP_NUM_THREADS, which torchrun sets to 1 by itself), then Slurm's
 * SLURM_CPUS_PER_TASK, then, under launchers that bind each rank to its own cores (dettrial's
 * built-in launcher, mpirun, srun), the cores this process is bound to, else the cores available
 * divided by the ranks on this node (torchrun without OMP_NUM_THREADS, the built-in launcher on fewer
 * cores than ranks; also a mask shared by all ranks, such as taskset's or a container's). One
 * process with no choice made takes the CPUs it may run on (LibTorch's own default counts physical
 * cores on some builds, and Debian's 1.13 then trains on one of two hyperthreads). With
 * `ThreadDefault::one_per_rank` (rank_invariant) every process without a choice of the user's takes one.
 */
DETTRIAL_INLINE ThreadChoice choose_threads(
    const LaunchEnvironment& env, std::optional<int> requested, CoreCount cores,
    const LaunchEnvironment::Getenv& getenv = [](const char* name) { return std::getenv(name); },
    ThreadDefault fallback = ThreadDefault::share_of_cores);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <dlfcn.h>
#include <sched.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace dettrial {

DETTRIAL_INLINE std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

DETTRIAL_INLINE bool set_thread_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) CPU_SET(cpu, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

DETTRIAL_INLINE CoreCount CoreCount::of_this_process() {
  CoreCount c;
  c.online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto allowed = allowed_cpus();
  c.available = allowed.empty() ? c.online : static_cast<int>(allowed.size());
  return c;
}

DETTRIAL_INLINE std::vector<int> share_of_cpus(const std::vector<int>& cpus, int ranks, int rank) {
  const auto n = static_cast<std::ptrdiff_t>(cpus.size());
  if (ranks < 1 || rank < 0 || rank >= ranks || n < ranks) return {};
  const std::ptrdiff_t base = n / ranks, extra = n % ranks;
  const std::ptrdiff_t first = rank * base + std::min<std::ptrdiff_t>(rank, extra);
  return {cpus.begin() + first, cpus.begin() + first + base + (rank < extra ? 1 : 0)};
}

DETTRIAL_INLINE std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return text;
}

namespace detail {
DETTRIAL_INLINE std::optional<int> omp_num_threads(const LaunchEnvironment::Getenv& getenv) {
  const char* text = getenv("OMP_NUM_THREADS");
  if (text == nullptr) return std::nullopt;
  while (*text == ' ' || *text == '\t') ++text;
  int value = 0;
  const char* end = text;
  while (*end >= '0' && *end <= '9' && value < 1'000'000) value = value * 10 + (*end++ - '0');
  if (end == text || value < 1) return std::nullopt;
  return value;
}
}  // namespace detail

DETTRIAL_INLINE ThreadChoice choose_threads(const LaunchEnvironment& env, std::optional<int> requested, CoreCount cores,
                                            const LaunchEnvironment::Getenv& getenv, ThreadDefault fallback) {
  if (requested) {
    if (*requested < 1) throw ConfigError("the thread count must be at least 1, not " + std::to_string(*requested));
    return ThreadChoice{.threads = *requested, .source = "--threads"};
  }
  if (const auto omp = detail::omp_num_threads(getenv))
    return ThreadChoice{.threads = *omp, .source = "OMP_NUM_THREADS", .set_by_dettrial = false};
  if (fallback == ThreadDefault::one_per_rank)
    return ThreadChoice{.threads = 1, .source = "reproducibility.rank_invariant: one per rank, whatever the rank count"};
  if (!env.distributed())
    return ThreadChoice{.threads = cores.available,
                        .source = std::string(cores.available == 1 ? "the CPU" : "the " + std::to_string(cores.available) + " CPUs") +
                                  " this process may run on"};
  if (env.launcher == Launcher::slurm)
    if (const auto per_task = LaunchEnvironment::env_integer(getenv, "SLURM_CPUS_PER_TASK", 1))
      return ThreadChoice{.threads = *per_task, .source = "SLURM_CPUS_PER_TASK"};
  if (const char* bound = getenv(rank_cpus_variable); bound && *bound)
    return ThreadChoice{.threads = cores.available,
                        .source = (cores.available == 1 ? "CPU " : "CPUs ") + std::string(bound) + " bound to this rank by the launcher"};
  const bool binds_ranks = env.launcher == Launcher::mpi || env.launcher == Launcher::slurm;
  if (binds_ranks && cores.available < cores.online)
    return ThreadChoice{.threads = cores.available, .source = "cores bound to this process"};
  const int ranks_here = std::max(1, std::min(env.local_size, env.size));
  return ThreadChoice{.threads = std::max(1, cores.available / ranks_here),
                      .source = std::to_string(cores.available) + " cores / " + std::to_string(ranks_here) + " ranks on this node"};
}

DETTRIAL_INLINE std::string ThreadPools::text() const {
  return "intra-op " + std::to_string(intra_op) + (blas.empty() ? std::string() : ", " + blas) + ", inter-op " + std::to_string(inter_op);
}

namespace detail {
/// A function of the loaded libraries by its C name, or null (dlsym over the global scope, where the
/// BLAS library that LibTorch links is).
template <class F>
F* loaded_function(const char* name) {
  return reinterpret_cast<F*>(::dlsym(RTLD_DEFAULT, name));
}

/// Sizes a BLAS pool through its library's setter and reads back what it took: "OpenBLAS 2".
template <class Int>
std::string size_blas_pool(const char* library, const char* variable, void (*set)(Int), Int (*get)(), int threads,
                           const LaunchEnvironment::Getenv& getenv) {
  const char* own = getenv(variable);
  const bool users = own != nullptr && *own != '\0';
  if (!users) set(static_cast<Int>(threads));
  const long long took = get ? static_cast<long long>(get()) : threads;
  return std::string(library) + " " + std::to_string(took) + (users ? " from " + std::string(variable) : std::string());
}
}  // namespace detail

DETTRIAL_INLINE ThreadPools apply_threads(const ThreadChoice& choice, const LaunchEnvironment::Getenv& getenv) {
  if (choice.set_by_dettrial) at::set_num_threads(choice.threads);
  ThreadPools pools;
  pools.intra_op = at::get_num_threads();
  pools.inter_op = static_cast<int>(at::get_num_interop_threads());
  if (at::globalContext().hasMKL()) {
    pools.blas = "MKL " + std::to_string(pools.intra_op) + " following the intra-op pool";
  } else if (auto* set = detail::loaded_function<void(int)>("openblas_set_num_threads")) {
    pools.blas = detail::size_blas_pool<int>("OpenBLAS", "OPENBLAS_NUM_THREADS", set,
                                             detail::loaded_function<int()>("openblas_get_num_threads"), choice.threads, getenv);
  } else if (auto* set_blis = detail::loaded_function<void(std::int64_t)>("bli_thread_set_num_threads")) {
    pools.blas =
        detail::size_blas_pool<std::int64_t>("BLIS", "BLIS_NUM_THREADS", set_blis,
                                             detail::loaded_function<std::int64_t()>("bli_thread_get_num_threads"), choice.threads, getenv);
  } else if (auto* set_mkl = detail::loaded_function<void(int)>("MKL_Set_Num_Threads")) {
    pools.blas = detail::size_blas_pool<int>("MKL", "MKL_NUM_THREADS", set_mkl, detail::loaded_function<int()>("MKL_Get_Max_Threads"),
                                             choice.threads, getenv);
  }
  return pools;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/threads.hpp
// ---- begin dettrial/context/context.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The trial context: hyperparameters, batch sizes, seed, device, counters, and the wrapping of
/// models, optimizers, schedulers and reducers that the trainer drives.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include <typeinfo>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

// ---- begin dettrial/detail/malloc.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Keeping freed memory in the process: glibc's malloc settings for a training loop.

#include <cstdlib>
#include <initializer_list>

#if defined(__GLIBC__) && __has_include(<malloc.h>)
#include <malloc.h>
#define DETTRIAL_HAS_MALLOPT 1
#endif


namespace dettrial::detail {

/**
 * @brief Makes glibc keep the memory a training loop frees, once per process; returns whether it did.
 *
 * By default glibc serves each block above its mmap threshold with a fresh mapping and unmaps it on
 * free, and trims the heap's free top: a loop that frees and re-allocates the same megabytes of
 * activations and gradients every batch then takes thousands of page faults a batch, each zeroing a
 * page (the MNIST example: 1.9 million faults in 300 batches, about a quarter of its time). With the
 * mmap threshold at its maximum (32 MiB) and trimming only beyond 1 GiB, freed blocks are reused;
 * the process keeps what it used at its peak. Left alone when the user tuned malloc (a `MALLOC_*_`
 * variable or `GLIBC_TUNABLES`) or set `DETTRIAL_MALLOC=system`.
 */
DETTRIAL_INLINE bool keep_freed_memory();

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE bool keep_freed_memory() {
#if defined(DETTRIAL_HAS_MALLOPT)
  static const bool applied = [] {
    for (const char* name : {"DETTRIAL_MALLOC", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                             "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX"})
      if (const char* value = std::getenv(name); value && *value) return false;
    return ::mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1 && ::mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1 &&
           ::mallopt(M_TOP_PAD, 64 * 1024 * 1024) == 1;
  }();
  return applied;
#else
  return false;
#endif
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/malloc.hpp
// ---- begin dettrial/distributed/ordered_gradients.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradients summed in one order whatever the rank count (`reproducibility.rank_invariant`):
/// the same micro-batches give bit-identical parameters on 1 rank aggregating 4 batches, 2 ranks
/// aggregating 2 and 4 ranks aggregating none.

#include <cstdint>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/**
 * @brief The gradients of an update's micro-batches, kept apart and summed in the data stream's order.
 *
 * An all-reduce sums each rank's accumulated gradients in an order that depends on the rank count
 * (and a rank's accumulation in the order of its own micro-batches), so 1 rank aggregating 4
 * batches and 4 ranks aggregating none end with parameters a few ulps apart, which grow over a run.
 * Here each micro-batch's gradient is copied out of `.grad` after its backward pass (`stash`); at the
 * update every rank's are gathered to every rank and summed micro-batch by micro-batch in the order
 * of the data stream (`combine`), each weighted by its records over the update's records: the same
 * floating-point operations on the same values in any layout. Cost: memory for the micro-batches a
 * rank aggregates and, in a job, an all-gather of every micro-batch's gradient instead of an
 * all-reduce of one sum (see docs/distributed.md).
 */
class OrderedGradients {
 public:
  /// `micro_batches` per rank and update (the aggregation frequency); `communicator` null in one process.
  OrderedGradients(Communicator* communicator, std::int64_t micro_batches);

  /// Keeps the gradients of `params` (one micro-batch of `records` records) and zeroes them.
  void stash(const std::vector<torch::Tensor>& params, std::int64_t records);

  /// Writes into the gradients of `params` the update's sum: every rank's micro-batches, in stream
  /// order (micro-batch `j` of rank `r` is the stream's `j * ranks + r`), each weighted by its share
  /// of the records. Every micro-batch of the update must be stashed.
  void combine(const std::vector<torch::Tensor>& params);

 private:
  Communicator* communicator_;
  std::int64_t micro_batches_;
  std::int64_t stashed_ = 0;
  torch::Tensor gradients_;  // [micro_batches, numel], the parameters' dtype and device
  torch::Tensor records_;    // [micro_batches] int64, CPU
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE OrderedGradients::OrderedGradients(Communicator* communicator, std::int64_t micro_batches)
    : communicator_(communicator), micro_batches_(micro_batches), records_(torch::zeros({micro_batches}, torch::kLong)) {}

DETTRIAL_INLINE void OrderedGradients::stash(const std::vector<torch::Tensor>& params, std::int64_t records) {
  std::int64_t numel = 0;
  for (const auto& p : params) {
    if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device())
      throw TrialError("reproducibility.rank_invariant needs every trained parameter in one dtype on one device, not " +
                       std::string(c10::toString(params.front().scalar_type())) + " and " + std::string(c10::toString(p.scalar_type())));
    numel += p.numel();
  }
  if (stashed_ >= micro_batches_)
    throw TrialError("reproducibility.rank_invariant: more micro-batches than the aggregation frequency before an optimizer step");
  if (!gradients_.defined() || gradients_.size(1) != numel) gradients_ = torch::zeros({micro_batches_, numel}, params.front().options());
  torch::Tensor row = gradients_[stashed_];
  std::int64_t offset = 0;
  for (const auto& p : params) {
    torch::Tensor part = row.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      part.copy_(p.grad().reshape(-1));
      p.grad().zero_();
    } else {
      part.zero_();
    }
    offset += p.numel();
  }
  records_[stashed_] = records;
  ++stashed_;
}

DETTRIAL_INLINE void OrderedGradients::combine(const std::vector<torch::Tensor>& params) {
  if (stashed_ != micro_batches_)
    throw TrialError("reproducibility.rank_invariant: an optimizer step after " + std::to_string(stashed_) + " micro-batch(es), not " +
                     std::to_string(micro_batches_));
  stashed_ = 0;
  std::vector<torch::Tensor> gradients{gradients_}, records{records_};
  if (communicator_) {
    gradients = communicator_->allgather(gradients_);
    records = communicator_->allgather(records_.to(communicator_->device()));
    for (auto& r : records) r = r.cpu();
  }
  const auto ranks = static_cast<std::int64_t>(gradients.size());
  std::int64_t total = 0;
  for (const auto& r : records) total += r.sum().item<std::int64_t>();
  if (total == 0) throw TrialError("reproducibility.rank_invariant: an update of micro-batches without records");
  torch::Tensor sum = torch::zeros({gradients_.size(1)}, gradients_.options());
  for (std::int64_t j = 0; j < micro_batches_; ++j)
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::int64_t n = records[static_cast<std::size_t>(r)][j].item<std::int64_t>();
      if (n > 0) sum.add_(gradients[static_cast<std::size_t>(r)][j], static_cast<double>(n) / static_cast<double>(total));
    }
  std::int64_t offset = 0;
  for (const auto& p : params) {
    const torch::Tensor part = sum.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined()) p.grad().copy_(part);
    else p.mutable_grad() = part.clone();
    offset += p.numel();
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/distributed/ordered_gradients.hpp
// ---- begin dettrial/optim/mixed_precision.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Mixed precision (see config/precision.hpp for the setting): autocast for a device (torch.autocast's C++ side, across LibTorch
/// versions) and a gradient scaler with PyTorch's GradScaler semantics and checkpoint layout.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <ATen/autocast_mode.h>


namespace dettrial {

/**
 * @brief Autocast on `device` to `dtype` while alive, the previous state restored after (as
 * `with torch.autocast(...)`); no dtype turns autocast off inside (for a backward pass). Autocast
 * is per thread, like LibTorch's.
 */
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device, std::optional<at::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
  bool nested_;
};

/**
 * @brief A gradient scaler for fp16 training with PyTorch's `torch.amp.GradScaler` semantics: the
 * loss is multiplied by the scale before the backward pass; before an optimizer step the gradients
 * are unscaled and checked, and a step with an inf or NaN gradient is skipped; after each update
 * batch the scale backs off (on inf/NaN) or grows after `growth_interval` clean steps.
 *
 * As in PyTorch, the scale, the growth count and the inf/NaN flags live in tensors on the gradients'
 * device, updated there without the host waiting. Whether a step is skipped is decided on the device
 * too where the optimizer can (dettrial::optim::FusedSGD, FusedAdam and FusedAdamW with LibTorch's
 * fused kernels, 2.4 and later): then an fp16 step needs no synchronization, and a CUDA graph can
 * capture it. Other optimizers are stepped or not by the host, which reads the flag (one
 * synchronization per step, as PyTorch's GradScaler does for them).
 *
 * Wrap it with `context.wrap_scaler(scaler)` (or let `optimizations.mixed_precision: fp16` make one):
 * then `context.backward` scales the loss, `context.step_optimizer` unscales, clips and steps (or
 * skips), and the trainer updates the scale once per update batch, as Determined's automatic mixed
 * precision does. Its state is saved in checkpoints as `scaler_state_dict`, the layout Python's
 * `GradScaler.load_state_dict` reads.
 */
class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::int64_t growth_interval = 2000;
    bool enabled = true;
  };
  GradScaler() : GradScaler(Options{}) {}
  explicit GradScaler(Options options);
  /// A copy has its own state (the tensors are cloned), as a copy of the earlier host-side scaler had.
  GradScaler(const GradScaler& other);
  GradScaler& operator=(const GradScaler& other) { return *this = GradScaler(other); }
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  bool enabled() const { return options_.enabled; }
  /// The current scale (a float32 value, as PyTorch keeps it). Reads the device: not for every batch.
  double get_scale() const { return scale_.item<float>(); }
  /// Clean steps since the scale last changed. Reads the device.
  std::int64_t growth_tracker() const { return growth_tracker_.item<std::int32_t>(); }
  /// Optimizer steps skipped because a gradient was inf or NaN, since construction or restore. Reads the device.
  std::int64_t skipped_steps() const { return static_cast<std::int64_t>(skipped_.item<float>()); }

  /// `loss` times the scale (no synchronisation). A wrapped scaler's loss is scaled by
  /// `context.backward`; scaling it here as well is a TrialError.
  torch::Tensor scale(const torch::Tensor& loss);
  /// `t` times the scale, in `t`'s dtype (for the context: a gradient given to backward).
  torch::Tensor scaled(const torch::Tensor& t);

  /// Unscales the gradients of `params` in place and records whether any is inf or NaN (on their
  /// device: no synchronisation). Once per step; `step` calls it when it was not.
  void unscale(const std::vector<torch::Tensor>& params);
  /// Steps `optimizer` unless the unscaled gradients hold an inf or NaN. An optimizer that can skip on
  /// the device (see the class) is always called and returns true: the host does not wait to know.
  /// Other optimizers: one synchronization; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params);
  /// After a step: backs off on inf/NaN, else counts a clean step and grows the scale every
  /// `growth_interval` of them (on the device). Does nothing when no step was taken since the last update.
  void update();
  /// For a trainer replaying a captured step: the replay stepped without running step() on the host.
  void note_replayed_step() { stepped_ = true; }

  /// PyTorch's `GradScaler.state_dict()`: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  c10::impl::GenericDict state_dict() const;
  /// Restores what state_dict() (or Python's GradScaler) wrote; a missing or mistyped entry is a CheckpointError.
  void load_state_dict(const c10::impl::GenericDict& state);

  /// Set by Context::wrap_scaler: the context scales losses itself.
  void mark_wrapped() { wrapped_ = true; }

 private:
  /// Moves the state to `device` (once: where the gradients are).
  void place(const torch::Device& device);

  Options options_;
  // Float32 and int32 scalars, as PyTorch's; made on the CPU and moved to the gradients' device once.
  torch::Tensor scale_;
  torch::Tensor growth_tracker_;
  torch::Tensor found_inf_;           // this step's flag, set by unscale
  torch::Tensor found_since_update_;  // the sum of every optimizer's flags since the last update (PyTorch combines them)
  torch::Tensor skipped_;             // a count
  bool unscaled_ = false;
  bool stepped_ = false;
  bool wrapped_ = false;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

namespace detail {
// LibTorch 2.4 made autocast's switches take a device type; before, CPU and CUDA had their own.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
DETTRIAL_INLINE bool autocast_enabled(torch::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
DETTRIAL_INLINE void set_autocast_enabled(torch::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
DETTRIAL_INLINE at::ScalarType autocast_dtype(torch::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
DETTRIAL_INLINE void set_autocast_dtype(torch::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
DETTRIAL_INLINE bool autocast_enabled(torch::DeviceType d) {
  return d == torch::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
DETTRIAL_INLINE void set_autocast_enabled(torch::DeviceType d, bool on) {
  if (d == torch::kCPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
DETTRIAL_INLINE at::ScalarType autocast_dtype(torch::DeviceType d) {
  return d == torch::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
DETTRIAL_INLINE void set_autocast_dtype(torch::DeviceType d, at::ScalarType t) {
  if (d == torch::kCPU) at::autocast::set_autocast_cpu_dtype(t);
  else at::autocast::set_autocast_gpu_dtype(t);
}
#endif
}  // namespace detail

DETTRIAL_INLINE AutocastGuard::AutocastGuard(torch::DeviceType device, std::optional<at::ScalarType> dtype)
    : device_(device),
      previous_enabled_(detail::autocast_enabled(device)),
      previous_dtype_(detail::autocast_dtype(device)),
      nested_(dtype.has_value()) {
  if (!dtype) {
    detail::set_autocast_enabled(device, false);
    return;
  }
  detail::set_autocast_dtype(device, *dtype);
  detail::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

DETTRIAL_INLINE AutocastGuard::~AutocastGuard() {
  // Casts cached for the outermost region are dropped when it ends (torch.autocast's __exit__).
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  detail::set_autocast_enabled(device_, previous_enabled_);
  detail::set_autocast_dtype(device_, previous_dtype_);
}

namespace detail {
// ATen's fused scaler kernels: on CUDA in every supported LibTorch, on the CPU from 2.4 (other
// devices may lack them, and take the host arithmetic).
DETTRIAL_INLINE bool amp_kernels_on(const torch::Tensor& t) { return t.is_cuda() || (DETTRIAL_FUSED_KERNELS && t.is_cpu()); }
}  // namespace detail

DETTRIAL_INLINE GradScaler::GradScaler(Options options) : options_(options) {
  if (!(options_.init_scale > 0)) throw ConfigError("GradScaler: init_scale must be positive");
  if (!(options_.growth_factor > 1)) throw ConfigError("GradScaler: growth_factor must be above 1");
  if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1)) throw ConfigError("GradScaler: backoff_factor must be in (0, 1)");
  if (options_.growth_interval < 1) throw ConfigError("GradScaler: growth_interval must be at least 1");
  const auto f = torch::TensorOptions().dtype(torch::kFloat);
  scale_ = torch::full({}, options_.init_scale, f);  // rounded to float32, as PyTorch keeps it
  growth_tracker_ = torch::zeros({}, f.dtype(torch::kInt));
  found_inf_ = torch::zeros({}, f);
  found_since_update_ = torch::zeros({}, f);
  skipped_ = torch::zeros({}, f);
}

DETTRIAL_INLINE GradScaler::GradScaler(const GradScaler& other)
    : options_(other.options_),
      scale_(other.scale_.clone()),
      growth_tracker_(other.growth_tracker_.clone()),
      found_inf_(other.found_inf_.clone()),
      found_since_update_(other.found_since_update_.clone()),
      skipped_(other.skipped_.clone()),
      unscaled_(other.unscaled_),
      stepped_(other.stepped_),
      wrapped_(other.wrapped_) {}

DETTRIAL_INLINE void GradScaler::place(const torch::Device& device) {
  if (scale_.device() == device) return;
  for (torch::Tensor* t : {&scale_, &growth_tracker_, &found_inf_, &found_since_update_, &skipped_}) *t = t->to(device);
}

DETTRIAL_INLINE torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (wrapped_)
    throw TrialError(
        "this GradScaler is wrapped with context.wrap_scaler: context.backward scales the loss itself; "
        "pass the loss unscaled");
  // In float32 (PyTorch multiplies by a float32 tensor): an fp16 loss times 65536 would overflow.
  return options_.enabled ? scaled(loss.to(torch::kFloat)) : loss;
}

DETTRIAL_INLINE torch::Tensor GradScaler::scaled(const torch::Tensor& t) {
  if (!options_.enabled) return t;
  place(t.device());
  return t * scale_;
}

DETTRIAL_INLINE void GradScaler::unscale(const std::vector<torch::Tensor>& params) {
  if (!options_.enabled || unscaled_) return;
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  unscaled_ = true;
  found_inf_.zero_();
  if (grads.empty()) return;
  place(grads.front().device());
  // The reciprocal in double, then float32, as PyTorch computes inv_scale.
  const torch::Tensor inverse = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  if (detail::amp_kernels_on(found_inf_)) {
    // The kernel takes the gradients of one device (and is fastest per dtype, as PyTorch groups them).
    std::vector<std::pair<torch::ScalarType, std::vector<torch::Tensor>>> by_dtype;
    std::vector<torch::Tensor> elsewhere;
    for (torch::Tensor& g : grads) {
      if (g.device() != found_inf_.device() || g.is_sparse()) {
        elsewhere.push_back(g);
        continue;
      }
      auto it = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const auto& b) { return b.first == g.scalar_type(); });
      if (it == by_dtype.end()) by_dtype.push_back({g.scalar_type(), {g}});
      else it->second.push_back(g);
    }
    for (auto& [dtype, same] : by_dtype) at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf_, inverse);
    grads = std::move(elsewhere);
    if (grads.empty()) return;
  }
  // Without the kernel (older LibTorch on the CPU, other devices), or gradients on another device
  // than the first: tensor operations, the flag gathered where it lives.
  const torch::Tensor inverse_here = inverse.cpu();
  const double inv = inverse_here.item<float>();
  for (torch::Tensor& g : grads) {
    found_inf_.logical_or_(torch::isfinite(g).all().logical_not().to(found_inf_.device()));
    g.mul_(inv);
  }
}

DETTRIAL_INLINE bool GradScaler::step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  unscale(params);
  unscaled_ = false;
  stepped_ = true;
  found_since_update_.add_(found_inf_);
  skipped_.add_(found_inf_);
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer); capturable && capturable->step_unless_found_inf(found_inf_))
    return true;
  if (found_inf_.item<float>() != 0) return false;
  optimizer.step();
  return true;
}

DETTRIAL_INLINE void GradScaler::update() {
  if (!options_.enabled || !stepped_) return;
  stepped_ = false;
  if (detail::amp_kernels_on(scale_)) {
    // PyTorch's update: the scale stays float32, and one that would leave its range stays as it is.
    at::_amp_update_scale_(scale_, growth_tracker_, found_since_update_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  } else {
    // The same arithmetic on the host (older LibTorch on the CPU, where reading a value costs no wait).
    double scale = scale_.item<float>();
    std::int64_t tracker = growth_tracker_.item<std::int32_t>();
    if (found_since_update_.item<float>() != 0) {
      scale = static_cast<float>(scale * options_.backoff_factor);
      tracker = 0;
    } else if (++tracker == options_.growth_interval) {
      const double grown = scale * options_.growth_factor;
      if (grown <= std::numeric_limits<float>::max()) scale = static_cast<float>(grown);
      tracker = 0;
    }
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
  }
  found_since_update_.zero_();
}

DETTRIAL_INLINE c10::impl::GenericDict GradScaler::state_dict() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled) return d;  // PyTorch's disabled scaler saves nothing
  d.insert("scale", get_scale());
  d.insert("growth_factor", options_.growth_factor);
  d.insert("backoff_factor", options_.backoff_factor);
  d.insert("growth_interval", options_.growth_interval);
  d.insert("_growth_tracker", growth_tracker());
  return d;
}

DETTRIAL_INLINE void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  if (!options_.enabled) return;
  if (state.empty()) throw CheckpointError("the checkpoint's scaler_state_dict is empty: it was saved by a disabled GradScaler");
  const auto number = [&](const char* key) {
    const auto it = state.find(key);
    if (it == state.end() || !(it->value().isDouble() || it->value().isInt()))
      throw CheckpointError(std::string("the checkpoint's scaler_state_dict lacks a number '") + key + "'");
    return it->value().isDouble() ? it->value().toDouble() : static_cast<double>(it->value().toInt());
  };
  const double scale = number("scale");
  options_.growth_factor = number("growth_factor");
  options_.backoff_factor = number("backoff_factor");
  options_.growth_interval = static_cast<std::int64_t>(number("growth_interval"));
  const double tracker = number("_growth_tracker");
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  found_since_update_.zero_();
  skipped_.zero_();
  stepped_ = unscaled_ = false;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/optim/mixed_precision.hpp

namespace dettrial {

/// Where a process sits in a data-parallel job. One process: rank 0 of 1.
struct DistributedInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  bool is_chief() const { return rank == 0; }

  // Determined's `context.distributed` getters. Nodes are numbered as launchers place ranks: a
  // node's ranks are consecutive, `local_size` of them (torchrun, srun, mpirun by slot).
  int get_rank() const { return rank; }
  int get_size() const { return size; }
  int get_local_rank() const { return local_rank; }
  int get_local_size() const { return local_size; }
  /// This process's node: `rank / local_size`.
  int get_cross_rank() const { return rank / (local_size > 0 ? local_size : 1); }
  /// The number of nodes: `size / local_size`, rounded up.
  int get_cross_size() const {
    const int per_node = local_size > 0 ? local_size : 1;
    return (size + per_node - 1) / per_node;
  }
};

/// Options that set up a Context (usually taken from the experiment config).
struct ContextOptions {
  /// The seed of every RNG; unset means: derived from `reproducibility.experiment_seed`, else from the clock.
  std::optional<std::uint64_t> trial_seed{};
  /// The device; unset means CUDA device 0 when LibTorch has CUDA and a GPU is present, else the CPU.
  std::optional<torch::Device> device{};
  /// Unset: the experiment config's (`optimizations.aggregation_frequency`), else 1.
  std::optional<std::int64_t> aggregation_frequency{};
  /// Unset: the experiment config's (`optimizations.average_aggregated_gradients`), else true.
  std::optional<bool> average_aggregated_gradients{};
  /// Unset: the experiment config's (`resources.slots_per_trial`), else 1. With a communicator, the
  /// world size (a config asking for another number of slots is an error).
  std::optional<std::int64_t> slots_per_trial{};
  /// The process group of a data-parallel job (see Communicator::create); none for one process.
  std::shared_ptr<Communicator> communicator;
  /// Deterministic algorithms (see ExperimentConfig::deterministic); unset: the config's.
  std::optional<bool> deterministic{};
  /// Results that do not depend on the rank count (see ExperimentConfig::rank_invariant); unset: the config's.
  std::optional<bool> rank_invariant{};
  /// Threads for this process's intra-op and BLAS pools (`--threads`). Unset: OMP_NUM_THREADS when
  /// set, else in a data-parallel job this rank's share of the node's cores, else the CPUs this
  /// process may run on (see dettrial::choose_threads and dettrial::apply_threads).
  std::optional<int> threads;
  /// Autocast around forward passes (and for fp16 a gradient scaler); unset: the config's
  /// `optimizations.mixed_precision`.
  std::optional<Precision> mixed_precision{};
  /// The trial's id in its experiment (Determined's `get_trial_id`). Unset: `DET_TRIAL_ID` from the
  /// environment, which dettrial's search runner sets for each trial (as Determined's agents do),
  /// else 0: a trial run on its own belongs to no experiment.
  std::optional<std::int64_t> trial_id{};
  /// The experiment's id (Determined's `get_experiment_id`). Unset: `DET_EXPERIMENT_ID`, else 0.
  std::optional<std::int64_t> experiment_id{};
};

namespace detail {
/// A non-negative integer id from environment variable `name`; 0 when unset; ConfigError when not a number.
DETTRIAL_INLINE std::int64_t id_from_environment(const char* name);

/// Where the running fit stands: set by the trainer, read through the Context's counters.
struct RunPosition {
  /// The batch index training started (or resumed) from.
  std::int64_t initial_batch = 0;
  /// The global index of the batch being trained.
  std::int64_t current_batch = 0;
  /// Batches per epoch on this rank; 0 until training starts.
  std::int64_t epoch_len = 0;
  std::filesystem::path output_dir{};
  /// NumPy's and Python's generator states from the Determined checkpoint this run continues
  /// (`np_rng_state`, `random_rng_state`), written back into its checkpoints; none otherwise.
  c10::IValue python_generators{};
};
}  // namespace detail

/**
 * @brief What a trial sees of its run (Determined's PyTorchTrialContext).
 *
 * Imperative trials take it in their constructor and wrap their models, optimizers and schedulers
 * with it; declarative trials may take it to read hyperparameters. The trainer keeps the counters.
 */
class Context {
 public:
  /// A context for the one trial an experiment config describes.
  explicit Context(const ExperimentConfig& config, ContextOptions options = {})
      : Context(config.trial_hyperparameters(), config, std::move(options)) {}

  /// A context from hyperparameters alone (an empty experiment config).
  explicit Context(Hyperparameters hparams, ContextOptions options = {})
      : Context(std::move(hparams), ExperimentConfig{}, std::move(options)) {}

  Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options);

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // ---- hyperparameters and configuration -------------------------------------------------------

  /// The hyperparameter `name` (dotted for nested values) as T; throws HyperparameterError naming it.
  template <class T>
  T get_hparam(std::string_view name) const {
    return hparams_.get<T>(name);
  }
  const Hyperparameters& get_hparams() const { return hparams_; }
  /// The experiment config's `data` section.
  const YAML::Node& get_data_config() const { return config_.data; }
  /// The running fit's output folder (metrics.jsonl, checkpoints/; in a search, the trial's own
  /// `trials/<id>/`): where a trial's or callback's own files belong. Empty until `fit` starts (the
  /// trial's constructor runs before), so read it in hooks and batches.
  const std::filesystem::path& output_dir() const { return position_.output_dir; }
  const ExperimentConfig& get_experiment_config() const { return config_; }

  /// `global_batch_size / slots_per_trial`; needs the `global_batch_size` hyperparameter.
  std::int64_t get_per_slot_batch_size() const;
  /// The effective global batch size, `per_slot * slots`.
  std::int64_t get_global_batch_size() const { return get_per_slot_batch_size() * slots_per_trial_; }
  /// True when the `global_batch_size` hyperparameter exists.
  bool has_global_batch_size() const { return hparams_.contains("global_batch_size"); }

  // ---- seed, device, distribution -------------------------------------------------------------

  /// The seed every RNG was seeded with: the same seed gives the same run.
  std::uint64_t get_trial_seed() const { return trial_seed_; }
  /// The trial's id in its experiment: 1, 2, ... in a search run by dettrial; 0 for a trial run on its
  /// own (see ContextOptions::trial_id).
  std::int64_t get_trial_id() const { return trial_id_; }
  /// The experiment's id: a search's own number, kept when it is continued; 0 for a trial run on its own.
  std::int64_t get_experiment_id() const { return experiment_id_; }
  const torch::Device& device() const { return device_; }
  const DistributedInfo& distributed() const { return distributed_; }
  /// The job's process group, or null for one process.
  Communicator* communicator() const { return communicator_.get(); }
  /// The thread count this process was given and why (see ContextOptions::threads).
  const ThreadChoice& threads() const { return threads_; }
  /// What each thread pool computes with: the intra-op pool's and the BLAS library's own.
  const ThreadPools& thread_pools() const { return thread_pools_; }
  std::int64_t aggregation_frequency() const { return aggregation_frequency_; }

  /// Moves a nested batch to this context's device (see dettrial::to_device).
  template <class B>
  std::remove_cvref_t<B> to_device(B&& batch) const {
    return dettrial::to_device(std::forward<B>(batch), device_, device_.is_cuda());
  }

  // ---- counters -------------------------------------------------------------------------------

  /// The batch index training started (or resumed) from.
  std::int64_t get_initial_batch() const { return position_.initial_batch; }
  /// The global index of the batch being trained.
  std::int64_t current_train_batch() const { return position_.current_batch; }
  /// The epoch of the batch being trained.
  std::int64_t current_train_epoch() const { return position_.current_batch / require_epoch_len(); }
  bool is_epoch_start() const { return position_.current_batch % require_epoch_len() == 0; }
  bool is_epoch_end() const { return position_.current_batch % require_epoch_len() == require_epoch_len() - 1; }
  /// True on batches that step the optimizers (every `aggregation_frequency`-th batch).
  bool is_update_batch() const { return (position_.current_batch + 1) % aggregation_frequency_ == 0; }

  /// Ask the trainer to checkpoint and stop at the next boundary.
  void set_stop_requested(bool stop) { stop_requested_ = stop; }
  bool get_stop_requested() const { return stop_requested_; }

  // ---- TensorBoard ----------------------------------------------------------------------------

  /// The run's TensorBoard writer, for a trial's own scalars and histograms next to the trainer's
  /// metrics (`add_scalar(tag, value, context.current_train_batch())`). It writes from the start of
  /// `fit` on the chief; before that, and on the other ranks, it writes nothing.
  TensorBoardWriter& get_tensorboard_writer() { return tensorboard_; }
  /// `<output_dir>/tensorboard`, where the run's event files go (empty until `fit` starts).
  std::filesystem::path get_tensorboard_path() const {
    return position_.output_dir.empty() ? std::filesystem::path() : RunFolder{position_.output_dir}.tensorboard();
  }
  /// Whether the trainer writes its metrics, learning rates and timings to TensorBoard (default on).
  /// Off, the writer still takes the trial's own scalars.
  void set_enable_tensorboard_logging(bool on) { tensorboard_logging_ = on; }

  /**
   * @brief Profiles training with LibTorch's profiler on a schedule (Determined's `set_profiler`,
   * with `torch.profiler.profile`'s arguments), from the trial's constructor. The trainer steps it
   * after every training batch and writes each cycle's trace to the run's TensorBoard folder, where
   * TensorBoard's profile plugin reads it. It takes the place of the config's `profiling` section.
   * A schedule `torch.profiler.schedule` would refuse is a ConfigError.
   *
   * @code
   * context.set_profiler({.activities = {dettrial::ProfilerActivity::cpu, dettrial::ProfilerActivity::cuda},
   *                       .schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 2}});
   * @endcode
   */
  void set_profiler(ProfilerOptions options) {
    detail::check_profiler_options(options);
    profiler_ = std::move(options);
  }
  /// What set_profiler was given, if it was called.
  const std::optional<ProfilerOptions>& profiler_options() const { return profiler_; }
  bool get_enable_tensorboard_logging() const { return tensorboard_logging_; }

  // ---- wrapping -------------------------------------------------------------------------------

  /// Moves the model to the device and registers it (train/eval mode, checkpoints). Returns it.
  template <class M>
  M wrap_model(M model) {
    static_assert(ModelHandle<M>,
                  "dettrial::Context::wrap_model<M>: M must be a LibTorch module holder (torch::nn::Linear, "
                  "torch::nn::Sequential, ...) or a std::shared_ptr to a torch::nn::Module");
    if constexpr (ModelHandle<M>) {  // only the sentence above when it is not
      auto module = module_of(model);
      module->to(device_);
      models_.push_back(std::move(module));
    }
    return model;
  }

  /**
   * @brief Registers an optimizer so `step_optimizer` can aggregate, clip and step it. The optimizer
   * must outlive the trainer (a member of the trial). `average_aggregated_gradients` defaults to
   * the experiment config's.
   */
  template <class O>
  O& wrap_optimizer(O& optimizer, std::optional<bool> average_aggregated_gradients = std::nullopt) {
    static_assert(TorchOptimizer<O>, "dettrial::Context::wrap_optimizer<O>: O must derive from torch::optim::Optimizer");
    if constexpr (TorchOptimizer<O>) {  // only the sentence above when it is not
      for (const auto& w : optimizers_)
        if (w.optimizer == &optimizer) throw TrialError("this optimizer was already wrapped with wrap_optimizer");
      WrappedOptimizer w{&optimizer, {}, average_aggregated_gradients.value_or(average_aggregated_gradients_), nullptr};
      refresh_params(w);
      optimizers_.push_back(std::move(w));
    }
    return optimizer;
  }

  /**
   * @brief Registers an LR scheduler to be stepped by dettrial in `Mode` (see dettrial::lr_step),
   * every `frequency` units. The scheduler must outlive the trainer. Returns it.
   */
  template <class S, class Mode = lr_step::every_batch>
  S& wrap_lr_scheduler(S& scheduler, Mode mode = {}, std::int64_t frequency = 1) {
    constexpr bool by_metric = std::same_as<Mode, lr_step::on_validation>;
    constexpr bool steppable = by_metric ? MetricLRSchedulerLike<S> : LRSchedulerLike<S>;
    static_assert(by_metric || LRSchedulerLike<S>,
                  "dettrial::Context::wrap_lr_scheduler<S>: S must have step() (a torch::optim scheduler)");
    static_assert(!by_metric || MetricLRSchedulerLike<S>,
                  "dettrial::Context::wrap_lr_scheduler<S>: lr_step::on_validation steps S with the validation metric, so S "
                  "must have step(double) (like dettrial::optim::ReduceLROnPlateau)");
    static_assert(LRStepMode<Mode>,
                  "dettrial::Context::wrap_lr_scheduler: the mode must be a dettrial::lr_step policy (every_batch, "
                  "every_epoch, every_optimizer_step, manual, on_validation) or a type with name and steps_after(...)");
    static_assert(!steppable || CheckpointableLRScheduler<S>,  // one sentence at a time
                  "dettrial::Context::wrap_lr_scheduler<S>: checkpoints must restore S, so S must derive from "
                  "torch::optim::LRScheduler or have save(torch::serialize::OutputArchive&) const and "
                  "load(torch::serialize::InputArchive&)");
    if (frequency < 1) throw ConfigError("an LR scheduler's step frequency must be at least 1");
    if constexpr (steppable && LRStepMode<Mode> && CheckpointableLRScheduler<S>) {  // else only the sentences above
      detail::WrappedScheduler w{&scheduler,
                                 nullptr,
                                 &Mode::steps_after,
                                 frequency,
                                 &detail::save_lr_scheduler<S>,
                                 &detail::load_lr_scheduler<S>,
                                 &detail::lr_scheduler_steps<S>,
                                 detail::python_state_writer<S>(),
                                 detail::python_state_reader<S>()};
      w.type = c10::demangle(typeid(S).name());
      if constexpr (by_metric) {
        if (mode.metric.empty())
          throw ConfigError(
              "lr_step::on_validation needs the validation metric to step with, e.g. lr_step::on_validation{\"validation_loss\"}");
        w.step_with_metric = [](void* s, double metric) { static_cast<S*>(s)->step(metric); };
        w.metric = mode.metric;
      } else {
        w.step = [](void* s) { static_cast<S*>(s)->step(); };
      }
      schedulers_.push_back(std::move(w));
    }
    return scheduler;
  }

  /// Steps the lr_step::on_validation schedulers with this validation's metrics (the trainer calls it).
  void step_lr_schedulers_on_validation(const MetricValues& metrics);

  /**
   * @brief Registers a user reducer (Determined's `wrap_reducer`): reset before each training workload
   * and validation, reduced at its end, and reported under `name` (or, for MetricValues, their own
   * names). `reducer` is one of:
   * - a CrossSlotReducer (`per_slot_reduce()` on every rank, `cross_slot_reduce(parts)` over all
   *   ranks' parts): owned by the caller, returned as given;
   * - a function of `const std::vector<T>&` (T = double unless given): dettrial keeps a
   *   FunctionReducer<T> and returns it; the trial calls its `update(value)`, and the function gets
   *   every rank's values in batch order;
   * - a LocalReducer (`reduce()` only): one process only, since it cannot see the other ranks' data.
   */
  template <class T = double, class R>
  decltype(auto) wrap_reducer(R&& reducer, std::string name = {}, bool for_training = true, bool for_validation = true) {
    using Plain = std::remove_cvref_t<R>;
    if constexpr (MetricReducer<Plain>) {
      static_assert(std::is_lvalue_reference_v<R>,
                    "dettrial::Context::wrap_reducer: a reducer object must outlive the trainer, so pass a member of the trial "
                    "(an lvalue), not a temporary");
      Plain& r = reducer;
      for (const auto& w : reducers_)
        if (w.object == &r) throw TrialError("this reducer was already wrapped with wrap_reducer");
      if constexpr (!CrossSlotReducer<Plain>)
        if (communicator_)
          throw TrialError("wrap_reducer" + (name.empty() ? std::string() : " '" + name + "'") +
                           ": this reducer has only reduce(), which sees one rank's data; in a data-parallel job give it "
                           "per_slot_reduce() and cross_slot_reduce(parts) (see dettrial::CrossSlotReducer), or wrap a "
                           "function with wrap_reducer(fn, name)");
      check_reducer_name<reduced_metrics_t<Plain>>(name);
      reducers_.push_back(detail::WrappedReducer::wrap(r, std::move(name), for_training, for_validation));
      return static_cast<Plain&>(r);
    } else {
      constexpr bool is_function = std::invocable<Plain&, const std::vector<T>&>;
      static_assert(is_function && SlotValue<std::vector<T>>,
                    "dettrial::Context::wrap_reducer: the reducer must have reset() and either reduce() returning a number or "
                    "dettrial::MetricValues, or per_slot_reduce() returning a number, tensor, string or std::vector/std::tuple of "
                    "them and cross_slot_reduce(parts) returning a number or dettrial::MetricValues (see dettrial::MetricReducer), "
                    "or be a function of const std::vector<T>& (T a number or tensor) returning one");
      if constexpr (is_function) {
        using Result = std::invoke_result_t<Plain&, const std::vector<T>&>;
        static_assert(ReducedMetrics<Result>,
                      "dettrial::Context::wrap_reducer(fn, name): fn must return a number or dettrial::MetricValues");
        if constexpr (ReducedMetrics<Result>) {
          using Function = FunctionReducer<T, std::decay_t<R>>;  // a function reference becomes a pointer
          check_reducer_name<Result>(name);
          auto owned = std::make_shared<Function>(std::forward<R>(reducer));
          Function& r = *owned;
          owned_reducers_.push_back(std::move(owned));
          reducers_.push_back(detail::WrappedReducer::wrap(r, std::move(name), for_training, for_validation));
          return r;
        }
      }
    }
  }

  // ---- the training step ----------------------------------------------------------------------

  /// Back-propagates `loss` (Determined's `context.backward`): outside autocast, and multiplied by the
  /// gradient scaler's scale when one is in use.
  void backward(const torch::Tensor& loss, bool retain_graph = false, bool create_graph = false);
  /// Back-propagates a non-scalar `output` with `gradient` (PyTorch's `backward(gradient)`).
  void backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph = false, bool create_graph = false);

  // ---- mixed precision ------------------------------------------------------------------------

  /**
   * @brief Registers a gradient scaler (Determined's `wrap_scaler`): from then on `backward` scales
   * the loss, `step_optimizer` unscales the gradients before clipping and skips a step with an inf
   * or NaN gradient, and the trainer updates the scale after each update batch; checkpoints keep its
   * state. At most one; with `mixed_precision: fp16` the context has one of its own unless a trial wraps one.
   */
  GradScaler& wrap_scaler(GradScaler& scaler);
  /// The scaler in use, or nullptr.
  GradScaler* scaler() const { return scaler_; }
  /// The precision forward passes run in (the trainer enters autocast around the trial's hooks).
  Precision precision() const { return precision_; }
  /// Autocast's dtype for this precision on this context's device; none for fp32.
  std::optional<at::ScalarType> autocast_dtype() const;

  /**
   * @brief Steps a wrapped optimizer with Determined's semantics: on batches that are not update
   * batches it returns (gradients accumulate); on update batches it divides the gradients by the
   * aggregation frequency (if averaging), clips them, steps, and zeroes them.
   */
  template <class Clip = clip::none>
  void step_optimizer(torch::optim::Optimizer& optimizer, Clip clip_gradients = {}, bool auto_zero_grads = true) {
    static_assert(GradientClipper<Clip>,
                  "dettrial::Context::step_optimizer: the clip argument must be callable with std::vector<torch::Tensor>& "
                  "(dettrial::clip::by_norm{...}, clip::by_value{...})");
    if (aggregation_frequency_ > 1 && !auto_zero_grads)
      throw TrialError("step_optimizer(auto_zero_grads=false) cannot be used with aggregation_frequency > 1");
    if (!is_update_batch()) return;
    WrappedOptimizer& w = find_optimizer(optimizer);
    refresh_params(w);  // param groups may have grown since wrapping (unfrozen layers)
    if (ordered_) {
      combine_ordered_gradients();  // weighted by records: already an average
    } else if (communicator_) {
      if (!w.buckets) w.buckets = std::make_unique<detail::GradientBuckets>(*communicator_, w.params);
      w.buckets->all_reduce();
    }
    if (w.average && aggregation_frequency_ > 1 && !ordered_) {
      const double scale = 1.0 / static_cast<double>(aggregation_frequency_);
      for (auto& p : w.params)
        if (p.grad().defined()) p.grad().mul_(scale);
    }
    if (scaler_) scaler_->unscale(w.params);                        // clipping sees the true gradients
    if constexpr (GradientClipper<Clip>) clip_gradients(w.params);  // else only the sentence above
    if (scaler_) scaler_->step(optimizer, w.params);                // skipped when a gradient is inf or NaN
    else optimizer.step();
    // Autocast caches low-precision copies of the weights until its region ends; a forward pass
    // later in the same train_batch must see the stepped weights.
    if (precision_ != Precision::fp32) at::autocast::clear_cache();
    if (auto_zero_grads) optimizer.zero_grad();
  }

  /// True while a trainer's trial is registered here.
  bool has_registrations() const { return !models_.empty() || !optimizers_.empty() || !schedulers_.empty() || !reducers_.empty(); }
  /// Forgets every wrapped object (called when their trainer goes away).
  void release_registrations();

  /// Every wrapped model, in wrap order.
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return models_; }
  std::size_t num_optimizers() const { return optimizers_.size(); }
  /// Wrapped optimizer `i`, in wrap order.
  torch::optim::Optimizer& optimizer(std::size_t i) const { return *optimizers_.at(i).optimizer; }
  std::size_t num_lr_schedulers() const { return schedulers_.size(); }
  /// Wrapped LR scheduler `i` (type-erased: how to step, save and restore it), in wrap order.
  const detail::WrappedScheduler& lr_scheduler(std::size_t i) const { return schedulers_.at(i); }

  // ---- driven by the trainer (trials read the counters and metrics above) ---------------------

  /// Where the running fit stands; the trainer moves it, the counters above read it.
  detail::RunPosition& position() { return position_; }
  /// The wrapped reducers, reset and reduced by the trainer at each workload.
  std::span<detail::WrappedReducer> reducers() { return reducers_; }

  /// Ends training batch `batch_idx` (the trainer calls it after train_batch): on an update batch
  /// (every `aggregation_frequency`-th, the one that stepped the optimizers) the gradient scaler's
  /// scale is updated, once however many optimizers stepped, and the schedulers step per their mode.
  /// The one place that decides what an update batch finishes.
  void finish_batch(std::int64_t batch_idx) {
    if (!is_update_batch()) {  // inline: most batches end here
      if (ordered_) stash_ordered_gradients();
      return;
    }
    if (scaler_) scaler_->update();
    step_lr_schedulers(batch_idx);
  }

  /// Begins training batch `position().current_batch` of `records` records. With rank_invariant,
  /// seeds the random draws of this micro-batch from its place in the data stream (the same
  /// records get the same dropout masks whatever the rank count); otherwise nothing.
  void begin_training_batch(std::int64_t records) {
    if (ordered_) seed_micro_batch(records);
  }
  /// Whether gradients are summed in the data stream's order (reproducibility.rank_invariant).
  bool rank_invariant() const { return ordered_ != nullptr; }

  /// In a job, after the trial and its data loaders were built from the same seed on every rank:
  /// ranks other than the chief continue on a stream of their own, derived from the trial seed and
  /// the rank, so that their dropout masks and other draws differ.
  void seed_rank_stream() const;

 private:
  /// Steps the schedulers per their mode after update batch `batch_idx`.
  void step_lr_schedulers(std::int64_t batch_idx);
  struct WrappedOptimizer {
    torch::optim::Optimizer* optimizer;
    std::vector<torch::Tensor> params;
    bool average;
    /// Data parallel only: made on the first step, dropped when the parameters change.
    std::unique_ptr<detail::GradientBuckets> buckets;
  };

  template <class Result>
  static void check_reducer_name(const std::string& name) {
    constexpr bool returns_many = std::same_as<std::remove_cvref_t<Result>, MetricValues>;
    if (returns_many && !name.empty())
      throw TrialError("wrap_reducer: reducer '" + name + "' returns MetricValues (merged by their own names), so wrap it without a name");
    if (!returns_many && name.empty()) throw TrialError("wrap_reducer: a reducer that returns a number needs a name to report it under");
  }

  static std::uint64_t derive_trial_seed(std::optional<std::uint64_t> experiment_seed);

  /// LibTorch's switches for bit-identical runs (process-wide): deterministic algorithms (an op
  /// without a deterministic implementation throws, naming itself), cuDNN's deterministic kernels and
  /// no autotuning, and cuBLAS's fixed workspace, which it needs before its first use.
  static void set_deterministic(bool on);

  void seed_everything() const {
    torch::manual_seed(trial_seed_);  // CPU and, when present, every CUDA device
  }

  std::int64_t global_batch_size_hparam() const;

  std::int64_t require_epoch_len() const;

  /// Rebuilds the cached parameter list when the optimizer's groups changed size (no allocation otherwise).
  void refresh_params(WrappedOptimizer& w);

  // rank_invariant: see detail::OrderedGradients.
  void seed_micro_batch(std::int64_t records);
  /// Every wrapped optimizer's parameters, each once, in wrap order.
  const std::vector<torch::Tensor>& ordered_params();
  void stash_ordered_gradients();
  /// Once per update batch, however many optimizers step: this batch's gradients stashed, and
  /// every optimizer's gradients replaced by the ordered sum of the update's micro-batches.
  void combine_ordered_gradients();

  WrappedOptimizer& find_optimizer(const torch::optim::Optimizer& optimizer);

  Hyperparameters hparams_;
  ExperimentConfig config_;
  std::int64_t aggregation_frequency_ = 1;
  bool average_aggregated_gradients_ = true;
  std::int64_t slots_per_trial_ = 1;
  std::uint64_t trial_seed_ = 0;
  std::int64_t trial_id_ = 0;
  std::int64_t experiment_id_ = 0;
  torch::Device device_{torch::kCPU};
  DistributedInfo distributed_;
  std::shared_ptr<Communicator> communicator_;
  ThreadChoice threads_;
  ThreadPools thread_pools_;

  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<WrappedOptimizer> optimizers_;
  std::vector<detail::WrappedScheduler> schedulers_;
  std::vector<detail::WrappedReducer> reducers_;
  std::vector<std::shared_ptr<void>> owned_reducers_;  // the FunctionReducers wrap_reducer(fn) made

  detail::RunPosition position_{};
  TensorBoardWriter tensorboard_{};
  bool tensorboard_logging_ = true;
  std::optional<ProfilerOptions> profiler_;
  bool stop_requested_ = false;
  Precision precision_ = Precision::fp32;
  std::unique_ptr<GradScaler> own_scaler_;             // fp16 without a scaler of the trial's
  std::unique_ptr<detail::OrderedGradients> ordered_;  // reproducibility.rank_invariant
  std::vector<torch::Tensor> ordered_params_;
  std::size_t ordered_params_counted_ = 0;  // the optimizers' parameters ordered_params_ was built from
  std::int64_t ordered_records_ = 0;
  std::int64_t ordered_combined_at_ = -1;  // the update batch whose gradients were combined
  GradScaler* scaler_ = nullptr;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cerrno>
#include <cstdlib>

namespace dettrial {

namespace detail {
DETTRIAL_INLINE std::int64_t id_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  char* end = nullptr;
  errno = 0;
  const long long id = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || id < 0)
    throw ConfigError(std::string(name) + " is '" + text + "'; it must be a trial or experiment id (a non-negative integer)");
  return id;
}
}  // namespace detail

DETTRIAL_INLINE Context::Context(Hyperparameters hparams, ExperimentConfig config, ContextOptions options)
    : hparams_(std::move(hparams)),
      config_(std::move(config)),
      aggregation_frequency_(options.aggregation_frequency.value_or(config_.aggregation_frequency)),
      average_aggregated_gradients_(options.average_aggregated_gradients.value_or(config_.average_aggregated_gradients)),
      slots_per_trial_(options.slots_per_trial.value_or(config_.slots_per_trial)) {
  if (aggregation_frequency_ < 1) throw ConfigError("aggregation_frequency must be at least 1");
  if (slots_per_trial_ < 1) throw ConfigError("slots_per_trial must be at least 1");
  if (options.communicator && options.communicator->size() > 1) {
    communicator_ = std::move(options.communicator);
    const LaunchEnvironment& env = communicator_->environment();
    if (slots_per_trial_ > 1 && slots_per_trial_ != env.size)
      throw ConfigError("resources.slots_per_trial is " + std::to_string(slots_per_trial_) + ", but " + launcher_name(env.launcher) +
                        " started " + std::to_string(env.size) + " processes");
    slots_per_trial_ = env.size;
    distributed_ = DistributedInfo{.rank = env.rank, .size = env.size, .local_rank = env.local_rank, .local_size = env.local_size};
  }
  // One GPU per process: the local rank picks it.
  device_ = options.device
                ? *options.device
                : (torch::cuda::is_available()
                       ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                         distributed_.local_rank %
                                                         std::max<std::int64_t>(static_cast<std::int64_t>(torch::cuda::device_count()), 1)))
                       : torch::Device(torch::kCPU));
  // NCCL takes tensors on one GPU only: models, gradients and every collective must be there. (Gloo
  // takes CPU tensors, and CUDA ones too.)
  if (communicator_ && !communicator_->device().is_cpu() && communicator_->device() != device_)
    throw ConfigError(std::string("the ") + communicator_->backend_name() + " backend of rank " + std::to_string(distributed_.rank) +
                      " takes tensors on " + communicator_->device().str() + ", but this process's device is " + device_.str() +
                      "; give every rank the device its local rank picks (or leave ContextOptions::device unset)");
  trial_seed_ = options.trial_seed ? *options.trial_seed : derive_trial_seed(config_.experiment_seed);
  trial_id_ = options.trial_id ? *options.trial_id : detail::id_from_environment("DET_TRIAL_ID");
  experiment_id_ = options.experiment_id ? *options.experiment_id : detail::id_from_environment("DET_EXPERIMENT_ID");
  // One trial seed for the job: the chief's (without an experiment seed each rank's clock differs,
  // and the ranks would shard different permutations of the data).
  if (communicator_) trial_seed_ = static_cast<std::uint64_t>(communicator_->broadcast_values({static_cast<std::int64_t>(trial_seed_)})[0]);
  const bool rank_invariant = options.rank_invariant.value_or(config_.rank_invariant);
  threads_ = choose_threads(communicator_ ? communicator_->environment() : LaunchEnvironment{}, options.threads, CoreCount::of_this_process(),
                            [](const char* name) { return std::getenv(name); },
                            rank_invariant ? ThreadDefault::one_per_rank : ThreadDefault::share_of_cores);
  thread_pools_ = apply_threads(threads_);
  if (const auto on = options.deterministic ? options.deterministic : config_.deterministic) set_deterministic(*on);
  if (rank_invariant) {
    if (!average_aggregated_gradients_)
      throw ConfigError(
          "reproducibility.rank_invariant needs optimizations.average_aggregated_gradients: a sum over the aggregated batches "
          "grows with the aggregation frequency, so it would differ between rank counts");
    ordered_ = std::make_unique<detail::OrderedGradients>(communicator_.get(), aggregation_frequency_);
  }
  precision_ = options.mixed_precision.value_or(config_.mixed_precision);
#if TORCH_VERSION_MAJOR < 2
  if (precision_ == Precision::fp16 && device_.is_cpu())
    throw ConfigError("mixed_precision fp16 autocasts on the CPU from LibTorch 2 on; this LibTorch " TORCH_VERSION
                      " autocasts the CPU to bf16 only (use bf16)");
#endif
  if (precision_ == Precision::fp16) {  // fp16's narrow range needs loss scaling; bf16's does not
    own_scaler_ = std::make_unique<GradScaler>();
    own_scaler_->mark_wrapped();
    scaler_ = own_scaler_.get();
  }
  detail::keep_freed_memory();
  seed_everything();
}

DETTRIAL_INLINE std::int64_t Context::get_per_slot_batch_size() const {
  const std::int64_t global = global_batch_size_hparam();
  return global / slots_per_trial_;
}

DETTRIAL_INLINE void Context::backward(const torch::Tensor& loss, bool retain_graph, bool create_graph) {
  backward(loss, torch::Tensor(), retain_graph, create_graph);
}

DETTRIAL_INLINE void Context::backward(const torch::Tensor& output, const torch::Tensor& gradient, bool retain_graph, bool create_graph) {
  if (gradient.defined() && gradient.sizes() != output.sizes())
    throw TrialError("context.backward: the gradient's shape " + c10::str(gradient.sizes()) + " differs from the output's " +
                     c10::str(output.sizes()));
  // In a job, an update batch's backward pass starts each gradient bucket's all-reduce as soon as
  // the bucket's gradients are ready (see all_reduce_gradients).
  for (auto& w : optimizers_)
    if (w.buckets) w.buckets->arm(is_update_batch());
  // Outside autocast (PyTorch's advice: backward ops run in the dtypes forward chose).
  std::optional<AutocastGuard> autocast_off;
  if (precision_ != Precision::fp32) autocast_off.emplace(device_.type(), std::nullopt);
  const bool scaled = scaler_ && scaler_->enabled();
  if (!gradient.defined())  // a loss: scaled in float32, as PyTorch's GradScaler does (fp16 times 65536 overflows)
    (scaled ? scaler_->scaled(output.to(torch::kFloat)) : output).backward({}, retain_graph, create_graph);
  else output.backward(scaled ? scaler_->scaled(gradient) : gradient, retain_graph, create_graph);
}

DETTRIAL_INLINE GradScaler& Context::wrap_scaler(GradScaler& scaler) {
  if (scaler_ && scaler_ != own_scaler_.get()) throw TrialError("wrap_scaler was called twice: a context takes one GradScaler");
  scaler.mark_wrapped();
  scaler_ = &scaler;
  return scaler;
}

DETTRIAL_INLINE std::optional<at::ScalarType> Context::autocast_dtype() const {
  switch (precision_) {
    case Precision::fp32: return std::nullopt;
    case Precision::bf16: return at::kBFloat16;
    case Precision::fp16: return at::kHalf;
  }
  return std::nullopt;
}

DETTRIAL_INLINE void Context::release_registrations() {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  reducers_.clear();
  owned_reducers_.clear();
  ordered_params_.clear();
  ordered_params_counted_ = 0;
  ordered_combined_at_ = -1;
  stop_requested_ = false;
  position_ = {};
  scaler_ = own_scaler_.get();
}

DETTRIAL_INLINE void Context::step_lr_schedulers_on_validation(const MetricValues& metrics) {
  for (auto& s : schedulers_) {
    if (!s.step_with_metric) continue;
    const std::optional<double> value = metrics.get(s.metric);
    if (!value) {
      std::string names;
      for (const auto& [name, v] : metrics) names += (names.empty() ? "" : ", ") + name;
      throw ConfigError("the LR scheduler stepped on validation needs the validation metric '" + s.metric +
                        "', which the validation did not report (it reported: " + names + ")");
    }
    s.step_with_metric(s.scheduler, *value);
  }
}

DETTRIAL_INLINE void Context::step_lr_schedulers(std::int64_t batch_idx) {
  for (auto& s : schedulers_) {
    const std::int64_t n = s.steps_after(batch_idx, aggregation_frequency_, position_.epoch_len, s.frequency);
    for (std::int64_t i = 0; i < n; ++i) s.step(s.scheduler);
  }
}

DETTRIAL_INLINE void Context::seed_micro_batch(std::int64_t records) {
  // Micro-batch k of rank r is the stream's batch k * ranks + r: the same records in any layout.
  const auto stream_batch = static_cast<std::uint64_t>(position_.current_batch * distributed_.size + distributed_.rank);
  torch::manual_seed(detail::mix64(trial_seed_ ^ detail::mix64(stream_batch + detail::golden_gamma)) >> 1);
  ordered_records_ = records;
}

DETTRIAL_INLINE const std::vector<torch::Tensor>& Context::ordered_params() {
  std::size_t count = 0;
  for (auto& w : optimizers_) {
    refresh_params(w);
    count += w.params.size();
  }
  if (count != ordered_params_counted_) {  // built once (again when groups grow)
    ordered_params_counted_ = count;
    ordered_params_.clear();
    for (const auto& w : optimizers_)
      for (const auto& p : w.params)
        if (std::none_of(ordered_params_.begin(), ordered_params_.end(), [&](const torch::Tensor& q) { return q.is_same(p); }))
          ordered_params_.push_back(p);
  }
  return ordered_params_;
}

DETTRIAL_INLINE void Context::stash_ordered_gradients() { ordered_->stash(ordered_params(), ordered_records_); }

DETTRIAL_INLINE void Context::combine_ordered_gradients() {
  if (ordered_combined_at_ == position_.current_batch) return;
  ordered_combined_at_ = position_.current_batch;
  const std::vector<torch::Tensor>& params = ordered_params();
  ordered_->stash(params, ordered_records_);
  ordered_->combine(params);
}

DETTRIAL_INLINE void Context::seed_rank_stream() const {
  if (distributed_.rank > 0)
    torch::manual_seed(detail::mix64(trial_seed_ ^ (static_cast<std::uint64_t>(distributed_.rank) * detail::golden_gamma)) >> 1);
}

DETTRIAL_INLINE std::uint64_t Context::derive_trial_seed(std::optional<std::uint64_t> experiment_seed) {
  // One trial of an experiment: a value in [0, 2^31) drawn from the experiment seed, as Determined's
  // master draws trial seeds; without an experiment seed, the clock (Determined's default).
  std::uint64_t x =
      experiment_seed ? *experiment_seed : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return detail::mix64(x + detail::golden_gamma) % (1ULL << 31);
}

DETTRIAL_INLINE void Context::set_deterministic(bool on) {
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(on);
  at::globalContext().setBenchmarkCuDNN(!on && at::globalContext().benchmarkCuDNN());
  if (on) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

DETTRIAL_INLINE std::int64_t Context::global_batch_size_hparam() const {
  if (!hparams_.contains("global_batch_size"))
    throw HyperparameterError("the batch size getters need the hyperparameter 'global_batch_size', which " + hparams_.source() +
                              " does not define");
  const auto global = hparams_.get<std::int64_t>("global_batch_size");
  if (global < slots_per_trial_)
    throw HyperparameterError("global_batch_size (" + std::to_string(global) + ") is smaller than slots_per_trial (" +
                              std::to_string(slots_per_trial_) + ")");
  return global;
}

DETTRIAL_INLINE std::int64_t Context::require_epoch_len() const {
  if (position_.epoch_len <= 0) throw TrialError("epoch counters are only known once training has started");
  return position_.epoch_len;
}

DETTRIAL_INLINE void Context::refresh_params(WrappedOptimizer& w) {
  std::size_t count = 0;
  for (const auto& group : w.optimizer->param_groups()) count += group.params().size();
  if (count == w.params.size()) return;
  w.buckets.reset();
  w.params.clear();
  for (auto& group : w.optimizer->param_groups())
    for (auto& p : group.params()) w.params.push_back(p);
}

DETTRIAL_INLINE Context::WrappedOptimizer& Context::find_optimizer(const torch::optim::Optimizer& optimizer) {
  for (auto& w : optimizers_)
    if (w.optimizer == &optimizer) return w;
  throw TrialError("step_optimizer was given an optimizer that was not wrapped with context.wrap_optimizer");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/context/context.hpp
// ---- begin dettrial/vocabulary/trial.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a trial is: the hooks of both styles (declarative and imperative) as concepts, and the
/// one-sentence diagnostics dettrial::Trainer gives when a hook is missing or mistyped.
///
/// dettrial::Trial is the conjunction of five named pieces, each a concept a user can check on its
/// own (a failed `template <dettrial::Trial T>` names the piece that does not hold):
/// TrainingDataLoaderHook, ValidationDataLoaderHook, ModelHooks, TrainBatchHook and EvaluationHook.
/// The `Declares...` concepts only ask whether a hook is there; the `...Hook` concepts ask whether it
/// is there and right. All of them are false, never a hard error, for a broken trial.

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <torch/torch.h>


namespace dettrial {
namespace detail {

template <class R>
struct is_scheduled_lr : std::false_type {};
template <class S, class M>
struct is_scheduled_lr<ScheduledLR<S, M>> : std::true_type {};

/// Stands in for a type a broken trial does not provide, so declarations stay well-formed while the
/// one diagnostic that matters is printed.
struct missing {};

}  // namespace detail

// ---- the data loaders ----------------------------------------------------------------------------

/// T has a `build_training_data_loader()` hook (whatever it returns).
template <class T>
concept DeclaresTrainingDataLoader = requires(T& t) { t.build_training_data_loader(); };
/// T has a `build_validation_data_loader()` hook (whatever it returns).
template <class T>
concept DeclaresValidationDataLoader = requires(T& t) { t.build_validation_data_loader(); };

namespace detail {

template <class T>
using training_loader_result = decltype(std::declval<T&>().build_training_data_loader());
template <class T>
using validation_loader_result = decltype(std::declval<T&>().build_validation_data_loader());

template <class T>
consteval auto training_loader_type() {
  if constexpr (DeclaresTrainingDataLoader<T>) return std::type_identity<std::remove_cvref_t<training_loader_result<T>>>{};
  else return std::type_identity<missing>{};
}
template <class T>
consteval auto validation_loader_type() {
  if constexpr (DeclaresValidationDataLoader<T>) return std::type_identity<std::remove_cvref_t<validation_loader_result<T>>>{};
  else return std::type_identity<missing>{};
}
template <class L>
consteval auto batch_type_of() {
  if constexpr (BatchLoader<L>) return std::type_identity<batch_of<L>>{};
  else return std::type_identity<missing>{};
}

}  // namespace detail

/// The training loader type of trial T (`detail::missing` when it has none).
template <class T>
using training_loader_t = typename decltype(detail::training_loader_type<T>())::type;
/// The validation loader type of trial T.
template <class T>
using validation_loader_t = typename decltype(detail::validation_loader_type<T>())::type;
/// The batch type `train_batch` receives.
template <class T>
using training_batch_t = typename decltype(detail::batch_type_of<training_loader_t<T>>())::type;
/// The batch type `evaluate_batch` receives.
template <class T>
using validation_batch_t = typename decltype(detail::batch_type_of<validation_loader_t<T>>())::type;

/// Piece 1 of dettrial::Trial: `build_training_data_loader()` returns a dettrial::BatchLoader (such
/// as dettrial::DataLoader).
template <class T>
concept TrainingDataLoaderHook = DeclaresTrainingDataLoader<T> && BatchLoader<training_loader_t<T>>;
/// Piece 2 of dettrial::Trial: `build_validation_data_loader()` returns a dettrial::BatchLoader.
template <class T>
concept ValidationDataLoaderHook = DeclaresValidationDataLoader<T> && BatchLoader<validation_loader_t<T>>;

// ---- the model, optimizer and scheduler of a declarative trial ----------------------------------

/// A declarative trial builds its model with `build_model()` (the seed's MNIST tutorial style).
template <class T>
concept DeclaresModel = requires(T& t) { t.build_model(); };

namespace detail {
template <class T>
consteval auto model_type() {
  if constexpr (DeclaresModel<T>) return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().build_model())>>{};
  else return std::type_identity<missing>{};
}
}  // namespace detail

/// The model type of a declarative trial.
template <class T>
using model_t = typename decltype(detail::model_type<T>())::type;

/// A declarative trial with an `optimizer(model)` hook taking what `build_model()` returns (whatever
/// the hook returns).
template <class T>
concept DeclaresOptimizer = DeclaresModel<T> && requires(T& t, model_t<T>& m) { t.optimizer(m); };

namespace detail {
template <class T>
consteval auto optimizer_type() {
  if constexpr (DeclaresOptimizer<T>)
    return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().optimizer(std::declval<model_t<T>&>()))>>{};
  else return std::type_identity<missing>{};
}
/// What `optimizer(model)` may return: an optimizer by value or a smart pointer to one.
template <class O>
consteval auto optimizer_object_type() {
  if constexpr (TorchOptimizer<O>) return std::type_identity<O>{};
  else if constexpr (requires(O& o) { *o; }) {
    if constexpr (TorchOptimizer<std::remove_cvref_t<decltype(*std::declval<O&>())>>)
      return std::type_identity<std::remove_cvref_t<decltype(*std::declval<O&>())>>{};
    else return std::type_identity<missing>{};
  } else return std::type_identity<missing>{};
}
}  // namespace detail

/// What a declarative trial's `optimizer(model)` returns.
template <class T>
using optimizer_result_t = typename decltype(detail::optimizer_type<T>())::type;
/// The optimizer class behind it.
template <class T>
using optimizer_t = typename decltype(detail::optimizer_object_type<optimizer_result_t<T>>())::type;

/// A declarative trial with an `lr_scheduler(optimizer)` hook taking the optimizer class behind what
/// `optimizer(model)` returns (whatever the hook returns).
template <class T>
concept DeclaresLRScheduler = DeclaresModel<T> && requires(T& t, optimizer_t<T>& o) { t.lr_scheduler(o); };

namespace detail {
template <class T>
consteval auto scheduler_type() {
  if constexpr (DeclaresLRScheduler<T>)
    return std::type_identity<std::remove_cvref_t<decltype(std::declval<T&>().lr_scheduler(std::declval<optimizer_t<T>&>()))>>{};
  else return std::type_identity<missing>{};
}
}  // namespace detail

/// What a declarative trial's optional `lr_scheduler(optimizer)` returns.
template <class T>
using scheduler_result_t = typename decltype(detail::scheduler_type<T>())::type;

/// `build_model()` returns a LibTorch module (a dettrial::ModelHandle).
template <class T>
concept BuildModelHook = DeclaresModel<T> && ModelHandle<model_t<T>>;
/// `optimizer(model)` returns a torch::optim optimizer, by value or by smart pointer.
template <class T>
concept OptimizerHook = DeclaresOptimizer<T> && TorchOptimizer<optimizer_t<T>>;
/// `lr_scheduler(optimizer)` returns a scheduler with `step()` or a dettrial::scheduled(...) one.
template <class T>
concept LRSchedulerHook =
    DeclaresLRScheduler<T> && (LRSchedulerLike<scheduler_result_t<T>> || detail::is_scheduled_lr<scheduler_result_t<T>>::value);

/// Piece 3 of dettrial::Trial: a declarative trial (one with `build_model()`) has a BuildModelHook,
/// an OptimizerHook and, if it declares one, an LRSchedulerHook. True for an imperative trial, which
/// wraps its model and optimizer in its constructor.
template <class T>
concept ModelHooks = !DeclaresModel<T> || (BuildModelHook<T> && OptimizerHook<T> && (!DeclaresLRScheduler<T> || LRSchedulerHook<T>));

// ---- train_batch and the evaluation hook ---------------------------------------------------------

template <class T>
concept DeclaresTrainBatch = requires { &T::train_batch; } || requires(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t i) {
  t.train_batch(b, m, i, i);
} || requires(T& t, training_batch_t<T>& b, std::int64_t i) { t.train_batch(b, i, i); };
template <class T>
concept DeclaresEvaluateBatch = requires { &T::evaluate_batch; } || requires(T& t, validation_batch_t<T>& b, model_t<T>& m) {
  t.evaluate_batch(b, m);
} || requires(T& t, validation_batch_t<T>& b) { t.evaluate_batch(b); };
template <class T>
concept DeclaresEvaluateFullDataset = requires { &T::evaluate_full_dataset; } || requires(T& t, validation_loader_t<T>& l, model_t<T>& m) {
  t.evaluate_full_dataset(l, m);
} || requires(T& t, validation_loader_t<T>& l) { t.evaluate_full_dataset(l); };

namespace detail {
/// Calls train_batch in the trial's style; only used in unevaluated contexts and by the trainer.
template <class T>
decltype(auto) call_train_batch(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t epoch_idx, std::int64_t batch_idx) {
  if constexpr (DeclaresModel<T>) return t.train_batch(b, m, epoch_idx, batch_idx);
  else return t.train_batch(b, epoch_idx, batch_idx);
}
template <class T>
decltype(auto) call_evaluate_batch(T& t, validation_batch_t<T>& b, model_t<T>& m, std::int64_t batch_idx) {
  if constexpr (DeclaresModel<T>) {
    if constexpr (requires { t.evaluate_batch(b, m, batch_idx); }) return t.evaluate_batch(b, m, batch_idx);
    else return t.evaluate_batch(b, m);
  } else {
    if constexpr (requires { t.evaluate_batch(b, batch_idx); }) return t.evaluate_batch(b, batch_idx);
    else return t.evaluate_batch(b);
  }
}
template <class T>
decltype(auto) call_evaluate_full_dataset(T& t, validation_loader_t<T>& l, model_t<T>& m) {
  if constexpr (DeclaresModel<T>) return t.evaluate_full_dataset(l, m);
  else return t.evaluate_full_dataset(l);
}
}  // namespace detail

template <class T>
concept CallableTrainBatch =
    (DeclaresModel<T> && requires(T& t, training_batch_t<T>& b, model_t<T>& m, std::int64_t i) { t.train_batch(b, m, i, i); }) ||
    (!DeclaresModel<T> && requires(T& t, training_batch_t<T>& b, std::int64_t i) { t.train_batch(b, i, i); });
template <class T>
concept CallableEvaluateBatch =
    (DeclaresModel<T> && (requires(T& t, validation_batch_t<T>& b, model_t<T>& m, std::int64_t i) { t.evaluate_batch(b, m, i); } ||
                          requires(T& t, validation_batch_t<T>& b, model_t<T>& m) { t.evaluate_batch(b, m); })) ||
    (!DeclaresModel<T> && (requires(T& t, validation_batch_t<T>& b, std::int64_t i) { t.evaluate_batch(b, i); } ||
                           requires(T& t, validation_batch_t<T>& b) { t.evaluate_batch(b); }));
template <class T>
concept CallableEvaluateFullDataset =
    (DeclaresModel<T> && requires(T& t, validation_loader_t<T>& l, model_t<T>& m) { t.evaluate_full_dataset(l, m); }) ||
    (!DeclaresModel<T> && requires(T& t, validation_loader_t<T>& l) { t.evaluate_full_dataset(l); });

namespace detail {
// What a hook returns. Only named once the hook is known to be callable: the concepts below put these
// after the Callable... check in a conjunction, which substitutes its right side only when its left
// side holds (naming one of these for a hook that cannot be called would be a hard error).
template <class T>
using train_batch_result_t =
    decltype(call_train_batch(std::declval<T&>(), std::declval<training_batch_t<T>&>(), std::declval<model_t<T>&>(), 0, 0));
template <class T>
using evaluate_batch_result_t =
    decltype(call_evaluate_batch(std::declval<T&>(), std::declval<validation_batch_t<T>&>(), std::declval<model_t<T>&>(), 0));
template <class T>
using evaluate_full_dataset_result_t =
    decltype(call_evaluate_full_dataset(std::declval<T&>(), std::declval<validation_loader_t<T>&>(), std::declval<model_t<T>&>()));
}  // namespace detail

/// Piece 4 of dettrial::Trial: `train_batch` can be called with the training loader's batch type, as
/// `train_batch(batch, model, epoch_idx, batch_idx)` in a declarative trial or
/// `train_batch(batch, epoch_idx, batch_idx)` in an imperative one, and returns dettrial::Metrics (with
/// a "loss" entry) or the loss as a torch::Tensor.
template <class T>
concept TrainBatchHook = DeclaresTrainBatch<T> && CallableTrainBatch<T> && MetricsResult<detail::train_batch_result_t<T>>;

/// `evaluate_batch` can be called with the validation loader's batch type, as
/// `evaluate_batch(batch, model[, batch_idx])` (declarative) or `evaluate_batch(batch[, batch_idx])`
/// (imperative), and returns dettrial::Metrics.
template <class T>
concept EvaluateBatchHook =
    DeclaresEvaluateBatch<T> && CallableEvaluateBatch<T> && std::same_as<std::remove_cvref_t<detail::evaluate_batch_result_t<T>>, Metrics>;
/// `evaluate_full_dataset` can be called with the validation loader, as
/// `evaluate_full_dataset(loader, model)` (declarative) or `evaluate_full_dataset(loader)`
/// (imperative), and returns dettrial::Metrics.
template <class T>
concept EvaluateFullDatasetHook = DeclaresEvaluateFullDataset<T> && CallableEvaluateFullDataset<T> &&
                                  std::same_as<std::remove_cvref_t<detail::evaluate_full_dataset_result_t<T>>, Metrics>;

/// Piece 5 of dettrial::Trial: exactly one of `evaluate_batch` (an EvaluateBatchHook) and
/// `evaluate_full_dataset` (an EvaluateFullDatasetHook).
template <class T>
concept EvaluationHook =
    (EvaluateBatchHook<T> && !DeclaresEvaluateFullDataset<T>) || (EvaluateFullDatasetHook<T> && !DeclaresEvaluateBatch<T>);

namespace detail {

/// The first thing wrong with a trial type, in the order a user would fix them.
enum class TrialProblem {
  none,
  no_training_loader,
  training_loader_not_a_loader,
  no_validation_loader,
  validation_loader_not_a_loader,
  model_not_a_module,
  no_optimizer,
  optimizer_not_an_optimizer,
  scheduler_not_a_scheduler,
  no_train_batch,
  train_batch_not_callable,
  train_batch_not_metrics,
  no_evaluate_hook,
  both_evaluate_hooks,
  evaluate_batch_not_callable,
  evaluate_batch_not_metrics,
  evaluate_full_dataset_not_callable,
  evaluate_full_dataset_not_metrics,
};

/// The first thing wrong with a trial, from the same concepts dettrial::Trial is made of (each rule
/// is stated once, in its concept).
template <class T>
consteval TrialProblem first_trial_problem() {
  using P = TrialProblem;
  if constexpr (!DeclaresTrainingDataLoader<T>) return P::no_training_loader;
  else if constexpr (!TrainingDataLoaderHook<T>) return P::training_loader_not_a_loader;
  else if constexpr (!DeclaresValidationDataLoader<T>) return P::no_validation_loader;
  else if constexpr (!ValidationDataLoaderHook<T>) return P::validation_loader_not_a_loader;
  else if constexpr (DeclaresModel<T> && !BuildModelHook<T>) return P::model_not_a_module;
  else if constexpr (DeclaresModel<T> && !DeclaresOptimizer<T>) return P::no_optimizer;
  else if constexpr (DeclaresModel<T> && !OptimizerHook<T>) return P::optimizer_not_an_optimizer;
  else if constexpr (DeclaresLRScheduler<T> && !LRSchedulerHook<T>) return P::scheduler_not_a_scheduler;
  else if constexpr (!DeclaresTrainBatch<T>) return P::no_train_batch;
  else if constexpr (!CallableTrainBatch<T>) return P::train_batch_not_callable;
  else if constexpr (!TrainBatchHook<T>) return P::train_batch_not_metrics;
  else if constexpr (!DeclaresEvaluateBatch<T> && !DeclaresEvaluateFullDataset<T>) return P::no_evaluate_hook;
  else if constexpr (DeclaresEvaluateBatch<T> && DeclaresEvaluateFullDataset<T>) return P::both_evaluate_hooks;
  else if constexpr (DeclaresEvaluateBatch<T> && !CallableEvaluateBatch<T>) return P::evaluate_batch_not_callable;
  else if constexpr (DeclaresEvaluateBatch<T> && !EvaluateBatchHook<T>) return P::evaluate_batch_not_metrics;
  else if constexpr (DeclaresEvaluateFullDataset<T> && !CallableEvaluateFullDataset<T>) return P::evaluate_full_dataset_not_callable;
  else if constexpr (DeclaresEvaluateFullDataset<T> && !EvaluateFullDatasetHook<T>) return P::evaluate_full_dataset_not_metrics;
  else return P::none;
}

/// Instantiated by dettrial::Trainer<T>: exactly one of these assertions fails for a broken trial,
/// and its message is the one sentence that names the hook at fault.
template <class T>
struct TrialDiagnostics {
  static constexpr TrialProblem problem = first_trial_problem<T>();
  using P = TrialProblem;
  static_assert(problem != P::no_training_loader,
                "dettrial::Trainer<T>: T has no build_training_data_loader() hook; add one that returns a dettrial::DataLoader");
  static_assert(problem != P::training_loader_not_a_loader,
                "dettrial::Trainer<T>: T::build_training_data_loader() must return a dettrial::BatchLoader such as dettrial::DataLoader "
                "(size() batches per epoch and batches(chain), the batches one rank reads)");
  static_assert(problem != P::no_validation_loader,
                "dettrial::Trainer<T>: T has no build_validation_data_loader() hook; add one that returns a dettrial::DataLoader");
  static_assert(problem != P::validation_loader_not_a_loader,
                "dettrial::Trainer<T>: T::build_validation_data_loader() must return a dettrial::BatchLoader such as dettrial::DataLoader "
                "(size() batches per epoch and batches(chain), the batches one rank reads)");
  static_assert(problem != P::model_not_a_module,
                "dettrial::Trainer<T>: T::build_model() must return a LibTorch module (a torch::nn::ModuleHolder such as "
                "torch::nn::Sequential, or a std::shared_ptr to a torch::nn::Module)");
  static_assert(problem != P::no_optimizer,
                "dettrial::Trainer<T>: T has build_model() but no optimizer(model) hook; add one that returns a torch::optim optimizer");
  static_assert(problem != P::optimizer_not_an_optimizer,
                "dettrial::Trainer<T>: T::optimizer(model) must return a torch::optim::Optimizer (by value or by smart pointer)");
  static_assert(problem != P::scheduler_not_a_scheduler,
                "dettrial::Trainer<T>: T::lr_scheduler(optimizer) must return a scheduler with step() or dettrial::scheduled(...)");
  static_assert(problem != P::no_train_batch,
                "dettrial::Trainer<T>: T has no train_batch hook; declare train_batch(batch, model, epoch_idx, batch_idx) in a "
                "trial with build_model(), or train_batch(batch, epoch_idx, batch_idx) in one that wraps its model in its constructor");
  static_assert(problem != P::train_batch_not_callable,
                "dettrial::Trainer<T>: T::train_batch cannot be called with the training loader's batch type as "
                "train_batch(batch, model, epoch_idx, batch_idx) (with build_model) or train_batch(batch, epoch_idx, batch_idx) (without)");
  static_assert(
      problem != P::train_batch_not_metrics,
      "dettrial::Trainer<T>: T::train_batch must return dettrial::Metrics (with a \"loss\" entry) or the loss as a torch::Tensor");
  static_assert(problem != P::no_evaluate_hook,
                "dettrial::Trainer<T>: T has neither evaluate_batch nor evaluate_full_dataset; define exactly one of them");
  static_assert(problem != P::both_evaluate_hooks,
                "dettrial::Trainer<T>: T defines both evaluate_batch and evaluate_full_dataset; define exactly one of them");
  static_assert(problem != P::evaluate_batch_not_callable,
                "dettrial::Trainer<T>: T::evaluate_batch cannot be called with the validation loader's batch type as "
                "evaluate_batch(batch, model[, batch_idx]) (with build_model) or evaluate_batch(batch[, batch_idx]) (without)");
  static_assert(problem != P::evaluate_batch_not_metrics, "dettrial::Trainer<T>: T::evaluate_batch must return dettrial::Metrics");
  static_assert(problem != P::evaluate_full_dataset_not_callable,
                "dettrial::Trainer<T>: T::evaluate_full_dataset cannot be called as evaluate_full_dataset(loader, model) (with "
                "build_model) or evaluate_full_dataset(loader) (without)");
  static_assert(problem != P::evaluate_full_dataset_not_metrics,
                "dettrial::Trainer<T>: T::evaluate_full_dataset must return dettrial::Metrics");
  static constexpr bool ok = problem == P::none;
};

}  // namespace detail

/**
 * @brief A trial: a plain type with Determined's hooks, in either style.
 *
 * - Declarative: `build_model()`, `optimizer(model)`, optional `lr_scheduler(optimizer)`,
 *   `train_batch(batch, model, epoch_idx, batch_idx)` returning metrics with `loss`; the trainer does
 *   backward, step and zero_grad.
 * - Imperative: the constructor takes the Context and wraps models, optimizers and schedulers;
 *   `train_batch(batch, epoch_idx, batch_idx)` calls `context.backward(loss)` and
 *   `context.step_optimizer(opt)` itself.
 *
 * Both need `build_training_data_loader()`, `build_validation_data_loader()` and exactly one of
 * `evaluate_batch` / `evaluate_full_dataset`. Each of these is a concept of its own, so a compiler's
 * "constraints not satisfied" note names the piece that does not hold; dettrial::Trainer<T> says the
 * same in one sentence.
 */
template <class T>
concept Trial = TrainingDataLoaderHook<T> && ValidationDataLoaderHook<T> && ModelHooks<T> && TrainBatchHook<T> && EvaluationHook<T>;

/// A trial in the declarative style.
template <class T>
concept DeclarativeTrial = Trial<T> && DeclaresModel<T>;
/// A trial in the imperative style.
template <class T>
concept ImperativeTrial = Trial<T> && !DeclaresModel<T>;

}  // namespace dettrial
// ---- end dettrial/vocabulary/trial.hpp
// ---- begin dettrial/checkpoint/checkpoint.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a checkpoint holds and how a Context's models, optimizers, schedulers, gradients and
/// RNGs go in and out of it; loading a checkpoint's models for evaluation or inference.
///
/// A checkpoint directory (Determined's layout):
/// - `state_dict.pth`: `torch.load`-able dict with `models_state_dict`, `optimizers_state_dict` (Python
///   layout), `lr_schedulers_state_dict`, `callbacks`, `rng_state`;
/// - `dettrial_state.pt`, only when needed: LibTorch's archive of what Python's layout cannot express
///   (an optimizer of a type it does not hold, a scheduler without a Python-state reader) and, mid
///   gradient aggregation, the pending gradients. Each tensor is stored once (format 2); a format-1
///   checkpoint holds every optimizer and scheduler here again, and still loads;
/// - `trial_state.json`: where the trial stands (batches, epochs, last validation and checkpoint);
/// - `load_data.json`: the experiment config and hyperparameters;
/// - `metadata.json`, written last: steps completed, framework, format, each file's size and CRC-32.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>
#include <utility>

#include <torch/torch.h>

// ---- begin dettrial/detail/json_fwd.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::detail::Json declared, without nlohmann/json's 25,000 lines: what a header needs
/// for declarations that take or return JSON. The definitions (and header-only mode) include
/// json.hpp, so a trial's translation unit in separate-compilation mode does not parse the library.

#include <nlohmann/json_fwd.hpp>

namespace dettrial::detail {

/// A JSON value whose objects keep their keys in insertion order (the order dettrial writes them).
using Json = nlohmann::ordered_json;

}  // namespace dettrial::detail
// ---- end dettrial/detail/json_fwd.hpp
// ---- begin dettrial/checkpoint/python_optimizer.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An optimizer's state from Python's layout (`optimizer.state_dict()`, as Determined's and
/// dettrial's `state_dict.pth` hold it) into LibTorch's optimizers and dettrial's fused ones: the
/// groups' options and every parameter's state, checked before anything is changed.

#include <string>

#include <torch/torch.h>

// ---- begin dettrial/vocabulary/checkpoint.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The checkpoint vocabulary: StateDict (the `state_dict.pth` a checkpoint holds, as LibTorch
/// reads it) and what a checkpoint policy is.

#include <concepts>
#include <string_view>

#include <torch/torch.h>

namespace dettrial {

/// A `torch.save`d state dict as LibTorch holds it: string keys to tensors, numbers, lists and dicts.
using StateDict = c10::impl::GenericDict;

/// A checkpoint policy: a name and whether to checkpoint after a validation, given whether it
/// improved on the best searcher metric so far.
template <class P>
concept CheckpointPolicyType = requires(bool improved) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::after_validation(improved) } -> std::same_as<bool>;
};

}  // namespace dettrial
// ---- end dettrial/vocabulary/checkpoint.hpp

namespace dettrial {

/**
 * @brief Loads Python's `optimizer.state_dict()` into `optimizer`, as Python's `load_state_dict`
 * does: the groups' options (learning rate, momentum, betas, ...) are the file's, and each
 * parameter's state (SGD's momentum buffer; Adam's and AdamW's `step`, `exp_avg`, `exp_avg_sq` and,
 * with amsgrad, `max_exp_avg_sq`; RMSprop's, Adagrad's and Adadelta's) is set from it.
 *
 * Checked first, nothing changed on a mismatch: the number of groups and of parameters in each,
 * every state tensor's shape against its parameter's, that each group's options are the optimizer's
 * own (an Adam state dict does not load into SGD: the error names the group and the option), and
 * that the file asks for nothing LibTorch's optimizers lack (`maximize: True`). CheckpointError
 * names `what` (the file and optimizer).
 */
DETTRIAL_INLINE void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state, const std::string& what);

/// Whether Python's layout (optimizer_state_dict) holds all of `optimizer`'s state, so that
/// load_optimizer_state_dict restores it exactly: every group's options and every parameter's state
/// of a type it reads (SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, and the fused ones).
DETTRIAL_INLINE bool python_layout_holds(torch::optim::Optimizer& optimizer);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

// ---- begin dettrial/checkpoint/state_dict.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief State dicts Python can load: models as name-to-tensor maps with Python's names, optimizers
/// in Python's layout, written as a `torch.save` zip archive; and loading a model's state dict back
/// with every name and shape checked before anything is copied.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/checkpoint/python_pickle.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Reading what Python pickled: `torch.save` archives and plain pickles (Determined's
/// `trial_state.pkl`), into LibTorch values, without Python.
///
/// Why not LibTorch's own unpickler: it reads what TorchScript writes, and Python's checkpoints hold
/// more. Determined's `state_dict.pth` keeps NumPy's generator state (an ndarray, pickled through
/// `numpy._core.multiarray._reconstruct`, its bytes through `_codecs.encode` at protocol 2), and
/// state dicts are `OrderedDict`s with a `_metadata` attribute. This reader runs the pickle machine
/// itself over the globals such files use, and refuses any other global by name: nothing is
/// executed, as Python's weights-only loader does not execute.
///
/// What becomes what: dicts (and OrderedDicts) become dicts with keys of any type, lists and sets
/// lists, tuples tuples, `bytes` strings, tensors tensors (on the CPU, sharing storage as saved),
/// NumPy arrays tensors (unsigned integers widened to int64), NumPy scalars numbers.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <torch/torch.h>


namespace dettrial::detail {

/// The storage record `data/<key>` of a torch.save archive, as a 1-D tensor of `numel` elements of `dtype`.
using PickleStorageLoader = std::function<torch::Tensor(const std::string& key, c10::ScalarType dtype, std::int64_t numel)>;

/// What the reader does with an object of a type it does not read (a global other than the ones
/// state dicts use): it never constructs one, and never runs anything.
enum class UnreadObjects {
  /// The whole read fails, naming the type.
  refuse,
  /// The object is kept as an opaque marker (python_object_type names it), so that a caller reading
  /// a checkpoint can refuse only the part that holds it, naming that part, or start it fresh.
  mark,
};

/// Runs a pickle (protocols 0 to 5, the opcodes Python's pickler writes) and returns its value;
/// `storages` resolves a torch.save archive's tensor storages (none for a plain pickle). Throws
/// std::runtime_error naming the opcode or global it cannot read.
DETTRIAL_INLINE c10::IValue unpickle(std::string_view pickle, const PickleStorageLoader& storages = {},
                                     UnreadObjects unread = UnreadObjects::refuse);

/// The Python type ("module.name") of the first object `value` holds that unpickle(..., mark) kept
/// unread, searching dicts, lists and tuples; nullopt when it holds none.
DETTRIAL_INLINE std::optional<std::string> python_object_type(const c10::IValue& value);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstring>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dettrial::detail {
namespace pickle_detail {

/// Objects the machine builds that are not values of their own (a global, a NumPy dtype, an array
/// before its BUILD) are dicts tagged with this key, so that tuples and lists can hold them.
inline constexpr const char* object_tag = "__dettrial_pickle_object__";

inline c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

inline c10::IValue object(const std::string& kind, std::initializer_list<std::pair<const char*, c10::IValue>> fields = {}) {
  auto d = new_dict();
  d.insert(object_tag, kind);
  for (const auto& [k, v] : fields) d.insert(k, v);
  return d;
}

/// The kind of an object built by object(), or "" for an ordinary value.
inline std::string kind_of(const c10::IValue& v) {
  if (!v.isGenericDict()) return "";
  const auto d = v.toGenericDict();
  const auto it = d.find(object_tag);
  return it == d.end() ? "" : it->value().toStringRef();
}

inline c10::IValue field(const c10::IValue& object, const char* key) { return object.toGenericDict().at(key); }

/// The kind of the marker that unpickle(..., UnreadObjects::mark) keeps for an object it does not read.
inline constexpr const char* unread_kind = "unread Python object";

inline std::string unread_message(const std::string& type) {
  return "the pickle holds a Python object of type '" + type +
         "', which dettrial does not read (it reads state dicts: tensors, numbers, strings, lists, tuples, dicts, NumPy arrays)";
}

inline std::vector<c10::IValue> elements(const c10::IValue& v, const char* what) {
  if (v.isTuple()) return v.toTupleRef().elements().vec();
  if (v.isList()) return v.toList().vec();
  throw std::runtime_error(std::string(what) + " is not a tuple");
}

inline std::vector<std::int64_t> int_elements(const c10::IValue& v, const char* what) {
  std::vector<std::int64_t> out;
  for (const auto& e : elements(v, what)) {
    if (!e.isInt()) throw std::runtime_error(std::string(what) + " holds a non-integer");
    out.push_back(e.toInt());
  }
  return out;
}

DETTRIAL_INLINE c10::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> types = {{"torch.FloatStorage", c10::kFloat},
                                                               {"torch.DoubleStorage", c10::kDouble},
                                                               {"torch.HalfStorage", c10::kHalf},
                                                               {"torch.BFloat16Storage", c10::kBFloat16},
                                                               {"torch.LongStorage", c10::kLong},
                                                               {"torch.IntStorage", c10::kInt},
                                                               {"torch.ShortStorage", c10::kShort},
                                                               {"torch.CharStorage", c10::kChar},
                                                               {"torch.ByteStorage", c10::kByte},
                                                               {"torch.BoolStorage", c10::kBool},
                                                               {"torch.ComplexFloatStorage", c10::kComplexFloat},
                                                               {"torch.ComplexDoubleStorage", c10::kComplexDouble},
                                                               {"torch.UntypedStorage", c10::kByte}};
  const auto it = types.find(name);
  if (it == types.end()) throw std::runtime_error("tensor storage type '" + name + "' is not one dettrial reads");
  return it->second;
}

/// A NumPy dtype string ("u4", "<f8", "|b1") as a tensor type and item size; unsigned types wider
/// than a byte are read into int64.
DETTRIAL_INLINE std::pair<c10::ScalarType, std::size_t> numpy_dtype(const c10::IValue& dtype) {
  if (kind_of(dtype) != "numpy.dtype") throw std::runtime_error("a NumPy array's dtype is not a dtype");
  const std::string descr = field(dtype, "descr").toStringRef();
  const std::string order = field(dtype, "order").toStringRef();
  if (order == ">") throw std::runtime_error("a big-endian NumPy array ('" + descr + "') is not one dettrial reads");
  static const std::map<std::string, std::pair<c10::ScalarType, std::size_t>> types = {
      {"b1", {c10::kBool, 1}}, {"u1", {c10::kByte, 1}}, {"i1", {c10::kChar, 1}},  {"i2", {c10::kShort, 2}},
      {"u2", {c10::kLong, 2}}, {"i4", {c10::kInt, 4}},  {"u4", {c10::kLong, 4}},  {"i8", {c10::kLong, 8}},
      {"u8", {c10::kLong, 8}}, {"f2", {c10::kHalf, 2}}, {"f4", {c10::kFloat, 4}}, {"f8", {c10::kDouble, 8}}};
  const auto it = types.find(descr);
  if (it == types.end()) throw std::runtime_error("NumPy dtype '" + descr + "' is not one dettrial reads");
  return it->second;
}

/// NumPy's array state `(version, shape, dtype, is_fortran, raw bytes)` as a tensor.
DETTRIAL_INLINE torch::Tensor numpy_array(const c10::IValue& state) {
  const auto s = elements(state, "a NumPy array's state");
  if (s.size() != 5) throw std::runtime_error("a NumPy array's state has " + std::to_string(s.size()) + " entries, not 5");
  const std::vector<std::int64_t> shape = int_elements(s[1], "a NumPy array's shape");
  const auto [dtype, item] = numpy_dtype(s[2]);
  if (!s[4].isString()) throw std::runtime_error("a NumPy array of Python objects is not one dettrial reads");
  const std::string& raw = s[4].toStringRef();
  std::int64_t count = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || (d > 0 && count > static_cast<std::int64_t>(raw.size()) / d))
      throw std::runtime_error("a NumPy array's shape does not fit its " + std::to_string(raw.size()) + " bytes");
    count *= d;
  }
  if (raw.size() != static_cast<std::size_t>(count) * item)
    throw std::runtime_error("a NumPy array holds " + std::to_string(raw.size()) + " bytes for " + std::to_string(count) + " items");
  const std::string descr = field(s[2], "descr").toStringRef();
  torch::Tensor out = torch::empty({count}, dtype);
  if (descr == "u2" || descr == "u4") {  // widened: no unsigned tensor types in every LibTorch
    auto* to = out.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < count; ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, raw.data() + i * item, item);
      to[i] = static_cast<std::int64_t>(v);
    }
  } else {
    std::memcpy(out.data_ptr(), raw.data(), raw.size());
  }
  return s[3].toBool() ? out.reshape(std::vector<std::int64_t>(shape.rbegin(), shape.rend())).t().contiguous() : out.reshape(shape);
}

/// `numpy.core.multiarray.scalar(dtype, bytes)`: a NumPy number as a Python one.
DETTRIAL_INLINE c10::IValue numpy_scalar(const std::vector<c10::IValue>& args) {
  if (args.size() != 2 || !args[1].isString()) throw std::runtime_error("a NumPy scalar is not (dtype, bytes)");
  const auto [dtype, item] = numpy_dtype(args[0]);
  if (args[1].toStringRef().size() != item) throw std::runtime_error("a NumPy scalar's bytes do not fit its dtype");
  const std::string descr = field(args[0], "descr").toStringRef();
  if (descr == "u2" || descr == "u4") {
    std::uint32_t v = 0;
    std::memcpy(&v, args[1].toStringRef().data(), item);
    return static_cast<std::int64_t>(v);
  }
  torch::Tensor t = torch::empty({1}, dtype);
  std::memcpy(t.data_ptr(), args[1].toStringRef().data(), item);
  if (t.is_floating_point()) return t.item<double>();
  if (dtype == c10::kBool) return t.item<bool>();
  return t.item<std::int64_t>();
}

/// `_codecs.encode(text, encoding)`, how protocol 2 pickles `bytes`: the text's code points are the bytes.
DETTRIAL_INLINE std::string encode_bytes(const std::string& utf8, const std::string& encoding) {
  if (encoding != "latin1" && encoding != "latin-1") return utf8;
  std::string out;
  for (std::size_t i = 0; i < utf8.size(); ++i) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xe0) == 0xc0 && i + 1 < utf8.size()) {
      out.push_back(static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3f)));
    } else {
      throw std::runtime_error("_codecs.encode: a code point above 255 in latin1 text");
    }
  }
  return out;
}

/// The pickle machine: its stack, marks and memo, and the opcodes' effects.
class Machine {
 public:
  Machine(std::string_view pickle, const PickleStorageLoader& storages, UnreadObjects unread)
      : in_(pickle), storages_(storages), unread_(unread) {}

  c10::IValue run();

 private:
  [[noreturn]] void fail(const std::string& why) const { throw std::runtime_error("pickle offset " + std::to_string(at_) + ": " + why); }
  std::string_view take(std::uint64_t n) {
    if (n > in_.size() - at_) fail("the pickle ends inside an opcode");  // (at_ + n could wrap)
    const std::string_view out = in_.substr(at_, n);
    at_ += n;
    return out;
  }
  std::uint64_t little(std::size_t n) {
    const std::string_view b = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    return v;
  }
  std::string line() {
    const std::size_t nl = in_.find('\n', at_);
    if (nl == std::string_view::npos) fail("the pickle ends inside a text argument");
    std::string out(in_.substr(at_, nl - at_));
    at_ = nl + 1;
    return out;
  }
  c10::IValue pop() {
    if (stack_.size() <= floor()) fail("the stack is empty");
    c10::IValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<c10::IValue> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    std::vector<c10::IValue> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back())),
                                   std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  c10::IValue& top() {
    if (stack_.size() <= floor()) fail("the stack is empty");
    return stack_.back();
  }
  static c10::IValue tuple(std::vector<c10::IValue> items) { return c10::ivalue::Tuple::create(std::move(items)); }
  static c10::IValue list(std::vector<c10::IValue> items) {
    c10::impl::GenericList l(c10::AnyType::get());
    for (auto& i : items) l.push_back(std::move(i));
    return l;
  }
  void put(std::uint64_t slot) { memo_[slot] = top(); }
  void get(std::uint64_t slot) {
    const auto it = memo_.find(slot);
    if (it == memo_.end()) fail("memo slot " + std::to_string(slot) + " is empty");
    stack_.push_back(it->second);
  }
  void set_items(std::vector<c10::IValue> items) {
    c10::IValue& target = top();
    if (kind_of(target) == unread_kind)
      fail("the pickle sets items on a Python object of type '" + field(target, "name").toStringRef() + "', which dettrial does not read");
    if (!target.isGenericDict() || !kind_of(target).empty()) fail("SETITEMS on something that is not a dict");
    auto d = target.toGenericDict();
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) d.insert_or_assign(std::move(items[i]), std::move(items[i + 1]));
  }
  void append_items(std::vector<c10::IValue> items) {
    c10::IValue& target = top();
    if (!target.isList()) fail("APPENDS on something that is not a list");
    auto l = target.toList();
    for (auto& i : items) l.push_back(std::move(i));
  }
  c10::IValue long_value(std::string_view bytes) {
    if (bytes.empty()) return std::int64_t{0};
    if (bytes.size() > 8) fail("an integer wider than 64 bits");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    if (bytes.size() < 8 && (static_cast<unsigned char>(bytes.back()) & 0x80)) v |= ~std::uint64_t{0} << (8 * bytes.size());
    return static_cast<std::int64_t>(v);
  }
  c10::IValue global(const std::string& module, const std::string& name);
  c10::IValue call(const c10::IValue& callable, std::vector<c10::IValue> args);
  c10::IValue build(c10::IValue object, c10::IValue state);
  c10::IValue persistent_load(const c10::IValue& id);
  bool step(unsigned char op);

  std::string_view in_;
  std::size_t at_ = 0;
  const PickleStorageLoader& storages_;
  UnreadObjects unread_;
  std::vector<c10::IValue> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, c10::IValue> memo_;
  std::map<std::string, torch::Tensor> storage_cache_;
  std::optional<c10::IValue> result_;
};

DETTRIAL_INLINE c10::IValue Machine::global(const std::string& module, const std::string& name) {
  std::string full = module + "." + name;
  // NumPy moved its internals from numpy.core to numpy._core in 2.0; pickles name either.
  if (full.rfind("numpy.core.", 0) == 0) full = "numpy._core." + full.substr(std::strlen("numpy.core."));
  if (full == "__builtin__.set" || full == "__builtin__.frozenset") full = "builtins." + name;
  return object("global", {{"name", full}});
}

DETTRIAL_INLINE c10::IValue Machine::call(const c10::IValue& callable, std::vector<c10::IValue> args) {
  if (kind_of(callable) != "global") fail("REDUCE of something that is not a global");
  const std::string name = field(callable, "name").toStringRef();
  const auto arg = [&](std::size_t i) -> const c10::IValue& {
    if (i >= args.size()) fail(name + " has too few arguments");
    return args[i];
  };
  if (name == "collections.OrderedDict") {
    c10::IValue d = new_dict();
    if (!args.empty()) {
      std::vector<c10::IValue> items;
      for (const auto& pair : elements(arg(0), "OrderedDict's items"))
        for (auto& e : elements(pair, "an OrderedDict item")) items.push_back(std::move(e));
      stack_.push_back(d);
      set_items(std::move(items));
      stack_.pop_back();
    }
    return d;
  }
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    const torch::Tensor& storage = arg(0).toTensor();
    const std::vector<std::int64_t> size = int_elements(arg(2), "a tensor's size"), stride = int_elements(arg(3), "a tensor's stride");
    return storage.as_strided(size, stride, arg(1).toInt());
  }
  if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") return arg(0);
  if (name == "_codecs.encode") return encode_bytes(arg(0).toStringRef(), args.size() > 1 ? arg(1).toStringRef() : "utf-8");
  if (name == "numpy._core.multiarray._reconstruct") return object("numpy.ndarray");
  if (name == "numpy.dtype") return object("numpy.dtype", {{"descr", arg(0).toStringRef()}, {"order", std::string("=")}});
  if (name == "numpy._core.multiarray.scalar") return numpy_scalar(args);
  if (name == "builtins.set" || name == "builtins.frozenset") return args.empty() ? list({}) : list(elements(arg(0), "a set's items"));
  if (name == "torch.device") return arg(0);
  if (name == "torch.Size") return tuple(elements(arg(0), "a torch.Size"));
  if (name.rfind("torch.jit._pickle.build_", 0) == 0 || name == "torch.jit._pickle.restore_type_tag") return arg(0);
  // Dict subclasses that state dicts hold, as their items: MultiStepLR's milestones are a Counter
  // (pickled as Counter(dict)); a defaultdict pickles its factory, then its items (SETITEMS).
  if (name == "collections.Counter") return args.empty() ? new_dict() : c10::IValue(arg(0));
  if (name == "collections.defaultdict") return new_dict();
  if (unread_ == UnreadObjects::mark) return object(unread_kind, {{"name", name}});
  fail(unread_message(name));
}

DETTRIAL_INLINE c10::IValue Machine::build(c10::IValue object, c10::IValue state) {
  const std::string kind = kind_of(object);
  if (kind == "numpy.ndarray") return numpy_array(state);
  if (kind == "numpy.dtype") {
    const auto s = elements(state, "a NumPy dtype's state");
    if (s.size() > 1 && s[1].isString()) object.toGenericDict().insert_or_assign("order", s[1]);
    return object;
  }
  if (kind == unread_kind) return object;  // its state is not read either
  if (object.isGenericDict() || object.isTensor()) return object;  // an OrderedDict's `_metadata`, a tensor's hooks
  fail("BUILD of something dettrial cannot set state on");
}

DETTRIAL_INLINE c10::IValue Machine::persistent_load(const c10::IValue& id) {
  const auto parts = elements(id, "a persistent id");
  if (parts.size() < 5 || !parts[0].isString() || parts[0].toStringRef() != "storage") fail("a persistent id other than a tensor storage");
  if (!storages_) fail("a tensor storage in a plain pickle (not a torch.save archive)");
  const std::string key = parts[2].toStringRef();
  if (const auto it = storage_cache_.find(key); it != storage_cache_.end()) return it->second;
  if (kind_of(parts[1]) != "global") fail("a storage without its type");
  const torch::Tensor storage = storages_(key, storage_dtype(field(parts[1], "name").toStringRef()), parts[4].toInt());
  storage_cache_[key] = storage;
  return storage;
}

DETTRIAL_INLINE c10::IValue Machine::run() {
  while (!result_) {
    if (at_ >= in_.size()) fail("the pickle ends without STOP");
    const auto op = static_cast<unsigned char>(in_[at_++]);
    if (!step(op)) fail("opcode 0x" + c10::str(std::hex, static_cast<int>(op)) + " is not one dettrial reads");
  }
  return *result_;
}

// One case per opcode, as the protocol's table reads.
DETTRIAL_INLINE bool Machine::step(unsigned char op) {
  switch (op) {
    case 0x80: take(1); break;  // PROTO
    case 0x95: take(8); break;  // FRAME
    case '.': result_ = pop(); break;
    case '(': marks_.push_back(stack_.size()); break;
    case '0': pop(); break;
    case '1': pop_to_mark(); break;
    case '2': stack_.push_back(top()); break;
    case 'N': stack_.emplace_back(); break;
    case 0x88: stack_.emplace_back(true); break;
    case 0x89: stack_.emplace_back(false); break;
    case 'I': {
      const std::string t = line();
      if (t == "00" || t == "01") stack_.emplace_back(t == "01");
      else stack_.emplace_back(static_cast<std::int64_t>(std::stoll(t)));
      break;
    }
    case 'L': {
      std::string t = line();
      if (!t.empty() && t.back() == 'L') t.pop_back();
      stack_.emplace_back(static_cast<std::int64_t>(std::stoll(t)));
      break;
    }
    case 'J': stack_.emplace_back(static_cast<std::int64_t>(static_cast<std::int32_t>(little(4)))); break;
    case 'K': stack_.emplace_back(static_cast<std::int64_t>(little(1))); break;
    case 'M': stack_.emplace_back(static_cast<std::int64_t>(little(2))); break;
    case 0x8a: stack_.push_back(long_value(take(little(1)))); break;
    case 0x8b: stack_.push_back(long_value(take(little(4)))); break;
    case 'F': stack_.emplace_back(std::stod(line())); break;
    case 'G': {
      const std::string_view b = take(8);
      std::uint64_t bits = 0;
      for (const char c : b) bits = bits << 8 | static_cast<unsigned char>(c);
      double v = 0;
      std::memcpy(&v, &bits, 8);
      stack_.emplace_back(v);
      break;
    }
    case 'X':
    case 'T':
    case 'B': stack_.emplace_back(std::string(take(little(4)))); break;  // BINUNICODE BINSTRING BINBYTES
    case 0x8c:
    case 'U':
    case 'C': stack_.emplace_back(std::string(take(little(1)))); break;  // SHORT_*
    case 0x8d:
    case 0x8e:
    case 0x96: stack_.emplace_back(std::string(take(little(8)))); break;  // *8, BYTEARRAY8
    case 'V': stack_.emplace_back(line()); break;                         // UNICODE (raw-unicode-escape; ASCII as is)
    case ']': stack_.push_back(list({})); break;
    case 'l': stack_.push_back(list(pop_to_mark())); break;
    case 'a': {
      c10::IValue v = pop();
      append_items({std::move(v)});
      break;
    }
    case 'e': append_items(pop_to_mark()); break;
    case ')': stack_.push_back(tuple({})); break;
    case 't': stack_.push_back(tuple(pop_to_mark())); break;
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<c10::IValue> items(op - 0x84);
      for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
      stack_.push_back(tuple(std::move(items)));
      break;
    }
    case '}': stack_.emplace_back(new_dict()); break;
    case 'd': {
      std::vector<c10::IValue> items = pop_to_mark();
      stack_.emplace_back(new_dict());
      set_items(std::move(items));
      break;
    }
    case 's': {
      c10::IValue value = pop(), key = pop();
      set_items({std::move(key), std::move(value)});
      break;
    }
    case 'u': set_items(pop_to_mark()); break;
    case 0x8f: stack_.push_back(list({})); break;             // EMPTY_SET
    case 0x90: append_items(pop_to_mark()); break;            // ADDITEMS
    case 0x91: stack_.push_back(list(pop_to_mark())); break;  // FROZENSET
    case 'c': {
      const std::string module = line();
      stack_.push_back(global(module, line()));
      break;
    }
    case 0x93: {  // STACK_GLOBAL
      const c10::IValue name = pop(), module = pop();
      if (!name.isString() || !module.isString()) fail("STACK_GLOBAL of something that is not a name");
      stack_.push_back(global(module.toStringRef(), name.toStringRef()));
      break;
    }
    case 'R': {
      const c10::IValue args = pop(), callable = pop();
      stack_.push_back(call(callable, elements(args, "REDUCE's arguments")));
      break;
    }
    case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
      const c10::IValue args = pop(), cls = pop();
      stack_.push_back(call(cls, elements(args, "NEWOBJ's arguments")));
      break;
    }
    case 'b': {
      c10::IValue state = pop();
      c10::IValue object = pop();
      c10::IValue built = build(object, std::move(state));
      if (!built.is(object))  // the memo holds the object before its BUILD: it now means the built one
        for (auto& [slot, value] : memo_)
          if (value.is(object)) value = built;
      stack_.push_back(std::move(built));
      break;
    }
    case 'p': put(std::stoull(line())); break;
    case 'q': put(little(1)); break;
    case 'r': put(little(4)); break;
    case 0x94: put(memo_.size()); break;  // MEMOIZE
    case 'g': get(std::stoull(line())); break;
    case 'h': get(little(1)); break;
    case 'j': get(little(4)); break;
    case 'Q': stack_.push_back(persistent_load(pop())); break;
    default: return false;
  }
  return true;
}

}  // namespace pickle_detail

DETTRIAL_INLINE c10::IValue unpickle(std::string_view pickle, const PickleStorageLoader& storages, UnreadObjects unread) {
  return pickle_detail::Machine(pickle, storages, unread).run();
}

DETTRIAL_INLINE std::optional<std::string> python_object_type(const c10::IValue& value) {
  if (value.isGenericDict()) {
    if (pickle_detail::kind_of(value) == pickle_detail::unread_kind) return pickle_detail::field(value, "name").toStringRef();
    for (const auto& entry : value.toGenericDict())
      if (auto found = python_object_type(entry.value())) return found;
  } else if (value.isList()) {
    const auto list = value.toList();
    for (std::size_t i = 0; i < list.size(); ++i)
      if (auto found = python_object_type(list.get(i))) return found;
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements())
      if (auto found = python_object_type(element)) return found;
  }
  return std::nullopt;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/python_pickle.hpp

namespace dettrial {

namespace detail {

/**
 * @brief `value` as a `torch.save` archive (a zip with `data.pkl` and `data/<n>`). The pickler is
 * told not to tag containers with TorchScript types, so the file uses only the globals Python's
 * weights-only loader allows (`_rebuild_tensor_v2`, the storage types, `OrderedDict`).
 */
DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value);
/// The same archive, passed to `sink` piece by piece as it is made (tensors' bytes as they are).
DETTRIAL_INLINE void pickle_archive_to(const c10::IValue& value, const std::function<void(const void*, std::size_t)>& sink);

/// `value` as a plain pickle (no tensors): what Python's `pickle.load` reads.
DETTRIAL_INLINE std::string pickle_bytes(const c10::IValue& value);

/// Reads an archive written by pickle_archive or by Python's `torch.save` (state dicts, checkpoints:
/// dicts, lists, tensors, numbers, strings); `file` names it in errors.
DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file,
                                             UnreadObjects unread = UnreadObjects::refuse);

/// Every parameter and buffer of a module with Python's state-dict names, in Python's order.
template <class F>
void for_each_state_entry(const torch::nn::Module& module, F&& f) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? std::string() : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      if (p.value().defined()) f(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      if (b.value().defined()) f(prefix + b.key(), b.value());
  }
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes);

/// Python's DistributedDataParallel saves `module.<name>`: the model's own names without it.
DETTRIAL_INLINE StateDict unwrapped(const StateDict& d);

/// A step count as Python's optimizers keep it: a float32 scalar tensor, or float64 past 2**24,
/// where float32 would round it (Python's load_state_dict takes either).
inline c10::IValue scalar_tensor(double v) {
  return torch::tensor(v, static_cast<double>(static_cast<float>(v)) == v ? torch::kFloat32 : torch::kFloat64);
}

/// Adam and AdamW keep the same state and options under the same names.
template <class State>
void adam_param_state(const State& s, c10::impl::GenericDict& out) {
  out.insert("step", scalar_tensor(static_cast<double>(s.step())));
  for (const auto& [key, t] :
       {std::pair{"exp_avg", s.exp_avg()}, std::pair{"exp_avg_sq", s.exp_avg_sq()}, std::pair{"max_exp_avg_sq", s.max_exp_avg_sq()}})
    if (t.defined()) out.insert(key, t.detach());
}
template <class Options>
void adam_options(const Options& o, c10::impl::GenericDict& out) {
  out.insert("lr", o.lr());
  out.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
  out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay());
  out.insert("amsgrad", o.amsgrad());
  out.insert("maximize", false);
}

/// One parameter's optimizer state and its group's options, in Python's names, for the built-in optimizers.
DETTRIAL_INLINE bool python_param_state(const torch::optim::OptimizerParamState& state, c10::impl::GenericDict& out);

DETTRIAL_INLINE void python_group_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& out);

}  // namespace detail

/**
 * @brief A module's state dict as Python's `module.state_dict()` has it: parameters and buffers under
 * their dotted names (`0.weight`, `fc1.bias`, `bn.running_mean`), detached.
 */
DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module);

/**
 * @brief An optimizer's state dict in Python's layout: `state` keyed by parameter index (counted
 * across groups), `param_groups` with their options and `params` as those indices. The built-in
 * optimizers (SGD, Adam, AdamW, Adagrad, RMSprop, and dettrial::optim::Adadelta) are written in full; for others, groups carry
 * their learning rate and the state is left empty.
 */
DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);

/**
 * @brief Copies a state dict into a module after checking it fits: every parameter and buffer of the
 * module present with the same shape, and no entry the module lacks. On any mismatch nothing is
 * copied and CheckpointError names `what` (the file and model) and the entry.
 */
DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace dettrial {
namespace detail {

DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value) {
  std::string out;
  pickle_archive_to(value, [&](const void* bytes, std::size_t n) { out.append(static_cast<const char*>(bytes), n); });
  return out;
}

DETTRIAL_INLINE void pickle_archive_to(const c10::IValue& value, const std::function<void(const void*, std::size_t)>& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) {
    sink(bytes, n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
}

DETTRIAL_INLINE std::string pickle_bytes(const c10::IValue& value) {
  std::string out;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { out.append(bytes, n); }, /*tensor_table=*/nullptr,
                              /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  return out;
}

DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file, UnreadObjects unread) {
  try {
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    auto [pickle_data, pickle_size] = reader.getRecord("data.pkl");
    const auto storages = [&](const std::string& key, c10::ScalarType dtype, std::int64_t numel) {
      auto [data, size] = reader.getRecord("data/" + key);
      // The pickle's element count is checked against the record before anything is allocated for
      // it: a crafted file must not choose the size of an allocation.
      const std::size_t element = c10::elementSize(dtype);
      if (numel < 0 || static_cast<std::uint64_t>(numel) > size / element)
        throw std::runtime_error("tensor storage '" + key + "' holds " + std::to_string(size) + " bytes where " +
                                 (numel < 0 ? std::to_string(numel) + " elements" : std::to_string(static_cast<std::uint64_t>(numel)) + " of " +
                                                                                      std::to_string(element) + " bytes") +
                                 " are needed");
      torch::Tensor out = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      std::memcpy(out.data_ptr(), data.get(), static_cast<std::size_t>(numel) * element);
      return out;
    };
    return unpickle(std::string_view(static_cast<const char*>(pickle_data.get()), pickle_size), storages, unread);
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read '" + file.string() + "' as a torch.save archive: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE StateDict unwrapped(const StateDict& d) {
  const std::string prefix = "module.";
  for (const auto& entry : d)
    if (!entry.key().isString() || entry.key().toStringRef().compare(0, prefix.size(), prefix) != 0) return d;
  StateDict out(c10::StringType::get(), c10::TensorType::get());
  for (const auto& entry : d) out.insert(entry.key().toStringRef().substr(prefix.size()), entry.value());
  return out;
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

DETTRIAL_INLINE bool python_param_state(const torch::optim::OptimizerParamState& state, c10::impl::GenericDict& out) {
  auto put = [&](const char* key, const torch::Tensor& t) {
    if (t.defined()) out.insert(key, t.detach());
  };
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    put("momentum_buffer", s->momentum_buffer());
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    adam_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    adam_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    out.insert("step", scalar_tensor(static_cast<double>(s->step())));
    put("sum", s->sum());
  } else if (const auto* s = dynamic_cast<const dettrial::optim::AdadeltaParamState*>(&state)) {
    dettrial::optim::python_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    out.insert("step", static_cast<std::int64_t>(s->step()));
    put("square_avg", s->square_avg());
    put("momentum_buffer", s->momentum_buffer());
    put("grad_avg", s->grad_avg());
  } else {
    return false;
  }
  return true;
}

DETTRIAL_INLINE void python_group_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& out) {
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("momentum", o->momentum());
    out.insert("dampening", o->dampening());
    out.insert("weight_decay", o->weight_decay());
    out.insert("nesterov", o->nesterov());
    out.insert("maximize", false);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    adam_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    adam_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("lr_decay", o->lr_decay());
    out.insert("weight_decay", o->weight_decay());
    out.insert("initial_accumulator_value", o->initial_accumulator_value());
    out.insert("eps", o->eps());
    out.insert("maximize", false);
  } else if (const auto* o = dynamic_cast<const dettrial::optim::AdadeltaOptions*>(&options)) {
    dettrial::optim::python_group_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("alpha", o->alpha());
    out.insert("eps", o->eps());
    out.insert("weight_decay", o->weight_decay());
    out.insert("momentum", o->momentum());
    out.insert("centered", o->centered());
    out.insert("maximize", false);
  } else {
    out.insert("lr", options.get_lr());
  }
}

}  // namespace detail

DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out(c10::StringType::get(), c10::TensorType::get());
  // LibTorch's pickler writes CPU and CUDA tensors (a CUDA one is copied out and tagged with its
  // device); others, such as the lazy device's, are saved as CPU copies.
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& t) {
    out.insert(name, t.device().is_cpu() || t.device().is_cuda() ? t.detach() : t.detach().cpu());
  });
  return out;
}

DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  // A fused optimizer keeps its step counts on the device between checkpoints.
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) capturable->pull_host_state();
  StateDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t index = 0;
  auto& states = optimizer.state();
  using StateMap = std::remove_cvref_t<decltype(states)>;
  for (auto& group : optimizer.param_groups()) {
    StateDict g(c10::StringType::get(), c10::AnyType::get());
    detail::python_group_options(group.options(), g);
    // A list typed Any: an int-typed one would be pickled with TorchScript's build_intlist, which
    // Python's weights-only loader refuses.
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& p : group.params()) {
      params.push_back(index);
      if (const auto it = states.find(detail::optimizer_state_key<StateMap>(p)); it != states.end()) {
        StateDict s(c10::StringType::get(), c10::AnyType::get());
        if (detail::python_param_state(*it->second, s) && s.size() > 0) state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::map<std::string, bool> used;
  for (const auto& entry : state) used[entry.key().toStringRef()] = false;
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& target) {
    const auto it = state.find(name);
    if (it == state.end())
      throw CheckpointError(what + " has no entry '" + name + "', which the model has (" + std::to_string(state.size()) +
                            " entries in the checkpoint): is it from another network?");
    if (!it->value().isTensor()) throw CheckpointError(what + ": entry '" + name + "' is not a tensor");
    const torch::Tensor source = it->value().toTensor();
    if (source.sizes() != target.sizes())
      throw CheckpointError(what + ": entry '" + name + "' has shape " + detail::shape_text(source.sizes()) + " in the checkpoint but " +
                            detail::shape_text(target.sizes()) + " in the model");
    used[name] = true;
    copies.emplace_back(target, source);
  });
  for (const auto& [name, seen] : used)
    if (!seen) throw CheckpointError(what + " has entry '" + name + "', which the model does not have: is it from another network?");
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/state_dict.hpp

namespace dettrial {
namespace python_optimizer_detail {

using optim::python_state_detail::python_number;  // schedulers' reader of Python's numbers

/// One optimizer type: the options it has (beyond those every optimizer carries), how to set them
/// and how to make a parameter's state from the file's entries.
struct Kind {
  const char* name;
  std::set<std::string> options;
  /// Flags Python's optimizers carry that change the update, with the one value LibTorch's type
  /// computes: another value in the file is refused, never trained on as something else (an AdamW
  /// checkpoint resumed into Adam would otherwise step as Adam with L2 weight decay).
  std::map<std::string, bool> fixed_flags;
  std::function<void(torch::optim::OptimizerOptions&, const std::string& key, const c10::IValue& value, const std::string& what)> set;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const StateDict& entries, const torch::Tensor& param,
                                                                   const std::string& what)>
      make_state;
};

/// Options Python's optimizers carry that change nothing in LibTorch's arithmetic (how the update
/// is computed, not what it is).
inline const std::set<std::string>& ignored_options() {
  static const std::set<std::string> keys = {"params", "foreach", "differentiable", "fused", "capturable", "initial_lr"};
  return keys;
}

/// Why a fixed flag's other value is another update, for the refusal's sentence.
inline std::string fixed_flag_reason(const std::string& key, bool value) {
  if (key == "decoupled_weight_decay")
    return value ? " (that is AdamW's decoupled weight decay: the trial's optimizer must be torch::optim::AdamW)"
                 : " (that is Adam's L2 weight decay: the trial's optimizer must be torch::optim::Adam)";
  return "";
}

/// A state entry as a tensor shaped like `param` (on its device), or undefined when absent.
inline torch::Tensor tensor_entry(const StateDict& entries, const char* key, const torch::Tensor& param, const std::string& what) {
  const auto it = entries.find(key);
  if (it == entries.end() || it->value().isNone()) return {};
  if (!it->value().isTensor()) throw CheckpointError(what + ": '" + key + "' is not a tensor");
  const torch::Tensor t = it->value().toTensor();
  if (t.sizes() != param.sizes())
    throw CheckpointError(what + ": '" + key + "' has shape " + detail::shape_text(t.sizes()) + " but the parameter " +
                          detail::shape_text(param.sizes()));
  return t.to(param.device(), param.scalar_type()).clone();
}

inline std::int64_t step_entry(const StateDict& entries, const std::string& what) {
  const auto it = entries.find("step");
  return it == entries.end() ? 0 : static_cast<std::int64_t>(python_number(it->value(), what + ": 'step'"));
}

template <class Options>
void set_adam(Options& o, const std::string& key, const c10::IValue& v, const std::string& what) {
  if (key == "lr") o.lr(python_number(v, what));
  else if (key == "eps") o.eps(python_number(v, what));
  else if (key == "weight_decay") o.weight_decay(python_number(v, what));
  else if (key == "amsgrad") o.amsgrad(python_number(v, what) != 0);
  else if (key == "betas") {
    if (!v.isTuple() && !v.isList()) throw CheckpointError(what + " is not a pair");
    const auto b = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    if (b.size() != 2) throw CheckpointError(what + " is not a pair");
    o.betas({python_number(b[0], what), python_number(b[1], what)});
  }
}

template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(const StateDict& e, const torch::Tensor& p, const std::string& what) {
  auto s = std::make_unique<State>();
  s->step(step_entry(e, what));
  s->exp_avg(tensor_entry(e, "exp_avg", p, what));
  s->exp_avg_sq(tensor_entry(e, "exp_avg_sq", p, what));
  s->max_exp_avg_sq(tensor_entry(e, "max_exp_avg_sq", p, what));
  if (!s->exp_avg().defined() || !s->exp_avg_sq().defined()) throw CheckpointError(what + " lacks exp_avg or exp_avg_sq");
  return s;
}

inline Kind sgd_kind() {
  using namespace torch::optim;
  return {"SGD",
          {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<SGDOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "momentum") o.momentum(python_number(v, what));
            else if (k == "dampening") o.dampening(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "nesterov") o.nesterov(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<SGDParamState>();
            s->momentum_buffer(tensor_entry(e, "momentum_buffer", p, what));
            return s;
          }};
}

inline Kind adam_kind() {
  using namespace torch::optim;
  return {"Adam",
          {"lr", "betas", "eps", "weight_decay", "amsgrad"},
          {{"maximize", false}, {"decoupled_weight_decay", false}},
          [](OptimizerOptions& o, const std::string& k, const c10::IValue& v, const std::string& what) {
            set_adam(static_cast<AdamOptions&>(o), k, v, what);
          },
          adam_state<AdamParamState>};
}

inline Kind adamw_kind() {
  using namespace torch::optim;
  return {"AdamW",
          {"lr", "betas", "eps", "weight_decay", "amsgrad"},
          {{"maximize", false}, {"decoupled_weight_decay", true}},
          [](OptimizerOptions& o, const std::string& k, const c10::IValue& v, const std::string& what) {
            set_adam(static_cast<AdamWOptions&>(o), k, v, what);
          },
          adam_state<AdamWParamState>};
}

inline Kind rmsprop_kind() {
  using namespace torch::optim;
  return {"RMSprop",
          {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<RMSpropOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "alpha") o.alpha(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "momentum") o.momentum(python_number(v, what));
            else if (k == "centered") o.centered(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<RMSpropParamState>();
            s->step(step_entry(e, what));
            s->square_avg(tensor_entry(e, "square_avg", p, what));
            s->momentum_buffer(tensor_entry(e, "momentum_buffer", p, what));
            s->grad_avg(tensor_entry(e, "grad_avg", p, what));
            return s;
          }};
}

inline Kind adagrad_kind() {
  using namespace torch::optim;
  return {"Adagrad",
          {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<AdagradOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "lr_decay") o.lr_decay(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "initial_accumulator_value") o.initial_accumulator_value(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<AdagradParamState>();
            s->step(step_entry(e, what));
            s->sum(tensor_entry(e, "sum", p, what));
            return s;
          }};
}

inline Kind adadelta_kind() {
  using namespace torch::optim;
  return {"Adadelta",
          {"lr", "rho", "eps", "weight_decay"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<optim::AdadeltaOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "rho") o.rho(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<optim::AdadeltaParamState>();
            s->step(step_entry(e, what));
            s->square_avg(tensor_entry(e, "square_avg", p, what));
            s->acc_delta(tensor_entry(e, "acc_delta", p, what));
            return s;
          }};
}

DETTRIAL_INLINE Kind kind_of(torch::optim::OptimizerOptions& options) {
  using namespace torch::optim;
  if (dynamic_cast<SGDOptions*>(&options)) return sgd_kind();
  if (dynamic_cast<AdamOptions*>(&options)) return adam_kind();
  if (dynamic_cast<AdamWOptions*>(&options)) return adamw_kind();
  if (dynamic_cast<RMSpropOptions*>(&options)) return rmsprop_kind();
  if (dynamic_cast<AdagradOptions*>(&options)) return adagrad_kind();
  if (dynamic_cast<optim::AdadeltaOptions*>(&options)) return adadelta_kind();
  return {nullptr, {}, {}, {}, {}};
}

/// Checks one group's options against the optimizer's kind before any is set.
inline void check_group_options(const StateDict& group, const Kind& kind, const std::string& what) {
  for (const auto& entry : group) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (const auto fixed = kind.fixed_flags.find(key); fixed != kind.fixed_flags.end()) {
      const bool value = python_optimizer_detail::python_number(entry.value(), what + ": '" + key + "'") != 0;
      if (value != fixed->second)
        throw CheckpointError(what + " has " + key + ": " + (value ? "True" : "False") + ", which LibTorch's " + kind.name +
                              " does not do" + fixed_flag_reason(key, value));
      continue;
    }
    if (!kind.options.count(key) && !ignored_options().count(key))
      throw CheckpointError(what + " has option '" + key + "', which " + kind.name +
                            " does not have: the checkpoint's optimizer is another type than the trial's");
  }
}

}  // namespace python_optimizer_detail

DETTRIAL_INLINE void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state, const std::string& what) {
  namespace pd = python_optimizer_detail;
  const auto groups_it = state.find("param_groups");
  const auto state_it = state.find("state");
  if (groups_it == state.end() || !groups_it->value().isList() || state_it == state.end() || !state_it->value().isGenericDict())
    throw CheckpointError(what + " is not an optimizer's state dict (it needs 'state' and 'param_groups')");
  const auto groups = groups_it->value().toList();
  const StateDict per_param = state_it->value().toGenericDict();
  auto& param_groups = optimizer.param_groups();
  if (groups.size() != param_groups.size())
    throw CheckpointError(what + " has " + std::to_string(groups.size()) + " parameter group(s), but the trial's optimizer " +
                          std::to_string(param_groups.size()));
  // Check everything, and build every parameter's state, before changing the optimizer.
  using StateMap = std::remove_cvref_t<decltype(optimizer.state())>;
  std::vector<std::pair<typename StateMap::key_type, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  std::vector<pd::Kind> kinds;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group_what = what + ", group " + std::to_string(g);
    if (!groups.get(g).isGenericDict()) throw CheckpointError(group_what + " is not a dict");
    const StateDict group = groups.get(g).toGenericDict();
    pd::Kind kind = pd::kind_of(param_groups[g].options());
    if (!kind.name)
      throw CheckpointError(what +
                            ": the trial's optimizer is not one whose Python state dettrial reads (SGD, Adam, AdamW, RMSprop, "
                            "Adagrad, Adadelta)");
    pd::check_group_options(group, kind, group_what);
    const auto params_it = group.find("params");
    if (params_it == group.end() || !params_it->value().isList()) throw CheckpointError(group_what + " lists no params");
    const auto ids = params_it->value().toList();
    const auto& params = param_groups[g].params();
    if (ids.size() != params.size())
      throw CheckpointError(group_what + " has " + std::to_string(ids.size()) + " parameters, but the trial's optimizer " +
                            std::to_string(params.size()) + ": is it from another network?");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto entry = per_param.find(ids.get(i));
      if (entry == per_param.end()) continue;  // no step taken for it yet
      if (!entry->value().isGenericDict()) throw CheckpointError(group_what + ", parameter " + std::to_string(i) + ": state is not a dict");
      states.emplace_back(detail::optimizer_state_key<StateMap>(params[i]),
                          kind.make_state(entry->value().toGenericDict(), params[i], group_what + ", parameter " + std::to_string(i)));
    }
    kinds.push_back(std::move(kind));
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const StateDict group = groups.get(g).toGenericDict();
    for (const auto& entry : group)
      kinds[g].set(param_groups[g].options(), entry.key().toStringRef(), entry.value(),
                   what + ", group " + std::to_string(g) + ", option '" + entry.key().toStringRef() + "'");
  }
  auto& map = optimizer.state();
  map.clear();
  for (auto& [key, s] : states) map[key] = std::move(s);
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) {
    capturable->push_device_state();
    capturable->sync_learning_rates(optimizer.param_groups());
  }
}

DETTRIAL_INLINE bool python_layout_holds(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups())
    if (!python_optimizer_detail::kind_of(group.options()).name) return false;
  for (const auto& [key, state] : optimizer.state()) {
    c10::impl::GenericDict scratch(c10::StringType::get(), c10::AnyType::get());
    if (!detail::python_param_state(*state, scratch)) return false;
  }
  return true;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/python_optimizer.hpp
// ---- begin dettrial/checkpoint/storage.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Checkpoint directories on disk: written crash-safely (temporary directory, fsync, rename),
/// listed, checked (sizes and CRC-32 of every file), retained and deleted.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>


namespace dettrial {

/// The layout version dettrial writes into `metadata.json`; it refuses to read newer ones.
/// - 1: LibTorch's archive (`dettrial_state.pt`) holds every optimizer and scheduler again, beside
///   Python's layout in `state_dict.pth`;
/// - 2: each tensor is stored once: optimizers and schedulers are restored from Python's layout, and
///   `dettrial_state.pt` (written only when needed) holds what that layout cannot express.
inline constexpr std::int64_t checkpoint_format_version = 2;

/// One complete checkpoint directory, as its `metadata.json` describes it.
struct CheckpointInfo {
  std::filesystem::path path{};
  std::string uuid;
  /// Determined's `steps_completed`: batches trained when it was written.
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// Write order within its storage directory (1, 2, ...).
  std::int64_t sequence = 0;
  /// Its `dettrial_format` (checkpoint_format_version when written); 0 for one Determined wrote.
  std::int64_t format = 0;
  /// The searcher metric of the validation at the same batch, if there was one.
  std::optional<double> validation_metric{};
  /// Written by Determined (its metadata has `determined_version` and no `dettrial_format`): the
  /// optimizers and schedulers are read from Python's layout, the progress from `trial_state.pkl`.
  bool by_determined = false;
};

/// How many checkpoints a trial keeps (Determined's `checkpoint_storage.save_trial_*`).
struct Retention {
  /// The best N by the searcher metric (checkpoints that have a validation).
  std::int64_t save_trial_best = 1;
  /// The N most recent.
  std::int64_t save_trial_latest = 1;
};

namespace detail {

inline std::string errno_text() { return std::strerror(errno); }

/// Writes `bytes` to `path` and fsyncs it, so a crash after this returns cannot lose or tear it.
DETTRIAL_INLINE void write_file_synced(const std::filesystem::path& path, std::string_view bytes);

/// Makes a directory's entries (new files, renames) durable.
DETTRIAL_INLINE void sync_directory(const std::filesystem::path& dir);

DETTRIAL_INLINE std::string read_file_bytes(const std::filesystem::path& path);

DETTRIAL_INLINE std::uint32_t crc32_of(std::string_view bytes);
/// The CRC-32 of what `crc` covered followed by `bytes`.
DETTRIAL_INLINE std::uint32_t crc32_continue(std::uint32_t crc, std::string_view bytes);

/// A random (version 4) UUID, Determined's name for a checkpoint directory.
DETTRIAL_INLINE std::string new_uuid();

DETTRIAL_INLINE bool is_hidden(const std::filesystem::path& p);

/// Removes what an interrupted writer or deleter left behind (hidden `.tmp-*` / `.deleting-*` folders).
DETTRIAL_INLINE void remove_stale_entries(const std::filesystem::path& storage);

/**
 * @brief Spreads a background write over a time budget. On a machine whose cores training keeps
 * busy, a writer that runs flat out takes a thick slice of a few steps (slow steps: the p99); paced,
 * it takes a thin slice of many. After each piece, the writer sleeps while it is ahead of an even
 * schedule (`expected_bytes` over `budget`); hurry() (someone waits for the write) ends the pacing
 * at once. Thread-safe: the writer calls wrote(), any thread hurry().
 */
class WritePace {
 public:
  WritePace(std::chrono::duration<double> budget, std::size_t expected_bytes)
      : start_(std::chrono::steady_clock::now()), budget_(budget), expected_(expected_bytes) {}
  /// `bytes` more are written: returns when the schedule allows the next piece, or when hurried.
  void wrote(std::size_t bytes) {
    written_ += bytes;
    if (expected_ == 0) return;
    const double share = std::min(1.0, static_cast<double>(written_) / static_cast<double>(expected_));
    const auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(budget_ * share);
    std::unique_lock lock(mutex_);
    woken_.wait_until(lock, due, [&] { return hurried_; });
  }
  /// Ends the pacing: the rest is written as fast as it can be.
  void hurry() {
    {
      std::lock_guard lock(mutex_);
      hurried_ = true;
    }
    woken_.notify_all();
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::duration<double> budget_;
  std::size_t expected_ = 0, written_ = 0;
  std::mutex mutex_;
  std::condition_variable woken_;
  bool hurried_ = false;
};

}  // namespace detail

/**
 * @brief Writes one checkpoint crash-safely: every file goes into a hidden temporary directory and
 * is synced; `commit` writes `metadata.json` (with each file's size and CRC-32) last, syncs, and
 * renames the directory into place. Until then the storage holds only complete checkpoints; a
 * writer destroyed without commit removes its temporary directory.
 */
class CheckpointWriter {
 public:
  /// With a `pace`, the files' bytes are written at its rate (see WritePace).
  CheckpointWriter(std::filesystem::path storage, std::string uuid, detail::WritePace* pace = nullptr);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  ~CheckpointWriter();

  void add_file(const std::string& name, std::string_view bytes);

  /// Receives a file's bytes piece by piece.
  using ByteSink = std::function<void(const void* data, std::size_t size)>;
  /// Writes file `name` from the pieces `produce` passes to the sink it is given, as they come:
  /// a large file is never held in memory whole.
  void add_file(const std::string& name, const std::function<void(const ByteSink&)>& produce);

  /// Writes `metadata.json`: the members of `fields` (a JSON object), then `"files"` (each file's
  /// `"size"` and `"crc32"`), and moves the checkpoint into place. Returns its final path.
  std::filesystem::path commit(detail::Json fields);

 private:
  std::filesystem::path storage_;
  std::string uuid_;
  std::filesystem::path temp_;
  /// Each file added: its name, size and CRC-32, in the order added.
  struct FileEntry {
    std::string name;
    std::size_t size = 0;
    std::uint32_t crc32 = 0;
  };
  std::vector<FileEntry> files_;
  detail::WritePace* pace_ = nullptr;
  bool committed_ = false;
};

/**
 * @brief Reads and checks a checkpoint directory's `metadata.json`: present, parsable, a format this
 * dettrial reads, and (when `verify_files`) every listed file present with its size and CRC-32.
 * Throws CheckpointError naming the file at fault.
 */
DETTRIAL_INLINE CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir, bool verify_files = true);

/// Checks a file of a checkpoint against the CRC-32 recorded in its metadata.json, returning its bytes.
DETTRIAL_INLINE std::string read_checked_file(const std::filesystem::path& dir, const std::string& name);

/// The complete checkpoints in a storage directory, oldest first (by write order). Hidden entries
/// (checkpoints being written or deleted) are not checkpoints.
DETTRIAL_INLINE std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& storage);

/**
 * @brief Resolves what a user names to resume from: a checkpoint directory itself, or a directory
 * holding checkpoints (a trial's storage, or its output directory with `checkpoints/`), whose most
 * recent checkpoint is taken. Throws CheckpointError when there is none.
 */
DETTRIAL_INLINE std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

/**
 * @brief The checkpoints `retention` lets go: all but the `save_trial_latest` most recent and the
 * `save_trial_best` best by their validation metric. `keep_uuid` (the newest, while a trial still
 * runs) is never chosen.
 */
DETTRIAL_INLINE std::vector<CheckpointInfo> checkpoints_to_delete(const std::vector<CheckpointInfo>& all, const Retention& retention,
                                                                  bool smaller_is_better, std::string_view keep_uuid = {});

/// Deletes a checkpoint: renamed to a hidden name first (atomic), so a crash half-way through
/// never leaves a directory that looks like a checkpoint but is not one.
DETTRIAL_INLINE void delete_checkpoint(const CheckpointInfo& checkpoint);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
// ---- begin dettrial/detail/json.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The JSON dettrial writes and reads (metrics lines, events, checkpoint metadata, summaries),
/// with nlohmann/json.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>


namespace dettrial::detail {

// ---- writing: nlohmann/json's dump; numbers as it writes them (shortest text that reads back exactly,
// 1.0 as `1.0`), NaN and infinities (which JSON lacks) as null, bytes that are not UTF-8 as U+FFFD.

/// One compact line, as in metrics.jsonl and events.jsonl: `{"type":"training","batches":3}` and a newline.
inline std::string json_line(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n"; }

/// The text of a JSON file (metadata.json, trial_state.json, load_data.json, summary.json), indented.
inline std::string json_text(const Json& j) { return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n"; }

/// A YAML document as JSON: maps, sequences, and plain scalars typed by YAML's core schema (null,
/// booleans, integers, finite floats); quoted scalars (tag "!") and everything else (`.inf`, `.nan`,
/// text) stay strings. A map's keys are their scalar text.
DETTRIAL_INLINE Json yaml_to_json(const YAML::Node& node);

// ---- reading ---------------------------------------------------------------------------------

/// Reads a JSON file written by dettrial; a missing or unparsable file is an ErrorT naming it:
/// "cannot read '<path>'", "'<path>' is not valid JSON (line N): <reason>".
template <class ErrorT = Error>
Json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path, ec)) throw ErrorT("cannot read '" + path.string() + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ErrorT("cannot read '" + path.string() + "'");
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // e.byte: 1-based, the byte the parser stopped at. Its message says where too; the reason follows the first ": ".
    const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    const std::string what = e.what();
    const auto colon = what.find(": ");
    throw ErrorT("'" + path.string() + "' is not valid JSON (line " + std::to_string(line) +
                 "): " + (colon == std::string::npos ? what : what.substr(colon + 2)));
  }
}

/// A field of a JSON document that is missing or has the wrong type, as `json_field` and `json_as`
/// report it ("no 'uuid'", "'uuid' is a number, not a string"); readers turn it into their own
/// error naming the file.
struct JsonFieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `object[key]`, or nullptr when `object` is not an object or lacks `key`.
DETTRIAL_INLINE const Json* json_find(const Json& object, const std::string& key);

/// `object[key]`; a missing key throws JsonFieldError("no '<key>'").
DETTRIAL_INLINE const Json& json_field(const Json& object, const std::string& key);

/// "a string", "a number", "null", ...: what a JSON value is, for messages.
DETTRIAL_INLINE std::string json_kind(const Json& j);

/**
 * @brief `value` (named `field` in messages) as a T, strictly: integral types only from JSON
 * integers within their range, floating point from any JSON number, strings from strings, bool
 * from true and false. Anything else throws JsonFieldError("'<field>' is a string, not an integer").
 */
template <class T>
T json_as(const Json& value, std::string_view field) {
  const auto wrong = [&](const std::string& expected) {
    return JsonFieldError("'" + std::string(field) + "' is " + json_kind(value) + ", not " + expected);
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) throw wrong("true or false");
    return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (value.is_number_unsigned()) {
      if (const auto u = value.get<std::uint64_t>(); std::in_range<T>(u)) return static_cast<T>(u);
    } else if (value.is_number_integer()) {
      if (const auto i = value.get<std::int64_t>(); std::in_range<T>(i)) return static_cast<T>(i);
    } else {
      throw wrong(std::is_signed_v<T> ? "an integer" : "a non-negative integer");
    }
    throw JsonFieldError("'" + std::string(field) + "' is " + value.dump() + ", out of range");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) throw wrong("a number");
    return value.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) throw wrong("a string");
    return value.get<std::string>();
  } else {
    static_assert(std::is_same_v<T, std::string>, "json_as reads bool, integers, floating point and std::string");
  }
}

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE Json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: return nullptr;
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = yaml_to_json(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() != "!") {  // "!" marks a quoted scalar: always a string
        if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
        if (s == "true" || s == "True" || s == "TRUE") return true;
        if (s == "false" || s == "False" || s == "FALSE") return false;
        std::int64_t i = 0;
        double d = 0;
        if (YAML::convert<std::int64_t>::decode(node, i)) return i;
        if (YAML::convert<double>::decode(node, d) && std::isfinite(d)) return d;
      }
      return s;
    }
  }
  return nullptr;
}

DETTRIAL_INLINE const Json* json_find(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

DETTRIAL_INLINE const Json& json_field(const Json& object, const std::string& key) {
  if (const Json* v = json_find(object, key)) return *v;
  throw JsonFieldError("no '" + key + "'");
}

DETTRIAL_INLINE std::string json_kind(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    default: return std::string("a ") + j.type_name();
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/json.hpp
#include <fstream>
#include <random>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

namespace dettrial {
namespace detail {

DETTRIAL_INLINE void write_file_synced(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create '" + path.string() + "': " + errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      ::close(fd);
      throw CheckpointError("cannot write '" + path.string() + "': " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw CheckpointError("cannot sync '" + path.string() + "' to disk: " + why);
  }
  if (::close(fd) != 0) throw CheckpointError("cannot close '" + path.string() + "': " + errno_text());
}

DETTRIAL_INLINE void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("cannot open directory '" + dir.string() + "': " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : std::string();
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot sync directory '" + dir.string() + "': " + why);
}

DETTRIAL_INLINE std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read '" + path.string() + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return std::move(bytes).str();
}

DETTRIAL_INLINE std::uint32_t crc32_continue(std::uint32_t crc, std::string_view bytes) {
  uLong value = crc;
  // zlib takes uInt lengths: feed large buffers in pieces.
  while (!bytes.empty()) {
    const std::size_t n = std::min<std::size_t>(bytes.size(), 1u << 30);
    value = ::crc32(value, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<std::uint32_t>(value);
}

DETTRIAL_INLINE std::uint32_t crc32_of(std::string_view bytes) {
  return crc32_continue(static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0)), bytes);
}

DETTRIAL_INLINE std::string new_uuid() {
  std::random_device device;
  std::uint64_t hi = (static_cast<std::uint64_t>(device()) << 32) | device();
  std::uint64_t lo = (static_cast<std::uint64_t>(device()) << 32) | device();
  hi = (hi & ~0xF000ULL) | 0x4000ULL;              // version 4
  lo = (lo & ~(0xC0ULL << 56)) | (0x80ULL << 56);  // RFC 4122 variant
  char text[37];
  std::snprintf(text, sizeof text, "%08llx-%04llx-%04llx-%04llx-%012llx", static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF), static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48), static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return text;
}

DETTRIAL_INLINE bool is_hidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

DETTRIAL_INLINE void remove_stale_entries(const std::filesystem::path& storage) {
  std::error_code ec;
  if (!std::filesystem::is_directory(storage, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(storage, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".deleting-", 0) == 0) std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace detail

DETTRIAL_INLINE CheckpointWriter::CheckpointWriter(std::filesystem::path storage, std::string uuid, detail::WritePace* pace)
    : storage_(std::move(storage)), uuid_(std::move(uuid)), temp_(storage_ / (".tmp-" + uuid_)), pace_(pace) {
  std::error_code ec;
  std::filesystem::create_directories(storage_, ec);
  if (ec) throw CheckpointError("cannot create checkpoint storage '" + storage_.string() + "': " + ec.message());
  std::filesystem::create_directory(temp_, ec);
  if (ec) throw CheckpointError("cannot create '" + temp_.string() + "': " + ec.message());
}

DETTRIAL_INLINE CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(temp_, ec);
}

DETTRIAL_INLINE void CheckpointWriter::add_file(const std::string& name, std::string_view bytes) {
  add_file(name, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

DETTRIAL_INLINE void CheckpointWriter::add_file(const std::string& name, const std::function<void(const ByteSink&)>& produce) {
  const std::filesystem::path path = temp_ / name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create '" + path.string() + "': " + detail::errno_text());
  FileEntry entry{name, 0, 0};
  std::uint32_t crc = detail::crc32_of({});
  try {
    produce([&](const void* data, std::size_t size) {
      // In pieces of at most 4 MB, each checksummed while it is in the cache and paced.
      constexpr std::size_t piece = std::size_t{4} << 20;
      for (const char* bytes = static_cast<const char*>(data); size > 0;) {
        const std::size_t n = std::min(size, piece);
        crc = detail::crc32_continue(crc, {bytes, n});
        for (std::size_t done = 0; done < n;) {
          const ssize_t wrote = ::write(fd, bytes + done, n - done);
          if (wrote < 0 && errno == EINTR) continue;
          if (wrote < 0) throw CheckpointError("cannot write '" + path.string() + "': " + detail::errno_text());
          done += static_cast<std::size_t>(wrote);
        }
        entry.size += n;
        bytes += n;
        size -= n;
        if (pace_) pace_->wrote(n);
      }
    });
    if (::fsync(fd) != 0) throw CheckpointError("cannot sync '" + path.string() + "' to disk: " + detail::errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw CheckpointError("cannot close '" + path.string() + "': " + detail::errno_text());
  entry.crc32 = crc;
  files_.push_back(std::move(entry));
}

DETTRIAL_INLINE std::filesystem::path CheckpointWriter::commit(detail::Json fields) {
  const std::filesystem::path meta_path = CheckpointFolder{temp_}.metadata();
  if (!fields.is_object())
    throw CheckpointError("the fields of '" + meta_path.string() + "' must be a JSON object, not " + detail::json_kind(fields));
  fields.erase("files");
  detail::Json files = detail::Json::object();
  for (const FileEntry& file : files_) files[file.name] = {{"size", file.size}, {"crc32", file.crc32}};
  fields["files"] = std::move(files);
  detail::write_file_synced(meta_path, detail::json_text(fields));
  detail::sync_directory(temp_);
  const std::filesystem::path final_path = storage_ / uuid_;
  if (::rename(temp_.c_str(), final_path.c_str()) != 0)
    throw CheckpointError("cannot move checkpoint into place at '" + final_path.string() + "': " + detail::errno_text());
  committed_ = true;
  detail::sync_directory(storage_);
  return final_path;
}

namespace detail {
/// A checkpoint Determined wrote: its id is its folder's name (Determined's storage id), its place
/// its `steps_completed`; it lists no checksums (Determined keeps none).
DETTRIAL_INLINE CheckpointInfo determined_checkpoint_info(const std::filesystem::path& dir, const Json& meta) {
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  CheckpointInfo info{.path = dir, .uuid = dir.filename().string(), .by_determined = true};
  try {
    info.batches_trained = json_as<std::int64_t>(json_field(meta, "steps_completed"), "steps_completed");
  } catch (const JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' (written by Determined " + meta.value("determined_version", std::string("?")) +
                          ") has no usable steps_completed: " + e.what());
  }
  std::error_code ec;
  if (!std::filesystem::exists(CheckpointFolder{dir}.state_dict(), ec))
    throw CheckpointError("'" + dir.string() +
                          "' (written by Determined) has no state_dict.pth: only PyTorchTrial checkpoints can be continued");
  return info;
}
}  // namespace detail

DETTRIAL_INLINE CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir, bool verify_files) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) throw CheckpointError("checkpoint '" + dir.string() + "' does not exist");
  if (!std::filesystem::is_directory(dir, ec))
    throw CheckpointError("checkpoint '" + dir.string() + "' is not a directory (a checkpoint is a directory with metadata.json)");
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  if (!std::filesystem::exists(meta_path, ec))
    throw CheckpointError("'" + dir.string() + "' is not a complete dettrial checkpoint: it has no metadata.json");
  const detail::Json meta = detail::read_json_file<CheckpointError>(meta_path);
  auto field = [&](const char* key) -> const detail::Json& {
    const detail::Json* v = detail::json_find(meta, key);
    if (!v) throw CheckpointError("'" + meta_path.string() + "' has no '" + key + "'");
    return *v;
  };
  CheckpointInfo info;
  info.path = dir;
  if (!detail::json_find(meta, "dettrial_format") && detail::json_find(meta, "determined_version"))
    return detail::determined_checkpoint_info(dir, meta);
  try {
    const auto format = detail::json_as<std::int64_t>(field("dettrial_format"), "dettrial_format");
    if (format > checkpoint_format_version)
      throw CheckpointError("'" + meta_path.string() + "' is checkpoint format " + std::to_string(format) +
                            ", written by a newer dettrial; this one reads formats up to " + std::to_string(checkpoint_format_version));
    info.format = format;
    info.uuid = detail::json_as<std::string>(field("uuid"), "uuid");
    info.batches_trained = detail::json_as<std::int64_t>(field("steps_completed"), "steps_completed");
    info.epochs_trained = detail::json_as<std::int64_t>(field("epochs_trained"), "epochs_trained");
    info.sequence = detail::json_as<std::int64_t>(field("sequence"), "sequence");
    if (const detail::Json* v = detail::json_find(meta, "validation_metric"); v && !v->is_null())
      info.validation_metric = detail::json_as<double>(*v, "validation_metric");
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' has a field of the wrong type: " + e.what());
  }
  if (verify_files) {
    const detail::Json* files = detail::json_find(meta, "files");
    if (!files || !files->is_object()) throw CheckpointError("'" + meta_path.string() + "' lists no files");
    for (auto it = files->begin(); it != files->end(); ++it) {
      const std::filesystem::path file = dir / it.key();
      if (!std::filesystem::exists(file, ec)) throw CheckpointError("checkpoint file '" + file.string() + "' is missing");
      std::uint64_t size = 0;
      try {
        size = detail::json_as<std::uint64_t>(detail::json_field(it.value(), "size"), "files." + it.key() + ".size");
      } catch (const detail::JsonFieldError& e) {
        throw CheckpointError("'" + meta_path.string() + "' has a bad entry for file '" + it.key() + "': " + e.what());
      }
      const auto actual = std::filesystem::file_size(file, ec);
      if (ec || actual != size)
        throw CheckpointError("checkpoint file '" + file.string() + "' is truncated or damaged: " + std::to_string(actual) +
                              " bytes where " + std::to_string(size) + " were written");
    }
  }
  return info;
}

DETTRIAL_INLINE std::string read_checked_file(const std::filesystem::path& dir, const std::string& name) {
  const std::filesystem::path file = dir / name;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw CheckpointError("checkpoint file '" + file.string() + "' is missing");
  std::string bytes = detail::read_file_bytes(file);
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  const detail::Json meta = detail::read_json_file<CheckpointError>(meta_path);
  const detail::Json* files = detail::json_find(meta, "files");
  const detail::Json* entry = files ? detail::json_find(*files, name) : nullptr;
  if (!entry) throw CheckpointError("'" + meta_path.string() + "' does not list '" + name + "'");
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
  try {
    size = detail::json_as<std::uint64_t>(detail::json_field(*entry, "size"), "files." + name + ".size");
    crc32 = detail::json_as<std::uint32_t>(detail::json_field(*entry, "crc32"), "files." + name + ".crc32");
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' has a bad entry for file '" + name + "': " + e.what());
  }
  if (size != bytes.size() || crc32 != detail::crc32_of(bytes))
    throw CheckpointError("checkpoint file '" + file.string() + "' is damaged: its size or CRC-32 differs from what was written");
  return bytes;
}

DETTRIAL_INLINE std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& storage) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(storage, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(storage, ec)) {
    if (!entry.is_directory() || detail::is_hidden(entry.path())) continue;
    if (!std::filesystem::exists(CheckpointFolder{entry.path()}.metadata(), ec)) continue;
    out.push_back(read_checkpoint_info(entry.path(), /*verify_files=*/false));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
  return out;
}

DETTRIAL_INLINE std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(CheckpointFolder{path}.metadata(), ec)) return path;
  if (!std::filesystem::exists(path, ec)) throw CheckpointError("checkpoint '" + path.string() + "' does not exist");
  for (const auto& storage : {path, RunFolder{path}.checkpoints()}) {
    const auto all = list_checkpoints(storage);
    if (!all.empty()) return all.back().path;
  }
  throw CheckpointError("'" + path.string() + "' holds no complete dettrial checkpoint (a directory with metadata.json)");
}

DETTRIAL_INLINE std::vector<CheckpointInfo> checkpoints_to_delete(const std::vector<CheckpointInfo>& all, const Retention& retention,
                                                                  bool smaller_is_better, std::string_view keep_uuid) {
  std::vector<bool> keep(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].uuid == keep_uuid) keep[i] = true;
    if (static_cast<std::int64_t>(all.size() - i) <= retention.save_trial_latest) keep[i] = true;
  }
  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].validation_metric) ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(), [&](std::size_t a, std::size_t b) {
    return MetricOrder{smaller_is_better}.better(*all[a].validation_metric, *all[b].validation_metric);
  });
  for (std::size_t k = 0; k < ranked.size() && static_cast<std::int64_t>(k) < retention.save_trial_best; ++k) keep[ranked[k]] = true;
  std::vector<CheckpointInfo> out;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!keep[i]) out.push_back(all[i]);
  return out;
}

DETTRIAL_INLINE void delete_checkpoint(const CheckpointInfo& checkpoint) {
  const std::filesystem::path doomed = checkpoint.path.parent_path() / (".deleting-" + checkpoint.uuid);
  if (::rename(checkpoint.path.c_str(), doomed.c_str()) != 0)
    throw CheckpointError("cannot delete checkpoint '" + checkpoint.path.string() + "': " + detail::errno_text());
  std::error_code ec;
  std::filesystem::remove_all(doomed, ec);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/storage.hpp

namespace dettrial {

/// Where a trial stands (Determined's `_TrialState`); saved in every checkpoint as `trial_state.json`.
struct TrialProgress {
  std::int64_t trial_id = 0;
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// `batches_trained` at the last validation and checkpoint; -1 when there was none.
  std::int64_t last_validation = -1;
  std::int64_t last_checkpoint = -1;
  /// The best searcher metric validated so far (what `checkpoint_policy: best` compares against).
  std::optional<double> best_validation{};
  /// The shuffle seeds of the data loaders (those that have one), so a resumed trial reads the same order.
  std::optional<std::uint64_t> training_data_seed{};
  std::optional<std::uint64_t> validation_data_seed{};
  /// The ranks of the job that wrote the checkpoint, and the rank count whose global batches the
  /// training data follows (the count the run began on: a run resumed on another count keeps them).
  /// 0: not recorded (a checkpoint written before dettrial recorded them, or by Determined).
  std::int64_t ranks = 0;
  std::int64_t data_ranks = 0;

  std::string to_json() const;
  static TrialProgress from_json(const std::filesystem::path& file);
  /// Determined's `trial_state.pkl` (its `_TrialState`), which Determined reads to continue.
  std::string to_determined_pickle() const;
  /// Where the trial of a checkpoint Determined wrote stands: its `trial_state.pkl`, or, without
  /// one, its metadata's steps_completed.
  static TrialProgress from_determined(const std::filesystem::path& dir, const CheckpointInfo& info);
};

namespace detail {

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what);

/// A checkpoint's `state_dict.pth`, its size and CRC-32 checked, as a dict.
DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir);

/// Maps a tensor of the live state to the one a checkpoint stores (the snapshot's host copy).
using TensorKeeper = std::function<torch::Tensor(const torch::Tensor&)>;

/// `dettrial_state.pt` before it is serialized.
struct NativeState {
  torch::serialize::OutputArchive archive;
  /// It holds an optimizer's own save() of its live state, which training changes in place: it is
  /// serialized before training goes on (the rest of a checkpoint is written in the background).
  bool holds_live_state = false;
  std::string bytes();
};

/// Moves a Context's state into and out of checkpoint files, through the Context's public accessors.
struct ContextCheckpoint {
  /// The Python-readable part (without callbacks, which the trainer adds).
  static StateDict python_state(Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank = {},
                                const std::vector<torch::Tensor>& gpu_rng_per_rank = {});

  /// LibTorch's archive of what Python's layout cannot express: the optimizers it cannot hold
  /// (python_layout_holds), the schedulers without a Python-state reader and, `with_grads`, the
  /// pending gradients, each taken through `keep` (the snapshot's copy). nullopt: nothing to write.
  static std::optional<NativeState> native_state(Context& c, bool with_grads, const TensorKeeper& keep);

  /// Checks and loads every model of `top` (state_dict.pth's dict) into the context's models.
  static void load_models(Context& c, const StateDict& top, const std::filesystem::path& file);

  static void load_rng(Context& c, const StateDict& top, const std::filesystem::path& file);

  static void set_generator_state(at::Generator generator, const torch::Tensor& state);  // a handle: copies share the generator
  /// The seed of rank `rank`'s generator when the checkpoint has no state of its own for it: the
  /// CRC-32 of the chief's saved state mixed with the rank.
  static std::uint64_t new_rank_seed(const torch::Tensor& chiefs_state, std::int64_t rank);

  /// LibTorch's archive `bytes` (`file` names it in errors).
  static torch::serialize::InputArchive read_native(const std::string& bytes, const std::filesystem::path& file);

  /// Restores the optimizers and schedulers from state_dict.pth's Python layout (dettrial's formats
  /// 1 and 2, and a checkpoint Determined wrote): each optimizer through load_optimizer_state_dict,
  /// each scheduler through its Python-state reader; a part that layout cannot hold from `native`
  /// (LibTorch's archive, when written), and the pending gradients it holds. A part that cannot be carried over is a
  /// CheckpointError naming it, or, with `fresh_parts`, a one-line warning and that part as the
  /// trial made it.
  static void load_python_layout(Context& c, const StateDict& top, const std::filesystem::path& file, bool fresh_parts,
                                 torch::serialize::InputArchive* native = nullptr);

 private:
  static void load_native_optimizer(Context& c, std::size_t i, torch::serialize::InputArchive& one, const std::string& what);
  static void load_native_scheduler(Context& c, std::size_t i, torch::serialize::InputArchive& one, const std::string& what);
  /// The pending gradients `archive` holds (none: nothing was pending at the checkpoint).
  static void load_native_grads(Context& c, torch::serialize::InputArchive& archive);
};

/// NumPy's and Python's generator states as Determined seeds them (`np.random.seed(seed)`,
/// `random.seed(seed)`), in the layouts `np.random.get_state()` and `random.getstate()` return,
/// written with primitives only (a list, not an ndarray) so that `torch.load(weights_only=True)` reads them.
DETTRIAL_INLINE c10::IValue numpy_seeded_state(std::uint64_t seed);
DETTRIAL_INLINE c10::IValue python_random_seeded_state(std::uint64_t seed);

}  // namespace detail

/**
 * @brief Loads a checkpoint's models into a trial's wrapped models, for evaluation or inference
 * without training: build the trial (`Trainer<T> trainer(context)`), then
 * `dettrial::load_models(path, context)`. `path` is a checkpoint directory, or a directory holding
 * checkpoints (the latest is taken). Names and shapes are checked before anything is copied.
 */
DETTRIAL_INLINE CheckpointInfo load_models(const std::filesystem::path& path, Context& context);

/// Loads model `index` of a checkpoint into a bare module (no trial needed), checking names and shapes.
DETTRIAL_INLINE void load_model(const std::filesystem::path& path, torch::nn::Module& module, std::size_t index = 0);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
namespace dettrial {
/// Brings device-side optimizer state (FusedAdam's step counts) into LibTorch's state before it is
/// saved: one read of the device per checkpoint.
inline void pull_device_optimizer_state(Context& c) {
  for (std::size_t i = 0; i < c.num_optimizers(); ++i)
    if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&c.optimizer(i))) capturable->pull_host_state();
}
}  // namespace dettrial

#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>
#include <functional>
namespace dettrial {

DETTRIAL_INLINE std::string TrialProgress::to_json() const {
  const auto optional = [](const auto& v) { return v ? detail::Json(*v) : detail::Json(nullptr); };
  // As strings: 64-bit seeds do not survive JSON readers that use doubles.
  const auto seed_text = [](const std::optional<std::uint64_t>& seed) {
    return seed ? detail::Json(std::to_string(*seed)) : detail::Json(nullptr);
  };
  const detail::Json j = {{"trial_id", trial_id},
                          {"batches_trained", batches_trained},
                          {"epochs_trained", epochs_trained},
                          {"last_val", last_validation},
                          {"last_ckpt", last_checkpoint},
                          {"best_validation", optional(best_validation)},
                          {"training_data_seed", seed_text(training_data_seed)},
                          {"validation_data_seed", seed_text(validation_data_seed)},
                          {"ranks", ranks},
                          {"data_ranks", data_ranks}};
  return detail::json_text(j);
}

DETTRIAL_INLINE TrialProgress TrialProgress::from_json(const std::filesystem::path& file) {
  const detail::Json n = detail::read_json_file<CheckpointError>(file);
  TrialProgress p;
  try {
    const auto integer = [&](const char* key) { return detail::json_as<std::int64_t>(detail::json_field(n, key), key); };
    // A seed is a string of digits (as written) or, from another writer, a non-negative integer.
    const auto seed = [&](const char* key) -> std::optional<std::uint64_t> {
      const detail::Json* v = detail::json_find(n, key);
      if (!v || v->is_null()) return std::nullopt;
      if (!v->is_string()) return detail::json_as<std::uint64_t>(*v, key);
      const std::string& text = v->get_ref<const std::string&>();
      std::uint64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty())
        throw detail::JsonFieldError(std::string("'") + key + "' is " + v->dump() + ", not a 64-bit seed");
      return value;
    };
    p.trial_id = integer("trial_id");
    p.batches_trained = integer("batches_trained");
    p.epochs_trained = integer("epochs_trained");
    p.last_validation = integer("last_val");
    p.last_checkpoint = integer("last_ckpt");
    if (const detail::Json* v = detail::json_find(n, "best_validation"); v && !v->is_null())
      p.best_validation = detail::json_as<double>(*v, "best_validation");
    p.training_data_seed = seed("training_data_seed");
    p.validation_data_seed = seed("validation_data_seed");
    for (const auto& [key, field] : {std::pair{"ranks", &p.ranks}, std::pair{"data_ranks", &p.data_ranks}})
      if (const detail::Json* v = detail::json_find(n, key); v && !v->is_null()) {
        *field = detail::json_as<std::int64_t>(*v, key);
        if (*field < 1) throw detail::JsonFieldError(std::string("'") + key + "' is " + v->dump() + ", not a rank count");
      }
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + file.string() + "' lacks a field or has one of the wrong type: " + e.what());
  }
  return p;
}

DETTRIAL_INLINE std::string TrialProgress::to_determined_pickle() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("trial_id", trial_id);
  d.insert("last_ckpt", std::max<std::int64_t>(last_checkpoint, 0));
  d.insert("step_id", std::int64_t{0});
  d.insert("last_val", std::max<std::int64_t>(last_validation, 0));
  d.insert("batches_trained", batches_trained);
  d.insert("epochs_trained", epochs_trained);
  return detail::pickle_bytes(d);
}

DETTRIAL_INLINE TrialProgress TrialProgress::from_determined(const std::filesystem::path& dir, const CheckpointInfo& info) {
  TrialProgress p;
  p.batches_trained = info.batches_trained;
  const std::filesystem::path file = CheckpointFolder{dir}.determined_trial_state();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return p;
  c10::IValue state;
  try {
    state = detail::unpickle(detail::read_file_bytes(file));
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read '" + file.string() + "' (Determined's trial state): " + detail::first_line(e.what()));
  }
  if (!state.isGenericDict()) throw CheckpointError("'" + file.string() + "' does not hold a dict (Determined's trial state)");
  const auto d = state.toGenericDict();
  const auto integer = [&](const char* key, std::int64_t fallback) {
    const auto it = d.find(key);
    if (it == d.end() || it->value().isNone()) return fallback;
    if (!it->value().isInt()) throw CheckpointError("'" + file.string() + "': " + key + " is not an integer");
    return it->value().toInt();
  };
  p.batches_trained = integer("batches_trained", info.batches_trained);
  p.epochs_trained = integer("epochs_trained", 0);
  p.last_validation = integer("last_val", -1);
  p.last_checkpoint = integer("last_ckpt", -1);
  p.trial_id = integer("trial_id", 0);
  if (p.batches_trained != info.batches_trained)
    throw CheckpointError("'" + file.string() + "' says " + std::to_string(p.batches_trained) +
                          " batches were trained, its metadata.json " + std::to_string(info.batches_trained) +
                          ": the checkpoint is inconsistent");
  return p;
}

namespace detail {

/// The archive key of parameter `j`'s pending gradient ("p0", "p1", ...). Formatted, not "p" +
/// std::to_string(j): GCC 12 at -O3 warns (-Wstringop-overflow) inside that concatenation's inlined
/// copy, in every program that includes this header.
DETTRIAL_INLINE std::string grad_key(std::size_t j) {
  char key[24];
  std::snprintf(key, sizeof key, "p%zu", j);
  return key;
}

DETTRIAL_INLINE c10::IValue numpy_seeded_state(std::uint64_t seed) {
  c10::impl::GenericList key(c10::AnyType::get());
  std::uint32_t x = static_cast<std::uint32_t>(seed);  // NumPy refuses seeds above 2**32-1; Determined's fit
  for (std::uint32_t i = 0; i < 624; ++i) {
    if (i > 0) x = 1812433253U * (x ^ (x >> 30)) + i;
    key.push_back(static_cast<std::int64_t>(x));
  }
  return c10::ivalue::Tuple::create({c10::IValue(std::string("MT19937")), key, std::int64_t{624}, std::int64_t{0}, 0.0});
}

DETTRIAL_INLINE c10::IValue python_random_seeded_state(std::uint64_t seed) {
  // CPython's random.seed(int): init_by_array over the seed's 32-bit words, least significant first.
  std::vector<std::uint32_t> words;
  for (std::uint64_t s = seed; s != 0 || words.empty(); s >>= 32) words.push_back(static_cast<std::uint32_t>(s));
  constexpr std::size_t n = 624;
  std::vector<std::uint32_t> mt(n);
  mt[0] = 19650218U;
  for (std::uint32_t i = 1; i < n; ++i) mt[i] = 1812433253U * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
  std::size_t i = 1, j = 0;
  for (std::size_t k = std::max(n, words.size()); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + words[j] + static_cast<std::uint32_t>(j);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
    if (++j >= words.size()) j = 0;
  }
  for (std::size_t k = n - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - static_cast<std::uint32_t>(i);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000U;
  std::vector<c10::IValue> state;
  for (const std::uint32_t v : mt) state.emplace_back(static_cast<std::int64_t>(v));
  state.emplace_back(static_cast<std::int64_t>(n));
  return c10::ivalue::Tuple::create({c10::IValue(std::int64_t{3}), c10::ivalue::Tuple::create(std::move(state)), c10::IValue()});
}

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what) {
  const auto it = dict.find(key);
  if (it == dict.end()) throw CheckpointError(what + " has no '" + key + "'");
  return it->value();
}

DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir) {
  const std::filesystem::path file = CheckpointFolder{dir}.state_dict();
  // Determined lists no checksums: its state_dict.pth is read as it is.
  const std::string bytes =
      read_checkpoint_info(dir, /*verify_files=*/false).by_determined ? read_file_bytes(file) : read_checked_file(dir, layout::state_dict);
  // Objects of types dettrial does not read are kept marked: an optimizer's or scheduler's state that
  // holds one is refused as that part (load_python_layout), which --resume-fresh-parts can start fresh.
  const c10::IValue top = unpickle_archive(bytes, file, UnreadObjects::mark);
  if (!top.isGenericDict()) throw CheckpointError("checkpoint file '" + file.string() + "' does not hold a dict");
  for (const auto& entry : top.toGenericDict()) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(a key that is not a name)");
    if (key == "optimizers_state_dict" || key == "lr_schedulers_state_dict") continue;
    if (const auto type = python_object_type(entry.value()))
      throw CheckpointError("checkpoint file '" + file.string() + "': '" + key + "' holds a Python object of type '" + *type +
                            "', which dettrial does not read");
  }
  return top.toGenericDict();
}

DETTRIAL_INLINE StateDict ContextCheckpoint::python_state(Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank,
                                                          const std::vector<torch::Tensor>& gpu_rng_per_rank) {
  pull_device_optimizer_state(c);
  c10::impl::GenericList models(c10::AnyType::get());
  for (const auto& m : c.models()) models.push_back(module_state_dict(*m));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) optimizers.push_back(optimizer_state_dict(c.optimizer(i)));
  c10::impl::GenericList schedulers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    const WrappedScheduler& s = c.lr_scheduler(i);
    StateDict d(c10::StringType::get(), c10::AnyType::get());
    if (s.python_state) {  // dettrial::optim's schedulers write Python's own state dict
      s.python_state(s.scheduler, d);
    } else if (const std::int64_t steps = s.steps_taken(s.scheduler); steps >= 0) {
      // Python schedulers step once when built: LibTorch's k steps are Python's last_epoch k.
      d.insert("last_epoch", steps);
      d.insert("_step_count", steps + 1);
    }
    schedulers.push_back(d);
  }
  StateDict rng(c10::StringType::get(), c10::AnyType::get());
  rng.insert("cpu_rng_state", at::detail::getDefaultCPUGenerator().get_state());
  if (!cpu_rng_per_rank.empty()) {  // a data-parallel job: each rank's own state, in rank order
    c10::impl::GenericList states(c10::AnyType::get());
    for (const auto& t : cpu_rng_per_rank) states.push_back(t);
    rng.insert("cpu_rng_states", states);
  }
  if (c.device().is_cuda()) rng.insert("gpu_rng_state", at::globalContext().defaultGenerator(c.device()).get_state());
  if (!gpu_rng_per_rank.empty()) {  // each rank's GPU generator, in rank order (dettrial's field)
    c10::impl::GenericList states(c10::AnyType::get());
    for (const auto& t : gpu_rng_per_rank) states.push_back(t);
    rng.insert("gpu_rng_states", states);
  }
  // NumPy's and Python's generators, which Determined restores (and requires): carried from the
  // Determined checkpoint this run continues, else as Determined seeds them with the trial seed.
  const c10::IValue& carried = c.position().python_generators;
  const bool carry = carried.isGenericDict();
  rng.insert("np_rng_state", carry ? carried.toGenericDict().at("np_rng_state") : numpy_seeded_state(c.get_trial_seed()));
  rng.insert("random_rng_state", carry ? carried.toGenericDict().at("random_rng_state") : python_random_seeded_state(c.get_trial_seed()));
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("models_state_dict", models);
  out.insert("optimizers_state_dict", optimizers);
  out.insert("lr_schedulers_state_dict", schedulers);
  out.insert("rng_state", rng);
  if (c.scaler()) out.insert("scaler_state_dict", c.scaler()->state_dict());  // Determined's key
  return out;
}

DETTRIAL_INLINE std::string NativeState::bytes() {
  std::string out;
  archive.save_to([&](const void* data, std::size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  return out;
}

DETTRIAL_INLINE std::optional<NativeState> ContextCheckpoint::native_state(Context& c, bool with_grads, const TensorKeeper& keep) {
  pull_device_optimizer_state(c);
  NativeState out;
  bool any = false;
  out.archive.write("format", c10::IValue(checkpoint_format_version));
  torch::serialize::OutputArchive optimizers;
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) {
    if (python_layout_holds(c.optimizer(i))) continue;
    torch::serialize::OutputArchive one;
    c.optimizer(i).save(one);
    // LibTorch's optimizer load restores the per-parameter state but not the groups' options
    // (learning rate, momentum, ...), which schedulers change: they are saved beside it.
    torch::serialize::OutputArchive groups;
    const auto& param_groups = c.optimizer(i).param_groups();
    for (std::size_t g = 0; g < param_groups.size(); ++g) {
      torch::serialize::OutputArchive options;
      param_groups[g].options().serialize(options);
      groups.write(std::to_string(g), options);
    }
    one.write("dettrial_group_options", groups);
    optimizers.write(std::to_string(i), one);
    any = out.holds_live_state = true;
  }
  out.archive.write("optimizers", optimizers);
  torch::serialize::OutputArchive schedulers;
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    if (c.lr_scheduler(i).load_python_state) continue;
    torch::serialize::OutputArchive one;
    c.lr_scheduler(i).save(c.lr_scheduler(i).scheduler, one);
    schedulers.write(std::to_string(i), one);
    any = true;
  }
  out.archive.write("schedulers", schedulers);
  if (with_grads) {
    // By position: the models were checked entry by entry before these are read back.
    torch::serialize::OutputArchive grads;
    for (std::size_t i = 0; i < c.models().size(); ++i) {
      torch::serialize::OutputArchive model;
      const auto params = c.models()[i]->parameters();
      for (std::size_t j = 0; j < params.size(); ++j)
        if (params[j].grad().defined()) model.write(detail::grad_key(j), keep(params[j].grad()), /*is_buffer=*/true);
      grads.write(std::to_string(i), model);
    }
    out.archive.write("grads", grads);
    any = true;
  }
  if (!any) return std::nullopt;
  return out;
}

DETTRIAL_INLINE void ContextCheckpoint::load_models(Context& c, const StateDict& top, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const c10::IValue& models = require_entry(top, "models_state_dict", what);
  if (!models.isList()) throw CheckpointError(what + ": 'models_state_dict' is not a list");
  const auto list = models.toList();
  if (list.size() != c.models().size())
    throw CheckpointError(what + " holds " + std::to_string(list.size()) + " model(s), but the trial wraps " +
                          std::to_string(c.models().size()));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const c10::IValue entry = list.get(i);
    if (!entry.isGenericDict()) throw CheckpointError(what + ": model " + std::to_string(i) + " is not a state dict");
    // A model Determined wrapped in DistributedDataParallel saved its names under `module.`.
    load_module_state_dict(*c.models()[i], unwrapped(entry.toGenericDict()), what + ", model " + std::to_string(i) + ",");
  }
}

DETTRIAL_INLINE std::uint64_t ContextCheckpoint::new_rank_seed(const torch::Tensor& chiefs_state, std::int64_t rank) {
  const torch::Tensor bytes = chiefs_state.contiguous().to(torch::kCPU);
  const std::uint32_t crc = crc32_of({static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()});  // the checksum checkpoints use
  return mix64(crc ^ (static_cast<std::uint64_t>(rank) * golden_gamma)) >> 1;
}

DETTRIAL_INLINE void ContextCheckpoint::load_rng(Context& c, const StateDict& top, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const c10::IValue& rng = require_entry(top, "rng_state", what);
  if (!rng.isGenericDict()) throw CheckpointError(what + ": 'rng_state' is not a dict");
  const StateDict states = rng.toGenericDict();
  // This rank's own state from a job's per-rank list; the chief's on rank 0. A rank the checkpoint's
  // job did not have (a run resumed on more ranks) starts a stream of its own, seeded from the
  // chief's saved state and its rank: different on every rank and at every checkpoint, and the same
  // however often the checkpoint is resumed.
  const auto rank = static_cast<std::size_t>(c.distributed().rank);
  const auto restore = [&](at::Generator generator, const char* per_rank_key, const torch::Tensor& chiefs) {
    const auto per_rank = states.find(per_rank_key);
    const bool listed = per_rank != states.end() && per_rank->value().isList() && rank < per_rank->value().toList().size();
    if (listed) return set_generator_state(generator, per_rank->value().toList().get(rank).toTensor());
    if (rank == 0) return set_generator_state(generator, chiefs);
    std::lock_guard lock(generator.mutex());
    generator.set_current_seed(new_rank_seed(chiefs, c.distributed().rank));
  };
  restore(at::detail::getDefaultCPUGenerator(), "cpu_rng_states", require_entry(states, "cpu_rng_state", what + "'s rng_state").toTensor());
  if (const auto gpu = states.find("gpu_rng_state"); gpu != states.end() && c.device().is_cuda())
    restore(at::globalContext().defaultGenerator(c.device()), "gpu_rng_states", gpu->value().toTensor());
  // NumPy's and Python's states are kept to be written back (dettrial draws from neither), as
  // primitives: an ndarray Determined wrote becomes a list, which NumPy's set_state takes.
  const auto np = states.find("np_rng_state");
  const auto py = states.find("random_rng_state");
  if (np == states.end() || py == states.end()) return;
  auto np_state = np->value().isTuple() ? np->value().toTupleRef().elements().vec() : std::vector<c10::IValue>{};
  if (np_state.size() == 5 && np_state[1].isTensor()) {
    c10::impl::GenericList key(c10::AnyType::get());
    const torch::Tensor k = np_state[1].toTensor().to(torch::kLong).contiguous();
    for (std::int64_t i = 0; i < k.numel(); ++i) key.push_back(k.data_ptr<std::int64_t>()[i]);
    np_state[1] = key;
  }
  c10::impl::GenericDict carried(c10::StringType::get(), c10::AnyType::get());
  carried.insert("np_rng_state", c10::ivalue::Tuple::create(std::move(np_state)));
  carried.insert("random_rng_state", py->value());
  c.position().python_generators = carried;
}

/// Refuses a part of a checkpoint that holds an object of a type dettrial does not read, naming the part.
DETTRIAL_INLINE void refuse_unread_objects(const c10::IValue& part, const std::string& name) {
  if (const auto type = python_object_type(part))
    throw CheckpointError(name + " holds a Python object of type '" + *type + "', which dettrial does not read");
}

/// The optimizer's type as a message names it ("SGD", "Adam", ...), from its options.
DETTRIAL_INLINE std::string optimizer_type_name(torch::optim::Optimizer& optimizer) {
  if (optimizer.param_groups().empty()) return "an optimizer";
  const char* name = python_optimizer_detail::kind_of(optimizer.param_groups()[0].options()).name;
  return name ? name : "an optimizer of another type";
}

DETTRIAL_INLINE void ContextCheckpoint::load_python_layout(Context& c, const StateDict& top, const std::filesystem::path& file,
                                                           bool fresh_parts, torch::serialize::InputArchive* native) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const std::string native_what = "checkpoint file '" + (file.parent_path() / layout::libtorch_state).string() + "'";
  const auto part = [&](const std::string& name, const std::function<void()>& load) {
    try {
      load();
    } catch (const CheckpointError& e) {
      if (!fresh_parts)
        throw CheckpointError(std::string(e.what()) + "\n(to continue with " + name +
                              " as the trial makes it, fresh, resume with --resume-fresh-parts)");
      std::fprintf(stderr, "dettrial: warning: %s starts fresh: %s\n", name.c_str(), first_line(e.what()).c_str());
    }
  };
  const auto list_of = [&](const char* key, std::size_t expected, const char* things) {
    const auto it = top.find(key);
    if (it == top.end() || !it->value().isList()) throw CheckpointError(what + " has no list '" + key + "' (Determined's layout)");
    const auto list = it->value().toList();
    if (list.size() != expected)
      throw CheckpointError(what + " holds " + std::to_string(list.size()) + " " + things + ", but the trial wraps " +
                            std::to_string(expected));
    return list;
  };
  // The archive's section for part `index` of `section`. Only a part Python's layout cannot hold
  // is read from it: format 1 archived every part, and LibTorch's archive of one version need not
  // read back in another, where Python's layout does.
  const auto archived = [&](const char* section, std::size_t index, torch::serialize::InputArchive& one) {
    torch::serialize::InputArchive parts;
    return native && native->try_read(section, parts) && parts.try_read(std::to_string(index), one);
  };
  const auto optimizers = list_of("optimizers_state_dict", c.num_optimizers(), "optimizer(s)");
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    part("optimizer " + std::to_string(i), [&] {
      torch::serialize::InputArchive one;
      if (!python_layout_holds(c.optimizer(i)) && archived("optimizers", i, one)) return load_native_optimizer(c, i, one, native_what);
      const std::string name = what + ", optimizer " + std::to_string(i) + " (" + optimizer_type_name(c.optimizer(i)) + ")";
      refuse_unread_objects(optimizers.get(i), name);
      if (!optimizers.get(i).isGenericDict()) throw CheckpointError(name + " is not a state dict");
      load_optimizer_state_dict(c.optimizer(i), optimizers.get(i).toGenericDict(), name);
    });
  const auto schedulers = list_of("lr_schedulers_state_dict", c.num_lr_schedulers(), "LR scheduler(s)");
  for (std::size_t i = 0; i < schedulers.size(); ++i)
    part("LR scheduler " + std::to_string(i), [&] {
      const WrappedScheduler& s = c.lr_scheduler(i);
      torch::serialize::InputArchive one;
      if (!s.load_python_state && archived("schedulers", i, one)) return load_native_scheduler(c, i, one, native_what);
      const std::string name = what + ", LR scheduler " + std::to_string(i) + (s.type.empty() ? std::string() : " (" + s.type + ")");
      refuse_unread_objects(schedulers.get(i), name);
      if (!s.load_python_state)
        throw CheckpointError(name + ": the trial's scheduler cannot read Python's state (dettrial::optim's StepLR, MultiStepLR, " +
                              "ExponentialLR and ReduceLROnPlateau can; a LambdaLR or another type has no counterpart here)");
      if (!schedulers.get(i).isGenericDict()) throw CheckpointError(name + " is not a state dict");
      s.load_python_state(s.scheduler, schedulers.get(i).toGenericDict(), name);
    });
  if (native) return load_native_grads(c, *native);
  for (const auto& model : c.models())  // nothing pending: Determined checkpoints at optimizer steps
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
}

DETTRIAL_INLINE void ContextCheckpoint::set_generator_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

DETTRIAL_INLINE torch::serialize::InputArchive ContextCheckpoint::read_native(const std::string& bytes, const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read checkpoint file '" + file.string() + "': " + first_line(e.what()));
  }
  return archive;
}

DETTRIAL_INLINE void ContextCheckpoint::load_native_optimizer(Context& c, std::size_t i, torch::serialize::InputArchive& one,
                                                              const std::string& what) {
  try {
    auto& optimizer = c.optimizer(i);
    optimizer.load(one);
    torch::serialize::InputArchive groups;
    one.read("dettrial_group_options", groups);
    for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      torch::serialize::InputArchive options;
      groups.read(std::to_string(g), options);
      optimizer.param_groups()[g].options().serialize(options);
    }
    // Device-side state (FusedAdam's step counts) follows the loaded state, and learning rates the loaded options.
    if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) {
      capturable->push_device_state();
      capturable->sync_learning_rates(optimizer.param_groups());
    }
  } catch (const std::exception& e) {
    throw CheckpointError(what + ": optimizer " + std::to_string(i) + " does not match the trial's: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE void ContextCheckpoint::load_native_scheduler(Context& c, std::size_t i, torch::serialize::InputArchive& one,
                                                              const std::string& what) {
  try {
    c.lr_scheduler(i).load(c.lr_scheduler(i).scheduler, one);
  } catch (const std::exception& e) {
    throw CheckpointError(what + ": LR scheduler " + std::to_string(i) + " cannot be restored: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE void ContextCheckpoint::load_native_grads(Context& c, torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive grads;
  const bool has_grads = archive.try_read("grads", grads);
  for (std::size_t i = 0; i < c.models().size(); ++i) {
    torch::serialize::InputArchive model;
    const bool has_model = has_grads && grads.try_read(std::to_string(i), model);
    auto params = c.models()[i]->parameters();
    for (std::size_t j = 0; j < params.size(); ++j) {
      torch::Tensor g;
      if (has_model && model.try_read(detail::grad_key(j), g, /*is_buffer=*/true)) params[j].mutable_grad() = g.to(params[j].device());
      else if (params[j].grad().defined()) params[j].mutable_grad() = torch::Tensor();  // nothing was pending at the checkpoint
    }
  }
}

}  // namespace detail

DETTRIAL_INLINE CheckpointInfo load_models(const std::filesystem::path& path, Context& context) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  const CheckpointInfo info = read_checkpoint_info(dir);
  detail::ContextCheckpoint::load_models(context, detail::read_state_dict_file(dir), CheckpointFolder{dir}.state_dict());
  return info;
}

DETTRIAL_INLINE void load_model(const std::filesystem::path& path, torch::nn::Module& module, std::size_t index) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  const std::string what = "checkpoint file '" + CheckpointFolder{dir}.state_dict().string() + "'";
  const auto models = detail::require_entry(detail::read_state_dict_file(dir), "models_state_dict", what).toList();
  if (index >= models.size())
    throw CheckpointError(what + " holds " + std::to_string(models.size()) + " model(s); there is no model " + std::to_string(index));
  load_module_state_dict(module, models.get(index).toGenericDict(), what + ", model " + std::to_string(index) + ",");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/checkpoint.hpp
// ---- begin dettrial/checkpoint/checkpointer.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A fit's checkpoints as the trainer uses them: where they go, when a validation is followed
/// by one (the policy), writing one with its callbacks' states and hooks, restoring one, retention.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/vocabulary/callbacks.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The callback vocabulary: the one table of callback hooks (found at compile time) and what
/// a callback is.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/torch.h>


namespace dettrial {

/**
 * @brief The callback hooks, one type each: the table both the compile-time check and the trainer's
 * calls use. Each names the hook and the arguments the trainer passes (Determined's PyTorchCallback).
 *
 * A callback declaring a hook by name (a non-overloaded member) that cannot be called with these
 * arguments is a compile error naming the hook, never a hook silently not called.
 */
namespace hook {

// NAME: the member function; ...: the argument types the trainer passes, in order. A hook whose
// member is a template or an overload set is found by calling it, not by name.
#define DETTRIAL_DETAIL_CALLBACK_HOOK(NAME, ...)                                                                     \
  struct NAME {                                                                                                      \
    static constexpr const char* name = #NAME;                                                                       \
    using arguments = std::tuple<__VA_ARGS__>;                                                                       \
    template <class C>                                                                                               \
    static constexpr bool named_in = requires { &C::NAME; };                                                         \
    template <class C, class... A>                                                                                   \
    static consteval bool callable_with(std::tuple<A...>*) {                                                         \
      return requires(C& c, A... a) { c.NAME(std::forward<A>(a)...); };                                              \
    }                                                                                                                \
    template <class C>                                                                                               \
    static constexpr bool callable = callable_with<C>(static_cast<arguments*>(nullptr));                             \
    template <class C, class... A>                                                                                   \
    static void call(C& c, A&&... a) {                                                                               \
      c.NAME(std::forward<A>(a)...);                                                                                 \
    }                                                                                                                \
    template <class C>                                                                                               \
    static consteval bool check() {                                                                                  \
      static_assert(!named_in<C> || callable<C>,                                                                     \
                    "dettrial callback: " #NAME " is declared but cannot be called as " #NAME "(" #__VA_ARGS__ ")"); \
      return true;                                                                                                   \
    }                                                                                                                \
  };

DETTRIAL_DETAIL_CALLBACK_HOOK(on_trial_startup, std::int64_t, const std::string&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_trial_shutdown)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_epoch_start, std::int64_t)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_training_epoch_end, std::int64_t)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_epoch_start)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_epoch_end, std::span<const Metrics>)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_validation_end, const MetricValues&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_save_start, StateDict&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_write_end, const std::filesystem::path&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_upload_end, const std::string&)
DETTRIAL_DETAIL_CALLBACK_HOOK(on_checkpoint_load_start, const StateDict&)
DETTRIAL_DETAIL_CALLBACK_HOOK(load_state_dict, const c10::IValue&)
#undef DETTRIAL_DETAIL_CALLBACK_HOOK

/// `on_training_workload_end(avg_metrics[, batch_metrics])`: the one hook with two forms (the
/// per-batch metrics are kept only when a callback takes them).
struct on_training_workload_end {
  static constexpr const char* name = "on_training_workload_end";
  template <class C>
  static constexpr bool named_in = requires { &C::on_training_workload_end; };
  template <class C>
  static constexpr bool takes_batches =
      requires(C& c, const MetricValues& m, std::span<const Metrics> b) { c.on_training_workload_end(m, b); };
  template <class C>
  static constexpr bool callable = takes_batches<C> || requires(C& c, const MetricValues& m) { c.on_training_workload_end(m); };
  template <class C>
  static void call(C& c, const MetricValues& metrics, std::span<const Metrics> batches) {
    if constexpr (takes_batches<C>) c.on_training_workload_end(metrics, batches);
    else c.on_training_workload_end(metrics);
  }
  template <class C>
  static consteval bool check() {
    static_assert(
        !named_in<C> || callable<C>,
        "dettrial callback: on_training_workload_end is declared but cannot be called as "
        "on_training_workload_end(const MetricValues&) or on_training_workload_end(const MetricValues&, std::span<const Metrics>)");
    return true;
  }
};

/// `state_dict()`: a callback's state for checkpoints, anything convertible to `c10::IValue`.
struct state_dict {
  static constexpr const char* name = "state_dict";
  template <class C>
  static constexpr bool named_in = requires { &C::state_dict; };
  template <class C>
  static constexpr bool callable = requires(C& c) { c10::IValue(c.state_dict()); };
  template <class C>
  static c10::IValue call(C& c) {
    return c10::IValue(c.state_dict());
  }
  template <class C>
  static consteval bool check() {
    static_assert(!named_in<C> || callable<C>,
                  "dettrial callback: state_dict is declared but state_dict() does not return something convertible to c10::IValue");
    return true;
  }
};

/// Every hook, in the order Determined documents them.
using all = std::tuple<on_trial_startup, on_trial_shutdown, on_training_start, on_training_epoch_start, on_training_epoch_end,
                       on_training_workload_end, on_validation_start, on_validation_epoch_start, on_validation_epoch_end, on_validation_end,
                       on_checkpoint_save_start, on_checkpoint_write_end, on_checkpoint_upload_end, on_checkpoint_load_start, state_dict,
                       load_state_dict>;

}  // namespace hook

namespace detail {
template <class C, class... Hook>
consteval bool has_any_hook(std::tuple<Hook...>*) {
  return ((Hook::template named_in<C> || Hook::template callable<C>) || ...);
}
template <class C, class... Hook>
consteval bool check_hooks(std::tuple<Hook...>*) {
  return (Hook::template check<C>() && ...);
}
}  // namespace detail

/**
 * @brief A callback: any object with at least one of the hooks in dettrial::hook (Determined's
 * PyTorchCallback): `on_trial_startup(first_batch_idx, checkpoint_uuid)`, `on_trial_shutdown()`,
 * `on_training_start()`, `on_training_epoch_start(epoch_idx)`, `on_training_epoch_end(epoch_idx)`,
 * `on_training_workload_end(avg_metrics[, batch_metrics])`, `on_validation_start()`,
 * `on_validation_epoch_start()`, `on_validation_epoch_end(outputs)`, `on_validation_end(metrics)`.
 * A hook a callback does not have costs nothing. Checkpoint hooks: `on_checkpoint_save_start(StateDict&)`
 * (may add entries to state_dict.pth), `on_checkpoint_write_end(path)` (chief only),
 * `on_checkpoint_upload_end(uuid)`, `on_checkpoint_load_start(const StateDict&)`. A callback with
 * state has `state_dict()` (returning anything convertible to `c10::IValue`) and
 * `load_state_dict(const c10::IValue&)`: its state is saved under `callbacks/<name()>` (or
 * `callback_<position>`) and restored on resume.
 */
template <class C>
concept Callback = detail::has_any_hook<C>(static_cast<hook::all*>(nullptr));

}  // namespace dettrial
// ---- end dettrial/vocabulary/callbacks.hpp
// ---- begin dettrial/checkpoint/policy.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Checkpoint policies (Determined's `checkpoint_policy`) as types: whether a validation is
/// followed by a checkpoint.

#include <concepts>
#include <string_view>
#include <utility>


namespace dettrial {

namespace checkpoint_policy {
/// After every validation.
struct all {
  static constexpr std::string_view name = "all";
  static constexpr bool after_validation(bool) { return true; }
};
/// After a validation whose searcher metric is the best so far (Determined's default).
struct best {
  static constexpr std::string_view name = "best";
  static constexpr bool after_validation(bool improved) { return improved; }
};
/// Never after a validation (periodic and final checkpoints still happen).
struct none {
  static constexpr std::string_view name = "none";
  static constexpr bool after_validation(bool) { return false; }
};

/// Calls `f` with the policy type the runtime choice names (from the experiment config).
template <class F>
decltype(auto) visit(CheckpointPolicy policy, F&& f) {
  switch (policy) {
    case CheckpointPolicy::all: return std::forward<F>(f)(all{});
    case CheckpointPolicy::none: return std::forward<F>(f)(none{});
    case CheckpointPolicy::best: break;
  }
  return std::forward<F>(f)(best{});
}
}  // namespace checkpoint_policy

static_assert(CheckpointPolicyType<checkpoint_policy::all> && CheckpointPolicyType<checkpoint_policy::best> &&
              CheckpointPolicyType<checkpoint_policy::none>);

}  // namespace dettrial
// ---- end dettrial/checkpoint/policy.hpp
// ---- begin dettrial/checkpoint/snapshot.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What lets a checkpoint be written while training goes on: a snapshot of the state in host
/// memory the snapshot owns (reused from one checkpoint to the next), and the background thread that
/// writes it, one checkpoint at a time.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/**
 * @brief Copies of a checkpoint's tensors in host memory owned here. The buffers of one snapshot
 * are reused by the next (same place in the state, same shape and type), so a run's checkpoints
 * cost one host copy of the state in all, allocated at the first. A CUDA tensor goes to pinned
 * memory asynchronously; finish() waits for those copies once.
 */
class HostSnapshot {
 public:
  /// Starts a snapshot: the copies that follow reuse the last one's buffers, in order.
  void begin();
  /// `state` with every tensor replaced by its copy; dicts, lists and tuples are copied, other
  /// values shared (they are immutable). Tensors that share storage (tied weights) share one copy,
  /// so each is stored once, as torch.save stores it.
  c10::IValue take(const c10::IValue& state);
  /// One tensor's copy.
  torch::Tensor keep(const torch::Tensor& t);
  /// Ends the snapshot: waits for the copies from a device, once, before any other thread reads them.
  void finish();

  /// The host memory the snapshot holds, in bytes.
  std::size_t bytes() const;

 private:
  c10::IValue copy(const c10::IValue& v);
  torch::Tensor buffer_like(const torch::Tensor& t);

  std::vector<torch::Tensor> buffers_;
  std::size_t next_ = 0;
  bool copied_from_device_ = false;
  std::map<std::tuple<const void*, std::vector<std::int64_t>, std::vector<std::int64_t>, int>, torch::Tensor> taken_;
};

/// The bytes of the tensors in `state` (dicts, lists and tuples searched), tensors sharing storage counted once.
DETTRIAL_INLINE std::size_t tensor_bytes(const c10::IValue& state);

/// The memory the system has available for new allocations (MemAvailable), in bytes; 0 when unknown.
DETTRIAL_INLINE std::size_t available_memory();

/**
 * @brief One checkpoint write at a time on a background thread, whose failure is rethrown where it is
 * collected. Destroying it waits for a write in flight: a checkpoint begun is completed (or its
 * temporary directory removed), even when training fails.
 */
class BackgroundWrite {
 public:
  BackgroundWrite() = default;
  BackgroundWrite(BackgroundWrite&&) noexcept = default;
  BackgroundWrite& operator=(BackgroundWrite&& other) noexcept;
  ~BackgroundWrite();

  /// Runs `write` on a new thread, at a lower priority than training's (see the definition), at
  /// `pace`'s rate if it writes through it: waiting for the write (collect(), destruction) hurries it.
  void start(std::function<CheckpointInfo()> write, std::shared_ptr<WritePace> pace = nullptr);
  /// Runs `write` on this thread (a synchronous checkpoint); collect() returns what it wrote.
  void run_here(const std::function<CheckpointInfo()>& write);
  /// Whether a write was started and not yet collected.
  bool in_flight() const { return future_.valid(); }
  /// Whether that write has ended (collect() then returns at once).
  bool ended() const;
  /// Waits for the write and returns what it wrote, or rethrows its error.
  CheckpointInfo collect();

 private:
  void hurry() const {
    if (pace_) pace_->hurry();
  }
  std::future<CheckpointInfo> future_;
  std::shared_ptr<WritePace> pace_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include <sys/resource.h>
#include <unistd.h>

namespace dettrial::detail {

DETTRIAL_INLINE void HostSnapshot::begin() {
  next_ = 0;
  copied_from_device_ = false;
  taken_.clear();
}

DETTRIAL_INLINE c10::IValue HostSnapshot::take(const c10::IValue& state) { return copy(state); }

DETTRIAL_INLINE void HostSnapshot::finish() {
  if (copied_from_device_) torch::cuda::synchronize();
  copied_from_device_ = false;
  taken_.clear();
}

DETTRIAL_INLINE torch::Tensor HostSnapshot::keep(const torch::Tensor& t) {
  if (!t.defined()) return t;
  const torch::Tensor source = t.detach();
  const auto key = std::make_tuple(static_cast<const void*>(source.data_ptr()), source.sizes().vec(), source.strides().vec(),
                                   static_cast<int>(source.scalar_type()));
  if (const auto found = taken_.find(key); found != taken_.end()) return found->second;
  torch::Tensor copy;
  if (source.layout() != torch::kStrided) {
    copy = source.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);  // sparse: a copy of its own, not reused
  } else {
    copy = buffer_like(source);
    const bool from_device = source.is_cuda();
    copy.copy_(source, /*non_blocking=*/from_device);
    copied_from_device_ = copied_from_device_ || from_device;
  }
  taken_.emplace(key, copy);
  return copy;
}

DETTRIAL_INLINE std::size_t HostSnapshot::bytes() const {
  std::size_t n = 0;
  for (const auto& b : buffers_) n += b.nbytes();
  return n;
}

DETTRIAL_INLINE c10::IValue HostSnapshot::copy(const c10::IValue& v) {
  if (v.isTensor()) return keep(v.toTensor());
  if (v.isGenericDict()) {
    const auto dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    out.reserve(dict.size());
    for (const auto& entry : dict) out.insert(entry.key(), copy(entry.value()));
    return out;
  }
  if (v.isList()) {
    const auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    // By index: a c10::List's iterator yields proxies, and a reference bound through one reads as
    // dangling to GCC 13's -Wdangling-reference (get() returns the element itself, a refcount).
    for (std::size_t i = 0; i < list.size(); ++i) out.push_back(copy(list.get(i)));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : v.toTupleRef().elements()) elements.push_back(copy(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

DETTRIAL_INLINE torch::Tensor HostSnapshot::buffer_like(const torch::Tensor& t) {
  const auto options = torch::TensorOptions().dtype(t.scalar_type()).device(torch::kCPU).pinned_memory(t.is_cuda());
  if (next_ < buffers_.size()) {
    torch::Tensor& reused = buffers_[next_];
    if (reused.sizes() == t.sizes() && reused.scalar_type() == t.scalar_type() && reused.is_pinned() == t.is_cuda()) {
      ++next_;
      return reused;
    }
    reused = torch::empty(t.sizes(), options);  // the state changed shape here (an optimizer's first step): replaced
    return buffers_[next_++];
  }
  buffers_.push_back(torch::empty(t.sizes(), options));
  ++next_;
  return buffers_.back();
}

DETTRIAL_INLINE std::size_t tensor_bytes(const c10::IValue& state) {
  std::set<const void*> storages;
  std::size_t n = 0;
  const std::function<void(const c10::IValue&)> visit = [&](const c10::IValue& v) {
    if (v.isTensor()) {
      const torch::Tensor& t = v.toTensor();
      if (t.defined() && t.layout() == torch::kStrided && storages.insert(t.storage().unsafeGetStorageImpl()).second) n += t.nbytes();
    } else if (v.isGenericDict()) {
      for (const auto& entry : v.toGenericDict()) visit(entry.value());
    } else if (v.isList()) {
      const auto list = v.toList();
      for (std::size_t i = 0; i < list.size(); ++i) visit(list.get(i));  // by index, as in HostSnapshot::copy
    } else if (v.isTuple()) {
      for (const c10::IValue& element : v.toTupleRef().elements()) visit(element);
    }
  };
  visit(state);
  return n;
}

DETTRIAL_INLINE std::size_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return std::strtoull(line.c_str() + 13, nullptr, 10) * 1024;  // in kB
  return 0;
}

DETTRIAL_INLINE BackgroundWrite& BackgroundWrite::operator=(BackgroundWrite&& other) noexcept {
  if (this != &other) {
    hurry();
    if (future_.valid()) future_.wait();
    future_ = std::move(other.future_);
    pace_ = std::move(other.pace_);
  }
  return *this;
}

DETTRIAL_INLINE BackgroundWrite::~BackgroundWrite() {
  hurry();
  if (future_.valid()) future_.wait();
}

DETTRIAL_INLINE void BackgroundWrite::start(std::function<CheckpointInfo()> write, std::shared_ptr<WritePace> pace) {
  pace_ = std::move(pace);
  future_ = std::async(std::launch::async, [write = std::move(write)] {
    // Serializing, checksumming and copying into the page cache take CPU time that the step loop's
    // threads would otherwise get: the writer runs niced, so on a machine whose cores training
    // fills it takes the time training leaves (the write still ends: nice is a share, not a stop).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    return write();
  });
}

DETTRIAL_INLINE void BackgroundWrite::run_here(const std::function<CheckpointInfo()>& write) {
  std::promise<CheckpointInfo> result;
  future_ = result.get_future();
  pace_ = nullptr;
  try {
    result.set_value(write());
  } catch (...) {
    result.set_exception(std::current_exception());
  }
}

DETTRIAL_INLINE bool BackgroundWrite::ended() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

DETTRIAL_INLINE CheckpointInfo BackgroundWrite::collect() {
  hurry();
  return future_.get();
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/snapshot.hpp
// ---- begin dettrial/checkpoint/trial_checkpoint.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A trial's checkpoint as the trainer writes and restores it: the Context's state, the
/// callbacks' states, where the trial stands, and the files of Determined's layout (see
/// checkpoint.hpp). The trainer decides when; these functions decide what and how.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/// Every rank's CPU (and, on GPUs, CUDA) generator state, in rank order; empty for one process.
struct RankRngStates {
  std::vector<torch::Tensor> cpu;
  std::vector<torch::Tensor> gpu;
};

/// Gathers every rank's generator states (a collective: all ranks checkpoint at the same batches).
DETTRIAL_INLINE RankRngStates gather_rng_states(Context& c);

/// Sends the chief's checkpoint uuid to every rank (36 characters); one process keeps its own.
DETTRIAL_INLINE std::string share_uuid(Communicator* comm, const std::string& uuid);

/// state_dict.pth's dict: the Context's Python-readable state and the callbacks' states.
DETTRIAL_INLINE StateDict trial_state_dict(Context& c, const RankRngStates& rng, StateDict callback_states);

/// The callbacks' states in a checkpoint's state dict (empty when it has none).
DETTRIAL_INLINE StateDict callback_states_of(const StateDict& top);

/// `load_data.json`: what Determined records to rebuild the trial (config, hyperparameters, type).
DETTRIAL_INLINE Json load_data(const Context& c, std::string_view trial_type);

/// What a trial's checkpoint records besides the Context's state.
struct TrialCheckpointRecord {
  TrialProgress progress;
  /// The checkpoint's place among the trial's checkpoints (1 for the first).
  std::int64_t sequence = 0;
  /// Written between optimizer steps: the pending (aggregated) gradients are saved too.
  bool mid_aggregation = false;
  std::string searcher_metric;
  /// The searcher metric of a validation at this very batch, if there was one.
  std::optional<double> validation_metric;
  std::string trial_type;
};

/**
 * @brief A checkpoint taken at a boundary: its files' contents, every tensor a copy in `snapshot`'s
 * host memory, so that write_checkpoint_files may run on another thread while training changes the
 * live state.
 */
struct TakenCheckpoint {
  std::filesystem::path storage{};
  /// What list_checkpoints will say about it, but its path (known once it is written).
  CheckpointInfo info{};
  c10::IValue state_dict{};
  std::optional<NativeState> native{};
  /// `native` serialized already, when it held live state.
  std::string native_bytes{};
  std::string trial_state{}, determined_trial_state{}, load_data{}, searcher_metric{};
};

/// Takes a checkpoint of the Context (`top` is state_dict.pth's dict) into `snapshot`: on the
/// training thread, at a boundary. Without a snapshot the tensors are the live state's own, and the
/// checkpoint must be written before training goes on.
DETTRIAL_INLINE TakenCheckpoint take_checkpoint(Context& c, const std::filesystem::path& storage, const StateDict& top,
                                                const TrialCheckpointRecord& record, HostSnapshot* snapshot);

/// Writes a taken checkpoint into its storage (crash-safe: a temporary directory renamed when
/// complete) and returns what list_checkpoints will say about it. Any thread; at `pace`'s rate if given.
DETTRIAL_INLINE CheckpointInfo write_checkpoint_files(TakenCheckpoint& taken, WritePace* pace = nullptr);

/// Restores the Context's models (names and shapes checked first), optimizers, schedulers, pending
/// gradients and RNGs from checkpoint `dir`, whose state_dict.pth holds `top`. A checkpoint without
/// LibTorch's archive (one Determined wrote) restores its optimizers and schedulers from Python's
/// layout; `fresh_parts` lets a part that cannot be carried over start fresh, with a warning.
DETTRIAL_INLINE void restore_context(Context& c, const std::filesystem::path& dir, const StateDict& top, bool fresh_parts = false);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE RankRngStates gather_rng_states(Context& c) {
  RankRngStates out;
  Communicator* comm = c.communicator();
  if (!comm) return out;
  for (const torch::Tensor& state : comm->allgather(at::detail::getDefaultCPUGenerator().get_state().to(comm->device())))
    out.cpu.push_back(state.cpu());
  if (c.device().is_cuda())
    for (const torch::Tensor& state : comm->allgather(at::globalContext().defaultGenerator(c.device()).get_state().to(comm->device())))
      out.gpu.push_back(state.cpu());
  return out;
}

DETTRIAL_INLINE std::string share_uuid(Communicator* comm, const std::string& uuid) {
  if (!comm) return uuid;
  std::vector<torch::Tensor> t{torch::zeros({36}, torch::kUInt8)};
  if (comm->rank() == 0) std::memcpy(t[0].data_ptr<std::uint8_t>(), uuid.data(), std::min<std::size_t>(uuid.size(), 36));
  t[0] = t[0].to(comm->device());
  comm->broadcast(t);
  const torch::Tensor host = t[0].cpu();
  return std::string(reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>()), 36);
}

DETTRIAL_INLINE StateDict trial_state_dict(Context& c, const RankRngStates& rng, StateDict callback_states) {
  StateDict top = ContextCheckpoint::python_state(c, rng.cpu, rng.gpu);
  top.insert("callbacks", std::move(callback_states));
  return top;
}

DETTRIAL_INLINE StateDict callback_states_of(const StateDict& top) {
  if (const auto it = top.find("callbacks"); it != top.end() && it->value().isGenericDict()) return it->value().toGenericDict();
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}

DETTRIAL_INLINE Json load_data(const Context& c, std::string_view trial_type) {
  return Json{{"trial_type", "dettrial"},
              {"experiment_config", yaml_to_json(c.get_experiment_config().yaml)},
              {"hparams", yaml_to_json(c.get_hparams().yaml())},
              {"trial_cls_spec", trial_type},
              {"is_trainer", true}};
}

DETTRIAL_INLINE TakenCheckpoint take_checkpoint(Context& c, const std::filesystem::path& storage, const StateDict& top,
                                                const TrialCheckpointRecord& record, HostSnapshot* snapshot) {
  TakenCheckpoint taken{.storage = storage,
                        .info = {.uuid = new_uuid(),
                                 .batches_trained = record.progress.batches_trained,
                                 .epochs_trained = record.progress.epochs_trained,
                                 .sequence = record.sequence,
                                 .format = checkpoint_format_version,
                                 .validation_metric = record.validation_metric},
                        .trial_state = record.progress.to_json(),
                        .determined_trial_state = record.progress.to_determined_pickle(),
                        .load_data = json_text(load_data(c, record.trial_type)),
                        .searcher_metric = record.searcher_metric};
  if (!snapshot) {
    taken.state_dict = top;
    taken.native = ContextCheckpoint::native_state(c, record.mid_aggregation, [](const torch::Tensor& t) { return t; });
    return taken;
  }
  snapshot->begin();
  taken.state_dict = snapshot->take(top);
  taken.native = ContextCheckpoint::native_state(c, record.mid_aggregation, [&](const torch::Tensor& t) { return snapshot->keep(t); });
  snapshot->finish();
  if (taken.native && taken.native->holds_live_state) {
    taken.native_bytes = taken.native->bytes();
    taken.native.reset();
  }
  return taken;
}

DETTRIAL_INLINE CheckpointInfo write_checkpoint_files(TakenCheckpoint& taken, WritePace* pace) {
  CheckpointInfo info = taken.info;
  CheckpointWriter writer(taken.storage, info.uuid, pace);
  writer.add_file(layout::state_dict, [&](const CheckpointWriter::ByteSink& sink) { pickle_archive_to(taken.state_dict, sink); });
  if (taken.native)
    writer.add_file(layout::libtorch_state, [&](const CheckpointWriter::ByteSink& sink) {
      taken.native->archive.save_to([&](const void* data, std::size_t n) {
        sink(data, n);
        return n;
      });
    });
  else if (!taken.native_bytes.empty()) writer.add_file(layout::libtorch_state, taken.native_bytes);
  writer.add_file(layout::trial_state, taken.trial_state);
  writer.add_file(layout::determined_trial_state, taken.determined_trial_state);
  writer.add_file(layout::load_data, taken.load_data);
  const std::string framework = "torch-" + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                                std::to_string(TORCH_VERSION_PATCH);
  Json metadata{{"uuid", info.uuid},
                {"steps_completed", info.batches_trained},
                {"epochs_trained", info.epochs_trained},
                {"sequence", info.sequence},
                {"framework", framework},
                {"format", "pickle"},
                {"dettrial_version", DETTRIAL_VERSION_STRING},
                {"dettrial_format", info.format},
                {"searcher_metric", taken.searcher_metric},
                {"validation_metric", nullptr}};
  if (info.validation_metric) metadata["validation_metric"] = *info.validation_metric;
  info.path = writer.commit(std::move(metadata));
  return info;
}

DETTRIAL_INLINE void restore_context(Context& c, const std::filesystem::path& dir, const StateDict& top, bool fresh_parts) {
  const std::filesystem::path file = CheckpointFolder{dir}.state_dict();
  ContextCheckpoint::load_models(c, top, file);
  std::error_code ec;
  if (!std::filesystem::exists(CheckpointFolder{dir}.libtorch_state(), ec)) {
    ContextCheckpoint::load_python_layout(c, top, file, fresh_parts);  // format 2 without an archive, or Determined's
  } else {
    auto archive = ContextCheckpoint::read_native(read_checked_file(dir, layout::libtorch_state), CheckpointFolder{dir}.libtorch_state());
    ContextCheckpoint::load_python_layout(c, top, file, fresh_parts, &archive);
  }
  ContextCheckpoint::load_rng(c, top, file);
  // A checkpoint written without a scaler (fp32, or bf16) leaves a new one at its initial scale.
  if (const auto it = top.find("scaler_state_dict"); c.scaler() && it != top.end()) {
    if (!it->value().isGenericDict()) throw CheckpointError("'" + file.string() + "': scaler_state_dict is not a dict");
    c.scaler()->load_state_dict(it->value().toGenericDict());
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/trial_checkpoint.hpp

namespace dettrial::detail {

/// A callback's name in checkpoints (`callbacks/<name>` in state_dict.pth): its `name()` if it has
/// one, else `callback_<position>`.
template <class C>
std::string callback_name(const C& cb, std::size_t index) {
  if constexpr (requires { std::string(cb.name()); }) return std::string(cb.name());
  else return "callback_" + std::to_string(index);
}

/// A checkpoint the chief wrote: how long training stood still for it (taking the snapshot, or the
/// whole write when synchronous), and how long the write took from there.
struct WrittenCheckpoint {
  CheckpointInfo info;
  double seconds = 0;
  double write_seconds = 0;
};

/**
 * @brief The checkpoints of one fit (Determined's layout, crash-safe; checkpoint/ writes the files).
 * Every rank holds one: writing and restoring are collectives; the chief writes the files, keeps the
 * sequence and applies retention.
 *
 * Writing is in two steps. begin() takes the checkpoint at a boundary: the state is copied into the
 * snapshot's host memory, and a background thread serializes, checksums, writes, syncs and renames
 * while training goes on (asynchronous, the default), or does so before begin() returns. finish()
 * hands over a checkpoint once it is durable; what depends on that (its hooks, retention, the
 * report, the searcher's record) comes after. One checkpoint is in flight at most: begin() first
 * waits for the last, and that wait is counted (take_waited_seconds()).
 */
class Checkpointer {
 public:
  Checkpointer() = default;
  /// On the chief, removes what an interrupted writer left in `storage` and continues its sequence.
  Checkpointer(Context& context, std::filesystem::path storage, CheckpointPolicy policy, Retention retention, bool smaller_is_better,
               bool asynchronous = true)
      : context_(&context),
        storage_(std::move(storage)),
        after_validation_(checkpoint_policy::visit(policy, []<class P>(P) { return &P::after_validation; })),
        retention_(retention),
        smaller_is_better_(smaller_is_better),
        asynchronous_(asynchronous) {
    if (!context.distributed().is_chief()) return;
    remove_stale_entries(storage_);
    const auto existing = list_checkpoints(storage_);
    sequence_ = existing.empty() ? 0 : existing.back().sequence;
  }
  Checkpointer(Checkpointer&&) noexcept = default;
  Checkpointer& operator=(Checkpointer&&) noexcept = default;

  const std::filesystem::path& storage() const { return storage_; }

  /// Whether a validation is followed by a checkpoint, given whether it improved the searcher metric.
  bool after_validation(bool improved) const { return after_validation_(improved); }

  /**
   * @brief Takes a checkpoint of the Context's state and the callbacks' (`record.sequence` is the
   * next of this storage) and starts writing it, with on_checkpoint_save_start. A collective: every
   * rank's RNG states go to the chief, which writes. The checkpoint in flight must have been
   * finished first (finish with `wait`).
   */
  template <class Set>
  void begin(Set& callbacks, TrialCheckpointRecord record) {
    const auto started = std::chrono::steady_clock::now();
    const RankRngStates rng = gather_rng_states(*context_);
    in_flight_ = true;
    if (!context_->distributed().is_chief()) return;
    StateDict top = trial_state_dict(*context_, rng, callback_states(callbacks));
    callbacks.template call<hook::on_checkpoint_save_start>(top);
    record.sequence = ++sequence_;
    const bool background = asynchronous_ && snapshot_fits(top);
    if (!background) {
      write_.run_here([&] {
        TakenCheckpoint taken = take_checkpoint(*context_, storage_, top, record, nullptr);
        return write_checkpoint_files(taken);
      });
    } else {
      auto taken = std::make_shared<TakenCheckpoint>(take_checkpoint(*context_, storage_, top, record, &snapshot_));
      auto pace = std::make_shared<WritePace>(write_budget(started), snapshot_.bytes());
      write_.start([taken, pace] { return write_checkpoint_files(*taken, pace.get()); }, pace);
    }
    last_begun_ = started;
    taken_at_ = std::chrono::steady_clock::now();
    stood_still_ = std::chrono::duration<double>(taken_at_ - started).count();
  }

  /**
   * @brief The checkpoint in flight, once it is durable (with `wait`, waiting for it), after its
   * hooks: on_checkpoint_write_end on the chief, on_checkpoint_upload_end with its uuid on every
   * rank. A collective while a checkpoint is in flight: every rank calls it at the same places.
   * nullopt while it is still being written, and on the ranks other than the chief. A write that
   * failed is a CheckpointError on every rank, naming the file on the chief.
   */
  template <class Set>
  std::optional<WrittenCheckpoint> finish(Set& callbacks, bool wait) {
    if (!in_flight_) return std::nullopt;
    const bool chief = context_->distributed().is_chief();
    const auto asked = std::chrono::steady_clock::now();
    enum : std::int64_t { writing = 0, written = 1, failed = 2 };
    std::int64_t status = writing;
    std::optional<CheckpointInfo> info;
    std::string error;
    if (chief && (wait || write_.ended())) {
      try {
        info = write_.collect();
        status = written;
      } catch (const std::exception& e) {
        error = first_line(e.what());
        status = failed;
      }
    }
    if (Communicator* comm = context_->communicator()) status = comm->broadcast_values({status})[0];
    const auto ended = std::chrono::steady_clock::now();
    if (wait) waited_ += std::chrono::duration<double>(ended - asked).count();
    if (status == writing) return std::nullopt;
    in_flight_ = false;
    if (status == failed)
      throw CheckpointError(chief ? "the checkpoint could not be written: " + error
                                  : std::string("the chief rank could not write the checkpoint (its log says why)"));
    const std::string uuid = share_uuid(context_->communicator(), chief ? info->uuid : std::string());
    if (chief) callbacks.template call<hook::on_checkpoint_write_end>(info->path);
    callbacks.template call<hook::on_checkpoint_upload_end>(uuid);
    if (!chief) return std::nullopt;
    return WrittenCheckpoint{*info, stood_still_, std::chrono::duration<double>(ended - taken_at_).count()};
  }

  /// Waits for a write in flight without its hooks (the fit is ending, perhaps failing): the
  /// checkpoint is completed, or its failure said in a warning. Not a collective.
  void settle() noexcept {
    if (!in_flight_) return;
    in_flight_ = false;
    if (!write_.in_flight()) return;
    try {
      (void)write_.collect();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the checkpoint in flight was not written: %s\n", first_line(e.what()).c_str());
    }
  }

  /// Seconds spent waiting in finish(wait) for writes still in progress since the last call.
  double take_waited_seconds() { return std::exchange(waited_, 0.0); }

  /**
   * @brief Restores checkpoint `dir` into the Context (models, names and shapes checked first;
   * optimizers, schedulers, pending gradients, RNGs) and the callbacks that keep state. Returns the
   * names of the callbacks with state that the checkpoint has none for.
   */
  template <class Set>
  std::vector<std::string> restore(const std::filesystem::path& dir, Set& callbacks, bool fresh_parts = false) {
    const StateDict top = read_state_dict_file(dir);
    callbacks.template call<hook::on_checkpoint_load_start>(top);
    restore_context(*context_, dir, top, fresh_parts);
    const StateDict states = callback_states_of(top);
    std::vector<std::string> without_state;
    std::size_t index = 0;
    callbacks.each([&](auto& cb) {
      if constexpr (hook::load_state_dict::callable<std::remove_reference_t<decltype(cb)>>) {
        const std::string name = callback_name(cb, index);
        if (const auto found = states.find(name); found != states.end()) hook::load_state_dict::call(cb, found->value());
        else without_state.push_back(name);
      }
      ++index;
    });
    return without_state;
  }

  /// Deletes the checkpoints retention lets go; `keep_uuid` (the newest, mid-trial) is spared.
  void apply_retention(std::string_view keep_uuid) const {
    for (const CheckpointInfo& doomed : checkpoints_to_delete(list_checkpoints(storage_), retention_, smaller_is_better_, keep_uuid))
      delete_checkpoint(doomed);
  }

 private:
  template <class Set>
  static StateDict callback_states(Set& callbacks) {
    StateDict states(c10::StringType::get(), c10::AnyType::get());
    std::size_t index = 0;
    callbacks.each([&](auto& cb) {
      if constexpr (hook::state_dict::callable<std::remove_reference_t<decltype(cb)>>)
        states.insert(callback_name(cb, index), hook::state_dict::call(cb));
      ++index;
    });
    return states;
  }

  /// How long a background write may take: half the time since the last checkpoint began (or since
  /// the fit began), so that it ends well before the next, at most a minute (a checkpoint is not
  /// left undurable for long). Paced over that time, the writer takes a thin share of many steps'
  /// CPU rather than a thick share of a few; whoever waits for it hurries it.
  std::chrono::duration<double> write_budget(std::chrono::steady_clock::time_point now) const {
    return std::min(std::chrono::duration<double>(now - last_begun_) / 2, std::chrono::duration<double>(60.0));
  }

  /// Whether a snapshot of `top` fits in host memory: at most half of what the system has
  /// available. Said once when it does not: checkpoints are then written in the step loop.
  bool snapshot_fits(const StateDict& top) {
    if (snapshot_.bytes() > 0) return true;  // taken before: the memory is held already
    const std::size_t needed = tensor_bytes(top), available = available_memory();
    if (available == 0 || needed <= available / 2) return true;
    if (!said_too_large_)
      std::fprintf(stderr,
                   "dettrial: warning: a snapshot of the state takes %.1f GB and the system has %.1f GB available: checkpoints "
                   "are written in the step loop, as with checkpoint_storage.async false\n",
                   static_cast<double>(needed) / 1e9, static_cast<double>(available) / 1e9);
    said_too_large_ = true;
    return false;
  }

  Context* context_ = nullptr;
  std::filesystem::path storage_;
  bool (*after_validation_)(bool improved) = &checkpoint_policy::best::after_validation;
  Retention retention_{};
  bool smaller_is_better_ = true;
  bool asynchronous_ = true;
  std::int64_t sequence_ = 0;
  bool in_flight_ = false;
  HostSnapshot snapshot_;
  BackgroundWrite write_;
  std::chrono::steady_clock::time_point taken_at_{};
  std::chrono::steady_clock::time_point last_begun_ = std::chrono::steady_clock::now();
  double stood_still_ = 0;
  double waited_ = 0;
  bool said_too_large_ = false;
};

}  // namespace dettrial::detail
// ---- end dettrial/checkpoint/checkpointer.hpp
// ---- begin dettrial/checkpoint/load_weights.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Weights from elsewhere: a state dict Python wrote (`torch.save(model.state_dict())`), a
/// Determined or dettrial checkpoint directory (`state_dict.pth`), loaded into a model for a warm
/// start or fine-tuning, strictly or listing what does not match (Python's `strict=False`).

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>


namespace dettrial {

/// How to load weights into a model.
struct LoadWeightsOptions {
  /// Every entry of the model present in the file and none the model lacks (Python's `strict=True`);
  /// false loads what matches and lists the rest in the returned IncompatibleKeys.
  bool strict = true;
  /// Which model of a checkpoint holding several (`models_state_dict[i]`).
  std::size_t model_index = 0;
};

/// What a non-strict load left out: Python's `_IncompatibleKeys`.
struct IncompatibleKeys {
  /// Entries of the model the file has no value for (they keep their current values).
  std::vector<std::string> missing_keys;
  /// Entries of the file the model does not have (ignored).
  std::vector<std::string> unexpected_keys;
  bool empty() const { return missing_keys.empty() && unexpected_keys.empty(); }
};

/**
 * @brief One model's state dict from `path`, whatever wrote it:
 * - a checkpoint directory (Determined's or dettrial's): its `state_dict.pth`, `models_state_dict[model_index]`;
 * - a `torch.save` file of a model's `state_dict()` (tensors by name);
 * - a `torch.save` file of a dict holding one: under `models_state_dict` (Determined's layout),
 *   `model_state_dict`, `state_dict` or `model` (common Python conventions).
 * Names of a model saved wrapped in Python's DistributedDataParallel (`module.` before every name)
 * are unwrapped. Throws CheckpointError naming the file and what it holds when none of these fits.
 */
DETTRIAL_INLINE StateDict read_model_state_dict(const std::filesystem::path& path, std::size_t model_index = 0);

/**
 * @brief Copies `state` into `module`. Shapes must match for every entry both have (Python refuses
 * those too, strict or not); strictly, the names must match one for one. Nothing is copied when
 * something is refused: CheckpointError names `what` and every offending entry.
 */
DETTRIAL_INLINE IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true,
                                                 const std::string& what = "the state dict");

/**
 * @brief Loads weights written by Python, Determined or dettrial into a model, for a warm start or
 * fine-tuning (call it where the trial builds its model). Returns what a non-strict load left out.
 * @code{.cpp}
 * auto keys = dettrial::load_weights(model, "pretrained/resnet.pt", {.strict = false});
 * for (const auto& k : keys.missing_keys) std::printf("new, not loaded: %s\n", k.c_str());
 * @endcode
 */
template <ModelHandle M>
IncompatibleKeys load_weights(M& model, const std::filesystem::path& path, LoadWeightsOptions options = {}) {
  return load_state_dict(*module_of(model), read_model_state_dict(path, options.model_index), options.strict, "'" + path.string() + "'");
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

namespace dettrial {
namespace detail {

/// Whether every value of `d` is a tensor (a model's state dict, as opposed to a checkpoint's top level).
DETTRIAL_INLINE bool all_tensors(const StateDict& d) {
  for (const auto& entry : d)
    if (!entry.key().isString() || !entry.value().isTensor()) return false;
  return d.size() > 0;
}

DETTRIAL_INLINE std::string keys_text(const StateDict& d) {
  std::string out;
  std::size_t shown = 0;
  for (const auto& entry : d) {
    if (shown++ == 8) return out + ", ...";
    out += (out.empty() ? "" : ", ") + (entry.key().isString() ? "'" + entry.key().toStringRef() + "'" : std::string("(not a name)"));
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace detail

DETTRIAL_INLINE StateDict read_model_state_dict(const std::filesystem::path& path, std::size_t model_index) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError("cannot load weights: '" + path.string() + "' does not exist");
  const bool directory = fs::is_directory(path, ec);
  const fs::path file = directory ? CheckpointFolder{path}.state_dict() : path;
  if (directory && !fs::exists(file, ec))
    throw CheckpointError("cannot load weights: '" + path.string() + "' is a directory without state_dict.pth (not a checkpoint)");
  // A dettrial checkpoint lists its files' sizes and checksums: use them when they are there.
  const bool listed =
      directory && fs::exists(CheckpointFolder{path}.metadata(), ec) && fs::exists(CheckpointFolder{path}.libtorch_state(), ec);
  const std::string bytes = listed ? read_checked_file(path, layout::state_dict) : detail::read_file_bytes(file);
  const c10::IValue top = detail::unpickle_archive(bytes, file);
  if (!top.isGenericDict())
    throw CheckpointError("'" + file.string() + "' holds a " + top.tagKind() + ", not a state dict (a dict of tensors by name)");
  const StateDict dict = top.toGenericDict();
  if (detail::all_tensors(dict)) return detail::unwrapped(dict);
  if (const auto it = dict.find("models_state_dict"); it != dict.end()) {
    if (!it->value().isList()) throw CheckpointError("'" + file.string() + "': models_state_dict is not a list");
    const auto models = it->value().toList();
    if (model_index >= models.size())
      throw CheckpointError("'" + file.string() + "' holds " + std::to_string(models.size()) + " model(s); model " +
                            std::to_string(model_index) + " was asked for");
    const c10::IValue model = models.get(model_index);
    if (!model.isGenericDict() || !(detail::all_tensors(model.toGenericDict()) || model.toGenericDict().size() == 0))
      throw CheckpointError("'" + file.string() + "': models_state_dict[" + std::to_string(model_index) + "] is not a state dict");
    return detail::unwrapped(model.toGenericDict());
  }
  for (const char* key : {"model_state_dict", "state_dict", "model"})
    if (const auto it = dict.find(key); it != dict.end() && it->value().isGenericDict() && detail::all_tensors(it->value().toGenericDict()))
      return detail::unwrapped(it->value().toGenericDict());
  throw CheckpointError("'" + file.string() + "' is neither a model's state dict nor a checkpoint holding one: it has " +
                        detail::keys_text(dict) + " (expected tensors by name, or models_state_dict, model_state_dict or state_dict)");
}

DETTRIAL_INLINE IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict, const std::string& what) {
  IncompatibleKeys keys;
  std::vector<std::string> wrong_shapes;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::map<std::string, bool> used;
  for (const auto& entry : state) used[entry.key().toStringRef()] = false;
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& target) {
    const auto it = state.find(name);
    if (it == state.end() || !it->value().isTensor()) {
      keys.missing_keys.push_back(name);
      return;
    }
    used[name] = true;
    const torch::Tensor source = it->value().toTensor();
    if (source.sizes() != target.sizes()) {
      wrong_shapes.push_back("'" + name + "' is " + detail::shape_text(source.sizes()) + " in the file but " +
                             detail::shape_text(target.sizes()) + " in the model");
      return;
    }
    copies.emplace_back(target, source);
  });
  for (const auto& [name, seen] : used)
    if (!seen) keys.unexpected_keys.push_back(name);
  std::string problems;
  for (const auto& w : wrong_shapes) problems += "\n  size mismatch: " + w;
  if (strict) {
    for (const auto& k : keys.missing_keys) problems += "\n  missing from the file: '" + k + "'";
    for (const auto& k : keys.unexpected_keys) problems += "\n  not in the model: '" + k + "'";
  }
  if (!problems.empty())
    throw CheckpointError("cannot load " + what + " into the model (nothing was loaded):" + problems +
                          (strict && wrong_shapes.empty() ? "\n(load with strict = false to load the entries that match)" : ""));
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
  return keys;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/checkpoint/load_weights.hpp
// ---- begin dettrial/report/html_report.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html: one self-contained page of a run's metrics.jsonl or of a search's trials
/// (inline SVG charts, a sortable table, a few lines of inline script; nothing fetched from a
/// network, no fonts or libraries from elsewhere), written next to the data it shows.

#include <filesystem>
#include <system_error>

// ---- begin dettrial/report/html/chart.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html's charts: inline SVG line charts and scatters, with their axes, ticks and legend, and the
/// numbers as text (locale-free).

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>


namespace dettrial::detail::html {

/// One line of a chart (or one set of dots of a scatter). `points` are (x, y); a null (NaN) value
/// is not a point.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  /// Values that were null (NaN), infinite or missing: left out of `points`.
  std::size_t skipped = 0;
  /// A dot on each point (validations).
  bool marks = false;
  /// A cross on the last point: a trial the searcher stopped early.
  bool stopped = false;
  /// A CSS colour; empty: the chart's palette, by the series' position.
  std::string color;
};

/// An SVG line chart (or scatter), as svg_chart draws it.
struct Chart {
  /// The `data-chart` attribute: the metric (or field) the chart shows.
  std::string name;
  std::string title;
  std::string x_label = "batches";
  std::vector<Series> series;
  /// Dashed vertical lines at these x values, with their labels (ASHA's rungs).
  std::vector<std::pair<double, std::string>> x_marks;
  /// Dots only, in the order given (no lines).
  bool scatter = false;
  /// A logarithmic x axis (decades); points at x <= 0 are left out.
  bool log_x = false;
  bool legend = true;
};

/// Text for HTML (content and attribute values): & < > " ' escaped.
DETTRIAL_INLINE std::string escape(std::string_view text);

/// At most `max_points` of `points` (sorted by x), keeping the first, the last and, in each of
/// (max_points - 2) / 2 equal runs between them, the lowest and the highest: a line drawn through
/// them keeps the series' extremes.
DETTRIAL_INLINE std::vector<std::pair<double, double>> downsample(std::vector<std::pair<double, double>> points,
                                                                  std::size_t max_points = 2000);

/**
 * @brief The chart as an `<svg data-chart="NAME">` element: axes with tick labels, a legend, each
 * series a `<polyline data-series="NAME" data-points="N">` (N: the points drawn, at most 2000; a
 * scatter's series are `<g>` with the same attributes), its dots and crosses. A chart without any
 * finite value says so.
 */
DETTRIAL_INLINE std::string svg_chart(const Chart& chart);

}  // namespace dettrial::detail::html

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail::html {

DETTRIAL_INLINE std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- numbers as text: std::to_chars, so that a program's locale never turns SVG's '.' into ','

/// `v` with `precision` significant digits ("0.000531533", "1.5e+06").
DETTRIAL_INLINE std::string general(double v, int precision = 6) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::general, precision);
  return ec == std::errc() ? std::string(buffer, end) : std::string("?");
}

/// The shortest text that reads back as `v` (sort keys).
DETTRIAL_INLINE std::string shortest(double v) {
  if (!std::isfinite(v)) return general(v);
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  return ec == std::errc() ? std::string(buffer, end) : general(v, 17);
}

/// `v` with `decimals` digits after the point; never "-0".
DETTRIAL_INLINE std::string fixed(double v, int decimals) {
  if (!std::isfinite(v) || std::abs(v) >= 1e15) return general(v);
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::fixed, decimals);
  std::string s = ec == std::errc() ? std::string(buffer, end) : std::string("0");
  if (s.front() == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);  // rounded to zero
  return s;
}

/// A JSON value for a table cell: numbers with 6 significant digits, strings as they are.
DETTRIAL_INLINE std::string value_text(const Json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) return general(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// A JSON value as the table sorts it (`data-value`): numbers exactly, empty for null.
DETTRIAL_INLINE std::string sort_key(const Json& v) {
  if (v.is_number_float()) return shortest(v.get<double>());
  return value_text(v);
}

// ---- axes ------------------------------------------------------------------------------------

/// An axis's range and tick step; a logarithmic axis holds exponents (lo, hi, step in decades).
struct Axis {
  double lo = 0, hi = 1, step = 1;
  bool log = false;
};

/// A range that holds [min, max], from and to multiples of a round step (1, 2 or 5 times a power of
/// ten) that gives about five ticks. One value (or all equal) gets a margin around it.
DETTRIAL_INLINE Axis linear_axis(double min, double max) {
  if (!(max > min)) {
    const double pad = min == 0 ? 1 : std::abs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const double raw = (max - min) / 5;
  if (!std::isfinite(raw) || raw <= 0) return {min, max, 0, false};  // beyond round steps: the bare range
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * magnitude;
  // The tolerance keeps a bound that is a multiple of the step up to rounding (-2.2 / 0.1) from
  // growing by a whole step.
  return {std::floor(min / step + 1e-9) * step, std::ceil(max / step - 1e-9) * step, step, false};
}

/// Whole decades around [min, max] (both > 0), ticked every decade, or every few when they are many.
DETTRIAL_INLINE Axis log_axis(double min, double max) {
  double lo = std::floor(std::log10(min)), hi = std::ceil(std::log10(max));
  if (!(hi > lo)) hi = lo + 1;
  return {lo, hi, std::max(1.0, std::ceil((hi - lo) / 6)), true};
}

/// The tick values of an axis (exponents on a logarithmic one).
DETTRIAL_INLINE std::vector<double> ticks(const Axis& a) {
  if (!(a.step > 0)) return {a.lo, a.hi};
  std::vector<double> out;
  const double n = std::round((a.hi - a.lo) / a.step);
  for (int i = 0; i <= n && i <= 50; ++i) {
    double v = a.lo + i * a.step;
    if (std::abs(v) < a.step * 1e-9) v = 0;  // 0, not 1e-17
    out.push_back(v);
  }
  return out;
}

/// A tick's label, with as many decimals as the step needs (0.05 -> 2): labels differ, none is long.
DETTRIAL_INLINE std::string tick_label(double v, const Axis& a) {
  if (a.log) {
    const long e = std::lround(v);
    if (e >= -3 && e <= 4) return general(std::pow(10.0, static_cast<double>(e)));
    return "1e" + std::to_string(e);
  }
  if (v == 0) return "0";
  if (!(a.step > 0)) return general(v, 4);
  if (a.step >= 1e-4 && std::max(std::abs(a.lo), std::abs(a.hi)) < 1e7)
    return fixed(v, std::max(0, static_cast<int>(std::ceil(-std::log10(a.step) - 1e-9))));
  return general(v, std::clamp(static_cast<int>(std::ceil(std::log10(std::abs(v) / a.step))) + 1, 1, 15));
}

/// Where `v` lies on the axis, 0 (low end) to 1.
DETTRIAL_INLINE double position(double v, const Axis& a) {
  const double t = a.log ? std::log10(v) : v;
  return a.hi > a.lo ? (t - a.lo) / (a.hi - a.lo) : 0.5;
}

/// Series colours: Tableau's ten, then hues a golden angle apart.
DETTRIAL_INLINE std::string palette(std::size_t i) {
  static constexpr const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  if (i < std::size(colors)) return colors[i];
  return "hsl(" + fixed(std::fmod(static_cast<double>(i) * 137.508, 360.0), 0) + ",60%,42%)";
}

/// About how wide a label is at the charts' 12px font (UTF-8 continuation bytes are not characters).
DETTRIAL_INLINE double text_width(std::string_view text) {
  double chars = 0;
  for (const char c : text)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++chars;
  return chars * 6.8;
}

DETTRIAL_INLINE std::vector<std::pair<double, double>> downsample(std::vector<std::pair<double, double>> points, std::size_t max_points) {
  max_points = std::max<std::size_t>(max_points, 4);
  if (points.size() <= max_points) return points;
  const std::size_t inner = points.size() - 2, buckets = (max_points - 2) / 2;
  std::vector<std::pair<double, double>> out;
  out.reserve(2 + 2 * buckets);
  out.push_back(points.front());
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::size_t begin = 1 + b * inner / buckets, end = 1 + (b + 1) * inner / buckets;
    if (begin == end) continue;
    std::size_t low = begin, high = begin;
    for (std::size_t i = begin; i < end; ++i) {
      if (points[i].second < points[low].second) low = i;
      if (points[i].second > points[high].second) high = i;
    }
    out.push_back(points[std::min(low, high)]);  // in x order
    if (low != high) out.push_back(points[std::max(low, high)]);
  }
  out.push_back(points.back());
  return out;
}

/// Where a chart's parts go, in the SVG's coordinates: the plot with its axes (x0..x1, y0..y1 the
/// plotting area); the legend's rows go below plot_height.
struct ChartFrame {
  static constexpr double width = 720, plot_height = 300;
  static constexpr double x0 = 72, x1 = width - 20, y0 = 22, y1 = plot_height - 46;
  static constexpr std::size_t max_marked = 400;  // beyond this many points a series' dots would only blur its line
  static constexpr std::size_t max_legend = 100;
};

/// What a chart draws: each series' finite points, in x order (a scatter's as given), thinned, with
/// how many there were before thinning, and the bounds of all of them (and of the x marks).
struct DrawnPoints {
  std::vector<std::vector<std::pair<double, double>>> series;
  std::vector<std::size_t> totals;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  bool any = false;
};

DETTRIAL_INLINE DrawnPoints drawn_points(const Chart& chart) {
  DrawnPoints d;
  for (const Series& s : chart.series) {
    std::vector<std::pair<double, double>> points;
    for (const auto& p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second) && (!chart.log_x || p.first > 0)) points.push_back(p);
    if (!chart.scatter) std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    d.totals.push_back(points.size());
    points = downsample(std::move(points));
    for (const auto& [x, y] : points) {
      d.xmin = std::min(d.xmin, x);
      d.xmax = std::max(d.xmax, x);
      d.ymin = std::min(d.ymin, y);
      d.ymax = std::max(d.ymax, y);
    }
    d.series.push_back(std::move(points));
  }
  d.any = d.xmin <= d.xmax;
  if (d.any)  // the rungs a trial has not reached are worth seeing too
    for (const auto& mark : chart.x_marks)
      if (std::isfinite(mark.first) && (!chart.log_x || mark.first > 0)) {
        d.xmin = std::min(d.xmin, mark.first);
        d.xmax = std::max(d.xmax, mark.first);
      }
  return d;
}

DETTRIAL_INLINE std::string series_color(const Chart& chart, std::size_t i) {
  return chart.series[i].color.empty() ? palette(i) : chart.series[i].color;
}

/// One legend entry, placed.
struct LegendEntry {
  std::string label, color;
  bool marks = false, cross = false;
  double x = 0, y = 0;
};

/// The legend: entries left to right, wrapped into rows under the x axis (`*rows` of them).
DETTRIAL_INLINE std::vector<LegendEntry> legend_entries(const Chart& chart, int* rows) {
  using F = ChartFrame;
  std::vector<LegendEntry> entries;
  if (chart.legend) {
    bool stopped = false;
    for (std::size_t i = 0; i < chart.series.size(); ++i) {
      stopped = stopped || chart.series[i].stopped;
      if (i < F::max_legend) entries.push_back({chart.series[i].name, series_color(chart, i), chart.series[i].marks, false, 0, 0});
    }
    if (chart.series.size() > F::max_legend)
      entries.push_back({"and " + std::to_string(chart.series.size() - F::max_legend) + " more", "none", false, false, 0, 0});
    if (stopped) entries.push_back({"stopped early", "#444", false, true, 0, 0});
  }
  *rows = 0;
  double cursor = F::x0;
  for (LegendEntry& e : entries) {
    const double w = 28 + text_width(e.label);
    if (*rows == 0 || (cursor + w > F::width - 8 && cursor > F::x0)) {
      ++*rows;
      cursor = F::x0;
    }
    e.x = cursor;
    e.y = F::plot_height + (*rows - 1) * 18;
    cursor += w + 14;
  }
  return entries;
}

/// From data to the SVG's coordinates.
struct Scales {
  Axis ax, ay;
  double sx(double x) const { return ChartFrame::x0 + position(x, ax) * (ChartFrame::x1 - ChartFrame::x0); }
  double sy(double y) const { return ChartFrame::y1 - position(y, ay) * (ChartFrame::y1 - ChartFrame::y0); }
};

/// The grid, the tick labels and the x axis's label.
DETTRIAL_INLINE std::string svg_axes(const Chart& chart, const Scales& s) {
  using F = ChartFrame;
  const auto tick_at = [](double t, const Axis& a) { return a.hi > a.lo ? (t - a.lo) / (a.hi - a.lo) : 0.5; };
  std::string out = "<g class=\"axis\">\n";
  for (const double t : ticks(s.ay)) {
    const std::string y = fixed(F::y1 - tick_at(t, s.ay) * (F::y1 - F::y0), 1);
    out += "<line class=\"grid\" x1=\"" + fixed(F::x0, 1) + "\" x2=\"" + fixed(F::x1, 1) + "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
    out +=
        "<text x=\"" + fixed(F::x0 - 6, 1) + "\" y=\"" + y + "\" dy=\"4\" text-anchor=\"end\">" + escape(tick_label(t, s.ay)) + "</text>\n";
  }
  for (const double t : ticks(s.ax)) {
    const std::string x = fixed(F::x0 + tick_at(t, s.ax) * (F::x1 - F::x0), 1);
    out += "<line class=\"grid\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(F::y0, 1) + "\" y2=\"" + fixed(F::y1, 1) + "\"/>";
    out += "<text x=\"" + x + "\" y=\"" + fixed(F::y1 + 16, 1) + "\" text-anchor=\"middle\">" + escape(tick_label(t, s.ax)) + "</text>\n";
  }
  out += "<text class=\"label\" x=\"" + fixed((F::x0 + F::x1) / 2, 1) + "\" y=\"" + fixed(F::y1 + 34, 1) + "\" text-anchor=\"middle\">" +
         escape(chart.x_label) + (s.ax.log ? " (log scale)" : "") + "</text>\n</g>\n";
  return out;
}

/// The chart's x marks (ASHA's rungs) as dashed lines with their labels.
DETTRIAL_INLINE std::string svg_x_marks(const Chart& chart, const Scales& s) {
  using F = ChartFrame;
  std::string out;
  for (std::size_t i = 0; i < chart.x_marks.size(); ++i) {
    const auto& [at, label] = chart.x_marks[i];
    if (!std::isfinite(at) || (chart.log_x && at <= 0)) continue;
    const std::string x = fixed(s.sx(at), 1);
    out += "<g class=\"rung\"><line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fixed(F::y0, 1) + "\" y2=\"" + fixed(F::y1, 1) +
           "\" stroke-dasharray=\"5 4\"/><text x=\"" + x + "\" dx=\"3\" y=\"" + fixed(F::y0 + 11 + static_cast<double>(i % 3) * 12, 1) +
           "\">" + escape(label) + "</text><title>" + escape(label) + " at " + escape(chart.x_label) + " " + general(at) + "</title></g>\n";
  }
  return out;
}

/// Series `i`: a scatter's dots, or a line with its dots (validations, or a single point) and a
/// cross at its end when the searcher stopped it early.
DETTRIAL_INLINE std::string svg_series(const Chart& chart, std::size_t i, const std::vector<std::pair<double, double>>& points,
                                       std::size_t total, const Scales& sc) {
  const Series& s = chart.series[i];
  const std::string color = series_color(chart, i), name = escape(s.name), count = std::to_string(points.size());
  const auto tooltip = [&](const std::pair<double, double>& p) {
    return "<title>" + name + ": " + escape(chart.x_label) + " " + general(p.first) + ", " + general(p.second) + "</title>";
  };
  const auto dot = [&](const std::pair<double, double>& p, double r) {
    return "<circle cx=\"" + fixed(sc.sx(p.first), 1) + "\" cy=\"" + fixed(sc.sy(p.second), 1) + "\" r=\"" + fixed(r, 1) + "\">" +
           tooltip(p) + "</circle>";
  };
  std::string out;
  if (chart.scatter) {
    out += "<g data-series=\"" + name + "\" data-points=\"" + count + "\" fill=\"" + color + "\" fill-opacity=\"0.85\">";
    for (const auto& p : points) out += dot(p, 4.5);
    return out + "</g>\n";
  }
  out += "<polyline data-series=\"" + name + "\" data-points=\"" + count + "\" data-total=\"" + std::to_string(total) +
         "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"";
  for (const auto& [x, y] : points) out += fixed(sc.sx(x), 1) + "," + fixed(sc.sy(y), 1) + " ";
  if (!points.empty()) out.pop_back();
  out += "\"/>\n";
  // A single point draws no line: it gets its dot whatever the series.
  if ((s.marks && points.size() <= ChartFrame::max_marked) || points.size() == 1) {
    out += "<g class=\"marks\" fill=\"" + color + "\">";
    for (const auto& p : points) out += dot(p, 2.6);
    out += "</g>\n";
  }
  if (s.stopped && !points.empty()) {
    const double cx = sc.sx(points.back().first), cy = sc.sy(points.back().second);
    out += "<path class=\"cross\" stroke=\"" + color + "\" d=\"M" + fixed(cx - 5, 1) + " " + fixed(cy - 5, 1) + "L" + fixed(cx + 5, 1) +
           " " + fixed(cy + 5, 1) + "M" + fixed(cx - 5, 1) + " " + fixed(cy + 5, 1) + "L" + fixed(cx + 5, 1) + " " + fixed(cy - 5, 1) +
           "\"><title>" + name + ": stopped early at " + escape(chart.x_label) + " " + general(points.back().first) + "</title></path>\n";
  }
  return out;
}

DETTRIAL_INLINE std::string svg_legend(const std::vector<LegendEntry>& entries) {
  std::string out;
  for (const LegendEntry& e : entries) {
    const std::string mid = fixed(e.y + 9, 1);
    out += "<g class=\"legend\">";
    if (e.cross)
      out += "<path class=\"cross\" stroke=\"" + e.color + "\" d=\"M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 4, 1) + "L" +
             fixed(e.x + 15, 1) + " " + fixed(e.y + 14, 1) + "M" + fixed(e.x + 5, 1) + " " + fixed(e.y + 14, 1) + "L" + fixed(e.x + 15, 1) +
             " " + fixed(e.y + 4, 1) + "\"/>";
    else if (e.color != "none")
      out += "<line x1=\"" + fixed(e.x, 1) + "\" x2=\"" + fixed(e.x + 20, 1) + "\" y1=\"" + mid + "\" y2=\"" + mid + "\" stroke=\"" +
             e.color + "\" stroke-width=\"2\"/>";
    if (e.marks) out += "<circle cx=\"" + fixed(e.x + 10, 1) + "\" cy=\"" + mid + "\" r=\"2.6\" fill=\"" + e.color + "\"/>";
    out += "<text x=\"" + fixed(e.x + 26, 1) + "\" y=\"" + fixed(e.y + 13, 1) + "\">" + escape(e.label) + "</text></g>\n";
  }
  return out;
}

DETTRIAL_INLINE std::string svg_chart(const Chart& chart) {
  using F = ChartFrame;
  const DrawnPoints drawn = drawn_points(chart);
  int rows = 0;
  const std::vector<LegendEntry> entries = legend_entries(chart, &rows);
  const double height = F::plot_height + (rows > 0 ? rows * 18 + 6 : 0);

  std::string out = "<svg class=\"chart\" data-chart=\"" + escape(chart.name) + "\" viewBox=\"0 0 " + fixed(F::width, 0) + " " +
                    fixed(height, 0) + "\" width=\"" + fixed(F::width, 0) + "\" height=\"" + fixed(height, 0) +
                    "\" role=\"img\" aria-label=\"" + escape(chart.title.empty() ? chart.name : chart.title) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  const std::string frame = "<rect class=\"frame\" x=\"" + fixed(F::x0, 1) + "\" y=\"" + fixed(F::y0, 1) + "\" width=\"" +
                            fixed(F::x1 - F::x0, 1) + "\" height=\"" + fixed(F::y1 - F::y0, 1) + "\" fill=\"none\"/>\n";
  if (!drawn.any) {
    out += frame + "<text class=\"empty\" x=\"" + fixed((F::x0 + F::x1) / 2, 1) + "\" y=\"" + fixed((F::y0 + F::y1) / 2, 1) +
           "\" text-anchor=\"middle\">no values to plot (each is null or missing)</text>\n";
    for (std::size_t i = 0; i < chart.series.size(); ++i)  // the series are there, empty: tools count them
      out += "<polyline data-series=\"" + escape(chart.series[i].name) + "\" data-points=\"0\" points=\"\" fill=\"none\"/>\n";
  } else {
    const Scales scales{chart.log_x ? log_axis(drawn.xmin, drawn.xmax) : linear_axis(drawn.xmin, drawn.xmax),
                        linear_axis(drawn.ymin, drawn.ymax)};
    out += svg_axes(chart, scales) + svg_x_marks(chart, scales);
    for (std::size_t i = 0; i < chart.series.size(); ++i) out += svg_series(chart, i, drawn.series[i], drawn.totals[i], scales);
  }
  return out + frame + svg_legend(entries) + "</svg>\n";
}

}  // namespace dettrial::detail::html
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/html/chart.hpp
// ---- begin dettrial/report/html/page.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html's page: its frame (style, script, footer), the JSON records it reads and the table
/// cells it writes, shared by the run's and the search's pages.

#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial::detail::html {

/**
 * @brief The JSON objects of a .jsonl file, one per line (blank lines skipped). A last line that is
 * not one (torn by a crash) is skipped and `*torn` set; any other is an Error naming the file and the
 * line number.
 */
DETTRIAL_INLINE std::vector<Json> read_jsonl(const std::filesystem::path& path, bool* torn = nullptr);

}  // namespace dettrial::detail::html

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail::html {

DETTRIAL_INLINE std::vector<Json> read_jsonl(const std::filesystem::path& path, bool* torn) {
  if (torn) *torn = false;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path.string() + "'");
  std::vector<Json> out;
  // A line that is not a record is fatal only once another line follows it: the last may be torn.
  std::string bad_reason;
  std::size_t bad_line = 0, number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (bad_line != 0)
      throw Error("'" + path.string() + "' line " + std::to_string(bad_line) + " is not a JSON record (" + bad_reason +
                  "); the file is damaged: fix or delete that line");
    try {
      Json record = Json::parse(line);
      if (record.is_object()) {
        out.push_back(std::move(record));
        continue;
      }
      bad_reason = "it is " + json_kind(record) + ", not an object";
    } catch (const Json::parse_error& e) {
      const std::string what = e.what();
      const auto colon = what.find(": ");
      bad_reason = colon == std::string::npos ? what : what.substr(colon + 2);
    }
    bad_line = number;
  }
  if (in.bad()) throw Error("cannot read '" + path.string() + "'");
  if (bad_line != 0 && torn) *torn = true;
  return out;
}

// ---- the page ---------------------------------------------------------------------------------

/// The page's style: system fonts only (nothing to download).
DETTRIAL_INLINE const char* page_style() {
  return R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{padding:14px 24px;background:#fff;border-bottom:1px solid #d0d7de}
h1{font-size:20px;margin:0 0 4px;word-break:break-all}
h2{font-size:16px;margin:26px 0 8px}
main{padding:4px 24px 32px}
p{margin:4px 0}
.meta{color:#57606a}
.note{color:#9a6700}
a{color:#0969da}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:0}
figcaption{font-weight:600;margin:0 0 4px;word-break:break-all}
svg.chart{display:block;width:100%;height:auto;max-width:900px}
svg.chart text{font-size:12px;fill:#30363d}
svg.chart .label{fill:#57606a}
svg.chart .empty{fill:#9a6700}
svg.chart .grid{stroke:#eaeef2;stroke-width:1}
svg.chart .frame{stroke:#8c959f;stroke-width:1}
svg.chart .rung line{stroke:#6e7781;stroke-width:1}
svg.chart .rung text{font-size:11px;fill:#57606a}
svg.chart .cross{fill:none;stroke-width:2.2}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 9px;text-align:right;white-space:nowrap}
th{background:#eef1f4;font-weight:600}
td.text,th.text{text-align:left}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th:hover{background:#e2e6ea}
th[aria-sort=ascending]::after{content:" \25B2";font-size:10px}
th[aria-sort=descending]::after{content:" \25BC";font-size:10px}
tr.best td{background:#fff8c5}
.state-COMPLETED{color:#1a7f37}
.state-STOPPED_EARLY{color:#9a6700}
.state-ERRORED{color:#cf222e;font-weight:600}
.state-RUNNING,.state-QUEUED{color:#0969da}
.scroll{overflow-x:auto}
pre{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;overflow:auto;font-size:12px}
details{margin:8px 0}
summary{cursor:pointer}
)CSS";
}

/// The page's script: sorts the trials' table by a clicked header or by the URL's `#sort=COLUMN`
/// (or `#sort=COLUMN:desc`), then sets `document.body.dataset.ready`, which tests wait for.
DETTRIAL_INLINE const char* page_script() {
  return R"JS(
(function () {
  "use strict";
  var table = document.getElementById("trials");
  var current = null;
  function sortTable(column, descending) {
    if (!table || !table.tHead || !table.tBodies.length) return false;
    var headers = table.tHead.rows[0].cells, index = -1;
    for (var i = 0; i < headers.length; i++) {
      if (headers[i].getAttribute("data-column") === column) { index = i; break; }
    }
    if (index < 0) return false;
    var numeric = headers[index].getAttribute("data-type") === "number";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[index] ? a.cells[index].getAttribute("data-value") : null;
      var y = b.cells[index] ? b.cells[index].getAttribute("data-value") : null;
      var xMissing = x === null || x === "", yMissing = y === null || y === "";
      if (xMissing || yMissing) return xMissing === yMissing ? 0 : (xMissing ? 1 : -1);  /* blanks last */
      var order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
      return descending ? -order : order;
    });
    for (var r = 0; r < rows.length; r++) body.appendChild(rows[r]);
    for (var h = 0; h < headers.length; h++) headers[h].removeAttribute("aria-sort");
    headers[index].setAttribute("aria-sort", descending ? "descending" : "ascending");
    current = { column: column, descending: descending };
    return true;
  }
  function sortFromHash() {
    var match = /(?:^#|&)sort=([^&]*)/.exec(window.location.hash);
    if (!match) return;
    var spec = match[1], descending = false;
    try { spec = decodeURIComponent(spec); } catch (e) { /* kept as written */ }
    var colon = spec.lastIndexOf(":");
    if (colon >= 0 && /^(asc|desc)$/.test(spec.slice(colon + 1))) {
      descending = spec.slice(colon + 1) === "desc";
      spec = spec.slice(0, colon);
    }
    sortTable(spec, descending);
  }
  if (table && table.tHead) {
    var headers = table.tHead.rows[0].cells;
    for (var i = 0; i < headers.length; i++) {
      headers[i].addEventListener("click", function (event) {
        var column = event.currentTarget.getAttribute("data-column");
        var descending = !!current && current.column === column && !current.descending;
        if (sortTable(column, descending)) {
          try { history.replaceState(null, "", "#sort=" + encodeURIComponent(column) + (descending ? ":desc" : "")); } catch (e) { /* file: URLs may refuse */ }
        }
      });
    }
    window.addEventListener("hashchange", sortFromHash);
  }
  sortFromHash();
  document.body.dataset.ready = "1";
})();
)JS";
}

/// Now, for the page's footer line.
DETTRIAL_INLINE std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char text[32] = "";
  if (::gmtime_r(&now, &tm)) std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

DETTRIAL_INLINE std::string page(const std::string& title, const std::string& header, const std::string& content) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"generator\" content=\"dettrial\">\n"
         "<title>" +
         escape(title) + "</title>\n<style>" + page_style() + "</style>\n</head>\n<body>\n<header>\n" + header + "</header>\n<main>\n" +
         content + "<p class=\"meta\">Written by dettrial, " + utc_now() +
         ". Regenerate with <code>--report DIR</code>.</p>\n</main>\n<script>" + page_script() + "</script>\n</body>\n</html>\n";
}

DETTRIAL_INLINE std::string figures(const std::vector<Chart>& charts) {
  std::string out = "<div class=\"charts\">\n";
  for (const Chart& c : charts)
    out += "<figure>\n<figcaption>" + escape(c.title.empty() ? c.name : c.title) + "</figcaption>\n" + svg_chart(c) + "</figure>\n";
  return out + "</div>\n";
}

/// A config file shown as it is, folded.
DETTRIAL_INLINE std::string config_section(const std::string& name, const std::string& text) {
  if (text.empty()) return "";
  return "<details><summary>" + escape(name) + "</summary>\n<pre>" + escape(text) + "</pre>\n</details>\n";
}

DETTRIAL_INLINE std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Nested hyperparameters by their dotted names ("optimizer.lr"), in their order.
DETTRIAL_INLINE void flatten(const Json& value, const std::string& prefix, std::vector<std::pair<std::string, Json>>& out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (!prefix.empty()) {
    out.emplace_back(prefix, value);
  }
}

/// The `hyperparameters` of a config.yaml, or null when it has none or does not parse.
DETTRIAL_INLINE Json config_hyperparameters(const std::string& yaml_text) {
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    if (doc.IsMap() && doc["hyperparameters"]) return yaml_to_json(doc["hyperparameters"]);
  } catch (const std::exception&) {
    // A config that does not parse: the page shows its text without the table.
  }
  return nullptr;
}

/// A table of name/value rows (hyperparameters).
DETTRIAL_INLINE std::string value_table(const std::vector<std::pair<std::string, Json>>& rows) {
  std::string out = "<table>\n";
  for (const auto& [name, value] : rows)
    out += "<tr><th class=\"text\">" + escape(name) + "</th><td class=\"" + (value.is_string() ? "text" : "") + "\">" +
           escape(value_text(value)) + "</td></tr>\n";
  return out + "</table>\n";
}

DETTRIAL_INLINE std::optional<std::int64_t> integer_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  if (v && (v->is_number_integer() || v->is_number_unsigned())) return v->get<std::int64_t>();
  return std::nullopt;
}

DETTRIAL_INLINE std::optional<double> number_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  if (v && v->is_number() && std::isfinite(v->get<double>())) return v->get<double>();
  return std::nullopt;
}

DETTRIAL_INLINE std::string string_of(const Json& object, const char* key) {
  const Json* v = json_find(object, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

/// A table header cell the script sorts by: `column` is the name `#sort=` takes.
DETTRIAL_INLINE std::string sortable_header(const std::string& column, const std::string& label, bool numeric) {
  return "<th data-column=\"" + escape(column) + "\" data-type=\"" + (numeric ? "number" : "text") + "\"" +
         (numeric ? "" : " class=\"text\"") + " title=\"sort by " + escape(label) + "\">" + escape(label) + "</th>";
}

DETTRIAL_INLINE std::string table_cell(const Json& value, const std::string& inner_html = {}) {
  return "<td" + std::string(value.is_string() ? " class=\"text\"" : "") + " data-value=\"" + escape(sort_key(value)) + "\">" +
         (inner_html.empty() ? escape(value_text(value)) : inner_html) + "</td>";
}

DETTRIAL_INLINE Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }
DETTRIAL_INLINE Json optional_json(const std::optional<std::int64_t>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace dettrial::detail::html
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/html/page.hpp
// ---- begin dettrial/report/html/run_page.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A run's report.html: a chart per metric and per numeric field of its metrics.jsonl, the last
/// values, its hyperparameters and config.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>


namespace dettrial {

/**
 * @brief Writes `<run_dir>/report.html` from the run's `metrics.jsonl` and returns its path: one
 * chart per metric (a training metric and its validation counterpart, `loss` and `validation_loss`,
 * share one), one per other numeric field of the records (throughput, per-phase seconds, learning
 * rate), the last values, and the run's hyperparameters and config (its `config.yaml`, or the
 * latest checkpoint's `load_data.json`). A torn last line (the run stopped while writing it) is
 * skipped; a folder without metrics.jsonl, or a corrupt line before the last, is an Error naming the
 * file (and the line).
 */
DETTRIAL_INLINE std::filesystem::path write_run_report(const std::filesystem::path& run_dir);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail::html {

/// The series named `series_name` of the chart named `chart_name`, each made on first use (charts
/// and series keep the order they were first seen in).
DETTRIAL_INLINE Series& series_of(std::vector<Chart>& charts, const std::string& chart_name, const std::string& series_name) {
  auto chart = std::find_if(charts.begin(), charts.end(), [&](const Chart& c) { return c.name == chart_name; });
  if (chart == charts.end()) {
    charts.emplace_back();
    charts.back().name = chart_name;
    chart = std::prev(charts.end());
  }
  auto& list = chart->series;
  const auto found = std::find_if(list.begin(), list.end(), [&](const Series& s) { return s.name == series_name; });
  if (found != list.end()) return *found;
  list.emplace_back();
  list.back().name = series_name;
  return list.back();
}

/// A number, or a null (NaN) counted as skipped.
DETTRIAL_INLINE void add_value(Series& s, double x, const Json& value) {
  if (value.is_number()) {
    const double y = value.get<double>();
    if (std::isfinite(y)) {
      s.points.emplace_back(x, y);
      return;
    }
  }
  ++s.skipped;
}

DETTRIAL_INLINE std::string_view without_prefix(std::string_view name, std::initializer_list<std::string_view> prefixes) {
  for (const std::string_view p : prefixes)
    if (name.size() > p.size() && name.substr(0, p.size()) == p) return name.substr(p.size());
  return name;
}

/// The charts of a run's records: its metrics first (`*metric_charts` of them), then every other
/// numeric field.
DETTRIAL_INLINE std::vector<Chart> run_charts(const std::vector<Json>& records, std::size_t* metric_charts_count = nullptr) {
  // A validation metric joins the chart of the training metric of the same stem (validation_loss:
  // loss; validation_error: train_error), so the two curves compare at a glance.
  std::map<std::string, std::string, std::less<>> training_chart;  // stem -> the training metric's name
  std::set<std::string, std::less<>> training_names;
  const auto is_training = [](const Json& r) {
    const Json* type = json_find(r, "type");
    return type && type->is_string() && type->get_ref<const std::string&>() == "training";
  };
  // The records repeat their own `batches` and `epochs` among the metrics (as searchers' time
  // metrics): the x axis already shows them.
  const auto counter = [](const std::string& key) { return key == "batches" || key == "epochs"; };
  for (const Json& r : records) {
    const Json* metrics = json_find(r, "metrics");
    if (!is_training(r) || !metrics || !metrics->is_object()) continue;
    for (auto it = metrics->begin(); it != metrics->end(); ++it) {
      if (counter(it.key())) continue;
      training_names.insert(it.key());
      training_chart.try_emplace(std::string(without_prefix(it.key(), {"train_", "training_"})), it.key());
    }
  }
  std::vector<Chart> metric_charts, field_charts;
  for (const Json& r : records) {
    const Json* batches = json_find(r, "batches");
    if (!batches || !batches->is_number()) continue;  // nowhere on the x axis
    if (string_of(r, "type") == "restart") continue;  // listed under the header, not charted
    const double x = batches->get<double>();
    const bool training = is_training(r);
    const Json* type = json_find(r, "type");
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "record";
    if (const Json* metrics = json_find(r, "metrics"); metrics && metrics->is_object()) {
      for (auto it = metrics->begin(); it != metrics->end(); ++it) {
        const std::string& key = it.key();
        if (counter(key) || !(it.value().is_number() || it.value().is_null())) continue;
        std::string chart = key, series = key;
        if (!training) {
          if (const auto t = training_chart.find(without_prefix(key, {"validation_", "val_"})); t != training_chart.end())
            chart = t->second;
          if (training_names.count(key)) series = key + " (" + kind + ")";  // the same name on both sides
        }
        Series& s = series_of(metric_charts, chart, series);
        s.marks = s.marks || !training;
        add_value(s, x, it.value());
      }
    }
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string& key = it.key();
      if (key == "type" || key == "batches" || key == "epochs" || key == "metrics") continue;
      const auto add = [&](const std::string& name, const Json& value) {
        Series& s = series_of(field_charts, key, training ? name : kind + " " + name);
        s.marks = s.marks || !training;
        add_value(s, x, value);
      };
      if (it.value().is_number() || it.value().is_null()) {
        add(key, it.value());
      } else if (it.value().is_object()) {  // {"seconds": {"data": .., "train_batch": ..}}, {"lr": {"group0": ..}}
        for (auto inner = it.value().begin(); inner != it.value().end(); ++inner)
          if (inner.value().is_number() || inner.value().is_null()) add(inner.key(), inner.value());
      }
    }
  }
  for (Chart& c : field_charts) {
    if (c.name == "samples_per_second") c.title = "throughput (samples per second)";
    else if (c.name == "seconds") c.title = "seconds (per report, by phase)";
    else if (c.name == "lr" || c.name == "learning_rates") c.title = "learning rate";
  }
  if (metric_charts_count) *metric_charts_count = metric_charts.size();
  metric_charts.insert(metric_charts.end(), std::make_move_iterator(field_charts.begin()), std::make_move_iterator(field_charts.end()));
  return metric_charts;
}

/// The hyperparameters of a run: its config.yaml's, else its latest checkpoint's load_data.json's.
DETTRIAL_INLINE Json run_hyperparameters(const std::filesystem::path& dir, const std::string& config_text) {
  if (!config_text.empty()) return config_hyperparameters(config_text);
  std::error_code ec;
  std::filesystem::path newest;
  std::filesystem::file_time_type newest_time{};
  for (std::filesystem::directory_iterator it(RunFolder{dir}.checkpoints(), ec), end; !ec && it != end; it.increment(ec)) {
    const auto file = CheckpointFolder{it->path()}.load_data();
    std::error_code time_ec;
    const auto time = std::filesystem::last_write_time(file, time_ec);
    if (!time_ec && (newest.empty() || time > newest_time)) {
      newest = file;
      newest_time = time;
    }
  }
  if (newest.empty()) return nullptr;
  try {
    const Json load_data = read_json_file(newest);
    if (const Json* hparams = json_find(load_data, "hparams")) return *hparams;
  } catch (const Error&) {
    // A damaged checkpoint: the page goes without the table.
  }
  return nullptr;
}

}  // namespace dettrial::detail::html

namespace dettrial {

namespace detail::html {

/// The last value of each series of a run's charts, with its range and counts, as a table (empty
/// when no series has a value).
DETTRIAL_INLINE std::string last_values_table(const std::vector<Chart>& charts, std::size_t metric_charts) {
  std::string values;
  bool any_skipped = false;
  for (const auto& c : charts)
    for (const auto& s : c.series) any_skipped = any_skipped || s.skipped > 0;
  for (std::size_t i = 0; i < charts.size(); ++i)
    for (const auto& s : charts[i].series) {
      if (s.points.empty() && s.skipped == 0) continue;
      // A metric's name says what it is; a field's series ("data" of "seconds") needs the field's.
      const bool named = i < metric_charts || s.name.find(charts[i].name) != std::string::npos;
      values += "<tr><th class=\"text\">" + escape(named ? s.name : charts[i].name + ": " + s.name) + "</th>";
      if (s.points.empty()) {
        values += "<td></td><td></td><td></td><td></td>";
      } else {
        double low = s.points.front().second, high = low;
        for (const auto& p : s.points) {
          low = std::min(low, p.second);
          high = std::max(high, p.second);
        }
        values += "<td>" + general(s.points.back().second) + "</td><td>" + general(s.points.back().first) + "</td><td>" + general(low) +
                  "</td><td>" + general(high) + "</td>";
      }
      values += "<td>" + std::to_string(s.points.size()) + "</td>" + (any_skipped ? "<td>" + std::to_string(s.skipped) + "</td>" : "") +
                "</tr>\n";
    }
  if (values.empty()) return values;
  return "<h2>Last values</h2>\n<div class=\"scroll\"><table>\n<tr><th class=\"text\">series</th><th>last</th><th>at batch</th><th>min</th>"
         "<th>max</th><th>points</th>" +
         std::string(any_skipped ? "<th>null</th>" : "") + "</tr>\n" + values + "</table></div>\n";
}

/// The run page's header: its name and folder, how many reports it holds and how far it trained.
DETTRIAL_INLINE std::string run_header(const std::vector<Json>& records, const std::filesystem::path& absolute, bool trial_of_search,
                                       bool torn) {
  std::int64_t trainings = 0, validations = 0;
  std::optional<std::int64_t> last_batches, last_epochs;
  for (const Json& r : records) {
    const std::string type = string_of(r, "type");
    trainings += type == "training";
    validations += type == "validation";
    if (const auto b = integer_of(r, "batches")) last_batches = std::max(last_batches.value_or(*b), *b);
    if (const auto e = integer_of(r, "epochs")) last_epochs = std::max(last_epochs.value_or(*e), *e);
  }
  const std::string name = absolute.filename().string();
  std::string header = "<h1>" + escape(trial_of_search ? "trial " + name : "run " + name) + "</h1>\n<p class=\"meta\">" +
                       escape(absolute.string()) + "</p>\n<p>" + std::to_string(trainings) + " training and " +
                       std::to_string(validations) + " validation reports";
  if (last_batches) header += "; trained to batch " + std::to_string(*last_batches);
  if (last_epochs) header += " (epoch " + std::to_string(*last_epochs) + ")";
  header += ".";
  if (trial_of_search) header += " <a href=\"../../report.html\">The search</a>.";
  header += "</p>\n";
  // Restarts and resumes on another rank count: when, and on how many ranks.
  std::string restarts;
  for (const Json& r : records) {
    if (string_of(r, "type") != "restart") continue;
    const auto batches = integer_of(r, "batches"), before = integer_of(r, "ranks_before"), ranks = integer_of(r, "ranks");
    const auto count = integer_of(r, "restart");
    restarts += std::string(restarts.empty() ? "" : "; ") + "at batch " + std::to_string(batches.value_or(0)) + ", " +
                (count ? "restart " + std::to_string(*count) : std::string("resumed")) + " on " + std::to_string(ranks.value_or(0)) +
                " rank(s)" + (before && ranks && *before != *ranks ? " (the checkpoint's job had " + std::to_string(*before) + ")" : "");
  }
  if (!restarts.empty()) header += "<p class=\"meta\">Continued " + escape(restarts) + ".</p>\n";
  if (torn)
    header += "<p class=\"note\">The last line of metrics.jsonl is incomplete (the run stopped while writing it): it is left out.</p>\n";
  return header;
}

}  // namespace detail::html

DETTRIAL_INLINE std::filesystem::path write_run_report(const std::filesystem::path& run_dir) {
  namespace html = detail::html;
  using detail::Json;
  const std::filesystem::path metrics_path = RunFolder{run_dir}.metrics_log();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(metrics_path, ec))
    throw Error("'" + run_dir.string() + "' has no metrics.jsonl: nothing to report (a run's output folder has one)");
  bool torn = false;
  const std::vector<Json> records = html::read_jsonl(metrics_path, &torn);
  std::size_t metric_charts = 0;
  const std::vector<html::Chart> charts = html::run_charts(records, &metric_charts);

  std::filesystem::path absolute = std::filesystem::absolute(run_dir, ec).lexically_normal();
  if (absolute.filename().empty()) absolute = absolute.parent_path();  // "run/"
  const std::string name = absolute.filename().string();
  const bool trial_of_search = absolute.parent_path().filename() == layout::trials &&
                               (std::filesystem::exists(ExperimentFolder{absolute.parent_path().parent_path()}.events_log(), ec) ||
                                std::filesystem::exists(ExperimentFolder{absolute.parent_path().parent_path()}.summary(), ec));
  const std::string header = html::run_header(records, absolute, trial_of_search, torn);

  std::string content;
  if (records.empty()) content += "<p class=\"note\">metrics.jsonl holds no reports yet.</p>\n";
  if (!charts.empty()) content += "<h2>Charts</h2>\n" + html::figures(charts);
  content += html::last_values_table(charts, metric_charts);

  const std::string config_text = html::read_text(RunFolder{run_dir}.config());
  std::vector<std::pair<std::string, Json>> hparams;
  html::flatten(html::run_hyperparameters(run_dir, config_text), "", hparams);
  if (!hparams.empty()) content += "<h2>Hyperparameters</h2>\n" + html::value_table(hparams);
  content += html::config_section(layout::config, config_text);

  const std::filesystem::path out = RunFolder{run_dir}.report_page();
  detail::write_atomically(out, html::page((trial_of_search ? "trial " : "run ") + name, header, content));
  return out;
}
}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/html/run_page.hpp
// ---- begin dettrial/report/html/experiment_page.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A search's report.html: every trial's searcher metric on one chart with ASHA's rungs, the trials'
/// sortable table, the best metric against each hyperparameter; each trial's own page kept current.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/**
 * @brief Writes `<experiment_dir>/report.html` for a search (the folder the experiment runner
 * writes: summary.json, events.jsonl, trials/<id>/) and returns its path: every trial's searcher
 * metric on one chart, with ASHA's rungs and the trials it stopped marked; the trials' table,
 * sortable; the best metric against each numeric hyperparameter. Each trial's own page
 * (`trials/<id>/report.html`) is written where it is missing or older than its metrics, and linked.
 * Works on a search still running (from events.jsonl and the trials' folders).
 */
DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir);

namespace detail::html {

/// write_experiment_report with the search's summary given, in summary.json's form, rather than read
/// from the folder: the runner's own, while the search runs (an empty object: none).
DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary);

}  // namespace detail::html

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail::html {

/// Whether `page` is missing or older than any of `sources` (that exist).
DETTRIAL_INLINE bool stale(const std::filesystem::path& page, std::initializer_list<std::filesystem::path> sources) {
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(page, ec);
  if (ec) return true;
  for (const auto& source : sources) {
    std::error_code source_ec;
    const auto changed = std::filesystem::last_write_time(source, source_ec);
    if (!source_ec && changed >= written) return true;
  }
  return false;
}

/// Fills in what `metric`, `smaller` (and `*name`) lack from a config's `searcher:` section; a config
/// that does not parse changes nothing.
DETTRIAL_INLINE void searcher_settings(const std::string& yaml_text, std::string& metric, std::optional<bool>& smaller,
                                       std::string* name = nullptr) {
  if (yaml_text.empty() || (!metric.empty() && smaller && (!name || !name->empty()))) return;
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    if (!doc.IsMap() || !doc["searcher"] || !doc["searcher"].IsMap()) return;
    const YAML::Node s = doc["searcher"];
    if (metric.empty() && s["metric"] && s["metric"].IsScalar()) metric = s["metric"].Scalar();
    if (name && name->empty() && s["name"] && s["name"].IsScalar()) *name = s["name"].Scalar();
    if (!smaller && s["smaller_is_better"] && s["smaller_is_better"].IsScalar()) smaller = s["smaller_is_better"].as<bool>();
  } catch (const std::exception&) {
    // The page goes without what the config would have said.
  }
}

/// One trial of a search as its page shows it.
struct TrialRow {
  std::int64_t id = 0;
  std::string state;
  std::optional<std::int64_t> batches, restarts, rung;
  std::vector<std::pair<std::string, Json>> hparams;
  std::optional<double> best, last;
  /// The searcher metric at each validation: (time metric, value).
  std::vector<std::pair<double, double>> curve;
  bool has_folder = false, has_page = false;
  std::string problem;  ///< why its own page could not be written
};

// ---- collecting: what the search's folder says, before anything is drawn ---------------------------

/// What a search's page shows.
struct SearchPage {
  std::string name;  ///< summary.json's experiment, else the folder's name
  std::filesystem::path absolute;
  std::string config_text;  ///< the experiment's config.yaml
  std::string metric, searcher, time_metric;
  MetricOrder order;  ///< the searcher metric's direction
  std::map<std::int64_t, TrialRow> rows;
  std::vector<std::string> notes;
  std::optional<std::int64_t> best_trial;
};

/// What events.jsonl says of each trial (also of trials a summary written earlier does not know yet).
struct SearchEvents {
  bool torn = false;
  std::map<std::int64_t, std::string> ended;
  std::map<std::int64_t, std::int64_t> restarts, batches, rungs;
  /// Each validation the searcher was told of: (time metric, value).
  std::map<std::int64_t, std::vector<std::pair<double, double>>> curves;
};

DETTRIAL_INLINE void rows_from_summary(const Json& summary, std::map<std::int64_t, TrialRow>& rows) {
  const Json* trials = detail::json_find(summary, "trials");
  if (!trials || !trials->is_array()) return;
  for (const Json& t : *trials) {
    const auto id = integer_of(t, "id");
    if (!id) continue;
    TrialRow& row = rows[*id];
    row.id = *id;
    row.state = string_of(t, "state");
    row.batches = integer_of(t, "batches_trained");
    row.restarts = integer_of(t, "restarts");
    row.rung = integer_of(t, "rung");
    if (const Json* h = detail::json_find(t, "hparams")) flatten(*h, "", row.hparams);
    row.best = number_of(t, "best_metric");
    row.last = number_of(t, "last_metric");
  }
}

DETTRIAL_INLINE SearchEvents read_search_events(const std::filesystem::path& events_path) {
  SearchEvents events;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(events_path, ec)) return events;
  for (const Json& e : read_jsonl(events_path, &events.torn)) {
    const auto id = integer_of(e, "trial");
    if (!id) continue;
    const std::string kind = string_of(e, "event");
    if (kind == "validation") {
      const auto value = number_of(e, "metric");
      auto time = number_of(e, "time");
      const auto batches = integer_of(e, "batches");
      if (!time && batches) time = static_cast<double>(*batches);
      if (value && time) events.curves[*id].emplace_back(*time, *value);
      if (batches) events.batches[*id] = std::max(events.batches[*id], *batches);
      if (const auto rung = integer_of(e, "rung")) {
        const auto [slot, added] = events.rungs.try_emplace(*id, *rung);
        if (!added) slot->second = std::max(slot->second, *rung);
      }
    } else if (kind == "end") {
      events.ended[*id] = string_of(e, "state");
      if (const auto r = integer_of(e, "restarts")) events.restarts[*id] = *r;
    } else if (kind == "restart") {
      if (const auto r = integer_of(e, "restarts")) events.restarts[*id] = *r;
    }
  }
  return events;
}

/// A row for each trial folder (trials/<id>/).
DETTRIAL_INLINE void rows_from_trial_folders(const std::filesystem::path& trials_dir, std::map<std::int64_t, TrialRow>& rows) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(trials_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string folder = it->path().filename().string();
    if (folder.empty() || folder.find_first_not_of("0123456789") != std::string::npos || folder.size() > 18) continue;
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    const std::int64_t id = std::stoll(folder);
    rows[id].id = id;
    rows[id].has_folder = true;
  }
}

/// The searcher metric at each validation from a trial's own records (when the event log lacks it).
DETTRIAL_INLINE void curve_from_metrics(TrialRow& row, const std::filesystem::path& metrics_log, const SearchPage& search,
                                        std::map<std::int64_t, std::int64_t>& batches) {
  try {
    for (const Json& r : read_jsonl(metrics_log)) {
      if (string_of(r, "type") != "validation") continue;
      if (const auto b = integer_of(r, "batches")) batches[row.id] = std::max(batches[row.id], *b);
      const Json* metrics = detail::json_find(r, "metrics");
      if (!metrics) continue;
      const std::optional<double> value = number_of(*metrics, search.metric.c_str());
      std::optional<double> time = number_of(*metrics, search.time_metric.c_str());
      if (!time) time = number_of(r, "batches");
      if (value && time) row.curve.emplace_back(*time, *value);
    }
  } catch (const Error& e) {
    row.problem = e.what();
  }
}

/// Fills in what a trial's row lacks from the events and its folder, and writes the trial's own
/// page where its metrics changed since it was written.
DETTRIAL_INLINE void complete_row(TrialRow& row, const std::filesystem::path& folder, const SearchPage& search, SearchEvents& events) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const RunFolder run{folder};
  const std::int64_t id = row.id;
  if (row.state.empty()) {
    if (const auto e = events.ended.find(id); e != events.ended.end()) row.state = e->second;
    else row.state = fs::exists(run.metrics_log(), ec) ? "RUNNING" : "QUEUED";
  }
  if (!row.restarts && events.restarts.count(id)) row.restarts = events.restarts[id];
  if (!row.rung && events.rungs.count(id)) row.rung = events.rungs[id];
  if (row.hparams.empty() && row.has_folder) flatten(config_hyperparameters(read_text(run.config())), "", row.hparams);
  if (const auto c = events.curves.find(id); c != events.curves.end()) row.curve = c->second;
  const bool has_metrics = row.has_folder && fs::is_regular_file(run.metrics_log(), ec);
  if (row.curve.empty() && has_metrics && !search.metric.empty()) curve_from_metrics(row, run.metrics_log(), search, events.batches);
  // summary.json's count is at the last checkpoint; a validation may have come after it.
  if (events.batches.count(id)) row.batches = std::max(row.batches.value_or(0), events.batches[id]);
  if (!row.curve.empty()) {
    if (!row.last) row.last = row.curve.back().second;
    if (!row.best)
      for (const auto& p : row.curve)
        if (search.order.improves(p.second, row.best)) row.best = p.second;
  }
  if (has_metrics && row.problem.empty()) {
    try {
      if (stale(run.report_page(), {run.metrics_log(), run.config()})) write_run_report(folder);
    } catch (const Error& e) {
      row.problem = e.what();
    }
  }
  row.has_page = fs::is_regular_file(run.report_page(), ec);
}

/// The search's settings (summary.json's, else the config's, else a trial's), and every trial.
DETTRIAL_INLINE SearchPage collect_search(const std::filesystem::path& experiment_dir, const Json& summary) {
  namespace fs = std::filesystem;
  std::error_code ec;
  SearchPage search;
  const ExperimentFolder experiment{experiment_dir};
  const fs::path trials_dir = experiment.trials();
  search.config_text = read_text(experiment.config());
  search.metric = string_of(summary, "metric");
  search.searcher = string_of(summary, "searcher");
  std::optional<bool> smaller;
  if (const Json* s = detail::json_find(summary, "smaller_is_better"); s && s->is_boolean()) smaller = s->get<bool>();
  searcher_settings(search.config_text, search.metric, smaller, &search.searcher);
  search.time_metric = string_of(summary, "time_metric");
  if (search.time_metric.empty()) search.time_metric = "batches";
  search.absolute = fs::absolute(experiment_dir, ec).lexically_normal();
  if (search.absolute.filename().empty()) search.absolute = search.absolute.parent_path();  // "experiment/"
  search.name = string_of(summary, "experiment");
  if (search.name.empty()) search.name = search.absolute.filename().string();

  rows_from_summary(summary, search.rows);
  SearchEvents events = read_search_events(experiment.events_log());
  rows_from_trial_folders(trials_dir, search.rows);
  // A trial's config names the searcher metric too (its searcher is `single`, not the search's).
  for (const auto& [id, row] : search.rows)
    if (row.has_folder && (search.metric.empty() || !smaller))
      searcher_settings(read_text(experiment.trial(id).config()), search.metric, smaller);
  search.order = MetricOrder{smaller.value_or(true)};

  if (events.torn)
    search.notes.push_back("The last line of events.jsonl is incomplete (the runner stopped while writing it): it is left out.");
  for (auto& [id, row] : search.rows) {
    complete_row(row, trials_dir / std::to_string(id), search, events);
    if (!row.problem.empty()) search.notes.push_back("trial " + std::to_string(id) + ": " + row.problem);
  }
  search.best_trial = integer_of(summary, "best_trial");
  if (!search.best_trial)
    for (const auto& [id, row] : search.rows)
      if (row.best && (!search.best_trial || search.order.better(*row.best, *search.rows.at(*search.best_trial).best)))
        search.best_trial = id;
  if (search.best_trial && !search.rows.count(*search.best_trial)) search.best_trial.reset();
  return search;
}

// ---- rendering ---------------------------------------------------------------------------------

/// What the search is and where it stands.
DETTRIAL_INLINE std::string search_header(const SearchPage& search, const Json& summary) {
  std::map<std::string, std::int64_t> states;
  for (const auto& [id, row] : search.rows) ++states[row.state];
  std::string header = "<h1>search " + escape(search.name) + "</h1>\n<p class=\"meta\">" + escape(search.absolute.string()) + "</p>\n<p>";
  if (!search.searcher.empty()) header += "Searcher <b>" + escape(search.searcher) + "</b>";
  if (!search.metric.empty())
    header += std::string(search.searcher.empty() ? "Metric" : ", metric") + " <b>" + escape(search.metric) + "</b> (" +
              (search.order.smaller_is_better ? "smaller" : "larger") + " is better)";
  if (const auto max_trials = integer_of(summary, "max_trials"))
    header +=
        std::string(search.searcher.empty() && search.metric.empty() ? "" : "; ") + "at most " + std::to_string(*max_trials) + " trials";
  header += ".</p>\n<p>" + std::to_string(search.rows.size()) + " trial" + (search.rows.size() == 1 ? "" : "s");
  std::string counts;
  for (const auto& [state, n] : states)
    counts +=
        (counts.empty() ? "" : ", ") + std::to_string(n) + " <span class=\"state-" + escape(state) + "\">" + escape(state) + "</span>";
  if (!counts.empty()) header += ": " + counts;
  if (search.best_trial) {
    header += ". Best: trial " + std::to_string(*search.best_trial);
    if (const auto& best = search.rows.at(*search.best_trial).best) header += " (" + escape(search.metric) + " " + general(*best) + ")";
  }
  header += ".</p>\n";
  for (const auto& note : search.notes) header += "<p class=\"note\">" + escape(note) + "</p>\n";
  return header;
}

/// The searcher metric of every trial, with ASHA's rungs.
DETTRIAL_INLINE Chart search_curves(const SearchPage& search, const Json& summary, const std::map<std::int64_t, std::string>& colors) {
  Chart chart;
  chart.name = search.metric.empty() ? "searcher metric" : search.metric;
  chart.title = (search.metric.empty() ? std::string("searcher metric") : search.metric) + " at each validation, by trial";
  chart.x_label = search.time_metric;
  for (const auto& [id, row] : search.rows) {
    if (row.curve.empty()) continue;
    Series s;
    s.name = "trial " + std::to_string(id);
    s.points = row.curve;
    s.marks = true;
    s.stopped = row.state == "STOPPED_EARLY";
    s.color = colors.at(id);
    chart.series.push_back(std::move(s));
  }
  if (const Json* brackets = detail::json_find(summary, "brackets"); brackets && brackets->is_array()) {
    std::set<std::int64_t> lengths;
    for (const Json& b : *brackets)
      if (const Json* rungs = detail::json_find(b, "rungs"); rungs && rungs->is_array())
        for (const Json& r : *rungs)
          if (r.is_number_integer()) lengths.insert(r.get<std::int64_t>());
    // One bracket: its rungs by number; several: by length only (the same number means different lengths).
    const bool numbered = brackets->size() == 1;
    std::int64_t k = 0;
    for (const auto length : lengths)
      chart.x_marks.emplace_back(static_cast<double>(length), numbered ? "rung " + std::to_string(++k) : std::to_string(length));
  }
  return chart;
}

/// Every hyperparameter of the trials by its dotted name, in the order first seen.
DETTRIAL_INLINE std::vector<std::string> hyperparameter_names(const std::map<std::int64_t, TrialRow>& rows) {
  std::vector<std::string> names;
  for (const auto& [id, row] : rows)
    for (const auto& [hp, value] : row.hparams)
      if (std::find(names.begin(), names.end(), hp) == names.end()) names.push_back(hp);
  return names;
}

DETTRIAL_INLINE Json hyperparameter_of(const TrialRow& row, const std::string& hp) {
  for (const auto& [n, v] : row.hparams)
    if (n == hp) return v;
  return nullptr;
}

/// The best metric against `hp`, where it is numeric and varies (nullopt otherwise).
DETTRIAL_INLINE std::optional<Chart> hyperparameter_scatter(const SearchPage& search, const std::string& hp,
                                                            const std::map<std::int64_t, std::string>& colors) {
  const std::string metric = search.metric.empty() ? std::string("metric") : search.metric;
  Chart scatter;
  scatter.name = metric + " vs " + hp;
  scatter.title = "best " + metric + " by " + hp;
  scatter.x_label = hp;
  scatter.scatter = true;
  scatter.legend = false;
  std::set<double> values;
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const auto& [id, row] : search.rows) {
    const Json v = hyperparameter_of(row, hp);
    if (v.is_null()) continue;
    if (!v.is_number()) return std::nullopt;
    const double x = v.get<double>();
    values.insert(x);
    low = std::min(low, x);
    high = std::max(high, x);
    if (!row.best) continue;
    Series s;
    s.name = "trial " + std::to_string(id);
    s.points.emplace_back(x, *row.best);
    s.color = colors.at(id);
    scatter.series.push_back(std::move(s));
  }
  if (values.size() < 2 || scatter.series.empty()) return std::nullopt;
  scatter.log_x = low > 0 && high / low >= 100;  // learning rates and the like, drawn from log spaces
  return scatter;
}

/// The trials' table: each trial's record, each hyperparameter (by its dotted name), its metric.
DETTRIAL_INLINE std::string trials_table(const SearchPage& search, const std::vector<std::string>& hparam_names,
                                         const std::map<std::int64_t, std::string>& colors) {
  const auto& rows = search.rows;
  const bool has_rungs = std::any_of(rows.begin(), rows.end(), [](const auto& kv) { return kv.second.rung.has_value(); });
  const std::set<std::string> fixed_columns = {"trial", "state", "batches", "restarts", "rung", "best", "last"};
  std::string table = "<div class=\"scroll\"><table id=\"trials\" class=\"sortable\">\n<thead><tr>" +
                      sortable_header("trial", "trial", true) + sortable_header("state", "state", false) +
                      sortable_header("batches", "batches", true) + sortable_header("restarts", "restarts", true);
  if (has_rungs) table += sortable_header("rung", "rung", true);
  for (const auto& hp : hparam_names) {
    const bool numeric = std::all_of(rows.begin(), rows.end(), [&](const auto& kv) {
      const Json v = hyperparameter_of(kv.second, hp);
      return v.is_null() || v.is_number();
    });
    table += sortable_header(fixed_columns.count(hp) ? "hparams." + hp : hp, hp, numeric);
  }
  const std::string metric_label = search.metric.empty() ? std::string("metric") : search.metric;
  table += sortable_header("best", "best " + metric_label, true) + sortable_header("last", "last " + metric_label, true) +
           "</tr></thead>\n<tbody>\n";
  for (const auto& [id, row] : rows) {
    table +=
        "<tr data-trial=\"" + std::to_string(id) + "\"" + (search.best_trial && *search.best_trial == id ? " class=\"best\"" : "") + ">";
    const std::string link = "trials/" + std::to_string(id) + "/report.html";
    table += table_cell(Json(id), "<span style=\"color:" + colors.at(id) + "\">&#9632;</span> " +
                                      (row.has_page ? "<a href=\"" + link + "\">" + std::to_string(id) + "</a>" : std::to_string(id)));
    table += table_cell(Json(row.state), "<span class=\"state-" + escape(row.state) + "\">" + escape(row.state) + "</span>");
    table += table_cell(optional_json(row.batches)) + table_cell(optional_json(row.restarts));
    if (has_rungs)  // shown from 1, as the chart numbers them
      table += table_cell(optional_json(row.rung ? std::optional<std::int64_t>(*row.rung + 1) : std::nullopt));
    for (const auto& hp : hparam_names) table += table_cell(hyperparameter_of(row, hp));
    table += table_cell(optional_json(row.best)) + table_cell(optional_json(row.last)) + "</tr>\n";
  }
  return table + "</tbody>\n</table></div>\n";
}

DETTRIAL_INLINE std::filesystem::path write_experiment_page(const std::filesystem::path& experiment_dir, const Json& summary) {
  const SearchPage search = collect_search(experiment_dir, summary);
  std::map<std::int64_t, std::string> colors;  // one colour per trial, on every chart
  std::size_t index = 0;
  for (const auto& [id, row] : search.rows) colors[id] = palette(index++);
  std::vector<Chart> charts{search_curves(search, summary, colors)};
  const std::vector<std::string> hparam_names = hyperparameter_names(search.rows);
  for (const auto& hp : hparam_names)
    if (auto scatter = hyperparameter_scatter(search, hp, colors)) charts.push_back(std::move(*scatter));

  std::string content;
  if (search.rows.empty()) content += "<p class=\"note\">No trial has started yet.</p>\n";
  content += "<h2>Trials</h2>\n<p class=\"meta\">Click a column to sort by it; a trial's number opens its own page.</p>\n" +
             trials_table(search, hparam_names, colors);
  content += "<h2>Charts</h2>\n" + figures(charts);
  content += config_section(layout::config, search.config_text);

  const std::filesystem::path out = ExperimentFolder{experiment_dir}.report_page();
  detail::write_atomically(out, html::page("search " + search.name, search_header(search, summary), content));
  return out;
}

}  // namespace dettrial::detail::html

namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_experiment_report(const std::filesystem::path& experiment_dir) {
  std::error_code ec;
  const ExperimentFolder experiment{experiment_dir};
  const std::filesystem::path summary_path = experiment.summary();
  const bool has_summary = std::filesystem::is_regular_file(summary_path, ec);
  if (!has_summary && !std::filesystem::is_directory(experiment.trials(), ec))
    throw Error("'" + experiment_dir.string() + "' has neither summary.json nor trials/: it is not a search's folder");
  return detail::html::write_experiment_page(experiment_dir, has_summary ? detail::read_json_file(summary_path) : detail::Json::object());
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/html/experiment_page.hpp

namespace dettrial {

/// write_experiment_report for a folder with summary.json or trials/, else write_run_report for one
/// with metrics.jsonl; an Error naming the folder and what it lacks when it has neither.
DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw Error("'" + dir.string() + "' is not a folder: nothing to report");
  if (std::filesystem::is_regular_file(ExperimentFolder{dir}.summary(), ec) ||
      std::filesystem::is_directory(ExperimentFolder{dir}.trials(), ec))
    return write_experiment_report(dir);
  if (std::filesystem::is_regular_file(RunFolder{dir}.metrics_log(), ec)) return write_run_report(dir);
  throw Error("'" + dir.string() +
              "' holds no metrics.jsonl (a run's folder) and no summary.json or trials/ (a search's folder): nothing to report");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/html_report.hpp
// ---- begin dettrial/report/metrics_log.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief metrics.jsonl: one JSON object per training or validation report, for tools to read.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>


namespace dettrial {

/// Appends one line per report to `<dir>/metrics.jsonl`.
class MetricsLog {
 public:
  MetricsLog() = default;
  /**
   * Opens `<dir>/metrics.jsonl` for appending. Resuming a trial from its checkpoint at
   * `resumed_at` batches, the records written after that checkpoint (by the run that stopped
   * without checkpointing again) describe training that is about to be done again: they are
   * dropped first, with a torn last line, so that no report appears twice.
   */
  explicit MetricsLog(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at = std::nullopt);
  bool enabled() const { return out_.is_open(); }
  const std::filesystem::path& path() const { return path_; }
  /// How many records opening it for a resume dropped.
  std::size_t dropped() const { return dropped_; }

  /// The `"batches"` of a metrics.jsonl record, or nullopt for one without an integer `"batches"`.
  static std::optional<std::int64_t> batches_of_record(const detail::Json& record);
  /// The `"batches"` of one metrics.jsonl line, or nullopt for a line that is not a complete record
  /// (one torn by a crash does not parse).
  static std::optional<std::int64_t> batches_of(std::string_view line);

  /// `{"type":"training"|"validation"|"checkpoint","batches":N,"epochs":E,<extra's fields>,"metrics":{...}}`,
  /// one compact line (`metrics` left out when empty and `extra` has fields of its own).
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, const detail::Json& extra);
  /// The same record without extra fields.
  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics);

 private:
  /// Rewrites the file (a new file renamed over it) without the records past `batches`.
  std::size_t drop_records_after(std::int64_t batches);

  std::filesystem::path path_;
  std::ofstream out_;
  std::size_t dropped_ = 0;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE MetricsLog::MetricsLog(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at)
    : path_(RunFolder{dir}.metrics_log()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create output directory '" + dir.string() + "': " + ec.message());
  if (resumed_at && std::filesystem::exists(path_, ec)) dropped_ = drop_records_after(*resumed_at);
  out_.open(path_, std::ios::app);
  if (!out_) throw Error("cannot write '" + path_.string() + "'");
}

DETTRIAL_INLINE std::optional<std::int64_t> MetricsLog::batches_of_record(const detail::Json& record) {
  const detail::Json* batches = detail::json_find(record, "batches");
  if (!batches || !batches->is_number_integer()) return std::nullopt;
  return batches->get<std::int64_t>();
}

DETTRIAL_INLINE std::optional<std::int64_t> MetricsLog::batches_of(std::string_view line) {
  const detail::Json record = detail::Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return std::nullopt;
  return batches_of_record(record);
}

DETTRIAL_INLINE void MetricsLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics) {
  write(type, batches, epochs, metrics, detail::Json::object());
}

DETTRIAL_INLINE void MetricsLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics,
                                       const detail::Json& extra) {
  if (!out_.is_open()) return;
  detail::Json record = {{"type", std::string(type)}, {"batches", batches}, {"epochs", epochs}};
  for (const auto& [key, value] : extra.items()) record[key] = value;
  if (!metrics.empty() || extra.empty()) {
    detail::Json values = detail::Json::object();
    for (const auto& [name, value] : metrics) values[name] = value;  // NaN is written as null
    record["metrics"] = std::move(values);
  }
  out_ << detail::json_line(record);
  out_.flush();
}

DETTRIAL_INLINE std::size_t MetricsLog::drop_records_after(std::int64_t batches) {
  std::ifstream in(path_, std::ios::binary);
  std::string kept, line;
  std::size_t dropped = 0;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // the last line without its newline is torn
    const auto at = batches_of(line);
    if (complete && at && *at <= batches) kept += line + "\n";
    else ++dropped;
  }
  if (dropped == 0) return 0;
  const std::filesystem::path temporary = path_.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw Error("cannot write '" + temporary.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path_, ec);
  if (ec) throw Error("cannot replace '" + path_.string() + "': " + ec.message());
  return dropped;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/metrics_log.hpp
// ---- begin dettrial/report/profiler.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LibTorch's profiler over training batches on a `torch.profiler.schedule`: set by
/// `Context::set_profiler` (each cycle's trace where TensorBoard's profile plugin reads it), or by
/// the config's `profiling` section (one range of batches, `trace.json`, for Perfetto or chrome://tracing).

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>


namespace dettrial::detail {

/// Where a profiler's traces go: one file (the `profiling` section's `trace.json`), or one file a
/// cycle in a folder, named as TensorBoard's profile plugin lists them
/// (`<folder>/<host>_<pid>.<milliseconds>.pt.trace.json`, as `tensorboard_trace_handler` names them).
struct TraceFiles {
  std::filesystem::path path;
  bool one_a_cycle = false;
};

/**
 * @brief LibTorch's profiler on a `torch.profiler.schedule` (see ProfilerOptions): operators on the
 * CPU, and kernels on the GPU where LibTorch has Kineto and the trial runs on CUDA.
 *
 * Step k is training batch `first_step_batch + k`. Before each batch the schedule's action decides:
 * warm up (the profiler prepared, nothing kept), record (on, with the batch inside a
 * `ProfilerStep#k` range, as Python's `profiler.step()` marks it), or nothing; after the last active
 * batch of a cycle the trace is written. Outside the recorded steps it costs an integer division a
 * batch. A cycle still open when training ends or stops is written then.
 */
class TraceProfiler {
 public:
  TraceProfiler() = default;
  TraceProfiler(ProfilerOptions options, std::int64_t first_step_batch, TraceFiles files, bool cuda)
      : options_(std::move(options)), first_step_batch_(first_step_batch), files_(std::move(files)), cuda_(cuda), enabled_(true) {}
  /// The config's `profiling` section as a schedule: the global batches `begin_on_batch` to
  /// `end_after_batch` (unset: to the end of training) recorded in one cycle, into `trace`. A resumed
  /// run inside the range records the rest of it.
  static TraceProfiler for_section(const ExperimentConfig::Profiling& section, std::filesystem::path trace, bool cuda) {
    ProfilerOptions o;
    o.record_shapes = true;
    o.schedule = {.wait = 0,
                  .warmup = 0,
                  .active = section.end_after_batch ? std::max<std::int64_t>(*section.end_after_batch - section.begin_on_batch + 1, 1)
                                                    : std::numeric_limits<std::int64_t>::max() / 4,
                  .repeat = 1,
                  .skip_first = section.begin_on_batch};
    return TraceProfiler(std::move(o), 0, TraceFiles{std::move(trace), false}, cuda);
  }
  // Moved only before it starts (the trainer's set-up); a moved-from profiler never stops LibTorch's.
  TraceProfiler(TraceProfiler&& o) noexcept { *this = std::move(o); }
  TraceProfiler& operator=(TraceProfiler&& o) noexcept {
    options_ = std::move(o.options_);
    first_step_batch_ = o.first_step_batch_;
    files_ = std::move(o.files_);
    cuda_ = o.cuda_;
    enabled_ = o.enabled_;
    prepared_ = std::exchange(o.prepared_, false);
    running_ = std::exchange(o.running_, false);
    first_batch_ = o.first_batch_;
    step_range_ = std::move(o.step_range_);
    written_ = std::move(o.written_);
    summary_ = std::move(o.summary_);
    return *this;
  }
  ~TraceProfiler();

  /// Before batch `batch_idx` trains: warms up, starts recording, or marks the next recorded step.
  void before_batch(std::int64_t batch_idx) {
    if (!enabled_) return;
    const ProfilerAction action = action_at(batch_idx);
    if (action == ProfilerAction::none) return;
    if (!prepared_ && !running_) prepare();
    if (action == ProfilerAction::warmup) return;
    if (!running_) start(batch_idx);
    open_step(batch_idx - first_step_batch_);
  }
  /// Whether before_batch(batch_idx) would start recording.
  bool starts_at(std::int64_t batch_idx) const {
    if (!enabled_ || running_) return false;
    const ProfilerAction action = action_at(batch_idx);
    return action == ProfilerAction::record || action == ProfilerAction::record_and_save;
  }
  /// After batch `batch_idx` trained: writes the cycle's trace after its last active step. True when
  /// it wrote one (summary() says where).
  bool after_batch(std::int64_t batch_idx) {
    if (!running_) return false;
    step_range_.reset();
    if (action_at(batch_idx) != ProfilerAction::record_and_save) return false;
    stop(batch_idx);
    return true;
  }
  /// Training ended or stopped after batch `last_batch`: writes the open cycle's trace. True when it wrote one.
  bool finish(std::int64_t last_batch) {
    step_range_.reset();
    if (!running_) {
      if (prepared_) discard();
      return false;
    }
    stop(last_batch);
    return true;
  }
  bool running() const { return running_; }
  /// The last trace written.
  const std::optional<std::filesystem::path>& written() const { return written_; }
  /// What happened, for the run's log ("profiled batches 5-9: trace.json (Kineto)").
  const std::string& summary() const { return summary_; }

 private:
  ProfilerAction action_at(std::int64_t batch_idx) const {
    const std::int64_t step = batch_idx - first_step_batch_;
    return step < 0 ? ProfilerAction::none : profiler_action(options_.schedule, step);
  }
  void prepare();
  void start(std::int64_t batch_idx);
  void open_step(std::int64_t step);
  void stop(std::int64_t batch_idx);
  void discard();
  std::filesystem::path next_trace_path() const;

  ProfilerOptions options_{};
  std::int64_t first_step_batch_ = 0;
  TraceFiles files_{};
  bool cuda_ = false;
  bool enabled_ = false;
  bool prepared_ = false;
  bool running_ = false;
  std::int64_t first_batch_ = 0;
  std::unique_ptr<at::RecordFunction> step_range_;
  std::optional<std::filesystem::path> written_{};
  std::string summary_{};
};

/// Writes a Chrome trace of `result`'s events ourselves: for LibTorch builds without Kineto, whose
/// `ProfilerResult::save` refuses (Debian's 1.13). Complete events ("ph":"X") in microseconds.
DETTRIAL_INLINE void write_chrome_trace(const torch::autograd::profiler::ProfilerResult& result, const std::filesystem::path& path);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

namespace dettrial::detail {

DETTRIAL_INLINE TraceProfiler::~TraceProfiler() {
  // A fit that throws inside a cycle leaves the profiler on this thread: turn it off, no trace.
  step_range_.reset();
  if (running_ || prepared_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }
}

namespace profiler_detail {
inline torch::profiler::impl::ProfilerConfig config_of(const ProfilerOptions& o) {
  namespace impl = torch::profiler::impl;
  return impl::ProfilerConfig(impl::ProfilerState::KINETO, o.record_shapes, o.profile_memory, o.with_stack, o.with_flops, o.with_modules);
}
inline std::set<torch::profiler::impl::ActivityType> activities_of(const ProfilerOptions& o, bool cuda) {
  namespace impl = torch::profiler::impl;
  std::set<impl::ActivityType> out;
  for (const ProfilerActivity a : o.activities) {
    if (a == ProfilerActivity::cpu) out.insert(impl::ActivityType::CPU);
    if (a == ProfilerActivity::cuda && cuda) out.insert(impl::ActivityType::CUDA);
  }
  if (out.empty()) out.insert(impl::ActivityType::CPU);  // CUDA asked for on a CPU run: the CPU's operators
  return out;
}
}  // namespace profiler_detail

DETTRIAL_INLINE void TraceProfiler::prepare() {
  torch::autograd::profiler::prepareProfiler(profiler_detail::config_of(options_), profiler_detail::activities_of(options_, cuda_));
  prepared_ = true;
}

DETTRIAL_INLINE void TraceProfiler::start(std::int64_t batch_idx) {
  if (!prepared_) prepare();
  torch::autograd::profiler::enableProfiler(profiler_detail::config_of(options_), profiler_detail::activities_of(options_, cuda_));
  running_ = true;
  first_batch_ = batch_idx;
}

DETTRIAL_INLINE void TraceProfiler::open_step(std::int64_t step) {
  // Python's profiler.step() marks each step with a ProfilerStep#<n> range; TensorBoard's profile
  // plugin splits a trace into steps by them.
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) {
    const std::string name = "ProfilerStep#" + std::to_string(step);
    step_range_->before(name.c_str(), c10::ArrayRef<const c10::IValue>{});
  }
}

DETTRIAL_INLINE void TraceProfiler::discard() {
  // Warmed up for a cycle that training ended before: off, nothing kept.
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {
  }
  prepared_ = false;
}

DETTRIAL_INLINE std::filesystem::path TraceProfiler::next_trace_path() const {
  if (!files_.one_a_cycle) return files_.path;
  // tensorboard_trace_handler's names: <host>_<pid>.<milliseconds since the epoch>.pt.trace.json.
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const std::string worker = std::string(host) + "_" + std::to_string(::getpid());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::filesystem::path path;
  std::error_code ec;
  do {
    path = files_.path / (worker + "." + std::to_string(ms++) + ".pt.trace.json");
  } while (std::filesystem::exists(path, ec));
  return path;
}

DETTRIAL_INLINE void TraceProfiler::stop(std::int64_t batch_idx) {
  if (cuda_) torch::cuda::synchronize();  // the last kernels belong in the trace
  // Off first, whatever follows: a profiler left on would refuse the next fit on this thread.
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  prepared_ = false;
  const std::filesystem::path trace_path = next_trace_path();
  // A trace that cannot be written is said, not thrown: the training it profiled goes on.
  try {
    std::error_code ec;
    std::filesystem::create_directories(trace_path.parent_path(), ec);
    std::string how = "Kineto";
    try {
      result->save(trace_path.string());
    } catch (const c10::Error&) {
      // Without Kineto, save() refuses; the events are there all the same.
      write_chrome_trace(*result, trace_path);
      how = "LibTorch's profiler without Kineto: CPU operators";
    }
    written_ = trace_path;
    summary_ = "profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) + ": " + trace_path.string() + " (" +
               std::to_string(result->events().size()) + " events; " + how + ")";
  } catch (const std::exception& e) {
    summary_ = "warning: profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) +
               ", but the trace could not be written to " + trace_path.string() + ": " + e.what();
  }
}

/// An event's start and duration in microseconds: LibTorch 2.x counts nanoseconds, 1.13 microseconds.
template <class Event>
std::pair<double, double> event_span_us(const Event& e) {
  if constexpr (requires { e.startNs(); }) return {static_cast<double>(e.startNs()) / 1000.0, static_cast<double>(e.durationNs()) / 1000.0};
  else return {static_cast<double>(e.startUs()), static_cast<double>(e.durationUs())};
}

DETTRIAL_INLINE void write_chrome_trace(const torch::autograd::profiler::ProfilerResult& result, const std::filesystem::path& path) {
  nlohmann::json events = nlohmann::json::array();
  const auto pid = static_cast<std::int64_t>(::getpid());
  for (const auto& e : result.events()) {
    const auto [start_us, duration_us] = event_span_us(e);
    const bool on_gpu = e.deviceType() == c10::DeviceType::CUDA;
    events.push_back({{"ph", "X"},
                      {"name", e.name()},
                      {"cat", on_gpu ? "kernel" : "cpu_op"},
                      {"ts", start_us},
                      {"dur", duration_us},
                      {"pid", pid},
                      {"tid", static_cast<std::int64_t>(e.startThreadId())}});
  }
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", {{"writer", "dettrial"}}}};
  detail::write_atomically(path, trace.dump());
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/profiler.hpp
// ---- begin dettrial/report/progress.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the user sees: a live progress line with rate and ETA on a terminal, plain report
/// lines otherwise.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>


namespace dettrial {

/// Where reports go and whether a live progress line is drawn.
struct ReportOptions {
  /// Draw a live progress line: unset means only when stdout is a terminal.
  std::optional<bool> live_progress;
  /// Print report lines at all.
  bool quiet = false;
};

namespace detail {

DETTRIAL_INLINE std::string format_duration(double seconds);

DETTRIAL_INLINE std::string format_metrics(const MetricValues& metrics);

/// Prints reports; draws the live line on terminals, throttled to a few updates a second.
class Progress {
 public:
  using clock = std::chrono::steady_clock;

  Progress() : Progress(ReportOptions{}) {}
  explicit Progress(ReportOptions options);

  /// Starts a phase ("train", "validate") of `total` units (0 when unknown).
  void begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit);

  /// Cheap per-batch call: draws at most every 200 ms, only on terminals.
  void update(std::int64_t done);

  /// Prints one report line (clearing the live line first).
  void line(const std::string& text);

  /// Seconds since begin().
  double elapsed() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

 private:
  bool quiet_;
  bool live_;
  bool drawn_ = false;
  std::string phase_, unit_;
  std::int64_t start_done_ = 0, total_ = 0;
  clock::time_point start_, next_draw_;
};

}  // namespace detail
}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

DETTRIAL_INLINE std::string format_metrics(const MetricValues& metrics) {
  std::string s;
  char buf[64];
  for (const auto& [name, value] : metrics) {
    std::snprintf(buf, sizeof buf, "%.6g", value);
    s += "  " + name + " " + (std::isfinite(value) ? std::string(buf) : std::string("n/a"));
  }
  return s;
}

DETTRIAL_INLINE Progress::Progress(ReportOptions options)
    : quiet_(options.quiet), live_(!options.quiet && options.live_progress.value_or(isatty(fileno(stdout)) == 1)) {}

DETTRIAL_INLINE void Progress::begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit) {
  phase_ = phase;
  unit_ = unit;
  start_done_ = done;
  total_ = total;
  start_ = clock::now();
  next_draw_ = start_;
}

DETTRIAL_INLINE void Progress::update(std::int64_t done) {
  if (!live_) return;
  const auto now = clock::now();
  if (now < next_draw_) return;
  next_draw_ = now + std::chrono::milliseconds(200);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done - start_done_) / elapsed : 0.0;
  char buf[256];
  if (total_ > 0) {
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : NAN;
    std::snprintf(buf, sizeof buf, "\r\033[K%s %3.0f%% %lld/%lld %s  %.1f %s/s  ETA %s", phase_.c_str(),
                  100.0 * static_cast<double>(done) / static_cast<double>(total_), static_cast<long long>(done),
                  static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(), format_duration(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "\r\033[K%s %lld %s  %.1f %s/s", phase_.c_str(), static_cast<long long>(done), unit_.c_str(), rate,
                  unit_.c_str());
  }
  std::fputs(buf, stdout);
  std::fflush(stdout);
  drawn_ = true;
}

DETTRIAL_INLINE void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (drawn_) std::fputs("\r\033[K", stdout);
  drawn_ = false;
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/progress.hpp
// ---- begin dettrial/report/reporter.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one place a fit reports through: the terminal (progress and result lines), the run's
/// metrics.jsonl and its TensorBoard event files. Only the chief of a job writes; the other ranks
/// stay quiet.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// ---- begin dettrial/tracking/mlflow.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A run tracked in an MLflow server over its REST API (no Python in the training process):
/// its params, metrics, tags, artifacts and status, sent by a background thread so that a slow or
/// dead server never slows training. What the server does not take is kept in the run folder
/// (`mlflow-pending.jsonl`) and sent later: when it answers again, or by `--sync-mlflow DIR`.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// ---- begin dettrial/detail/folder_lock.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief One process per run folder: an advisory `flock` on a file in the folder, which the kernel
/// releases when the holding process ends, however it ends (a SIGKILLed run leaves no stale lock).

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>


namespace dettrial::detail {

/**
 * @brief The lock of a folder that this process writes into (a run's or an experiment's). A second
 * process asking for it is refused with a FolderInUseError naming the holder's pid and host. Within
 * one process the lock is shared: the command line locks a run folder before it touches it, and the
 * trainer it starts asks again and shares that lock. The lock goes when the last FolderLock of the
 * folder does, or with the process; it is not passed to child processes.
 */
class FolderLock {
 public:
  FolderLock() = default;

  /// Locks `lock_file` (created with its folder if needed), naming `what` (e.g. "run folder") in
  /// the refusal; throws FolderInUseError when another process holds it, after waiting up to
  /// `patience` for it to end (saying so once): a search's trial started anew waits for the
  /// process of a runner that died, which is checkpointing before it ends.
  static FolderLock acquire(const std::filesystem::path& lock_file, const std::string& what,
                            std::chrono::seconds patience = std::chrono::seconds(0));

  bool held() const { return static_cast<bool>(held_); }

 private:
  struct Held;
  std::shared_ptr<Held> held_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>


namespace dettrial::detail {

struct FolderLock::Held {
  int fd = -1;
  ~Held() {
    if (fd >= 0) ::close(fd);  // releases the flock
  }
};

namespace folder_lock_detail {
/// The locks this process holds, by lock file: a second acquire shares the first.
inline std::map<std::filesystem::path, std::weak_ptr<void>>& held_here() {
  static std::map<std::filesystem::path, std::weak_ptr<void>> locks;
  return locks;
}
inline std::mutex& held_here_mutex() {
  static std::mutex m;
  return m;
}

inline std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("an unknown host");
}

/// The holder's "pid N on host H", as it wrote it into the lock file.
inline std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<std::size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? std::string("another process (it has not written its pid yet)") : holder;
}
}  // namespace folder_lock_detail

DETTRIAL_INLINE FolderLock FolderLock::acquire(const std::filesystem::path& lock_file, const std::string& what,
                                               std::chrono::seconds patience) {
  namespace fl = folder_lock_detail;
  std::error_code ec;
  std::filesystem::create_directories(lock_file.parent_path(), ec);
  const std::filesystem::path key = std::filesystem::weakly_canonical(lock_file, ec);
  std::lock_guard guard(fl::held_here_mutex());
  FolderLock out;
  if (const auto found = fl::held_here().find(key); found != fl::held_here().end())
    if (auto shared = std::static_pointer_cast<Held>(found->second.lock())) {
      out.held_ = std::move(shared);
      return out;
    }
  auto held = std::make_shared<Held>();
  held->fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (held->fd < 0) throw Error("cannot open the lock file '" + lock_file.string() + "': " + std::strerror(errno));
  const auto give_up = std::chrono::steady_clock::now() + patience;
  for (bool said = false; ::flock(held->fd, LOCK_EX | LOCK_NB) != 0;) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw Error("cannot lock '" + lock_file.string() + "': " + std::strerror(errno));
    const std::string in_use = "the " + what + " '" + lock_file.parent_path().string() + "' is in use by " + fl::holder_of(held->fd);
    if (std::chrono::steady_clock::now() >= give_up)
      throw FolderInUseError(in_use + ", which holds its lock " + lock_file.filename().string() +
                             ": wait for it to end, or give this run another folder (--output DIR)");
    if (!said)
      std::fprintf(stderr, "dettrial: %s; waiting up to %llds for it to end\n", in_use.c_str(), static_cast<long long>(patience.count()));
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + fl::host_name() + "\n";
  if (::ftruncate(held->fd, 0) != 0 || ::pwrite(held->fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size()))
    throw Error("cannot write the lock file '" + lock_file.string() + "': " + std::strerror(errno));
  fl::held_here()[key] = held;
  out.held_ = std::move(held);
  return out;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/folder_lock.hpp
// ---- begin dettrial/tracking/http.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief HTTP requests for tracking servers, through libcurl (TLS, proxies and redirects as curl
/// does them by default). Built only where libcurl was found (DETTRIAL_HAS_CURL); elsewhere a
/// request is an Error that says so.

#include <string>
#include <string_view>
#include <utility>


namespace dettrial::detail {

/// What a server answered: its HTTP status and body.
struct HttpResponse {
  long status = 0;
  std::string body;
  bool ok() const { return status >= 200 && status < 300; }
};

/// A request that got no answer (no connection, a timeout, a TLS failure): curl's words.
struct HttpUnreachable : Error {
  using Error::Error;
};

/// How requests authenticate: a bearer token, else a username and password (basic), else none.
struct HttpAuth {
  std::string token, username, password;
};

/**
 * @brief One connection's worth of requests (curl keeps the connection alive between them). Not
 * shared between threads: each thread that talks to a server holds its own.
 */
class HttpClient {
 public:
  /// `timeout_seconds` bounds a whole request, connecting included.
  explicit HttpClient(HttpAuth auth = {}, long timeout_seconds = 30);
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  ~HttpClient();

  /// `method` (GET, POST, PUT) of `url` with `body` of `content_type`. Throws HttpUnreachable when
  /// no answer came; any answer (404, 500) is returned.
  HttpResponse request(std::string_view method, const std::string& url, std::string_view body = {},
                       std::string_view content_type = "application/json");

  /// `text` with every character a URL's query must not hold percent-encoded.
  static std::string escape(std::string_view text);

 private:
  HttpAuth auth_;
  long timeout_ = 30;
  void* curl_ = nullptr;
};

/// Whether this dettrial was built with libcurl.
constexpr bool http_available() {
#if DETTRIAL_HAS_CURL
  return true;
#else
  return false;
#endif
}

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>
#include <mutex>
#if DETTRIAL_HAS_CURL
#include <curl/curl.h>
#endif

namespace dettrial::detail {

#if DETTRIAL_HAS_CURL
namespace http_detail {
inline std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}
}  // namespace http_detail

DETTRIAL_INLINE HttpClient::HttpClient(HttpAuth auth, long timeout_seconds) : auth_(std::move(auth)), timeout_(timeout_seconds) {
  static std::once_flag initialized;
  std::call_once(initialized, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (!curl_) throw Error("libcurl could not start a session");
}

DETTRIAL_INLINE HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

DETTRIAL_INLINE HttpResponse HttpClient::request(std::string_view method, const std::string& url, std::string_view body,
                                                 std::string_view content_type) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);
  HttpResponse response;
  char error[CURL_ERROR_SIZE] = {};
  const std::string verb(method), header = "Content-Type: " + std::string(content_type);
  curl_slist* headers = curl_slist_append(nullptr, header.c_str());
  if (!auth_.token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + auth_.token).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, verb.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, timeout_);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, timeout_ < 10 ? timeout_ : 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // a training process's signals are its own
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &http_detail::append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  if (auth_.token.empty() && !auth_.username.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERNAME, auth_.username.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, auth_.password.c_str());
  }
  if (verb != "GET") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (code != CURLE_OK)
    throw HttpUnreachable(verb + " " + url + ": " + (error[0] ? std::string(error) : std::string(curl_easy_strerror(code))));
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}
#else
DETTRIAL_INLINE HttpClient::HttpClient(HttpAuth auth, long timeout_seconds) : auth_(std::move(auth)), timeout_(timeout_seconds) {}
DETTRIAL_INLINE HttpClient::~HttpClient() = default;
DETTRIAL_INLINE HttpResponse HttpClient::request(std::string_view method, const std::string& url, std::string_view, std::string_view) {
  throw HttpUnreachable(std::string(method) + " " + url + ": this dettrial was built without libcurl (Debian: libcurl4-openssl-dev)");
}
#endif

DETTRIAL_INLINE std::string HttpClient::escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", u);
      out += hex;
    }
  }
  return out;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/tracking/http.hpp

namespace dettrial {

/// The MLflow server refused a request: the message names the request and says the server's reason.
struct MlflowError : Error {
  MlflowError(const std::string& what, long status) : Error(what), status(status) {}
  long status = 0;
};

namespace layout {
/// A tracked run's MLflow ids (server, experiment, run) and how far its metrics were sent.
inline constexpr const char* mlflow_state = "mlflow.json";
/// The MLflow requests the server did not take yet, one JSON object a line, in order.
inline constexpr const char* mlflow_pending = "mlflow-pending.jsonl";
}  // namespace layout

namespace detail {

/// MLflow's REST API, one request at a time (the calling thread waits).
class MlflowClient {
 public:
  MlflowClient(std::string tracking_uri, long timeout_seconds = 10);
  /// `POST /api/2.0/mlflow/<api>` (`GET` with `body`'s members as the query). Throws MlflowError
  /// for an answer that is not a success, HttpUnreachable for none.
  Json call(std::string_view method, std::string_view api, const Json& body);
  /// The id of experiment `name`, created if there is none.
  std::string experiment_id(const std::string& name);
  /// Uploads `bytes` as artifact `name` of a run whose artifact URI is `artifact_uri` (the server's
  /// artifact proxy, `mlflow-artifacts:/...`). Throws MlflowError for a URI the proxy does not serve.
  void upload_artifact(const std::string& artifact_uri, const std::string& name, std::string_view bytes);

 private:
  std::string uri_;
  HttpClient http_;
};

/// What a run (or a search) is tracked with: `settings` completed from MLflow's environment
/// variables, the experiment "Default" and the run `default_run_name` where unnamed; nullopt when
/// no server is named, or this dettrial has no libcurl (said in a warning).
DETTRIAL_INLINE std::optional<MlflowSettings> tracked_settings(MlflowSettings settings, const std::string& default_run_name);

/// The HTTP auth MLflow's clients use: MLFLOW_TRACKING_TOKEN, else MLFLOW_TRACKING_USERNAME and _PASSWORD.
DETTRIAL_INLINE HttpAuth mlflow_auth();

/// Whether a failed request may succeed when sent again (no answer, 429 or 5xx), rather than being
/// refused for what it says.
DETTRIAL_INLINE bool retryable(const std::exception& e);

/// Sends the pending requests of run folder `dir` (`--sync-mlflow`), creating its run first if the
/// server could not when it trained; keeps in the file those that still fail. Returns how many were
/// sent; throws what stopped it (the rest stays pending).
DETTRIAL_INLINE std::size_t sync_mlflow_run(const std::filesystem::path& dir);

/// `--sync-mlflow DIR`: sync_mlflow_run for a run's folder, or for a search's folder and each of its
/// trials' (each taken under its folder's lock: a live run sends its own). Returns each folder
/// tracked and how many requests it sent; throws when one could not be synced, or none was tracked.
DETTRIAL_INLINE std::vector<std::pair<std::filesystem::path, std::size_t>> sync_mlflow_folder(const std::filesystem::path& dir);

/**
 * @brief One run's MLflow run (on the chief). A resumed run continues the MLflow run whose id its
 * folder keeps, and does not log the reports it redoes a second time. Everything is queued here and
 * sent by a thread: requests that fail are retried a few times, then kept in the folder's pending
 * file, which is tried again every 30 s and at the end (one warning says so). end() sends the
 * status and waits for the queue, never longer than the server's timeouts.
 */
class MlflowRun {
 public:
  /// What the run starts with: its params (the hyperparameters, nested names dotted) and tags.
  struct Start {
    std::vector<std::pair<std::string, std::string>> params;
    std::vector<std::pair<std::string, std::string>> tags;
  };
  MlflowRun(MlflowSettings settings, std::filesystem::path dir, Start start);
  MlflowRun(const MlflowRun&) = delete;
  MlflowRun& operator=(const MlflowRun&) = delete;
  /// Ends as FAILED if end() was not called (the fit threw).
  ~MlflowRun();

  /// Metrics of a report of `kind` (training, validation) at batch `step`, unless a run before a
  /// resume sent that report already.
  /// `tags` go with them (the latest learning rates, a checkpoint's uuid).
  void log_metrics(std::string_view kind, std::int64_t step, const std::vector<std::pair<std::string, double>>& metrics,
                   const std::vector<std::pair<std::string, std::string>>& tags = {});
  /// The run's status (FINISHED, FAILED, KILLED) and end time; waits for the queue to empty.
  void end(std::string_view status);
  /// The run's id in MLflow, once the thread has created (or continued) it; empty when the server
  /// did not answer (a search's runner hands it to its trials as their parent).
  std::string run_id();

 private:
  /// The queue, the thread that sends it and the run's state file (defined with the definitions,
  /// so that a trial's translation unit does not parse nlohmann/json for it).
  class Sender;
  std::unique_ptr<Sender> sender_;
};

}  // namespace detail
}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>


namespace dettrial::detail {

namespace mlflow_detail {
inline std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
/// `name` as MLflow takes a key: letters, digits and `_ - . : /` and spaces; anything else becomes `_`
/// (a metric named `acc@1` is logged as `acc_1`, not refused with its whole report).
inline std::string key_of(std::string_view name) {
  std::string key(name);
  for (char& c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '_' && c != '-' && c != '.' && c != ' ' && c != '/' && c != ':') c = '_';
  }
  return key;
}
/// Key-value pairs as MLflow's params and tags; values cut to what MLflow stores (6,000 characters
/// for a param, 8,000 for a tag: 6,000 for both).
inline Json key_values(const std::vector<std::pair<std::string, std::string>>& pairs, std::size_t from, std::size_t to) {
  Json out = Json::array();
  for (std::size_t i = from; i < to && i < pairs.size(); ++i)
    out.push_back({{"key", key_of(pairs[i].first)}, {"value", pairs[i].second.substr(0, 6000)}});
  return out;
}
/// The run's id in `body` (requests are queued without it: it may not be known yet).
inline void set_run(Json& body, const std::string& run_id) {
  if (body.is_object() && !body.contains("run_id")) body["run_id"] = run_id;
}
inline Json read_state(const std::filesystem::path& dir) {
  std::ifstream in(dir / layout::mlflow_state);
  if (!in) return Json::object();
  Json state = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  return state.is_object() ? state : Json::object();
}
/// Creates the run the state describes (its "create" request), filling in its ids.
inline void create_run(MlflowClient& client, Json& state) {
  Json create = state.at("create");
  create["experiment_id"] = client.experiment_id(create.at("experiment_name").get<std::string>());
  state["experiment_id"] = create["experiment_id"];
  create.erase("experiment_name");
  const Json run = client.call("POST", "runs/create", create).at("run").at("info");
  state["run_id"] = run.at("run_id");
  state["artifact_uri"] = run.value("artifact_uri", "");
}
/// Sends one kept or queued request whose run exists.
inline void send(MlflowClient& client, const Json& state, const std::string& api, Json body) {
  if (api == "artifact") {
    client.upload_artifact(state.value("artifact_uri", ""), body.at("name").get<std::string>(), body.at("text").get<std::string>());
    return;
  }
  set_run(body, state.at("run_id").get<std::string>());
  client.call("POST", api, body);
}
}  // namespace mlflow_detail

DETTRIAL_INLINE HttpAuth mlflow_auth() {
  return {environment_value("MLFLOW_TRACKING_TOKEN"), environment_value("MLFLOW_TRACKING_USERNAME"),
          environment_value("MLFLOW_TRACKING_PASSWORD")};
}

DETTRIAL_INLINE std::optional<MlflowSettings> tracked_settings(MlflowSettings settings, const std::string& default_run_name) {
  settings.complete_from_environment();
  if (!settings.enabled()) return std::nullopt;
  if (!http_available()) {
    std::fprintf(stderr, "dettrial: warning: MLflow tracking at %s is off: this dettrial was built without libcurl\n",
                 settings.tracking_uri.c_str());
    return std::nullopt;
  }
  if (settings.experiment_name.empty()) settings.experiment_name = "Default";
  if (settings.run_name.empty()) settings.run_name = default_run_name;
  return settings;
}

DETTRIAL_INLINE bool retryable(const std::exception& e) {
  if (dynamic_cast<const HttpUnreachable*>(&e)) return true;
  if (const auto* refused = dynamic_cast<const MlflowError*>(&e)) return refused->status == 429 || refused->status >= 500;
  return false;
}

DETTRIAL_INLINE MlflowClient::MlflowClient(std::string tracking_uri, long timeout_seconds)
    : uri_(std::move(tracking_uri)), http_(mlflow_auth(), timeout_seconds) {}

DETTRIAL_INLINE Json MlflowClient::call(std::string_view method, std::string_view api, const Json& body) {
  std::string url = uri_ + "/api/2.0/mlflow/" + std::string(api);
  HttpResponse answer;
  if (method == "GET") {
    char separator = '?';
    for (const auto& [key, value] : body.items()) {
      url += separator + key + "=" + HttpClient::escape(value.is_string() ? value.get<std::string>() : value.dump());
      separator = '&';
    }
    answer = http_.request("GET", url);
  } else {
    answer = http_.request(method, url, body.dump());
  }
  Json parsed = Json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
  if (!answer.ok()) {
    std::string reason = parsed.is_object() ? parsed.value("message", std::string()) : std::string();
    if (reason.empty()) reason = answer.body.substr(0, 300);
    throw MlflowError(
        "the MLflow server at " + uri_ + " answered " + std::to_string(answer.status) + " to " + std::string(api) + ": " + reason,
        answer.status);
  }
  return parsed.is_discarded() ? Json::object() : parsed;
}

DETTRIAL_INLINE std::string MlflowClient::experiment_id(const std::string& name) {
  try {
    return call("GET", "experiments/get-by-name", {{"experiment_name", name}}).at("experiment").at("experiment_id").get<std::string>();
  } catch (const MlflowError& e) {
    if (e.status != 404) throw;
  }
  try {
    return call("POST", "experiments/create", {{"name", name}}).at("experiment_id").get<std::string>();
  } catch (const MlflowError& e) {
    // Another process (a search's trial) created it meanwhile.
    if (e.status != 400 && e.status != 409) throw;
    return call("GET", "experiments/get-by-name", {{"experiment_name", name}}).at("experiment").at("experiment_id").get<std::string>();
  }
}

DETTRIAL_INLINE void MlflowClient::upload_artifact(const std::string& artifact_uri, const std::string& name, std::string_view bytes) {
  constexpr std::string_view proxied = "mlflow-artifacts:";
  if (artifact_uri.rfind(proxied, 0) != 0)
    throw MlflowError("the MLflow server at " + uri_ + " keeps this run's artifacts at '" + artifact_uri +
                          "', which dettrial cannot write over HTTP (start the server with --serve-artifacts)",
                      0);
  std::string path = artifact_uri.substr(proxied.size());
  while (!path.empty() && path.front() == '/') path.erase(0, 1);
  const std::string url = uri_ + "/api/2.0/mlflow-artifacts/artifacts/" + path + "/" + name;
  const HttpResponse answer = http_.request("PUT", url, bytes, "application/octet-stream");
  if (!answer.ok())
    throw MlflowError("the MLflow server at " + uri_ + " answered " + std::to_string(answer.status) + " to the upload of artifact '" +
                          name + "': " + answer.body.substr(0, 300),
                      answer.status);
}

DETTRIAL_INLINE std::size_t sync_mlflow_run(const std::filesystem::path& dir) {
  Json state = mlflow_detail::read_state(dir);
  if (!state.contains("tracking_uri"))
    throw Error("'" + (dir / layout::mlflow_state).string() + "' is missing: the run in '" + dir.string() + "' was not tracked in MLflow");
  const std::filesystem::path pending_path = dir / layout::mlflow_pending;
  std::vector<Json> pending;
  {
    std::ifstream in(pending_path);
    for (std::string line; std::getline(in, line);) {
      Json entry = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (entry.is_object() && entry.contains("api")) pending.push_back(std::move(entry));  // a torn last line was never acknowledged
    }
  }
  if (pending.empty() && !state.value("run_id", std::string()).empty()) return 0;
  MlflowClient client(state.at("tracking_uri").get<std::string>());
  if (state.value("run_id", std::string()).empty()) {
    mlflow_detail::create_run(client, state);
    write_atomically(dir / layout::mlflow_state, json_text(state));
  }
  std::size_t sent = 0;
  try {
    for (; sent < pending.size(); ++sent)
      mlflow_detail::send(client, state, pending[sent].at("api").get<std::string>(), pending[sent].value("body", Json::object()));
  } catch (...) {
    std::string rest;
    for (std::size_t i = sent; i < pending.size(); ++i) rest += json_line(pending[i]);
    write_atomically(pending_path, rest);
    throw;
  }
  std::error_code ignored;
  std::filesystem::remove(pending_path, ignored);
  return sent;
}

DETTRIAL_INLINE std::vector<std::pair<std::filesystem::path, std::size_t>> sync_mlflow_folder(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> folders;
  if (std::filesystem::exists(dir / layout::mlflow_state)) folders.push_back(dir);
  std::error_code ec;
  std::vector<std::filesystem::path> trials;
  for (const auto& entry : std::filesystem::directory_iterator(ExperimentFolder{dir}.trials(), ec))
    if (std::filesystem::exists(entry.path() / layout::mlflow_state)) trials.push_back(entry.path());
  std::sort(trials.begin(), trials.end());
  folders.insert(folders.end(), trials.begin(), trials.end());
  if (folders.empty())
    throw Error("'" + dir.string() + "' holds no run tracked in MLflow (no " + layout::mlflow_state + " in it or its trials)");
  std::vector<std::pair<std::filesystem::path, std::size_t>> out;
  for (const std::filesystem::path& folder : folders) {
    const FolderLock lock = FolderLock::acquire(folder / layout::lock, "run folder");
    out.emplace_back(folder, sync_mlflow_run(folder));
  }
  return out;
}

/// MlflowRun's insides: everything is queued here and sent by the thread `worker_`.
class MlflowRun::Sender {
 public:
  Sender(MlflowSettings settings, std::filesystem::path dir, Start start);
  ~Sender();
  void log_metrics(std::string_view kind, std::int64_t step, const std::vector<std::pair<std::string, double>>& metrics,
                   const std::vector<std::pair<std::string, std::string>>& tags);
  void end(std::string_view status);
  std::string run_id();

 private:
  struct Request {
    std::string api;
    Json body;
    /// The report it carries (kind and step), if any: what the state file records as sent.
    std::string kind;
    std::int64_t step = -1;
  };
  void enqueue(Request request);
  void work();
  /// Sends `r` (its run id filled in), retrying what may succeed; false when it failed and was kept.
  bool deliver(Request& r);
  void keep_pending(const Request& r);
  void save_state();

  MlflowSettings settings_;
  std::filesystem::path dir_;
  MlflowClient client_;
  Json state_;
  std::map<std::string, std::int64_t, std::less<>> sent_before_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Request> queue_;
  /// Requests queued and handled so far (run_id() waits for its own), and the run's id when known.
  std::size_t queued_ = 0, handled_ = 0;
  std::string run_id_;
  std::condition_variable handled_one_;
  bool closing_ = false, ended_ = false, warned_ = false;
  std::thread worker_;
};

DETTRIAL_INLINE MlflowRun::Sender::Sender(MlflowSettings settings, std::filesystem::path dir, Start start)
    : settings_(std::move(settings)), dir_(std::move(dir)), client_(settings_.tracking_uri) {
  state_ = mlflow_detail::read_state(dir_);
  const bool continued = state_.value("tracking_uri", std::string()) == settings_.tracking_uri && state_.contains("create");
  if (continued) {
    const Json sent = state_.value("sent", Json::object());
    for (const auto& [kind, step] : sent.items()) sent_before_[kind] = step.get<std::int64_t>();
  } else {
    std::vector<std::pair<std::string, std::string>> tags = settings_.tags;
    tags.insert(tags.end(), start.tags.begin(), start.tags.end());
    if (!settings_.parent_run_id.empty()) tags.emplace_back("mlflow.parentRunId", settings_.parent_run_id);
    tags.emplace_back("mlflow.runName", settings_.run_name);
    state_ = {{"tracking_uri", settings_.tracking_uri},
              {"run_id", ""},
              {"create",
               {{"experiment_name", settings_.experiment_name},
                {"run_name", settings_.run_name},
                {"start_time", mlflow_detail::now_ms()},
                {"tags", mlflow_detail::key_values(tags, 0, tags.size())}}},
              {"sent", Json::object()}};
  }
  std::filesystem::create_directories(dir_);
  save_state();
  worker_ = std::thread([this] { work(); });
  if (continued) {
    enqueue({"runs/update", {{"status", "RUNNING"}}, {}, -1});
    return;
  }
  // MLflow takes at most 100 params a request; a param's value is immutable (a resumed run sends none).
  for (std::size_t i = 0; i < start.params.size(); i += 100)
    enqueue({"runs/log-batch", {{"params", mlflow_detail::key_values(start.params, i, i + 100)}}, {}, -1});
  if (!settings_.config_text.empty()) enqueue({"artifact", {{"name", "config.yaml"}, {"text", settings_.config_text}}, {}, -1});
}

DETTRIAL_INLINE MlflowRun::Sender::~Sender() {
  if (!ended_) end("FAILED");
}

DETTRIAL_INLINE void MlflowRun::Sender::log_metrics(std::string_view kind, std::int64_t step,
                                                    const std::vector<std::pair<std::string, double>>& metrics,
                                                    const std::vector<std::pair<std::string, std::string>>& tags) {
  if (const auto before = sent_before_.find(kind); before != sent_before_.end() && step <= before->second) return;
  Json list = Json::array();
  const std::int64_t now = mlflow_detail::now_ms();
  for (const auto& [key, value] : metrics)  // JSON has no NaN nor infinity
    if (std::isfinite(value)) list.push_back({{"key", mlflow_detail::key_of(key)}, {"value", value}, {"timestamp", now}, {"step", step}});
  Json body = {{"metrics", std::move(list)}};
  if (!tags.empty()) body["tags"] = mlflow_detail::key_values(tags, 0, tags.size());
  enqueue({"runs/log-batch", std::move(body), std::string(kind), step});
}

DETTRIAL_INLINE void MlflowRun::Sender::end(std::string_view status) {
  if (ended_) return;
  ended_ = true;
  enqueue({"runs/update", {{"status", std::string(status)}, {"end_time", mlflow_detail::now_ms()}}, {}, -1});
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

DETTRIAL_INLINE void MlflowRun::Sender::enqueue(Request request) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(request));
    ++queued_;
  }
  wake_.notify_all();
}

DETTRIAL_INLINE std::string MlflowRun::Sender::run_id() {
  enqueue({"", Json::object(), {}, -1});  // nothing to send: the run is created, if it is not yet
  std::unique_lock lock(mutex_);
  const std::size_t ticket = queued_;
  handled_one_.wait(lock, [&] { return handled_ >= ticket; });
  return run_id_;
}

DETTRIAL_INLINE void MlflowRun::Sender::work() {
  using Clock = std::chrono::steady_clock;
  auto next_retry = Clock::now();
  for (;;) {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, std::chrono::seconds(30), [&] { return closing_ || !queue_.empty(); });
    const bool closing = closing_;
    std::deque<Request> batch;
    batch.swap(queue_);
    lock.unlock();
    const bool kept = std::filesystem::exists(dir_ / layout::mlflow_pending);
    if (kept && (closing || Clock::now() >= next_retry)) {
      // The server failed before: what it did not take goes first, in order.
      try {
        sync_mlflow_run(dir_);
        state_ = mlflow_detail::read_state(dir_);
      } catch (const std::exception&) {
        next_retry = Clock::now() + std::chrono::seconds(30);
      }
    }
    for (Request& r : batch) {
      if (!std::filesystem::exists(dir_ / layout::mlflow_pending)) deliver(r);
      else if (!r.api.empty()) keep_pending(r);
      if (!r.kind.empty()) state_["sent"][r.kind] = r.step;
    }
    if (!batch.empty()) save_state();
    {
      std::lock_guard done(mutex_);
      handled_ += batch.size();
      run_id_ = state_.value("run_id", std::string());
    }
    handled_one_.notify_all();
    if (closing) {
      if (std::filesystem::exists(dir_ / layout::mlflow_pending))
        std::fprintf(stderr, "dettrial: MLflow requests the server at %s did not take are kept in %s: send them with --sync-mlflow %s\n",
                     settings_.tracking_uri.c_str(), (dir_ / layout::mlflow_pending).c_str(), dir_.c_str());
      return;
    }
  }
}

DETTRIAL_INLINE bool MlflowRun::Sender::deliver(Request& r) {
  for (int attempt = 0;; ++attempt) {
    try {
      if (state_.value("run_id", std::string()).empty()) {
        mlflow_detail::create_run(client_, state_);
        save_state();
      }
      if (!r.api.empty()) mlflow_detail::send(client_, state_, r.api, r.body);
      return true;
    } catch (const std::exception& e) {
      if (!retryable(e)) {
        // The server refuses what the request says: sending it again cannot help.
        std::fprintf(stderr, "dettrial: warning: MLflow: %s\n", e.what());
        return true;
      }
      if (attempt < 2) {
        std::this_thread::sleep_for(std::chrono::seconds(1 << attempt));
        continue;
      }
      if (!warned_)
        std::fprintf(stderr,
                     "dettrial: warning: the MLflow server does not answer (%s): training goes on, and what it does not take is kept "
                     "in %s and sent when it answers again (or by --sync-mlflow %s)\n",
                     e.what(), (dir_ / layout::mlflow_pending).c_str(), dir_.c_str());
      warned_ = true;
      if (!r.api.empty()) keep_pending(r);
      return false;
    }
  }
}

DETTRIAL_INLINE void MlflowRun::Sender::keep_pending(const Request& r) {
  std::ofstream out(dir_ / layout::mlflow_pending, std::ios::app);
  out << json_line(Json{{"api", r.api}, {"body", r.body}});
  out.flush();
  if (!out)
    std::fprintf(stderr, "dettrial: warning: cannot write %s: an MLflow request is lost\n", (dir_ / layout::mlflow_pending).c_str());
}

DETTRIAL_INLINE void MlflowRun::Sender::save_state() {
  try {
    write_atomically(dir_ / layout::mlflow_state, json_text(state_));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dettrial: warning: %s\n", e.what());
  }
}

DETTRIAL_INLINE MlflowRun::MlflowRun(MlflowSettings settings, std::filesystem::path dir, Start start)
    : sender_(std::make_unique<Sender>(std::move(settings), std::move(dir), std::move(start))) {}

DETTRIAL_INLINE MlflowRun::~MlflowRun() = default;

DETTRIAL_INLINE void MlflowRun::log_metrics(std::string_view kind, std::int64_t step,
                                            const std::vector<std::pair<std::string, double>>& metrics,
                                            const std::vector<std::pair<std::string, std::string>>& tags) {
  sender_->log_metrics(kind, step, metrics, tags);
}

DETTRIAL_INLINE void MlflowRun::end(std::string_view status) { sender_->end(status); }

DETTRIAL_INLINE std::string MlflowRun::run_id() { return sender_->run_id(); }

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/tracking/mlflow.hpp
// ---- begin dettrial/report/csv_log.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief metrics.csv: the reports of metrics.jsonl as a table (Keras's CSVLogger, Lightning's
/// CSVLogger), for a spreadsheet or pandas.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>


namespace dettrial {

/**
 * @brief One row per training or validation report: `type,batches,epochs`, then one column per
 * metric, in the order metrics first appeared (a report without a metric leaves its cell empty).
 * When a report brings a new metric, the file is rewritten with the new column (as Lightning's
 * CSVLogger does); otherwise a row is appended. A resumed run starts from its metrics.jsonl, which
 * already left out the reports it redoes.
 */
class CsvLog {
 public:
  CsvLog() = default;
  /// `<dir>/metrics.csv`, its rows first those of `<dir>/metrics.jsonl` as it stands.
  explicit CsvLog(const std::filesystem::path& dir);
  bool enabled() const { return !path_.empty(); }
  const std::filesystem::path& path() const { return path_; }

  void write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics);

 private:
  struct Row {
    std::string type;
    std::int64_t batches = 0, epochs = 0;
    std::map<std::string, double> values;
  };
  /// Adds `row`'s new metrics as columns; true when there were any.
  bool add_columns(const Row& row);
  std::string line(const Row& row) const;
  void rewrite() const;

  std::filesystem::path path_;
  std::vector<std::string> columns_;
  std::vector<Row> rows_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>


namespace dettrial {

DETTRIAL_INLINE CsvLog::CsvLog(const std::filesystem::path& dir) : path_(RunFolder{dir}.metrics_csv()) {
  std::ifstream in(RunFolder{dir}.metrics_log());
  for (std::string text; std::getline(in, text);) {
    const detail::Json record = detail::Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;
    const std::string type = record.value("type", std::string());
    if (type != "training" && type != "validation") continue;
    Row row{type, record.value("batches", std::int64_t{0}), record.value("epochs", std::int64_t{0}), {}};
    const detail::Json metrics = record.value("metrics", detail::Json::object());
    for (const auto& [name, value] : metrics.items())
      if (name != "batches" && name != "epochs")
        row.values[name] = value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
    add_columns(row);
    rows_.push_back(std::move(row));
  }
  rewrite();
}

DETTRIAL_INLINE void CsvLog::write(std::string_view type, std::int64_t batches, std::int64_t epochs, const MetricValues& metrics) {
  if (!enabled()) return;
  Row row{std::string(type), batches, epochs, {}};
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") row.values[name] = value;
  const bool new_columns = add_columns(row);
  rows_.push_back(std::move(row));
  if (new_columns) {
    rewrite();
    return;
  }
  std::ofstream out(path_, std::ios::app);
  out << line(rows_.back());
}

DETTRIAL_INLINE bool CsvLog::add_columns(const Row& row) {
  bool added = false;
  for (const auto& [name, value] : row.values) {
    if (std::find(columns_.begin(), columns_.end(), name) != columns_.end()) continue;
    columns_.push_back(name);
    added = true;
  }
  return added;
}

DETTRIAL_INLINE std::string CsvLog::line(const Row& row) const {
  std::string text = row.type + "," + std::to_string(row.batches) + "," + std::to_string(row.epochs);
  for (const std::string& column : columns_) {
    text += ',';
    const auto found = row.values.find(column);
    if (found == row.values.end()) continue;
    if (found->second != found->second) {
      text += "nan";
      continue;
    }
    char number[32];
    std::snprintf(number, sizeof number, "%.9g", found->second);
    text += number;
  }
  return text + "\n";
}

DETTRIAL_INLINE void CsvLog::rewrite() const {
  std::string text = "type,batches,epochs";
  for (const std::string& column : columns_) {
    // A name with a comma or a quote is quoted, as RFC 4180 says.
    if (column.find_first_of(",\"\n") == std::string::npos) {
      text += "," + column;
      continue;
    }
    std::string quoted = "\"";
    for (const char c : column) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    text += "," + quoted + "\"";
  }
  text += "\n";
  for (const Row& row : rows_) text += line(row);
  detail::write_atomically(path_, text);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/csv_log.hpp

namespace dettrial::detail {

/// Where a training workload's time went on this rank, in seconds.
struct PhaseTimes {
  /// From the end of one batch's step to the next batch on the device: loading, collating, copying.
  double data = 0;
  /// The trial's train_batch (for an imperative trial: forward, backward and the optimizer step).
  double train_batch = 0;
  /// A declarative trial's backward pass, and its clipping and optimizer step, run by the trainer.
  double backward = 0;
  double optimizer_step = 0;
  /// Waiting, at a checkpoint since the last report, for the last checkpoint's background write
  /// (one is in flight at most): 0 when writes keep up with the checkpoint period.
  double checkpoint_wait = 0;
  void reset() { *this = PhaseTimes{}; }
};

/// A learning rate as reported: `lr` for a single optimizer's single group, else suffixed with the
/// optimizer's and group's indices (`lr_1`, `lr_group_2`, `lr_1_group_2`).
using LearningRates = std::vector<std::pair<std::string, double>>;

/// The hyperparameters as TensorBoard's hparams dashboard lists them: nested ones by dotted name,
/// numbers as numbers, true/false as booleans, lists and anything else as their YAML text.
DETTRIAL_INLINE std::vector<std::pair<std::string, HParamValue>> flat_hparams(const Hyperparameters& hparams);

/// What a fit reports, in the words and files users read: one object, so that new outlets (event
/// files, a profiler) plug in here rather than into the loop.
class Reporter {
 public:
  Reporter() = default;
  /// `writes` is true on the chief: it prints (unless `options.quiet`) and writes
  /// `<output_dir>/metrics.jsonl`, dropping the records a resumed run at batch `resumed_at` redoes,
  /// and, given a `tensorboard` writer, the same numbers as TensorBoard scalars (`train/<metric>`,
  /// `validation/<metric>`, `train/lr`, `train/samples_per_second`, `timing/<phase>_seconds`).
  /// `metrics.csv` holds the training and validation reports as a table; given an `mlflow` run, the
  /// same go to it.
  Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir, std::optional<std::int64_t> resumed_at,
           TensorBoardWriter* tensorboard = nullptr, MlflowRun* mlflow = nullptr);

  /// A line of its own (start-up facts, warnings, stops).
  void line(const std::string& text) { progress_.line(text); }

  /// A phase with a live progress line: `done` of `total` units so far.
  void begin(std::string_view phase, std::int64_t done, std::int64_t total, std::string_view unit) {
    progress_.begin(phase, done, total, unit);
  }
  void update(std::int64_t done) { progress_.update(done); }
  /// Seconds since the phase began.
  double elapsed() const { return progress_.elapsed(); }

  /// A training workload's averaged metrics, the job's samples per second, where the chief's time
  /// went (`seconds` in all) and the learning rates after its last step.
  void training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second, double seconds,
                const PhaseTimes& phases, const LearningRates& learning_rates);

  /// A validation's metrics, over `records` records (0: not counted) in `seconds`.
  void validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records, double seconds);

  /// A checkpoint written at `batches`: training stood still `seconds` for it (a snapshot, or the
  /// whole write when synchronous), and its write went on `write_seconds` from there.
  void checkpoint(std::int64_t batches, std::int64_t epochs, const std::filesystem::path& path, double seconds, double write_seconds);

  /// A run continued at `batches` on `ranks` ranks from a checkpoint written by `ranks_before`:
  /// restart `restart` of a launcher that restarted the job (0: resumed by hand).
  void restart(std::int64_t batches, std::int64_t epochs, std::int64_t ranks_before, std::int64_t ranks, std::int64_t restart);

 private:
  /// Every metric but the counters (`batches`, `epochs`: TensorBoard's step already says them).
  void add_scalars(std::string_view prefix, const MetricValues& metrics, std::int64_t step);
  /// The same metrics named `<prefix><name>`, for MLflow.
  static std::vector<std::pair<std::string, double>> prefixed(std::string_view prefix, const MetricValues& metrics);

  Progress progress_{};
  MetricsLog log_{};
  CsvLog csv_{};
  TensorBoardWriter* tensorboard_ = nullptr;
  MlflowRun* mlflow_ = nullptr;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

/// flat_hparams' recursion: the entries of `map`, their names prefixed.
DETTRIAL_INLINE void flatten_hparams(const YAML::Node& map, const std::string& prefix,
                                     std::vector<std::pair<std::string, HParamValue>>& out) {
  for (const auto& kv : map) {
    const std::string name = prefix + kv.first.Scalar();
    const YAML::Node& value = kv.second;
    if (value.IsMap()) {
      flatten_hparams(value, name + ".", out);
    } else if (value.IsScalar()) {
      const std::string& text = value.Scalar();
      double number = 0;
      std::size_t used = 0;
      if (text == "true" || text == "True" || text == "false" || text == "False") {
        out.emplace_back(name, text == "true" || text == "True");
      } else {
        try {
          number = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used > 0 && used == text.size() && value.Tag() != "!") out.emplace_back(name, number);  // "!" marks a quoted scalar
        else out.emplace_back(name, text);
      }
    } else if (value.IsDefined() && !value.IsNull()) {
      YAML::Emitter emitter;
      emitter << YAML::Flow << value;
      out.emplace_back(name, std::string(emitter.c_str()));
    }
  }
}

DETTRIAL_INLINE std::vector<std::pair<std::string, HParamValue>> flat_hparams(const Hyperparameters& hparams) {
  std::vector<std::pair<std::string, HParamValue>> out;
  if (hparams.yaml().IsMap()) flatten_hparams(hparams.yaml(), "", out);
  return out;
}

DETTRIAL_INLINE Reporter::Reporter(bool writes, ReportOptions options, const std::filesystem::path& output_dir,
                                   std::optional<std::int64_t> resumed_at, TensorBoardWriter* tensorboard, MlflowRun* mlflow) {
  if (writes) log_ = MetricsLog(output_dir, resumed_at);
  if (writes) csv_ = CsvLog(output_dir);
  if (writes) tensorboard_ = tensorboard;
  if (writes) mlflow_ = mlflow;
  if (!writes) options.quiet = true;
  progress_ = Progress(options);
  if (log_.dropped() > 0)  // also under --quiet: a trial's log says why its metrics.jsonl shrank
    std::fprintf(
        stderr,
        "dettrial: resuming at batch %lld: dropped %zu record(s) of %s written after that checkpoint (that training is done again)\n",
        static_cast<long long>(resumed_at.value_or(0)), log_.dropped(), log_.path().c_str());
  if (tensorboard_ && tensorboard_->dropped() > 0)
    std::fprintf(stderr, "dettrial: resuming at batch %lld: dropped %zu event(s) of %s written after that checkpoint\n",
                 static_cast<long long>(resumed_at.value_or(0)), tensorboard_->dropped(), tensorboard_->dir().c_str());
}

DETTRIAL_INLINE void Reporter::training(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, double samples_per_second,
                                        double seconds, const PhaseTimes& phases, const LearningRates& learning_rates) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "  (%.1f samples/s)", samples_per_second);
  progress_.line("[train]" + format_metrics(metrics) + tail);
  const std::pair<const char*, double> phase_seconds[] = {{"data", phases.data},
                                                          {"train_batch", phases.train_batch},
                                                          {"backward", phases.backward},
                                                          {"optimizer_step", phases.optimizer_step},
                                                          {"checkpoint_wait", phases.checkpoint_wait},
                                                          {"total", seconds}};
  if (log_.enabled()) {
    Json extra = {{"samples_per_second", samples_per_second}};
    Json times = Json::object();
    for (const auto& [phase, value] : phase_seconds) times[phase] = value;
    extra["seconds"] = std::move(times);
    if (!learning_rates.empty()) {
      Json lrs = Json::object();
      for (const auto& [name, lr] : learning_rates) lrs[name] = lr;
      extra["learning_rates"] = std::move(lrs);
    }
    log_.write("training", batches, epochs, metrics, extra);
    csv_.write("training", batches, epochs, metrics);
  }
  if (mlflow_) {
    std::vector<std::pair<std::string, double>> values = prefixed("train/", metrics);
    values.emplace_back("train/samples_per_second", samples_per_second);
    Json rates = Json::object(), times = Json::object();
    for (const auto& [name, lr] : learning_rates) {
      values.emplace_back("train/" + name, lr);
      rates[name] = lr;
    }
    for (const auto& [phase, value] : phase_seconds) {
      values.emplace_back(std::string("timing/") + phase + "_seconds", value);
      times[phase] = value;
    }
    mlflow_->log_metrics("training", batches, values,
                         {{"dettrial.learning_rates", rates.dump()}, {"dettrial.phase_seconds", times.dump()}});
  }
  if (tensorboard_) {
    add_scalars("train/", metrics, batches);
    tensorboard_->add_scalar("train/samples_per_second", samples_per_second, batches);
    for (const auto& [name, lr] : learning_rates) tensorboard_->add_scalar("train/" + name, lr, batches);
    for (const auto& [phase, value] : phase_seconds) tensorboard_->add_scalar(std::string("timing/") + phase + "_seconds", value, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::validation(std::int64_t batches, std::int64_t epochs, const MetricValues& metrics, std::int64_t records,
                                          double seconds) {
  char tail[96];
  if (records > 0) std::snprintf(tail, sizeof tail, "  (%lld records in %.2f s)", static_cast<long long>(records), seconds);
  else std::snprintf(tail, sizeof tail, "  (%.2f s)", seconds);
  progress_.line("[validation]" + format_metrics(metrics) + tail);
  log_.write("validation", batches, epochs, metrics, Json{{"seconds", seconds}});
  csv_.write("validation", batches, epochs, metrics);
  if (mlflow_) {
    std::vector<std::pair<std::string, double>> values = prefixed("validation/", metrics);
    values.emplace_back("timing/validation_seconds", seconds);
    mlflow_->log_metrics("validation", batches, values);
  }
  if (tensorboard_) {
    add_scalars("validation/", metrics, batches);
    tensorboard_->add_scalar("timing/validation_seconds", seconds, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::checkpoint(std::int64_t batches, std::int64_t epochs, const std::filesystem::path& path, double seconds,
                                          double write_seconds) {
  char tail[96];
  if (write_seconds > 0.005) std::snprintf(tail, sizeof tail, " (%.2f s, then %.2f s in the background)", seconds, write_seconds);
  else std::snprintf(tail, sizeof tail, " (%.2f s)", seconds);
  progress_.line("[checkpoint] batches " + std::to_string(batches) + ": " + path.string() + tail);
  log_.write("checkpoint", batches, epochs, MetricValues{},
             Json{{"seconds", seconds}, {"write_seconds", write_seconds}, {"uuid", path.filename().string()}});
  if (mlflow_) {
    const std::string uuid = path.filename().string();
    mlflow_->log_metrics("checkpoint", batches, {},
                         {{"dettrial.checkpoint.batch_" + std::to_string(batches), uuid + " " + path.string()},
                          {"dettrial.checkpoint.latest", uuid},
                          {"dettrial.checkpoint.latest_path", path.string()}});
  }
  if (tensorboard_) {
    tensorboard_->add_scalar("timing/checkpoint_seconds", seconds, batches);
    tensorboard_->add_scalar("timing/checkpoint_write_seconds", write_seconds, batches);
    tensorboard_->flush();
  }
}

DETTRIAL_INLINE void Reporter::restart(std::int64_t batches, std::int64_t epochs, std::int64_t ranks_before, std::int64_t ranks,
                                       std::int64_t restart) {
  const auto count = [](std::int64_t n) { return std::to_string(n) + " rank" + (n == 1 ? "" : "s"); };
  progress_.line("[restart] batches " + std::to_string(batches) + ": " +
                 (restart > 0 ? "restart " + std::to_string(restart) + ", " : std::string("resumed, ")) + "on " + count(ranks) +
                 (ranks_before == ranks ? "" : " (the checkpoint's job had " + count(ranks_before) + ")"));
  Json extra = {{"ranks_before", ranks_before}, {"ranks", ranks}};
  if (restart > 0) extra["restart"] = restart;
  log_.write("restart", batches, epochs, MetricValues{}, extra);
  if (mlflow_)
    mlflow_->log_metrics(
        "restart", batches, {},
        {{"dettrial.restart.batch_" + std::to_string(batches), std::to_string(ranks_before) + " -> " + std::to_string(ranks) + " ranks"}});
}

DETTRIAL_INLINE std::vector<std::pair<std::string, double>> Reporter::prefixed(std::string_view prefix, const MetricValues& metrics) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") out.emplace_back(std::string(prefix) + name, value);
  return out;
}

DETTRIAL_INLINE void Reporter::add_scalars(std::string_view prefix, const MetricValues& metrics, std::int64_t step) {
  for (const auto& [tag, value] : prefixed(prefix, metrics)) tensorboard_->add_scalar(tag, value, step);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/reporter.hpp
// ---- begin dettrial/report/runtime.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a run computes with, for its first line: the LibTorch version and build, the BLAS
/// behind it, and the intra-op threads. A LibTorch linked against the system BLAS (Debian's) runs
/// much slower on the reference BLAS than on OpenBLAS (1.8x on a small MLP, more with wider layers),
/// so the first line names the library loaded.

#include <string>
#include <string_view>

#include <torch/torch.h>


namespace dettrial::detail {

/// The BLAS this process loaded: "MKL (built in)" for an MKL-built LibTorch (PyPI's wheel), else the
/// shared BLAS library loaded, named by its real file ("OpenBLAS (.../openblas-pthread/libblas.so.3)",
/// "reference BLAS (.../blas/libblas.so.3)"), or "unknown".
DETTRIAL_INLINE std::string loaded_blas();

/// "LibTorch 2.5.1 (CPU), MKL (built in), 4 threads (the 4 CPUs this process may run on: intra-op 4,
/// MKL 4 (...), inter-op 4)": the source of the thread count and what each pool got.
DETTRIAL_INLINE std::string runtime_summary(std::string_view threads_source, std::string_view pools);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <link.h>

#include <cstdlib>
#include <filesystem>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::string loaded_blas() {
  if (at::globalContext().hasMKL()) return "MKL (built in)";
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        const std::string_view file = name.substr(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1);
        if (file.starts_with("libblas.so") || file.starts_with("libopenblas") || file.starts_with("libblis") ||
            file.starts_with("libflexiblas") || file.starts_with("libmkl_rt")) {
          *static_cast<std::string*>(out) = std::string(name);
          return 1;
        }
        return 0;
      },
      &found);
  if (found.empty()) return "unknown";
  std::error_code ec;
  const std::string real = std::filesystem::canonical(found, ec).string();
  const std::string path = ec ? found : real;
  const char* kind = path.find("openblas") != std::string::npos ? "OpenBLAS"
                     : path.find("blis") != std::string::npos   ? "BLIS"
                     : path.find("mkl") != std::string::npos    ? "MKL"
                     : path.find("/blas/") != std::string::npos ? "reference BLAS (slow: install an optimized BLAS such as OpenBLAS)"
                                                                : "BLAS";
  return std::string(kind) + " (" + path + ")";
}

DETTRIAL_INLINE std::string runtime_summary(std::string_view threads_source, std::string_view pools) {
  std::string s = "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                  std::to_string(TORCH_VERSION_PATCH);
  s += torch::cuda::is_available() ? " (CUDA, " + std::to_string(torch::cuda::device_count()) + " GPUs)" : " (CPU)";
  s += ", " + loaded_blas();
  const int threads = at::get_num_threads();
  s += ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  s += " (" + std::string(threads_source.empty() ? "LibTorch's default" : threads_source) +
       (pools.empty() ? std::string() : ": " + std::string(pools)) + ")";
  if (keep_freed_memory()) s += ", malloc keeps freed memory";
  return s;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/report/runtime.hpp
// ---- begin dettrial/trainer/callbacks.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Callbacks as the trainer holds them: each type checked once against the hook table
/// (vocabulary/callbacks.hpp), and a set of them called hook by hook.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>


namespace dettrial {

namespace detail {

/// Checks each callback type once: a sentence instead of silence for a hook-less (misspelt) one, and
/// for a hook declared with the wrong parameters.
template <class C>
consteval bool check_callback() {
  static_assert(Callback<C>,
                "dettrial callback: this type has none of dettrial's callback hooks (on_training_start, "
                "on_training_epoch_end, on_validation_end, ...); check the hook names and parameter types");
  return check_hooks<C>(static_cast<hook::all*>(nullptr));
}

/// A tuple of references to the callbacks of one fit: the trial's own, then the caller's.
template <class... C>
class CallbackSet {
 public:
  static constexpr std::size_t size = sizeof...(C);
  explicit CallbackSet(std::tuple<C&...> callbacks) : callbacks_(callbacks) { (check_callback<C>(), ...); }

  /// Calls `Hook` on every callback that has it, in order, with the table's argument types.
  template <class Hook, class... A>
  void call(A&&... args) {
    std::apply([&](auto&... cb) { (call_one<Hook>(cb, args...), ...); }, callbacks_);
  }
  /// Calls `f(callback)` for each callback, in order (reversed: last first).
  template <class F>
  void each(F&& f) {
    std::apply([&](auto&... cb) { (f(cb), ...); }, callbacks_);
  }
  template <class F>
  void each_reversed(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::get<sizeof...(C) - 1 - I>(callbacks_)), ...);
    }(std::index_sequence_for<C...>{});
  }
  /// Whether any callback wants per-batch training metrics (only then are they kept).
  static constexpr bool wants_batch_metrics = (hook::on_training_workload_end::takes_batches<C> || ...);
  /// Whether any callback wants the per-batch validation outputs.
  static constexpr bool wants_validation_outputs = (hook::on_validation_epoch_end::callable<C> || ...);

 private:
  template <class Hook, class Callback, class... A>
  static void call_one(Callback& cb, A&... args) {
    if constexpr (Hook::template callable<Callback>) Hook::call(cb, args...);
  }
  std::tuple<C&...> callbacks_;
};

}  // namespace detail
}  // namespace dettrial
// ---- end dettrial/trainer/callbacks.hpp
// ---- begin dettrial/trainer/fit_options.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The options of Trainer::fit (Determined's Trainer.fit arguments) and what fit returns.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>


namespace dettrial {

/**
 * @brief How long to train and when to validate, checkpoint and report.
 * @code{.cpp}
 * trainer.fit({.max_length = dettrial::Epoch{5},
 *              .validation_period = dettrial::Epoch{1},
 *              .reporting_period = dettrial::Batch{100}});
 * @endcode
 */
struct FitOptions {
  /// Total training length (required): Batch, Epoch, or Record (converted with the global batch size).
  std::optional<TrainUnit> max_length;
  /// Validate when this period is reached (default: never, but always once at the end).
  TrainUnit validation_period = never();
  /// Checkpoint when this period is reached (default: never, but always once at the end).
  TrainUnit checkpoint_period = never();
  /// Report training metrics (and progress) when this period is reached.
  TrainUnit reporting_period = Batch(100);
  /// Whether to checkpoint right after a validation: all, none, or best by `searcher_metric`.
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  /// The validation metric `best` compares, and its direction.
  std::string searcher_metric{};
  bool smaller_is_better = true;
  /// Validate once before training (when nothing has been trained yet).
  bool step_zero_validation = false;
  /// Train one batch, validate on one batch, then stop: a quick check that the trial runs.
  bool test_mode = false;
  /// Resume from this checkpoint: a checkpoint directory, or a directory holding checkpoints (a
  /// storage directory, or a run's output directory), whose latest is taken.
  std::optional<std::filesystem::path> latest_checkpoint{};
  /// When the resumed checkpoint has an optimizer or LR scheduler state the trial's cannot take (a
  /// Determined checkpoint's LambdaLR, another optimizer type), start that part fresh with a warning
  /// instead of stopping with an error that names it.
  bool resume_fresh_parts = false;
  /// How many times a launcher (or max_restarts) restarted this job; a resumed run with one, or on
  /// another rank count than its checkpoint's, logs a `restart` record saying so.
  std::int64_t restart = 0;
  /// Where metrics.jsonl (and checkpoints) go; empty means `runs/<date>-<time>` under the working directory.
  std::filesystem::path output_dir{};
  /// Where checkpoints go; empty means `<output_dir>/checkpoints`.
  std::filesystem::path checkpoint_dir{};
  /// How many checkpoints to keep (best by the searcher metric, and latest).
  Retention retention{};
  /// Write checkpoints in the background from a snapshot in host memory, while training goes on
  /// (`checkpoint_storage.async`); false writes them in the step loop.
  bool async_checkpoints = true;
  /// The trial's id, saved in its checkpoints: resuming a checkpoint of another trial loads its
  /// weights and optimizer state but starts counting afresh (Determined's warm start).
  std::int64_t trial_id = 0;
  /// Catch SIGINT and SIGTERM during fit: finish the batch, checkpoint and return (see FitResult::signal).
  bool handle_signals = true;
  /// Terminal and log output.
  ReportOptions report{};
  /// LibTorch's profiler over a range of batches, written to `<output_dir>/trace.json` (the
  /// experiment config's `profiling` section).
  ExperimentConfig::Profiling profiling{};
  /// How the training step runs: eagerly (capture::none), or captured once in a CUDA graph and
  /// replayed (capture::cuda_graph; the experiment config's `optimizations.step_capture`).
  StepCapture step_capture = capture::none{};
  /// An MLflow server the run is tracked in (the experiment config's `mlflow` section); tracking is
  /// also on when MLFLOW_TRACKING_URI is set.
  MlflowSettings mlflow{};

  /**
   * @brief The options an experiment config implies, as Determined maps them: searcher.max_length (or
   * max_steps x scheduling_unit), min_validation_period, min_checkpoint_period, reporting every
   * scheduling_unit batches, perform_initial_validation, checkpoint_policy and the searcher metric.
   */
  static FitOptions from_config(const ExperimentConfig& config);
};

/// What fit returns.
struct FitResult {
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// The last training report and the last validation.
  MetricValues last_training_metrics;
  MetricValues last_validation_metrics;
  std::int64_t validations = 0;
  /// The checkpoints this fit wrote, oldest first (some may since have been deleted by retention).
  std::vector<CheckpointInfo> checkpoints;
  /// Where checkpoints went.
  std::filesystem::path checkpoint_dir{};
  /// The batch training resumed from (0 for a fresh start).
  std::int64_t resumed_from_batch = 0;
  /// True when the trial asked to stop (context.set_stop_requested) or a signal did.
  bool stop_requested = false;
  /// True when that stop came before max_length.
  bool stopped_early = false;
  /// The signal (SIGINT, SIGTERM) that stopped training after a checkpoint, or 0.
  int signal = 0;
  std::filesystem::path output_dir{};
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE FitOptions FitOptions::from_config(const ExperimentConfig& config) {
  FitOptions o;
  o.max_length = config.searcher.max_length;
  if (config.min_validation_period) o.validation_period = *config.min_validation_period;
  if (config.min_checkpoint_period) o.checkpoint_period = *config.min_checkpoint_period;
  o.reporting_period = Batch(config.scheduling_unit);
  o.step_zero_validation = config.perform_initial_validation;
  o.checkpoint_policy = config.checkpoint_policy;
  o.searcher_metric = config.searcher.metric;
  o.smaller_is_better = config.searcher.smaller_is_better;
  if (config.checkpoint_storage.path) o.checkpoint_dir = *config.checkpoint_storage.path;
  o.profiling = config.profiling;
  o.step_capture = config.step_capture;
  o.retention = {.save_trial_best = config.checkpoint_storage.save_trial_best,
                 .save_trial_latest = config.checkpoint_storage.save_trial_latest};
  o.async_checkpoints = config.checkpoint_storage.async;
  o.mlflow = config.mlflow;
  return o;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/trainer/fit_options.hpp
// ---- begin dettrial/trainer/load_trial.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `load_trial_from_checkpoint_path`: a trial rebuilt from a checkpoint, with the
/// hyperparameters and config it was trained with (its `load_data.json`), optionally changed, and
/// its models' weights loaded: for inference, evaluation or fine-tuning outside a run.

#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

// ---- begin dettrial/trainer/trainer.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::Trainer<TrialT>: checks a trial at compile time and runs Determined's training
/// loop for it, generated inline.

#include <concepts>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

// ---- begin dettrial/detail/scope_exit.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Runs a function when a scope ends, however it ends (std::experimental::scope_exit's role).

#include <utility>

namespace dettrial::detail {

template <class F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  ~ScopeExit() {
    if (armed_) f_();
  }
  /// The scope ended as planned: do not run the function.
  void dismiss() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

/// `auto guard = on_scope_exit([&] { ... });`
template <class F>
ScopeExit<F> on_scope_exit(F f) {
  return ScopeExit<F>(std::move(f));
}

}  // namespace dettrial::detail
// ---- end dettrial/detail/scope_exit.hpp
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
/// prefix (`val_loss`, `val_accuracy`). Keras's callbacks are in callbacks.hpp.

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

// ---- begin dettrial/keras/callbacks.hpp
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


namespace dettrial::keras {

namespace detail {

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

}  // namespace detail

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


namespace dettrial::keras {

namespace detail {

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

}  // namespace detail

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
  dettrial::detail::write_atomically(path, dettrial::detail::pickle_archive(module_state_dict(*context_->models().front())));
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
// ---- end dettrial/keras/callbacks.hpp

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
namespace losses {
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
}  // namespace losses

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

namespace detail {
/// Keras's optimizer of that name over `parameters`, with Keras's defaults (Adam: lr 0.001, eps 1e-7; SGD:
/// lr 0.01; RMSprop: lr 0.001, rho 0.9, eps 1e-7; AdamW: lr 0.001, weight decay 0.004, eps 1e-7;
/// Adagrad: lr 0.001, initial accumulator 0.1, eps 1e-7). An unknown name is a ConfigError with a suggestion.
DETTRIAL_INLINE std::shared_ptr<torch::optim::Optimizer> optimizer_named(const std::string& name,
                                                                         const std::vector<torch::Tensor>& parameters);
/// The metrics of `names`, `accuracy` resolved by `loss` as Keras resolves it.
DETTRIAL_INLINE std::vector<CompiledMetric> metrics_named(const std::vector<std::string>& names, const Loss& loss);
/// The loss of a batch (the mean over its rows).
DETTRIAL_INLINE torch::Tensor loss_value(const Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// One metric of a batch, as a tensor on the batch's device (no synchronisation).
DETTRIAL_INLINE torch::Tensor metric_value(CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's loss of each sample (its values averaged over the last axis where Keras averages), for weighting.
DETTRIAL_INLINE torch::Tensor per_sample_loss(const Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true);
/// Keras's weighted loss: sum(weight x per-sample loss) / the number of per-sample values.
DETTRIAL_INLINE torch::Tensor weighted_loss_value(const Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights);
/// The weights of a WeightedSequence: sample weights times class weights, one per sample, as float.
DETTRIAL_INLINE torch::Tensor combined_weights(const WeightedSequence& s);

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
}  // namespace detail

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

namespace detail {
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
}  // namespace detail

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

namespace dettrial::keras {

namespace detail {

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
                    dettrial::detail::suggestion(name, {"adam", "sgd", "rmsprop", "adamw", "adagrad"}) +
                    " (by name: adam, sgd, rmsprop, adamw, adagrad; or pass an optimizer)");
}

DETTRIAL_INLINE std::vector<CompiledMetric> metrics_named(const std::vector<std::string>& names, const Loss& loss) {
  using Kind = CompiledMetric::Kind;
  std::vector<CompiledMetric> out;
  for (const std::string& name : names) {
    if (name == "loss") throw ConfigError("keras::compile: 'loss' is always reported; it is not a metric to ask for");
    Kind kind;
    if (name == "accuracy" || name == "acc") {
      // Keras picks the accuracy that fits the loss.
      if (std::holds_alternative<losses::CategoricalCrossentropy>(loss)) kind = Kind::categorical_accuracy;
      else if (std::holds_alternative<losses::BinaryCrossentropy>(loss)) kind = Kind::binary_accuracy;
      else kind = Kind::sparse_categorical_accuracy;
    } else if (name == "sparse_categorical_accuracy") kind = Kind::sparse_categorical_accuracy;
    else if (name == "categorical_accuracy") kind = Kind::categorical_accuracy;
    else if (name == "binary_accuracy") kind = Kind::binary_accuracy;
    else if (name == "mse" || name == "mean_squared_error") kind = Kind::mean_squared_error;
    else if (name == "mae" || name == "mean_absolute_error") kind = Kind::mean_absolute_error;
    else
      throw ConfigError("keras::compile: unknown metric '" + name + "'" +
                        dettrial::detail::suggestion(
                            name, {"accuracy", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy", "mse", "mae"}));
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

DETTRIAL_INLINE torch::Tensor loss_value(const Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        if constexpr (std::is_same_v<L, losses::SparseCategoricalCrossentropy>) {
          // Classes on the last axis; labels of shape (N) or (N, 1) (Keras squeezes the last axis).
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return torch::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}));
        } else if constexpr (std::is_same_v<L, losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1).mean();
        } else if constexpr (std::is_same_v<L, losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          if (l.from_logits) return torch::binary_cross_entropy_with_logits(y_pred, target);
          return torch::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target);
        } else if constexpr (std::is_same_v<L, losses::MeanSquaredError>) {
          return torch::mse_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else if constexpr (std::is_same_v<L, losses::MeanAbsoluteError>) {
          return torch::l1_loss(y_pred, y_true.to(y_pred.dtype()).reshape(y_pred.sizes()));
        } else {
          if (!l) throw TrialError("keras::compile was given an empty custom loss");
          return l(y_pred, y_true);
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor per_sample_loss(const Loss& loss, const torch::Tensor& output, const torch::Tensor& y_true) {
  constexpr double eps = keras_epsilon;
  const torch::Tensor y_pred = loss_input(output);
  return std::visit(
      [&](const auto& l) -> torch::Tensor {
        using L = std::decay_t<decltype(l)>;
        namespace F = torch::nn::functional;
        if constexpr (std::is_same_v<L, losses::SparseCategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return F::nll_loss(log_p.reshape({-1, log_p.size(-1)}), y_true.to(torch::kLong).reshape({-1}),
                             F::NLLLossFuncOptions().reduction(torch::kNone));
        } else if constexpr (std::is_same_v<L, losses::CategoricalCrossentropy>) {
          const torch::Tensor log_p = log_probabilities(l.from_logits, y_pred);
          return -(y_true.to(log_p.dtype()) * log_p).sum(-1);
        } else if constexpr (std::is_same_v<L, losses::BinaryCrossentropy>) {
          const torch::Tensor target = y_true.to(y_pred.dtype()).reshape(y_pred.sizes());
          const torch::Tensor each =
              l.from_logits
                  ? F::binary_cross_entropy_with_logits(y_pred, target,
                                                        F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone))
                  : F::binary_cross_entropy(y_pred.clamp(eps, 1 - eps), target, F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
          return each.mean(-1);
        } else if constexpr (std::is_same_v<L, losses::MeanSquaredError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).square().mean(-1);
        } else if constexpr (std::is_same_v<L, losses::MeanAbsoluteError>) {
          return (y_pred - y_true.to(y_pred.dtype()).reshape(y_pred.sizes())).abs().mean(-1);
        } else {
          throw TrialError(
              "keras: a custom loss returns one number for the batch, so sample or class weights cannot weigh its "
              "samples; use one of Keras's losses, or weigh inside the custom loss");
        }
      },
      loss);
}

DETTRIAL_INLINE torch::Tensor weighted_loss_value(const Loss& loss, const torch::Tensor& y_pred, const torch::Tensor& y_true,
                                                  const torch::Tensor& sample_weights) {
  const torch::Tensor each = per_sample_loss(loss, y_pred, y_true);
  // One weight per sample, broadcast over any further axes of the per-sample losses.
  std::vector<std::int64_t> shape(static_cast<std::size_t>(each.dim()), 1);
  shape[0] = each.size(0);
  const torch::Tensor weights = sample_weights.to(each.dtype()).reshape(shape);
  return (each * weights).sum() / static_cast<double>(each.numel());
}

DETTRIAL_INLINE torch::Tensor combined_weights(const WeightedSequence& s) {
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

DETTRIAL_INLINE torch::Tensor metric_value(CompiledMetric::Kind kind, const torch::Tensor& y_pred, const torch::Tensor& y_true) {
  using Kind = CompiledMetric::Kind;
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

}  // namespace detail

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
// ---- end dettrial/keras/keras.hpp
// ---- begin dettrial/trainer/run.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Run<TrialT, Set>: one fit of a valid trial, Determined's loop generated for it
/// (workloads ending at any boundary, validation, checkpoints, reports, the final validation).
/// Trainer<TrialT> builds the trial and makes a Run for each fit; what does not depend on the trial
/// type is detail::RunState's (run_state.hpp).

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

// ---- begin dettrial/data/copy_ahead.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batches moved to the device one ahead: while the GPU computes batch k, batch k+1 copies on
/// a stream of its own.

#include <memory>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>


namespace dettrial::detail {

/**
 * @brief A CUDA stream of its own for copies to the device, and the event that orders the compute
 * stream after them. Compiled once (dettrial::compiled in separate-compilation mode), so that a
 * trial's translation unit reads no CUDA header. Made only for a CUDA device with a CUDA-built
 * LibTorch; CopyAhead copies on the compute stream without one.
 */
class SideCopyStream {
 public:
  /// A side stream on `device` (a CUDA device).
  DETTRIAL_INLINE explicit SideCopyStream(torch::Device device);
  DETTRIAL_INLINE ~SideCopyStream();
  SideCopyStream(const SideCopyStream&) = delete;
  SideCopyStream& operator=(const SideCopyStream&) = delete;

  /// Whether side streams exist in this build (LibTorch is CUDA-built).
  DETTRIAL_INLINE static bool available();
  /// Makes the side stream current, until leave().
  DETTRIAL_INLINE void enter();
  /// Marks the copies queued on the side stream so far, for order_compute_after().
  DETTRIAL_INLINE void record_copies();
  /// Makes the stream current before enter() current again.
  DETTRIAL_INLINE void leave() noexcept;
  /// Makes the device's compute stream wait for the recorded copies (the host does not wait), and
  /// returns that stream, for the tensors it will read (Tensor::record_stream).
  DETTRIAL_INLINE c10::Stream order_compute_after();

 private:
  /// The stream, the event and the stream guard (CUDA types, complete where compiled).
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  torch::Device device_;
};

/**
 * @brief Reads a batch stream (which it holds) with one batch staged on the device ahead of the one
 * in use.
 *
 * `stage()` takes the stream's next batch and starts its copy to the device; `take()` hands over the
 * staged batch (staging it first if none is) once its copy is done on the device's queue, without the
 * host waiting. On a CUDA device the copy runs on a side stream: the compute stream waits for it with
 * an event, and each copied tensor is marked as used by the compute stream, so its memory is not reused
 * while kernels still read it. Elsewhere, and for batches holding user types, the batch is moved as
 * `to_device_in_place` moves it, on the compute stream.
 *
 * The caller decides when to stage: the trainer stages the next batch only when it will train it
 * right away, never across a boundary, so batches are read from the stream in the same order relative
 * to the training steps as without staging (a checkpoint never follows a read that was not trained).
 */
template <std::ranges::input_range Stream>
class CopyAhead {
 public:
  using batch_type = std::remove_cvref_t<std::ranges::range_reference_t<Stream>>;

  CopyAhead(Stream stream, torch::Device device)
      : stream_(std::move(stream)), it_(std::ranges::begin(stream_)), end_(std::ranges::end(stream_)), device_(device) {
    // A batch with tensors for_each_tensor cannot reach (inside a user type) is copied on the compute
    // stream: its tensors could not be marked as used there.
    if (device_.is_cuda() && tensors_only_batch<batch_type>() && SideCopyStream::available()) copy_stream_.emplace(device_);
  }

  // Its iterator points into the stream it holds.
  CopyAhead(const CopyAhead&) = delete;
  CopyAhead& operator=(const CopyAhead&) = delete;

  /// Whether the stream has a next batch to stage (staged or not).
  bool has_next() const { return staged_.has_value() || it_ != end_; }

  /// Reads the stream's next batch and starts its copy to the device; nothing when one is staged
  /// already or the stream has ended.
  void stage() {
    if (staged_ || it_ == end_) return;
    batch_type batch = std::move(*it_);  // a stream's batch is read once: taken, not copied
    ++it_;
    if (copy_stream_) {
      copy_stream_->enter();
      const auto back = on_scope_exit([&] { copy_stream_->leave(); });
      to_device_in_place(batch, device_, /*non_blocking=*/true);
      copy_stream_->record_copies();
      staged_.emplace(std::move(batch));
      return;
    }
    to_device_in_place(batch, device_, /*non_blocking=*/device_.is_cuda());
    staged_.emplace(std::move(batch));
  }

  /// The staged batch (staged now if none was), its copy ordered before the compute stream's next work.
  batch_type take() {
    stage();
    if (!staged_) throw std::logic_error("CopyAhead::take: the batch stream has ended");
    batch_type batch = std::move(*staged_);
    staged_.reset();
    if (copy_stream_) {
      const c10::Stream compute = copy_stream_->order_compute_after();
      // Memory allocated on the copy stream is otherwise free for it again as soon as the batch dies,
      // while the compute stream may still be reading it.
      for_each_tensor(batch, [&](torch::Tensor& t) {
        if (t.defined() && t.is_cuda()) t.record_stream(compute);
      });
    }
    return batch;
  }

 private:
  Stream stream_;
  std::ranges::iterator_t<Stream> it_;
  std::ranges::sentinel_t<Stream> end_;
  torch::Device device_;
  std::optional<batch_type> staged_;
  std::optional<SideCopyStream> copy_stream_;
};

template <class Stream>
CopyAhead(Stream&&, torch::Device) -> CopyAhead<std::remove_cvref_t<Stream>>;

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
// DETTRIAL_HAS_CUDA: LibTorch is CUDA-built (dettrial's CMake defines it).
#if defined(DETTRIAL_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dettrial::detail {

#if defined(DETTRIAL_HAS_CUDA)
struct SideCopyStream::Cuda {
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAEvent copied{};
  std::optional<c10::cuda::CUDAStreamGuard> on_stream{};
};
DETTRIAL_INLINE SideCopyStream::SideCopyStream(torch::Device device)
    // Built in place: the guard it holds cannot be moved.
    : cuda_(new Cuda{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())}), device_(device) {}
DETTRIAL_INLINE bool SideCopyStream::available() { return true; }
DETTRIAL_INLINE void SideCopyStream::enter() { cuda_->on_stream.emplace(cuda_->stream); }
DETTRIAL_INLINE void SideCopyStream::record_copies() { cuda_->copied.record(cuda_->stream); }
DETTRIAL_INLINE void SideCopyStream::leave() noexcept { cuda_->on_stream.reset(); }
DETTRIAL_INLINE c10::Stream SideCopyStream::order_compute_after() {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  cuda_->copied.block(compute);
  return compute;
}
#else
struct SideCopyStream::Cuda {};
DETTRIAL_INLINE SideCopyStream::SideCopyStream(torch::Device device) : device_(device) {}
DETTRIAL_INLINE bool SideCopyStream::available() { return false; }
DETTRIAL_INLINE void SideCopyStream::enter() {}
DETTRIAL_INLINE void SideCopyStream::record_copies() {}
DETTRIAL_INLINE void SideCopyStream::leave() noexcept {}
DETTRIAL_INLINE c10::Stream SideCopyStream::order_compute_after() { return c10::Stream(c10::Stream::DEFAULT, device_); }
#endif
DETTRIAL_INLINE SideCopyStream::~SideCopyStream() = default;

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/data/copy_ahead.hpp
// ---- begin dettrial/detail/signals.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief SIGINT and SIGTERM during fit: the first asks the trainer to finish the batch, checkpoint
/// and return; a second one ends the process at once (the default action of that signal).

#include <atomic>
#include <csignal>
#include <optional>

#include <signal.h>
#include <unistd.h>


namespace dettrial::detail {

/// The signal that asked the running fit to stop, or 0. Read once per batch (a relaxed load).
inline std::atomic<int> pending_stop_signal{0};

extern "C" DETTRIAL_INLINE void dettrial_on_stop_signal(int signal_number);

/// Installs `handler` for SIGINT and SIGTERM while alive; restores the previous handlers when it goes.
class SignalHandlers {
 public:
  explicit SignalHandlers(void (*handler)(int), int flags = 0);
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;
  ~SignalHandlers();

 private:
  struct sigaction previous_int_{};
  struct sigaction previous_term_{};
};

/// Catches SIGINT and SIGTERM during one fit (see dettrial_on_stop_signal). A signal belongs to the
/// fit it arrived in: it is forgotten when that fit ends, so a later fit in the process trains.
class StopSignals {
 public:
  explicit StopSignals(bool enabled);
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();
  /// The signal received since construction, or 0.
  static int received() { return pending_stop_signal.load(std::memory_order_relaxed); }

 private:
  std::optional<SignalHandlers> handlers_;
};

/// "SIGINT", "SIGTERM", or "a signal": how a stop is reported.
inline const char* signal_name(int signal_number) {
  return signal_number == SIGINT ? "SIGINT" : signal_number == SIGTERM ? "SIGTERM" : "a signal";
}

/// The last SIGINT/SIGTERM a process that supervises others (the built-in launcher, an experiment)
/// received, to pass on to its children; 0 when none. Its children run in process groups of their
/// own, so a terminal's Ctrl-C reaches them only through their supervisor, once per Ctrl-C.
inline std::atomic<int> supervisor_signal{0};
/// How many such signals arrived: the first asks the children to checkpoint and stop, a second one
/// passed on makes them abort.
inline std::atomic<int> supervisor_signal_count{0};
extern "C" DETTRIAL_INLINE void dettrial_on_supervisor_signal(int signal_number);

/// Ends this process with SIGTERM when the process that started it exits first (a killed launcher
/// or experiment runner must not leave ranks or trials running in process groups of their own).
/// `supervisor` is the pid the child was told in DETTRIAL_SUPERVISOR_PID.
DETTRIAL_INLINE void stop_with_supervisor(pid_t supervisor);

/// The variable that tells a child its supervisor's pid.
inline constexpr const char* supervisor_pid_variable = "DETTRIAL_SUPERVISOR_PID";

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace dettrial::detail {

extern "C" DETTRIAL_INLINE void dettrial_on_stop_signal(int signal_number) {
  if (pending_stop_signal.exchange(signal_number) != 0) {
    // Second signal: give up at once, as if dettrial had not caught the first.
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  static constexpr char message[] = "\ndettrial: stop signal received; finishing the batch and checkpointing (send it again to abort)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, message, sizeof message - 1);
}

DETTRIAL_INLINE SignalHandlers::SignalHandlers(void (*handler)(int), int flags) {
  struct sigaction action{};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = flags;
  ::sigaction(SIGINT, &action, &previous_int_);
  ::sigaction(SIGTERM, &action, &previous_term_);
}

DETTRIAL_INLINE SignalHandlers::~SignalHandlers() {
  ::sigaction(SIGINT, &previous_int_, nullptr);
  ::sigaction(SIGTERM, &previous_term_, nullptr);
}

DETTRIAL_INLINE StopSignals::StopSignals(bool enabled) {
  pending_stop_signal.store(0);
  if (enabled) handlers_.emplace(&dettrial_on_stop_signal, SA_RESTART);
}

DETTRIAL_INLINE StopSignals::~StopSignals() {
  handlers_.reset();  // first: a signal arriving now gets the previous handler, not a stale record
  pending_stop_signal.store(0);
}

extern "C" DETTRIAL_INLINE void dettrial_on_supervisor_signal(int signal_number) {
  supervisor_signal.store(signal_number);
  supervisor_signal_count.fetch_add(1);
}

DETTRIAL_INLINE void stop_with_supervisor(pid_t supervisor) {
#if defined(__linux__)
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
  if (::getppid() != supervisor) std::raise(SIGTERM);  // it exited before prctl took effect
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/signals.hpp
// ---- begin dettrial/trainer/run_state.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::RunState: one fit's state and the part of Determined's loop that does not depend
/// on the trial type (options, boundaries, reports, agreement across ranks, the checkpoint policy).
/// Compiled once (dettrial::compiled in separate-compilation mode): Trainer<T> keeps only what calls
/// the trial, its loaders and its callbacks.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>


namespace dettrial::detail {

/// Which boundaries the last batch of a workload reached (Determined handles them in this order).
struct Reached {
  bool length = false;
  bool validation = false;
  bool checkpoint = false;
  bool report = false;
  bool any() const { return length || validation || checkpoint || report; }
};

/// What a training workload accumulates; kept across workloads so that a batch allocates nothing.
struct Workload {
  WorkloadMeans means;
  std::vector<Metrics> batch_metrics{};  // kept only when a callback asks for them
  std::int64_t records = 0;
  PhaseTimes phases{};
  /// The end of the last timed phase.
  std::chrono::steady_clock::time_point mark{};
};

/**
 * @brief One fit: its options with every period in batches, where it stands (TrialProgress), and
 * what writes, reports and profiles it. Its functions are the loop's steps that do not call the
 * trial; Trainer<T> calls them between the trial's hooks.
 */
struct RunState {
  // Made, moved and destroyed where compiled (a trial's translation unit compiles none of its members' code).
  DETTRIAL_INLINE RunState();
  DETTRIAL_INLINE RunState(RunState&&) noexcept;
  DETTRIAL_INLINE RunState& operator=(RunState&&) noexcept;
  DETTRIAL_INLINE ~RunState();

  FitOptions options;
  /// The run folder's lock, held by the chief from begin() to end() (declared before the
  /// checkpointer: released after a write in flight ends).
  FolderLock folder_lock{};
  TrainUnit length = Batch(1);
  std::int64_t epoch_len = 0;
  /// The rank count whose global batches the training data follows (TrialProgress::data_ranks).
  std::int64_t data_ranks = 1;
  /// The training loader's own batches per epoch on this rank (epoch_len, unless records_per_epoch sets it).
  std::int64_t data_epoch_len = 0;
  /// Where the trial stands: batches and epochs trained, the last validation and checkpoint, the
  /// best searcher metric (what a checkpoint saves as `trial_state.json`; its data seeds are filled
  /// in when it is saved).
  TrialProgress progress{};
  bool warned_best_without_metric = false;
  /// Where checkpoints go, when, and how they are written, restored and retained.
  Checkpointer checkpointer{};
  /// The checkpoint resumed from, and where it says the trial stood.
  std::optional<std::filesystem::path> resume_dir{};
  std::optional<TrialProgress> resumed{};
  bool same_trial = false;
  FitResult result{};
  /// The run in MLflow (on the chief, when tracked), and the status it ends with.
  std::unique_ptr<MlflowRun> mlflow{};
  std::string mlflow_status = "FAILED";
  Reporter reporter{};
  TraceProfiler profiler{};
  /// Wait for the GPU at each phase's end while profiling, so that the phase timings are the GPU's (profiling.sync_timings).
  bool sync_timings = false;
  /// Whether the first eager batch after a capture was announced.
  bool eager_batch_announced = false;

  /// Checks the options, finds (and checks) the checkpoint to resume from before anything is
  /// written, and sets up the output folder, checkpoint storage, reporter and profiler.
  DETTRIAL_INLINE static RunState begin(Context& context, FitOptions options);

  /// The batch this fit starts from: the one the resumed checkpoint of the same trial stood at.
  std::int64_t first_batch() const { return same_trial ? resumed->batches_trained : 0; }
  /// The epoch length from the chief's sharded length (agreed already) and records_per_epoch,
  /// and the run's position in the context.
  DETTRIAL_INLINE void settle_epoch_length(Context& context);
  /// A run begun on `began` ranks continues on this job's: its global batch must divide among them
  /// (throws ConfigError, naming both counts, where it does not).
  DETTRIAL_INLINE static void check_global_batch_divides(const Context& context, std::int64_t began);
  /// With reproducibility.rank_invariant and aggregation, every boundary must fall on an update's
  /// last batch: the micro-batches of an update are kept apart until it, and no checkpoint holds
  /// them (throws ConfigError naming the period that does not).
  DETTRIAL_INLINE void check_rank_invariant_boundaries(const Context& context) const;
  /// After a restore: the position the training stream starts from; every rank takes rank 0's weights.
  DETTRIAL_INLINE void start_position(Context& context);
  /// The fit options that place boundaries must be the same on every rank (throws where not).
  DETTRIAL_INLINE void require_same_settings(Communicator& comm, const Context& context) const;

  /// The run's first lines: the runtime, the trial, the job, the checkpoint resumed from.
  DETTRIAL_INLINE void announce(Context& context);
  /// One TensorBoard hparams session a folder: a resumed run's folder already starts one.
  DETTRIAL_INLINE static void start_tensorboard_session(Context& context);
  /// The session ends as the fit does: failed when it throws.
  DETTRIAL_INLINE static void end_tensorboard_session(Context& context, bool succeeded) noexcept;
  /// The profiler's summary line, after a profiled range ended.
  DETTRIAL_INLINE void report_profile();
  /// The step was captured at batch `batch_idx` (its line).
  DETTRIAL_INLINE void note_capture(std::int64_t batch_idx);
  /// Batch `batch_idx` runs eagerly after the capture (a line the first time).
  DETTRIAL_INLINE void note_eager_batch(std::int64_t batch_idx);
  /// A warning for each callback whose state the checkpoint lacks.
  DETTRIAL_INLINE void warn_missing_callback_states(const std::vector<std::string>& names);
  /// The trial trained to its length: retention applies without sparing the newest checkpoint.
  DETTRIAL_INLINE void complete(const Context& context);
  /// The fit's result, with what it trained, after its report is written.
  DETTRIAL_INLINE FitResult finish(const Context& context);
  /// However the fit ends: a checkpoint write in flight ends (a failure is a warning then), and
  /// the run folder's lock is released.
  DETTRIAL_INLINE void release() noexcept;
  /// Writes the trace when training ended (or stopped) inside the profiled range.
  DETTRIAL_INLINE void finish_profiling();
  /// The run's report.html, from its metrics.jsonl (on the chief). A report that cannot be written
  /// is a warning: the training it describes is done and saved.
  DETTRIAL_INLINE void write_report(const Context& context);

  /// Batches (or epochs) still to train.
  std::int64_t remaining() const {
    return length.unit() == Unit::epochs ? length.value() - progress.epochs_trained : length.value() - progress.batches_trained;
  }
  /// Determined's boundary rule: batch periods on batches completed; epoch periods on the last batch
  /// of an epoch, on epochs completed.
  DETTRIAL_INLINE Reached boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const;

  /// A workload begins: models in training mode, training reducers and the workload's sums reset.
  DETTRIAL_INLINE void begin_workload(Context& context, Workload& workload);
  /// The workload's training metrics over all ranks (reported, and kept as the last ones).
  DETTRIAL_INLINE const MetricValues& report_training(Context& context, const Workload& workload);

  /// A validation begins: rank 0's buffers, models in evaluation mode, validation reducers reset.
  DETTRIAL_INLINE static void begin_validation(Context& context);
  /// This rank's share and every other's, reduced: the validation's metrics, as the callbacks get them.
  DETTRIAL_INLINE MetricValues reduce_validation(Context& context, RankShare mine, std::int64_t& records) const;
  /// After on_validation_end: LR schedulers on the metrics, counters, report. Returns the metrics
  /// with `batches` and `epochs`, as reported and as the checkpoint policy reads them.
  DETTRIAL_INLINE const MetricValues& finish_validation(Context& context, const MetricValues& metrics, std::int64_t records);
  /// After a validation: tracks the best searcher metric; whether the policy asks for a checkpoint.
  DETTRIAL_INLINE bool checkpoint_after_validation(Context& context, const MetricValues& reported);

  /// What a checkpoint saves besides the state, with the loaders' data seeds.
  DETTRIAL_INLINE TrialCheckpointRecord checkpoint_record(const Context& context, std::optional<std::uint64_t> training_data_seed,
                                                          std::optional<std::uint64_t> validation_data_seed, std::string trial_type) const;
  /// A checkpoint the chief wrote: recorded, reported, and retention applied sparing it.
  DETTRIAL_INLINE void checkpoint_written(const WrittenCheckpoint& written);
  /// Training stops early (after its checkpoint) for `signal`, or 0 for a stop request: the result
  /// says why, and a line says so.
  DETTRIAL_INLINE void stopped(int signal);
};

/// `runs/<date>-<time>-<pid>` under the working directory.
DETTRIAL_INLINE std::filesystem::path default_output_dir();

/// The training loader's endless stream ended (a DataError naming the batch).
[[noreturn]] DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx);

/// A configuration error (exit status 78): every trial of a search would fail the same way.
DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics);

/// Every wrapped optimizer's learning rates, named as LearningRates says; an optimizer whose
/// options cannot tell theirs (a custom type without get_lr) is left out.
DETTRIAL_INLINE LearningRates learning_rates(const Context& context);

/// Merges the user reducers taking part (`role`: for_training or for_validation) into `out`, each
/// reducing the parts of every rank.
DETTRIAL_INLINE void reduce_user_reducers(Context& context, bool WrappedReducer::* role, const std::vector<RankShare>& shares,
                                          MetricValues& out);

/// Every rank takes rank 0's buffers (see broadcast_buffers: DDP's broadcast_buffers, at the
/// boundaries that read them).
DETTRIAL_INLINE void agree_on_buffers(Context& context);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstring>
#include <ctime>
#include <iterator>
#include <unistd.h>

#include <cstdio>
#include <exception>


namespace dettrial::detail {

namespace run_state_detail {
inline TrainUnit resolve_length(const FitOptions& o, const Context& context) {
  if (o.test_mode) return Batch(1);
  if (!o.max_length)
    throw ConfigError(
        "fit() needs a training length: set FitOptions::max_length (Batch, Epoch or Record), or "
        "searcher.max_length in the experiment config and build the options with FitOptions::from_config");
  TrainUnit length = *o.max_length;
  if (length.is_schedule()) throw ConfigError("max_length must be a count, not a schedule of points");
  if (length.unit() == Unit::records) length = length.in_batches_if_records(context.get_global_batch_size());
  if (length.value() < 1) throw ConfigError("max_length is " + length.to_string() + "; training needs a max_length of at least 1");
  return length;
}
inline TrainUnit resolve_period(const TrainUnit& period, const Context& context) {
  return period.unit() == Unit::records ? period.in_batches_if_records(context.get_global_batch_size()) : period;
}
/// The profiler of `st`'s fit: set_profiler's schedule, or the config's profiling section.
inline void start_profiler(RunState& st, Context& context, std::optional<std::int64_t> resumed_at) {
  const FitOptions& o = st.options;
  if (const auto& profiler = context.profiler_options()) {
    // set_profiler: steps count from this fit's first batch; every rank writes each cycle's trace
    // into the run's TensorBoard folder under its own worker name (host and process).
    st.profiler = TraceProfiler(*profiler, resumed_at.value_or(0), {RunFolder{o.output_dir}.tensorboard(), /*one_a_cycle=*/true},
                                context.device().is_cuda());
    st.sync_timings = o.profiling.sync_timings && context.device().is_cuda();
  } else if (o.profiling.enabled) {
    // Every rank profiles its own process: the chief into trace.json, rank r into trace.rank<r>.json.
    const int rank = context.distributed().rank;
    st.profiler = TraceProfiler::for_section(o.profiling, RunFolder{o.output_dir}.trace(rank), context.device().is_cuda());
    st.sync_timings = o.profiling.sync_timings && context.device().is_cuda();
  }
}
/// The run's MLflow run, when the options or MLFLOW_TRACKING_URI name a server: its params are
/// the hyperparameters, its tags say what ran where.
inline std::unique_ptr<MlflowRun> start_mlflow(RunState& st, Context& context) {
  MlflowSettings wanted = st.options.mlflow;
  wanted.complete_from_environment();  // a search's trial learns its parent run here: it is named by its id
  const std::string name = wanted.parent_run_id.empty() ? std::filesystem::absolute(st.options.output_dir).filename().string()
                                                        : "trial " + std::to_string(st.options.trial_id);
  std::optional<MlflowSettings> settings = tracked_settings(std::move(wanted), name);
  if (!settings) return nullptr;
  MlflowRun::Start start;
  for (const auto& [name, value] : flat_hparams(context.get_hparams())) {
    std::string text = std::visit(
        []<class V>(const V& v) -> std::string {
          if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
          else if constexpr (std::is_arithmetic_v<V>) {
            char number[32];  // as the config wrote it: 32, 0.001
            std::snprintf(number, sizeof number, "%.15g", v);
            return number;
          } else {
            return std::string(v);
          }
        },
        value);
    start.params.emplace_back(name, std::move(text));
  }
  start.tags = {{"dettrial.version", DETTRIAL_VERSION_STRING},
                {"dettrial.system", runtime_summary(context.threads().source, context.thread_pools().text())},
                {"dettrial.device", context.device().str()},
                {"dettrial.ranks", std::to_string(context.distributed().size)},
                {"dettrial.run_folder", std::filesystem::absolute(st.options.output_dir).string()}};
  return std::make_unique<MlflowRun>(std::move(*settings), st.options.output_dir, std::move(start));
}
}  // namespace run_state_detail

DETTRIAL_INLINE RunState RunState::begin(Context& context, FitOptions options) {
  RunState st;
  st.options = std::move(options);
  FitOptions& o = st.options;
  if (o.output_dir.empty()) o.output_dir = default_output_dir();
  // Before anything in the folder is read or written: a second process there is refused.
  if (context.distributed().is_chief()) st.folder_lock = FolderLock::acquire(RunFolder{o.output_dir}.lock(), "run folder");
  st.length = run_state_detail::resolve_length(o, context);
  o.validation_period = run_state_detail::resolve_period(o.validation_period, context);
  o.checkpoint_period = run_state_detail::resolve_period(o.checkpoint_period, context);
  o.reporting_period = run_state_detail::resolve_period(o.reporting_period, context);
  if (o.retention.save_trial_best < 0 || o.retention.save_trial_latest < 0)
    throw ConfigError("checkpoint retention counts (save_trial_best, save_trial_latest) must not be negative");
  if (o.latest_checkpoint) {
    st.resume_dir = resolve_checkpoint(*o.latest_checkpoint);
    const CheckpointInfo info = read_checkpoint_info(*st.resume_dir);
    if (info.by_determined) {
      // Determined's trial ids belong to its master, which a moved run leaves behind: a checkpoint
      // Determined wrote is this trial's own, continued where it stood.
      st.resumed = TrialProgress::from_determined(*st.resume_dir, info);
      st.resumed->trial_id = o.trial_id;
    } else {
      st.resumed = TrialProgress::from_json(CheckpointFolder{*st.resume_dir}.trial_state());
    }
    st.same_trial = st.resumed->trial_id == o.trial_id;
  }
  st.result.output_dir = o.output_dir;
  context.position().output_dir = o.output_dir;
  const std::filesystem::path storage = o.checkpoint_dir.empty() ? RunFolder{o.output_dir}.checkpoints() : o.checkpoint_dir;
  st.result.checkpoint_dir = storage;
  // One writer per job: the chief reports and writes metrics.jsonl, event files and checkpoints.
  const bool chief = context.distributed().is_chief();
  const std::optional<std::int64_t> resumed_at = st.same_trial ? std::optional(st.resumed->batches_trained) : std::nullopt;
  if (chief) context.get_tensorboard_writer() = TensorBoardWriter(context.get_tensorboard_path(), resumed_at);
  if (chief) st.mlflow = run_state_detail::start_mlflow(st, context);
  st.reporter = Reporter(chief, o.report, o.output_dir, resumed_at,
                         context.get_enable_tensorboard_logging() ? &context.get_tensorboard_writer() : nullptr, st.mlflow.get());
  run_state_detail::start_profiler(st, context, resumed_at);
  st.checkpointer = Checkpointer(context, storage, o.checkpoint_policy, o.retention, o.smaller_is_better, o.async_checkpoints);
  return st;
}

DETTRIAL_INLINE void RunState::check_global_batch_divides(const Context& context, std::int64_t began) {
  if (!context.has_global_batch_size()) return;  // the loader's batch size is then the rank's own choice
  const auto global = context.get_hparams().get<std::int64_t>("global_batch_size");
  const std::int64_t ranks = context.distributed().size;
  if (global % ranks != 0)
    throw ConfigError("global_batch_size " + std::to_string(global) + " does not divide among " + std::to_string(ranks) +
                      " ranks: this run began on " + std::to_string(began) +
                      " and keeps its global batch when resumed; resume on a rank count that divides " + std::to_string(global));
}

DETTRIAL_INLINE void RunState::check_rank_invariant_boundaries(const Context& context) const {
  const std::int64_t agg = context.aggregation_frequency();
  if (!context.rank_invariant() || agg == 1) return;
  const std::pair<const char*, const TrainUnit*> periods[] = {{"max_length", &length},
                                                              {"the validation period", &options.validation_period},
                                                              {"the checkpoint period", &options.checkpoint_period},
                                                              {"the reporting period", &options.reporting_period}};
  for (const auto& [name, period] : periods) {
    if (period->is_never()) continue;
    const std::int64_t per_batch = period->unit() == Unit::epochs ? epoch_len : 1;
    std::vector<std::int64_t> ends = period->is_schedule() ? period->points() : std::vector<std::int64_t>{period->value()};
    for (const std::int64_t end : ends)
      if (end > 0 && end * per_batch % agg != 0)
        throw ConfigError(std::string("reproducibility.rank_invariant keeps an update's batches apart until its last one, so ") + name +
                          " (" + period->to_string() + (per_batch > 1 ? ", epochs of " + std::to_string(epoch_len) + " batches" : "") +
                          ") must end on a multiple of aggregation_frequency " + std::to_string(agg) + " batches");
  }
  if (progress.batches_trained % agg != 0)
    throw ConfigError("reproducibility.rank_invariant cannot resume at batch " + std::to_string(progress.batches_trained) +
                      ", between the batches of an update (aggregation_frequency " + std::to_string(agg) + ")");
}

DETTRIAL_INLINE void RunState::settle_epoch_length(Context& context) {
  if (epoch_len < 1) throw DataError("the training data loader yields no batches (its size() is 0)");
  data_epoch_len = epoch_len;
  // Determined's records_per_epoch: the epoch of epoch-based lengths, periods, LR steps and epoch
  // hooks, in global batches (its legacy sequencer's records_per_epoch // global_batch_size, at
  // least 1), whatever the loader's own length; the data still reshuffles at its own epochs.
  if (const std::int64_t records = context.get_experiment_config().records_per_epoch; records > 0)
    epoch_len = std::max<std::int64_t>(records / context.get_global_batch_size(), 1);
  context.position().epoch_len = epoch_len;
}

DETTRIAL_INLINE void RunState::start_position(Context& context) {
  RunPosition& position = context.position();
  position.initial_batch = progress.batches_trained;  // the training stream skips what was trained
  position.current_batch = progress.batches_trained;
  result.resumed_from_batch = progress.batches_trained;
  if (Communicator* comm = context.communicator()) broadcast_modules(*comm, context.models());  // every rank starts from rank 0's weights
}

DETTRIAL_INLINE void RunState::require_same_settings(Communicator& comm, const Context& context) const {
  const FitOptions& o = options;
  const RankSetting placing_boundaries[] = {
      {"max_length", length.to_string()},
      {"the validation period", o.validation_period.to_string()},
      {"the checkpoint period", o.checkpoint_period.to_string()},
      {"the reporting period", o.reporting_period.to_string()},
      {"test mode", o.test_mode ? "on" : "off"},
      {"step-zero validation", o.step_zero_validation ? "on" : "off"},
      {"the checkpoint policy", std::to_string(static_cast<int>(o.checkpoint_policy))},
      {"the searcher metric", o.searcher_metric + (o.smaller_is_better ? " (smaller is better)" : " (larger is better)")},
      {"the batch resumed from", std::to_string(first_batch())},
      {"aggregation_frequency", std::to_string(context.aggregation_frequency())},
      {"the global batch size", context.has_global_batch_size() ? std::to_string(context.get_global_batch_size()) : "-"}};
  detail::require_same_settings(comm, placing_boundaries);
}

DETTRIAL_INLINE void RunState::announce(Context& context) {
  const FitOptions& o = options;
  reporter.line("dettrial " DETTRIAL_VERSION_STRING ": " + runtime_summary(context.threads().source, context.thread_pools().text()));
  reporter.line("dettrial: trial seed " + std::to_string(context.get_trial_seed()) + ", device " + context.device().str() + ", training " +
                length.to_string() + " (an epoch is " + std::to_string(epoch_len) + " batches), output " + o.output_dir.string());
  if (const Communicator* comm = context.communicator())
    reporter.line("dettrial: " + std::to_string(comm->size()) + " processes (" + launcher_name(comm->environment().launcher) + ", " +
                  comm->backend_name() + "), rendezvous at " + comm->environment().master_addr + ":" +
                  std::to_string(comm->environment().master_port) + ", global batch " + std::to_string(context.get_global_batch_size()));
  if (resume_dir)
    reporter.line("dettrial: resumed from " + resume_dir->string() +
                  (same_trial ? " at batch " + std::to_string(progress.batches_trained)
                              : std::string(" (another trial's checkpoint: weights and optimizer state only)")));
  const std::int64_t ranks = context.distributed().size;
  if (same_trial && (o.restart > 0 || (resumed->ranks > 0 && resumed->ranks != ranks)))
    reporter.restart(progress.batches_trained, progress.epochs_trained, resumed->ranks > 0 ? resumed->ranks : ranks, ranks, o.restart);
  if (data_ranks != ranks)
    reporter.line("dettrial: the training data keeps the global batches of the " + std::to_string(data_ranks) +
                  "-rank job this run began as: each of the " + std::to_string(ranks) + " ranks trains its share of each");
  if (const auto* graph = std::get_if<capture::cuda_graph>(&o.step_capture))
    reporter.line("dettrial: the training step is captured in a CUDA graph after " + std::to_string(graph->warmup_batches) +
                  " eager batch(es), and replayed; batches of other shapes run eagerly");
  if (const auto& profiler = context.profiler_options()) {
    const ProfilerSchedule& s = profiler->schedule;
    reporter.line("dettrial: profiling on set_profiler's schedule (skip_first " + std::to_string(s.skip_first) + ", wait " +
                  std::to_string(s.wait) + ", warmup " + std::to_string(s.warmup) + ", active " + std::to_string(s.active) + ", repeat " +
                  std::to_string(s.repeat) + ", from batch " + std::to_string(progress.batches_trained) + "); each cycle's trace in " +
                  RunFolder{o.output_dir}.tensorboard().string() +
                  (o.profiling.enabled ? " (the config's profiling section is not used)" : ""));
  } else if (o.profiling.enabled)
    reporter.line("dettrial: profiling batches " + std::to_string(o.profiling.begin_on_batch) + " to " +
                  (o.profiling.end_after_batch ? std::to_string(*o.profiling.end_after_batch) : std::string("the end of training")) +
                  " with LibTorch's profiler" + (sync_timings ? ", timings synchronized with the GPU" : "") + "; trace in " +
                  o.output_dir.string());
  if (const std::int64_t records = context.get_experiment_config().records_per_epoch; records > 0)
    reporter.line("dettrial: records_per_epoch " + std::to_string(records) + " sets the epoch: " + std::to_string(epoch_len) +
                  " batches of " + std::to_string(context.get_global_batch_size()) + " records (the training data loader's own epoch is " +
                  std::to_string(data_epoch_len) + " batches on this rank)");
}

DETTRIAL_INLINE void RunState::finish_profiling() {
  if (profiler.finish(progress.batches_trained - 1)) reporter.line("dettrial: " + profiler.summary());
}

DETTRIAL_INLINE void RunState::write_report(const Context& context) {
  if (!context.distributed().is_chief()) return;
  try {
    const auto path = write_run_report(options.output_dir);
    reporter.line("dettrial: report " + path.string());
  } catch (const std::exception& e) {
    reporter.line(std::string("dettrial: warning: no report.html: ") + e.what());
  }
}

DETTRIAL_INLINE Reached RunState::boundaries_after(std::int64_t batch_idx, std::int64_t epoch_idx, bool epoch_end) const {
  auto hit = [&](const TrainUnit& u) {
    return u.unit() == Unit::epochs ? epoch_end && u.reached(epoch_idx + 1) : u.reached(batch_idx + 1);
  };
  return Reached{.length = options.test_mode || hit(length),
                 .validation = hit(options.validation_period),
                 .checkpoint = hit(options.checkpoint_period),
                 .report = hit(options.reporting_period)};
}

DETTRIAL_INLINE void RunState::begin_workload(Context& context, Workload& workload) {
  for (const auto& m : context.models()) m->train();
  for (auto& r : context.reducers())
    if (r.for_training) r.reset(r.object);
  workload.means.reset();
  workload.batch_metrics.clear();
  workload.records = 0;
  workload.phases.reset();
  workload.phases.checkpoint_wait = checkpointer.take_waited_seconds();
  workload.mark = std::chrono::steady_clock::now();
  reporter.begin("train", progress.batches_trained, length.unit() == Unit::epochs ? length.value() * epoch_len : length.value(), "batches");
}

DETTRIAL_INLINE const MetricValues& RunState::report_training(Context& context, const Workload& workload) {
  const double seconds = reporter.elapsed();
  RankShare mine{.batches = workload.means.batches(), .records = workload.records};
  for (const auto& [name, value] : workload.means.means()) mine.totals.push_back({name, Reducer::avg, value});
  for (auto& r : context.reducers())
    if (r.for_training) mine.reducer_parts.push_back(r.per_slot(r.object));
  const auto shares = gather_shares(std::move(mine), context.communicator());
  MetricValues avg;
  avg.set("batches", static_cast<double>(progress.batches_trained));
  avg.set("epochs", static_cast<double>(progress.epochs_trained));
  for (const auto& [name, value] : combine_training(shares)) avg.set(name, value);
  reduce_user_reducers(context, &WrappedReducer::for_training, shares, avg);
  // The whole job's records (every rank's), over the chief's clock.
  const double rate = seconds > 0 ? static_cast<double>(total_records(shares)) / seconds : 0.0;
  reporter.training(progress.batches_trained, progress.epochs_trained, avg, rate, seconds, workload.phases, learning_rates(context));
  result.last_training_metrics = std::move(avg);
  return result.last_training_metrics;
}

DETTRIAL_INLINE void RunState::begin_validation(Context& context) {
  agree_on_buffers(context);
  for (const auto& m : context.models()) m->eval();
  for (auto& r : context.reducers())
    if (r.for_validation) r.reset(r.object);
}

DETTRIAL_INLINE MetricValues RunState::reduce_validation(Context& context, RankShare mine, std::int64_t& records) const {
  for (auto& r : context.reducers())
    if (r.for_validation) mine.reducer_parts.push_back(r.per_slot(r.object));
  const auto shares = gather_shares(std::move(mine), context.communicator());
  // Decided from the gathered shares, so every rank throws (or goes on) together.
  if (total_batches(shares) == 0) throw DataError("the validation data loader yielded no batches");
  MetricValues metrics = combine_validation(shares);
  reduce_user_reducers(context, &WrappedReducer::for_validation, shares, metrics);
  records = total_records(shares);
  return metrics;
}

DETTRIAL_INLINE const MetricValues& RunState::finish_validation(Context& context, const MetricValues& metrics, std::int64_t records) {
  context.step_lr_schedulers_on_validation(metrics);  // the same reduced metrics on every rank
  progress.last_validation = progress.batches_trained;
  ++result.validations;
  MetricValues reported;
  reported.set("batches", static_cast<double>(progress.batches_trained));
  reported.set("epochs", static_cast<double>(progress.epochs_trained));
  for (const auto& [name, value] : metrics) reported.set(name, value);
  reporter.validation(progress.batches_trained, progress.epochs_trained, reported, records, reporter.elapsed());
  result.last_validation_metrics = std::move(reported);
  return result.last_validation_metrics;
}

DETTRIAL_INLINE bool RunState::checkpoint_after_validation(Context& context, const MetricValues& reported) {
  bool improved = true;  // without a searcher metric every validation counts as the best so far
  if (!options.searcher_metric.empty()) {
    const auto value = reported.get(options.searcher_metric);
    if (!value) throw missing_searcher_metric(options.searcher_metric, reported);
    improved = MetricOrder{options.smaller_is_better}.improves(*value, progress.best_validation);
    // Every rank holds the same gathered metrics; the chief's decision is still the one acted on,
    // because a checkpoint is a collective that all ranks enter or none.
    if (Communicator* comm = context.communicator()) improved = comm->broadcast_values({improved ? 1 : 0})[0] != 0;
    if (improved) progress.best_validation = *value;
  } else if (options.checkpoint_policy == CheckpointPolicy::best && !warned_best_without_metric) {
    reporter.line("dettrial: checkpoint_policy 'best' has no searcher metric to compare; checkpointing after every validation");
    warned_best_without_metric = true;
  }
  return checkpointer.after_validation(improved);
}

DETTRIAL_INLINE TrialCheckpointRecord RunState::checkpoint_record(const Context& context, std::optional<std::uint64_t> training_data_seed,
                                                                  std::optional<std::uint64_t> validation_data_seed,
                                                                  std::string trial_type) const {
  TrialProgress saved = progress;
  saved.trial_id = options.trial_id;
  saved.training_data_seed = training_data_seed;
  saved.validation_data_seed = validation_data_seed;
  saved.ranks = context.distributed().size;
  saved.data_ranks = data_ranks;
  const bool validated_here = progress.last_validation == progress.batches_trained && !options.searcher_metric.empty();
  return {.progress = std::move(saved),
          .mid_aggregation = progress.batches_trained % context.aggregation_frequency() != 0,
          .searcher_metric = options.searcher_metric,
          .validation_metric = validated_here ? result.last_validation_metrics.get(options.searcher_metric) : std::nullopt,
          .trial_type = std::move(trial_type)};
}

DETTRIAL_INLINE void RunState::checkpoint_written(const WrittenCheckpoint& written) {
  result.checkpoints.push_back(written.info);
  reporter.checkpoint(written.info.batches_trained, written.info.epochs_trained, written.info.path, written.seconds, written.write_seconds);
  checkpointer.apply_retention(written.info.uuid);
}

DETTRIAL_INLINE void RunState::stopped(int signal) {
  result.signal = signal;
  result.stop_requested = true;
  result.stopped_early = remaining() > 0;
  const std::string after = " after batch " + std::to_string(progress.batches_trained);
  if (signal != 0)
    reporter.line(std::string("dettrial: stopped by ") + signal_name(signal) + after + "; resume from " + checkpointer.storage().string());
  else reporter.line("dettrial: stop requested; stopped" + after);
}

DETTRIAL_INLINE RunState::RunState() = default;
DETTRIAL_INLINE RunState::RunState(RunState&&) noexcept = default;
DETTRIAL_INLINE RunState& RunState::operator=(RunState&&) noexcept = default;
DETTRIAL_INLINE RunState::~RunState() = default;

DETTRIAL_INLINE void RunState::start_tensorboard_session(Context& context) {
  if (!context.get_tensorboard_writer().has_session()) context.get_tensorboard_writer().add_hparams(flat_hparams(context.get_hparams()));
}

DETTRIAL_INLINE void RunState::end_tensorboard_session(Context& context, bool succeeded) noexcept {
  try {
    context.get_tensorboard_writer().end_session(succeeded);
    context.get_tensorboard_writer().flush();
  } catch (const std::exception& e) {  // ends a fit that may be unwinding already
    std::fprintf(stderr, "dettrial: warning: the TensorBoard session did not end cleanly: %s\n", e.what());
  }
}

DETTRIAL_INLINE void RunState::report_profile() { reporter.line("dettrial: " + profiler.summary()); }

DETTRIAL_INLINE void RunState::note_capture(std::int64_t batch_idx) {
  reporter.line("dettrial: training step captured in a CUDA graph at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE void RunState::note_eager_batch(std::int64_t batch_idx) {
  if (!eager_batch_announced)
    reporter.line("dettrial: batch " + std::to_string(batch_idx) + " has other shapes than the captured batch; such batches run eagerly");
  eager_batch_announced = true;
}

DETTRIAL_INLINE void RunState::warn_missing_callback_states(const std::vector<std::string>& names) {
  for (const std::string& name : names) reporter.line("dettrial: warning: the checkpoint has no state for callback '" + name + "'");
}

DETTRIAL_INLINE void RunState::complete(const Context& context) {
  if (context.distributed().is_chief()) checkpointer.apply_retention({});
}

DETTRIAL_INLINE FitResult RunState::finish(const Context& context) {
  result.batches_trained = progress.batches_trained;
  result.epochs_trained = progress.epochs_trained;
  mlflow_status = result.signal != 0 ? "KILLED" : "FINISHED";
  write_report(context);
  return std::move(result);
}

DETTRIAL_INLINE void RunState::release() noexcept {
  checkpointer.settle();
  if (mlflow) {
    try {
      mlflow->end(mlflow_status);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dettrial: warning: the MLflow run did not end cleanly: %s\n", e.what());
    }
  }
  folder_lock = FolderLock{};
}

DETTRIAL_INLINE void training_stream_ended(std::int64_t batch_idx) {
  throw DataError("the training data loader's repeating stream ended at batch " + std::to_string(batch_idx));
}

DETTRIAL_INLINE std::filesystem::path default_output_dir() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::filesystem::path("runs") / (std::string(stamp) + "-" + std::to_string(::getpid()));
}

DETTRIAL_INLINE ConfigError missing_searcher_metric(const std::string& metric, const MetricValues& metrics) {
  std::vector<std::string> names;
  for (const auto& [name, ignored] : metrics) names.push_back(name);
  std::string reported;
  for (const auto& name : names) reported += (reported.empty() ? "" : ", ") + name;
  std::string hint = suggestion(metric, names);
  if (hint.empty()) {  // val_loss for validation_loss: the one name with the same last word
    auto last_word = [](const std::string& n) { return n.substr(n.rfind('_') == std::string::npos ? 0 : n.rfind('_') + 1); };
    std::vector<std::string> same;
    std::ranges::copy_if(names, std::back_inserter(same), [&](const std::string& n) { return last_word(n) == last_word(metric); });
    if (same.size() == 1) hint = "; did you mean '" + same.front() + "'?";
  }
  return ConfigError("searcher.metric '" + metric + "' is not a metric validation reports (it reported " + reported + ")" + hint);
}

DETTRIAL_INLINE LearningRates learning_rates(const Context& context) {
  LearningRates out;
  const std::size_t optimizers = context.num_optimizers();
  for (std::size_t i = 0; i < optimizers; ++i) {
    const auto& groups = context.optimizer(i).param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      try {
        const double lr = groups[g].options().get_lr();
        // Appended piece by piece: GCC 12 at -O3 mistakes chained string + for overlapping copies (-Wrestrict).
        std::string name = "lr";
        if (optimizers > 1) name.append("_").append(std::to_string(i));
        if (groups.size() > 1) name.append("_group_").append(std::to_string(g));
        out.emplace_back(std::move(name), lr);
      } catch (const c10::Error&) {
        break;
      }
    }
  }
  return out;
}

DETTRIAL_INLINE void reduce_user_reducers(Context& context, bool WrappedReducer::* role, const std::vector<RankShare>& shares,
                                          MetricValues& out) {
  // Every rank sees every share, so a mismatch stops all ranks here together.
  for (const auto& s : shares)
    if (s.reducer_parts.size() != shares.front().reducer_parts.size())
      throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
  std::size_t index = 0;
  for (auto& r : context.reducers())
    if (r.*role) r.cross_slot_into(r.object, r.name, reducer_parts(shares, index++), out);
}

DETTRIAL_INLINE void agree_on_buffers(Context& context) {
  if (Communicator* comm = context.communicator()) broadcast_buffers(*comm, context.models());
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/trainer/run_state.hpp
// ---- begin dettrial/trainer/step_graph.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step captured once in a CUDA graph and replayed (capture::cuda_graph): the
/// checks made before training starts, and the graph with its input buffers.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <concepts>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/torch.h>


namespace dettrial::detail {

/// Whether this build of dettrial can capture CUDA graphs.
inline constexpr bool step_capture_built =
#if defined(DETTRIAL_HAS_CUDA)
    true;
#else
    false;
#endif

/// Calls `f(a_tensor, b_tensor)` on the tensors of two batches of the same type, pairwise; returns
/// false (and stops) where their structure differs (vector lengths, map keys).
template <class A, class B, class F>
  requires std::same_as<std::remove_cvref_t<A>, std::remove_cvref_t<B>>
bool for_each_tensor_pair(A& a, B& b, F&& f) {
  using U = std::remove_cvref_t<A>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    return f(a, b);
  } else if constexpr (is_tuple_like<U>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (for_each_tensor_pair(std::get<I>(a), std::get<I>(b), f) && ...);
    }(std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (is_vector<U>::value) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!for_each_tensor_pair(a[i], b[i], f)) return false;
    return true;
  } else if constexpr (is_string_map<U>::value) {
    if (a.size() != b.size()) return false;
    for (auto& [key, value] : a) {
      const auto it = b.find(key);
      if (it == b.end() || !for_each_tensor_pair(value, it->second, f)) return false;
    }
    return true;
  } else {
    return true;
  }
}

/**
 * @brief Refuses, before the first batch, a step capture that could not be right: one sentence
 * naming what stands in the way. The trial-side reasons come first, so that they are seen (and
 * tested) on any machine; the device last. `tensors_only`: whether the training batch type
 * (`batch_type`, for the message) is made of tensors only.
 */
DETTRIAL_INLINE void check_step_capture(const StepCapture& capture, Context& context, bool tensors_only, const std::string& batch_type);

/**
 * @brief What a captured step holds that does not depend on the batch type: the optimizers it syncs,
 * the warm-up count, the CUDA graph and its side stream. Compiled once (dettrial::compiled in
 * separate-compilation mode), so that a trial's translation unit reads no CUDA header.
 */
class StepGraphCore {
 public:
  DETTRIAL_INLINE StepGraphCore();
  DETTRIAL_INLINE ~StepGraphCore();
  StepGraphCore(const StepGraphCore&) = delete;
  StepGraphCore& operator=(const StepGraphCore&) = delete;

  /// Arms the capture for this fit: the optimizers it syncs, and the eager batches before it.
  DETTRIAL_INLINE void start(const capture::cuda_graph& options, Context& context);
  bool armed() const { return armed_; }
  bool warming_up() const { return warmup_left_ > 0; }
  /// One warm-up batch less to go.
  void count_warm_up() { --warmup_left_; }
  /// Whether every optimizer's state is whole (an fp16 scaler may have skipped every warm-up step).
  DETTRIAL_INLINE bool optimizers_ready() const;
  /// See StepGraph::check_unchanged.
  DETTRIAL_INLINE void check_unchanged() const;

  /// Makes the side stream current, ordered after the work queued so far on the current stream.
  DETTRIAL_INLINE void enter_side_stream();
  /// Makes the stream current before enter_side_stream() current again.
  DETTRIAL_INLINE void leave_side_stream() noexcept;
  /// The stream current before enter_side_stream() waits for the work queued on the side stream.
  DETTRIAL_INLINE void join_side_stream();

  /// Before a capture: gradients unset (the captured backward pass makes them in the graph's
  /// memory), learning rates synced, and the optimizers writing nothing from the host.
  DETTRIAL_INLINE void prepare_capture();
  /// A new graph, and the capture begun on the side stream (made current).
  DETTRIAL_INLINE void begin_capture();
  DETTRIAL_INLINE void end_capture();
  /// Ends a capture that failed; its own error is the one reported.
  DETTRIAL_INLINE void abandon_capture() noexcept;
  /// The optimizers write from the host again.
  DETTRIAL_INLINE void stop_capturing();
  /// Keeps what check_unchanged() compares against.
  void note_captured() { captured_groups_ = group_states(); }
  /// Replays the graph as it is.
  DETTRIAL_INLINE void replay_graph();
  /// Syncs the learning rates into the graph's memory, replays, and tells the scaler.
  DETTRIAL_INLINE void replay_step();
  /// Unsets the gradients (before an eager batch after the capture, so that its backward pass does
  /// not add to the graph's).
  DETTRIAL_INLINE void clear_gradients();
  /// Forgets the graph (and its memory).
  DETTRIAL_INLINE void reset();

 private:
  DETTRIAL_INLINE std::vector<std::vector<double>> group_states() const;

  struct Capturable {
    optim::CapturableOptimizer* capturable;
    torch::optim::Optimizer* optimizer;
  };
  /// The graph, the side stream and the stream guard (CUDA types, complete where compiled).
  struct Device;
  std::unique_ptr<Device> device_;
  std::vector<Capturable> optimizers_;
  Context* context_ = nullptr;
  std::int64_t warmup_left_ = 0;
  bool armed_ = false;
  std::vector<std::vector<double>> captured_groups_;
};

/**
 * @brief One fit's captured step: the graph (StepGraphCore), its input batch and output metrics, and
 * where the run stands (warming up, captured). The trainer drives it; see Trainer::train_batch.
 */
template <class Batch>
class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { reset(); }

  /// Arms the capture for this fit: the optimizers it syncs, and the eager batches before it.
  void start(const capture::cuda_graph& options, Context& context) { core_.start(options, context); }
  bool armed() const { return core_.armed(); }
  bool captured() const { return static_batch_.has_value(); }
  bool warming_up() const { return core_.warming_up(); }

  /// Whether `batch` has the captured batch's structure and shapes (else it runs eagerly).
  bool fits(const Batch& batch) const { return same_layout(*static_batch_, batch); }

  /// Whether `batch` may be captured: it has the shapes of the last warm-up batch (so an epoch's
  /// short last batch is never the one captured, and nothing is tuned for a new shape inside the
  /// capture), and every optimizer's state is whole (an fp16 scaler may have skipped every warm-up
  /// step). Else it warms up too.
  bool ready_to_capture(const Batch& batch) const {
    return core_.optimizers_ready() && last_warm_up_ && same_layout(*last_warm_up_, batch);
  }
  /// Keeps handles to a warm-up batch's tensors (before the trial may reassign them), for their shapes.
  void note_warm_up_shapes(const Batch& batch) { last_warm_up_.emplace(batch); }

  /// At each workload after the capture: the parameters and the options the graph holds as host
  /// values must be those it was captured with (a replay would silently keep the old ones).
  void check_unchanged() const {
    if (captured()) core_.check_unchanged();
  }

  /// A warm-up batch: `step` runs eagerly on the capture's side stream, ordered after the work
  /// before it and before the work after it, so that the libraries make their per-stream state
  /// (cuBLAS workspaces) where the capture will run.
  template <class Step>
  Metrics warm_up(Step&& step) {
    core_.count_warm_up();
    core_.enter_side_stream();
    Metrics metrics;
    {
      const auto back = on_scope_exit([&] { core_.leave_side_stream(); });
      metrics = step();
    }
    core_.join_side_stream();
    check_metrics(metrics);
    return metrics;
  }

  /// Captures `step(static_batch)` in the graph (nothing runs), then replays it once to train `batch`.
  template <class Step>
  Metrics capture(Batch batch, Step&& step) {
    static_batch_.emplace(std::move(batch));
    core_.prepare_capture();
    try {
      const auto back = on_scope_exit([&] { core_.leave_side_stream(); });
      core_.begin_capture();
      try {
        // The trial gets its own handles to the inputs: reassigning one (x = x.float()) must not
        // replace the buffer each batch is copied into.
        Batch working = *static_batch_;
        static_metrics_ = step(working);
      } catch (...) {
        core_.abandon_capture();
        throw;
      }
      core_.end_capture();
    } catch (const std::exception& e) {
      core_.stop_capturing();
      throw TrialError(std::string("step_capture: cuda_graph could not capture the training step (train_batch, backward and "
                                   "the optimizer step): ") +
                       first_line(e.what()) +
                       ". A captured step must not wait for the device (.item(), .cpu(), printing a tensor, a branch on a "
                       "tensor's value), make tensors on the host, or change shapes with the data (nonzero, masked_select); "
                       "remove that from train_batch or set step_capture: none");
    }
    core_.stop_capturing();
    core_.join_side_stream();
    check_metrics(static_metrics_);
    core_.note_captured();
    last_warm_up_.reset();
    core_.replay_graph();
    return static_metrics_;
  }

  /// Copies `batch` into the graph's inputs (on the device, without waiting) and replays the step.
  Metrics replay(const Batch& batch) {
    for_each_tensor_pair(*static_batch_, batch, [](torch::Tensor& s, const torch::Tensor& b) {
      if (s.defined()) s.copy_(b, /*non_blocking=*/true);
      return true;
    });
    core_.replay_step();
    return static_metrics_;
  }

  /// Before an eager batch after the capture: gradients unset, so the eager backward pass does not
  /// add to the graph's.
  void before_eager_batch() { core_.clear_gradients(); }

  /// Forgets the graph (and its memory) at the end of a fit.
  void reset() {
    core_.reset();
    static_metrics_ = Metrics{};
    static_batch_.reset();
    last_warm_up_.reset();
  }

 private:
  /// The same structure, and tensors of the same shapes and types.
  static bool same_layout(const Batch& a, const Batch& b) {
    return for_each_tensor_pair(a, b, [](const torch::Tensor& x, const torch::Tensor& y) {
      return x.defined() == y.defined() && (!x.defined() || (x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type()));
    });
  }
  static void check_metrics(const Metrics& metrics) {
    for (const auto& e : metrics)
      if (!e.value.is_tensor())
        throw TrialError(
            "step_capture: cuda_graph replays train_batch, so a metric it returns as a number would keep the "
            "captured batch's value: return '" +
            std::string(e.key.view()) + "' as a tensor");
  }
  static std::string first_line(const char* text) {
    const std::string s(text);
    return s.substr(0, s.find('\n'));
  }

  StepGraphCore core_;
  std::optional<Batch> static_batch_;
  Metrics static_metrics_;
  std::optional<Batch> last_warm_up_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
// DETTRIAL_HAS_CUDA: LibTorch is CUDA-built (dettrial's CMake defines it, as it does the NCCL backend).
#if defined(DETTRIAL_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dettrial::detail {

#if defined(DETTRIAL_HAS_CUDA)
struct StepGraphCore::Device {
  std::optional<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> side;
  /// The stream current before the side stream was made current.
  std::optional<c10::cuda::CUDAStream> main;
  std::optional<c10::cuda::CUDAStreamGuard> on_side;

  /// `after` waits for the work queued on `before` so far.
  static void join(const c10::cuda::CUDAStream& before, const c10::cuda::CUDAStream& after) {
    at::cuda::CUDAEvent event;
    event.record(before);
    event.block(after);
  }
};
#else
struct StepGraphCore::Device {};
[[noreturn]] inline void step_capture_unavailable() { throw ConfigError("step_capture: cuda_graph needs LibTorch built with CUDA"); }
#endif

DETTRIAL_INLINE void check_step_capture(const StepCapture& capture, Context& context, bool tensors_only, const std::string& batch_type) {
  if (std::holds_alternative<capture::none>(capture)) return;
  const auto& graph = std::get<capture::cuda_graph>(capture);
  const std::string what = "step_capture: cuda_graph ";
  if (graph.warmup_batches < 1)
    throw ConfigError(what + "needs at least 1 warm-up batch (capture_warmup_batches is " + std::to_string(graph.warmup_batches) +
                      "): the eager batches before the capture make the optimizer's state");
  if (!tensors_only)
    throw TrialError(what +
                     "copies each batch into the graph's input tensors, so the training batch must be made of tensors "
                     "(in tuples, pairs, vectors or string-keyed maps); " +
                     batch_type + " is not, or holds a value that the graph would freeze");
  if (context.communicator())
    throw ConfigError(what +
                      "does not capture data-parallel training (the gradient all-reduce runs between the backward pass "
                      "and the step); run one process per trial or set step_capture: none");
  if (context.rank_invariant())
    throw ConfigError(what +
                      "replays one step, but reproducibility.rank_invariant seeds each batch's draws and keeps its "
                      "gradients apart on the host's schedule; set one of them off");
  if (context.aggregation_frequency() > 1)
    throw ConfigError(what + "needs aggregation_frequency 1: with " + std::to_string(context.aggregation_frequency()) +
                      " the optimizer steps on some batches only, which one graph cannot replay");
  for (const auto& reducer : context.reducers())
    if (reducer.for_training)
      throw TrialError(what + "replays train_batch without running its host code, so a reducer fed in train_batch (" +
                       (reducer.name.empty() ? std::string("one returning MetricValues") : "'" + reducer.name + "'") +
                       ") would see only the captured batch; wrap it with for_training = false, or set step_capture: none");
#if !DETTRIAL_FUSED_KERNELS
  if (context.scaler())
    throw ConfigError(what +
                      "cannot replay an fp16 gradient scaler with LibTorch before 2.4, whose optimizer kernels cannot "
                      "skip a step on the device; use mixed_precision: bf16 (no scaler) or fp32, or LibTorch 2.4 or later");
#endif
  for (std::size_t i = 0; i < context.num_optimizers(); ++i) {
    torch::optim::Optimizer& optimizer = context.optimizer(i);
    if (!dynamic_cast<optim::CapturableOptimizer*>(&optimizer))
      throw TrialError(what + "needs optimizers that read their learning rate on the device, and optimizer " + std::to_string(i) + " (" +
                       c10::demangle(typeid(optimizer).name()) +
                       ") reads it on the host, so a replay would keep the captured batch's; use dettrial::optim::FusedSGD, "
                       "FusedAdam or FusedAdamW (same options and checkpoints as LibTorch's SGD, Adam and AdamW)");
  }
  if (!step_capture_built) throw ConfigError(what + "needs LibTorch built with CUDA, and this one is CPU-only; set step_capture: none");
  if (!context.device().is_cuda())
    throw ConfigError(what + "needs a CUDA device, and this trial runs on " + context.device().str() + "; set step_capture: none");
}

DETTRIAL_INLINE StepGraphCore::StepGraphCore() : device_(std::make_unique<Device>()) {}
DETTRIAL_INLINE StepGraphCore::~StepGraphCore() { reset(); }

DETTRIAL_INLINE void StepGraphCore::start(const capture::cuda_graph& options, Context& context) {
  warmup_left_ = options.warmup_batches;
  optimizers_.clear();
  for (std::size_t i = 0; i < context.num_optimizers(); ++i) {
    torch::optim::Optimizer& o = context.optimizer(i);
    optimizers_.push_back({dynamic_cast<optim::CapturableOptimizer*>(&o), &o});
  }
  context_ = &context;
  armed_ = true;
}

DETTRIAL_INLINE bool StepGraphCore::optimizers_ready() const {
  for (const auto& entry : optimizers_)
    if (!entry.capturable->ready_for_capture()) return false;
  return true;
}

DETTRIAL_INLINE void StepGraphCore::check_unchanged() const {
  if (group_states() != captured_groups_)
    throw TrialError(
        "step_capture: cuda_graph replays the optimizer step as captured, and since the capture an optimizer's "
        "parameters or options other than the learning rate (momentum, betas, weight decay, ...) changed; "
        "only learning rates may change under a captured step, or set step_capture: none");
}

DETTRIAL_INLINE void StepGraphCore::prepare_capture() {
  clear_gradients();
  for (auto& [capturable, optimizer] : optimizers_) {
    capturable->sync_learning_rates(optimizer->param_groups());
    capturable->set_capturing(true);
  }
}

DETTRIAL_INLINE void StepGraphCore::stop_capturing() {
  for (auto& [capturable, optimizer] : optimizers_) capturable->set_capturing(false);
}

DETTRIAL_INLINE void StepGraphCore::replay_step() {
  for (auto& [capturable, optimizer] : optimizers_) capturable->sync_learning_rates(optimizer->param_groups());
  replay_graph();
  // The replay unscaled, checked and stepped (or skipped) on the device; the scale is updated after it.
  if (GradScaler* scaler = context_->scaler()) scaler->note_replayed_step();
}

DETTRIAL_INLINE void StepGraphCore::clear_gradients() {
  for (const auto& m : context_->models())
    for (auto& p : m->parameters()) p.mutable_grad().reset();
  for (auto& [capturable, optimizer] : optimizers_)
    for (auto& group : optimizer->param_groups())
      for (auto& p : group.params()) p.mutable_grad().reset();
}

DETTRIAL_INLINE std::vector<std::vector<double>> StepGraphCore::group_states() const {
  std::vector<std::vector<double>> out;
  for (const auto& [capturable, optimizer] : optimizers_)
    for (const auto& group : optimizer->param_groups()) out.push_back(captured_group_state(group));
  return out;
}

#if defined(DETTRIAL_HAS_CUDA)
DETTRIAL_INLINE void StepGraphCore::enter_side_stream() {
  Device& d = *device_;
  d.main = c10::cuda::getCurrentCUDAStream(context_->device().index());
  if (!d.side) d.side = c10::cuda::getStreamFromPool(false, context_->device().index());
  Device::join(*d.main, *d.side);
  d.on_side.emplace(*d.side);
}
DETTRIAL_INLINE void StepGraphCore::leave_side_stream() noexcept { device_->on_side.reset(); }
DETTRIAL_INLINE void StepGraphCore::join_side_stream() { Device::join(*device_->side, *device_->main); }

DETTRIAL_INLINE void StepGraphCore::begin_capture() {
  device_->graph.emplace();
  enter_side_stream();
  // Thread-local mode: the loader's threads may pin memory (cudaHostAlloc) during the capture.
  device_->graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
}
DETTRIAL_INLINE void StepGraphCore::end_capture() { device_->graph->capture_end(); }
DETTRIAL_INLINE void StepGraphCore::abandon_capture() noexcept {
  try {
    device_->graph->capture_end();
  } catch (...) {  // the capture is invalid already
  }
}
DETTRIAL_INLINE void StepGraphCore::replay_graph() { device_->graph->replay(); }

DETTRIAL_INLINE void StepGraphCore::reset() {
  if (device_) {
    device_->on_side.reset();
    if (device_->graph) device_->graph->reset();
    device_->graph.reset();
  }
  armed_ = false;
  warmup_left_ = 0;
  captured_groups_.clear();
}
#else
DETTRIAL_INLINE void StepGraphCore::enter_side_stream() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::leave_side_stream() noexcept {}
DETTRIAL_INLINE void StepGraphCore::join_side_stream() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::begin_capture() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::end_capture() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::abandon_capture() noexcept {}
DETTRIAL_INLINE void StepGraphCore::replay_graph() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::reset() {
  armed_ = false;
  warmup_left_ = 0;
  captured_groups_.clear();
}
#endif

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/trainer/step_graph.hpp

namespace dettrial::detail {

/// Dereferences a smart pointer, or returns the object itself.
template <class O>
decltype(auto) deref(O& o) {
  if constexpr (TorchOptimizer<O>) return (o);
  else return (*o);
}

/**
 * @brief One fit of a valid trial (only Trainer<TrialT> makes one, and only for a trial that meets
 * the concepts): the trial's loaders, the captured step and the fit's RunState as members, and the
 * loop that calls the trial's hooks and the callbacks in `Set` between RunState's steps.
 */
template <class TrialT, class Set>
class Run {
  static constexpr bool declarative = DeclaresModel<TrialT>;

 public:
  using Model = std::conditional_t<declarative, model_t<TrialT>, missing>;
  using OptimizerHolder = std::conditional_t<declarative, optimizer_result_t<TrialT>, missing>;

  /// A declarative trial's model and optimizer holder; `missing` objects for the others.
  Run(Context& context, TrialT& trial, Model& model, OptimizerHolder& optimizer, Set& callbacks)
      : context_(context), trial_(trial), model_(model), optimizer_(optimizer), callbacks_(callbacks) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Trains until the options' max_length, validating, checkpointing and reporting at their
  /// periods, and validates at the end.
  FitResult fit(FitOptions options) {
    check_step_capture(options.step_capture, context_, tensors_only_batch<training_batch_t<TrialT>>(),
                       c10::demangle(typeid(training_batch_t<TrialT>).name()));
    st_ = RunState::begin(context_, std::move(options));
    const auto release = on_scope_exit([&] { st_.release(); });
    // Each callback that started gets on_trial_shutdown, in reverse order, whatever happens next.
    std::size_t started = 0;
    const auto shutdown = on_scope_exit([&] { shut_down(callbacks_, started); });
    const std::int64_t first_batch = st_.first_batch();
    const std::string resume_uuid = st_.resume_dir ? st_.resume_dir->filename().string() : std::string();
    callbacks_.each([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if constexpr (hook::on_trial_startup::callable<C>) hook::on_trial_startup::call(cb, first_batch, resume_uuid);
      ++started;
    });
    prepare_training();
    // The graph is made anew in each fit (a resumed run warms up and captures again) and freed after it.
    if (const auto* graph = std::get_if<capture::cuda_graph>(&st_.options.step_capture)) step_graph_.start(*graph, context_);
    const auto free_graph = on_scope_exit([&] { step_graph_.reset(); });
    st_.announce(context_);
    if constexpr (requires { train_loader_->describe(); }) st_.reporter.line("dettrial: training data: " + train_loader_->describe());
    RunState::start_tensorboard_session(context_);
    // The hparams session ends as the fit does: failed when it throws.
    const auto end_session = on_scope_exit([&, exceptions = std::uncaught_exceptions()] {
      RunState::end_tensorboard_session(context_, std::uncaught_exceptions() == exceptions);
    });
    const StopSignals signals(st_.options.handle_signals);
    callbacks_.template call<hook::on_training_start>();
    if (st_.options.step_zero_validation && st_.progress.batches_trained == 0 && st_.progress.last_validation < 0) validate();
    train();
    st_.finish_profiling();
    if (!st_.result.stop_requested) {
      if (st_.progress.last_validation != st_.progress.batches_trained) validate();
      checkpoint_unless_current();
      finish_checkpoint(/*wait=*/true);
      st_.complete(context_);
    }
    return st_.finish(context_);
  }

 private:
  /// Builds the data loaders, makes the ranks agree, restores the checkpoint and sets the counters.
  void prepare_training() {
    train_loader_.emplace(trial_.build_training_data_loader());
    validation_loader_.emplace(trial_.build_validation_data_loader());
    st_.data_ranks = data_layout();
    st_.epoch_len = epoch_length(*train_loader_, training_chain());
    agree_across_ranks();
    st_.settle_epoch_length(context_);
    if (st_.resume_dir) restore(*st_.resume_dir, st_.same_trial ? *st_.resumed : TrialProgress{.trial_id = st_.options.trial_id});
    st_.check_rank_invariant_boundaries(context_);
    st_.start_position(context_);
  }

  /// on_trial_shutdown for the callbacks that started, last first; a failing hook is reported, not thrown.
  static void shut_down(Set& callbacks, std::size_t started) {
    std::size_t index = Set::size;
    callbacks.each_reversed([&](auto& cb) {
      using C = std::remove_reference_t<decltype(cb)>;
      if (index-- > started) return;
      if constexpr (hook::on_trial_shutdown::callable<C>) {
        try {
          hook::on_trial_shutdown::call(cb);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "dettrial: on_trial_shutdown failed: %s\n", e.what());
        }
      }
    });
  }

  // ---- the loop: train until a boundary, then handle each boundary reached ------------------

  void train() {
    // One endless stream for the whole run (Determined's repeat → shard → skip chain).
    CopyAhead batches(train_loader_->batches(training_chain()), context_.device());
    Workload workload;
    while (st_.remaining() > 0) {
      const Reached reached = train_until_boundary(batches, workload);
      report_training(workload);
      finish_checkpoint(/*wait=*/false);  // the one written in the background, if it is durable now
      if (const int signal = agreed_max(StopSignals::received()); signal != 0) return stop(signal);
      if (handle_boundaries(reached)) return;
    }
  }

  /// Trains batch after batch until one reaches a boundary (or, in one process, a stop signal arrives).
  template <class Batches>
  Reached train_until_boundary(Batches& batches, Workload& workload) {
    step_graph_.check_unchanged();
    st_.begin_workload(context_, workload);
    for (;;) {
      const std::int64_t batch_idx = st_.progress.batches_trained, epoch_idx = batch_idx / st_.epoch_len;
      const bool epoch_start = batch_idx % st_.epoch_len == 0, epoch_end = batch_idx % st_.epoch_len == st_.epoch_len - 1;
      context_.position().current_batch = batch_idx;
      if (epoch_start) callbacks_.template call<hook::on_training_epoch_start>(epoch_idx);
      if (!batches.has_next()) training_stream_ended(batch_idx);
      st_.profiler.before_batch(batch_idx);
      // Synchronized timings only inside the profiled range: a sync a batch elsewhere would cost the GPU its queue.
      train_batch(batches.take(), workload, batch_idx, epoch_idx, st_.sync_timings && st_.profiler.running());
      ++st_.progress.batches_trained;
      if (st_.profiler.after_batch(batch_idx)) st_.report_profile();
      if (epoch_end) {
        callbacks_.template call<hook::on_training_epoch_end>(epoch_idx);
        ++st_.progress.epochs_trained;
      }
      st_.reporter.update(st_.progress.batches_trained);
      const Reached reached = st_.boundaries_after(batch_idx, epoch_idx, epoch_end);
      if (reached.any()) return reached;
      // One process stops at any batch (with rank_invariant, at an update's last); a job only at
      // boundaries, where its ranks agree.
      if (!context_.communicator() && StopSignals::received() != 0 && (!context_.rank_invariant() || context_.is_update_batch()))
        return reached;
      // The next batch is trained right away: its copy to the device starts while the device still
      // computes this one. Not across a boundary or an epoch's start, so the data is read in the same
      // order relative to checkpoints and callbacks as without it; nor into a profiled range, whose
      // trace shows each of its batches' reads.
      if (!epoch_end && !st_.profiler.starts_at(batch_idx + 1)) batches.stage();
    }
  }

  /// Adds the time since the last phase ended to `phase` (after the GPU's work, with sync_timings).
  static void lap(Workload& workload, double& phase, bool sync) {
    if (sync) torch::cuda::synchronize();
    const auto now = std::chrono::steady_clock::now();
    phase += std::chrono::duration<double>(now - workload.mark).count();
    workload.mark = now;
  }

  /// The trial's train_batch, and for a declarative trial backward, clipping and the optimizer step.
  template <class Batch>
  Metrics eager_step(Batch& batch, Workload& workload, std::int64_t batch_idx, std::int64_t epoch_idx, bool sync_timings) {
    Metrics metrics = [&] {
      RECORD_USER_SCOPE("dettrial::train_batch");
      return as_metrics(in_precision([&]() -> decltype(auto) { return call_train_batch(trial_, batch, model_, epoch_idx, batch_idx); }));
    }();
    lap(workload, workload.phases.train_batch, sync_timings);
    if constexpr (declarative) {
      const MetricValue& loss = metrics.at("loss");
      if (!loss.is_tensor())
        throw TrialError("train_batch must return the loss as a tensor (the trainer back-propagates it), not a number");
      {
        RECORD_USER_SCOPE("dettrial::backward");
        context_.backward(loss.tensor());
      }
      lap(workload, workload.phases.backward, sync_timings);
      {
        RECORD_USER_SCOPE("dettrial::optimizer_step");
        // An optional hook: gradient_clipping() returns a clip policy (clip::by_norm{...}, clip::by_value{...}).
        if constexpr (requires(TrialT& t) { t.gradient_clipping(); })
          context_.step_optimizer(deref(optimizer_), trial_.gradient_clipping());
        else context_.step_optimizer(deref(optimizer_));
      }
      lap(workload, workload.phases.optimizer_step, sync_timings);
    }
    return metrics;
  }

  /// One batch: to the device, train_batch, and for a declarative trial backward and step (eagerly,
  /// or as a replay of the captured step); each phase timed, and named for the profiler's trace.
  template <class Loaded>
  void train_batch(Loaded&& loaded, Workload& workload, std::int64_t batch_idx, std::int64_t epoch_idx, bool sync_timings) {
    training_batch_t<TrialT> batch = std::move(loaded);
    const std::int64_t records = record_count(batch);
    workload.records += records;
    context_.begin_training_batch(records);
    Metrics metrics;
    if (step_graph_.captured() && step_graph_.fits(batch)) {
      // The batch (on the device already: CopyAhead) is copied into the graph's inputs; the
      // whole step is one replay.
      metrics = step_graph_.replay(batch);
      lap(workload, workload.phases.train_batch, sync_timings);
    } else {
      lap(workload, workload.phases.data, sync_timings);  // the batch came on the device (CopyAhead)
      if (!step_graph_.armed()) {
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      } else if (step_graph_.warming_up() || (!step_graph_.captured() && !step_graph_.ready_to_capture(batch))) {
        step_graph_.note_warm_up_shapes(batch);
        metrics = step_graph_.warm_up([&] { return eager_step(batch, workload, batch_idx, epoch_idx, sync_timings); });
      } else if (!step_graph_.captured()) {
        // Nothing may wait for the device while capturing: no synchronized timings.
        metrics = step_graph_.capture(std::move(batch),
                                      [&](training_batch_t<TrialT>& b) { return eager_step(b, workload, batch_idx, epoch_idx, false); });
        lap(workload, workload.phases.train_batch, sync_timings);
        st_.note_capture(batch_idx);
      } else {
        st_.note_eager_batch(batch_idx);
        step_graph_.before_eager_batch();
        metrics = eager_step(batch, workload, batch_idx, epoch_idx, sync_timings);
      }
    }
    context_.finish_batch(batch_idx);
    workload.means.add(metrics, batch_idx);
    if constexpr (Set::wants_batch_metrics) workload.batch_metrics.push_back(detached(metrics));
  }

  /// Validates and checkpoints as reached, in Determined's order (length, validation, checkpoint,
  /// report), honouring a stop request after each. Returns true when training stops.
  bool handle_boundaries(const Reached& reached) {
    enum class Kind { length, validation, checkpoint, report };
    const std::pair<bool, Kind> in_order[] = {{reached.length, Kind::length},
                                              {reached.validation, Kind::validation},
                                              {reached.checkpoint, Kind::checkpoint},
                                              {reached.report, Kind::report}};
    for (const auto& [hit, kind] : in_order) {
      if (!hit) continue;
      if (kind == Kind::validation && st_.progress.last_validation != st_.progress.batches_trained) validate();
      if (kind == Kind::checkpoint) checkpoint_unless_current();
      if (agreed_max(context_.get_stop_requested() ? 1 : 0) != 0) {
        stop(0);
        return true;
      }
    }
    return false;
  }

  /// The one way training stops early: checkpoint (unless current), record why (`signal`, or 0
  /// for a stop request), say so.
  void stop(int signal) {
    checkpoint_unless_current();
    finish_checkpoint(/*wait=*/true);  // durable before the process exits (with 75 after a signal)
    st_.stopped(signal);
  }

  void checkpoint_unless_current() {
    if (st_.progress.last_checkpoint != st_.progress.batches_trained) checkpoint();
  }

  // ---- reports and validation -----------------------------------------------------------------

  void report_training(const Workload& workload) {
    const MetricValues& metrics = st_.report_training(context_, workload);
    callbacks_.template call<hook::on_training_workload_end>(metrics, std::span<const Metrics>(workload.batch_metrics));
  }

  void validate() {
    RECORD_USER_SCOPE("dettrial::validate");
    torch::NoGradGuard no_grad;
    RunState::begin_validation(context_);
    callbacks_.template call<hook::on_validation_start>();
    st_.reporter.begin("validate", 0, epoch_length(*validation_loader_, validation_chain()), "batches");
    std::int64_t records = 0;
    const MetricValues metrics = st_.reduce_validation(context_, evaluate(), records);
    callbacks_.template call<hook::on_validation_end>(metrics);
    const MetricValues& reported = st_.finish_validation(context_, metrics, records);
    if (st_.checkpoint_after_validation(context_, reported)) checkpoint_unless_current();
  }

  /// This rank's share of a validation: its metric totals over its shard (evaluate_batch) or, with
  /// evaluate_full_dataset, the chief's metrics over the whole set (taken as they are).
  RankShare evaluate() {
    RankShare mine;
    if constexpr (DeclaresEvaluateBatch<TrialT>) {
      callbacks_.template call<hook::on_validation_epoch_start>();
      ValidationReduction reduction(evaluation_reducer());
      std::vector<Metrics> outputs;
      std::int64_t batch_idx = 0;
      CopyAhead batches(validation_loader_->batches(validation_chain()), context_.device());
      while (batches.has_next()) {
        validation_batch_t<TrialT> batch = batches.take();
        mine.records += record_count(batch);
        Metrics m = in_precision([&]() -> decltype(auto) { return call_evaluate_batch(trial_, batch, model_, batch_idx); });
        reduction.add(m, batch_idx);
        if constexpr (Set::wants_validation_outputs) outputs.push_back(std::move(m));
        st_.reporter.update(++batch_idx);
        if (st_.options.test_mode) break;
        batches.stage();  // the next batch copies while the device evaluates this one
      }
      callbacks_.template call<hook::on_validation_epoch_end>(std::span<const Metrics>(outputs));
      mine.totals = reduction.totals();
      mine.batches = reduction.batches();
    } else if (context_.distributed().is_chief()) {  // the whole dataset on the chief only (Determined's rule)
      const Metrics m = in_precision([&]() -> decltype(auto) { return call_evaluate_full_dataset(trial_, *validation_loader_, model_); });
      for (const auto& e : m) mine.totals.push_back({std::string(e.key.view()), Reducer::sum, e.value.to_double()});
      mine.batches = 1;
    }
    return mine;
  }

  template <class L>
  static std::optional<std::uint64_t> data_seed(const L& loader) {
    if constexpr (requires {
                    { loader.seed() } -> std::convertible_to<std::uint64_t>;
                  })
      return loader.seed();
    else return std::nullopt;
  }
  template <class L>
  static void restore_data_seed(L& loader, const std::optional<std::uint64_t>& seed) {
    if constexpr (requires { loader.set_seed(std::uint64_t{}); })
      if (seed) loader.set_seed(*seed);
  }

  // ---- checkpoints: when, and the callbacks' part (checkpoint/ writes and reads the files) ----

  /// Takes a checkpoint (Determined's layout, crash-safe) and starts writing it, in the background
  /// unless checkpoint_storage.async is off; the last one is finished first (one in flight at most).
  void checkpoint() {
    RECORD_USER_SCOPE("dettrial::checkpoint");
    finish_checkpoint(/*wait=*/true);
    st_.progress.last_checkpoint = st_.progress.batches_trained;
    agree_on_buffers(context_);
    st_.checkpointer.begin(callbacks_, st_.checkpoint_record(context_, data_seed(*train_loader_), data_seed(*validation_loader_),
                                                             c10::demangle(typeid(TrialT).name())));
    finish_checkpoint(/*wait=*/false);  // a synchronous write has ended already
  }

  /// Once the checkpoint in flight is durable (`wait`: waiting for it): its hooks, its record and
  /// report line, and retention sparing it. A collective while one is in flight.
  void finish_checkpoint(bool wait) {
    if (const std::optional<WrittenCheckpoint> written = st_.checkpointer.finish(callbacks_, wait))
      st_.checkpoint_written(*written);  // on the chief
  }

  /// The largest of `value` over the ranks: what every rank acts on.
  int agreed_max(int value) { return detail::agreed_max(context_.communicator(), value); }

  /**
   * @brief Makes the ranks of a job agree before training: the epoch length is the chief's sharded
   * length (Determined's rule; a rank whose shard is a batch shorter reads on into the next epoch of
   * the endless stream), the data loaders shuffle with the chief's seeds, each rank's own RNG
   * stream (dropout) is derived from the agreed trial seed and its rank, and the fit options that
   * place boundaries must be the same on every rank.
   */
  void agree_across_ranks() {
    Communicator* comm = context_.communicator();
    if (!comm) return;
    const auto train_seed = data_seed(*train_loader_), validation_seed = data_seed(*validation_loader_);
    const std::vector<std::int64_t> chief =
        comm->broadcast_values({st_.epoch_len, static_cast<std::int64_t>(train_seed.value_or(0)), train_seed ? 1 : 0,
                                static_cast<std::int64_t>(validation_seed.value_or(0)), validation_seed ? 1 : 0});
    st_.epoch_len = chief[0];
    if (chief[2]) restore_data_seed(*train_loader_, static_cast<std::uint64_t>(chief[1]));
    if (chief[4]) restore_data_seed(*validation_loader_, static_cast<std::uint64_t>(chief[3]));
    st_.require_same_settings(*comm, context_);
    context_.seed_rank_stream();
  }

  /**
   * @brief Restores a checkpoint: models (names and shapes checked), optimizers, schedulers, pending
   * gradients, RNGs, callbacks, and where the trial stands (`progress`).
   */
  void restore(const std::filesystem::path& dir, const TrialProgress& progress) {
    st_.warn_missing_callback_states(st_.checkpointer.restore(dir, callbacks_, st_.options.resume_fresh_parts));
    restore_data_seed(*train_loader_, progress.training_data_seed);
    restore_data_seed(*validation_loader_, progress.validation_data_seed);
    st_.progress = progress;
  }

  /// A copy whose tensors are detached from the graph and on the CPU (kept for callbacks).
  static Metrics detached(const Metrics& m) {
    Metrics out;
    for (const auto& e : m) out.set(e.key, e.value.is_tensor() ? MetricValue(e.value.tensor().detach().cpu()) : e.value);
    return out;
  }

  /// The training loader's chain: endless, this rank's shard (of the global batches of the rank
  /// count the run began on), skipping what was trained.
  LoaderChain training_chain() const {
    return LoaderChain{.repeat = true,
                       .skip = context_.get_initial_batch(),
                       .num_replicas = context_.distributed().size,
                       .rank = context_.distributed().rank,
                       .layout_replicas = st_.data_ranks};
  }

  /**
   * @brief The rank count whose global batches the training data follows: the one the resumed run
   * began on, when this job has another and its training loader can keep them (a dettrial
   * DataLoader), else this job's. Checks first that the global batch divides among this job's ranks.
   */
  std::int64_t data_layout() {
    const std::int64_t ranks = context_.distributed().size;
    const std::int64_t began = st_.same_trial && st_.resumed->data_ranks > 0 ? st_.resumed->data_ranks : ranks;
    if (began == ranks) return ranks;
    RunState::check_global_batch_divides(context_, began);
    if constexpr (requires { training_loader_t<TrialT>::keeps_global_batches; }) {
      (void)train_loader_->layout_sampler(LoaderChain{.repeat = true, .num_replicas = ranks, .layout_replicas = began});  // checks
      return began;
    } else {
      st_.reporter.line("warning: the training data loader is not a dettrial::DataLoader, so it cannot keep the global batches of the " +
                        std::to_string(began) + "-rank job this run began as: from batch " + std::to_string(st_.resumed->batches_trained) +
                        " on, it reads its own " + std::to_string(ranks) + "-rank shards");
      return ranks;
    }
  }
  /// The validation loader's chain: one pass over this rank's shard.
  LoaderChain validation_chain() const {
    return LoaderChain{.repeat = false, .skip = 0, .num_replicas = context_.distributed().size, .rank = context_.distributed().rank};
  }
  /// Batches per epoch on this rank: the loader's sharded length when it knows one.
  template <class L>
  static std::int64_t epoch_length(const L& loader, const LoaderChain& chain) {
    if constexpr (requires {
                    { loader.batches_for(chain) } -> std::convertible_to<std::int64_t>;
                  }) {
      return static_cast<std::int64_t>(loader.batches_for(chain));
    } else {  // Determined's DistributedBatchSampler length: len // n + (len % n > rank)
      const auto len = static_cast<std::int64_t>(loader.size());
      return len / chain.num_replicas + (len % chain.num_replicas > chain.rank ? 1 : 0);
    }
  }

  ReducerChoice evaluation_reducer() {
    if constexpr (requires(TrialT& t) { ReducerChoice(t.evaluation_reducer()); }) return ReducerChoice(trial_.evaluation_reducer());
    else return Reducer::avg;
  }

  template <class B>
  std::int64_t record_count(const B& batch) {
    if constexpr (requires(TrialT& t) {
                    { t.get_batch_length(batch) } -> std::convertible_to<std::int64_t>;
                  })
      return trial_.get_batch_length(batch);
    else return batch_length(batch);
  }

  /// Runs a trial hook under autocast when the context's precision asks for it (no cost at fp32).
  template <class F>
  decltype(auto) in_precision(F&& hook) {
    if (const std::optional<at::ScalarType> dtype = context_.autocast_dtype()) {
      AutocastGuard autocast(context_.device().type(), dtype);
      return std::forward<F>(hook)();
    }
    return std::forward<F>(hook)();
  }

  Context& context_;
  TrialT& trial_;
  Model& model_;
  OptimizerHolder& optimizer_;
  Set& callbacks_;
  RunState st_{};
  std::optional<training_loader_t<TrialT>> train_loader_;
  std::optional<validation_loader_t<TrialT>> validation_loader_;
  /// The captured training step (capture::cuda_graph).
  StepGraph<training_batch_t<TrialT>> step_graph_;
};

}  // namespace dettrial::detail
// ---- end dettrial/trainer/run.hpp

namespace dettrial {

/**
 * @brief Runs a trial: builds it, and on `fit()` runs Determined's loop (workloads ending at any
 * boundary, validation, reporting, the final validation) for it.
 *
 * `Trainer<T>` checks T's hooks at compile time; a trial that breaks the contract gets one sentence
 * naming the hook at fault. The trial is built in place (it may keep references to itself), from the
 * Context when it takes one.
 * @code{.cpp}
 * dettrial::Context context(dettrial::ExperimentConfig::load_file("const.yaml"));
 * dettrial::Trainer<MnistTrial> trainer(context);
 * trainer.fit({.max_length = dettrial::Epoch{1}});
 * @endcode
 * @tparam TrialT a type satisfying dettrial::Trial.
 */
template <class TrialT>
class Trainer {
  static constexpr bool trial_ok = detail::TrialDiagnostics<TrialT>::ok;
  static constexpr bool declarative = DeclaresModel<TrialT>;

  using Model = std::conditional_t<trial_ok && declarative, model_t<TrialT>, detail::missing>;
  using OptimizerHolder = std::conditional_t<trial_ok && declarative, optimizer_result_t<TrialT>, detail::missing>;
  using SchedulerResult = std::conditional_t<trial_ok && declarative, scheduler_result_t<TrialT>, detail::missing>;

  static constexpr auto trial_callbacks_type() {
    if constexpr (requires(TrialT& t) { t.build_callbacks(); })
      return std::type_identity<decltype(std::declval<TrialT&>().build_callbacks())>{};
    else return std::type_identity<std::tuple<>>{};
  }
  using TrialCallbacks = typename decltype(trial_callbacks_type())::type;

 public:
  /// Builds the trial (with `args...` after the context, when its constructor takes them) and, for a
  /// declarative trial, its model, optimizer and scheduler, wrapped in `context`.
  template <class... Args>
  explicit Trainer(Context& context, Args&&... args) : context_(context) {
    static_assert(std::constructible_from<TrialT, Context&, Args...> || std::constructible_from<TrialT, Args...>,
                  "dettrial::Trainer<T>: T must be constructible from (dettrial::Context&, args...) or from (args...), "
                  "where args are the Trainer's arguments after the context");
    if (context_.has_registrations())
      throw TrialError("this context already serves a trainer; give each Trainer its own dettrial::Context");
    if constexpr (trial_ok) {
      // If building fails half-way, the context must not keep pointers into the half-built trial.
      auto release = detail::on_scope_exit([this] { context_.release_registrations(); });
      build(std::forward<Args>(args)...);
      release.dismiss();
    }
  }

 private:
  template <class... Args>
  void build(Args&&... args) {
    if constexpr (std::constructible_from<TrialT, Context&, Args...>)
      trial_ = std::make_unique<TrialT>(context_, std::forward<Args>(args)...);
    else trial_ = std::make_unique<TrialT>(std::forward<Args>(args)...);
    if constexpr (declarative) build_declarative();
    if constexpr (requires(TrialT& t) { t.build_callbacks(); }) callbacks_ = std::make_unique<TrialCallbacks>(trial_->build_callbacks());
    else callbacks_ = std::make_unique<TrialCallbacks>();
    if (context_.models().empty())
      throw TrialError("the trial wrapped no model: call context.wrap_model(...) in its constructor (or define build_model())");
    if (context_.num_optimizers() == 0)
      throw TrialError("the trial wrapped no optimizer: call context.wrap_optimizer(...) in its constructor (or define optimizer(model))");
  }

 public:
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// The context forgets the trial's models, optimizers, schedulers and reducers (they die with it).
  ~Trainer() { context_.release_registrations(); }

  TrialT& trial() { return *trial_; }
  Context& context() { return context_; }
  /// The model of a declarative trial.
  Model& model()
    requires declarative
  {
    return *model_;
  }

  /// The optimizer of a declarative trial.
  auto& optimizer()
    requires declarative
  {
    return detail::deref(*optimizer_);
  }

  /**
   * @brief Trains until `max_length`, validating, checkpointing and reporting at the configured
   * periods, and validates at the end. `callbacks...` (caller-owned) run after the trial's own.
   */
  template <class... Callbacks>
  FitResult fit(FitOptions options, Callbacks&... callbacks) {
    if constexpr (!trial_ok) {
      return {};
    } else {
      auto set = std::apply(
          [&](auto&... own) {
            return detail::CallbackSet<std::remove_reference_t<decltype(own)>..., Callbacks...>(std::tie(own..., callbacks...));
          },
          *callbacks_);
      detail::Run<TrialT, decltype(set)> run(context_, *trial_, model_or_missing(), optimizer_or_missing(), set);
      return run.fit(std::move(options));
    }
  }

 private:
  void build_declarative() {
    model_.emplace(context_.wrap_model(trial_->build_model()));
    optimizer_.emplace(trial_->optimizer(*model_));
    auto& optimizer = detail::deref(*optimizer_);
    context_.wrap_optimizer(optimizer);
    if constexpr (!std::same_as<SchedulerResult, detail::missing>) {
      scheduler_ = std::make_unique<SchedulerResult>(trial_->lr_scheduler(optimizer));
      if constexpr (detail::is_scheduled_lr<SchedulerResult>::value)
        context_.wrap_lr_scheduler(scheduler_->scheduler, typename SchedulerResult::mode{}, scheduler_->frequency);
      else context_.wrap_lr_scheduler(*scheduler_, lr_step::every_batch{});
    }
  }

 public:
  /// `runs/<date>-<time>-<pid>` under the working directory.
  static std::filesystem::path default_output_dir() { return detail::default_output_dir(); }

 private:
  /// The model and optimizer holder a Run gets: a declarative trial's, else `missing` objects.
  auto& model_or_missing() {
    if constexpr (declarative) return *model_;
    else return missing_;
  }
  auto& optimizer_or_missing() {
    if constexpr (declarative) return *optimizer_;
    else return missing_;
  }

  Context& context_;
  std::unique_ptr<TrialT> trial_;
  std::optional<Model> model_;
  std::optional<OptimizerHolder> optimizer_;
  std::unique_ptr<SchedulerResult> scheduler_;
  std::unique_ptr<TrialCallbacks> callbacks_;
  detail::missing missing_;
};

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
// ---- end dettrial/trainer/trainer.hpp

namespace dettrial {

struct LoadTrialOptions {
  /// Hyperparameters to change, merged over the checkpoint's (a map; nested maps are merged key by key):
  /// `{.hparams = YAML::Load("{dropout: 0.0}")}`.
  YAML::Node hparams{};
  /// The device the models go to; unset: as a Context picks it (the first GPU, else the CPU).
  std::optional<torch::Device> device{};
};

/// A trial rebuilt by load_trial_from_checkpoint_path: it owns the Context and the trial's Trainer.
template <class TrialT>
class LoadedTrial {
 public:
  LoadedTrial(std::unique_ptr<Context> context, std::unique_ptr<Trainer<TrialT>> trainer)
      : context_(std::move(context)), trainer_(std::move(trainer)) {}
  TrialT& trial() { return trainer_->trial(); }
  Context& context() { return *context_; }
  /// The trainer around the trial: `fit` continues training the loaded weights (a warm start).
  Trainer<TrialT>& trainer() { return *trainer_; }
  /// The trial's first (or `index`-th) model, as the context wrapped it.
  torch::nn::Module& model(std::size_t index = 0) { return *context_->models().at(index); }

 private:
  std::unique_ptr<Context> context_;  // before the trainer, which refers to it: destroyed after it
  std::unique_ptr<Trainer<TrialT>> trainer_;
};

namespace detail {
/// `changes` merged into the map `target`, nested maps key by key.
DETTRIAL_INLINE void merge_yaml_map(YAML::Node target, const YAML::Node& changes);
/// The experiment config a checkpoint was trained under, with its trial's hyperparameters (from its
/// `load_data.json`) and `overrides` merged over them.
DETTRIAL_INLINE ExperimentConfig checkpoint_trial_config(const std::filesystem::path& checkpoint, const YAML::Node& overrides);
}  // namespace detail

/**
 * @brief Rebuilds `TrialT` from a checkpoint (a checkpoint directory, or a folder holding checkpoints
 * whose latest is taken): its experiment config and hyperparameters from the checkpoint's
 * `load_data.json` with `options.hparams` merged over them, the trial built as the Trainer builds it
 * (with `trial_args...` after the Context), and every model's weights loaded, names and shapes
 * checked. The models are left in training mode; call `eval()` for inference.
 * @code{.cpp}
 * auto loaded = dettrial::load_trial_from_checkpoint_path<MnistTrial>("runs/x/checkpoints",
 *                                                                    {.hparams = YAML::Load("{dropout: 0.0}")});
 * loaded.model().eval();
 * @endcode
 */
template <class TrialT, class... Args>
LoadedTrial<TrialT> load_trial_from_checkpoint_path(const std::filesystem::path& path, const LoadTrialOptions& options = {},
                                                    Args&&... trial_args) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  auto context = std::make_unique<Context>(detail::checkpoint_trial_config(dir, options.hparams), ContextOptions{.device = options.device});
  auto trainer = std::make_unique<Trainer<TrialT>>(*context, std::forward<Args>(trial_args)...);
  detail::ContextCheckpoint::load_models(*context, detail::read_state_dict_file(dir), CheckpointFolder{dir}.state_dict());
  return LoadedTrial<TrialT>(std::move(context), std::move(trainer));
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE void merge_yaml_map(YAML::Node target, const YAML::Node& changes) {
  for (const auto& entry : changes) {
    const std::string key = entry.first.as<std::string>();
    if (entry.second.IsMap() && target[key] && target[key].IsMap()) merge_yaml_map(target[key], entry.second);
    else target[key] = YAML::Clone(entry.second);
  }
}

DETTRIAL_INLINE ExperimentConfig checkpoint_trial_config(const std::filesystem::path& checkpoint, const YAML::Node& overrides) {
  const std::filesystem::path file = CheckpointFolder{checkpoint}.load_data();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw CheckpointError("'" + checkpoint.string() +
                          "' has no load_data.json, so the trial cannot be rebuilt from it; "
                          "load only its weights with dettrial::load_weights");
  YAML::Node load_data;
  try {
    load_data = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw CheckpointError("'" + file.string() + "' is not valid JSON: " + e.what());
  }
  if (!load_data["experiment_config"] || !load_data["experiment_config"].IsMap())
    throw CheckpointError("'" + file.string() + "' has no experiment_config");
  YAML::Node doc = YAML::Clone(load_data["experiment_config"]);
  // The trial's own hyperparameters (the experiment config may hold the search space they were drawn from).
  if (load_data["hparams"] && load_data["hparams"].IsMap()) doc["hyperparameters"] = YAML::Clone(load_data["hparams"]);
  if (overrides && !overrides.IsNull()) {
    if (!overrides.IsMap())
      throw ConfigError("load_trial_from_checkpoint_path: LoadTrialOptions::hparams must be a map of hyperparameter names to values");
    if (!doc["hyperparameters"] || !doc["hyperparameters"].IsMap()) doc["hyperparameters"] = YAML::Node(YAML::NodeType::Map);
    merge_yaml_map(doc["hyperparameters"], overrides);
  }
  doc["searcher"]["name"] = std::string(to_string(SearcherKind::single));
  return ExperimentConfig::from_yaml(doc, file.string() + " (the checkpoint's config)");
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/trainer/load_trial.hpp
// ---- begin dettrial/search/hyperparameter_space.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's hyperparameter space: const, int, double, log and categorical axes, nested maps;
/// random samples and grid points, each as a plain YAML map of values a trial reads.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/// One leaf of a hyperparameter space.
struct HyperparameterAxis {
  enum class Type { constant, integer, real, log, categorical };
  std::vector<std::string> path;  // nested keys, outermost first
  Type type = Type::constant;
  double minval = 0, maxval = 0, base = 10;
  std::int64_t count = 0;          // grid points (0: not given)
  std::vector<YAML::Node> values;  // const: one value; categorical: the choices

  std::string name() const;
};

/**
 * @brief A search space as an experiment config's `hyperparameters` section writes it. Parsing
 * checks each axis (bounds, base, count, values) and names the file, line and column of a fault.
 */
class HyperparameterSpace {
 public:
  HyperparameterSpace() = default;
  HyperparameterSpace(const YAML::Node& hyperparameters, const std::string& source);

  const std::vector<HyperparameterAxis>& axes() const { return axes_; }
  /// True when every axis is a constant (one trial).
  bool is_constant() const;

  /// A random point (Determined's sampling: uniform int in [min, max], Uniform(min, max),
  /// base^Uniform(min, max), a uniform choice).
  template <class Rng>
  YAML::Node sample(Rng& rng) const {
    YAML::Node out(YAML::NodeType::Map);
    for (const auto& a : axes_) {
      switch (a.type) {
        case HyperparameterAxis::Type::constant: set(out, a.path, YAML::Clone(a.values[0])); break;
        case HyperparameterAxis::Type::integer: {
          std::uniform_int_distribution<std::int64_t> d(static_cast<std::int64_t>(a.minval), static_cast<std::int64_t>(a.maxval));
          set(out, a.path, YAML::Node(d(rng)));
          break;
        }
        case HyperparameterAxis::Type::real:
          set(out, a.path, YAML::Node(std::uniform_real_distribution<double>(a.minval, a.maxval)(rng)));
          break;
        case HyperparameterAxis::Type::log:
          set(out, a.path, YAML::Node(std::pow(a.base, std::uniform_real_distribution<double>(a.minval, a.maxval)(rng))));
          break;
        case HyperparameterAxis::Type::categorical: {
          std::uniform_int_distribution<std::size_t> d(0, a.values.size() - 1);
          set(out, a.path, YAML::Clone(a.values[d(rng)]));
          break;
        }
      }
    }
    return out;
  }

  /// The values of one axis on a grid (Determined's `getGridAxes`).
  static std::vector<YAML::Node> grid_values(const HyperparameterAxis& a);

  /// Every grid point: the cartesian product of the axes, the first axis varying slowest.
  std::vector<YAML::Node> grid() const;

  static const char* type_name(HyperparameterAxis::Type t);

 private:
  static void set(YAML::Node& root, const std::vector<std::string>& path, const YAML::Node& value);

  void parse(const YAML::Node& map, std::vector<std::string> prefix, const std::string& source);

  std::vector<HyperparameterAxis> axes_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE std::string HyperparameterAxis::name() const {
  std::string out;
  for (const auto& p : path) out += (out.empty() ? "" : ".") + p;
  return out;
}

DETTRIAL_INLINE HyperparameterSpace::HyperparameterSpace(const YAML::Node& hyperparameters, const std::string& source) {
  if (hyperparameters.IsDefined() && !hyperparameters.IsNull()) parse(hyperparameters, {}, source);
}

DETTRIAL_INLINE bool HyperparameterSpace::is_constant() const {
  for (const auto& a : axes_)
    if (a.type != HyperparameterAxis::Type::constant) return false;
  return true;
}

DETTRIAL_INLINE std::vector<YAML::Node> HyperparameterSpace::grid_values(const HyperparameterAxis& a) {
  std::vector<YAML::Node> out;
  auto linspace = [&](std::int64_t n, auto&& emit) {
    if (n == 1) {
      emit((a.minval + a.maxval) / 2);
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) emit(a.minval + static_cast<double>(i) * (a.maxval - a.minval) / static_cast<double>(n - 1));
  };
  switch (a.type) {
    case HyperparameterAxis::Type::constant: out.push_back(YAML::Clone(a.values[0])); break;
    case HyperparameterAxis::Type::categorical:
      for (const auto& v : a.values) out.push_back(YAML::Clone(v));
      break;
    case HyperparameterAxis::Type::integer: {
      const auto span = static_cast<std::int64_t>(a.maxval - a.minval) + 1;
      linspace(std::min(a.count, span), [&](double v) { out.emplace_back(static_cast<std::int64_t>(std::llround(v))); });
      break;
    }
    case HyperparameterAxis::Type::real: linspace(a.count, [&](double v) { out.emplace_back(v); }); break;
    case HyperparameterAxis::Type::log: linspace(a.count, [&](double v) { out.emplace_back(std::pow(a.base, v)); }); break;
  }
  return out;
}

DETTRIAL_INLINE std::vector<YAML::Node> HyperparameterSpace::grid() const {
  for (const auto& a : axes_)
    if ((a.type == HyperparameterAxis::Type::integer || a.type == HyperparameterAxis::Type::real ||
         a.type == HyperparameterAxis::Type::log) &&
        a.count < 1)
      throw ConfigError("the grid searcher needs 'count' for hyperparameter '" + a.name() + "' (type " + type_name(a.type) + ")");
  std::vector<std::vector<YAML::Node>> values;
  std::size_t total = 1;
  for (const auto& a : axes_) {
    values.push_back(grid_values(a));
    total *= values.back().size();
  }
  std::vector<YAML::Node> out;
  out.reserve(total);
  std::vector<std::size_t> index(axes_.size(), 0);
  for (std::size_t n = 0; n < total; ++n) {
    YAML::Node point(YAML::NodeType::Map);
    for (std::size_t k = 0; k < axes_.size(); ++k) set(point, axes_[k].path, YAML::Clone(values[k][index[k]]));
    out.push_back(point);
    for (std::size_t k = axes_.size(); k-- > 0;) {  // odometer: the last axis varies fastest
      if (++index[k] < values[k].size()) break;
      index[k] = 0;
    }
  }
  return out;
}

DETTRIAL_INLINE const char* HyperparameterSpace::type_name(HyperparameterAxis::Type t) {
  switch (t) {
    case HyperparameterAxis::Type::constant: return "const";
    case HyperparameterAxis::Type::integer: return "int";
    case HyperparameterAxis::Type::real: return "double";
    case HyperparameterAxis::Type::log: return "log";
    case HyperparameterAxis::Type::categorical: return "categorical";
  }
  return "?";
}

DETTRIAL_INLINE void HyperparameterSpace::set(YAML::Node& root, const std::vector<std::string>& path, const YAML::Node& value) {
  YAML::Node node(root);
  for (std::size_t i = 0; i + 1 < path.size(); ++i) {
    YAML::Node next = node[path[i]];
    if (!next.IsMap()) {
      next = YAML::Node(YAML::NodeType::Map);
      node[path[i]] = next;
    }
    node.reset(next);
  }
  node[path.back()] = value;
}

DETTRIAL_INLINE void HyperparameterSpace::parse(const YAML::Node& map, std::vector<std::string> prefix, const std::string& source) {
  if (!map.IsMap()) throw ConfigError(detail::where(map, source) + ": 'hyperparameters' must be a map");
  for (const auto& kv : map) {
    std::vector<std::string> path = prefix;
    path.push_back(kv.first.Scalar());
    const YAML::Node& v = kv.second;
    HyperparameterAxis a;
    a.path = path;
    const std::string name = a.name();
    if (!v.IsMap() || !v["type"]) {
      if (v.IsMap()) {
        parse(v, path, source);  // nested
        continue;
      }
      a.values.push_back(v);  // a plain value is a constant
      axes_.push_back(std::move(a));
      continue;
    }
    const std::string type = v["type"].Scalar();
    auto number = [&](const char* key) {
      const YAML::Node n = v[key];
      double x = 0;
      if (!n || !detail::try_read(n, x))
        throw ConfigError(detail::where(n ? n : v, source) + ": hyperparameter '" + name + "' (type " + type + ") needs a number '" + key +
                          "'" + (n ? ", found " + detail::describe(n) : std::string()));
      return x;
    };
    if (type == "const") {
      if (!v["val"]) throw ConfigError(detail::where(v, source) + ": hyperparameter '" + name + "' of type const has no 'val'");
      a.values.push_back(v["val"]);
    } else if (type == "int" || type == "double" || type == "log") {
      a.type = type == "int"      ? HyperparameterAxis::Type::integer
               : type == "double" ? HyperparameterAxis::Type::real
                                  : HyperparameterAxis::Type::log;
      a.minval = number("minval");
      a.maxval = number("maxval");
      if (!(a.minval < a.maxval))
        throw ConfigError(detail::where(v["maxval"], source) + ": hyperparameter '" + name + "' needs minval < maxval");
      if (type == "int" && (a.minval != std::floor(a.minval) || a.maxval != std::floor(a.maxval)))
        throw ConfigError(detail::where(v, source) + ": hyperparameter '" + name + "' of type int needs integer bounds");
      if (type == "log") {
        a.base = v["base"] ? number("base") : 10.0;
        if (!(a.base > 0)) throw ConfigError(detail::where(v["base"], source) + ": hyperparameter '" + name + "' needs base > 0");
      }
      if (v["count"]) {
        const double count = number("count");
        if (count < 1 || count != std::floor(count))
          throw ConfigError(detail::where(v["count"], source) + ": hyperparameter '" + name + "' needs a positive integer count");
        a.count = static_cast<std::int64_t>(count);
      }
    } else if (type == "categorical") {
      a.type = HyperparameterAxis::Type::categorical;
      const YAML::Node vals = v["vals"];
      if (!vals || !vals.IsSequence() || vals.size() == 0)
        throw ConfigError(detail::where(vals ? vals : v, source) + ": hyperparameter '" + name +
                          "' of type categorical needs a non-empty list 'vals'");
      for (const auto& x : vals) a.values.push_back(x);
    } else {
      throw ConfigError(detail::where(v["type"], source) + ": hyperparameter '" + name + "' has unknown type '" + type +
                        "' (expected const, int, double, log or categorical)");
    }
    axes_.push_back(std::move(a));
  }
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/hyperparameter_space.hpp
// ---- begin dettrial/search/searchers.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's searchers: single, random, grid and adaptive_asha (stopping-based ASHA), each
/// a type with the same three decisions (which trials to start, whether a validation stops a trial,
/// which trials replace one that ended), chosen from the experiment config at the start.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/// A trial a searcher asks for: its hyperparameters, its seed, and how long it may train (in the
/// searcher's time unit, batches unless a length says otherwise).
struct TrialRequest {
  std::int64_t id = 0;
  YAML::Node hparams{YAML::NodeType::Map};
  std::uint64_t seed = 0;
  std::int64_t max_length = 0;
  int bracket = 0;
};

/// What a searcher says after a validation.
enum class SearcherDecision { keep_training, stop };

namespace detail {

/// Draws trial seeds and hyperparameters from the experiment seed: the same seed, the same trials.
class SearchRandom {
 public:
  explicit SearchRandom(std::uint64_t experiment_seed) : rng_(mix64(experiment_seed ^ 0x5EA2C4ULL)) {}
  std::uint64_t trial_seed() { return std::uniform_int_distribution<std::uint64_t>(0, (1ULL << 31) - 1)(rng_); }
  std::mt19937_64& engine() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace detail

namespace searcher {

/// `random` (and `single`, one random trial of a constant space): `max_trials` trials, a new one
/// each time one ends, `max_concurrent_trials` at a time; validations never stop a trial.
class Random {
 public:
  Random(SearcherSettings config, HyperparameterSpace space, std::uint64_t experiment_seed);

  std::vector<TrialRequest> initial();
  SearcherDecision on_validation(std::int64_t, double, double) { return SearcherDecision::keep_training; }
  std::vector<TrialRequest> on_trial_end(std::int64_t);
  std::int64_t max_trials() const { return config_.max_trials; }

 private:
  TrialRequest next();
  SearcherSettings config_;
  HyperparameterSpace space_;
  detail::SearchRandom random_;
  std::int64_t created_ = 0;
};

/// `grid`: every point of the grid, `max_concurrent_trials` at a time.
class Grid {
 public:
  Grid(SearcherSettings config, const HyperparameterSpace& space, std::uint64_t experiment_seed);

  std::vector<TrialRequest> initial();
  SearcherDecision on_validation(std::int64_t, double, double) { return SearcherDecision::keep_training; }
  std::vector<TrialRequest> on_trial_end(std::int64_t);
  std::int64_t max_trials() const { return static_cast<std::int64_t>(points_.size()); }

 private:
  TrialRequest next();
  SearcherSettings config_;
  std::vector<YAML::Node> points_;
  detail::SearchRandom random_;
  std::int64_t created_ = 0;
};

/// One bracket of adaptive ASHA: its rungs (time each needs) and its share of trials and concurrency.
struct AshaBracket {
  std::int64_t rungs = 1;
  std::int64_t max_trials = 0;
  std::int64_t max_concurrent = 0;
  std::vector<std::int64_t> units_needed;
};

/// Determined's bracket arithmetic (`adaptive_asha.go`).
DETTRIAL_INLINE std::vector<AshaBracket> asha_brackets(const SearcherSettings& c);

/**
 * @brief `adaptive_asha`, stopping-based as Determined implements it: trials train until stopped.
 * On each validation a trial's metric enters every rung whose time it has reached; it is stopped at
 * the top rung, or where it ranks outside the best `max(len(rung) / divisor, 1)` so far. A stopped or
 * ended trial is replaced (new hyperparameters) while its bracket has trials left to create.
 */
class AdaptiveAsha {
 public:
  AdaptiveAsha(SearcherSettings config, HyperparameterSpace space, std::uint64_t experiment_seed);

  const std::vector<AshaBracket>& brackets() const { return brackets_; }

  std::vector<TrialRequest> initial();

  /// `metric` is the searcher metric, `time` the time metric's value at this validation.
  SearcherDecision on_validation(std::int64_t trial, double metric, double time);

  /// A trial ended (stopped, finished or failed for good): its bracket may start a replacement.
  std::vector<TrialRequest> on_trial_end(std::int64_t trial);
  std::int64_t max_trials() const { return config_.max_trials; }

 private:
  struct State {
    int bracket = 0;
    std::int64_t rung = 0;
  };
  TrialRequest next(std::size_t bracket);
  SearcherSettings config_;
  HyperparameterSpace space_;
  detail::SearchRandom random_;
  std::vector<AshaBracket> brackets_;
  std::vector<std::vector<std::vector<double>>> rung_metrics_;  // bracket, rung: sorted metrics
  std::vector<std::int64_t> created_;
  std::map<std::int64_t, State> trials_;
  std::int64_t last_id_ = 0;
};

}  // namespace searcher

/// The searcher an experiment config names.
using Searcher = std::variant<searcher::Random, searcher::Grid, searcher::AdaptiveAsha>;

/// Builds the searcher `config` names over `space` (single is random with one trial).
DETTRIAL_INLINE Searcher make_searcher(const SearcherSettings& config, const HyperparameterSpace& space, std::uint64_t experiment_seed);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::searcher {

DETTRIAL_INLINE Random::Random(SearcherSettings config, HyperparameterSpace space, std::uint64_t experiment_seed)
    : config_(std::move(config)), space_(std::move(space)), random_(experiment_seed) {}

DETTRIAL_INLINE std::vector<TrialRequest> Random::initial() {
  std::vector<TrialRequest> out;
  const std::int64_t first =
      config_.max_concurrent_trials > 0 ? std::min(config_.max_trials, config_.max_concurrent_trials) : config_.max_trials;
  for (std::int64_t i = 0; i < first; ++i) out.push_back(next());
  return out;
}

DETTRIAL_INLINE std::vector<TrialRequest> Random::on_trial_end(std::int64_t) {
  if (created_ < config_.max_trials) return {next()};
  return {};
}

DETTRIAL_INLINE TrialRequest Random::next() {
  TrialRequest r;
  r.id = ++created_;
  r.seed = random_.trial_seed();
  r.hparams = space_.sample(random_.engine());
  r.max_length = config_.length();
  return r;
}

DETTRIAL_INLINE Grid::Grid(SearcherSettings config, const HyperparameterSpace& space, std::uint64_t experiment_seed)
    : config_(std::move(config)), points_(space.grid()), random_(experiment_seed) {}

DETTRIAL_INLINE std::vector<TrialRequest> Grid::initial() {
  std::vector<TrialRequest> out;
  const auto n = static_cast<std::int64_t>(points_.size());
  const std::int64_t first = config_.max_concurrent_trials > 0 ? std::min(n, config_.max_concurrent_trials) : n;
  for (std::int64_t i = 0; i < first; ++i) out.push_back(next());
  return out;
}

DETTRIAL_INLINE std::vector<TrialRequest> Grid::on_trial_end(std::int64_t) {
  if (created_ < static_cast<std::int64_t>(points_.size())) return {next()};
  return {};
}

DETTRIAL_INLINE TrialRequest Grid::next() {
  TrialRequest r;
  r.hparams = points_[static_cast<std::size_t>(created_)];
  r.id = ++created_;
  r.seed = random_.trial_seed();
  r.max_length = config_.length();
  return r;
}

DETTRIAL_INLINE std::vector<AshaBracket> asha_brackets(const SearcherSettings& c) {
  if (c.max_trials < 1) throw ConfigError("adaptive_asha needs max_trials of at least 1");
  if (c.max_time < 1) throw ConfigError("adaptive_asha needs max_time of at least 1");
  if (!(c.divisor > 1)) throw ConfigError("adaptive_asha needs a divisor greater than 1");
  const auto max_rungs =
      std::min({c.max_rungs, static_cast<std::int64_t>(std::log(static_cast<double>(c.max_time)) / std::log(c.divisor)) + 1,
                static_cast<std::int64_t>(std::log(static_cast<double>(c.max_trials)) / std::log(c.divisor)) + 1});
  std::vector<std::int64_t> rungs = c.bracket_rungs;
  if (rungs.empty()) {
    std::int64_t low = 1;
    if (c.mode == "standard") low = (max_rungs - 1) / 2 + 1;
    else if (c.mode == "aggressive") low = max_rungs;
    else if (c.mode != "conservative")
      throw ConfigError("adaptive_asha mode must be aggressive, standard or conservative, not '" + c.mode + "'");
    for (std::int64_t r = low; r <= max_rungs; ++r) rungs.push_back(r);
  }
  std::sort(rungs.rbegin(), rungs.rend());
  std::vector<double> weights;
  double total = 0;
  for (const auto r : rungs) {
    weights.push_back(std::pow(c.divisor, static_cast<double>(r - 1)) / static_cast<double>(r));
    total += weights.back();
  }
  std::vector<AshaBracket> out;
  std::int64_t assigned = 0;
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    AshaBracket b;
    b.rungs = rungs[i];
    b.max_trials = std::max<std::int64_t>(static_cast<std::int64_t>(static_cast<double>(c.max_trials) * weights[i] / total), 1);
    assigned += b.max_trials;
    for (std::int64_t k = 0; k < b.rungs; ++k)
      b.units_needed.push_back(std::max<std::int64_t>(
          static_cast<std::int64_t>(static_cast<double>(c.max_time) / std::pow(c.divisor, static_cast<double>(b.rungs - k - 1))), 1));
    out.push_back(std::move(b));
  }
  out.front().max_trials += std::max<std::int64_t>(c.max_trials - assigned, 0);
  const auto n = static_cast<std::int64_t>(out.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (c.max_concurrent_trials > 0)
      out[static_cast<std::size_t>(i)].max_concurrent =
          std::max<std::int64_t>(c.max_concurrent_trials / n + (i < c.max_concurrent_trials % n ? 1 : 0), 1);
    else out[static_cast<std::size_t>(i)].max_concurrent = std::max(out.back().max_trials, static_cast<std::int64_t>(c.divisor));
  }
  return out;
}

DETTRIAL_INLINE AdaptiveAsha::AdaptiveAsha(SearcherSettings config, HyperparameterSpace space, std::uint64_t experiment_seed)
    : config_(std::move(config)), space_(std::move(space)), random_(experiment_seed), brackets_(asha_brackets(config_)) {
  rung_metrics_.resize(brackets_.size());
  for (std::size_t b = 0; b < brackets_.size(); ++b) rung_metrics_[b].resize(static_cast<std::size_t>(brackets_[b].rungs));
  created_.assign(brackets_.size(), 0);
}

DETTRIAL_INLINE std::vector<TrialRequest> AdaptiveAsha::initial() {
  std::vector<TrialRequest> out;
  for (std::size_t b = 0; b < brackets_.size(); ++b)
    for (std::int64_t i = 0; i < std::min(brackets_[b].max_concurrent, brackets_[b].max_trials); ++i) out.push_back(next(b));
  return out;
}

DETTRIAL_INLINE SearcherDecision AdaptiveAsha::on_validation(std::int64_t trial, double metric, double time) {
  auto it = trials_.find(trial);
  if (it == trials_.end()) return SearcherDecision::keep_training;
  State& s = it->second;
  const double value = config_.smaller_is_better ? metric : -metric;
  const AshaBracket& bracket = brackets_[static_cast<std::size_t>(s.bracket)];
  while (s.rung < bracket.rungs && time >= static_cast<double>(bracket.units_needed[static_cast<std::size_t>(s.rung)])) {
    auto& rung = rung_metrics_[static_cast<std::size_t>(s.bracket)][static_cast<std::size_t>(s.rung)];
    const auto pos = std::upper_bound(rung.begin(), rung.end(), value);
    const auto index = static_cast<std::int64_t>(pos - rung.begin());
    rung.insert(pos, value);
    if (s.rung == bracket.rungs - 1) return SearcherDecision::stop;  // the top rung: done
    if (index >= std::max<std::int64_t>(static_cast<std::int64_t>(static_cast<double>(rung.size()) / config_.divisor), 1))
      return SearcherDecision::stop;
    ++s.rung;
  }
  return SearcherDecision::keep_training;
}

DETTRIAL_INLINE std::vector<TrialRequest> AdaptiveAsha::on_trial_end(std::int64_t trial) {
  auto it = trials_.find(trial);
  if (it == trials_.end()) return {};
  const auto b = static_cast<std::size_t>(it->second.bracket);
  if (created_[b] < brackets_[b].max_trials) return {next(b)};
  return {};
}

DETTRIAL_INLINE TrialRequest AdaptiveAsha::next(std::size_t bracket) {
  TrialRequest r;
  r.id = ++last_id_;
  r.seed = random_.trial_seed();
  r.hparams = space_.sample(random_.engine());
  r.max_length = config_.max_time;
  r.bracket = static_cast<int>(bracket);
  ++created_[bracket];
  trials_[r.id] = State{static_cast<int>(bracket), 0};
  return r;
}

}  // namespace dettrial::searcher

namespace dettrial {

DETTRIAL_INLINE Searcher make_searcher(const SearcherSettings& config, const HyperparameterSpace& space, std::uint64_t experiment_seed) {
  switch (config.kind) {
    case SearcherKind::single: {
      SearcherSettings one = config;
      one.max_trials = 1;
      return searcher::Random(one, space, experiment_seed);
    }
    case SearcherKind::random: return searcher::Random(config, space, experiment_seed);
    case SearcherKind::grid: return searcher::Grid(config, space, experiment_seed);
    case SearcherKind::adaptive_asha: return searcher::AdaptiveAsha(config, space, experiment_seed);
  }
  throw ConfigError("searcher '" + std::string(config.name()) + "' is not one dettrial has (single, random, grid, adaptive_asha)");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/searchers.hpp
// ---- end dettrial/dettrial.hpp
