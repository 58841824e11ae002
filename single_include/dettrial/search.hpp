// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
#include "dettrial.hpp"
// ---- begin dettrial/search.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Hyperparameter search for dettrial: Determined's search spaces (`hyperparameters` with
/// `type: const | int | double | log | categorical`) and searchers (single, random, grid, ASHA), for a
/// program that samples or drives trials itself. Opt-in, next to <dettrial/dettrial.hpp>: a trial's
/// translation unit does not read them (<dettrial/main.hpp>, the experiment runner, includes them).


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

}  // namespace dettrial

namespace dettrial::detail {

/// Draws trial seeds and hyperparameters from the experiment seed: the same seed, the same trials.
class SearchRandom {
 public:
  explicit SearchRandom(std::uint64_t experiment_seed) : rng_(mix64(experiment_seed ^ 0x5EA2C4ULL)) {}
  std::uint64_t trial_seed() { return std::uniform_int_distribution<std::uint64_t>(0, (1ULL << 31) - 1)(rng_); }
  std::mt19937_64& engine() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace dettrial::detail

namespace dettrial::searcher {

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

}  // namespace dettrial::searcher

namespace dettrial::detail {
/// The rung count of each ASHA bracket, most first: `bracket_rungs`, or those the mode picks.
DETTRIAL_INLINE std::vector<std::int64_t> asha_bracket_rungs(const SearcherSettings& c);
/// Shares `max_concurrent_trials` out over the ASHA brackets (Determined's rule when it is 0).
DETTRIAL_INLINE void share_asha_concurrency(const SearcherSettings& c, std::vector<searcher::AshaBracket>& brackets);
}  // namespace dettrial::detail

namespace dettrial {
/// The searcher an experiment config names.
using Searcher = std::variant<searcher::Random, searcher::Grid, searcher::AdaptiveAsha>;

/// Builds the searcher `config` names over `space` (single is random with one trial).
DETTRIAL_INLINE Searcher make_searcher(const SearcherSettings& config, const HyperparameterSpace& space, std::uint64_t experiment_seed);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

DETTRIAL_INLINE std::vector<std::int64_t> asha_bracket_rungs(const SearcherSettings& c) {
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
  return rungs;
}

DETTRIAL_INLINE void share_asha_concurrency(const SearcherSettings& c, std::vector<searcher::AshaBracket>& brackets) {
  const auto n = static_cast<std::int64_t>(brackets.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (c.max_concurrent_trials > 0)
      brackets[static_cast<std::size_t>(i)].max_concurrent =
          std::max<std::int64_t>(c.max_concurrent_trials / n + (i < c.max_concurrent_trials % n ? 1 : 0), 1);
    else brackets[static_cast<std::size_t>(i)].max_concurrent = std::max(brackets.back().max_trials, static_cast<std::int64_t>(c.divisor));
  }
}

}  // namespace dettrial::detail

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
  const std::vector<std::int64_t> rungs = detail::asha_bracket_rungs(c);
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
  detail::share_asha_concurrency(c, out);
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
// ---- end dettrial/search.hpp
