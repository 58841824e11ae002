// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::main<Trial>(argc, argv): a whole trial program's command line in one call.
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include "../config/experiment_config.hpp"
#include "../checkpoint/storage.hpp"
#include "../context/context.hpp"
#include "../detail/error.hpp"
#include "../version.hpp"
#include "fit_options.hpp"
#include "trainer.hpp"

namespace dettrial {

namespace detail {

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
         "                       or the resumed run's directory with --resume)\n"
         "  --resume PATH        continue from a checkpoint: a checkpoint directory, or a run's\n"
         "                       output directory (its latest checkpoint)\n"
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

}  // namespace detail

/// The exit status of a trial program stopped by SIGINT or SIGTERM after checkpointing (EX_TEMPFAIL:
/// try again, for example with `--resume`).
inline constexpr int exit_status_interrupted = 75;

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
    if (config.searcher.name != "single")
      throw ConfigError(config_path + ": searcher '" + config.searcher.name +
                        "' is not available in dettrial " DETTRIAL_VERSION_STRING "; use searcher name: single");
    if (config.slots_per_trial != 1)
      throw ConfigError(config_path + ": resources.slots_per_trial " + std::to_string(config.slots_per_trial) +
                        " needs distributed training, which is not available in dettrial " DETTRIAL_VERSION_STRING);
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
    Context context(config);
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
