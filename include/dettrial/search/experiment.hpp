// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Runs a hyperparameter search: each trial is its own process of the same program (a crash
/// cannot take the experiment down), on this machine or as a Slurm job, restarted from its latest
/// checkpoint up to max_restarts times; ASHA's stop is a SIGTERM (the trial checkpoints and exits); an
/// event log makes a second run of the same command continue the experiment (adopting the Slurm jobs
/// still running); a summary table and summary.json at the end, and report.html (the search's page,
/// refreshed as trials end).
#pragma once

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

#include "../layout.hpp"
#include "../checkpoint/restart_policy.hpp"
#include "../checkpoint/storage.hpp"
#include "../config/experiment_config.hpp"
#include "../error.hpp"
#include "../detail/exit_status.hpp"
#include "../detail/folder_lock.hpp"
#include "../detail/json_fwd.hpp"
#include "../detail/jsonl.hpp"
#include "../detail/yaml.hpp"
#include "../detail/process.hpp"
#include "../vocabulary/metrics.hpp"
#include "../report/html_report.hpp"
#include "../tracking/mlflow.hpp"
#include "../version.hpp"
#include "../detail/signals.hpp"
#include "../detail/text.hpp"
#include "../vocabulary/search_event.hpp"
#include "searchers.hpp"
#include "trial_summary.hpp"
#include "detail/event_log.hpp"
#include "detail/slurm.hpp"
#include "detail/summary.hpp"
#include "detail/trial_launch.hpp"
#include "detail/validation_tail.hpp"
#include "../detail/linkage.hpp"

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
#include "../detail/json.hpp"

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
