// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Small helpers over yaml-cpp: positions for messages, typed reads that name the value at fault.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

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

#include "linkage.hpp"

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

/// `node` as one line of flow YAML, `{lr: 0.01, layers: 2}`: a trial's hyperparameters in messages.
DETTRIAL_INLINE std::string one_line(const YAML::Node& node);

/// The one form of a YAML syntax error in a message: "<source>:<line>:<column>: YAML syntax error:
/// <what yaml-cpp says>" (without the position when yaml-cpp has none).
DETTRIAL_INLINE std::string yaml_syntax_error(const std::string& source, const YAML::Exception& e);

/// `text` parsed, or a syntax error (yaml_syntax_error's text) thrown as an `ErrorT`.
template <class ErrorT>
YAML::Node load_yaml_or_throw(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ErrorT(yaml_syntax_error(source, e));
  }
}

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

DETTRIAL_INLINE std::string yaml_syntax_error(const std::string& source, const YAML::Exception& e) {
  const std::string where =
      e.mark.is_null() ? source : source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
  return where + ": YAML syntax error: " + e.msg;
}

DETTRIAL_INLINE std::string one_line(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
