// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Runs a hyperparameter search: each trial is its own process of the same program (a crash
/// cannot take the experiment down), on this machine or as a Slurm job, restarted from its latest
/// checkpoint up to max_restarts times; ASHA's stop is a SIGTERM (the trial checkpoints and exits); an
/// event log makes a second run of the same command continue the experiment (adopting the Slurm jobs
/// still running); a summary table and summary.json at the end, and report.html (the search's page,
/// refreshed as trials end).
#pragma once

#include <sys/stat.h>
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
#include "../detail/process.hpp"
#include "../vocabulary/metrics.hpp"
#include "../report/html_report.hpp"
#include "../report/metrics_log.hpp"
#include "../tracking/mlflow.hpp"
#include "../version.hpp"
#include "../detail/signals.hpp"
#include "../detail/text.hpp"
#include "searchers.hpp"
#include "detail/slurm.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// How a trial of an experiment ended (or where it stands).
enum class TrialState { queued, running, completed, stopped_by_searcher, errored, interrupted };

DETTRIAL_INLINE const char* to_string(TrialState s);

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

}  // namespace dettrial

namespace dettrial::detail {
DETTRIAL_INLINE std::string one_line(const YAML::Node& node);
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief An experiment: a searcher, its trials as child processes, and the record that lets it
 * resume. `run()` returns 0 when every trial completed or was stopped by the searcher, 1 when some
 * trial still failed after its restarts, 75 (exit_status_interrupted) when a signal interrupted it,
 * and 78 (exit_status_config_error) when a trial's configuration was wrong: that error would repeat
 * in every trial, so the search stops at the first one (other trials checkpoint and stop), prints
 * it, and continues when the same command runs again after the fix.
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
    /// How far metrics.jsonl has been read, in the file with this inode (a resumed trial rewrites
    /// the file without the records past its checkpoint: then it is read again from the start).
    std::uintmax_t metrics_offset = 0;
    ino_t metrics_inode = 0;
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
  void log_event(const detail::Json& event);

  /// A torn last line of events.jsonl (a runner killed while writing it) cut off, so that this
  /// runner's first event is not appended to it and lost with it.
  void cut_torn_event();
  /// One event of the log, replayed; `line` is its text, for messages.
  void replay_event(const detail::Json& e, const std::string& line);
  bool replayed_ = false;

  static TrialState state_from(const std::string& s);

  void add_trial(TrialRequest r);

  void record_metric(TrialSummary& t, double metric);

  // ---- trials as processes ---------------------------------------------------------------------

  /// The trial's own experiment config: its hyperparameters as values, one trial, its length, seed and storage.
  void write_trial_config(const TrialRequest& r) const;

  void launch_queued();

  void launch(std::int64_t id);

  /// Reads the trials' new validation records and lets the searcher decide on each.
  void poll_metrics();

  void reap(bool interrupting);

  /// The end of trial `id`'s process or job, `status` its wait status: completed, stopped by the
  /// searcher, restarted from its latest checkpoint, or failed.
  /// `slurm_job`: the job that ended, recorded in the event log (a later runner then knows that
  /// job's end was handled).
  void trial_ended(std::int64_t id, int status, bool stop_sent, bool interrupting, std::int64_t slurm_job = 0,
                   const std::optional<std::vector<CheckpointInfo>>& checkpoints_at_start = std::nullopt);

  /// The last `error: ...` line of a trial's log (what its program printed before it exited), or
  /// empty (a trial killed by a signal prints none).
  std::string last_error_line(std::int64_t id) const;
  /// How the trial's process ended and its error line: "exit status 1: error: ...".
  std::string describe_failure(std::int64_t id, int status) const;

  /// Batches trained and the best checkpoint, from the trial's folder.
  void refresh_from_disk(TrialSummary& t) const;

  /**
   * @brief Determined's garbage collection at the end of an experiment: a checkpoint goes when it is
   * neither among the experiment's `save_experiment_best` nor its trial's `save_trial_best` (by the
   * searcher metric), nor among its trial's `save_trial_latest`.
   */
  void apply_experiment_retention();

