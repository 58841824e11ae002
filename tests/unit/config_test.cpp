// Experiment configs and hyperparameters: Determined's schema and defaults, typed reads, and errors
// that name the file, line, key and value.
#include <doctest/doctest.h>

#include <fstream>

#include <dettrial/search.hpp>
#include "applied_context.hpp"

using namespace dettrial;

TEST_CASE("hyperparameters: typed, nested, and errors that name the key and the value") {
  const auto hp = Hyperparameters::parse(
      "learning_rate: 0.001\nglobal_batch_size: 64\nname: net\npretrained: True\n"
      "optimizer:\n  momentum: 0.9\n  betas: [0.9, 0.999]\nstart-epoch: 0\n",
      "const.yaml");
  CHECK(hp.get<double>("learning_rate") == 0.001);
  CHECK(hp.get<int>("global_batch_size") == 64);
  CHECK(hp.get<double>("global_batch_size") == 64.0);
  CHECK(hp.get<std::string>("name") == "net");
  CHECK(hp.get<bool>("pretrained"));
  CHECK(hp.get<double>("optimizer.momentum") == 0.9);
  CHECK(hp.get<std::vector<double>>("optimizer.betas") == std::vector<double>{0.9, 0.999});
  CHECK(hp.nested("optimizer").get<double>("momentum") == 0.9);
  CHECK(hp.get<int>("start-epoch") == 0);
  CHECK(hp.get_or<double>("missing", 2.5) == 2.5);
  CHECK(hp.names() == std::vector<std::string>{"learning_rate", "global_batch_size", "name", "pretrained", "optimizer", "start-epoch"});

  CHECK_THROWS_WITH_AS(hp.get<double>("dropout"),
                       "hyperparameter 'dropout' is missing from const.yaml (it defines: learning_rate, global_batch_size, "
                       "name, pretrained, optimizer, start-epoch)",
                       HyperparameterError);
  CHECK_THROWS_WITH_AS(hp.get<double>("optimizer.beta1"), doctest::Contains("'optimizer.beta1' is missing"), HyperparameterError);
  CHECK_THROWS_WITH_AS(hp.get<int>("learning_rate"), "const.yaml:1:16: hyperparameter 'learning_rate' is '0.001', which is not a integer",
                       HyperparameterError);
  CHECK_THROWS_WITH_AS(hp.get<double>("name"), "const.yaml:3:7: hyperparameter 'name' is 'net', which is not a number",
                       HyperparameterError);
  CHECK_THROWS_WITH_AS(hp.get<double>("optimizer"), doctest::Contains("hyperparameter 'optimizer' is a map, which is not a number"),
                       HyperparameterError);
  CHECK_THROWS_WITH_AS(hp.get<bool>("name"), doctest::Contains("which is not a bool"), HyperparameterError);
  CHECK_THROWS_WITH_AS(Hyperparameters::parse("a: [1, 2", "x.yaml"), doctest::Contains("x.yaml:1:"), HyperparameterError);
}

