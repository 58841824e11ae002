// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The first stage of a trial program: its command line, read into a `CommandLine` without
/// touching LibTorch, a config or the file system (so it is tested on its own).
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../detail/linkage.hpp"

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
