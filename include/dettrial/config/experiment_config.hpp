// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's experiment configuration (the fields a single machine gives meaning to).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <algorithm>

#include <yaml-cpp/yaml.h>

#include "../error.hpp"
#include "../detail/yaml.hpp"
#include "units.hpp"
#include "hyperparameters.hpp"
#include "searcher_settings.hpp"
#include "precision.hpp"
#include "step_capture.hpp"
#include "tracking.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// When to checkpoint right after a validation (Determined's `checkpoint_policy`).
enum class CheckpointPolicy { best, all, none };

/// ZeRO's sharding of a data-parallel job's training state over its ranks (`optimizations.zero_stage`).
enum class ZeroStage {
  /// Every rank keeps the whole optimizer state (0).
  off = 0,
  /// Each rank keeps, and steps, the optimizer state of its 1/N of the parameters (1, ZeRO-1).
  optimizer_state = 1,
};

DETTRIAL_INLINE const char* to_string(CheckpointPolicy p);

/**
 * @brief An experiment configuration in Determined's YAML schema.
 *
 * Reads the fields that mean something without a cluster, with Determined's defaults, including the
 * legacy `searcher.max_steps` (counted in steps of `scheduling_unit` batches). Errors carry
 * `file:line:column`.
 */
class ExperimentConfig {
 public:
  std::string name;
  std::string description;
  /// The search space or values, as written (`hyperparameters`).
  detail::YamlMember hyperparameters{YAML::NodeType::Map};
  /// The free-form `data` section.
  detail::YamlMember data{YAML::NodeType::Map};

  /// The `searcher:` section.
  SearcherSettings searcher;
  /// Fields that mean something only on a Determined cluster (entrypoint, environment, ...): accepted
  /// and ignored, listed here for one warning.
  std::vector<std::string> ignored_fields;

  std::int64_t scheduling_unit = 100;
  std::int64_t records_per_epoch = 0;
  std::optional<TrainUnit> min_validation_period;
  std::optional<TrainUnit> min_checkpoint_period;
  bool perform_initial_validation = false;
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  std::int64_t max_restarts = 5;
  std::int64_t slots_per_trial = 1;
  std::int64_t aggregation_frequency = 1;
  /// `optimizations.mixed_precision`: autocast (and for fp16 a gradient scaler) around forward passes.
  Precision mixed_precision = Precision::fp32;
  /// `optimizations.step_capture` (dettrial's): none, or cuda_graph to capture the training step once
  /// and replay it (with `optimizations.capture_warmup_batches` eager batches first, default 3).
  StepCapture step_capture = capture::none{};
  bool average_aggregated_gradients = true;
  /// `optimizations.zero_stage` (dettrial's): 1 shards the optimizer state over a data-parallel
  /// job's ranks (ZeRO-1, docs/distributed.md); 0, the default, keeps it whole on every rank.
  ZeroStage zero_stage = ZeroStage::off;
  std::optional<std::uint64_t> experiment_seed;
  /// `reproducibility.deterministic` (dettrial's): LibTorch's deterministic algorithms on, cuDNN's
  /// autotuner off, so that runs with one seed are bit-identical on a GPU too. Unset: LibTorch's defaults.
  std::optional<bool> deterministic;
  /// `reproducibility.rank_invariant` (dettrial's): gradients summed over the micro-batches of an
  /// update in the data stream's order, and each micro-batch's random draws seeded by its place in
  /// the stream, so that the same per-slot batch and seed give bit-identical parameters on CPU
  /// whatever the ranks x aggregation_frequency layout; on a GPU it turns `deterministic` on unless
  /// set. See docs/distributed.md for its cost.
  bool rank_invariant = false;
  /// `checkpoint_storage`: where checkpoints go (`host_path`/`storage_path` of shared_fs, or
  /// `container_path` of directory storage; unset means the run's output directory) and how many are kept.
  struct CheckpointStorage {
    std::optional<std::filesystem::path> path;
    std::int64_t save_experiment_best = 0;
    std::int64_t save_trial_best = 1;
    std::int64_t save_trial_latest = 1;
    /// `async` (dettrial's): checkpoints are written by a background thread from a snapshot in host
    /// memory while training goes on; false writes them in the step loop.
    bool async = true;
  } checkpoint_storage;
  /// `profiling`, as Determined means it: `enabled` samples the machine's system metrics on a thread
  /// (CPU, memory, disk, network, and GPUs through NVML) for the whole run, and traces LibTorch's
  /// operators over the global batches `begin_on_batch` to `end_after_batch` (inclusive; unset:
  /// `default_traced_batches` batches, so that an open-ended section holds a bounded trace) as a
  /// Chrome trace; `sync_timings` waits for the GPU at each phase so that per-phase timings are
  /// the GPU's, not the host's launch times. `sampling_interval` (seconds, at least 0.1) and
  /// `samples_per_report` (dettrial's keys: the arguments of Determined's `profiler.on()`) set how
  /// often the machine is sampled and how many samples a report averages.
  struct Profiling {
    static constexpr std::int64_t default_traced_batches = 10;
    bool enabled = false;
    std::int64_t begin_on_batch = 0;
    std::optional<std::int64_t> end_after_batch;
    bool sync_timings = true;
    double sampling_interval = 1.0;
    std::int64_t samples_per_report = 10;
    /// The last batch traced: `end_after_batch`, or `default_traced_batches` from `begin_on_batch`.
    std::int64_t last_traced_batch() const { return end_after_batch.value_or(begin_on_batch + default_traced_batches - 1); }
  } profiling;
  /// `slurm.sbatch_args`: the options a search run with `--launcher slurm` gives srun for each
  /// trial's job (--partition, --account, --time, --gres, ...).
  std::vector<std::string> slurm_args;
  /// `mlflow` (dettrial's): the MLflow server runs are tracked in (`tracking_uri`), their MLflow
  /// experiment (`experiment_name`, default the config's `name`), run name and extra `tags`.
  MlflowSettings mlflow;

