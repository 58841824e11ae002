// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A trial's hyperparameters: typed, nested, with errors that name the key and the value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "../error.hpp"
#include "../detail/yaml.hpp"
#include "../detail/linkage.hpp"

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

  /// Determined's `global_batch_size`, the one hyperparameter the harness reads itself, when given
  /// (a present but mistyped value throws, naming it). Every reader of it asks here.
  std::optional<std::int64_t> global_batch_size() const {
    if (!contains(global_batch_size_key)) return std::nullopt;
    return get<std::int64_t>(global_batch_size_key);
  }
  static constexpr std::string_view global_batch_size_key = "global_batch_size";
  /// A slot's share of `global_batch_size` over `slots` slots; a HyperparameterError when it is
  /// missing or smaller than `slots`.
  std::int64_t per_slot_batch_size(std::int64_t slots) const;

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

DETTRIAL_INLINE std::int64_t Hyperparameters::per_slot_batch_size(std::int64_t slots) const {
  const std::optional<std::int64_t> global = global_batch_size();
  if (!global)
    throw HyperparameterError("the batch size getters need the hyperparameter 'global_batch_size', which " + source_ + " does not define");
  if (*global < slots)
    throw HyperparameterError("global_batch_size (" + std::to_string(*global) + ") is smaller than slots_per_trial (" +
                              std::to_string(slots) + ")");
  return *global / slots;
}

DETTRIAL_INLINE Hyperparameters Hyperparameters::parse(const std::string& yaml_text, std::string source) {
  YAML::Node root = detail::load_yaml_or_throw<HyperparameterError>(yaml_text, source);
  return Hyperparameters(std::move(root), source);
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
