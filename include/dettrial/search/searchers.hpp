// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's searchers: single, random, grid and adaptive_asha (stopping-based ASHA), each
/// a type with the same three decisions (which trials to start, whether a validation stops a trial,
/// which trials replace one that ended), chosen from the experiment config at the start.
#pragma once

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

#include "../error.hpp"
#include "../config/searcher_settings.hpp"
#include "../detail/random.hpp"
#include "../detail/yaml.hpp"
#include "hyperparameter_space.hpp"
#include "../detail/linkage.hpp"

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
