// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
#include "dettrial.hpp"
#include "search.hpp"
// ---- begin dettrial/main.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial's command line, opt-in: `dettrial::main<MyTrial>(argc, argv)` (one trial, a
/// data-parallel job through the built-in launcher, or a hyperparameter search). Include it in the
/// one translation unit that defines `main`; trials need only <dettrial/dettrial.hpp>.


// ---- begin dettrial/cli/main.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::main<Trial>(argc, argv): a whole trial program's command line in one call, in
/// stages: the command line (command_line.hpp), the run plan (run_plan.hpp), then a search, a launch
/// of local ranks or the training of this rank; the exit status comes from how it ended.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <sys/types.h>

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

// ---- begin dettrial/checkpoint/restart_policy.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one rule for restarting a failed trial from its checkpoint, whoever restarts it: the
/// trial's own process (a trial run alone), the launcher of a data-parallel job, or a search's
/// runner. Each owns the count of the attempts it supervises, and only one restarts any failure:
/// a search's trial process is started with --max-restarts 0, so its runner alone counts.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>


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
// ---- end dettrial/checkpoint/restart_policy.hpp
// ---- begin dettrial/search/experiment.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Runs a hyperparameter search: each trial is its own process of the same program (a crash
/// cannot take the experiment down), on this machine or as a Slurm job, restarted from its latest
/// checkpoint up to max_restarts times; ASHA's stop is a SIGTERM (the trial checkpoints and exits); an
/// event log makes a second run of the same command continue the experiment (adopting the Slurm jobs
/// still running); a summary table and summary.json at the end, and report.html (the search's page,
/// refreshed as trials end).

#include <sys/wait.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <yaml-cpp/yaml.h>

// ---- begin dettrial/detail/exit_status.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The exit statuses of a trial program that its supervisors (the built-in launcher, an
/// experiment runner, a user's script) act on: one source for all of them.

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
// ---- end dettrial/detail/exit_status.hpp
// ---- begin dettrial/detail/process.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Starting child processes (ranks of the built-in launcher, trials of an experiment) with
/// extra environment variables and their output sent to a file.

#include <unistd.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>


extern "C" char** environ;

namespace dettrial::detail {

struct SpawnOptions {
  /// `NAME=value` entries added to this process's environment; each replaces an inherited variable
  /// of the same name (getenv would otherwise find the inherited one first).
  std::vector<std::string> extra_env{};
  /// Inherited variables left out of the child's environment: those whose names start with one of these.
  std::vector<std::string> drop_env_prefixes{};
  /// Where stdout goes (and stderr, with merge_stderr); empty: inherited.
  std::string output{};
  bool append = false;
  bool merge_stderr = true;
  /// Starts the child in a process group of its own: a terminal's Ctrl-C (sent to the foreground
  /// group) then reaches it only through the supervisor that forwards it, once.
  bool own_process_group = false;
};

/// Starts `program` with `args` as its argv (the program name first); returns its pid.
DETTRIAL_INLINE pid_t spawn_process(const std::string& program, std::vector<std::string> args, const SpawnOptions& options = {});

/// Runs `program` to its end and returns its waitpid status. Waited for here, by pid: a
/// supervisor's own waitpid(-1) loop never takes it.
DETTRIAL_INLINE int run_and_wait(const std::string& program, std::vector<std::string> args, const SpawnOptions& options = {});

/// The path of executable `name` on PATH, or "" when there is none.
DETTRIAL_INLINE std::string find_on_path(const std::string& name);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>

namespace dettrial::detail {

DETTRIAL_INLINE int run_and_wait(const std::string& program, std::vector<std::string> args, const SpawnOptions& options) {
  int status = 0;
  const pid_t pid = spawn_process(program, std::move(args), options);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

DETTRIAL_INLINE std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

DETTRIAL_INLINE pid_t spawn_process(const std::string& program, std::vector<std::string> args, const SpawnOptions& options) {
  std::vector<std::string> env_strings;
  auto name_of = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e; ++e) {
    const std::string_view name = name_of(*e);
    const bool replaced =
        std::any_of(options.extra_env.begin(), options.extra_env.end(), [&](const std::string& extra) { return name_of(extra) == name; });
    const bool dropped = std::any_of(options.drop_env_prefixes.begin(), options.drop_env_prefixes.end(),
                                     [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; });
    if (!replaced && !dropped) env_strings.emplace_back(*e);
  }
  env_strings.insert(env_strings.end(), options.extra_env.begin(), options.extra_env.end());
  std::vector<char*> env, argv;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.output.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.output.c_str(),
                                     O_WRONLY | O_CREAT | (options.append ? O_APPEND : O_TRUNC), 0644);
    if (options.merge_stderr) posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (options.own_process_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), env.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error("cannot start '" + program + "'");
  return pid;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/detail/process.hpp
// ---- begin dettrial/search/trial_summary.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::TrialSummary: one line of an experiment's summary.

#include <cstdint>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/// One line of the experiment summary.
struct TrialSummary {
  std::int64_t id = 0;
  YAML::Node hparams;
  TrialState state = TrialState::queued;
  std::int64_t restarts = 0;
  std::int64_t batches_trained = 0;
  std::optional<double> best_metric;
  std::optional<double> last_metric;
  std::string best_checkpoint;
};

}  // namespace dettrial
// ---- end dettrial/search/trial_summary.hpp
// ---- begin dettrial/search/detail/event_log.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An experiment's events.jsonl as the search runner writes and replays it: typed events,
/// read strictly, each error naming the file and the line.

#include <filesystem>
#include <string>
#include <utility>
#include <vector>


namespace dettrial::detail {

/// An event of the log and its line's text, for messages.
struct LoggedEvent {
  SearchEvent event;
  std::string line;
};

/// events.jsonl: what the searcher was told, in order, so that a second runner replays it.
class EventLog {
 public:
  explicit EventLog(std::filesystem::path path) : file_(std::move(path)) {}
  const std::filesystem::path& path() const { return file_.path(); }

  void append(const SearchEvent& event) const;

  /// Cuts a torn last line (a runner killed while writing it) off, so that this runner's first
  /// event is not appended to it and lost with it; true when it cut one.
  bool cut_torn_line() const { return file_.cut_torn_line(); }

  /// The events, in order (none when there is no log). A torn last line is left out; a damaged line
  /// before it, or an event that lacks a field or has one of the wrong type, is an Error naming the
  /// file and quoting the line.
  std::vector<LoggedEvent> read() const;

