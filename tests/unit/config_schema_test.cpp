// Experiment configs against Determined's own schema test cases (determined-ai/determined,
// schemas/test_cases/v0/*.yaml, at c1e9c6d7b821ef246d612bb9922f7fb1b58dcf2e, 2025-03-20), kept as data
// in tests/unit/config_schema/: every config they call valid is accepted (valid.yaml), those dettrial
// deliberately refuses are refused with their reason (refused.yaml), and those they call invalid are
// ConfigErrors (invalid.yaml). Cases that need checks of their own follow, in code.

// LibTorch before doctest (as the precompiled header has it): Debian's LibTorch brings glog, whose
// CHECK macro must not be the one the test cases use.
#include <dettrial/search.hpp>

#include <doctest/doctest.h>

#include "source_dir.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

using namespace dettrial;

namespace {

// One case of a file in tests/unit/config_schema/: its name there, the config's text, and (for the
// refused ones) what the error must say.
struct SchemaCase {
  std::string name, yaml, reason;
};

std::vector<SchemaCase> schema_cases(const char* file) {
  const std::filesystem::path path = std::filesystem::path(test::tests_source_dir()) / "unit" / "config_schema" / file;
  std::vector<SchemaCase> cases;
  for (const YAML::Node& c : YAML::LoadFile(path.string()))
    cases.push_back({c["name"].as<std::string>(), c["config"].as<std::string>(), c["reason"] ? c["reason"].as<std::string>() : ""});
  return cases;
}

}  // namespace

TEST_CASE("every experiment config Determined's schema test cases call valid is accepted") {
  const std::vector<SchemaCase> valid_cases = schema_cases("valid.yaml");
  CHECK(valid_cases.size() == 75);  // every one of the file, none lost to a YAML slip
  for (const SchemaCase& c : valid_cases) {
    INFO("case: " << c.name);
    std::optional<ExperimentConfig> config;
    CHECK_NOTHROW(config.emplace(ExperimentConfig::parse(c.yaml, c.name)));
    if (!config) continue;
    // The search space reads too (lists are constants, as in Determined's hyperparameter.json), and a grid
    // searcher's points exist (every int, double and log axis has its count).
    CHECK_NOTHROW(HyperparameterSpace(config->hyperparameters, config->source));
    if (config->searcher.kind == SearcherKind::grid) {
      CHECK_NOTHROW(HyperparameterSpace(config->hyperparameters, config->source).grid());
    }
  }
}

TEST_CASE("schema-valid configs that dettrial deliberately refuses are refused with their reason") {
  const std::vector<SchemaCase> refused = schema_cases("refused.yaml");
  CHECK(refused.size() == 20);
  for (const auto& c : refused) {
    INFO("case: " << c.name);
    CHECK_THROWS_WITH_AS(ExperimentConfig::parse(c.yaml, c.name), doctest::Contains(c.reason.c_str()), ConfigError);
  }
}

TEST_CASE("configs Determined's schema test cases call invalid are ConfigErrors") {
  const std::vector<SchemaCase> invalid_configs = schema_cases("invalid.yaml");
  CHECK(invalid_configs.size() == 24);
  for (const SchemaCase& c : invalid_configs) {
    INFO("case: " << c.name);
    CHECK_THROWS_AS(ExperimentConfig::parse(c.yaml, c.name), ConfigError);
  }

  // Hyperparameter spaces are checked where they are read (the searcher's space), not by parse.
  {
    INFO("case: experiment.yaml: check grid conditional (invalid)");
    const ExperimentConfig c = ExperimentConfig::parse(R"(
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
      count: 2
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
searcher:
  name: grid
  metric: loss
)",
                                                       "grid.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source).grid(),
                         doctest::Contains("needs 'count' for hyperparameter 'dict_hparam.log_hparam'"), ConfigError);
  }
  {
    INFO("case: misc.yaml: check counts for grid (invalid)");
    const ExperimentConfig c = ExperimentConfig::parse(R"(
searcher: {name: grid, metric: loss}
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  a: 1
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
)",
                                                       "grid.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source).grid(),
                         doctest::Contains("needs 'count' for hyperparameter 'dict_hparam.double_hparam'"), ConfigError);
  }
  {
    INFO("case: hyperparameters.yaml: nested hyperparameters (invalid, to show paths in errors)");
    const ExperimentConfig c = ExperimentConfig::parse(
        "searcher: {name: random, metric: loss, max_trials: 2}\nhyperparameters:\n  one:\n    a:\n      type: categorical\n",
        "nested.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source),
                         doctest::Contains("hyperparameter 'one.a' of type categorical needs a non-empty list 'vals'"), ConfigError);
  }
  {
    INFO("case: compare_properties.yaml: a<b compareProperties (invalid, equal) and (invalid, nonequal)");
    for (const char* maxval : {"2", "1"}) {
      INFO("maxval: " << maxval);
      const ExperimentConfig c = ExperimentConfig::parse(
          std::string("searcher: {name: random, metric: loss, max_trials: 2}\nhyperparameters:\n  h: {type: int, minval: 2, maxval: ") +
              maxval + "}\n",
          "int.yaml");
      CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source), doctest::Contains("hyperparameter 'h' needs minval < maxval"),
                           ConfigError);
    }
  }
}
