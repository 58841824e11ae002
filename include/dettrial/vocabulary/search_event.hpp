// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::SearchEvent, one line of an experiment's events.jsonl, and dettrial::TrialState:
/// the schema the search runner writes and replays and the search's report reads, in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "../detail/json_fwd.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// How a trial of an experiment ended (or where it stands).
enum class TrialState { queued, running, completed, stopped_by_searcher, errored, interrupted };

/// "QUEUED", "RUNNING", "COMPLETED", "STOPPED_EARLY", "ERRORED", "INTERRUPTED": Determined's names.
DETTRIAL_INLINE const char* to_string(TrialState s);

/// The state named `name` (as to_string writes it), or nullopt.
DETTRIAL_INLINE std::optional<TrialState> trial_state_named(const std::string& name);

/**
 * @brief One event of an experiment's events.jsonl, in the order the searcher was told of them: a
 * second runner replays them into a searcher made from the same seed to continue the experiment,
 * and the search's report draws them. `{"event":"validation"|"restart"|"end","trial":<id>,...}`.
 */
struct SearchEvent {
  /// A validation the searcher was told of.
  struct Validation {
    double metric = 0;
    /// The searcher's time metric at it (the batches when the trial does not report one).
    double time = 0;
    std::optional<std::int64_t> batches;
    /// ASHA: the rung it reached (0: the first).
    std::optional<std::int64_t> rung;
    /// The searcher stopped the trial on it.
    bool stopped = false;
  };
  /// The trial failed and runs again from its latest checkpoint.
  struct Restart {
    std::int64_t restarts = 0;
  };
  /// The trial ended.
  struct End {
    TrialState state = TrialState::completed;
    std::int64_t restarts = 0;
  };

  std::int64_t trial = 0;
  std::variant<Validation, Restart, End> what;
  /// The Slurm job whose end a restart or end records (a later runner then knows it was handled).
  std::optional<std::int64_t> slurm_job;

  /// The event in `j`, strictly: a missing field, one of the wrong type, an unknown event or end state
  /// throws detail::JsonFieldError naming the field (readers name the file).
  static SearchEvent from_json(const detail::Json& j);
  /// The event's line, without its newline.
  detail::Json to_json() const;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../detail/json.hpp"

namespace dettrial {

DETTRIAL_INLINE const char* to_string(TrialState s) {
  switch (s) {
    case TrialState::queued: return "QUEUED";
    case TrialState::running: return "RUNNING";
    case TrialState::completed: return "COMPLETED";
    case TrialState::stopped_by_searcher: return "STOPPED_EARLY";
    case TrialState::errored: return "ERRORED";
    case TrialState::interrupted: return "INTERRUPTED";
  }
  return "?";
}

DETTRIAL_INLINE std::optional<TrialState> trial_state_named(const std::string& name) {
  for (auto s : {TrialState::queued, TrialState::running, TrialState::completed, TrialState::stopped_by_searcher, TrialState::errored,
                 TrialState::interrupted})
    if (name == to_string(s)) return s;
  return std::nullopt;
}

DETTRIAL_INLINE SearchEvent SearchEvent::from_json(const detail::Json& j) {
  using detail::json_as, detail::json_field, detail::json_find;
  const auto optional_integer = [&j](const char* key) -> std::optional<std::int64_t> {
    if (const detail::Json* v = json_find(j, key)) return json_as<std::int64_t>(*v, key);
    return std::nullopt;
  };
  const auto trial = json_as<std::int64_t>(json_field(j, "trial"), "trial");
  const auto slurm_job = optional_integer("slurm_job");
  const auto kind = json_as<std::string>(json_field(j, "event"), "event");
  if (kind == "validation") {
    Validation v{.metric = json_as<double>(json_field(j, "metric"), "metric"),
                 .time = json_as<double>(json_field(j, "time"), "time"),
                 .batches = optional_integer("batches"),
                 .rung = optional_integer("rung"),
                 .stopped = false};
    if (const detail::Json* stopped = json_find(j, "stopped")) v.stopped = json_as<bool>(*stopped, "stopped");
    return {.trial = trial, .what = v, .slurm_job = slurm_job};
  }
  if (kind == "restart")
    return {
        .trial = trial, .what = Restart{.restarts = json_as<std::int64_t>(json_field(j, "restarts"), "restarts")}, .slurm_job = slurm_job};
  if (kind == "end") {
    const auto name = json_as<std::string>(json_field(j, "state"), "state");
    // The states a trial ends in (an interrupted one continues, and logs no end).
    const auto state = trial_state_named(name);
    if (!state || (*state != TrialState::completed && *state != TrialState::stopped_by_searcher && *state != TrialState::errored))
      throw detail::JsonFieldError("'state' is '" + name + "', not COMPLETED, STOPPED_EARLY or ERRORED");
    return {.trial = trial,
            .what = End{.state = *state, .restarts = json_as<std::int64_t>(json_field(j, "restarts"), "restarts")},
            .slurm_job = slurm_job};
  }
  throw detail::JsonFieldError("'event' is '" + kind + "', not validation, restart or end");
}

DETTRIAL_INLINE detail::Json SearchEvent::to_json() const {
  detail::Json j;
  if (const auto* v = std::get_if<Validation>(&what)) {
    j = {{"event", "validation"}, {"trial", trial}, {"metric", v->metric}, {"time", v->time}};
    if (v->batches) j["batches"] = *v->batches;
    if (v->rung) j["rung"] = *v->rung;
    if (v->stopped) j["stopped"] = true;
  } else if (const auto* r = std::get_if<Restart>(&what)) {
    j = {{"event", "restart"}, {"trial", trial}, {"restarts", r->restarts}};
  } else {
    const auto& end = std::get<End>(what);
    j = {{"event", "end"}, {"trial", trial}, {"state", to_string(end.state)}, {"restarts", end.restarts}};
  }
  if (slurm_job) j["slurm_job"] = *slurm_job;
  return j;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
