// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A search's trials as Slurm jobs (`--launcher slurm`): Slurm's client commands, the job
/// names, the srun command around a trial's, stopping a trial's job, and reading the jobs the
/// controller knows. The Experiment decides when; this knows how to say it to Slurm.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>
// IWYU pragma: private, include <dettrial/main.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../../detail/linkage.hpp"

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

#include "../../detail/exit_status.hpp"
#include "../../detail/process.hpp"
#include "../../error.hpp"

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