 private:
  JsonlFile file_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

DETTRIAL_INLINE void EventLog::append(const SearchEvent& event) const { file_.append(event.to_json()); }

DETTRIAL_INLINE std::vector<LoggedEvent> EventLog::read() const {
  std::vector<LoggedEvent> events;
  if (!std::filesystem::exists(path())) return events;
  for (const Json& j : file_.read()) {
    std::string line = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    try {
      events.push_back({SearchEvent::from_json(j), std::move(line)});
    } catch (const JsonFieldError& err) {
      throw Error("'" + path().string() + "' has an event that lacks a field or has one of the wrong type (" + err.what() + "): " + line);
    }
  }
  return events;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/detail/event_log.hpp
// ---- begin dettrial/search/detail/slurm.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A search's trials as Slurm jobs (`--launcher slurm`): Slurm's client commands, the job
/// names, the srun command around a trial's, stopping a trial's job, and reading the jobs the
/// controller knows. The Experiment decides when; this knows how to say it to Slurm.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>


namespace dettrial::detail {

/// A Slurm job of an experiment, as `scontrol show job` lists it (a job that ended stays listed for
/// the cluster's MinJobAge, 300 s by default).
struct SlurmJob {
  std::int64_t trial = 0;
  std::int64_t id = 0;
  std::string state;
  /// Its wait status, once it ended: the exit code or the signal that killed it, and for a job
  /// that ended without either (cancelled while queued, timed out, its node failed) SIGTERM for a
  /// cancel and SIGKILL otherwise, so that it never reads as a success.
  int status = 0;
};

/// Whether a Slurm job state is final (the job's record then holds its exit code).
DETTRIAL_INLINE bool slurm_job_ended(std::string_view state);

/// A trial's command line: the program, its arguments and what changes in its environment.
struct TrialCommand {
  std::string program{};
  std::vector<std::string> args{};
  /// NAME=value pairs added to the runner's environment.
  std::vector<std::string> extra_env{};
  /// Variables of the runner's environment left out, by prefix.
  std::vector<std::string> drop_env_prefixes{};
};

/**
 * @brief The Slurm cluster an experiment's trials run on: its client commands (found on PATH when
 * made) and the experiment's jobs, named `dettrial-e<experiment>-t<trial>`.
 */
class SlurmCluster {
 public:
  /// Finds srun, scancel and scontrol on PATH; throws ConfigError naming the one that is missing.
  DETTRIAL_INLINE SlurmCluster();

  /// The experiment whose jobs this names and lists (its id is known once its folder is).
  void set_experiment(std::int64_t experiment_id) { experiment_id_ = experiment_id; }
  /// The job name of trial `trial` (what squeue and scancel find it by).
  DETTRIAL_INLINE std::string job_name(std::int64_t trial) const;

  /// `command` run as trial `trial`'s job of `tasks` tasks, with the config's sbatch arguments.
  DETTRIAL_INLINE TrialCommand job_command(std::int64_t trial, std::int64_t tasks, const std::vector<std::string>& sbatch_args,
                                           TrialCommand command) const;
  /// Asks trial `trial`'s job to stop: SIGTERM to its tasks (`scancel --signal=TERM`: srun itself
  /// would cancel the step, killing the tasks before they checkpoint), and a job still queued is
  /// cancelled outright (it has trained nothing).
  DETTRIAL_INLINE void stop(std::int64_t trial) const;

  /// This experiment's jobs, by job id; nullopt when scontrol fails (the controller does not
  /// answer). `scratch` is a folder for scontrol's listing.
  DETTRIAL_INLINE std::optional<std::map<std::int64_t, SlurmJob>> jobs(const std::filesystem::path& scratch) const;
  /// Each trial's newest job among `jobs`.
  DETTRIAL_INLINE static std::map<std::int64_t, SlurmJob> newest_job_per_trial(const std::map<std::int64_t, SlurmJob>& jobs);

 private:
  /// What every job name of the experiment starts with (the trial's id follows).
  DETTRIAL_INLINE std::string job_name_prefix() const;

  std::string srun_, scancel_, scontrol_;
  std::int64_t experiment_id_ = 0;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <fstream>


namespace dettrial::detail {

DETTRIAL_INLINE bool slurm_job_ended(std::string_view state) {
  for (std::string_view end : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
                               "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
    if (state == end) return true;
  return false;
}

DETTRIAL_INLINE SlurmCluster::SlurmCluster() {
  for (const char* tool : {"srun", "scancel", "scontrol"}) {
    const std::string path = find_on_path(tool);
    if (path.empty())
      throw ConfigError(std::string("--launcher slurm runs each trial with Slurm's srun, stops it with scancel and finds its jobs with "
                                    "scontrol, but there is no ") +
                        tool + " on PATH; install Slurm's client commands, or run the search here with --launcher local");
    (std::string_view(tool) == "srun" ? srun_ : std::string_view(tool) == "scancel" ? scancel_ : scontrol_) = path;
  }
}

DETTRIAL_INLINE std::string SlurmCluster::job_name_prefix() const { return "dettrial-e" + std::to_string(experiment_id_) + "-t"; }

DETTRIAL_INLINE std::string SlurmCluster::job_name(std::int64_t trial) const { return job_name_prefix() + std::to_string(trial); }

DETTRIAL_INLINE TrialCommand SlurmCluster::job_command(std::int64_t trial, std::int64_t tasks, const std::vector<std::string>& sbatch_args,
                                                       TrialCommand command) const {
  // srun waits for the job and returns its tasks' exit status, so the runner supervises it as it
  // does a local trial; its messages (a failed task named) go to the trial's log.
  // --dependency=singleton: should a job of this trial outlive what this runner knows (a runner
  // killed between starting srun and the job reaching the controller), the next one waits for it.
  std::vector<std::string> srun = {srun_, "--job-name=" + job_name(trial), "--ntasks=" + std::to_string(tasks), "--kill-on-bad-exit=1",
                                   "--dependency=singleton"};
  srun.insert(srun.end(), sbatch_args.begin(), sbatch_args.end());
  command.args.insert(command.args.begin(), srun.begin(), srun.end());
  command.program = srun_;
  // Without an allocation's variables, srun starts a job of its own for the trial, also when this
  // runner runs inside an allocation: jobs are what squeue and scancel --name see, and each job's
  // rendezvous port (derived from its job id) is its own.
  command.drop_env_prefixes.emplace_back("SLURM_");
  if (const char* conf = std::getenv("SLURM_CONF"))
    command.extra_env.push_back(std::string("SLURM_CONF=") + conf);  // which cluster, not an allocation
  return command;
}

DETTRIAL_INLINE void SlurmCluster::stop(std::int64_t trial) const {
  const std::string name = "--name=" + job_name(trial);
  run_and_wait(scancel_, {scancel_, "--quiet", "--state=PENDING", name});
  run_and_wait(scancel_, {scancel_, "--quiet", "--signal=TERM", name});
}

}  // namespace dettrial::detail

namespace dettrial::detail::slurm {
inline std::optional<std::int64_t> number(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && !text.empty() ? std::optional(value) : std::nullopt;
}
/// The value of `key` (as "Key=") in one of scontrol's one-line records: up to the next space.
inline std::string field(const std::string& line, std::string_view key) {
  for (std::size_t at = line.find(key); at != std::string::npos; at = line.find(key, at + 1)) {
    if (at != 0 && line[at - 1] != ' ') continue;
    const std::size_t begin = at + key.size();
    return line.substr(begin, line.find(' ', begin) - begin);
  }
  return {};
}
}  // namespace dettrial::detail::slurm

namespace dettrial::detail {
DETTRIAL_INLINE std::optional<std::map<std::int64_t, SlurmJob>> SlurmCluster::jobs(const std::filesystem::path& scratch) const {
  using detail::slurm::field, detail::slurm::number;
  // One line per job the controller knows: "JobId=16 JobName=dettrial-e5-t1 ... JobState=RUNNING ... ExitCode=0:0 ...".
  const std::filesystem::path listing = scratch / ".slurm-jobs.txt";
  const int status = run_and_wait(scontrol_, {scontrol_, "--oneliner", "show", "job"}, {.output = listing.string(), .merge_stderr = false});
  std::map<std::int64_t, SlurmJob> jobs;
  std::ifstream in(listing);
  const std::string prefix = job_name_prefix();
  for (std::string line; std::getline(in, line);) {
    const std::string name = field(line, "JobName=");
    if (name.rfind(prefix, 0) != 0) continue;
    const auto trial = number(name.substr(prefix.size()));
    const auto id = number(field(line, "JobId="));
    if (!trial || !id) continue;
    SlurmJob job{*trial, *id, field(line, "JobState="), 0};
    // ExitCode=<exit code>:<signal>, as a wait status.
    const std::string code = field(line, "ExitCode=");
    const auto colon = code.find(':');
    const auto exit_code = number(code.substr(0, colon)).value_or(0);
    const auto signal = colon == std::string::npos ? 0 : number(code.substr(colon + 1)).value_or(0);
    job.status = signal != 0 ? wait_status_killed(static_cast<int>(signal)) : wait_status_exited(static_cast<int>(exit_code));
    if (job.status == 0 && job.state != "COMPLETED" && slurm_job_ended(job.state))
      job.status = wait_status_killed(job.state == "CANCELLED" ? SIGTERM : SIGKILL);
    jobs[*id] = std::move(job);
  }
  std::filesystem::remove(listing);
  if (status != 0 && jobs.empty()) return std::nullopt;
  return jobs;
}

DETTRIAL_INLINE std::map<std::int64_t, SlurmJob> SlurmCluster::newest_job_per_trial(const std::map<std::int64_t, SlurmJob>& jobs) {
  std::map<std::int64_t, SlurmJob> newest;
  for (const auto& [id, job] : jobs) newest[job.trial] = job;  // by ascending job id: the last is the newest
  return newest;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/detail/slurm.hpp
// ---- begin dettrial/search/detail/summary.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The end of an experiment: its retention over all trials' checkpoints, and the summary table.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>


namespace dettrial::detail {

/**
 * @brief Determined's garbage collection at the end of an experiment: a checkpoint of the trials in
 * `trials` goes when it is neither among the experiment's `save_experiment_best` nor its trial's
 * `save_trial_best` (by the searcher metric), nor among its trial's `save_trial_latest`.
 */
DETTRIAL_INLINE void apply_experiment_retention(const ExperimentConfig& config, const std::vector<RunFolder>& trials);

/// The table printed at the end: a row per trial (`metric` the searcher metric's name), then the
/// best trial's checkpoint when there is one.
DETTRIAL_INLINE std::string summary_table(const std::map<std::int64_t, TrialSummary>& trials, const std::string& metric,
                                          std::optional<std::int64_t> best_trial);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstdio>


namespace dettrial::detail {

DETTRIAL_INLINE void apply_experiment_retention(const ExperimentConfig& config, const std::vector<RunFolder>& trials) {
  const auto& storage = config.checkpoint_storage;
  if (storage.save_experiment_best == 0) return;  // the trials applied their own retention already
  const MetricOrder order = config.searcher.order();
  std::vector<CheckpointInfo> ranked;
  std::map<std::string, std::int64_t> trial_best_keep;  // uuid -> kept by its trial's rules
  for (const RunFolder& trial : trials) {
    const auto all = list_checkpoints(trial.checkpoints());
    for (const auto& c :
         checkpoints_to_delete(all, {.save_trial_best = storage.save_trial_best, .save_trial_latest = storage.save_trial_latest},
                               config.searcher.smaller_is_better))
      trial_best_keep[c.uuid] = 0;  // candidates for deletion
    for (const auto& c : all)
      if (c.validation_metric) ranked.push_back(c);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo& a, const CheckpointInfo& b) {
    return order.better(*a.validation_metric, *b.validation_metric);
  });
  for (std::size_t k = 0; k < ranked.size() && static_cast<std::int64_t>(k) < storage.save_experiment_best; ++k)
    trial_best_keep.erase(ranked[k].uuid);  // among the experiment's best: kept
  for (const RunFolder& trial : trials)
    for (const auto& c : list_checkpoints(trial.checkpoints()))
      if (trial_best_keep.count(c.uuid)) delete_checkpoint(c);
}

DETTRIAL_INLINE std::string summary_table(const std::map<std::int64_t, TrialSummary>& trials, const std::string& metric,
                                          std::optional<std::int64_t> best_trial) {
  std::string table = "\n trial  state           batches  restarts  best " + metric + "  last  hyperparameters\n";
  for (const auto& [id, t] : trials) {
    char row[160];
    std::snprintf(row, sizeof row, " %5lld  %-14s %8lld  %8lld  %12s  %6s  ", static_cast<long long>(id), to_string(t.state),
                  static_cast<long long>(t.batches_trained), static_cast<long long>(t.restarts),
                  t.best_metric ? std::to_string(*t.best_metric).c_str() : "-",
                  t.last_metric ? std::to_string(*t.last_metric).c_str() : "-");
    table += row + one_line(t.hparams) + "\n";
  }
  if (best_trial) table += " best: trial " + std::to_string(*best_trial) + ", checkpoint " + trials.at(*best_trial).best_checkpoint + "\n";
  return table;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/detail/summary.hpp
// ---- begin dettrial/search/detail/trial_launch.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a search's trial runs as: its own experiment config in its folder, and its command line.

#include <filesystem>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>


namespace dettrial::detail {

/**
 * @brief Trial `r`'s own experiment config: the experiment's, with the trial's hyperparameters as
 * values, one trial of its length (the single searcher), its seed, and checkpoint storage in its
 * folder that keeps what a restart and the experiment's retention need.
 */
DETTRIAL_INLINE YAML::Node trial_config(const ExperimentConfig& experiment, const TrialRequest& r, const RunFolder& folder);

/**
 * @brief The command line of `program` (dettrial::main's) that trains the trial in `folder` from its
 * config: resumed from its latest checkpoint when it has one, from the folder when an attempt failed
 * before its first (main then starts afresh there). `--max-restarts 0`: the runner restarts a
 * search's trials (one RestartPolicy count over a trial's life), not the trial's own process.
 */
DETTRIAL_INLINE std::vector<std::string> trial_arguments(const std::filesystem::path& program, const RunFolder& folder);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>


namespace dettrial::detail {

DETTRIAL_INLINE YAML::Node trial_config(const ExperimentConfig& experiment, const TrialRequest& r, const RunFolder& folder) {
  YAML::Node doc = YAML::Clone(experiment.yaml);
  doc["hyperparameters"] = YAML::Clone(r.hparams);
  const SearcherSettings& settings = experiment.searcher;
  YAML::Node searcher(YAML::NodeType::Map);
  searcher["name"] = std::string(to_string(SearcherKind::single));
  searcher["metric"] = settings.metric;
  searcher["smaller_is_better"] = settings.smaller_is_better;
  const std::string unit = settings.kind == SearcherKind::adaptive_asha ? settings.time_metric
                           : settings.max_length                        ? std::string(to_string(settings.max_length->unit()))
                                                                        : std::string("batches");
  searcher["max_length"][unit] = r.max_length;
  doc["searcher"] = searcher;
  doc["reproducibility"]["experiment_seed"] = r.seed;
  doc.remove("checkpoint_storage");
  const auto& kept = experiment.checkpoint_storage;
  YAML::Node storage(YAML::NodeType::Map);
  storage["type"] = "shared_fs";
  storage["host_path"] = folder.checkpoints().string();
  // The experiment's best are chosen among the trials' best, so each trial keeps its best until then.
  storage["save_trial_best"] = std::max<std::int64_t>(kept.save_trial_best, kept.save_experiment_best > 0 ? 1 : 0);
  storage["save_trial_latest"] = std::max<std::int64_t>(kept.save_trial_latest, 1);  // restarts need one
  storage["async"] = kept.async;
  doc["checkpoint_storage"] = storage;
  return doc;
}

DETTRIAL_INLINE std::vector<std::string> trial_arguments(const std::filesystem::path& program, const RunFolder& folder) {
  std::vector<std::string> args = {program.string(),    "--config", folder.config().string(), "--output",
                                   folder.dir.string(), "--quiet",  "--max-restarts",         "0"};
  if (!list_checkpoints(folder.checkpoints()).empty()) {
    args.emplace_back("--resume");
    args.push_back(folder.checkpoints().string());
  } else if (std::filesystem::exists(folder.metrics_log())) {
    // A restart before any checkpoint: the folder without one makes main start afresh there,
    // dropping the failed attempt's metrics and TensorBoard events first.
    args.emplace_back("--resume");
    args.push_back(folder.dir.string());
  }
  return args;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/detail/trial_launch.hpp
// ---- begin dettrial/search/detail/validation_tail.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A running trial's validations, read from its metrics.jsonl as the trial appends them.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>


namespace dettrial::detail {

/// A validation record of a trial's metrics.jsonl, as the searcher reads it.
struct TrialValidation {
  std::int64_t batches = 0;
  /// The searcher metric (nullopt when the record lacks it, or holds null: a NaN).
  std::optional<double> metric;
  /// The searcher's time metric (the batches when the record lacks it).
  double time = 0;
};

/// Follows one trial's metrics.jsonl (a resumed trial rewrites it: it is then read from the start).
class ValidationTail {
 public:
  /// The validation records appended to `metrics_log` since the last call, in order, with the
  /// searcher metric `metric` and the time metric `time_metric`.
  std::vector<TrialValidation> read_new(const std::filesystem::path& metrics_log, const std::string& metric,
                                        const std::string& time_metric);

 private:
  JsonlTail tail_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

DETTRIAL_INLINE std::vector<TrialValidation> ValidationTail::read_new(const std::filesystem::path& metrics_log, const std::string& metric,
                                                                      const std::string& time_metric) {
  const auto number = [](const Json* metrics, const std::string& name) -> std::optional<double> {
    const Json* value = metrics ? json_find(*metrics, name) : nullptr;
    if (!value || !value->is_number()) return std::nullopt;
    return value->get<double>();
  };
  std::vector<TrialValidation> out;
  for (const Json& record : tail_.read_new(metrics_log)) {
    const Json* type = json_find(record, "type");
    if (!type || !type->is_string() || type->get_ref<const std::string&>() != "validation") continue;
    const auto batches = MetricsLog::batches_of_record(record);
    if (!batches) continue;
    const Json* metrics = json_find(record, "metrics");
    out.push_back({.batches = *batches,
                   .metric = number(metrics, metric),
                   .time = number(metrics, time_metric).value_or(static_cast<double>(*batches))});
  }
  return out;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/detail/validation_tail.hpp

namespace dettrial {

/// Where a search's trials run.
enum class TrialLauncher {
  /// Child processes of the runner on this machine.
  local,
  /// Slurm jobs: each trial runs under `srun` (inside an allocation, a job step of it; outside, a job
  /// of its own), with `resources.slots_per_trial` tasks and the config's `slurm.sbatch_args`.
  slurm,
};

struct ExperimentOptions {
  /// The experiment's folder: trials/<id>/ (config, log, metrics.jsonl, checkpoints), events.jsonl, summary.json.
  std::filesystem::path output_dir;
  /// The program that trains one trial, with dettrial::main's command line (normally this one).
  std::filesystem::path program = "/proc/self/exe";
  bool quiet = false;
  TrialLauncher launcher = TrialLauncher::local;
};

/**
 * @brief An experiment: a searcher, its trials as child processes, and the record that lets it
 * resume. `run()` returns 0 when every trial completed or was stopped by the searcher, 1 when some
 * trial still failed after its restarts, 75 (exit_status_interrupted) when a signal interrupted it,
 * and 78 (exit_status_config_error) when a trial's configuration was wrong: that error would repeat
 * in every trial, so the search stops at the first one (other trials checkpoint and stop), prints
 * it, and continues when the same command runs again after the fix.
 *
 * Its parts, by concern: the event log (search/detail/event_log.hpp, replayed here), the trials'
 * configs and command lines (search/detail/trial_launch.hpp), Slurm (search/detail/slurm.hpp), the
 * trials' validations (search/detail/validation_tail.hpp), retention and the summary table
 * (search/detail/summary.hpp); this class decides and keeps the record.
 */
class Experiment {
 public:
  Experiment(ExperimentConfig config, ExperimentOptions options);

  int run();

  /// Every trial's summary, by id.
  std::map<std::int64_t, TrialSummary> trials() const;

  /// The searcher's first trials, then the folder's events.jsonl told to the searcher again, in
  /// order (what run() does first, once): trials() then says where the search stands. An event of
  /// a trial the searcher did not create, a trial's second end, a missing or mistyped field, or a
  /// damaged line before the last (the last may be torn by a crash, and is left out) is an Error
  /// naming the file.
  void replay();

 private:
  struct Running {
    /// The runner's child (the trial's process, or its srun); -1 for a Slurm job adopted from an
    /// earlier runner, which is watched through Slurm instead.
    pid_t pid = -1;
    /// An adopted trial's Slurm job id.
    std::int64_t slurm_job = 0;
    bool stop_sent = false;
    /// Its metrics.jsonl, read as the trial appends to it.
    detail::ValidationTail validations;
    /// The trial's checkpoints when this runner started the attempt (none known for an adopted
    /// job): whether a failed attempt made progress, for RestartPolicy.
    std::optional<std::vector<CheckpointInfo>> checkpoints_at_start;
  };

  /// Everything the runner knows of one trial.
  struct TrialRecord {
    TrialSummary summary;
    TrialRequest request;
    /// Its process (or Slurm job) while it runs.
    std::optional<Running> running;
    /// The batches of the last validation the searcher was told of.
    std::optional<std::int64_t> validated_batches;
    /// ASHA: the highest rung its validations reached (0: the first), as events.jsonl says.
    std::optional<std::int64_t> rung;
    /// The searcher stopped it, as events.jsonl says (an adopted trial's exit is then its stop).
    bool stop_logged = false;
    /// The last Slurm job whose end events.jsonl records (a restart or the end).
    std::optional<std::int64_t> handled_job;
  };

  // ---- a run from its start to its exit status --------------------------------------------------

  /// What the folder holds, continued: a torn last event cut off, the log replayed, the MLflow run
  /// started, Slurm jobs adopted, a trial whose stop the log records ended.
  void continue_from_folder();
  /// After a signal or a trial's configuration error: the trials stopped, the summary, the status.
  int stop_early();
  /// When every trial ended: retention, the summary and report, the status.
  int finish();

  /// The ids of the running trials, in order (a copy: ending one changes the records).
  std::vector<std::int64_t> running_ids() const;
  std::size_t running_count() const;

  /// SIGTERM to every running trial (each checkpoints and exits), once per signal this process got
  /// (a second Ctrl-C makes them abort), and waits for them.
  void stop_running_trials();

  /// Sends SIGTERM to trial `id`'s processes: to its process here, or, run by Slurm, to its job's
  /// tasks (`scancel --signal=TERM`: srun itself would cancel the step, killing the tasks before they
  /// checkpoint).
  void terminate_trial(std::int64_t id, const Running& run) const;

  /// Continuing an experiment whose trials ran on Slurm (the runner was killed, its trials' jobs
  /// ran on): a trial that has not ended in the event log and still has a job queued or running is
  /// adopted (watched through scontrol, stopped with scancel) instead of started a second time into
  /// the same folder; one whose job ended meanwhile ends as that job did.
  void adopt_slurm_jobs();
  /// Adopts `job` as trial `id`'s attempt when the log leaves it to run; true when the job has ended.
  bool adopt_slurm_job(std::int64_t id, const detail::SlurmJob& job);

  /// An adopted trial's job that ended: handled as a child's exit. Asks Slurm at most once a second.
  void reap_adopted(bool interrupting);

  /// The experiment's folder, and trial `id`'s run folder in it.
  ExperimentFolder folder() const { return {options_.output_dir}; }
  RunFolder trial_folder(std::int64_t id) const { return folder().trial(id); }
  std::filesystem::path trial_dir(std::int64_t id) const { return trial_folder(id).dir; }

  void say(const std::string& line) const;

  // ---- the event log: what the searcher was told, in order, so a second run replays it ----------

  /// The config's searcher settings, once a searcher that trains for `max_length` has one.
  static const SearcherSettings& checked_searcher(const ExperimentConfig& c);
  detail::EventLog events() const { return detail::EventLog(folder().events_log()); }
  void log_event(const SearchEvent& event) const { events().append(event); }
  /// One event of the log, replayed.
  void replay_event(const detail::LoggedEvent& logged);
  bool replayed_ = false;

  void add_trial(TrialRequest r);

  void record_metric(TrialSummary& t, double metric);

  // ---- trials as processes ---------------------------------------------------------------------

  void launch_queued();

  void launch(std::int64_t id);
  /// Trial `id`'s command line and environment, as a local process or a Slurm job.
  detail::TrialCommand trial_command(std::int64_t id) const;

  void reap(bool interrupting);

  /// The end of trial `id`'s process or job, `status` its wait status: completed, stopped by the
  /// searcher, restarted from its latest checkpoint, or failed.
  /// `slurm_job`: the job that ended, recorded in the event log (a later runner then knows that
  /// job's end was handled).
  void trial_ended(std::int64_t id, int status, bool stop_sent, bool interrupting, std::int64_t slurm_job = 0,
                   const std::optional<std::vector<CheckpointInfo>>& checkpoints_at_start = std::nullopt);
  /// A failed attempt of trial `id` queued again from its latest checkpoint (true), or, when
  /// RestartPolicy refuses, the trial ERRORED (false).
  bool restart_after_failure(std::int64_t id, int status, std::int64_t slurm_job,
                             const std::optional<std::vector<CheckpointInfo>>& checkpoints_at_start);
  /// The first trial configuration error: the trial's error line, and where its config came from.
  std::string config_error_text(std::int64_t id) const;

  /// The last `error: ...` line of a trial's log (what its program printed before it exited), or
  /// empty (a trial killed by a signal prints none).
  std::string last_error_line(std::int64_t id) const;
  /// How the trial's process ended and its error line: "exit status 1: error: ...".
  std::string describe_failure(std::int64_t id, int status) const;

  // ---- the searcher's decisions ------------------------------------------------------------------

  /// Reads the running trials' new validation records and lets the searcher decide on each.
  void poll_metrics();
  /// The searcher told of trial `id`'s validation `v` (its metric present), the event logged, and
  /// the trial stopped when the searcher says so.
  void tell_searcher(std::int64_t id, TrialRecord& trial, const detail::TrialValidation& v);

  // ---- the summary -------------------------------------------------------------------------------

  /// Batches trained and the best checkpoint, from the trial's folder.
  void refresh_from_disk(TrialSummary& t) const;

  /// The searcher metric's direction: the one "better" rule (dettrial::MetricOrder).
  MetricOrder order() const { return config_.searcher.order(); }

  /// summary.json (and, with `print`, the summary table on the terminal), after reading each
  /// trial's checkpoints: at the end, or when interrupted (no trial running).
  void write_summary(bool print = true);

  /// What summary.json holds, from what this runner knows now (without reading checkpoints, which
  /// running trials may be writing or deleting).
  detail::Json summary_json() const;
  /// The trial with the best metric so far.
  std::optional<std::int64_t> best_trial() const;

  /// Writes report.html: the search's page and the pages of the trials whose metrics changed (at
  /// the end, from summary.json, and its path printed). A page that cannot be written is one
  /// warning, never the search's failure.
  void refresh_report(bool at_end);

  /// "[experiment] 5 of 12 trials ended (2 completed, 3 stopped early, 0 failed), 2 running".
  std::string progress() const;

  /// The ASHA bracket trial `id` is in, or nullptr for the other searchers.
  const searcher::AshaBracket* bracket_of(std::int64_t id) const;

  /// The experiment's id, kept in its folder's `experiment.json` (drawn when the folder is new, so a
  /// continued experiment keeps it): what each trial's `context.get_experiment_id()` returns.
  static std::int64_t experiment_id_in(const std::filesystem::path& dir);

  ExperimentConfig config_;
  std::int64_t experiment_id_ = 0;
  /// The search's MLflow run (when tracked), its trials' runs nested under it.
  std::unique_ptr<detail::MlflowRun> mlflow_;
  /// Its id, which each trial's process gets in its environment (its run is created as a child).
  std::string mlflow_run_id_;
  /// Starts (or continues) the search's MLflow run and hands its id to the trials' processes.
  void start_mlflow();
  /// Ends it with `status`.
  void end_mlflow(detail::MlflowEnd status);
  /// The cluster the trials run on as jobs, with --launcher slurm.
  std::optional<detail::SlurmCluster> slurm_;
  /// When reap_adopted may ask Slurm again.
  std::chrono::steady_clock::time_point next_slurm_poll_{};
  ExperimentOptions options_;
  Searcher searcher_;
  /// Every trial the searcher asked for, by id.
  std::map<std::int64_t, TrialRecord> records_;
  /// The trials waiting to start, in order.
  std::vector<std::int64_t> queue_;
  /// The first trial that failed with a configuration error, and that error.
  std::optional<std::pair<std::int64_t, std::string>> config_error_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

DETTRIAL_INLINE const SearcherSettings& Experiment::checked_searcher(const ExperimentConfig& c) {
  if (c.searcher.kind != SearcherKind::adaptive_asha && !c.searcher.max_length)
    throw ConfigError(c.source + ": searcher '" + std::string(c.searcher.name()) + "' needs searcher.max_length, e.g. {batches: 1000}");
  return c.searcher;
}

DETTRIAL_INLINE Experiment::Experiment(ExperimentConfig config, ExperimentOptions options)
    : config_(std::move(config)),
      options_(std::move(options)),
      searcher_(make_searcher(checked_searcher(config_), HyperparameterSpace(config_.hyperparameters, config_.source),
                              config_.experiment_seed.value_or(0))) {
  if (config_.searcher.metric.empty())
    throw ConfigError(config_.source + ": searcher '" + std::string(config_.searcher.name()) + "' needs searcher.metric");
  if (options_.launcher == TrialLauncher::slurm) {
    slurm_.emplace();
    // Checkpoints and metrics go to the experiment's folder, which the trials' nodes must see.
    options_.output_dir = std::filesystem::absolute(options_.output_dir);
    if (options_.program == "/proc/self/exe") options_.program = std::filesystem::read_symlink("/proc/self/exe");
  }
}

// ---- a run from its start to its exit status ----------------------------------------------------

DETTRIAL_INLINE int Experiment::run() {
  // One runner per experiment folder; each trial's process locks its own run folder.
  const detail::FolderLock lock = detail::FolderLock::acquire(folder().lock(), "experiment folder");
  std::filesystem::create_directories(folder().trials());
  experiment_id_ = experiment_id_in(options_.output_dir);
  if (slurm_) slurm_->set_experiment(experiment_id_);
  detail::supervisor_signal.store(0);
  detail::supervisor_signal_count.store(0);
  const detail::SignalHandlers handlers(&detail::dettrial_on_supervisor_signal);
  continue_from_folder();
  while (true) {
    if (detail::supervisor_signal_count.load() != 0 || config_error_) return stop_early();
    launch_queued();
    if (running_count() == 0 && queue_.empty()) return finish();
    poll_metrics();
    reap(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

DETTRIAL_INLINE void Experiment::continue_from_folder() {
  if (events().cut_torn_line())
    say("dettrial: the last line of " + events().path().string() + " was torn (a runner killed while writing it); it is dropped");
  replay();
  start_mlflow();
  if (slurm_) adopt_slurm_jobs();
  // A trial the searcher stopped whose end the log lacks (the runner died before it): it is
  // stopped, not trained on.
  for (const std::int64_t id : std::vector<std::int64_t>(queue_))
    if (records_.at(id).stop_logged) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), id));
      trial_ended(id, detail::wait_status_exited(detail::exit_status_interrupted_value), /*stop_sent=*/true, /*interrupting=*/false);
    }
}

DETTRIAL_INLINE int Experiment::stop_early() {
  stop_running_trials();
  write_summary();
  refresh_report(/*at_end=*/true);
  if (config_error_) {
    std::fprintf(stderr,
                 "dettrial: the search stopped: trial %lld's configuration is wrong, and every trial would fail the same way:\n%s\n"
                 "dettrial: fix it and run the same command again to continue the experiment\n",
                 static_cast<long long>(config_error_->first), config_error_->second.c_str());
    end_mlflow(detail::MlflowEnd::failed);
    return detail::exit_status_config_value;
  }
  end_mlflow(detail::MlflowEnd::killed);
  say("dettrial: experiment interrupted; run the same command again to continue it");
  return detail::exit_status_interrupted_value;
}

DETTRIAL_INLINE int Experiment::finish() {
  // What each trial trained, before the experiment's retention deletes checkpoints (also of trials
  // that ended under an earlier runner, which this one knows only from their folders).
  std::vector<RunFolder> trial_folders;
  for (auto& [id, r] : records_) {
    refresh_from_disk(r.summary);
    trial_folders.push_back(trial_folder(id));
  }
  detail::apply_experiment_retention(config_, trial_folders);
  write_summary();
  refresh_report(/*at_end=*/true);
  const auto failed = std::ranges::count_if(records_, [](const auto& kv) { return kv.second.summary.state == TrialState::errored; });
  end_mlflow(failed == 0 ? detail::MlflowEnd::finished : detail::MlflowEnd::failed);
  if (failed == 0) return 0;
  std::fprintf(stderr, "dettrial: %lld of %zu trials failed (ERRORED in the summary above); each trial's log.txt says why\n",
               static_cast<long long>(failed), records_.size());
  return 1;
}

DETTRIAL_INLINE void Experiment::start_mlflow() {
  std::optional<MlflowSettings> settings =
      detail::tracked_settings(config_.mlflow, std::filesystem::absolute(options_.output_dir).filename().string());
  if (!settings) return;
  settings->parent_run_id.clear();  // a search is no one's child
  detail::MlflowRun::Start start;
  start.params = {{"searcher.name", std::string(to_string(config_.searcher.kind))},
                  {"searcher.metric", config_.searcher.metric},
                  {"searcher.max_trials", std::to_string(config_.searcher.max_trials)}};
  start.tags = {{"dettrial.version", DETTRIAL_VERSION_STRING},
                {"dettrial.experiment_folder", std::filesystem::absolute(options_.output_dir).string()}};
  mlflow_ = std::make_unique<detail::MlflowRun>(std::move(*settings), options_.output_dir, std::move(start));
  // Each trial's process is given it at launch: its run is created as this run's child.
  mlflow_run_id_ = mlflow_->run_id();
}

DETTRIAL_INLINE void Experiment::end_mlflow(detail::MlflowEnd status) {
  if (mlflow_) mlflow_->end(status);
  mlflow_.reset();
}

DETTRIAL_INLINE void Experiment::stop_running_trials() {
  int forwarded = 0;
  while (running_count() != 0) {
    const int signals = std::max(1, detail::supervisor_signal_count.load());
    if (signals > forwarded) {
      for (const std::int64_t id : running_ids()) terminate_trial(id, *records_.at(id).running);
      forwarded = signals;
    }
    reap(/*interrupting=*/true);  // waits; a signal interrupts the wait
  }
}

// ---- Slurm: jobs adopted from an earlier runner ---------------------------------------------------

DETTRIAL_INLINE void Experiment::adopt_slurm_jobs() {
  const auto jobs = slurm_->jobs(options_.output_dir);
  if (!jobs)
    throw Error(
        "--launcher slurm: 'scontrol show job' failed, so this runner cannot tell which of the experiment's trials still run as Slurm "
        "jobs; is the cluster up (sinfo)?");
  std::vector<std::int64_t> ended;
  for (const auto& [id, job] : detail::SlurmCluster::newest_job_per_trial(*jobs))
    if (adopt_slurm_job(id, job)) ended.push_back(id);
  // The validations the searcher has not heard of yet (those after the earlier runner stopped
  // reading), in the order of the trials; then the ended jobs end as they did (a failure restarts
  // the trial from its checkpoint).
  poll_metrics();
  for (const std::int64_t id : ended) {
    const std::int64_t job = records_.at(id).running->slurm_job;
    const bool stop_sent = records_.at(id).running->stop_sent;
    records_.at(id).running.reset();
    trial_ended(id, jobs->at(job).status, stop_sent, /*interrupting=*/false, job);
  }
}

DETTRIAL_INLINE bool Experiment::adopt_slurm_job(std::int64_t id, const detail::SlurmJob& job) {
  const auto queued = std::find(queue_.begin(), queue_.end(), id);
  if (queued == queue_.end()) return false;  // ended in the event log: its job is history
  // A job whose end the log records (a restart logged, the runner killed before the next job
  // started): the trial is queued again, as the log says.
  TrialRecord& record = records_.at(id);
  if (record.handled_job == job.id) return false;
  queue_.erase(queued);
  Running run;
  run.slurm_job = job.id;
  run.stop_sent = record.stop_logged;
  record.running = std::move(run);
  record.summary.state = TrialState::running;
  const std::string trial = "[experiment] trial " + std::to_string(id);
  if (detail::slurm_job_ended(job.state)) {
    say(trial + "'s Slurm job " + std::to_string(job.id) + " ended while no runner watched it (" + job.state + ")");
    return true;
  }
  say(trial + ": adopting its Slurm job " + std::to_string(job.id) + " (" + job.state + ") from an earlier runner");
  return false;
}

DETTRIAL_INLINE void Experiment::reap_adopted(bool interrupting) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_slurm_poll_) return;
  next_slurm_poll_ = now + std::chrono::seconds(1);
  const auto jobs = slurm_->jobs(options_.output_dir);
  // The controller does not answer: ask again in a second, unless a second Ctrl-C asks this runner
  // to leave (the jobs run on; the next runner adopts them).
  const bool leave = !jobs && interrupting && detail::supervisor_signal_count.load() >= 2;
  if (!jobs && !leave) return;
  std::vector<std::int64_t> ended;
  for (const std::int64_t id : running_ids())
    if (const Running& run = *records_.at(id).running;
        run.pid < 0 && (leave || !jobs->count(run.slurm_job) || detail::slurm_job_ended(jobs->at(run.slurm_job).state)))
      ended.push_back(id);
  for (const std::int64_t id : ended) {
    const std::int64_t job = records_.at(id).running->slurm_job;
    const bool stop_sent = records_.at(id).running->stop_sent;
    poll_metrics();  // its last records
    records_.at(id).running.reset();
    const std::string trial = "[experiment] trial " + std::to_string(id), name = "Slurm job " + std::to_string(job);
    if (leave) {
      records_.at(id).summary.state = TrialState::interrupted;
      say(trial + ": left its " + name + " running (Slurm does not answer)");
    } else if (!jobs->count(job)) {
      // The controller forgot the job (restarted without its state): how it ended is unknown, so
      // the trial resumes from its latest checkpoint (a completed one ends at once), not counted
      // as a restart.
      say(trial + "'s " + name + " is no longer known to Slurm; it resumes from its latest checkpoint");
      queue_.push_back(id);
    } else {
      trial_ended(id, jobs->at(job).status, stop_sent, interrupting, job);
    }
  }
}

DETTRIAL_INLINE void Experiment::terminate_trial(std::int64_t id, const Running& run) const {
  if (slurm_) slurm_->stop(id);
  else if (run.pid > 0) ::kill(run.pid, SIGTERM);
}

DETTRIAL_INLINE void Experiment::say(const std::string& line) const {
  if (!options_.quiet) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

DETTRIAL_INLINE std::int64_t Experiment::experiment_id_in(const std::filesystem::path& dir) {
  const std::filesystem::path file = ExperimentFolder{dir}.experiment_id();
  if (std::filesystem::exists(file)) {
    std::ifstream in(file);
    const detail::Json j = detail::Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_number_integer())
      throw Error("'" + file.string() + "' is damaged (it should hold {\"id\": <the experiment's id>}); restore or delete it");
    return j["id"].get<std::int64_t>();
  }
  std::random_device device;
  const std::int64_t id = 1 + static_cast<std::int64_t>((static_cast<std::uint64_t>(device()) << 32 | device()) % 2147483646ULL);
  std::ofstream(file) << detail::json_line(detail::Json{{"id", id}});
  return id;
}

// ---- the event log --------------------------------------------------------------------------------

DETTRIAL_INLINE void Experiment::replay() {
  if (replayed_) return;
  replayed_ = true;
  for (auto& r : std::visit([](auto& s) { return s.initial(); }, searcher_)) add_trial(std::move(r));
  // The searcher is deterministic given its seed and the same events in the same order.
  const std::vector<detail::LoggedEvent> logged = events().read();
  for (const detail::LoggedEvent& e : logged) replay_event(e);
  if (!logged.empty())
    say("dettrial: continuing the experiment in " + options_.output_dir.string() + " (" + std::to_string(logged.size()) + " events)");
}

DETTRIAL_INLINE void Experiment::replay_event(const detail::LoggedEvent& logged) {
  const SearchEvent& e = logged.event;
  // Only the trials this searcher, from this seed, created: an event of another is from another
  // experiment's log (or another searcher's, or seed's), and the searcher would be told of a trial
  // it never made.
  const auto found = records_.find(e.trial);
  if (found == records_.end())
    throw Error("'" + events().path().string() + "' has an event of trial " + std::to_string(e.trial) +
                ", which this experiment's searcher did not create (the log of another experiment, searcher or seed?): " + logged.line);
  TrialRecord& record = found->second;
  if (const auto* v = std::get_if<SearchEvent::Validation>(&e.what)) {
    std::visit([&](auto& s) { s.on_validation(e.trial, v->metric, v->time); }, searcher_);
    record_metric(record.summary, v->metric);
    if (v->batches) record.validated_batches = std::max(record.validated_batches.value_or(0), *v->batches);
    if (v->rung) record.rung = std::max(record.rung.value_or(*v->rung), *v->rung);
    record.stop_logged = record.stop_logged || v->stopped;
  } else if (const auto* end = std::get_if<SearchEvent::End>(&e.what)) {
    // Told twice that a trial ended, a searcher would create its successors twice.
    if (std::find(queue_.begin(), queue_.end(), e.trial) == queue_.end())
      throw Error("'" + events().path().string() + "' ends trial " + std::to_string(e.trial) + " a second time: " + logged.line);
    record.summary.state = end->state;
    record.summary.restarts = end->restarts;
    queue_.erase(std::remove(queue_.begin(), queue_.end(), e.trial), queue_.end());
    for (auto& r : std::visit([&](auto& s) { return s.on_trial_end(e.trial); }, searcher_)) add_trial(std::move(r));
  } else {
    record.summary.restarts = std::get<SearchEvent::Restart>(e.what).restarts;
  }
  if (e.slurm_job) record.handled_job = *e.slurm_job;
}

DETTRIAL_INLINE void Experiment::add_trial(TrialRequest r) {
  const std::int64_t id = r.id;
  TrialRecord record;
  record.summary.id = id;
  record.summary.hparams = r.hparams;
  record.request = std::move(r);
  records_[id] = std::move(record);
  queue_.push_back(id);
}

DETTRIAL_INLINE void Experiment::record_metric(TrialSummary& t, double metric) {
  t.last_metric = metric;
  if (order().improves(metric, t.best_metric)) t.best_metric = metric;
}

// ---- trials as processes ----------------------------------------------------------------------------

DETTRIAL_INLINE void Experiment::launch_queued() {
  while (!queue_.empty()) {
    const std::int64_t id = queue_.front();
    queue_.erase(queue_.begin());
    launch(id);
  }
}

DETTRIAL_INLINE void Experiment::launch(std::int64_t id) {
  const TrialRequest& r = records_.at(id).request;
  std::filesystem::create_directories(trial_dir(id));
  std::ofstream(trial_folder(id).config()) << detail::trial_config(config_, r, trial_folder(id)) << "\n";
  detail::TrialCommand command = trial_command(id);
  Running run;
  run.checkpoints_at_start = list_checkpoints(trial_folder(id).checkpoints());
  // In a process group of its own: a Ctrl-C reaches the trial once, as this runner's SIGTERM.
  run.pid = detail::spawn_process(command.program, std::move(command.args),
                                  {.extra_env = std::move(command.extra_env),
                                   .drop_env_prefixes = std::move(command.drop_env_prefixes),
                                   .output = trial_folder(id).trial_log().string(),
                                   .append = true,
                                   .own_process_group = true});
  records_.at(id).running = std::move(run);
  records_.at(id).summary.state = TrialState::running;
  say("[experiment] trial " + std::to_string(id) + " started: " + detail::one_line(r.hparams));
}

DETTRIAL_INLINE detail::TrialCommand Experiment::trial_command(std::int64_t id) const {
  // Determined's own variables: context.get_trial_id() / get_experiment_id().
  detail::TrialCommand command{.program = options_.program.string(),
                               .args = detail::trial_arguments(options_.program, trial_folder(id)),
                               .extra_env = {"DET_TRIAL_ID=" + std::to_string(id), "DET_EXPERIMENT_ID=" + std::to_string(experiment_id_),
                                             std::string(detail::search_trial_variable) + "=1"}};
  if (!mlflow_run_id_.empty()) command.extra_env.push_back(std::string(MlflowSettings::parent_run_variable) + "=" + mlflow_run_id_);
  if (slurm_) return slurm_->job_command(id, config_.slots_per_trial, config_.slurm_args, std::move(command));
  // A local trial ends with this runner (its parent); a Slurm trial's parent is slurmstepd.
  command.extra_env.push_back(std::string(detail::supervisor_pid_variable) + "=" + std::to_string(::getpid()));
  return command;
}

DETTRIAL_INLINE void Experiment::reap(bool interrupting) {
  const auto running_with = [&](auto pid_test) {
    return std::ranges::any_of(records_, [&](const auto& kv) { return kv.second.running && pid_test(kv.second.running->pid); });
  };
  const bool children = running_with([](pid_t pid) { return pid > 0; });
  const bool adopted = running_with([](pid_t pid) { return pid < 0; });
  if (adopted) {
    reap_adopted(interrupting);
    if (interrupting) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!children) return;
  int status = 0;
  // Interrupting, it waits for a child (a signal interrupts the wait), unless adopted jobs need asking.
  const pid_t pid = ::waitpid(-1, &status, interrupting && !adopted ? 0 : WNOHANG);
  if (pid <= 0) return;
  auto it = std::ranges::find_if(records_, [&](const auto& kv) { return kv.second.running && kv.second.running->pid == pid; });
  if (it == records_.end()) return;
  const std::int64_t id = it->first;
  const bool stop_sent = it->second.running->stop_sent;
  const auto checkpoints_at_start = std::move(it->second.running->checkpoints_at_start);
  poll_metrics();  // its last records
  it->second.running.reset();
  // Which job srun ran, for the event log (its record is fresh: the job has just ended).
  std::int64_t slurm_job = 0;
  if (slurm_)
    if (const auto jobs = slurm_->jobs(options_.output_dir))
      if (const auto newest = detail::SlurmCluster::newest_job_per_trial(*jobs); newest.count(id) != 0) slurm_job = newest.at(id).id;
  trial_ended(id, status, stop_sent, interrupting, slurm_job, checkpoints_at_start);
}

DETTRIAL_INLINE void Experiment::trial_ended(std::int64_t id, int status, bool stop_sent, bool interrupting, std::int64_t slurm_job,
                                             const std::optional<std::vector<CheckpointInfo>>& checkpoints_at_start) {
  TrialSummary& t = records_.at(id).summary;
  refresh_from_disk(t);
  const auto end = detail::ProcessEnd::from_wait_status(status);
  // Stopped by a signal after a checkpoint; a SIGTERM that came after training ended kills it.
  // srun reports a task killed by signal n as exit status 128 + n.
  const bool stopped =
      end.interrupted() || (stop_sent && end.killed_by(SIGTERM)) || (stop_sent && slurm_ && end.exited_with(128 + SIGTERM));
  if (end.config_error()) {
    // Not restarted, and not ended in the event log: after the fix the next run trains it.
    t.state = TrialState::errored;
    if (!config_error_) config_error_.emplace(id, config_error_text(id));
    return;
  }
  if (interrupting && (stopped || !end.succeeded())) {
    t.state = TrialState::interrupted;
    return;  // continued by the next run
  }
  if (end.succeeded() || (stopped && stop_sent)) {
    // The searcher's decision names the state, not its race with the signal: a trial it stopped
    // short of its length is STOPPED_EARLY also when it finished before the signal arrived.
    t.state = stop_sent ? TrialState::stopped_by_searcher : TrialState::completed;
  } else if (restart_after_failure(id, status, slurm_job, checkpoints_at_start)) {
    return;
  }
  log_event({.trial = id,
             .what = SearchEvent::End{.state = t.state, .restarts = t.restarts},
             .slurm_job = slurm_job != 0 ? std::optional(slurm_job) : std::nullopt});
  say("[experiment] trial " + std::to_string(id) + " " + to_string(t.state) + " after " + std::to_string(t.batches_trained) + " batches");
  for (auto& r : std::visit([&](auto& s) { return s.on_trial_end(id); }, searcher_)) add_trial(std::move(r));
  say(progress());
  refresh_report(/*at_end=*/false);
}

DETTRIAL_INLINE bool Experiment::restart_after_failure(std::int64_t id, int status, std::int64_t slurm_job,
                                                       const std::optional<std::vector<CheckpointInfo>>& checkpoints_at_start) {
  TrialSummary& t = records_.at(id).summary;
  // The runner alone restarts a search's trial (its process runs with --max-restarts 0).
  std::optional<bool> progressed;
  if (checkpoints_at_start) progressed = wrote_new_checkpoint(*checkpoints_at_start, list_checkpoints(trial_folder(id).checkpoints()));
  RestartPolicy restarts(config_.max_restarts, t.restarts);
  if (const auto why_not = restarts.refuse_restart(RestartPolicy::Failure::other, progressed)) {
    t.state = TrialState::errored;
    std::fprintf(stderr, "[experiment] trial %lld failed (%s) after %lld restart(s) and is not restarted: %s; see %s\n",
                 static_cast<long long>(id), describe_failure(id, status).c_str(), static_cast<long long>(t.restarts), why_not->c_str(),
                 trial_folder(id).trial_log().c_str());
    return false;
  }
  t.restarts = restarts.used();
  log_event({.trial = id,
             .what = SearchEvent::Restart{.restarts = t.restarts},
             .slurm_job = slurm_job != 0 ? std::optional(slurm_job) : std::nullopt});
  say("[experiment] trial " + std::to_string(id) + " failed (" + describe_failure(id, status) + "); " + restarts.restart_text() +
      " from its latest checkpoint");
  queue_.push_back(id);
  return true;
}

DETTRIAL_INLINE std::string Experiment::config_error_text(std::int64_t id) const {
  return last_error_line(id) + "\n(trial " + std::to_string(id) + "'s config " + trial_folder(id).config().string() + " is " +
         config_.source + " with the trial's hyperparameters " + detail::one_line(records_.at(id).summary.hparams) + ")";
}

DETTRIAL_INLINE std::string Experiment::last_error_line(std::int64_t id) const {
  std::ifstream in(trial_folder(id).trial_log());
  std::string line, last;
  while (std::getline(in, line))
    if (line.rfind("error: ", 0) == 0) last = line;
  return last;
}

DETTRIAL_INLINE std::string Experiment::describe_failure(std::int64_t id, int status) const {
  const std::string error = last_error_line(id);
  return detail::ProcessEnd::from_wait_status(status).describe() + (error.empty() ? "" : ": " + error);
}

// ---- the searcher's decisions ----------------------------------------------------------------------

DETTRIAL_INLINE void Experiment::poll_metrics() {
  const std::string& metric = config_.searcher.metric;
  for (auto& [id, trial] : records_) {
    if (!trial.running) continue;
    for (const detail::TrialValidation& v :
         trial.running->validations.read_new(trial_folder(id).metrics_log(), metric, config_.searcher.time_metric)) {
      // Each validation reaches the searcher once, also when a restarted trial trains it again.
      if (trial.validated_batches && v.batches <= *trial.validated_batches) continue;
      trial.validated_batches = v.batches;
      // The searcher closed a trial it stopped: a validation the trial reaches before the stop
      // does (it trains on while the signal travels) would otherwise change ASHA's rungs for the
      // other trials, by how fast the signal was. A metric absent or null (NaN) is not told.
      if (trial.running->stop_sent || !v.metric) continue;
      tell_searcher(id, trial, v);
    }
  }
}

DETTRIAL_INLINE void Experiment::tell_searcher(std::int64_t id, TrialRecord& trial, const detail::TrialValidation& v) {
  const double metric = *v.metric, time = v.time;
  record_metric(trial.summary, metric);
  const SearcherDecision d = std::visit([&](auto& s) { return s.on_validation(id, metric, time); }, searcher_);
  // A trial at its full length ends by itself; a stop is for the ones with time left.
  const bool stop = d == SearcherDecision::stop && time < static_cast<double>(trial.request.max_length);
  SearchEvent::Validation event{.metric = metric, .time = time, .batches = v.batches, .rung = std::nullopt, .stopped = stop};
  // For the report: the ASHA rung this validation reached (the rungs its time has passed).
  std::string where;
  if (const searcher::AshaBracket* bracket = bracket_of(id)) {
    const auto passed =
        std::ranges::count_if(bracket->units_needed, [&](std::int64_t needed) { return time >= static_cast<double>(needed); });
    if (passed > 0) {
      event.rung = static_cast<std::int64_t>(passed) - 1;
      trial.rung = std::max(trial.rung.value_or(*event.rung), *event.rung);
      where = "; rung " + std::to_string(passed) + " of " + std::to_string(bracket->units_needed.size());
    }
  }
  log_event({.trial = id, .what = event, .slurm_job = std::nullopt});
  char values[96];
  std::snprintf(values, sizeof values, "%.6g (best %.6g", metric, trial.summary.best_metric.value_or(metric));
  const std::string at = " at " + config_.searcher.time_metric + " " + std::to_string(static_cast<std::int64_t>(time));
  say("[experiment] trial " + std::to_string(id) + at + ": " + config_.searcher.metric + " " + values + where + ")");
  if (stop) {
    terminate_trial(id, *trial.running);  // the trial checkpoints and exits
    trial.running->stop_sent = true;
    say("[experiment] trial " + std::to_string(id) + " stopped by the searcher" + at);
  }
}

// ---- the summary -----------------------------------------------------------------------------------

DETTRIAL_INLINE void Experiment::refresh_from_disk(TrialSummary& t) const {
  const auto checkpoints = list_checkpoints(trial_folder(t.id).checkpoints());
  t.best_checkpoint.clear();
  std::optional<double> best;
  for (const auto& c : checkpoints) {
    t.batches_trained = std::max(t.batches_trained, c.batches_trained);
    if (c.validation_metric && order().improves(*c.validation_metric, best)) {
      best = c.validation_metric;
      t.best_checkpoint = c.path.string();
    }
  }
  if (t.best_checkpoint.empty() && !checkpoints.empty()) t.best_checkpoint = checkpoints.back().path.string();
}

DETTRIAL_INLINE std::optional<std::int64_t> Experiment::best_trial() const {
  std::optional<std::int64_t> best;
  for (const auto& [id, record] : records_)
    if (const auto& m = record.summary.best_metric; m && (!best || order().better(*m, *records_.at(*best).summary.best_metric))) best = id;
  return best;
}

DETTRIAL_INLINE detail::Json Experiment::summary_json() const {
  const auto optional = [](const std::optional<double>& v) { return v ? detail::Json(*v) : detail::Json(nullptr); };
  detail::Json summary = {{"experiment", config_.name.empty() ? config_.description : config_.name},
                          {"searcher", std::string(config_.searcher.name())},
                          {"metric", config_.searcher.metric},
                          {"smaller_is_better", config_.searcher.smaller_is_better},
                          {"time_metric", config_.searcher.time_metric},
                          {"max_trials", std::visit([](const auto& s) { return s.max_trials(); }, searcher_)}};
  // ASHA's rungs: the time each needs, per bracket (report.html draws them).
  if (const auto* asha = std::get_if<searcher::AdaptiveAsha>(&searcher_)) {
    detail::Json brackets = detail::Json::array();
    for (const auto& b : asha->brackets()) brackets.push_back({{"rungs", b.units_needed}, {"max_trials", b.max_trials}});
    summary["brackets"] = std::move(brackets);
  }
  summary["trials"] = detail::Json::array();
  for (const auto& [id, record] : records_) {
    const TrialSummary& t = record.summary;
    detail::Json trial = {{"id", id},
                          {"state", to_string(t.state)},
                          {"batches_trained", t.batches_trained},
                          {"restarts", t.restarts},
                          {"hparams", detail::yaml_to_json(t.hparams)},
                          {"best_metric", optional(t.best_metric)},
                          {"last_metric", optional(t.last_metric)},
                          {"best_checkpoint", t.best_checkpoint}};
    if (bracket_of(id)) {
      trial["bracket"] = record.request.bracket;
      if (record.rung) trial["rung"] = *record.rung;
    }
    summary["trials"].push_back(std::move(trial));
  }
  const std::optional<std::int64_t> best = best_trial();
  summary["best_trial"] = best ? detail::Json(*best) : detail::Json(nullptr);
  return summary;
}

DETTRIAL_INLINE void Experiment::write_summary(bool print) {
  for (auto& [id, r] : records_) refresh_from_disk(r.summary);
  detail::write_file_synced(folder().summary(), detail::json_text(summary_json()));
  if (print) say(detail::summary_table(trials(), config_.searcher.metric, best_trial()) + " summary: " + folder().summary().string());
}

DETTRIAL_INLINE void Experiment::refresh_report(bool at_end) {
  try {
    // While trials run, from what this runner knows (summary.json is written at the end).
    const std::filesystem::path page =
        at_end ? write_experiment_report(options_.output_dir) : detail::html::write_experiment_page(options_.output_dir, summary_json());
    if (at_end) say(" report: " + page.string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dettrial: warning: the search's report.html was not updated: %s\n", detail::first_line(e.what()).c_str());
  }
}

DETTRIAL_INLINE std::string Experiment::progress() const {
  std::int64_t completed = 0, stopped = 0, failed = 0;
  for (const auto& [id, record] : records_) {
    const TrialSummary& t = record.summary;
    completed += t.state == TrialState::completed ? 1 : 0;
    stopped += t.state == TrialState::stopped_by_searcher ? 1 : 0;
    failed += t.state == TrialState::errored ? 1 : 0;
  }
  const std::int64_t total = std::visit([](const auto& s) { return s.max_trials(); }, searcher_);
  return "[experiment] " + std::to_string(completed + stopped + failed) + " of " + std::to_string(total) + " trials ended (" +
         std::to_string(completed) + " completed, " + std::to_string(stopped) + " stopped early, " + std::to_string(failed) + " failed), " +
         std::to_string(running_count()) + " running";
}

DETTRIAL_INLINE std::map<std::int64_t, TrialSummary> Experiment::trials() const {
  std::map<std::int64_t, TrialSummary> out;
  for (const auto& [id, record] : records_) out.emplace(id, record.summary);
  return out;
}

DETTRIAL_INLINE std::vector<std::int64_t> Experiment::running_ids() const {
  std::vector<std::int64_t> ids;
  for (const auto& [id, record] : records_)
    if (record.running) ids.push_back(id);
  return ids;
}

DETTRIAL_INLINE std::size_t Experiment::running_count() const {
  return static_cast<std::size_t>(std::ranges::count_if(records_, [](const auto& kv) { return kv.second.running.has_value(); }));
}

DETTRIAL_INLINE const searcher::AshaBracket* Experiment::bracket_of(std::int64_t id) const {
  const auto* asha = std::get_if<searcher::AdaptiveAsha>(&searcher_);
  const auto record = records_.find(id);
  if (!asha || record == records_.end()) return nullptr;
  const auto b = static_cast<std::size_t>(record->second.request.bracket);
  return b < asha->brackets().size() ? &asha->brackets()[b] : nullptr;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/search/experiment.hpp
// ---- begin dettrial/cli/command_line.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The first stage of a trial program: its command line, read into a `CommandLine` without
/// touching LibTorch, a config or the file system (so it is tested on its own).

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>


namespace dettrial {

/// A command line that cannot be run (exit status 2): an unknown flag, a missing or wrong value.
struct CommandLineError : std::runtime_error {
  /// Whether the program's usage text should follow the message (it does where the whole shape of
  /// the command is in doubt, not for one wrong value).
  bool show_usage = false;
  CommandLineError(const std::string& message, bool usage) : std::runtime_error(message), show_usage(usage) {}
};

/// What a trial program was asked to do, as its flags say it (see main_usage()).
struct CommandLine {
  std::string program = "trial";       ///< argv[0], for messages
  bool help = false;                   ///< --help: print the usage and exit 0
  std::string report_dir;              ///< --report DIR: write the page and exit; nothing else is read
  std::string sync_mlflow_dir;         ///< --sync-mlflow DIR: send what MLflow did not take, and exit
  std::string config_path;             ///< --config FILE
  std::vector<std::string> overrides;  ///< every --set KEY=VALUE, in order
  std::string output;                  ///< --output DIR
  std::string resume;                  ///< --resume PATH
  bool resume_fresh_parts = false;     ///< --resume-fresh-parts
  std::string backend_name;            ///< --backend: "gloo", "nccl", or empty (chosen by the devices)
  bool slurm_launcher = false;         ///< --launcher slurm (a search's trials as Slurm jobs), not local
  int nproc = 0;                       ///< --nproc N, or MAX of --nproc MIN:MAX (0: not given)
  int nproc_min = 0;                   ///< MIN of --nproc MIN:MAX (0: a fixed count)
  std::optional<long> max_restarts;    ///< --max-restarts K (unset: the config's max_restarts)
  std::optional<int> threads;          ///< --threads N
  long timeout_seconds = 300;          ///< --timeout SECONDS
  bool test_mode = false;              ///< --test-mode
  bool quiet = false;                  ///< --quiet
  bool no_cpu_bind = false;            ///< --no-cpu-bind
  /// The command line the built-in launcher gives each rank: this one without `--nproc N`.
  std::vector<std::string> rank_args;
};

/// The usage text, a printf format whose one `%s` is the program's name.
DETTRIAL_INLINE const char* main_usage();

/// Reads a trial program's flags. Throws CommandLineError for an unknown flag, a flag without its
/// value, a value out of its range, or neither --config nor --resume (nor --report, nor --help).
DETTRIAL_INLINE CommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

/// A flag's value as an integer of at least `least` (a positive one by default), or the sentence
/// that says it is not one.
DETTRIAL_INLINE long positive_flag_value(std::string_view flag, const std::string& value, long least = 1) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || n < least)
    throw CommandLineError(std::string(flag) + " needs a " + (least == 1 ? "positive" : "non-negative") + " integer, not '" + value + "'",
                           false);
  return n;
}

/// --nproc's value: `N` as (0, N), `MIN:MAX` as (MIN, MAX).
DETTRIAL_INLINE std::pair<int, int> rank_range(const std::string& value) {
  const auto colon = value.find(':');
  if (colon == std::string::npos) return {0, static_cast<int>(positive_flag_value("--nproc", value))};
  const auto low = static_cast<int>(positive_flag_value("--nproc", value.substr(0, colon)));
  const auto high = static_cast<int>(positive_flag_value("--nproc", value.substr(colon + 1)));
  if (low > high) throw CommandLineError("--nproc MIN:MAX needs MIN <= MAX, not '" + value + "'", false);
  return {low, high};
}

/// `value` if it is one of `allowed` (for messages: "gloo or nccl"), else the sentence that says not.
DETTRIAL_INLINE const std::string& one_of(std::string_view flag, const std::string& value, std::initializer_list<std::string_view> allowed,
                                          std::string_view said) {
  for (const auto a : allowed)
    if (value == a) return value;
  throw CommandLineError(std::string(flag) + " must be " + std::string(said) + ", not '" + value + "'", false);
}

}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine line;
  if (argc > 0 && argv[0]) line.program = argv[0];
  line.rank_args.push_back(line.program);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const int at = i;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw CommandLineError(std::string(arg) + " needs a value", false);
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") line.help = true;
    else if (arg == "--config") line.config_path = value();
    else if (arg == "--set") line.overrides.push_back(value());
    else if (arg == "--output") line.output = value();
    else if (arg == "--resume") line.resume = value();
    else if (arg == "--resume-fresh-parts") line.resume_fresh_parts = true;
    else if (arg == "--report") line.report_dir = value();
    else if (arg == "--sync-mlflow") line.sync_mlflow_dir = value();
    else if (arg == "--nproc") std::tie(line.nproc_min, line.nproc) = detail::rank_range(value());
    else if (arg == "--max-restarts") line.max_restarts = detail::positive_flag_value(arg, value(), /*least=*/0);
    else if (arg == "--threads") line.threads = static_cast<int>(detail::positive_flag_value(arg, value()));
    else if (arg == "--timeout") line.timeout_seconds = detail::positive_flag_value(arg, value());
    else if (arg == "--backend") line.backend_name = detail::one_of(arg, value(), {"gloo", "nccl"}, "gloo or nccl");
    else if (arg == "--launcher") line.slurm_launcher = detail::one_of(arg, value(), {"local", "slurm"}, "local or slurm") == "slurm";
    else if (arg == "--test-mode") line.test_mode = true;
    else if (arg == "--quiet") line.quiet = true;
    else if (arg == "--no-cpu-bind") line.no_cpu_bind = true;
    else throw CommandLineError("unknown argument '" + std::string(arg) + "'", true);
    // Every rank gets the same command line but for --nproc, which only the launcher acts on.
    if (arg != "--nproc")
      for (int j = at; j <= i; ++j) line.rank_args.emplace_back(argv[j]);
  }
  if (!line.help && line.report_dir.empty() && line.sync_mlflow_dir.empty() && line.config_path.empty() && line.resume.empty())
    throw CommandLineError("--config FILE is required (or --resume DIR, which reads the run's own config)", true);
  return line;
}

DETTRIAL_INLINE const char* main_usage() {
  return "usage: %s --config FILE [options]\n"
         "\n"
         "Trains the trial described by an experiment config in Determined's YAML schema.\n"
         "\n"
         "options:\n"
         "  --config FILE        the experiment config (required, but for --resume DIR and --report DIR)\n"
         "  --set KEY=VALUE      override a config value; KEY is a dotted path such as\n"
         "                       hyperparameters.learning_rate or data.dir (repeatable)\n"
         "  --output DIR         where metrics.jsonl and checkpoints go (default: runs/<date>-<time>,\n"
         "                       or the resumed run's directory with --resume); for a search, the\n"
         "                       experiment's folder (default: runs/experiment-<name>); running the\n"
         "                       same search command again continues it\n"
         "  --resume PATH        continue from a checkpoint: a checkpoint directory, or a run's\n"
         "                       output directory (its latest checkpoint); also one Determined wrote\n"
         "  --resume-fresh-parts an optimizer or LR scheduler of the resumed checkpoint that the trial's\n"
         "                       cannot take starts fresh, with a warning (default: an error naming it)\n"
         "  --nproc N            train data-parallel in N local processes (Gloo on CPU, NCCL on GPUs);\n"
         "                       default: resources.slots_per_trial when no launcher (torchrun, srun,\n"
         "                       mpirun) started this process. MIN:MAX: start MAX; when a rank fails,\n"
         "                       restart without its slot, on as many ranks as remain (at least MIN)\n"
         "  --max-restarts K     restart a job whose rank failed from its latest checkpoint, up to K\n"
         "                       times (default: the config's max_restarts, 5)\n"
         "  --threads N          intra-op threads per process (default: OMP_NUM_THREADS when set;\n"
         "                       data parallel: this rank's share of the node's cores)\n"
         "  --no-cpu-bind        with --nproc: leave the ranks unbound (by default each rank is bound\n"
         "                       to its share of the CPUs, unless --threads or OMP_NUM_THREADS is set)\n"
         "  --backend NAME       gloo or nccl (default: nccl when each rank on the node has a GPU of its\n"
         "                       own and NCCL is built, else gloo)\n"
         "  --launcher NAME      where a search's trials run: local (child processes, the default) or\n"
         "                       slurm (each trial a Slurm job through srun, with slots_per_trial tasks\n"
         "                       and the config's slurm.sbatch_args; the experiment's folder must be on\n"
         "                       a file system every node sees)\n"
         "  --timeout SECONDS    how long ranks wait for each other before failing (default 300)\n"
         "  --test-mode          train one batch and validate one batch, to check the trial runs\n"
         "  --report DIR         write DIR/report.html, a page of charts that works offline, from a\n"
         "                       run's folder (its metrics.jsonl) or a search's (every trial), print\n"
         "                       its path and exit; nothing is trained\n"
         "  --sync-mlflow DIR    send the MLflow requests a run (or every trial of a search) kept in its\n"
         "                       folder while the server did not answer, and exit; nothing is trained\n"
         "  --quiet              print nothing but errors\n"
         "  --help               show this text\n"
         "\n"
         "SIGINT or SIGTERM finishes the batch, checkpoints and exits with status 75; a second one aborts.\n"
         "Exit status: 0 done, 1 failed, 2 bad command line, 75 stopped by a signal (continue with\n"
         "--resume), 78 wrong configuration (running it again fails the same way).\n";
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/cli/command_line.hpp
// ---- begin dettrial/cli/detail/launcher.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The built-in launcher (`--nproc N`): the ranks of a data-parallel job on this machine, each
/// bound to its own share of the CPUs, with signals forwarded and a failed rank named.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>


namespace dettrial::detail {

/// A free TCP port on the loopback interface (the kernel picks it).
DETTRIAL_INLINE int free_local_port();

/**
 * @brief The built-in launcher: runs this program `nproc` times with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (one machine), forwards SIGINT/SIGTERM to them,
 * and waits. With `bind_cpus` and at least one CPU per rank, each rank is bound to its own share of
 * the CPUs this process may use (as mpirun binds ranks to cores: unbound, the ranks' threads
 * migrate between cores and the 2-rank MNIST job trained about 15% slower) and told which in
 * DETTRIAL_RANK_CPUS. When one rank fails, the others get `grace` to fail on their own (their
 * collectives time out) and are then killed. Returns 0 when all succeed, exit_status_interrupted
 * when all stopped on a signal, else 1 after naming the rank that failed first.
 */
DETTRIAL_INLINE int launch_local(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus = true);

/// How a job of the built-in launcher ended: launch_local's status, and the rank that failed first (-1: none).
struct LaunchOutcome {
  int status = 0;
  int first_failure = -1;
};

/// launch_local, with `extra_env` ("NAME=value") in every rank's environment, saying which rank failed first.
DETTRIAL_INLINE LaunchOutcome run_local_ranks(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus,
                                              const std::vector<std::string>& extra_env);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace dettrial::detail {

DETTRIAL_INLINE int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok =
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("cannot find a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

DETTRIAL_INLINE int launch_local(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus) {
  return run_local_ranks(args, nproc, grace, bind_cpus, {}).status;
}

DETTRIAL_INLINE LaunchOutcome run_local_ranks(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus,
                                              const std::vector<std::string>& extra_env) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int port = free_local_port();
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  std::vector<int> statuses(static_cast<std::size_t>(nproc), -1);
  supervisor_signal.store(0);
  supervisor_signal_count.store(0);
  const SignalHandlers handlers(&dettrial_on_supervisor_signal);
  const std::vector<int> all_cpus = allowed_cpus();
  for (int rank = 0; rank < nproc; ++rank) {
    // Each rank in a process group of its own: a Ctrl-C reaches it once, forwarded from here.
    SpawnOptions options{.extra_env = {"MASTER_ADDR=127.0.0.1", std::string(supervisor_pid_variable) + "=" + std::to_string(::getpid())},
                         .own_process_group = true};
    options.extra_env.insert(options.extra_env.end(), extra_env.begin(), extra_env.end());
    for (const auto& [key, value] : {std::pair{"RANK", rank}, std::pair{"WORLD_SIZE", nproc}, std::pair{"LOCAL_RANK", rank},
                                     std::pair{"LOCAL_WORLD_SIZE", nproc}, std::pair{"MASTER_PORT", port}})
      options.extra_env.push_back(std::string(key) + "=" + std::to_string(value));
    // The child inherits the affinity of the thread that starts it: bind this thread, start, restore.
    const std::vector<int> cpus = bind_cpus ? share_of_cpus(all_cpus, nproc, rank) : std::vector<int>{};
    const bool bound = !cpus.empty() && set_thread_cpus(cpus);
    if (bound) options.extra_env.push_back(std::string(rank_cpus_variable) + "=" + cpu_list_text(cpus));
    try {
      pids[static_cast<std::size_t>(rank)] = spawn_process(self, args, options);
    } catch (...) {
      if (bound) set_thread_cpus(all_cpus);
      throw;
    }
    if (bound) set_thread_cpus(all_cpus);
  }
  int running = nproc, first_failure = -1, forwarded = 0;
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (const int signals = supervisor_signal_count.load(); signals > forwarded) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (statuses[r] < 0) ::kill(pids[r], supervisor_signal.load());
      forwarded = signals;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (pids[r] == pid) {
          statuses[r] = status;
          --running;
          const auto end = ProcessEnd::from_wait_status(status);
          if (!end.succeeded() && !end.interrupted() && first_failure < 0) {
            first_failure = static_cast<int>(r);
            kill_at = std::chrono::steady_clock::now() + grace;
          }
        }
      continue;
    }
    if (std::chrono::steady_clock::now() >= kill_at) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (statuses[r] < 0) ::kill(pids[r], SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failure >= 0) {
    const auto end = ProcessEnd::from_wait_status(statuses[static_cast<std::size_t>(first_failure)]);
    std::fprintf(stderr, "error: rank %d of %d %s\n", first_failure, nproc,
                 end.signal ? ("was killed by signal " + std::to_string(*end.signal)).c_str()
                            : ("exited with status " + std::to_string(end.exit_code.value_or(-1))).c_str());
    // A configuration error stays one: whoever started this job must not retry it.
    return {end.config_error() ? exit_status_config_value : 1, first_failure};
  }
  bool all_interrupted = true;
  for (const int status : statuses) all_interrupted = all_interrupted && ProcessEnd::from_wait_status(status).interrupted();
  return {all_interrupted ? exit_status_interrupted_value : 0, -1};
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/cli/detail/launcher.hpp
// ---- begin dettrial/cli/run_plan.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The second stage of a trial program: from its command line to a `RunPlan`, the config it
/// trains (its file, the overrides, one trial drawn from a search space) and what it continues.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <yaml-cpp/yaml.h>


namespace dettrial {

/// What a trial program will run, decided before anything is trained.
struct RunPlan {
  /// The config to run: the file (or the resumed run's own), with --set applied and, for one trial of
  /// a search space, the drawn point.
  ExperimentConfig config;
  /// The config's name in messages: --config's path, or the resumed run's load_data.json.
  std::string config_path;
  /// Where the config came from: --config's file, or (no --config with --resume) the config the
  /// resumed run was written under.
  enum class ConfigSource { file, resumed_run };
  ConfigSource config_source = ConfigSource::file;
  /// The checkpoint --resume continues from.
  std::optional<std::filesystem::path> resumed_checkpoint;
  /// A run folder given to --resume that holds no checkpoint yet: the run starts afresh there.
  std::filesystem::path afresh;
  /// --output, or the folder started afresh.
  std::filesystem::path output;

  /// A search (every searcher but `single`): its trials are processes of this program.
  bool search() const { return config.searcher.kind != SearcherKind::single; }
};

/// Reads the config (or the resumed run's), applies the overrides and, where one trial of a search
/// space is asked for (searcher `single` over a space, or --test-mode), draws it. Throws ConfigError
/// or CheckpointError naming the file.
DETTRIAL_INLINE RunPlan plan_run(const CommandLine& line);

}  // namespace dettrial

namespace dettrial::detail {

/// Applies `a.b.c=value` to a YAML document; the value is parsed as YAML (numbers stay numbers).
DETTRIAL_INLINE void apply_override(YAML::Node& root, const std::string& assignment);

/// The experiment config a checkpoint was written under (its load_data.json: the run's config with
/// the overrides it was given), for `--resume` without `--config`.
DETTRIAL_INLINE ExperimentConfig resumed_run_config(const std::filesystem::path& checkpoint);

/// One trial's config from a config whose hyperparameters are a search space: one point drawn from
/// the space (seeded by reproducibility.experiment_seed when set) as constant values, under searcher
/// `single`. Determined does this for `single` over a space, and for `det experiment create --test`.
DETTRIAL_INLINE ExperimentConfig one_trial_drawn(const ExperimentConfig& config);

/// The checkpoint `--resume PATH` continues from, or nullopt when PATH is a dettrial run's folder (it
/// has a metrics.jsonl) that holds no checkpoint yet, nor does the config's checkpoint storage (the
/// run stopped before its first): with a config given, that run starts afresh there.
DETTRIAL_INLINE std::optional<std::filesystem::path> checkpoint_to_resume(const std::filesystem::path& path,
                                                                          const std::string& config_path);

/// Every scalar of a YAML document by its dotted path ("searcher.max_length.batches"), sequences by index.
DETTRIAL_INLINE void flatten_yaml(const YAML::Node& node, const std::string& path, std::map<std::string, std::string>& out);

/// The fields where `given` differs from the resumed run's `stored` config, one "path: old -> new"
/// per line (numbers compared as numbers: 1e-3 is 0.001), or empty.
DETTRIAL_INLINE std::string config_differences(const YAML::Node& stored, const YAML::Node& given);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

/// The config file, or the resumed run's own config when none is given, with --set applied.
DETTRIAL_INLINE ExperimentConfig config_of(const CommandLine& line, const RunPlan& plan) {
  ExperimentConfig config =
      line.config_path.empty() ? resumed_run_config(*plan.resumed_checkpoint) : ExperimentConfig::load_file(line.config_path);
  if (line.overrides.empty()) return config;
  YAML::Node doc = YAML::Clone(config.yaml);
  for (const auto& o : line.overrides) apply_override(doc, o);
  return ExperimentConfig::from_yaml(doc, config.source + " (with --set)");
}

/// One trial from a search config, as Determined runs `single` over a space and `--test`: one point
/// drawn from the space (`draws`: it is one, not constants), trained here (its drawn values are in the
/// run's load_data.json). A resumed trial keeps the hyperparameters it was drawn with.
DETTRIAL_INLINE void draw_one_trial(const CommandLine& line, bool draws, RunPlan& plan) {
  ExperimentConfig& config = plan.config;
  const LaunchEnvironment env = LaunchEnvironment::detect();
  const bool several_ranks = env.distributed() || line.nproc > 1 || config.slots_per_trial > 1;
  if (draws && several_ranks && !config.experiment_seed && !plan.resumed_checkpoint)
    throw ConfigError(plan.config_path +
                      ": a data-parallel trial drawn from a search space needs reproducibility.experiment_seed, "
                      "so that every rank draws the same hyperparameters");
  config = one_trial_drawn(config);
  if (draws && plan.resumed_checkpoint && std::filesystem::exists(CheckpointFolder{*plan.resumed_checkpoint}.load_data())) {
    YAML::Node doc = YAML::Clone(config.yaml);
    doc["hyperparameters"] = YAML::Clone(resumed_run_config(*plan.resumed_checkpoint).yaml["hyperparameters"]);
    config = ExperimentConfig::from_yaml(doc, config.source);
  }
  if (!line.quiet && env.rank == 0) {
    YAML::Emitter values;
    values << YAML::Flow << config.hyperparameters;
    std::fprintf(stderr, "dettrial: %s: one trial%s%s\n",
                 line.test_mode ? "--test-mode of a search" : "searcher 'single' over a search space",
                 draws ? ", with hyperparameters drawn from the space: " : "", draws ? values.c_str() : "");
  }
}

}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE RunPlan plan_run(const CommandLine& line) {
  RunPlan plan;
  plan.output = line.output;
  if (!line.resume.empty()) {
    plan.resumed_checkpoint = detail::checkpoint_to_resume(line.resume, line.config_path);
    if (!plan.resumed_checkpoint) {
      plan.afresh = line.resume;
      if (plan.output.empty()) plan.output = line.resume;
    }
  }
  plan.config_source = line.config_path.empty() ? RunPlan::ConfigSource::resumed_run : RunPlan::ConfigSource::file;
  plan.config = detail::config_of(line, plan);
  plan.config_path = line.config_path.empty() ? plan.config.source : line.config_path;
  if (!plan.config.ignored_fields.empty() && !line.quiet) {
    std::string fields;
    for (const auto& f : plan.config.ignored_fields) fields += (fields.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "dettrial: warning: ignoring fields that mean something only on a Determined cluster: %s\n", fields.c_str());
  }
  const bool one_point = HyperparameterSpace(plan.config.hyperparameters, plan.config.source).is_constant();
  const bool single = plan.config.searcher.kind == SearcherKind::single;
  if ((single || line.test_mode) && (!one_point || !single)) detail::draw_one_trial(line, !one_point, plan);
  return plan;
}

}  // namespace dettrial

namespace dettrial::detail {

DETTRIAL_INLINE ExperimentConfig one_trial_drawn(const ExperimentConfig& config) {
  const HyperparameterSpace space(config.hyperparameters, config.source);
  std::mt19937_64 rng(config.experiment_seed ? *config.experiment_seed : std::random_device{}());
  YAML::Node doc = YAML::Clone(config.yaml);
  doc["hyperparameters"] = space.sample(rng);
  doc["searcher"]["name"] = std::string(to_string(SearcherKind::single));
  return ExperimentConfig::from_yaml(doc, config.source);
}

DETTRIAL_INLINE std::optional<std::filesystem::path> checkpoint_to_resume(const std::filesystem::path& path,
                                                                          const std::string& config_path) {
  std::error_code ec;
  const bool run_folder = std::filesystem::is_directory(path, ec) && std::filesystem::exists(RunFolder{path}.metrics_log(), ec) &&
                          !std::filesystem::exists(CheckpointFolder{path}.metadata(), ec);
  if (!run_folder || !list_checkpoints(path).empty() || !list_checkpoints(RunFolder{path}.checkpoints()).empty())
    return resolve_checkpoint(path);  // a checkpoint, a folder holding some, or resolve_checkpoint's error
  if (!config_path.empty()) {
    // The config may keep checkpoints elsewhere (checkpoint_storage.host_path): the run's are there.
    if (const auto storage = ExperimentConfig::load_file(config_path).checkpoint_storage.path;
        storage && !list_checkpoints(*storage).empty())
      return resolve_checkpoint(*storage);
    return std::nullopt;
  }
  throw CheckpointError("'" + path.string() +
                        "' holds no checkpoint yet (the run stopped before its first), so it has no "
                        "config of its own to resume with; give --config FILE to start it afresh there");
}

DETTRIAL_INLINE void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw ConfigError("--set needs KEY=VALUE with a dotted KEY, got '" + assignment + "'");
  const std::string key = assignment.substr(0, eq);
  const YAML::Node value = detail::load_yaml_or_throw<ConfigError>(assignment.substr(eq + 1), "--set " + key + "'s value");
  YAML::Node node(root);
  std::size_t start = 0;
  for (;;) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError("--set: '" + key + "' has an empty path component");
    if (!node.IsMap() && !node.IsNull() && node.IsDefined())
      throw ConfigError("--set " + key + ": '" + key.substr(0, start ? start - 1 : 0) + "' is not a map");
    if (dot == std::string::npos) {
      node[part] = value;
      return;
    }
    // A missing section is made a map in its parent first: yaml-cpp's node for a missing key is not
    // attached to the parent, so keys set in it would be lost (--set profiling.enabled=true).
    if (!node[part] || node[part].IsNull()) node[part] = YAML::Node(YAML::NodeType::Map);
    YAML::Node next = node[part];
    node.reset(next);
    start = dot + 1;
  }
}

DETTRIAL_INLINE ExperimentConfig resumed_run_config(const std::filesystem::path& checkpoint) {
  LoadData load_data;
  try {
    load_data = LoadData::read(CheckpointFolder{checkpoint});
  } catch (const CheckpointError& e) {
    throw ConfigError(std::string("cannot take the resumed run's config from its checkpoint: ") + e.what() + "; give it with --config");
  }
  return ExperimentConfig::from_yaml(load_data.experiment_config,
                                     CheckpointFolder{checkpoint}.load_data().string() + " (the resumed run's config)");
}

DETTRIAL_INLINE void flatten_yaml(const YAML::Node& node, const std::string& path, std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node)
      flatten_yaml(kv.second, path.empty() ? kv.first.as<std::string>() : path + "." + kv.first.as<std::string>(), out);
  } else if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) flatten_yaml(node[i], path + "[" + std::to_string(i) + "]", out);
  } else if (node.IsScalar()) {
    out[path] = node.Scalar();
  } else {
    out[path] = "null";
  }
}

DETTRIAL_INLINE std::string config_differences(const YAML::Node& stored, const YAML::Node& given) {
  std::map<std::string, std::string> a, b;
  flatten_yaml(stored, "", a);
  flatten_yaml(given, "", b);
  auto same = [](const std::string& x, const std::string& y) {
    if (x == y) return true;
    char* end_x = nullptr;
    char* end_y = nullptr;
    const double dx = std::strtod(x.c_str(), &end_x), dy = std::strtod(y.c_str(), &end_y);
    return !x.empty() && !y.empty() && *end_x == '\0' && *end_y == '\0' && dx == dy;
  };
  std::string out;
  for (const auto& [path, value] : a)
    if (const auto it = b.find(path); it == b.end()) out += "  " + path + ": " + value + " -> (not set)\n";
    else if (!same(value, it->second)) out += "  " + path + ": " + value + " -> " + it->second + "\n";
  for (const auto& [path, value] : b)
    if (!a.count(path)) out += "  " + path + ": (not set) -> " + value + "\n";
  return out;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/cli/run_plan.hpp

namespace dettrial {

/// The exit status of a trial program stopped by SIGINT or SIGTERM after checkpointing (EX_TEMPFAIL:
/// try again, for example with `--resume`).
inline constexpr int exit_status_interrupted = detail::exit_status_interrupted_value;
/// The exit status of a trial program whose configuration is wrong (ConfigError, HyperparameterError):
/// running it again would fail the same way (EX_CONFIG).
inline constexpr int exit_status_config_error = detail::exit_status_config_value;

}  // namespace dettrial

namespace dettrial::detail {

/// --report DIR: writes the page, prints its path; nothing is trained and no config is read.
DETTRIAL_INLINE int write_report_only(const CommandLine& line);
/// --sync-mlflow DIR: sends what a run's (or a search's) folder kept for MLflow; nothing is trained.
DETTRIAL_INLINE int sync_mlflow_only(const CommandLine& line);

/// A search: every trial is a process of this program (a single-trial config of its own).
DETTRIAL_INLINE int run_search(const CommandLine& line, const RunPlan& plan);

/// How many local ranks the built-in launcher starts (--nproc, or slots_per_trial when no launcher
/// started this process), or 0 when this process trains.
DETTRIAL_INLINE int ranks_to_launch(const CommandLine& line, const RunPlan& plan, const LaunchEnvironment& env);

/**
 * @brief Starts `nproc` ranks of this program and supervises them; all agree on the output
 * directory. When a rank fails after the job wrote a new checkpoint, restarts the job from it, up to
 * --max-restarts (or max_restarts) times: on `nproc` ranks, or with --nproc MIN:MAX on the slots
 * that did not fail (as many of them as the global batch divides among, at least MIN).
 */
DETTRIAL_INLINE int launch_ranks(const CommandLine& line, const RunPlan& plan, int nproc, const std::filesystem::path& default_output);

/// The restarts allowed: --max-restarts, else the config's max_restarts (never negative).
DETTRIAL_INLINE std::int64_t restarts_allowed(const CommandLine& line, const RunPlan& plan);

/// Whether a failed attempt wrote a checkpoint: the newest of `after` is not the newest of `before`.
/// An attempt that wrote none would fail where it began, so it is not restarted.

/// Where a run's checkpoints go: the config's checkpoint storage, else the run folder's.
DETTRIAL_INLINE std::filesystem::path checkpoint_storage(const FitOptions& options);

/// A restarted job's command line: `args` resuming from `checkpoint` (an earlier --resume replaced).
DETTRIAL_INLINE std::vector<std::string> resuming_from(std::vector<std::string> args, const std::filesystem::path& checkpoint);

/// The slots a job restarts on after slot `lost` failed (--nproc MIN:MAX): the others, as many of
/// them as the global batch (0: none given) divides among; empty when that is fewer than `least`.
DETTRIAL_INLINE std::vector<int> slots_after_losing(std::vector<int> slots, int lost, int least, std::int64_t global_batch);

/// CUDA_VISIBLE_DEVICES for the ranks on `slots`: those of the caller's own list (or the slot numbers).
DETTRIAL_INLINE std::string visible_devices(const std::vector<int>& slots);

/// A launcher restarted this job (torchrun's agent, a requeued Slurm job): it continues from its run
/// folder's latest checkpoint, or, when the failed attempt wrote none, starts the folder afresh
/// (returns true: its records describe training about to be redone). One that may restart it needs
/// a run folder that outlives the attempt.
DETTRIAL_INLINE bool continue_restarted_job(const RunPlan& plan, const LaunchEnvironment& env, FitOptions& options);

/// The collectives of a data-parallel rank (null for one process): --backend's, or NCCL where every
/// rank of the job has a GPU of its own and NCCL is built, Gloo otherwise (it takes CUDA tensors
/// too): backend::gpu_or_gloo.
DETTRIAL_INLINE std::shared_ptr<Communicator> connect_ranks(const CommandLine& line, const LaunchEnvironment& env);

/// The fit's options: the config's, the command line's, and the folder a resumed run continues in.
DETTRIAL_INLINE FitOptions fit_options_for(const CommandLine& line, const RunPlan& plan, const std::filesystem::path& default_output);

/// --config with --resume: says what differs from the run's own config (that is what changes now).
DETTRIAL_INLINE void say_config_differences(const CommandLine& line, const RunPlan& plan, const LaunchEnvironment& env);

/// A run folder without a checkpoint, started again: its records describe training about to be redone.
DETTRIAL_INLINE void start_afresh(const std::filesystem::path& run, bool quiet);

/// RestartPolicy for a trial run on its own, called while `failure` is being handled: the checkpoint
/// to restart from, or the failure rethrown. Only an exception restarts here (a crash needs a
/// supervisor, such as the search runner); data-parallel ranks do not restart alone (their launcher
/// restarts the job).
DETTRIAL_INLINE std::filesystem::path checkpoint_to_restart_from(const std::exception& failure, const std::vector<CheckpointInfo>& before,
                                                                 const std::filesystem::path& storage, RestartPolicy& restarts, bool quiet);

/// Says so when a resumed run had nothing left to train.
DETTRIAL_INLINE void say_if_nothing_left(const FitResult& result, const RunPlan& plan, bool quiet, bool chief);

/// A wrong configuration (ConfigError, HyperparameterError): running it again fails the same way.
DETTRIAL_INLINE bool is_configuration_error(const std::exception& e);

/// The exit status of the std::exception being handled, after one line naming the problem: 2 for
/// the command line, exit_status_config_error for a wrong configuration, 1 for anything else (any
/// other exception is rethrown, as it always was).
DETTRIAL_INLINE int exit_status_of_failure(const char* program);

/// Trains this process's trial (one process, or one rank of several), restarting it from its
/// checkpoints up to max_restarts.
template <class TrialT, class... Args>
int train_trial(const CommandLine& line, const RunPlan& plan, const LaunchEnvironment& env, Args&... trial_args) {
  say_config_differences(line, plan, env);
  const std::shared_ptr<Communicator> communicator = connect_ranks(line, env);
  FitOptions options = fit_options_for(line, plan, Trainer<TrialT>::default_output_dir());
  // Locked before anything in the run folder changes (start_afresh rewrites its records); the
  // trainer shares this lock. A search's trial waits for one its runner's predecessor started,
  // which ends with a checkpoint; the runner holds the experiment's lock.
  const char* search_trial = std::getenv(detail::search_trial_variable);
  const auto patience = search_trial && *search_trial ? std::chrono::seconds(600) : std::chrono::seconds(0);
  const FolderLock lock = env.rank == 0 ? FolderLock::acquire(RunFolder{options.output_dir}.lock(), "run folder", patience) : FolderLock{};
  const bool restarted_afresh = continue_restarted_job(plan, env, options);
  if (env.rank == 0 && (restarted_afresh || (!plan.afresh.empty() && !options.latest_checkpoint)))
    start_afresh(options.output_dir, line.quiet);
  const std::filesystem::path storage = checkpoint_storage(options);
  RestartPolicy restarts(communicator || line.test_mode ? 0 : restarts_allowed(line, plan));
  for (;;) {
    options.restart = env.restart + restarts.used();
    const std::vector<CheckpointInfo> before = restarts.max_restarts() > 0 ? list_checkpoints(storage) : std::vector<CheckpointInfo>{};
    Context context(plan.config, ContextOptions{.communicator = communicator, .threads = line.threads});
    context.process_settings().apply();  // the one place the process is configured: threads, determinism, allocator, seed
    try {
      Trainer<TrialT> trainer(context, trial_args...);
      const FitResult result = trainer.fit(options);
      say_if_nothing_left(result, plan, line.quiet, context.distributed().is_chief());
      return result.signal != 0 ? exit_status_interrupted : 0;
    } catch (const std::exception& e) {
      options.latest_checkpoint = checkpoint_to_restart_from(e, before, storage, restarts, line.quiet);
    }
  }
}

}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief The `main` of a trial program: parses the command line, reads the experiment config, builds
 * the context and the trainer, and fits. Returns the process exit status: 0 on success, 1 when the
 * run fails (with one line naming the problem), 2 on a command-line error, exit_status_interrupted
 * (75) when a signal stopped it after a checkpoint, exit_status_config_error (78) when the
 * configuration is wrong (the message names the file and the field).
 * @code{.cpp}
 * int main(int argc, char** argv) { return dettrial::main<MnistTrial>(argc, argv); }
 * @endcode
 */
template <class TrialT, class... Args>
int main(int argc, char** argv, Args&&... trial_args) {
  if (const char* supervisor = std::getenv(detail::supervisor_pid_variable); supervisor && *supervisor)
    detail::stop_with_supervisor(static_cast<pid_t>(std::strtol(supervisor, nullptr, 10)));
  try {
    const CommandLine line = parse_command_line(argc, argv);
    if (line.help) {
      std::printf(main_usage(), line.program.c_str());
      return 0;
    }
    if (!line.report_dir.empty()) return detail::write_report_only(line);
    if (!line.sync_mlflow_dir.empty()) return detail::sync_mlflow_only(line);
    const RunPlan plan = plan_run(line);
    if (plan.search()) return detail::run_search(line, plan);
    if (line.slurm_launcher)
      throw ConfigError(
          "--launcher slurm runs a search's trials as Slurm jobs; this config trains one trial: start it under Slurm "
          "directly (srun --ntasks=N " +
          line.program + " --config ...)");
    const LaunchEnvironment env = LaunchEnvironment::detect();
    if (const int nproc = detail::ranks_to_launch(line, plan, env); nproc > 1)
      return detail::launch_ranks(line, plan, nproc, Trainer<TrialT>::default_output_dir());
    return detail::train_trial<TrialT>(line, plan, env, trial_args...);
  } catch (...) {
    return detail::exit_status_of_failure(argc > 0 && argv[0] ? argv[0] : "trial");
  }
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

DETTRIAL_INLINE int write_report_only(const CommandLine& line) {
  std::printf("%s\n", write_report(line.report_dir).string().c_str());
  return 0;
}

DETTRIAL_INLINE int sync_mlflow_only(const CommandLine& line) {
  for (const auto& [dir, sent] : sync_mlflow_folder(line.sync_mlflow_dir))
    if (!line.quiet) std::printf("dettrial: %s: %zu MLflow request(s) sent\n", dir.c_str(), sent);
  return 0;
}

DETTRIAL_INLINE int run_search(const CommandLine& line, const RunPlan& plan) {
  const ExperimentConfig& config = plan.config;
  const std::string stem = config.name.empty() ? std::filesystem::path(plan.config_path).stem().string() : config.name;
  ExperimentOptions experiment{.output_dir = plan.output.empty() ? std::filesystem::path("runs") / ("experiment-" + stem) : plan.output,
                               .quiet = line.quiet,
                               .launcher = line.slurm_launcher ? TrialLauncher::slurm : TrialLauncher::local};
  return Experiment(config, experiment).run();
}

DETTRIAL_INLINE int ranks_to_launch(const CommandLine& line, const RunPlan& plan, const LaunchEnvironment& env) {
  if (env.distributed()) return 0;
  if (line.nproc == 0 && plan.config.slots_per_trial > 1) return static_cast<int>(plan.config.slots_per_trial);
  return line.nproc > 1 ? line.nproc : 0;
}

DETTRIAL_INLINE int launch_ranks(const CommandLine& line, const RunPlan& plan, int nproc, const std::filesystem::path& default_output) {
  std::vector<std::string> args = line.rank_args;
  if (plan.output.empty() && !plan.resumed_checkpoint) {
    args.emplace_back("--output");
    args.push_back(default_output.string());
  }
  // The user's own thread count (--threads, OMP_NUM_THREADS) leaves the ranks unbound: they may
  // want more threads than a rank's share of the cores.
  const bool bind_cpus = !line.no_cpu_bind && !line.threads && !omp_num_threads([](const char* n) { return std::getenv(n); });
  const std::chrono::seconds grace(line.timeout_seconds + 10);
  RestartPolicy restarts(line.test_mode ? 0 : restarts_allowed(line, plan));
  if (restarts.max_restarts() == 0) return launch_local(args, nproc, grace, bind_cpus);
  const std::filesystem::path storage = checkpoint_storage(fit_options_for(line, plan, default_output));
  const Hyperparameters hparams = plan.config.trial_hyperparameters();
  const std::int64_t global_batch = hparams.global_batch_size().value_or(0);
  std::vector<int> slots(static_cast<std::size_t>(nproc));
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<CheckpointInfo> before = list_checkpoints(storage);
  for (;;) {
    std::vector<std::string> env = {"DETTRIAL_RESTART=" + std::to_string(restarts.used())};
    if (static_cast<int>(slots.size()) < nproc) env.push_back("CUDA_VISIBLE_DEVICES=" + visible_devices(slots));
    const LaunchOutcome outcome = run_local_ranks(args, static_cast<int>(slots.size()), grace, bind_cpus, env);
    if (outcome.status == 0 || outcome.status == exit_status_interrupted_value || outcome.status == exit_status_config_value)
      return outcome.status;
    const auto say = [&](const std::string& text) {
      if (!line.quiet) std::fprintf(stderr, "dettrial: %s\n", text.c_str());
    };
    const std::vector<CheckpointInfo> after = list_checkpoints(storage);
    // The ranks' configuration errors end the job above (exit status 78).
    if (const auto why_not = restarts.refuse_restart(RestartPolicy::Failure::other, wrote_new_checkpoint(before, after))) {
      say("the job failed and is not restarted: " + *why_not);
      return outcome.status;
    }
    if (line.nproc_min > 0 && outcome.first_failure >= 0) {
      const std::size_t had = slots.size();
      slots = slots_after_losing(slots, slots[static_cast<std::size_t>(outcome.first_failure)], line.nproc_min, global_batch);
      if (slots.empty()) {
        say("the job lost a rank and cannot restart on at least " + std::to_string(line.nproc_min) + " ranks (--nproc " +
            std::to_string(line.nproc_min) + ":" + std::to_string(nproc) + ") among which global_batch_size " +
            std::to_string(global_batch) + " divides");
        return outcome.status;
      }
      if (slots.size() != had) say("slot " + std::to_string(outcome.first_failure) + " is left out from now on");
    }
    say("restarting the job from its checkpoint at batch " + std::to_string(after.back().batches_trained) + " on " +
        std::to_string(slots.size()) + " rank(s): " + restarts.restart_text());
    args = resuming_from(std::move(args), after.back().path);
    before = after;
  }
}

DETTRIAL_INLINE std::int64_t restarts_allowed(const CommandLine& line, const RunPlan& plan) {
  return line.max_restarts.value_or(std::max<std::int64_t>(plan.config.max_restarts, 0));
}

DETTRIAL_INLINE std::filesystem::path checkpoint_storage(const FitOptions& options) {
  return options.checkpoint_dir.empty() ? RunFolder{options.output_dir}.checkpoints() : options.checkpoint_dir;
}

DETTRIAL_INLINE std::vector<std::string> resuming_from(std::vector<std::string> args, const std::filesystem::path& checkpoint) {
  for (auto it = args.begin(); it != args.end();)
    it = *it == "--resume" && std::next(it) != args.end() ? args.erase(it, std::next(it, 2)) : std::next(it);
  args.emplace_back("--resume");
  args.push_back(checkpoint.string());
  return args;
}

DETTRIAL_INLINE std::vector<int> slots_after_losing(std::vector<int> slots, int lost, int least, std::int64_t global_batch) {
  std::erase(slots, lost);
  while (!slots.empty() && global_batch > 0 && global_batch % static_cast<std::int64_t>(slots.size()) != 0) slots.pop_back();
  if (static_cast<int>(slots.size()) < least) slots.clear();
  return slots;
}

DETTRIAL_INLINE std::string visible_devices(const std::vector<int>& slots) {
  std::vector<std::string> devices;
  if (const char* given = std::getenv("CUDA_VISIBLE_DEVICES"); given && *given) {
    std::istringstream list(given);
    for (std::string entry; std::getline(list, entry, ',');) devices.push_back(entry);
  }
  std::string list;
  for (const int slot : slots) {
    const auto index = static_cast<std::size_t>(slot);
    list += (list.empty() ? "" : ",") + (index < devices.size() ? devices[index] : std::to_string(slot));
  }
  return list;
}

DETTRIAL_INLINE bool continue_restarted_job(const RunPlan& plan, const LaunchEnvironment& env, FitOptions& options) {
  const bool may_restart = env.restart > 0 || env.max_restarts.value_or(0) > 0;
  if (!may_restart || env.launcher == Launcher::env) return false;  // the built-in launcher resumes its ranks itself
  if (plan.output.empty() && !plan.resumed_checkpoint)
    throw ConfigError(std::string(launcher_name(env.launcher)) + (env.restart > 0 ? " restarted this job" : " may restart this job") +
                      ", and a restarted job continues from its run folder's latest checkpoint: give the run a folder that outlives "
                      "an attempt with --output DIR");
  if (env.restart == 0) return false;
  const std::vector<CheckpointInfo> saved = list_checkpoints(checkpoint_storage(options));
  if (!saved.empty()) options.latest_checkpoint = saved.back().path;
  return saved.empty() && !options.latest_checkpoint;
}

DETTRIAL_INLINE std::shared_ptr<Communicator> connect_ranks(const CommandLine& line, const LaunchEnvironment& env) {
  if (!env.distributed()) return nullptr;
  const std::chrono::milliseconds timeout = std::chrono::seconds(line.timeout_seconds);
  if (line.backend_name.empty()) return Communicator::create(env, timeout, backend::gpu_or_gloo{});
  return line.backend_name == "nccl" ? Communicator::create(env, timeout, backend::nccl{})
                                     : Communicator::create(env, timeout, backend::gloo{});
}

DETTRIAL_INLINE FitOptions fit_options_for(const CommandLine& line, const RunPlan& plan, const std::filesystem::path& default_output) {
  FitOptions options = FitOptions::from_config(plan.config);
  options.test_mode = line.test_mode;
  options.output_dir = plan.output;
  options.report.quiet = line.quiet;
  if (plan.resumed_checkpoint) {
    options.latest_checkpoint = *plan.resumed_checkpoint;
    options.resume_fresh_parts = line.resume_fresh_parts;
    // Continue in the resumed run's directory (metrics.jsonl appended, checkpoints beside the old).
    if (plan.output.empty() && plan.resumed_checkpoint->parent_path().filename() == layout::checkpoints)
      options.output_dir = plan.resumed_checkpoint->parent_path().parent_path();
  }
  if (!line.test_mode && !options.max_length)
    throw ConfigError(plan.config_path + ": the config sets no training length; add searcher.max_length, e.g. {batches: 1000}");
  if (options.output_dir.empty()) options.output_dir = default_output;
  return options;
}

DETTRIAL_INLINE void say_config_differences(const CommandLine& line, const RunPlan& plan, const LaunchEnvironment& env) {
  if (!plan.resumed_checkpoint || plan.config_source == RunPlan::ConfigSource::resumed_run || line.quiet || env.rank != 0) return;
  if (std::error_code ec; !std::filesystem::exists(CheckpointFolder{*plan.resumed_checkpoint}.load_data(), ec)) return;
  const std::string differences = config_differences(resumed_run_config(*plan.resumed_checkpoint).yaml, plan.config.yaml);
  if (!differences.empty())
    std::fprintf(stderr, "dettrial: resuming %s with a config that differs from the run's own (its load_data.json); now:\n%s",
                 plan.resumed_checkpoint->string().c_str(), differences.c_str());
}

DETTRIAL_INLINE void start_afresh(const std::filesystem::path& run, bool quiet) {
  if (!quiet)
    std::fprintf(stderr, "dettrial: '%s' holds no checkpoint yet (the run stopped before its first): starting it afresh there\n",
                 run.string().c_str());
  MetricsLog(run, /*resumed_at=*/-1);                                      // drops every record
  TensorBoardWriter::drop_events_after(RunFolder{run}.tensorboard(), -1);  // and every event
}

DETTRIAL_INLINE std::filesystem::path checkpoint_to_restart_from(const std::exception& failure, const std::vector<CheckpointInfo>& before,
                                                                 const std::filesystem::path& storage, RestartPolicy& restarts,
                                                                 bool quiet) {
  // Nothing to say without restarts, or for a wrong configuration (its own message says what to fix).
  if (restarts.max_restarts() == 0 || is_configuration_error(failure)) throw;
  const std::vector<CheckpointInfo> after = list_checkpoints(storage);
  if (const auto why_not = restarts.refuse_restart(RestartPolicy::Failure::other, wrote_new_checkpoint(before, after))) {
    if (!quiet) std::fprintf(stderr, "dettrial: the trial failed and is not restarted: %s\n", why_not->c_str());
    throw;
  }
  if (!quiet)
    std::fprintf(stderr, "dettrial: the trial failed: %s\ndettrial: restarting it from its checkpoint at batch %lld: %s\n",
                 first_line(failure.what()).c_str(), static_cast<long long>(after.back().batches_trained), restarts.restart_text().c_str());
  return after.back().path;
}

DETTRIAL_INLINE void say_if_nothing_left(const FitResult& result, const RunPlan& plan, bool quiet, bool chief) {
  if (result.resumed_from_batch > 0 && result.batches_trained == result.resumed_from_batch && result.signal == 0 && !quiet && chief)
    std::fprintf(stderr,
                 "dettrial: nothing left to train: the checkpoint is at batch %lld, which already reaches searcher.max_length of %s; "
                 "raise it to train on (e.g. --set searcher.max_length.batches=N)\n",
                 static_cast<long long>(result.resumed_from_batch), plan.config_path.c_str());
}

DETTRIAL_INLINE bool is_configuration_error(const std::exception& e) {
  return dynamic_cast<const ConfigError*>(&e) != nullptr || dynamic_cast<const HyperparameterError*>(&e) != nullptr;
}

DETTRIAL_INLINE int exit_status_of_failure(const char* program) {
  try {
    throw;
  } catch (const CommandLineError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    if (e.show_usage) std::fprintf(stderr, main_usage(), program);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return is_configuration_error(e) ? exit_status_config_error : 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: LibTorch: %s\n", e.what_without_backtrace());
  } catch (const YAML::Exception& e) {
    std::fprintf(stderr, "error: YAML: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/cli/main.hpp
// ---- end dettrial/main.hpp
