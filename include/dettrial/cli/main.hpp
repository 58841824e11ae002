// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::main<Trial>(argc, argv): a whole trial program's command line in one call.
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include "../layout.hpp"
#include "../config/experiment_config.hpp"
#include "../checkpoint/storage.hpp"
#include "../context/context.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/launch_environment.hpp"
#include "../distributed/threads.hpp"
#include "../search/experiment.hpp"
#include "../search/hyperparameter_space.hpp"
#include "../report/html_report.hpp"
#include "../report/metrics_log.hpp"
#include "../error.hpp"
#include "../detail/text.hpp"
#include "../detail/exit_status.hpp"
#include "../detail/process.hpp"
#include "../version.hpp"
#include "../trainer/fit_options.hpp"
#include "../detail/signals.hpp"
#include "launcher.hpp"
#include "../trainer/trainer.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

namespace detail {


DETTRIAL_INLINE const char* main_usage();

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

}  // namespace detail

/// The exit status of a trial program stopped by SIGINT or SIGTERM after checkpointing (EX_TEMPFAIL:
/// try again, for example with `--resume`).
inline constexpr int exit_status_interrupted = detail::exit_status_interrupted_value;
/// The exit status of a trial program whose configuration is wrong (ConfigError, HyperparameterError):
/// running it again would fail the same way (EX_CONFIG).
inline constexpr int exit_status_config_error = detail::exit_status_config_value;

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
  const char* program = argc > 0 ? argv[0] : "trial";
  if (const char* supervisor = std::getenv(detail::supervisor_pid_variable); supervisor && *supervisor)
    detail::stop_with_supervisor(static_cast<pid_t>(std::strtol(supervisor, nullptr, 10)));
  std::string config_path;
  std::vector<std::string> overrides;
  std::string output;
  std::string resume;
  std::string backend_name;
  std::string report_dir;
  int nproc = 0;
  std::optional<int> threads;
  long timeout_seconds = 300;
  std::vector<std::string> child_args{program};  // what the built-in launcher passes to each rank
  bool test_mode = false, quiet = false, no_cpu_bind = false;
  TrialLauncher launcher = TrialLauncher::local;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %.*s needs a value\n", program, static_cast<int>(flag.size()), flag.data());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::printf(detail::main_usage(), program);
      return 0;
    } else if (arg == "--config") {
      config_path = value(arg);
    } else if (arg == "--set") {
      overrides.push_back(value(arg));
    } else if (arg == "--output") {
      output = value(arg);
    } else if (arg == "--resume") {
      resume = value(arg);
    } else if (arg == "--report") {
      report_dir = value(arg);
    } else if (arg == "--nproc" || arg == "--timeout" || arg == "--threads") {
      const std::string v = value(arg);
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1) {
        std::fprintf(stderr, "%s: %s needs a positive integer, not '%s'\n", program, argv[i - 1], v.c_str());
        return 2;
      }
      if (arg == "--nproc") nproc = static_cast<int>(n);
      else if (arg == "--threads") threads = static_cast<int>(n);
      else timeout_seconds = n;
    } else if (arg == "--backend") {
      backend_name = value(arg);
      if (backend_name != "gloo" && backend_name != "nccl") {
        std::fprintf(stderr, "%s: --backend must be gloo or nccl, not '%s'\n", program, backend_name.c_str());
        return 2;
      }
    } else if (arg == "--launcher") {
      const std::string name = value(arg);
      if (name != "local" && name != "slurm") {
        std::fprintf(stderr, "%s: --launcher must be local or slurm, not '%s'\n", program, name.c_str());
        return 2;
      }
      launcher = name == "slurm" ? TrialLauncher::slurm : TrialLauncher::local;
    } else if (arg == "--test-mode") {
      test_mode = true;
    } else if (arg == "--quiet") {
      quiet = true;
    } else if (arg == "--no-cpu-bind") {
      no_cpu_bind = true;
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", program, argv[i]);
      std::fprintf(stderr, detail::main_usage(), program);
      return 2;
    }
  }
  if (!report_dir.empty()) {
    // Only the page: nothing is trained, no config is read.
    try {
      std::printf("%s\n", write_report(report_dir).string().c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--nproc") {
      ++i;
      continue;
    }
    child_args.emplace_back(argv[i]);
  }
  if (config_path.empty() && resume.empty()) {
    std::fprintf(stderr, "%s: --config FILE is required (or --resume DIR, which reads the run's own config)\n", program);
    std::fprintf(stderr, detail::main_usage(), program);
    return 2;
  }
  try {
    // --resume alone: the run's own config, with the overrides it was given.
    std::optional<std::filesystem::path> resumed_checkpoint;
    std::string afresh;  // a run folder without checkpoint, started again (said and done just before training)
    if (!resume.empty()) {
      resumed_checkpoint = detail::checkpoint_to_resume(resume, config_path);
      if (!resumed_checkpoint) {
        afresh = resume;
        if (output.empty()) output = resume;
        resume.clear();
      }
    }
    ExperimentConfig config = config_path.empty() ? detail::resumed_run_config(*resumed_checkpoint) : ExperimentConfig::load_file(config_path);
    if (config_path.empty()) config_path = config.source;
    if (!overrides.empty()) {
      YAML::Node doc = YAML::Clone(config.yaml);
      for (const auto& o : overrides) detail::apply_override(doc, o);
      config = ExperimentConfig::from_yaml(doc, config_path + " (with --set)");
    }
    if (!config.ignored_fields.empty() && !quiet) {
      std::string fields;
      for (const auto& f : config.ignored_fields) fields += (fields.empty() ? "" : ", ") + f;
      std::fprintf(stderr, "dettrial: warning: ignoring fields that mean something only on a Determined cluster: %s\n", fields.c_str());
    }
    const bool one_point = HyperparameterSpace(config.hyperparameters, config.source).is_constant();
    if ((config.searcher.name == "single" || test_mode) && (!one_point || config.searcher.name != "single")) {
      // One trial from a search config, as Determined runs `single` over a space and `--test`: one
      // point drawn from the space, trained here (its drawn values are in the run's load_data.json).
      const bool draws = !one_point;
      const bool several_ranks = LaunchEnvironment::detect().distributed() || nproc > 1 || config.slots_per_trial > 1;
      if (draws && several_ranks && !config.experiment_seed && !resumed_checkpoint)
        throw ConfigError(config_path + ": a data-parallel trial drawn from a search space needs reproducibility.experiment_seed, "
                          "so that every rank draws the same hyperparameters");
      config = detail::one_trial_drawn(config);
      // Resuming such a trial: the hyperparameters it was drawn with, not a new draw.
      if (draws && resumed_checkpoint && std::filesystem::exists(*resumed_checkpoint / layout::load_data)) {
        YAML::Node doc = YAML::Clone(config.yaml);
        doc["hyperparameters"] = YAML::Clone(detail::resumed_run_config(*resumed_checkpoint).yaml["hyperparameters"]);
        config = ExperimentConfig::from_yaml(doc, config.source);
      }
      if (!quiet && LaunchEnvironment::detect().rank == 0) {
        YAML::Emitter values;
        values << YAML::Flow << config.hyperparameters;
        std::fprintf(stderr, "dettrial: %s: one trial%s%s\n",
                     test_mode ? "--test-mode of a search" : "searcher 'single' over a search space",
                     draws ? ", with hyperparameters drawn from the space: " : "", draws ? values.c_str() : "");
      }
    }
    if (config.searcher.name != "single") {
      // A search: every trial is a process of this program (a single-trial config of its own).
      const std::string stem = config.name.empty() ? std::filesystem::path(config_path).stem().string() : config.name;
      ExperimentOptions experiment{.output_dir = output.empty() ? std::filesystem::path("runs") / ("experiment-" + stem) : std::filesystem::path(output),
                                   .quiet = quiet,
                                   .launcher = launcher};
      return Experiment(config, experiment).run();
    }
    if (launcher == TrialLauncher::slurm)
      throw ConfigError("--launcher slurm runs a search's trials as Slurm jobs; this config trains one trial: start it under Slurm "
                        "directly (srun --ntasks=N " + std::string(program) + " --config ...)");
    const LaunchEnvironment env = LaunchEnvironment::detect();
    if (!env.distributed() && nproc == 0 && config.slots_per_trial > 1) nproc = static_cast<int>(config.slots_per_trial);
    if (!env.distributed() && nproc > 1) {
      // All ranks must agree on the output directory: the launcher picks it.
      if (output.empty() && resume.empty()) {
        child_args.emplace_back("--output");
        child_args.push_back(Trainer<TrialT>::default_output_dir().string());
      }
      // The user's own thread count (--threads, OMP_NUM_THREADS) leaves the ranks unbound: they may
      // want more threads than a rank's share of the cores.
      const bool bind_cpus = !no_cpu_bind && !threads && !detail::omp_num_threads([](const char* n) { return std::getenv(n); });
      return detail::launch_local(child_args, nproc, std::chrono::seconds(timeout_seconds + 10), bind_cpus);
    }
    // --config with --resume: say what differs from the run's config (that is what changes now).
    if (resumed_checkpoint && config.source.find("(the resumed run's config)") == std::string::npos && !quiet && env.rank == 0) {
      if (std::error_code ec; std::filesystem::exists(*resumed_checkpoint / layout::load_data, ec)) {
        const std::string differences = detail::config_differences(detail::resumed_run_config(*resumed_checkpoint).yaml, config.yaml);
        if (!differences.empty())
          std::fprintf(stderr, "dettrial: resuming %s with a config that differs from the run's own (its load_data.json); now:\n%s",
                       resumed_checkpoint->string().c_str(), differences.c_str());
      }
    }
    std::shared_ptr<Communicator> communicator;
    if (env.distributed()) {
      // NCCL where each rank of this node has a GPU of its own; Gloo otherwise (it takes CUDA tensors too).
      const bool gpu_per_rank = torch::cuda::is_available() && env.local_size <= static_cast<std::int64_t>(torch::cuda::device_count());
      if (backend_name.empty()) backend_name = gpu_per_rank && backend::has_nccl ? "nccl" : "gloo";
      const std::chrono::milliseconds timeout = std::chrono::seconds(timeout_seconds);
      communicator = backend_name == "nccl" ? Communicator::create(env, timeout, backend::nccl{})
                                            : Communicator::create(env, timeout, backend::gloo{});
    }
    FitOptions options = FitOptions::from_config(config);
    options.test_mode = test_mode;
    options.output_dir = output;
    options.report.quiet = quiet;
    if (resumed_checkpoint) {
      const std::filesystem::path checkpoint = *resumed_checkpoint;
      options.latest_checkpoint = checkpoint;
      // Continue in the resumed run's directory (metrics.jsonl appended, checkpoints beside the old).
      if (output.empty() && checkpoint.parent_path().filename() == layout::checkpoints)
        options.output_dir = checkpoint.parent_path().parent_path();
    }
    if (!test_mode && !options.max_length)
      throw ConfigError(config_path + ": the config sets no training length; add searcher.max_length, e.g. {batches: 1000}");
    if (!afresh.empty() && env.rank == 0) {
      if (!quiet)
        std::fprintf(stderr, "dettrial: '%s' holds no checkpoint yet (the run stopped before its first): starting it afresh there\n",
                     afresh.c_str());
      MetricsLog(afresh, /*resumed_at=*/-1);  // drops every record: they describe training about to be redone
      TensorBoardWriter::drop_events_after(std::filesystem::path(afresh) / layout::tensorboard, -1);  // and every event
    }
    // Determined's max_restarts for a trial run on its own: a failure (an exception; a crash needs a
    // supervisor, such as the search runner) restarts it from the checkpoint it wrote last. Only
    // after progress: a failure before the attempt's first new checkpoint would just repeat (missing
    // data, a bug at batch 0). Data-parallel ranks do not restart alone (their launcher ends the
    // job), nor does a wrong configuration.
    if (options.output_dir.empty()) options.output_dir = Trainer<TrialT>::default_output_dir();
    const std::filesystem::path storage = options.checkpoint_dir.empty() ? options.output_dir / layout::checkpoints : options.checkpoint_dir;
    const std::int64_t max_restarts = communicator || test_mode ? 0 : std::max<std::int64_t>(config.max_restarts, 0);
    FitResult result;
    std::unique_ptr<Context> context;
    for (std::int64_t restarts = 0;; ++restarts) {
      const std::vector<CheckpointInfo> before = max_restarts > 0 ? list_checkpoints(storage) : std::vector<CheckpointInfo>{};
      context = std::make_unique<Context>(config, ContextOptions{.communicator = communicator, .threads = threads});
      try {
        Trainer<TrialT> trainer(*context, trial_args...);
        result = trainer.fit(options);
        break;
      } catch (const std::exception& e) {
        const bool configuration = dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const HyperparameterError*>(&e);
        if (configuration || restarts >= max_restarts) throw;
        const std::vector<CheckpointInfo> after = list_checkpoints(storage);
        if (after.empty() || (!before.empty() && after.back().uuid == before.back().uuid)) throw;  // no progress
        if (!quiet)
          std::fprintf(stderr, "dettrial: the trial failed: %s\ndettrial: restarting it from its checkpoint at batch %lld: restart %lld of max_restarts %lld\n",
                       detail::first_line(e.what()).c_str(), static_cast<long long>(after.back().batches_trained),
                       static_cast<long long>(restarts + 1), static_cast<long long>(max_restarts));
        options.latest_checkpoint = after.back().path;
      }
    }
    if (result.resumed_from_batch > 0 && result.batches_trained == result.resumed_from_batch && result.signal == 0 && !quiet &&
        context->distributed().is_chief())
      std::fprintf(stderr, "dettrial: nothing left to train: the checkpoint is at batch %lld, which already reaches searcher.max_length of %s; "
                           "raise it to train on (e.g. --set searcher.max_length.batches=N)\n",
                   static_cast<long long>(result.resumed_from_batch), config_path.c_str());
    return result.signal != 0 ? exit_status_interrupted : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    // Running a wrong configuration again fails the same way: say so in the status.
    const bool configuration = dynamic_cast<const ConfigError*>(&e) != nullptr || dynamic_cast<const HyperparameterError*>(&e) != nullptr;
    if (configuration) return exit_status_config_error;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: LibTorch: %s\n", e.what_without_backtrace());
  } catch (const YAML::Exception& e) {
    std::fprintf(stderr, "error: YAML: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

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
         "                       output directory (its latest checkpoint)\n"
         "  --nproc N            train data-parallel in N local processes (Gloo on CPU, NCCL on GPUs);\n"
         "                       default: resources.slots_per_trial when no launcher (torchrun, srun,\n"
         "                       mpirun) started this process\n"
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
         "  --quiet              print nothing but errors\n"
         "  --help               show this text\n"
         "\n"
         "SIGINT or SIGTERM finishes the batch, checkpoints and exits with status 75; a second one aborts.\n"
         "Exit status: 0 done, 1 failed, 2 bad command line, 75 stopped by a signal (continue with\n"
         "--resume), 78 wrong configuration (running it again fails the same way).\n";
}

DETTRIAL_INLINE ExperimentConfig one_trial_drawn(const ExperimentConfig& config) {
  const HyperparameterSpace space(config.hyperparameters, config.source);
  std::mt19937_64 rng(config.experiment_seed ? *config.experiment_seed : std::random_device{}());
  YAML::Node doc = YAML::Clone(config.yaml);
  doc["hyperparameters"] = space.sample(rng);
  doc["searcher"]["name"] = "single";
  return ExperimentConfig::from_yaml(doc, config.source);
}

DETTRIAL_INLINE std::optional<std::filesystem::path> checkpoint_to_resume(const std::filesystem::path& path,
                                                                         const std::string& config_path) {
  std::error_code ec;
  const bool run_folder = std::filesystem::is_directory(path, ec) && std::filesystem::exists(path / layout::metrics_log, ec) &&
                          !std::filesystem::exists(path / layout::metadata, ec);
  if (!run_folder || !list_checkpoints(path).empty() || !list_checkpoints(path / layout::checkpoints).empty())
    return resolve_checkpoint(path);  // a checkpoint, a folder holding some, or resolve_checkpoint's error
  if (!config_path.empty()) {
    // The config may keep checkpoints elsewhere (checkpoint_storage.host_path): the run's are there.
    if (const auto storage = ExperimentConfig::load_file(config_path).checkpoint_storage.path; storage && !list_checkpoints(*storage).empty())
      return resolve_checkpoint(*storage);
    return std::nullopt;
  }
  throw CheckpointError("'" + path.string() + "' holds no checkpoint yet (the run stopped before its first), so it has no "
                        "config of its own to resume with; give --config FILE to start it afresh there");
}

DETTRIAL_INLINE void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set needs KEY=VALUE with a dotted KEY, got '" + assignment + "'");
  const std::string key = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set " + key + ": the value is not valid YAML: " + e.msg);
  }
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
  const std::filesystem::path file = checkpoint / layout::load_data;
  YAML::Node load_data;
  try {
    load_data = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw ConfigError("cannot read the resumed run's config from '" + file.string() + "' (" + e.what() + "); give it with --config");
  }
  if (!load_data["experiment_config"] || !load_data["experiment_config"].IsMap())
    throw ConfigError("'" + file.string() + "' holds no experiment_config; give the run's config with --config");
  return ExperimentConfig::from_yaml(load_data["experiment_config"], file.string() + " (the resumed run's config)");
}

DETTRIAL_INLINE void flatten_yaml(const YAML::Node& node, const std::string& path, std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) flatten_yaml(kv.second, path.empty() ? kv.first.as<std::string>() : path + "." + kv.first.as<std::string>(), out);
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
