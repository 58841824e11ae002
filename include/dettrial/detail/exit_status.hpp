// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The exit statuses of a trial program that its supervisors (the built-in launcher, an
/// experiment runner, a user's script) act on: one source for all of them.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <sys/wait.h>

#include <optional>
#include <string>

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

/// How a process ended, decoded once from its wait status: the code it exited with, or the signal
/// that killed it. Supervisors ask this, not the wait status.
struct ProcessEnd {
  std::optional<int> exit_code;  ///< set when it exited
  std::optional<int> signal;     ///< set when a signal killed it

  static ProcessEnd from_wait_status(int status) {
    ProcessEnd end;
    if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) end.signal = WTERMSIG(status);
    return end;
  }
  bool exited_with(int code) const { return exit_code == code; }
  bool succeeded() const { return exited_with(0); }
  /// Stopped by a signal after a checkpoint, to be continued.
  bool interrupted() const { return exited_with(exit_status_interrupted_value); }
  /// A wrong configuration: running it again fails the same way.
  bool config_error() const { return exited_with(exit_status_config_value); }
  bool killed_by(int s) const { return signal == s; }
  /// "exit status 1" or "killed by signal 9".
  std::string describe() const {
    return signal ? "killed by signal " + std::to_string(*signal) : "exit status " + std::to_string(exit_code.value_or(-1));
  }
};

}  // namespace dettrial::detail