  /// The whole document, for `get_experiment_config()`.
  detail::YamlMember yaml{YAML::NodeType::Map};
  /// Where it came from (file name or "<string>"), for messages.
  std::string source = "<string>";

  // Out of line (compiled once in separate compilation): every trial's translation unit makes, copies
  // and ends one, and the members' own are many.
  DETTRIAL_INLINE ExperimentConfig();
  DETTRIAL_INLINE ExperimentConfig(const ExperimentConfig&);
  DETTRIAL_INLINE ExperimentConfig(ExperimentConfig&&) noexcept;
  DETTRIAL_INLINE ExperimentConfig& operator=(const ExperimentConfig&);
  DETTRIAL_INLINE ExperimentConfig& operator=(ExperimentConfig&&) noexcept;
  DETTRIAL_INLINE ~ExperimentConfig();

  /// Reads and parses a file; a missing or unreadable file is a ConfigError naming it.
  static ExperimentConfig load_file(const std::filesystem::path& path);

  /// Parses YAML text; `source` names it in messages.
  static ExperimentConfig parse(const std::string& text, std::string source = "<string>");

  static ExperimentConfig from_yaml(const YAML::Node& root, std::string source);

  /// The names of dettrial's searchers, for "did you mean" hints.
  static std::vector<std::string> searcher_names() {
    std::vector<std::string> names;
    for (SearcherKind kind : searcher_kinds) names.emplace_back(to_string(kind));
    return names;
  }

  /**
   * @brief The hyperparameters of the one trial this config describes: `const` entries and plain
   * values resolved, nested maps kept. A search space (int, double, log, categorical) has no single
   * value, so it is an error that names it.
   */
  Hyperparameters trial_hyperparameters() const { return Hyperparameters(resolve_constants(hyperparameters, ""), source); }

  /// True when the `data` section has a value at `path` (dotted for nested values).
  bool has_data(std::string_view path) const;
  /// The `data` section's node at `path`; a ConfigError naming `data.<path>` and the section's
  /// names when it is missing.
  YAML::Node data_node(std::string_view path) const;

 private:
  /// `map` with its `const` entries and plain values resolved (nested maps kept); a search space is
  /// an error that names it.
  YAML::Node resolve_constants(const YAML::Node& map, const std::string& prefix) const;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fstream>
#include <stdexcept>
#include <sstream>
#include "../detail/text.hpp"

// The reader of the document: one function per part, and the schema check. Internal: its one caller
// is ExperimentConfig::from_yaml.
namespace dettrial::detail::config_reader {

struct Reader {
  const std::string& source;
  /// The keys of the section being read (its Section::keys): reading any other is dettrial's own
  /// mistake, refused at once, so that the schema table and the readers cannot drift apart.
  const std::vector<std::string>* keys = nullptr;

