// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief SIGINT and SIGTERM during fit: the first asks the trainer to finish the batch, checkpoint
/// and return; a second one ends the process at once (the default action of that signal).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <atomic>
#include <csignal>
#include <optional>

#include <signal.h>
#include <unistd.h>

#include "linkage.hpp"

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
/// Set (to 1) by a search's runner in each trial process it starts, locally or as a Slurm job: the
/// trial waits for the run folder's lock that its predecessor (a restarted attempt) may still hold.
/// (DET_TRIAL_ID is the trial's id for `context.get_trial_id()`, which a user may also set.)
inline constexpr const char* search_trial_variable = "DETTRIAL_SEARCH_TRIAL";

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
