// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The second stage of a trial program: from its command line to a `RunPlan`, the config it
/// trains (its file, the overrides, one trial drawn from a search space) and what it continues.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <yaml-cpp/yaml.h>

#include "../layout.hpp"
#include "../checkpoint/detail/load_data.hpp"
#include "../checkpoint/storage.hpp"
#include "../config/experiment_config.hpp"
#include "../detail/yaml.hpp"
#include "../process/launch_environment.hpp"
#include "../error.hpp"
#include "../search/hyperparameter_space.hpp"
#include "command_line.hpp"
#include "../detail/linkage.hpp"

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