  /// `map[key]`, `key` being one of the section's keys.
  YAML::Node node(const YAML::Node& map, const char* key) const {
    if (keys && std::find(keys->begin(), keys->end(), key) == keys->end())
      throw std::logic_error(std::string("dettrial's config reader reads '") + key +
                             "', which its schema table (detail::config_reader::schema) does not list in that section");
    return map[key];
  }
  template <class T>
  void read(const YAML::Node& map, const char* key, T& out) const {
    const YAML::Node value = node(map, key);
    if (!value || value.IsNull()) return;
    if (!detail::try_read(value, out))
      throw ConfigError(detail::where(value, source) + ": '" + key + "' is " + detail::describe(value) + ", which is not a " +
                        detail::type_name<T>());
  }
  /// A length (`{batches: N}`, `{records: N}`, `{epochs: N}`). With `step_batches` > 0, a plain
  /// integer is also accepted: Determined's legacy form, N steps of `step_batches` batches.
  std::optional<TrainUnit> length(const YAML::Node& map, const char* key, bool zero_means_never, std::int64_t step_batches = 0) const;
};

/**
 * @brief A part of the experiment config: its name (empty for the top level), the keys dettrial
 * reads in it, the keys only Determined's cluster reads there (accepted, and named in one warning),
 * and its reader, called when the part is present (a null one too).
 */
struct Section {
  const char* name;
  std::vector<std::string> keys;
  std::vector<std::string> cluster_keys;
  void (*read)(const YAML::Node& node, const Reader& r, ExperimentConfig& c);
};

/// The schema: every part dettrial knows, in the order from_yaml checks and reads them (the top
/// level first: the searcher reads its scheduling_unit). The one list from which both the unknown-key check and
/// the readers take their keys; the top level's keys include the other parts' names.
DETTRIAL_INLINE const std::vector<Section>& schema();

/**
 * @brief Every key must be one of the schema's: cluster-only ones are collected in `ignored` (one
 * warning), anything else is an error at its file:line:column with the nearest known name.
 */
DETTRIAL_INLINE void check_fields(const YAML::Node& root, const std::string& source, std::vector<std::string>& ignored);

DETTRIAL_INLINE void check_map(const YAML::Node& map, const std::string& prefix, const std::vector<std::string>& known,
                               const std::vector<std::string>& cluster, const std::string& source, std::vector<std::string>& ignored);

// One reader per part of the document, called by from_yaml through schema(), in its order.
DETTRIAL_INLINE void read_top_level(const YAML::Node& root, const Reader& r, ExperimentConfig& c);
DETTRIAL_INLINE void read_resources(const YAML::Node& res, const Reader& r, ExperimentConfig& c);
DETTRIAL_INLINE void read_optimizations(const YAML::Node& opt, const Reader& r, ExperimentConfig& c);
DETTRIAL_INLINE void read_reproducibility(const YAML::Node& rep, const Reader& r, ExperimentConfig& c);
DETTRIAL_INLINE void read_profiling(const YAML::Node& prof, const Reader& r, ExperimentConfig::Profiling& p);
DETTRIAL_INLINE void read_slurm(const YAML::Node& slurm, const Reader& r, std::vector<std::string>& args);
DETTRIAL_INLINE void read_checkpoint_storage(const YAML::Node& cs, const Reader& r, ExperimentConfig::CheckpointStorage& storage);
DETTRIAL_INLINE void read_searcher(const YAML::Node& s, const Reader& r, ExperimentConfig& c);
/// The searchers dettrial runs, and the names Determined removed.
DETTRIAL_INLINE void read_search_fields(const YAML::Node& s, const Reader& r, const std::string& name, SearcherSettings& out);
DETTRIAL_INLINE void read_mlflow(const YAML::Node& m, const Reader& r, MlflowSettings& mlflow);

}  // namespace dettrial::detail::config_reader

namespace dettrial {

DETTRIAL_INLINE ExperimentConfig::ExperimentConfig() = default;

DETTRIAL_INLINE bool ExperimentConfig::has_data(std::string_view path) const {
  return data.IsMap() && Hyperparameters(data, source).contains(path);
}

DETTRIAL_INLINE YAML::Node ExperimentConfig::data_node(std::string_view path) const {
  if (!has_data(path)) {
    std::string known;
    if (data.IsMap())
      for (const auto& kv : data) known += (known.empty() ? "" : ", ") + kv.first.Scalar();
    throw ConfigError("data." + std::string(path) + " is missing from " + source + "'s data section" +
                      (known.empty() ? " (it has none)" : " (it has: " + known + ")"));
  }
  return Hyperparameters(data, source).node(path);
}
DETTRIAL_INLINE ExperimentConfig::ExperimentConfig(const ExperimentConfig&) = default;
DETTRIAL_INLINE ExperimentConfig::ExperimentConfig(ExperimentConfig&&) noexcept = default;
DETTRIAL_INLINE ExperimentConfig& ExperimentConfig::operator=(const ExperimentConfig&) = default;
DETTRIAL_INLINE ExperimentConfig& ExperimentConfig::operator=(ExperimentConfig&&) noexcept = default;
DETTRIAL_INLINE ExperimentConfig::~ExperimentConfig() = default;

DETTRIAL_INLINE const char* to_string(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::best: return "best";
    case CheckpointPolicy::all: return "all";
    case CheckpointPolicy::none: return "none";
  }
  return "?";
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::load_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    throw ConfigError("cannot read experiment config '" + path.string() +
                      "': " + (exists ? "permission denied or not a file" : "no such file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path.string());
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::parse(const std::string& text, std::string source) {
  const YAML::Node root = detail::load_yaml_or_throw<ConfigError>(text, source);
  return from_yaml(root, std::move(source));
}

DETTRIAL_INLINE ExperimentConfig ExperimentConfig::from_yaml(const YAML::Node& root, std::string source) {
  namespace reader = detail::config_reader;
  ExperimentConfig c;
  c.source = std::move(source);
  if (!root.IsDefined() || root.IsNull()) throw ConfigError(c.source + ": the experiment config is empty");
  if (!root.IsMap()) throw ConfigError(detail::where(root, c.source) + ": the experiment config must be a map");
  c.yaml.reset(root);
  reader::check_fields(root, c.source, c.ignored_fields);
  for (const reader::Section& section : reader::schema()) {
    if (*section.name == '\0') continue;
    if (const YAML::Node node = root[section.name]; node && !node.IsNull() && !node.IsMap())
      throw ConfigError(detail::where(node, c.source) + ": '" + section.name + "' must be a map, found " + detail::describe(node));
  }
  for (const reader::Section& section : reader::schema()) {
    const YAML::Node node = *section.name == '\0' ? root : root[section.name];
    if (node) section.read(node, reader::Reader{c.source, &section.keys}, c);
  }
  if (c.mlflow.experiment_name.empty()) c.mlflow.experiment_name = c.name;
  YAML::Emitter text;  // the config as the run trains it (overrides applied): its MLflow artifact
  text << root;
  c.mlflow.config_text = std::string(text.c_str()) + "\n";
  return c;
}

DETTRIAL_INLINE void detail::config_reader::read_top_level(const YAML::Node& root, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  r.read(root, "name", c.name);
  r.read(root, "description", c.description);
  if (r.node(root, "hyperparameters")) {
    c.hyperparameters.reset(r.node(root, "hyperparameters"));
    if (!c.hyperparameters.IsMap() && !c.hyperparameters.IsNull())
      throw ConfigError(detail::where(c.hyperparameters, source) + ": 'hyperparameters' must be a map");
  }
  if (r.node(root, "data")) c.data.reset(r.node(root, "data"));
  r.read(root, "scheduling_unit", c.scheduling_unit);
  if (c.scheduling_unit < 1)
    throw ConfigError(detail::where(r.node(root, "scheduling_unit"), source) + ": scheduling_unit must be at least 1");
  r.read(root, "records_per_epoch", c.records_per_epoch);
  r.read(root, "perform_initial_validation", c.perform_initial_validation);
  r.read(root, "max_restarts", c.max_restarts);
  // The legacy integer form counts steps of scheduling_unit batches, as Determined reads it.
  c.min_validation_period = r.length(root, "min_validation_period", /*zero_means_never=*/true, c.scheduling_unit);
  c.min_checkpoint_period = r.length(root, "min_checkpoint_period", /*zero_means_never=*/true, c.scheduling_unit);
  if (const YAML::Node p = r.node(root, "checkpoint_policy"); p && !p.IsNull()) {  // null: the default, as the schema allows
    std::string s;
    r.read(root, "checkpoint_policy", s);
    if (s == "best") c.checkpoint_policy = CheckpointPolicy::best;
    else if (s == "all") c.checkpoint_policy = CheckpointPolicy::all;
    else if (s == "none") c.checkpoint_policy = CheckpointPolicy::none;
    else throw ConfigError(detail::where(p, source) + ": checkpoint_policy must be best, all or none, not '" + s + "'");
  }
}

DETTRIAL_INLINE void detail::config_reader::read_resources(const YAML::Node& res, const Reader& r, ExperimentConfig& c) {
  r.read(res, "slots_per_trial", c.slots_per_trial);
  if (c.slots_per_trial < 0)
    throw ConfigError(detail::where(r.node(res, "slots_per_trial"), r.source) + ": resources.slots_per_trial must not be negative");
  // 0 is a trial without a GPU slot on a cluster (the schema's minimum): here, one process.
  if (c.slots_per_trial == 0) c.slots_per_trial = 1;
}

DETTRIAL_INLINE void detail::config_reader::read_optimizations(const YAML::Node& opt, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  if (const YAML::Node mp = r.node(opt, "mixed_precision"); mp && !mp.IsNull()) {
    std::string text;
    r.read(opt, "mixed_precision", text);
    try {
      c.mixed_precision = parse_precision(text);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::where(mp, source) + ": optimizations." + e.what());
    }
  }
  r.read(opt, "aggregation_frequency", c.aggregation_frequency);
  if (c.aggregation_frequency < 1)
    throw ConfigError(detail::where(r.node(opt, "aggregation_frequency"), source) +
                      ": optimizations.aggregation_frequency must be at least 1");
  r.read(opt, "average_aggregated_gradients", c.average_aggregated_gradients);
  if (const YAML::Node sc = r.node(opt, "step_capture"); sc && !sc.IsNull()) {
    std::string text;
    std::int64_t warmup = capture::cuda_graph{}.warmup_batches;
    r.read(opt, "step_capture", text);
    r.read(opt, "capture_warmup_batches", warmup);
    try {
      c.step_capture = parse_step_capture(text, warmup);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::where(sc, source) + ": optimizations." + e.what());
    }
  } else if (r.node(opt, "capture_warmup_batches")) {
    throw ConfigError(detail::where(r.node(opt, "capture_warmup_batches"), source) +
                      ": optimizations.capture_warmup_batches is set but step_capture is not; set step_capture: cuda_graph");
  }
  if (const YAML::Node zero = r.node(opt, "zero_stage"); zero && !zero.IsNull()) {
    std::int64_t stage = 0;
    r.read(opt, "zero_stage", stage);
    if (stage == 2 || stage == 3)
      throw ConfigError(detail::where(zero, source) + ": optimizations.zero_stage " + std::to_string(stage) + " (sharded gradients" +
                        (stage == 3 ? std::string(" and parameters") : std::string()) +
                        ") is not in dettrial yet; 1 shards the optimizer state, 0 keeps it whole");
    if (stage != 0 && stage != 1)
      throw ConfigError(detail::where(zero, source) + ": optimizations.zero_stage must be 0 (off) or 1 (sharded optimizer state), not " +
                        std::to_string(stage));
    c.zero_stage = static_cast<ZeroStage>(stage);
  }
}

DETTRIAL_INLINE void detail::config_reader::read_reproducibility(const YAML::Node& rep, const Reader& r, ExperimentConfig& c) {
  if (r.node(rep, "experiment_seed") && !r.node(rep, "experiment_seed").IsNull()) {
    std::uint64_t seed = 0;
    r.read(rep, "experiment_seed", seed);
    c.experiment_seed = seed;
  }
  if (r.node(rep, "deterministic") && !r.node(rep, "deterministic").IsNull()) {
    bool on = false;
    r.read(rep, "deterministic", on);
    c.deterministic = on;
  }
  r.read(rep, "rank_invariant", c.rank_invariant);
}

DETTRIAL_INLINE void detail::config_reader::read_profiling(const YAML::Node& prof, const Reader& r, ExperimentConfig::Profiling& p) {
  if (!prof.IsMap()) return;  // null: the defaults
  r.read(prof, "enabled", p.enabled);
  r.read(prof, "begin_on_batch", p.begin_on_batch);
  r.read(prof, "sync_timings", p.sync_timings);
  r.read(prof, "sampling_interval", p.sampling_interval);
  r.read(prof, "samples_per_report", p.samples_per_report);
  if (!(p.sampling_interval >= 0.1))
    throw ConfigError(detail::where(r.node(prof, "sampling_interval"), r.source) + ": profiling.sampling_interval is " +
                      detail::number_text(p.sampling_interval) + " seconds; it must be at least 0.1 (as Determined's profiler requires)");
  if (p.samples_per_report < 1)
    throw ConfigError(detail::where(r.node(prof, "samples_per_report"), r.source) + ": profiling.samples_per_report is " +
                      std::to_string(p.samples_per_report) + "; it must be at least 1");
  if (p.begin_on_batch < 0)
    throw ConfigError(detail::where(r.node(prof, "begin_on_batch"), r.source) + ": profiling.begin_on_batch must not be negative");
  if (const YAML::Node end = r.node(prof, "end_after_batch"); end && !end.IsNull()) {
    std::int64_t last = 0;
    r.read(prof, "end_after_batch", last);
    if (last < p.begin_on_batch)
      throw ConfigError(detail::where(end, r.source) + ": profiling.end_after_batch (" + std::to_string(last) +
                        ") must not come before begin_on_batch (" + std::to_string(p.begin_on_batch) + ")");
    p.end_after_batch = last;
  }
}

DETTRIAL_INLINE void detail::config_reader::read_slurm(const YAML::Node& slurm, const Reader& r, std::vector<std::string>& args) {
  const std::string& source = r.source;
  const YAML::Node given = slurm.IsMap() ? r.node(slurm, "sbatch_args") : YAML::Node();
  if (!given || given.IsNull()) return;
  if (!given.IsSequence())
    throw ConfigError(detail::where(given, source) + ": slurm.sbatch_args must be a list of options, such as [--partition=gpu]");
  for (const auto& a : given) {
    if (!a.IsScalar())
      throw ConfigError(detail::where(a, source) + ": slurm.sbatch_args holds " + detail::describe(a) + "; each entry is one option");
    // dettrial starts each trial with srun, which takes sbatch's resource options but not these
    // (or reads them otherwise: srun's --output redirects the tasks', --wait is a timeout).
    const std::string option = a.Scalar().substr(0, a.Scalar().find('='));
    for (const char* batch_only :
         {"--array", "-a", "--wrap", "--parsable", "--wait", "-W", "--output", "-o", "--error", "-e", "--open-mode", "--test-only"})
      if (option == batch_only)
        throw ConfigError(detail::where(a, source) + ": slurm.sbatch_args: '" + a.Scalar() +
                          "' is an sbatch option that srun, which starts " +
                          "each trial, does not take the same way; leave it out (each trial's output goes to its log.txt)");
    args.push_back(a.Scalar());
  }
}

DETTRIAL_INLINE void detail::config_reader::read_mlflow(const YAML::Node& m, const Reader& r, MlflowSettings& mlflow) {
  if (!m.IsMap()) return;  // null: no MLflow
  r.read(m, "tracking_uri", mlflow.tracking_uri);
  r.read(m, "experiment_name", mlflow.experiment_name);
  r.read(m, "run_name", mlflow.run_name);
  const std::string& uri = mlflow.tracking_uri;
  if (!uri.empty() && uri.rfind("http://", 0) != 0 && uri.rfind("https://", 0) != 0)
    throw ConfigError(detail::where(r.node(m, "tracking_uri"), r.source) + ": mlflow.tracking_uri '" + uri +
                      "' is not a server's address (http:// or https://): dettrial logs to an MLflow server over its REST API");
  const YAML::Node tags = r.node(m, "tags");
  if (!tags || tags.IsNull()) return;
  if (!tags.IsMap())
    throw ConfigError(detail::where(tags, r.source) + ": mlflow.tags must be a map of names to values, found " + detail::describe(tags));
  for (const auto& kv : tags) {
    if (!kv.second.IsScalar())
      throw ConfigError(detail::where(kv.second, r.source) + ": mlflow.tags." + kv.first.Scalar() + " must be a single value, found " +
                        detail::describe(kv.second));
    mlflow.tags.emplace_back(kv.first.Scalar(), kv.second.Scalar());
  }
}

DETTRIAL_INLINE void detail::config_reader::read_checkpoint_storage(const YAML::Node& cs, const Reader& r,
                                                                    ExperimentConfig::CheckpointStorage& storage) {
  const std::pair<const char*, std::int64_t*> counts[] = {{"save_experiment_best", &storage.save_experiment_best},
                                                          {"save_trial_best", &storage.save_trial_best},
                                                          {"save_trial_latest", &storage.save_trial_latest}};
  for (const auto& [key, field_ptr] : counts) {
    std::int64_t& field = *field_ptr;
    r.read(cs, key, field);
    if (field < 0) throw ConfigError(detail::where(r.node(cs, key), r.source) + ": checkpoint_storage." + key + " must not be negative");
  }
  if (const YAML::Node type = r.node(cs, "type"); type && type.IsScalar() && type.Scalar() != "shared_fs" && type.Scalar() != "directory")
    throw ConfigError(detail::where(type, r.source) + ": checkpoint_storage type '" + type.Scalar() +
                      "' is not one dettrial writes (shared_fs or directory, on a local or mounted file system)");
  r.read(cs, "async", storage.async);
  std::string host_path, storage_path, container_path;
  r.read(cs, "host_path", host_path);
  r.read(cs, "storage_path", storage_path);
  r.read(cs, "container_path", container_path);
  if (!host_path.empty())
    storage.path = storage_path.empty() ? std::filesystem::path(host_path) : std::filesystem::path(host_path) / storage_path;
  else if (!container_path.empty()) storage.path = std::filesystem::path(container_path);
}

DETTRIAL_INLINE void detail::config_reader::read_searcher(const YAML::Node& s, const Reader& r, ExperimentConfig& c) {
  const std::string& source = r.source;
  if (!s.IsMap()) throw ConfigError(detail::where(s, source) + ": 'searcher' must be a map");
  std::string name(to_string(SearcherKind::single));
  r.read(s, "name", name);
  r.read(s, "metric", c.searcher.metric);
  r.read(s, "smaller_is_better", c.searcher.smaller_is_better);
  if (const YAML::Node ml = r.node(s, "max_length"); ml && ml.IsScalar()) {
    // The schema's unitless form (searcher-length.json: an integer), read as batches.
    std::int64_t n = 0;
    r.read(s, "max_length", n);
    if (n < 0) throw ConfigError(detail::where(ml, source) + ": searcher.max_length must not be negative");
    c.searcher.max_length = Batch(n);
  } else if (r.node(s, "max_length")) {
    c.searcher.max_length = r.length(s, "max_length", /*zero_means_never=*/false);
  } else if (r.node(s, "max_steps")) {
    std::int64_t steps = 0;
    r.read(s, "max_steps", steps);
    if (steps < 0) throw ConfigError(detail::where(r.node(s, "max_steps"), source) + ": searcher.max_steps must not be negative");
    c.searcher.max_length = Batch(steps * c.scheduling_unit);
  }
  read_search_fields(s, r, name, c.searcher);
}

DETTRIAL_INLINE void detail::config_reader::read_search_fields(const YAML::Node& s, const Reader& r, const std::string& name,
                                                               SearcherSettings& out) {
  const std::string& source = r.source;
  if (name == "adaptive" || name == "adaptive_simple" || name == "sync_halving")
    throw ConfigError(detail::where(r.node(s, "name"), source) + ": searcher '" + name +
                      "' was removed from Determined; use adaptive_asha");
  if (name != "async_halving" && !searcher_kind_named(name))
    throw ConfigError(detail::where(r.node(s, "name"), source) + ": unknown searcher '" + name + "'" +
                      detail::suggestion(name, ExperimentConfig::searcher_names()) +
                      " (dettrial runs single, random, grid and adaptive_asha)");
  r.read(s, "max_trials", out.max_trials);
  r.read(s, "max_concurrent_trials", out.max_concurrent_trials);
  r.read(s, "time_metric", out.time_metric);
  r.read(s, "max_time", out.max_time);
  r.read(s, "divisor", out.divisor);
  r.read(s, "max_rungs", out.max_rungs);
  r.read(s, "num_rungs", out.max_rungs);  // async_halving
  r.read(s, "mode", out.mode);
  if (const YAML::Node b = r.node(s, "bracket_rungs"); b && !b.IsNull()) {
    if (!b.IsSequence()) throw ConfigError(detail::where(b, source) + ": searcher.bracket_rungs must be a list of rung counts");
    for (const auto& x : b) out.bracket_rungs.push_back(x.as<std::int64_t>());
  }
  out.kind = name == "async_halving" ? SearcherKind::adaptive_asha : *searcher_kind_named(name);
  if (name == "async_halving") out.bracket_rungs = {out.max_rungs};
  auto positive = [&](const char* key, double value) {
    if (r.node(s, key) && !(value >= 1))
      throw ConfigError(detail::where(r.node(s, key), source) + ": searcher." + key + " must be at least 1");
  };
  positive("max_trials", static_cast<double>(out.max_trials));
  positive("max_rungs", static_cast<double>(out.max_rungs));
  if (out.max_concurrent_trials < 0)
    throw ConfigError(detail::where(r.node(s, "max_concurrent_trials"), source) + ": searcher.max_concurrent_trials must not be negative");
  if (r.node(s, "divisor") && !(out.divisor > 1))
    throw ConfigError(detail::where(r.node(s, "divisor"), source) + ": searcher.divisor must be greater than 1");
  if ((out.kind == SearcherKind::random || out.kind == SearcherKind::adaptive_asha) && !r.node(s, "max_trials"))
    throw ConfigError(detail::where(s, source) + ": searcher '" + std::string(out.name()) + "' needs max_trials");
  if (out.kind == SearcherKind::adaptive_asha) {
    // Determined needs time_metric and max_time; its deprecated max_length stands for them.
    if (!r.node(s, "max_time") && out.max_length) {
      out.max_time = out.max_length->value();
      out.time_metric = out.max_length->unit() == Unit::epochs ? "epochs" : "batches";
    }
    if (out.max_time < 1)
      throw ConfigError(detail::where(s, source) + ": searcher 'adaptive_asha' needs max_time (and time_metric, default batches)");
    // Each trial is given its rung's length as searcher.max_length in time_metric's unit: a metric
    // the trial reports of its own cannot be a length it trains (nor can it for Determined's
    // PyTorchTrial, whose lengths are batches, records or epochs).
    if (out.time_metric != "batches" && out.time_metric != "records" && out.time_metric != "epochs")
      throw ConfigError(detail::where(r.node(s, "time_metric") ? r.node(s, "time_metric") : s, source) + ": searcher.time_metric '" +
                        out.time_metric +
                        "' is not batches, records or epochs: each trial trains its rung's length in that unit, so ASHA's time must "
                        "be counted in one of them");
  }
}

DETTRIAL_INLINE const std::vector<detail::config_reader::Section>& detail::config_reader::schema() {
  static const std::vector<Section> sections = [] {
    std::vector<Section> s = {
        {"",
         {"name", "description", "hyperparameters", "records_per_epoch", "min_validation_period", "min_checkpoint_period",
          "scheduling_unit", "perform_initial_validation", "checkpoint_policy", "max_restarts", "data"},
         {"entrypoint", "environment", "bind_mounts", "labels", "project", "workspace", "debug", "tensorboard_storage", "pbs",
          "log_policies", "retention_policy", "integrations", "data_layer", "preemption_timeout", "security", "internal", "notes"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_top_level(n, r, c); }},
        // budget, train_stragglers: the removed searchers' fields (refused by name, with the searcher); unit: custom's.
        {"searcher",
         {"name", "metric", "smaller_is_better", "max_length", "max_steps", "max_trials", "max_concurrent_trials", "time_metric",
          "max_time", "divisor", "max_rungs", "num_rungs", "mode", "bracket_rungs"},
         {"source_trial_id", "source_checkpoint_uuid", "stop_once", "budget", "train_stragglers", "unit"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_searcher(n, r, c); }},
        {"resources",
         {"slots_per_trial"},
         {"slots", "resource_pool", "max_slots", "priority", "weight", "shm_size", "devices", "native_parallel", "is_single_node",
          "agent_label"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_resources(n, r, c); }},
        {"optimizations",
         {"aggregation_frequency", "average_aggregated_gradients", "mixed_precision", "step_capture", "capture_warmup_batches",
          "zero_stage"},
         {"average_training_metrics", "gradient_compression", "tensor_fusion_threshold", "tensor_fusion_cycle_time",
          "auto_tune_tensor_fusion", "grad_updates_size_file"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_optimizations(n, r, c); }},
        {"reproducibility",
         {"experiment_seed", "deterministic", "rank_invariant"},
         {},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_reproducibility(n, r, c); }},
        {"profiling",
         {"enabled", "begin_on_batch", "end_after_batch", "sync_timings", "sampling_interval", "samples_per_report"},
         {},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_profiling(n, r, c.profiling); }},
        {"slurm",
         {"sbatch_args"},
         {"slots_per_node", "gpu_type"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_slurm(n, r, c.slurm_args); }},
        {"mlflow",
         {"tracking_uri", "experiment_name", "run_name", "tags"},
         {},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_mlflow(n, r, c.mlflow); }},
        // Cloud storage, and shared_fs's legacy checkpoint_path / tensorboard_path (paths inside a task's container).
        {"checkpoint_storage",
         {"type", "host_path", "storage_path", "container_path", "propagation", "save_experiment_best", "save_trial_best",
          "save_trial_latest", "async"},
         {"checkpoint_path", "tensorboard_path", "bucket", "access_key", "secret_key", "endpoint_url", "prefix", "region", "credentials",
          "credential", "user", "account_url", "connection_string", "container"},
         [](const YAML::Node& n, const Reader& r, ExperimentConfig& c) { read_checkpoint_storage(n, r, c.checkpoint_storage); }},
    };
    // The top level's keys include the other parts' names.
    for (std::size_t i = 1; i < s.size(); ++i) s.front().keys.emplace_back(s[i].name);
    return s;
  }();
  return sections;
}