  /// The searcher metric's direction: the one "better" rule (dettrial::MetricOrder).
  MetricOrder order() const { return config_.searcher.order(); }

  /// summary.json (and, with `print`, the summary table on the terminal), after reading each
  /// trial's checkpoints: at the end, or when interrupted (no trial running).
  void write_summary(bool print = true);

  /// What summary.json holds, from what this runner knows now (without reading checkpoints, which
  /// running trials may be writing or deleting).
  detail::Json summary_json() const;

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

}  // namespace dettrial

namespace dettrial::detail {

DETTRIAL_INLINE std::string one_line(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace dettrial::detail

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

DETTRIAL_INLINE int Experiment::run() {
  namespace fs = std::filesystem;
  // One runner per experiment folder; each trial's process locks its own run folder.
  const detail::FolderLock lock = detail::FolderLock::acquire(folder().lock(), "experiment folder");
  fs::create_directories(folder().trials());
  experiment_id_ = experiment_id_in(options_.output_dir);
  if (slurm_) slurm_->set_experiment(experiment_id_);
  detail::supervisor_signal.store(0);
  detail::supervisor_signal_count.store(0);
  const detail::SignalHandlers handlers(&detail::dettrial_on_supervisor_signal);

  cut_torn_event();
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
  while (true) {
    if (detail::supervisor_signal_count.load() != 0 || config_error_) {
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
    launch_queued();
    if (running_count() == 0 && queue_.empty()) break;
    poll_metrics();
    reap(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // What each trial trained, before the experiment's retention deletes checkpoints (also of trials
  // that ended under an earlier runner, which this one knows only from their folders).
  for (auto& [id, r] : records_) refresh_from_disk(r.summary);
  apply_experiment_retention();
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

DETTRIAL_INLINE void Experiment::adopt_slurm_jobs() {
  const auto jobs = slurm_->jobs(options_.output_dir);
  if (!jobs)
    throw Error(
        "--launcher slurm: 'scontrol show job' failed, so this runner cannot tell which of the experiment's trials still run as Slurm "
        "jobs; "
        "is the cluster up (sinfo)?");
  std::vector<std::int64_t> ended;
  for (const auto& [id, job] : detail::SlurmCluster::newest_job_per_trial(*jobs)) {
    const auto queued = std::find(queue_.begin(), queue_.end(), id);
    if (queued == queue_.end()) continue;  // ended in the event log: its job is history
    // A job whose end the log records (a restart logged, the runner killed before the next job
    // started): the trial is queued again, as the log says.
    TrialRecord& record = records_.at(id);
    if (record.handled_job == job.id) continue;
    queue_.erase(queued);
    Running run;
    run.slurm_job = job.id;
    run.stop_sent = record.stop_logged;
    record.running = run;
    record.summary.state = TrialState::running;
    if (detail::slurm_job_ended(job.state)) {
      say("[experiment] trial " + std::to_string(id) + "'s Slurm job " + std::to_string(job.id) + " ended while no runner watched it (" +
          job.state + ")");
      ended.push_back(id);
    } else {
      say("[experiment] trial " + std::to_string(id) + ": adopting its Slurm job " + std::to_string(job.id) + " (" + job.state +
          ") from an earlier runner");
    }
  }
  // The validations the searcher has not heard of yet (those after the earlier runner stopped
  // reading), in the order of the trials; then the ended jobs end as they did (a failure restarts
  // the trial from its checkpoint).
  poll_metrics();
  for (const std::int64_t id : ended) {
    const Running run = *records_.at(id).running;
    records_.at(id).running.reset();
    trial_ended(id, jobs->at(run.slurm_job).status, run.stop_sent, /*interrupting=*/false, run.slurm_job);
  }
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
    const Running run = *records_.at(id).running;
    poll_metrics();  // its last records
    records_.at(id).running.reset();
    const std::string job = "Slurm job " + std::to_string(run.slurm_job);
    if (leave) {
      records_.at(id).summary.state = TrialState::interrupted;
      say("[experiment] trial " + std::to_string(id) + ": left its " + job + " running (Slurm does not answer)");
    } else if (!jobs->count(run.slurm_job)) {
      // The controller forgot the job (restarted without its state): how it ended is unknown, so
      // the trial resumes from its latest checkpoint (a completed one ends at once), not counted
      // as a restart.
      say("[experiment] trial " + std::to_string(id) + "'s " + job + " is no longer known to Slurm; it resumes from its latest checkpoint");
      queue_.push_back(id);
    } else {
      trial_ended(id, jobs->at(run.slurm_job).status, run.stop_sent, interrupting, run.slurm_job);
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

DETTRIAL_INLINE void Experiment::log_event(const detail::Json& event) {
  std::ofstream(folder().events_log(), std::ios::app) << detail::json_line(event);
}

DETTRIAL_INLINE void Experiment::cut_torn_event() {
  const auto events_path = folder().events_log();
  std::ifstream whole(events_path, std::ios::binary);
  if (!whole) return;
  const std::string text((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  if (text.empty() || text.back() == '\n') return;
  const auto keep = text.rfind('\n');
  std::filesystem::resize_file(events_path, keep == std::string::npos ? 0 : keep + 1);
  say("dettrial: the last line of " + events_path.string() + " was torn (a runner killed while writing it); it is dropped");
}

DETTRIAL_INLINE void Experiment::replay() {
  if (replayed_) return;
  replayed_ = true;
  std::vector<TrialRequest> first = std::visit([](auto& s) { return s.initial(); }, searcher_);
  for (auto& r : first) add_trial(std::move(r));
  const auto events_path = folder().events_log();
  if (!std::filesystem::exists(events_path)) return;
  // The searcher is deterministic given its seed and the same events in the same order.
  std::int64_t replayed = 0;
  for (const detail::Json& e : detail::read_jsonl(events_path)) {
    const std::string line = e.dump(-1, ' ', false, detail::Json::error_handler_t::replace);
    try {
      replay_event(e, line);
    } catch (const detail::JsonFieldError& err) {
      throw Error("'" + events_path.string() + "' has an event that lacks a field or has one of the wrong type (" + err.what() +
                  "): " + line);
    }
    ++replayed;
  }
  if (replayed > 0)
    say("dettrial: continuing the experiment in " + options_.output_dir.string() + " (" + std::to_string(replayed) + " events)");
}

DETTRIAL_INLINE void Experiment::replay_event(const detail::Json& e, const std::string& line) {
  const auto get = [&e](const char* key) -> const detail::Json& { return detail::json_field(e, key); };
  const auto id = detail::json_as<std::int64_t>(get("trial"), "trial");
  const auto kind = detail::json_as<std::string>(get("event"), "event");
  // Only the trials this searcher, from this seed, created: an event of another is from another
  // experiment's log (or another searcher's, or seed's), and the searcher would be told of a trial
  // it never made.
  const auto found = records_.find(id);
  if (found == records_.end())
    throw Error("'" + folder().events_log().string() + "' has an event of trial " + std::to_string(id) +
                ", which this experiment's searcher did not create (the log of another experiment, searcher or seed?): " + line);
  TrialRecord& record = found->second;
  if (kind == "validation") {
    const double metric = detail::json_as<double>(get("metric"), "metric");
    const double time = detail::json_as<double>(get("time"), "time");
    std::visit([&](auto& s) { s.on_validation(id, metric, time); }, searcher_);
    record_metric(record.summary, metric);
    if (const detail::Json* b = detail::json_find(e, "batches"))
      record.validated_batches = std::max(record.validated_batches.value_or(0), detail::json_as<std::int64_t>(*b, "batches"));
    if (const detail::Json* r = detail::json_find(e, "rung")) {
      const auto rung = detail::json_as<std::int64_t>(*r, "rung");
      record.rung = std::max(record.rung.value_or(rung), rung);
    }
    if (const detail::Json* stopped = detail::json_find(e, "stopped"); stopped && stopped->is_boolean() && stopped->get<bool>())
      record.stop_logged = true;
  } else if (kind == "end") {
    // Told twice that a trial ended, a searcher would create its successors twice.
    if (std::find(queue_.begin(), queue_.end(), id) == queue_.end())
      throw Error("'" + folder().events_log().string() + "' ends trial " + std::to_string(id) + " a second time: " + line);
    TrialSummary& t = record.summary;
    t.state = state_from(detail::json_as<std::string>(get("state"), "state"));
    t.restarts = detail::json_as<std::int64_t>(get("restarts"), "restarts");
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
    for (auto& r : std::visit([&](auto& s) { return s.on_trial_end(id); }, searcher_)) add_trial(std::move(r));
  } else if (kind == "restart") {
    record.summary.restarts = detail::json_as<std::int64_t>(get("restarts"), "restarts");
  }
  if (const detail::Json* job = detail::json_find(e, "slurm_job")) record.handled_job = detail::json_as<std::int64_t>(*job, "slurm_job");
}

DETTRIAL_INLINE TrialState Experiment::state_from(const std::string& s) {
  for (auto st : {TrialState::completed, TrialState::stopped_by_searcher, TrialState::errored})
    if (s == to_string(st)) return st;
  return TrialState::errored;
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
  const bool better = order().improves(metric, t.best_metric);
  if (better) t.best_metric = metric;
}

DETTRIAL_INLINE void Experiment::write_trial_config(const TrialRequest& r) const {
  YAML::Node doc = YAML::Clone(config_.yaml);
  doc["hyperparameters"] = YAML::Clone(r.hparams);
  YAML::Node searcher(YAML::NodeType::Map);
  searcher["name"] = std::string(to_string(SearcherKind::single));
  searcher["metric"] = config_.searcher.metric;
  searcher["smaller_is_better"] = config_.searcher.smaller_is_better;
  const std::string unit = config_.searcher.kind == SearcherKind::adaptive_asha ? config_.searcher.time_metric
                           : config_.searcher.max_length ? std::string(to_string(config_.searcher.max_length->unit()))
                                                         : std::string("batches");
  searcher["max_length"][unit] = r.max_length;
  doc["searcher"] = searcher;
  doc["reproducibility"]["experiment_seed"] = r.seed;
  doc.remove("checkpoint_storage");
  YAML::Node storage(YAML::NodeType::Map);
  storage["type"] = "shared_fs";
  storage["host_path"] = trial_folder(r.id).checkpoints().string();
  // The experiment's best are chosen among the trials' best, so each trial keeps its best until then.
  storage["save_trial_best"] =
      std::max<std::int64_t>(config_.checkpoint_storage.save_trial_best, config_.checkpoint_storage.save_experiment_best > 0 ? 1 : 0);
  storage["save_trial_latest"] = std::max<std::int64_t>(config_.checkpoint_storage.save_trial_latest, 1);  // restarts need one
  storage["async"] = config_.checkpoint_storage.async;
  doc["checkpoint_storage"] = storage;
  std::ofstream(trial_folder(r.id).config()) << doc << "\n";
}

DETTRIAL_INLINE void Experiment::launch_queued() {
  while (!queue_.empty()) {
    const std::int64_t id = queue_.front();
    queue_.erase(queue_.begin());
    launch(id);
  }
}

DETTRIAL_INLINE void Experiment::launch(std::int64_t id) {
  namespace fs = std::filesystem;
  const TrialRequest& r = records_.at(id).request;
  fs::create_directories(trial_dir(id));
  write_trial_config(r);
  // --max-restarts 0: this runner restarts the trial (RestartPolicy, one count over its life); its
  // process, whose config keeps max_restarts, must not restart it a second time.
  std::vector<std::string> args = {
      options_.program.string(), "--config", trial_folder(id).config().string(), "--output", trial_dir(id).string(), "--quiet",
      "--max-restarts",          "0"};
  if (!list_checkpoints(trial_folder(id).checkpoints()).empty()) {
    args.emplace_back("--resume");
    args.push_back(trial_folder(id).checkpoints().string());
  } else if (std::filesystem::exists(trial_folder(id).metrics_log())) {
    // A restart before any checkpoint: the folder without one makes main start afresh there,
    // dropping the failed attempt's metrics and TensorBoard events first.
    args.emplace_back("--resume");
    args.push_back(trial_dir(id).string());
  }
  // Determined's own variables: context.get_trial_id() / get_experiment_id().
  detail::TrialCommand command{.program = options_.program.string(),
                               .args = std::move(args),
                               .extra_env = {"DET_TRIAL_ID=" + std::to_string(id), "DET_EXPERIMENT_ID=" + std::to_string(experiment_id_),
                                             std::string(detail::search_trial_variable) + "=1"}};
  if (!mlflow_run_id_.empty()) command.extra_env.push_back(std::string(MlflowSettings::parent_run_variable) + "=" + mlflow_run_id_);
  if (slurm_) {
    command = slurm_->job_command(id, config_.slots_per_trial, config_.slurm_args, std::move(command));
  } else {
    // A local trial ends with this runner (its parent); a Slurm trial's parent is slurmstepd.
    command.extra_env.push_back(std::string(detail::supervisor_pid_variable) + "=" + std::to_string(::getpid()));
  }
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

DETTRIAL_INLINE void Experiment::poll_metrics() {
  for (auto& [id, trial] : records_) {
    if (!trial.running) continue;
    Running& run = *trial.running;
    const auto path = trial_folder(id).metrics_log();
    struct stat file{};
    if (::stat(path.c_str(), &file) != 0) continue;
    if (file.st_ino != run.metrics_inode || static_cast<std::uintmax_t>(file.st_size) < run.metrics_offset) {
      run.metrics_inode = file.st_ino;  // a new file: read it from the start; validations already told are skipped
      run.metrics_offset = 0;
    }
    std::ifstream in(path);
    if (!in) continue;
    in.seekg(static_cast<std::streamoff>(run.metrics_offset));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written: read it next time
      run.metrics_offset += line.size() + 1;
      const detail::Json record = detail::Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded()) continue;  // not a complete record
      const detail::Json* type = detail::json_find(record, "type");
      if (!type || !type->is_string() || type->get_ref<const std::string&>() != "validation") continue;
      // Each validation reaches the searcher once, also when a restarted trial trains it again.
      const auto batches = MetricsLog::batches_of_record(record);
      if (!batches) continue;
      if (trial.validated_batches && *batches <= *trial.validated_batches) continue;
      trial.validated_batches = *batches;
      // The searcher closed a trial it stopped: a validation the trial reaches before the stop
      // does (it trains on while the signal travels) would otherwise change ASHA's rungs for the
      // other trials, by how fast the signal was.
      if (run.stop_sent) continue;
      const detail::Json* metrics = detail::json_find(record, "metrics");
      const detail::Json* searcher_metric = metrics ? detail::json_find(*metrics, config_.searcher.metric) : nullptr;
      if (!searcher_metric || !searcher_metric->is_number()) continue;  // absent, or null (NaN)
      const double metric = searcher_metric->get<double>();
      const std::string& time_metric = config_.searcher.time_metric;
      const detail::Json* time_value = detail::json_find(*metrics, time_metric);
      const double time = time_value && time_value->is_number() ? time_value->get<double>() : static_cast<double>(*batches);
      TrialSummary& t = trial.summary;
      record_metric(t, metric);
      const SearcherDecision d = std::visit([&](auto& s) { return s.on_validation(id, metric, time); }, searcher_);
      // A trial at its full length ends by itself; a stop is for the ones with time left.
      const bool stop = d == SearcherDecision::stop && !run.stop_sent && time < static_cast<double>(trial.request.max_length);
      detail::Json event = {{"event", "validation"}, {"trial", id}, {"metric", metric}, {"time", time}, {"batches", *batches}};
      // For the report: the ASHA rung this validation reached (the rungs its time has passed), and a stop.
      std::string where;
      if (const searcher::AshaBracket* bracket = bracket_of(id)) {
        const std::int64_t rung = static_cast<std::int64_t>(std::ranges::count_if(
                                      bracket->units_needed, [&](std::int64_t needed) { return time >= static_cast<double>(needed); })) -
                                  1;
        if (rung >= 0) {
          event["rung"] = rung;
          trial.rung = std::max(trial.rung.value_or(rung), rung);
          where = "; rung " + std::to_string(rung + 1) + " of " + std::to_string(bracket->units_needed.size());
        }
      }
      if (stop) event["stopped"] = true;
      log_event(event);
      char values[96];
      std::snprintf(values, sizeof values, "%.6g (best %.6g", metric, t.best_metric.value_or(metric));
      say("[experiment] trial " + std::to_string(id) + " at " + time_metric + " " + std::to_string(static_cast<std::int64_t>(time)) + ": " +
          config_.searcher.metric + " " + values + where + ")");
      if (stop) {
        terminate_trial(id, run);  // the trial checkpoints and exits
        run.stop_sent = true;
        say("[experiment] trial " + std::to_string(id) + " stopped by the searcher at " + time_metric + " " +
            std::to_string(static_cast<std::int64_t>(time)));
      }
    }
  }
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
  // A restart or end, with the Slurm job behind it.
  const auto log_ending = [&](detail::Json event) {
    if (slurm_job != 0) event["slurm_job"] = slurm_job;
    log_event(event);
  };
  TrialSummary& t = records_.at(id).summary;
  refresh_from_disk(t);
  const auto end = detail::ProcessEnd::from_wait_status(status);
  const bool ok = end.succeeded();
  // Stopped by a signal after a checkpoint; a SIGTERM that came after training ended kills it.
  // srun reports a task killed by signal n as exit status 128 + n.
  const bool stopped =
      end.interrupted() || (stop_sent && end.killed_by(SIGTERM)) || (stop_sent && slurm_ && end.exited_with(128 + SIGTERM));
  if (end.config_error()) {
    // Not restarted, and not ended in the event log: after the fix the next run trains it.
    t.state = TrialState::errored;
    if (!config_error_)
      config_error_.emplace(id, last_error_line(id) + "\n(trial " + std::to_string(id) + "'s config " + trial_folder(id).config().string() +
                                    " is " + config_.source + " with the trial's hyperparameters " + detail::one_line(t.hparams) + ")");
    return;
  }
  if (interrupting && (stopped || !ok)) {
    t.state = TrialState::interrupted;
    return;  // continued by the next run
  }
  if (ok || (stopped && stop_sent)) {
    // The searcher's decision names the state, not its race with the signal: a trial it stopped
    // short of its length is STOPPED_EARLY also when it finished before the signal arrived.
    t.state = stop_sent ? TrialState::stopped_by_searcher : TrialState::completed;
  } else {
    // The runner alone restarts a search's trial (its process runs with --max-restarts 0).
    std::optional<bool> progressed;
    if (checkpoints_at_start) progressed = wrote_new_checkpoint(*checkpoints_at_start, list_checkpoints(trial_folder(id).checkpoints()));
    RestartPolicy restarts(config_.max_restarts, t.restarts);
    if (const auto why_not = restarts.refuse_restart(RestartPolicy::Failure::other, progressed)) {
      t.state = TrialState::errored;
      std::fprintf(stderr, "[experiment] trial %lld failed (%s) after %lld restart(s) and is not restarted: %s; see %s\n",
                   static_cast<long long>(id), describe_failure(id, status).c_str(), static_cast<long long>(t.restarts), why_not->c_str(),
                   trial_folder(id).trial_log().c_str());
    } else {
      t.restarts = restarts.used();
      log_ending({{"event", "restart"}, {"trial", id}, {"restarts", t.restarts}});
      say("[experiment] trial " + std::to_string(id) + " failed (" + describe_failure(id, status) + "); " + restarts.restart_text() +
          " from its latest checkpoint");
      queue_.push_back(id);
      return;
    }
  }
  log_ending({{"event", "end"}, {"trial", id}, {"state", to_string(t.state)}, {"restarts", t.restarts}});
  say("[experiment] trial " + std::to_string(id) + " " + to_string(t.state) + " after " + std::to_string(t.batches_trained) + " batches");
  for (auto& r : std::visit([&](auto& s) { return s.on_trial_end(id); }, searcher_)) add_trial(std::move(r));
  say(progress());
  refresh_report(/*at_end=*/false);
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

DETTRIAL_INLINE void Experiment::apply_experiment_retention() {
  const auto& storage = config_.checkpoint_storage;
  if (storage.save_experiment_best == 0) return;  // the trials applied their own retention already
  std::vector<CheckpointInfo> ranked;
  std::map<std::string, std::int64_t> trial_best_keep;  // uuid -> kept by its trial's rules
  for (const auto& [id, r] : records_) {
    const auto all = list_checkpoints(trial_folder(id).checkpoints());
    for (const auto& c :
         checkpoints_to_delete(all, {.save_trial_best = storage.save_trial_best, .save_trial_latest = storage.save_trial_latest},
                               config_.searcher.smaller_is_better))
      trial_best_keep[c.uuid] = 0;  // candidates for deletion
    for (const auto& c : all)
      if (c.validation_metric) ranked.push_back(c);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo& a, const CheckpointInfo& b) {
    return order().better(*a.validation_metric, *b.validation_metric);
  });
  for (std::size_t k = 0; k < ranked.size() && static_cast<std::int64_t>(k) < storage.save_experiment_best; ++k)
    trial_best_keep.erase(ranked[k].uuid);  // among the experiment's best: kept
  for (const auto& [id, r] : records_)
    for (const auto& c : list_checkpoints(trial_folder(id).checkpoints()))
      if (trial_best_keep.count(c.uuid)) delete_checkpoint(c);
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
  std::optional<std::int64_t> best_trial;
  for (const auto& [id, record] : records_) {
    const TrialSummary& t = record.summary;
    if (t.best_metric && (!best_trial || order().better(*t.best_metric, *records_.at(*best_trial).summary.best_metric))) best_trial = id;
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
  summary["best_trial"] = best_trial ? detail::Json(*best_trial) : detail::Json(nullptr);
  return summary;
}

DETTRIAL_INLINE void Experiment::write_summary(bool print) {
  for (auto& [id, r] : records_) refresh_from_disk(r.summary);
  const detail::Json summary = summary_json();
  detail::write_file_synced(folder().summary(), detail::json_text(summary));
  if (!print) return;
  std::string table = "\n trial  state           batches  restarts  best " + config_.searcher.metric + "  last  hyperparameters\n";
  for (const auto& [id, record] : records_) {
    const TrialSummary& t = record.summary;
    char row[160];
    std::snprintf(row, sizeof row, " %5lld  %-14s %8lld  %8lld  %12s  %6s  ", static_cast<long long>(id), to_string(t.state),
                  static_cast<long long>(t.batches_trained), static_cast<long long>(t.restarts),
                  t.best_metric ? std::to_string(*t.best_metric).c_str() : "-",
                  t.last_metric ? std::to_string(*t.last_metric).c_str() : "-");
    table += row + detail::one_line(t.hparams) + "\n";
  }
  if (const detail::Json& best = summary.at("best_trial"); best.is_number_integer())
    table += " best: trial " + std::to_string(best.get<std::int64_t>()) + ", checkpoint " +
             records_.at(best.get<std::int64_t>()).summary.best_checkpoint + "\n";
  say(table + " summary: " + folder().summary().string());
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
