// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::main<Trial>(argc, argv): a whole trial program's command line in one call, in
/// stages: the command line (command_line.hpp), the run plan (run_plan.hpp), then a search, a launch
/// of local ranks or the training of this rank; the exit status comes from how it ended.
#pragma once

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

#include "../layout.hpp"
#include "../checkpoint/restart_policy.hpp"
#include "../checkpoint/storage.hpp"
#include "../context/context.hpp"
#include "../distributed/communicator.hpp"
#include "../process/launch_environment.hpp"
#include "../process/threads.hpp"
#include "../search/experiment.hpp"
#include "../report/html_report.hpp"
#include "../report/metrics_log.hpp"
#include "../tensorboard/event_file.hpp"
#include "../error.hpp"
#include "../detail/text.hpp"
#include "../detail/exit_status.hpp"
#include "../detail/folder_lock.hpp"
#include "../detail/process.hpp"
#include "../trainer/fit_options.hpp"
#include "../trainer/trainer.hpp"
#include "command_line.hpp"
#include "detail/launcher.hpp"
#include "run_plan.hpp"
#include "../detail/linkage.hpp"

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