DETTRIAL_INLINE void detail::config_reader::check_fields(const YAML::Node& root, const std::string& source,
                                                         std::vector<std::string>& ignored) {
  for (const Section& section : schema()) {
    if (*section.name == '\0') {
      check_map(root, "", section.keys, section.cluster_keys, source, ignored);
    } else if (const YAML::Node node = root[section.name]; node && node.IsMap()) {
      check_map(node, std::string(section.name) + ".", section.keys, section.cluster_keys, source, ignored);
    }
  }
}

DETTRIAL_INLINE void detail::config_reader::check_map(const YAML::Node& map, const std::string& prefix,
                                                      const std::vector<std::string>& known, const std::vector<std::string>& cluster,
                                                      const std::string& source, std::vector<std::string>& ignored) {
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (std::find(cluster.begin(), cluster.end(), key) != cluster.end()) {
      ignored.push_back(prefix + key);
      continue;
    }
    std::vector<std::string> all = known;
    all.insert(all.end(), cluster.begin(), cluster.end());
    throw ConfigError(detail::where(kv.first, source) + ": unknown field '" + prefix + key + "'" + detail::suggestion(key, all));
  }
}

DETTRIAL_INLINE YAML::Node ExperimentConfig::resolve_constants(const YAML::Node& map, const std::string& prefix) const {
  YAML::Node out(YAML::NodeType::Map);
  if (!map.IsDefined() || map.IsNull()) return out;
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (v.IsMap() && v["type"]) {
      const std::string type = v["type"].Scalar();
      if (type == "const") {
        if (!v["val"]) throw ConfigError(detail::where(v, source) + ": hyperparameter '" + prefix + key + "' of type const has no 'val'");
        out[key] = v["val"];
      } else if (type == "int" || type == "double" || type == "log" || type == "categorical") {
        throw ConfigError(detail::where(v, source) + ": hyperparameter '" + prefix + key + "' is a search space (type: " + type +
                          "), which has no single value; give it a value (type: const) to train one trial");
      } else {
        throw ConfigError(detail::where(v["type"], source) + ": hyperparameter '" + prefix + key + "' has unknown type '" + type +
                          "' (expected const, int, double, log or categorical)");
      }
    } else if (v.IsMap()) {
      out[key] = resolve_constants(v, prefix + key + ".");
    } else {
      out[key] = v;
    }
  }
  return out;
}