TEST_CASE("the data section: typed reads with defaults, and errors that name data.<key> and where it was written") {
  Context context(
      ExperimentConfig::parse("data:\n  dir: /srv/mnist\n  holdout: 500\n  on_device: true\n  crop: {size: 224}\n"
                              "  mean: 0.5\n",
                              "exp.yaml"));
  CHECK(context.get_data<std::string>("dir") == "/srv/mnist");
  CHECK(context.get_data<std::int64_t>("holdout") == 500);
  CHECK(context.get_data<double>("holdout") == 500.0);
  CHECK(context.get_data<bool>("on_device"));
  CHECK(context.get_data<int>("crop.size") == 224);
  CHECK(context.get_data<float>("mean") == 0.5f);
  CHECK(context.get_data_or<std::string>("train_split", "train") == "train");
  CHECK(context.get_data_or<std::int64_t>("holdout", 0) == 500);
  CHECK(context.get_data_or<std::vector<int>>("sizes", {1, 2}) == std::vector<int>{1, 2});  // a type compiled where it is used
  CHECK(context.has_data("crop.size"));
  CHECK_FALSE(context.has_data("crop.ratio"));

  CHECK_THROWS_WITH_AS(context.get_data<std::string>("split"),
                       "data.split is missing from exp.yaml's data section (it has: dir, holdout, on_device, crop, mean)", ConfigError);
  CHECK_THROWS_WITH_AS(context.get_data<int>("dir"), "exp.yaml:2:8: data.dir is '/srv/mnist', which is not a integer", ConfigError);
  CHECK_THROWS_WITH_AS(context.get_data_or<bool>("holdout", false), "exp.yaml:3:12: data.holdout is '500', which is not a bool",
                       ConfigError);
  CHECK_THROWS_WITH_AS(context.get_data<double>("crop"), doctest::Contains("data.crop is a map, which is not a number"), ConfigError);
  Context empty(ExperimentConfig::parse("name: x\n", "bare.yaml"));
  CHECK(empty.get_data_or<int>("workers", 3) == 3);
  CHECK_THROWS_WITH_AS(empty.get_data<int>("workers"), "data.workers is missing from bare.yaml's data section (it has none)", ConfigError);
}

TEST_CASE("the seed's const.yaml: legacy max_steps in steps of scheduling_unit, Determined's defaults") {
  const auto c = ExperimentConfig::parse(R"(
description: mnist_pytorch_const
hyperparameters:
    learning_rate: 0.001
    dropout: 0.5
    global_batch_size: 64
    n_filters1: 40
    n_filters2: 40
searcher:
    name: single
    metric: validation_error
    max_steps: 20
    smaller_is_better: true
entrypoint: model_def:MNistTrial
)",
                                         "const.yaml");
  CHECK(c.description == "mnist_pytorch_const");
  REQUIRE(c.searcher.max_length);
  CHECK(*c.searcher.max_length == TrainUnit(Batch(2000)));
  CHECK(c.searcher.metric == "validation_error");
  CHECK(c.scheduling_unit == 100);
  CHECK(c.checkpoint_policy == CheckpointPolicy::best);
  CHECK(c.max_restarts == 5);
  CHECK(c.aggregation_frequency == 1);
  CHECK(c.average_aggregated_gradients);
  CHECK_FALSE(c.perform_initial_validation);
  CHECK_FALSE(c.experiment_seed);
  const FitOptions o = FitOptions::from_config(c);
  CHECK(o.reporting_period == TrainUnit(Batch(100)));
  CHECK(o.validation_period.is_never());
  CHECK(o.searcher_metric == "validation_error");
  CHECK(c.trial_hyperparameters().get<int>("n_filters2") == 40);
}

TEST_CASE("config fields map to fit options, const hyperparameters resolve, search spaces are named") {
  const auto c = ExperimentConfig::parse(R"(
hyperparameters:
  lr: {type: const, val: 0.5}
  arch:
    depth: 3
    width: {type: const, val: 16}
searcher: {name: single, metric: acc, smaller_is_better: false, max_length: {epochs: 4}}
min_validation_period: {batches: 50}
min_checkpoint_period: {records: 0}
scheduling_unit: 10
perform_initial_validation: true
checkpoint_policy: all
optimizations: {aggregation_frequency: 4, average_aggregated_gradients: false}
reproducibility: {experiment_seed: 77}
resources: {slots_per_trial: 1}
data: {dir: /data}
)");
  CHECK(*c.searcher.max_length == TrainUnit(Epoch(4)));
  CHECK(c.min_validation_period->value() == 50);
  CHECK(c.min_checkpoint_period->is_never());  // Determined: a period below 1 means never
  CHECK(c.aggregation_frequency == 4);
  CHECK_FALSE(c.average_aggregated_gradients);
  CHECK(*c.experiment_seed == 77);
  CHECK(c.data["dir"].as<std::string>() == "/data");
  const auto hp = c.trial_hyperparameters();
  CHECK(hp.get<double>("lr") == 0.5);
  CHECK(hp.get<int>("arch.width") == 16);
  CHECK(hp.get<int>("arch.depth") == 3);
  const FitOptions o = FitOptions::from_config(c);
  CHECK(o.step_zero_validation);
  CHECK(o.checkpoint_policy == CheckpointPolicy::all);
  CHECK_FALSE(o.smaller_is_better);
  CHECK(o.reporting_period == TrainUnit(Batch(10)));

  test::Context a(c, ContextOptions{});
  test::Context b(c, ContextOptions{});
  CHECK(a.get_trial_seed() == b.get_trial_seed());  // derived from experiment_seed
  CHECK(a.aggregation_frequency() == 4);

  const auto search =
      ExperimentConfig::parse("hyperparameters:\n  lr:\n    type: log\n    minval: -4\n    maxval: -1\n    base: 10\n", "adaptive.yaml");
  CHECK_THROWS_WITH_AS(search.trial_hyperparameters(),
                       doctest::Contains("adaptive.yaml:3:5: hyperparameter 'lr' is a search space (type: log)"), ConfigError);
}

