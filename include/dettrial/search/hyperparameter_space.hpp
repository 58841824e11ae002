// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's hyperparameter space: const, int, double, log and categorical axes, nested maps;
/// random samples and grid points, each as a plain YAML map of values a trial reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "../error.hpp"
#include "../detail/yaml.hpp"
#include "../detail/linkage.hpp"

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
  /// The axis the map `v` (which has a `type`) describes.
  static HyperparameterAxis parse_axis(HyperparameterAxis a, const YAML::Node& v, const std::string& source);
  /// An int, double or log axis's bounds, base and count.
  static void parse_range(HyperparameterAxis& a, const YAML::Node& v, const std::string& type, const std::string& source);

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
    if (v.IsMap() && v["type"]) {
      axes_.push_back(parse_axis(std::move(a), v, source));
    } else if (v.IsMap()) {
      parse(v, path, source);  // nested
    } else {
      a.values.push_back(v);  // a plain value is a constant
      axes_.push_back(std::move(a));
    }
  }
}

DETTRIAL_INLINE HyperparameterAxis HyperparameterSpace::parse_axis(HyperparameterAxis a, const YAML::Node& v, const std::string& source) {
  const std::string name = a.name();
  const std::string type = v["type"].Scalar();
  if (type == "const") {
    if (!v["val"]) throw ConfigError(detail::where(v, source) + ": hyperparameter '" + name + "' of type const has no 'val'");
    a.values.push_back(v["val"]);
  } else if (type == "int" || type == "double" || type == "log") {
    parse_range(a, v, type, source);
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
  return a;
}

DETTRIAL_INLINE void HyperparameterSpace::parse_range(HyperparameterAxis& a, const YAML::Node& v, const std::string& type,
                                                      const std::string& source) {
  const std::string name = a.name();
  auto number = [&](const char* key) {
    const YAML::Node n = v[key];
    double x = 0;
    if (!n || !detail::try_read(n, x))
      throw ConfigError(detail::where(n ? n : v, source) + ": hyperparameter '" + name + "' (type " + type + ") needs a number '" + key +
                        "'" + (n ? ", found " + detail::describe(n) : std::string()));
    return x;
  };
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
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