DETTRIAL_INLINE std::optional<TrainUnit> detail::config_reader::Reader::length(const YAML::Node& map, const char* key,
                                                                               bool zero_means_never, std::int64_t step_batches) const {
  const YAML::Node node = map[key];
  if (!node || node.IsNull()) return std::nullopt;
  if (step_batches > 0 && node.IsScalar()) {
    std::int64_t steps = 0;
    if (!detail::try_read(node, steps) || steps < 0)
      throw ConfigError(detail::where(node, source) + ": '" + key + "' is " + detail::describe(node) +
                        "; give a length such as {batches: 1000}, or a non-negative number of steps of scheduling_unit (" +
                        std::to_string(step_batches) + ") batches");
    if (zero_means_never && steps < 1) return TrainUnit(Unit::batches, TrainUnit::never_value);
    return TrainUnit(Unit::batches, steps * step_batches);
  }
  if (!node.IsMap() || node.size() != 1)
    throw ConfigError(detail::where(node, source) + ": '" + key +
                      "' must be a map with exactly one of batches, records or epochs, e.g. {batches: 1000}" +
                      (step_batches > 0 ? ", or a number of steps of scheduling_unit batches" : ""));
  const std::string unit_name = node.begin()->first.Scalar();
  Unit unit;
  if (unit_name == "batches") unit = Unit::batches;
  else if (unit_name == "epochs") unit = Unit::epochs;
  else if (unit_name == "records") unit = Unit::records;
  else
    throw ConfigError(detail::where(node.begin()->first, source) + ": '" + key + "' has unit '" + unit_name +
                      "'; expected batches, records or epochs");
  std::int64_t value = 0;
  if (!detail::try_read(node.begin()->second, value) || value < 0)
    throw ConfigError(detail::where(node.begin()->second, source) + ": '" + key + "." + unit_name +
                      "' must be a non-negative integer, found " + detail::describe(node.begin()->second));
  // Determined maps a configured period below 1 to "never".
  if (zero_means_never && value < 1) return TrainUnit(unit, TrainUnit::never_value);
  return TrainUnit(unit, value);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
