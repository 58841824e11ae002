// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The exit statuses of a trial program that its supervisors (the built-in launcher, an
/// experiment runner, a user's script) act on: one source for all of them.
#pragma once

namespace dettrial::detail {

/// Stopped by SIGINT or SIGTERM after a checkpoint: continue it later (sysexits' EX_TEMPFAIL).
inline constexpr int exit_status_interrupted_value = 75;
/// The configuration or the trial's use of it is wrong (a missing hyperparameter, a searcher metric
/// that validation does not report, a broken config): running it again fails the same way, so an
/// experiment does not restart it (sysexits' EX_CONFIG).
inline constexpr int exit_status_config_value = 78;

/// The wait status (as waitpid gives it, for WIFEXITED and the rest) of a process that exited
/// with `code`, or that `signal` killed: for ends a supervisor learns of other than by waitpid.
inline constexpr int wait_status_exited(int code) { return (code & 0xff) << 8; }
inline constexpr int wait_status_killed(int signal) { return signal & 0x7f; }

}  // namespace dettrial::detail
