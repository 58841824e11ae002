// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one rule for restarting a failed trial from its checkpoint, whoever restarts it: the
/// trial's own process (a trial run alone), the launcher of a data-parallel job, or a search's
/// runner. Each owns the count of the attempts it supervises, and only one restarts any failure:
/// a search's trial process is started with --max-restarts 0, so its runner alone counts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "storage.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief Determined's `max_restarts`: a trial that fails is restarted from its latest checkpoint at
 * most `max_restarts` times over its life (not per attempt, and not once in the trial's process and
 * again in its supervisor). dettrial restarts only a failure that can go differently:
 * - a wrong configuration (exit status 78, ConfigError) fails the same way again: never restarted;
 * - an attempt that wrote no checkpoint newer than the one it began from would start where it did
 *   (missing data, a bug at batch 0): not restarted either, however many restarts are left.
 * What is not known (a job that ended while no runner watched it) counts as progress.
 */
class RestartPolicy {
 public:
  /// How an attempt ended.
  enum class Failure {
    configuration,  ///< a wrong configuration: running it again fails the same way
    other,          ///< anything else (an exception, a crash, a lost rank, a cancelled job)
  };

  explicit RestartPolicy(std::int64_t max_restarts, std::int64_t used = 0) : max_restarts_(max_restarts), used_(used) {}

  /**
   * @brief Decides about a failed attempt, and counts the restart it grants: nullopt to restart,
   * else why not, as a clause ("it used its 5 restart(s) (max_restarts)"). `progressed`: the
   * attempt wrote a checkpoint newer than the latest one before it (nullopt: not known).
   */
  DETTRIAL_INLINE std::optional<std::string> refuse_restart(Failure failure, std::optional<bool> progressed);

  std::int64_t max_restarts() const { return max_restarts_; }
  /// Restarts granted so far.
  std::int64_t used() const { return used_; }
  /// "restart 2 of max_restarts 5", for the line that says a restart happens.
  std::string restart_text() const { return "restart " + std::to_string(used_) + " of max_restarts " + std::to_string(max_restarts_); }

 private:
  std::int64_t max_restarts_;
  std::int64_t used_;
};

/// Whether `after` (a checkpoint storage's listing when an attempt ended) holds a checkpoint newer
/// than every one in `before` (its listing when the attempt began).
DETTRIAL_INLINE bool wrote_new_checkpoint(const std::vector<CheckpointInfo>& before, const std::vector<CheckpointInfo>& after);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE std::optional<std::string> RestartPolicy::refuse_restart(Failure failure, std::optional<bool> progressed) {
  if (failure == Failure::configuration) return "a wrong configuration fails the same way again";
  if (progressed == false) return "it failed before writing a new checkpoint (a restart would start where this attempt did)";
  if (used_ >= max_restarts_) return "it used its " + std::to_string(max_restarts_) + " restart(s) (max_restarts)";
  ++used_;
  return std::nullopt;
}

DETTRIAL_INLINE bool wrote_new_checkpoint(const std::vector<CheckpointInfo>& before, const std::vector<CheckpointInfo>& after) {
  return !after.empty() && (before.empty() || after.back().uuid != before.back().uuid);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