TEST_CASE("legacy integer periods count steps of scheduling_unit batches, as Determined reads them") {
  // The TFKerasTrial tutorial's const.yaml, unchanged.
  const auto c = ExperimentConfig::parse(R"(description: mnist_keras_const_simple
hyperparameters:
    global_batch_size: 32
searcher:
    name: single
    metric: val_accuracy
    max_steps: 40
min_validation_period: 10
entrypoint: model_def:MNISTTrial
)",
                                         "const.yaml");
  REQUIRE(c.min_validation_period);
  CHECK(*c.min_validation_period == TrainUnit(Batch(1000)));
  CHECK(*c.searcher.max_length == TrainUnit(Batch(4000)));
  CHECK_FALSE(c.min_checkpoint_period);
  const auto seven = ExperimentConfig::parse("scheduling_unit: 7\nmin_validation_period: 3\nmin_checkpoint_period: 0\n");
  CHECK(*seven.min_validation_period == TrainUnit(Batch(21)));
  CHECK(seven.min_checkpoint_period->is_never());
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("min_validation_period: -2\n", "p.yaml"),
                       doctest::Contains("p.yaml:1:24: 'min_validation_period' is '-2'; give a length such as {batches: 1000}"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("min_checkpoint_period: often\n", "p.yaml"),
                       doctest::Contains("'min_checkpoint_period' is 'often'"), ConfigError);
  // The schema's unitless searcher.max_length (an integer) counts batches; a negative one is refused.
  CHECK(*ExperimentConfig::parse("searcher: {max_length: 40}\n", "p.yaml").searcher.max_length == TrainUnit(Batch(40)));
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {max_length: -4}\n", "p.yaml"),
                       doctest::Contains("searcher.max_length must not be negative"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {max_length: {batches: 4, epochs: 1}}\n", "p.yaml"),
                       doctest::Contains("'max_length' must be a map with exactly one of batches, records or epochs"), ConfigError);
}

TEST_CASE("shared_fs's legacy checkpoint_path and tensorboard_path are accepted as cluster-only fields") {
  const auto c = ExperimentConfig::parse(R"(checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  checkpoint_path: determined-checkpoint
  tensorboard_path: determined-tensorboard
)");
  CHECK(c.ignored_fields == std::vector<std::string>{"checkpoint_storage.checkpoint_path", "checkpoint_storage.tensorboard_path"});
  CHECK(c.checkpoint_storage.path == std::filesystem::path("/tmp"));
}

