// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::main<Trial>(argc, argv): a whole trial program's command line in one call.
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include "../config/experiment_config.hpp"
#include "../checkpoint/storage.hpp"
#include "../context/context.hpp"
#include "../distributed/communicator.hpp"
#include "../distributed/launch_environment.hpp"
#include "../search/experiment.hpp"
#include "../search/hyperparameter_space.hpp"
#include "../detail/error.hpp"
#include "../detail/process.hpp"
#include "../version.hpp"
#include "fit_options.hpp"
#include "signals.hpp"
#include "trainer.hpp"

namespace dettrial {

namespace detail {

inline constexpr int exit_status_interrupted_value = 75;

inline const char* main_usage() {
  return "usage: %s --config FILE [options]\n"
         "\n"
         "Trains the trial described by an experiment config in Determined's YAML schema.\n"
         "\n"
         "options:\n"
         "  --config FILE        the experiment config (required)\n"
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
         "  --backend NAME       gloo or nccl (default: nccl when this process has a GPU and NCCL)\n"
         "  --timeout SECONDS    how long ranks wait for each other before failing (default 300)\n"
         "  --test-mode          train one batch and validate one batch, to check the trial runs\n"
         "  --quiet              print nothing but errors\n"
         "  --help               show this text\n"
         "\n"
         "SIGINT or SIGTERM finishes the batch, checkpoints and exits with status 75; a second one aborts.\n";
}

/// Applies `a.b.c=value` to a YAML document; the value is parsed as YAML (numbers stay numbers).
inline void apply_override(YAML::Node& root, const std::string& assignment) {
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
    YAML::Node next = node[part];
    node.reset(next);
    start = dot + 1;
  }
}

/// A free TCP port on the loopback interface (the kernel picks it).
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("cannot find a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

/**
 * @brief The built-in launcher: runs this program `nproc` times with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (one machine), forwards SIGINT/SIGTERM to them,
 * and waits. When one rank fails, the others get `grace` to fail on their own (their collectives
 * time out) and are then killed. Returns 0 when all succeed, exit_status_interrupted when all
 * stopped on a signal, else 1 after naming the rank that failed first.
 */
inline int launch_local(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int port = free_local_port();
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  std::vector<int> statuses(static_cast<std::size_t>(nproc), -1);
  supervisor_signal.store(0);
  const SignalHandlers handlers(&dettrial_on_supervisor_signal);
  for (int rank = 0; rank < nproc; ++rank) {
    SpawnOptions options{.extra_env = {"MASTER_ADDR=127.0.0.1"}};
    for (const auto& [key, value] : {std::pair{"RANK", rank}, std::pair{"WORLD_SIZE", nproc}, std::pair{"LOCAL_RANK", rank},
                                     std::pair{"LOCAL_WORLD_SIZE", nproc}, std::pair{"MASTER_PORT", port}})
      options.extra_env.push_back(std::string(key) + "=" + std::to_string(value));
    pids[static_cast<std::size_t>(rank)] = spawn_process(self, args, options);
  }
  int running = nproc, first_failure = -1, forwarded = 0;
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (const int sig = supervisor_signal.load(); sig != 0 && sig != forwarded) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (statuses[r] < 0) ::kill(pids[r], sig);
      forwarded = sig;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (pids[r] == pid) {
          statuses[r] = status;
          --running;
          const bool ok = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == exit_status_interrupted_value);
          if (!ok && first_failure < 0) {
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
    const int status = statuses[static_cast<std::size_t>(first_failure)];
    std::fprintf(stderr, "error: rank %d of %d %s\n", first_failure, nproc,
                 WIFSIGNALED(status) ? ("was killed by signal " + std::to_string(WTERMSIG(status))).c_str()
                                     : ("exited with status " + std::to_string(WEXITSTATUS(status))).c_str());
    return 1;
  }
  bool all_interrupted = true;
  for (const int status : statuses) all_interrupted = all_interrupted && WEXITSTATUS(status) == exit_status_interrupted_value;
  return all_interrupted ? exit_status_interrupted_value : 0;
}

}  // namespace detail

/// The exit status of a trial program stopped by SIGINT or SIGTERM after checkpointing (EX_TEMPFAIL:
/// try again, for example with `--resume`).
inline constexpr int exit_status_interrupted = detail::exit_status_interrupted_value;

/**
 * @brief The `main` of a trial program: parses the command line, reads the experiment config, builds
 * the context and the trainer, and fits. Returns the process exit status: 0 on success, 1 when the
 * run fails (with one line naming the problem), 2 on a command-line error, exit_status_interrupted
 * (75) when a signal stopped it after a checkpoint.
 * @code{.cpp}
 * int main(int argc, char** argv) { return dettrial::main<MnistTrial>(argc, argv); }
 * @endcode
 */
template <class TrialT, class... Args>
int main(int argc, char** argv, Args&&... trial_args) {
  const char* program = argc > 0 ? argv[0] : "trial";
  std::string config_path;
  std::vector<std::string> overrides;
  std::string output;
  std::string resume;
  std::string backend_name;
  int nproc = 0;
  std::optional<int> threads;
  long timeout_seconds = 300;
  std::vector<std::string> child_args{program};  // what the built-in launcher passes to each rank
  bool test_mode = false, quiet = false;
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
    } else if (arg == "--test-mode") {
      test_mode = true;
    } else if (arg == "--quiet") {
      quiet = true;
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", program, argv[i]);
      std::fprintf(stderr, detail::main_usage(), program);
      return 2;
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--nproc") {
      ++i;
      continue;
    }
    child_args.emplace_back(argv[i]);
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "%s: --config FILE is required\n", program);
    std::fprintf(stderr, detail::main_usage(), program);
    return 2;
  }
  try {
    ExperimentConfig config = ExperimentConfig::load_file(config_path);
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
    if (config.searcher.name != "single" || !HyperparameterSpace(config.hyperparameters, config.source).is_constant()) {
      // A search: every trial is a process of this program (a single-trial config of its own).
      if (config.searcher.name == "single")
        throw ConfigError(config_path + ": the hyperparameters are a search space, but searcher 'single' trains one trial; "
                          "use random, grid or adaptive_asha, or give each hyperparameter one value");
      if (test_mode) throw ConfigError("--test-mode checks one trial; it does not run a search (searcher '" + config.searcher.name + "')");
      const std::string stem = config.name.empty() ? std::filesystem::path(config_path).stem().string() : config.name;
      ExperimentOptions experiment{.output_dir = output.empty() ? std::filesystem::path("runs") / ("experiment-" + stem) : std::filesystem::path(output),
                                   .quiet = quiet};
      return Experiment(config, experiment).run();
    }
    const LaunchEnvironment env = LaunchEnvironment::detect();
    if (!env.distributed() && nproc == 0 && config.slots_per_trial > 1) nproc = static_cast<int>(config.slots_per_trial);
    if (!env.distributed() && nproc > 1) {
      // All ranks must agree on the output directory: the launcher picks it.
      if (output.empty() && resume.empty()) {
        child_args.emplace_back("--output");
        child_args.push_back(Trainer<TrialT>::default_output_dir().string());
      }
      return detail::launch_local(child_args, nproc, std::chrono::seconds(timeout_seconds + 10));
    }
    std::shared_ptr<Communicator> communicator;
    if (env.distributed()) {
      const bool gpu = torch::cuda::is_available();
      if (backend_name.empty()) backend_name = gpu && backend::has_nccl ? "nccl" : "gloo";
      const std::chrono::milliseconds timeout = std::chrono::seconds(timeout_seconds);
      communicator = backend_name == "nccl" ? Communicator::create(env, timeout, backend::nccl{})
                                            : Communicator::create(env, timeout, backend::gloo{});
    }
    FitOptions options = FitOptions::from_config(config);
    options.test_mode = test_mode;
    options.output_dir = output;
    options.report.quiet = quiet;
    if (!resume.empty()) {
      const std::filesystem::path checkpoint = resolve_checkpoint(resume);
      options.latest_checkpoint = checkpoint;
      // Continue in the resumed run's directory (metrics.jsonl appended, checkpoints beside the old).
      if (output.empty() && checkpoint.parent_path().filename() == "checkpoints")
        options.output_dir = checkpoint.parent_path().parent_path();
    }
    if (!test_mode && !options.max_length)
      throw ConfigError(config_path + ": the config sets no training length; add searcher.max_length, e.g. {batches: 1000}");
    Context context(config, ContextOptions{.communicator = communicator, .threads = threads});
    Trainer<TrialT> trainer(context, std::forward<Args>(trial_args)...);
    const FitResult result = trainer.fit(std::move(options));
    return result.signal != 0 ? exit_status_interrupted : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
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