TEST_CASE("reproducibility.deterministic turns LibTorch's deterministic switches on, and off again") {
  const ExperimentConfig on = ExperimentConfig::parse("reproducibility: {experiment_seed: 3, deterministic: true}\n", "d.yaml");
  REQUIRE(on.deterministic);
  CHECK(*on.deterministic);
  CHECK_FALSE(ExperimentConfig::parse("reproducibility: {experiment_seed: 3}\n", "d.yaml").deterministic);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("reproducibility: {deterministic: sure}\n", "d.yaml"),
                       doctest::Contains("d.yaml:1:34: 'deterministic' is 'sure'"), ConfigError);
  {
    test::Context context(on);
    CHECK(at::globalContext().deterministicAlgorithms());
    CHECK(at::globalContext().deterministicCuDNN());
    CHECK_FALSE(at::globalContext().benchmarkCuDNN());
    CHECK(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
  }
  test::Context off(ExperimentConfig::parse("reproducibility: {deterministic: false}\n", "d.yaml"));
  CHECK_FALSE(at::globalContext().deterministicAlgorithms());
  CHECK_FALSE(at::globalContext().deterministicCuDNN());
}

TEST_CASE("bad configs: syntax errors with their line, wrong types and values with file:line:column") {
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher:\n  name: single\n   metric: x\n", "bad.yaml"), doctest::Contains("bad.yaml:3:"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher:\n  name: single\n   metric: x\n", "bad.yaml"),
                       doctest::Contains("YAML syntax error"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("scheduling_unit: lots\n", "c.yaml"),
                       "c.yaml:1:18: 'scheduling_unit' is 'lots', which is not a integer", ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("scheduling_unit: 0\n", "c.yaml"), doctest::Contains("at least 1"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher:\n  max_length: {steps: 3}\n", "c.yaml"),
                       "c.yaml:2:16: 'max_length' has unit 'steps'; expected batches, records or epochs", ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher:\n  max_length: {batches: -3}\n", "c.yaml"),
                       doctest::Contains("'max_length.batches' must be a non-negative integer"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("checkpoint_policy: sometimes\n", "c.yaml"),
                       doctest::Contains("checkpoint_policy must be best, all or none, not 'sometimes'"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("optimizations: {aggregation_frequency: 0}\n", "c.yaml"),
                       doctest::Contains("aggregation_frequency must be at least 1"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("", "empty.yaml"), "empty.yaml: the experiment config is empty", ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::load_file("/nonexistent/const.yaml"),
                       "cannot read experiment config '/nonexistent/const.yaml': no such file", ConfigError);
}

TEST_CASE("train units: Determined's boundary rule") {
  CHECK_FALSE(Batch(5).reached(0));
  CHECK(Batch(5).reached(5));
  CHECK(Batch(5).reached(10));
  CHECK_FALSE(Batch(5).reached(6));
  CHECK(Batch(0).reached(3));  // a period below 1 fires on every unit
  CHECK(never().is_never());
  CHECK_FALSE(never().reached(1'000'000));
  const TrainUnit at = Batch::at({50, 10});
  CHECK(at.reached(10));
  CHECK(at.reached(50));
  CHECK_FALSE(at.reached(20));
  CHECK(Record(1000).in_batches_if_records(64) == TrainUnit(Batch(15)));
  CHECK(Record(10).in_batches_if_records(64) == TrainUnit(Batch(1)));
  CHECK(Epoch(2).to_string() == "2 epochs");
}

TEST_CASE("metrics: literal names without allocation, dynamic names interned, lookups that name what is missing") {
  Metrics m{{"loss", torch::tensor(0.5)}, {"acc", 0.75}};
  const std::string dynamic = "head_" + std::to_string(2);
  m.set(dynamic, 3);
  CHECK(m.size() == 3);
  CHECK(m.at("loss").is_tensor());
  CHECK(m.at("acc").to_double() == 0.75);
  CHECK(m.at("head_2").to_double() == 3.0);
  CHECK(MetricKey(dynamic).view().data() == MetricKey(std::string("head_2")).view().data());
  CHECK_THROWS_WITH_AS(m.at("error"), "metric 'error' is missing; the metrics are: loss, acc, head_2", TrialError);
}

TEST_CASE("experiment configs: unknown fields are errors at their place with the nearest name, cluster-only fields are listed") {
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("name: x\nsearcher: {name: single, metric: loss, max_lenght: {batches: 5}}\n", "e.yaml"),
                       "e.yaml:2:40: unknown field 'searcher.max_lenght'; did you mean 'max_length'?", ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("hyperparameter:\n  lr: 0.1\n", "e.yaml"),
                       "e.yaml:1:1: unknown field 'hyperparameter'; did you mean 'hyperparameters'?", ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("zzz: 1\n", "e.yaml"), "e.yaml:1:1: unknown field 'zzz'", ConfigError);
  const ExperimentConfig seed = ExperimentConfig::parse(
      "entrypoint: model_def:MNistTrial\nresources: {slots_per_trial: 1, resource_pool: gpus}\nenvironment: {image: x}\n", "seed.yaml");
  CHECK(seed.ignored_fields == std::vector<std::string>{"entrypoint", "environment", "resources.resource_pool"});
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("checkpoint_storage: {type: s3, bucket: b}\n", "e.yaml"),
                       doctest::Contains("e.yaml:1:28: checkpoint_storage type 's3' is not one dettrial writes"), ConfigError);
}

TEST_CASE("experiment configs: searchers are checked as Determined checks them") {
  const ExperimentConfig asha = ExperimentConfig::parse(R"(
searcher:
  name: adaptive_asha
  metric: validation_loss
  max_trials: 16
  max_time: 1000
  time_metric: batches
  divisor: 4
  max_concurrent_trials: 8
)",
                                                        "asha.yaml");
  CHECK(asha.searcher.kind == SearcherKind::adaptive_asha);
  CHECK(asha.searcher.name() == "adaptive_asha");
  CHECK(asha.searcher.max_trials == 16);
  CHECK(asha.searcher.max_time == 1000);
  CHECK(asha.searcher.max_concurrent_trials == 8);
  // A time_metric that is no length unit is refused where it is written, not in every trial.
  std::string refused;
  try {
    ExperimentConfig::parse(
        "hyperparameters: {global_batch_size: 8}\nsearcher:\n  name: adaptive_asha\n  metric: loss\n  max_trials: 4\n  max_time: 100\n"
        "  time_metric: steps\n",
        "asha.yaml");
  } catch (const ConfigError& e) {
    refused = e.what();
  }
  CHECK(refused.find("asha.yaml:7:") != std::string::npos);
  CHECK(refused.find("searcher.time_metric 'steps' is not batches, records or epochs") != std::string::npos);
  // The deprecated max_length stands for time_metric and max_time.
  const ExperimentConfig legacy =
      ExperimentConfig::parse("searcher: {name: adaptive_asha, metric: m, max_trials: 4, max_length: {epochs: 3}}\n", "l.yaml");
  CHECK(legacy.searcher.time_metric == "epochs");
  CHECK(legacy.searcher.max_time == 3);
  // No name: the single searcher. async_halving is adaptive_asha with one bracket of num_rungs rungs,
  // and needs max_trials as adaptive_asha does.
  CHECK(ExperimentConfig::parse("searcher: {metric: m, max_length: 5}\n", "s.yaml").searcher.kind == SearcherKind::single);
  const ExperimentConfig halving =
      ExperimentConfig::parse("searcher: {name: async_halving, metric: m, max_trials: 4, max_time: 90, num_rungs: 3}\n", "h.yaml");
  CHECK(halving.searcher.kind == SearcherKind::adaptive_asha);
  CHECK(halving.searcher.bracket_rungs == std::vector<std::int64_t>{3});
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: async_halving, metric: m, max_time: 9}\n", "h.yaml"),
                       doctest::Contains("searcher 'adaptive_asha' needs max_trials"), ConfigError);
  for (SearcherKind kind : {SearcherKind::single, SearcherKind::random, SearcherKind::grid, SearcherKind::adaptive_asha})
    CHECK(searcher_kind_named(to_string(kind)) == kind);
  CHECK_FALSE(searcher_kind_named("async_halving"));
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: adaptive_asha, metric: m, max_trials: 4}\n", "a.yaml"),
                       doctest::Contains("a.yaml:1:11: searcher 'adaptive_asha' needs max_time"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: random, metric: m, max_length: {batches: 5}}\n", "r.yaml"),
                       doctest::Contains("searcher 'random' needs max_trials"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: adaptive_simple, metric: m}\n", "s.yaml"),
                       doctest::Contains("s.yaml:1:18: searcher 'adaptive_simple' was removed from Determined; use adaptive_asha"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: grd, metric: m}\n", "s.yaml"),
                       doctest::Contains("unknown searcher 'grd'; did you mean 'grid'?"), ConfigError);
  CHECK_THROWS_WITH_AS(
      ExperimentConfig::parse("searcher: {name: adaptive_asha, metric: m, max_trials: 4, max_time: 9, divisor: 1}\n", "d.yaml"),
      doctest::Contains("d.yaml:1:81: searcher.divisor must be greater than 1"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: random, metric: m, max_trials: 0}\n", "t.yaml"),
                       doctest::Contains("searcher.max_trials must be at least 1"), ConfigError);
}

TEST_CASE("an assigned experiment config rebinds its YAML sections: no other copy's document is written into") {
  const ExperimentConfig b = ExperimentConfig::parse("hyperparameters: {lr: 0.2}\ndata: {dir: b}\n");
  ExperimentConfig c = ExperimentConfig::parse("hyperparameters: {lr: 0.3}\ndata: {dir: c}\n");
  const ExperimentConfig kept = c;  // shares c's nodes
  c = b;                            // rebinds c: yaml-cpp's own assignment would write 0.2 into kept's document
  CHECK(c.hyperparameters["lr"].as<double>() == 0.2);
  CHECK(c.data["dir"].as<std::string>() == "b");
  CHECK(c.yaml["hyperparameters"]["lr"].as<double>() == 0.2);
  CHECK(kept.hyperparameters["lr"].as<double>() == 0.3);
  CHECK(kept.data["dir"].as<std::string>() == "c");
  CHECK(kept.yaml["hyperparameters"]["lr"].as<double>() == 0.3);
  CHECK(b.hyperparameters["lr"].as<double>() == 0.2);
}

TEST_CASE(
    "the mlflow section names a server, an experiment after the config by default and tags, and a wrong address or tag is an error naming "
    "it") {
  const auto c = ExperimentConfig::parse(R"(
name: fashion
mlflow:
  tracking_uri: http://tracker:5000/
  tags: {team: vision, budget: 3}
searcher: {name: single, metric: loss, max_length: {batches: 1}}
)",
                                         "mlflow.yaml");
  CHECK(c.mlflow.tracking_uri == "http://tracker:5000/");
  CHECK(c.mlflow.experiment_name == "fashion");
  CHECK(c.mlflow.tags == std::vector<std::pair<std::string, std::string>>{{"team", "vision"}, {"budget", "3"}});
  const FitOptions o = FitOptions::from_config(c);
  CHECK(o.mlflow.tracking_uri == "http://tracker:5000/");
  CHECK(o.mlflow.config_text.find("team: vision") != std::string::npos);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("mlflow: {tracking_uri: ./mlruns}\n", "local.yaml"),
                       "local.yaml:1:24: mlflow.tracking_uri './mlruns' is not a server's address (http:// or https://): dettrial logs to "
                       "an MLflow server over its REST API",
                       ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("mlflow: {tags: {team: [a, b]}}\n", "tags.yaml"),
                       doctest::Contains("tags.yaml:1:23: mlflow.tags.team must be a single value"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("mlflow: {tracking_url: http://x}\n", "typo.yaml"),
                       doctest::Contains("unknown field 'mlflow.tracking_url'"), ConfigError);
}
