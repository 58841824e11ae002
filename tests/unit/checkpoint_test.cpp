// Checkpoints: exact resume, crash safety (processes killed while saving), policies and retention,
// loading for use, stop signals, and clear errors for missing, damaged or mismatching checkpoints.
#include <doctest/doctest.h>

#include "source_dir.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "test_trials.hpp"
#include "applied_context.hpp"
#include "rprop.hpp"
#include "skip.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

/// Every training and validation report as (kind, batches, name, value), to compare runs exactly.
struct MetricsRecorder {
  std::vector<std::tuple<std::string, std::int64_t, std::string, double>> rows;
  std::int64_t batches = 0;
  void on_training_workload_end(const MetricValues& m) {
    batches = static_cast<std::int64_t>(m.at("batches"));
    add("train", m);
  }
  void on_validation_end(const MetricValues& m) { add("validation", m); }
  void add(const std::string& kind, const MetricValues& m) {
    for (const auto& [name, value] : m) rows.emplace_back(kind, batches, name, value);
  }
  auto after(std::int64_t batch) const {
    std::vector<std::tuple<std::string, std::int64_t, std::string, double>> out;
    for (const auto& r : rows)
      if (std::get<1>(r) > batch) out.push_back(r);
    return out;
  }
};

/// A callback with state, saved in checkpoints and restored on resume.
struct BatchCounter {
  std::int64_t seen = 0;
  static std::string name() { return "batch_counter"; }
  void on_training_epoch_end(std::int64_t) { ++seen; }
  c10::IValue state_dict() const {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("seen", seen);
    return d;
  }
  void load_state_dict(const c10::IValue& state) { seen = state.toGenericDict().at("seen").toInt(); }
};

/// Dropout, shuffling, Adam, a StepLR stepped every batch, and a stop request at a chosen batch.
struct ResumableTrial : test::DeclarativeRegression {
  std::int64_t stop_at = -1;
  explicit ResumableTrial(Context& c) : DeclarativeRegression(c) {}
  torch::optim::Adam optimizer(torch::nn::Sequential& model) {
    return torch::optim::Adam(model->parameters(), torch::optim::AdamOptions(context.get_hparam<double>("lr")));
  }
  auto lr_scheduler(torch::optim::Adam& opt) { return torch::optim::StepLR(opt, /*step_size=*/3, /*gamma=*/0.7); }
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
    if (i + 1 == stop_at) context.set_stop_requested(true);
    return DeclarativeRegression::train_batch(b, model, e, i);
  }
};

FitOptions resumable_options(std::int64_t length) {
  return test::quiet({.max_length = Batch(length),
                      .validation_period = Batch(4),
                      .checkpoint_period = Batch(3),
                      .reporting_period = Batch(2),
                      .checkpoint_policy = CheckpointPolicy::none,
                      .searcher_metric = "validation_loss"});
}

std::size_t count_dirs(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) ++n;
  return n;
}

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; }

/// ResumableTrial with an optimizer of its own, which dettrial does not know (tests/unit/rprop.hpp).
struct OwnOptimizerTrial : test::DeclarativeRegression {
  std::int64_t stop_at = -1;
  explicit OwnOptimizerTrial(Context& c) : DeclarativeRegression(c) {}
  test::Rprop optimizer(torch::nn::Sequential& model) {
    return test::Rprop(model->parameters(), test::RpropOptions(context.get_hparam<double>("lr")).etas({0.4, 1.3}).step_sizes({1e-5, 0.5}));
  }
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
    if (i + 1 == stop_at) context.set_stop_requested(true);
    return DeclarativeRegression::train_batch(b, model, e, i);
  }
};

}  // namespace

// The proof that an optimizer's layout lives beside its type: Rprop is declared in the test alone,
// and dettrial's checkpoints write it in Python's layout, resume it exactly and hand it to Python's
// torch.optim.Rprop.
TEST_CASE("a trial's own optimizer, its Python layout declared beside it, checkpoints, resumes exactly and loads in Python") {
  const ContextOptions options{.trial_seed = 5};
  test::Context straight_context(test::hparams(), options);
  Trainer<OwnOptimizerTrial> straight(straight_context);
  const FitResult a = straight.fit(resumable_options(14));
  REQUIRE(a.batches_trained == 14);

  test::Context first_context(test::hparams(), options);
  Trainer<OwnOptimizerTrial> first(first_context);
  first.trial().stop_at = 6;  // a checkpoint boundary (every 3 batches), where the stop is taken
  const FitResult b1 = first.fit(resumable_options(14));
  REQUIRE(b1.batches_trained == 6);
  REQUIRE(!b1.checkpoints.empty());
  const fs::path checkpoint = b1.checkpoints.back().path;
  // Python's layout, not LibTorch's archive: state_dict.pth holds the state, nothing native beside it.
  const StateDict state =
      dettrial::detail::unpickle_archive(dettrial::detail::read_file_bytes(checkpoint / "state_dict.pth"), "state_dict.pth")
          .toGenericDict();
  const auto optimizer = state.at("optimizers_state_dict").toList().get(0).toGenericDict();
  const auto group = optimizer.at("param_groups").toList().get(0).toGenericDict();
  CHECK(group.at("etas").toTupleRef().elements()[0].toDouble() == 0.4);
  const auto parameter = optimizer.at("state").toGenericDict().at(0).toGenericDict();
  std::set<std::string> keys;
  for (const auto& entry : parameter) keys.insert(entry.key().toStringRef());
  CHECK(keys == std::set<std::string>({"prev", "step", "step_size"}));
  CHECK_FALSE(fs::exists(checkpoint / "dettrial_state.pt"));

  test::Context second_context(test::hparams(), ContextOptions{.trial_seed = 99});
  Trainer<OwnOptimizerTrial> second(second_context);
  FitOptions resume = resumable_options(14);
  resume.latest_checkpoint = b1.output_dir;
  const FitResult b2 = second.fit(resume);
  CHECK(b2.resumed_from_batch == 6);
  CHECK(test::bit_identical(test::parameters_of(straight_context), test::parameters_of(second_context)));

  const char* python = std::getenv("DETTRIAL_TEST_PYTHON");
  if (!python || !*python) return test::skip("the Python half: no Python with this LibTorch's torch given (DETTRIAL_TEST_PYTHON)");
  const std::string command = "'" + std::string(python) + "' '" + test::tests_source_dir() + "/python/load_own_optimizer.py' '" +
                              checkpoint.string() + "' 0.4 1.3 1e-05 0.5";
  const int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return test::skip(std::string(python) + " has no torch");
  CHECK_MESSAGE(status == 0, command);
}

TEST_CASE("stopping and resuming is bit-identical to training straight through") {
  // 64 records in batches of 8: an epoch is 8 batches. Aggregation frequency 2 and a stop after
  // batch 9 leave one batch of gradients pending in the checkpoint.
  const ContextOptions options{.trial_seed = 7, .aggregation_frequency = 2};
  test::Context straight_context(test::hparams(), options);
  Trainer<ResumableTrial> straight(straight_context);
  MetricsRecorder straight_metrics;
  BatchCounter straight_counter;
  const FitResult a = straight.fit(resumable_options(20), straight_metrics, straight_counter);
  REQUIRE(a.batches_trained == 20);

  test::Context first_context(test::hparams(), options);
  Trainer<ResumableTrial> first(first_context);
  first.trial().stop_at = 9;
  BatchCounter first_counter;
  const FitResult b1 = first.fit(resumable_options(20), first_counter);
  REQUIRE(b1.stop_requested);
  REQUIRE(b1.batches_trained == 9);
  REQUIRE(!b1.checkpoints.empty());
  CHECK(b1.checkpoints.back().batches_trained == 9);

  // A new process would have another seed; everything that matters comes from the checkpoint.
  test::Context second_context(test::hparams(), ContextOptions{.trial_seed = 99, .aggregation_frequency = 2});
  Trainer<ResumableTrial> second(second_context);
  MetricsRecorder resumed_metrics;
  BatchCounter resumed_counter;
  FitOptions resume = resumable_options(20);
  resume.latest_checkpoint = b1.output_dir;
  const FitResult b2 = second.fit(resume, resumed_metrics, resumed_counter);
  CHECK(b2.resumed_from_batch == 9);
  CHECK(b2.batches_trained == 20);
  CHECK(b2.epochs_trained == a.epochs_trained);

  CHECK(test::bit_identical(test::parameters_of(straight_context), test::parameters_of(second_context)));
  CHECK(straight.optimizer().param_groups()[0].options().get_lr() == second.optimizer().param_groups()[0].options().get_lr());
  const auto expected_rows = straight_metrics.after(9);
  const bool same_reports = resumed_metrics.rows == expected_rows;
  if (!same_reports) {  // name the first report that differs
    for (std::size_t i = 0; i < std::min(expected_rows.size(), resumed_metrics.rows.size()); ++i)
      if (expected_rows[i] != resumed_metrics.rows[i]) {
        const auto& [kind, batches, name, value] = expected_rows[i];
        MESSAGE("first difference: " << kind << " at batch " << batches << ", " << name << ": " << value << " straight, "
                                     << std::get<3>(resumed_metrics.rows[i]) << " resumed");
        break;
      }
  }
  CHECK(same_reports);
  CHECK(!resumed_metrics.rows.empty());
  CHECK(first_counter.seen == 1);
  CHECK(resumed_counter.seen == straight_counter.seen);  // the callback's state came back too
  CHECK(straight_counter.seen == 2);
}

TEST_CASE("a checkpoint's load_data.json reads back, and a missing, damaged or mistyped one is refused naming the file") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(2)}));
  REQUIRE(r.checkpoints.size() == 1);
  const CheckpointFolder folder{r.checkpoints.back().path};
  const auto load_data = dettrial::detail::LoadData::read(folder);
  CHECK(load_data.experiment_config.IsMap());
  CHECK(load_data.hparams["lr"].as<double>() == 0.05);
  CHECK(load_data.hparams["global_batch_size"].as<int>() == 8);
  CHECK(load_data.trial_type.find("DeclarativeRegression") != std::string::npos);
  const std::string file = "'" + folder.load_data().string() + "'";
  const auto refused = [&](const std::string& text) {
    std::ofstream(folder.load_data(), std::ios::binary | std::ios::trunc) << text;
    std::string message;
    try {
      (void)dettrial::detail::LoadData::read(folder);
    } catch (const CheckpointError& e) {
      message = e.what();
    }
    return message;
  };
  CHECK(refused("{\"experiment_config\": {\"name\": ").rfind(file + " is not valid JSON", 0) == 0);
  CHECK(refused("[1, 2]") == file + " is not a JSON object");
  CHECK(refused("{\"hparams\": {}}") == file + " has no experiment_config (a map)");
  CHECK(refused("{\"experiment_config\": [1]}") == file + " has no experiment_config (a map)");
  CHECK(refused("{\"experiment_config\": {}, \"hparams\": [0.1]}") == file + "'s hparams are not a map of hyperparameter names to values");
  // Determined's loader refuses it the same way, before building a trial from it.
  CHECK_THROWS_WITH_AS(load_trial_from_checkpoint_path<test::DeclarativeRegression>(folder.dir),
                       (file + "'s hparams are not a map of hyperparameter names to values").c_str(), CheckpointError);
  CHECK(refused("") == file + " is not a JSON object");
  fs::remove(folder.load_data());
  CHECK_THROWS_WITH_AS(dettrial::detail::LoadData::read(folder), (file + " is missing").c_str(), CheckpointError);
  CHECK_THROWS_WITH_AS(load_trial_from_checkpoint_path<test::DeclarativeRegression>(folder.dir),
                       doctest::Contains("has no load_data.json, so the trial cannot be rebuilt from it"), CheckpointError);
}

TEST_CASE("a checkpoint directory has Determined's layout and metadata") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(5), .searcher_metric = "validation_loss"}));
  REQUIRE(r.checkpoints.size() == 1);
  const CheckpointInfo& info = r.checkpoints.back();
  CHECK(info.path == r.checkpoint_dir / info.uuid);
  CHECK(info.batches_trained == 5);
  CHECK(info.validation_metric == r.last_validation_metrics.get("validation_loss"));
  for (const char* file : {"state_dict.pth", "trial_state.json", "trial_state.pkl", "load_data.json", "metadata.json"})
    CHECK_MESSAGE(fs::exists(info.path / file), file);
  // SGD's state is all in Python's layout: no LibTorch archive beside it (each tensor stored once).
  CHECK_FALSE(fs::exists(info.path / "dettrial_state.pt"));
  const YAML::Node meta = YAML::LoadFile((info.path / "metadata.json").string());
  CHECK(meta["dettrial_format"].as<int>() == 2);
  CHECK(meta["steps_completed"].as<int>() == 5);
  CHECK(meta["format"].as<std::string>() == "pickle");
  CHECK(meta["framework"].as<std::string>().rfind("torch-", 0) == 0);
  const YAML::Node load_data = YAML::LoadFile((info.path / "load_data.json").string());
  CHECK(load_data["hparams"]["global_batch_size"].as<int>() == 8);
  CHECK(load_data["hparams"]["lr"].as<double>() == 0.05);
  const TrialProgress progress = TrialProgress::from_json(info.path / "trial_state.json");
  CHECK(progress.batches_trained == 5);
  CHECK(progress.last_validation == 5);
  CHECK(progress.last_checkpoint == 5);

  // The state dict: Python's names for the model, Python's layout for the optimizer.
  const c10::IValue top =
      dettrial::detail::unpickle_archive(dettrial::detail::read_file_bytes(info.path / "state_dict.pth"), "state_dict.pth");
  const StateDict dict = top.toGenericDict();
  const StateDict model = dict.at("models_state_dict").toList().get(0).toGenericDict();
  std::vector<std::string> names;
  for (const auto& e : model) names.push_back(e.key().toStringRef());
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"});
  const StateDict optimizer = dict.at("optimizers_state_dict").toList().get(0).toGenericDict();
  const auto groups = optimizer.at("param_groups").toList();
  REQUIRE(groups.size() == 1);
  CHECK(groups.get(0).toGenericDict().at("lr").toDouble() == 0.05);
  CHECK(groups.get(0).toGenericDict().at("params").toList().size() == 4);
  CHECK(dict.at("rng_state").toGenericDict().at("cpu_rng_state").toTensor().numel() > 0);
}

TEST_CASE("checkpoint policies and retention keep what Determined keeps") {
  // Validation after every batch; the loss falls, then a large learning rate makes it jump.
  auto run = [](CheckpointPolicy policy, Retention retention, std::int64_t length = 6) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
    Trainer<test::DeclarativeRegression> trainer(context);
    trainer.trial().shuffle = false;
    return trainer.fit(test::quiet({.max_length = Batch(length),
                                    .validation_period = Batch(1),
                                    .checkpoint_policy = policy,
                                    .searcher_metric = "validation_loss",
                                    .retention = retention}));
  };
  SUBCASE("all: a checkpoint after every validation; retention keeps the best and the latest") {
    const FitResult r = run(CheckpointPolicy::all, {.save_trial_best = 1, .save_trial_latest = 1});
    CHECK(r.checkpoints.size() == 6);
    const auto kept = list_checkpoints(r.checkpoint_dir);
    const auto best = std::min_element(r.checkpoints.begin(), r.checkpoints.end(),
                                       [](const auto& a, const auto& b) { return *a.validation_metric < *b.validation_metric; });
    std::set<std::string> kept_ids;
    for (const auto& k : kept) kept_ids.insert(k.uuid);
    CHECK(kept_ids.count(best->uuid) == 1);
    CHECK(kept_ids.count(r.checkpoints.back().uuid) == 1);
    CHECK(kept.size() == (best->uuid == r.checkpoints.back().uuid ? 1u : 2u));
  }
  SUBCASE("best: only validations that improve, plus the final checkpoint when it is not current") {
    const FitResult r = run(CheckpointPolicy::best, {.save_trial_best = 100, .save_trial_latest = 100});
    double best = 1e300;
    for (const auto& c : r.checkpoints) {
      REQUIRE(c.validation_metric);
      CHECK(*c.validation_metric < best);  // every checkpoint improved on the ones before
      best = *c.validation_metric;
    }
    CHECK(list_checkpoints(r.checkpoint_dir).size() == r.checkpoints.size());
  }
  SUBCASE("none: only the final checkpoint") {
    const FitResult r = run(CheckpointPolicy::none, {});
    REQUIRE(r.checkpoints.size() == 1);
    CHECK(r.checkpoints[0].batches_trained == 6);
  }
  SUBCASE("keeping nothing deletes every checkpoint once the trial is complete") {
    const FitResult r = run(CheckpointPolicy::all, {.save_trial_best = 0, .save_trial_latest = 0});
    CHECK(r.checkpoints.size() == 6);
    CHECK(list_checkpoints(r.checkpoint_dir).empty());
  }
  SUBCASE("the policy types decide as Determined does") {
    CHECK(checkpoint_policy::all::after_validation(false));
    CHECK(checkpoint_policy::best::after_validation(true));
    CHECK(!checkpoint_policy::best::after_validation(false));
    CHECK(!checkpoint_policy::none::after_validation(true));
    CHECK(checkpoint_policy::visit(CheckpointPolicy::none, [](auto p) { return std::string(p.name); }) == "none");
  }
}

TEST_CASE("retention picks the best by metric direction and the most recent") {
  std::vector<CheckpointInfo> all;
  const double metrics[] = {0.5, 0.2, 0.9, 0.3, 0.4};
  for (int i = 0; i < 5; ++i)
    all.push_back(
        CheckpointInfo{.uuid = "c" + std::to_string(i), .batches_trained = i, .sequence = i + 1, .validation_metric = metrics[i]});
  all.push_back(CheckpointInfo{.uuid = "c5", .batches_trained = 5, .sequence = 6});  // no validation
  auto ids = [](const std::vector<CheckpointInfo>& v) {
    std::vector<std::string> out;
    for (const auto& c : v) out.push_back(c.uuid);
    return out;
  };
  CHECK(ids(checkpoints_to_delete(all, {.save_trial_best = 1, .save_trial_latest = 1}, true)) ==
        std::vector<std::string>{"c0", "c2", "c3", "c4"});
  CHECK(ids(checkpoints_to_delete(all, {.save_trial_best = 2, .save_trial_latest = 2}, false)) == std::vector<std::string>{"c1", "c3"});
  CHECK(ids(checkpoints_to_delete(all, {.save_trial_best = 0, .save_trial_latest = 0}, true, "c2")).size() == 5);
}

TEST_CASE("a trial's models load from a checkpoint for evaluation without training") {
  test::Context trained_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<test::DeclarativeRegression> trained(trained_context);
  const FitResult r = trained.fit(test::quiet({.max_length = Batch(6)}));

  test::Context fresh_context(test::hparams(), ContextOptions{.trial_seed = 12});
  Trainer<test::DeclarativeRegression> fresh(fresh_context);
  REQUIRE(!test::bit_identical(test::parameters_of(trained_context), test::parameters_of(fresh_context)));
  const CheckpointInfo info = load_models(r.output_dir, fresh_context);  // a run directory: its latest checkpoint
  CHECK(info.batches_trained == 6);
  CHECK(test::bit_identical(test::parameters_of(trained_context), test::parameters_of(fresh_context)));

  auto bare = test::make_model();
  load_model(r.checkpoints.back().path, *bare);
  CHECK(torch::equal(bare->parameters()[0], trained.model()->parameters()[0].cpu()));  // into a CPU model, from any device
}

TEST_CASE("resuming another trial's checkpoint is a warm start") {
  test::Context c1(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<test::DeclarativeRegression> t1(c1);
  const FitResult r1 = t1.fit(test::quiet({.max_length = Batch(4), .trial_id = 1}));
  test::Context c2(test::hparams(), ContextOptions{.trial_seed = 2});
  Trainer<test::DeclarativeRegression> t2(c2);
  FitOptions o = test::quiet({.max_length = Batch(3), .trial_id = 2});
  o.latest_checkpoint = r1.output_dir;
  // Trial 2 starts from trial 1's weights: before training, its model is trial 1's final one.
  struct FirstWeights {
    Trainer<test::DeclarativeRegression>* trainer;
    torch::Tensor at_start;
    void on_training_start() { at_start = trainer->model()[0]->as<torch::nn::Linear>()->weight.detach().clone(); }
  } first{&t2, {}};
  const torch::Tensor trial1_final = t1.model()[0]->as<torch::nn::Linear>()->weight.detach().clone();
  const torch::Tensor trial2_initial = t2.model()[0]->as<torch::nn::Linear>()->weight.detach().clone();
  REQUIRE_FALSE(torch::equal(trial1_final, trial2_initial));  // different seeds: different initial weights
  const FitResult r2 = t2.fit(o, first);
  CHECK(r2.resumed_from_batch == 0);
  CHECK(r2.batches_trained == 3);
  REQUIRE(first.at_start.defined());
  CHECK(torch::equal(first.at_start, trial1_final));
}

TEST_CASE("missing, damaged, mismatching and newer checkpoints are clear errors that delete nothing") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 4});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(
      test::quiet({.max_length = Batch(4), .checkpoint_period = Batch(2), .retention = {.save_trial_best = 0, .save_trial_latest = 5}}));
  REQUIRE(r.checkpoints.size() == 2);
  const fs::path older = r.checkpoints[0].path, newer = r.checkpoints[1].path;
  const std::size_t before = count_dirs(r.checkpoint_dir);

  auto resume = [&](const fs::path& from) {
    test::Context c(test::hparams(), ContextOptions{.trial_seed = 4});
    Trainer<test::DeclarativeRegression> t(c);
    FitOptions o = test::quiet({.max_length = Batch(8), .checkpoint_dir = r.checkpoint_dir});
    o.latest_checkpoint = from;
    return t.fit(o);
  };

  CHECK_THROWS_WITH_AS(resume(r.checkpoint_dir / "nope"), doctest::Contains("does not exist"), CheckpointError);
  fs::create_directories(r.output_dir / "empty");
  CHECK_THROWS_WITH_AS(resume(r.output_dir / "empty"), doctest::Contains("holds no complete dettrial checkpoint"), CheckpointError);

  // A truncated state_dict.pth in the newest checkpoint: the error names the file.
  const std::string pth = dettrial::detail::read_file_bytes(newer / "state_dict.pth");
  write_bytes(newer / "state_dict.pth", pth.substr(0, pth.size() / 2));
  const std::string truncated = (newer / "state_dict.pth").string() + "' is truncated or damaged";
  CHECK_THROWS_WITH_AS(resume(r.output_dir), doctest::Contains(truncated.c_str()), CheckpointError);
  // A flipped byte of the same size: caught by the CRC.
  std::string flipped = pth;
  flipped[flipped.size() / 2] ^= 0x5A;
  write_bytes(newer / "state_dict.pth", flipped);
  CHECK_THROWS_WITH_AS(resume(newer), doctest::Contains("state_dict.pth' is damaged"), CheckpointError);
  write_bytes(newer / "state_dict.pth", pth);

  // A newer format.
  const std::string meta = dettrial::detail::read_file_bytes(newer / "metadata.json");
  std::string future = meta;
  const std::string written_format = "\"dettrial_format\": " + std::to_string(checkpoint_format_version);
  REQUIRE(future.find(written_format) != std::string::npos);
  future.replace(future.find(written_format), written_format.size(), "\"dettrial_format\": 99");
  write_bytes(newer / "metadata.json", future);
  CHECK_THROWS_WITH_AS(resume(newer), doctest::Contains("written by a newer dettrial"), CheckpointError);
  write_bytes(newer / "metadata.json", meta);

  // Another network: a different hidden width, then a different depth.
  struct Wider : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    torch::nn::Sequential build_model() {
      return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Dropout(0.25), torch::nn::Linear(16, 1));
    }
  };
  {
    test::Context c(test::hparams(), ContextOptions{.trial_seed = 4});
    Trainer<Wider> t(c);
    FitOptions o = test::quiet({.max_length = Batch(8)});
    o.latest_checkpoint = older;
    CHECK_THROWS_WITH_AS(t.fit(o), doctest::Contains("entry '0.weight' has shape [8, 4] in the checkpoint but [16, 4] in the model"),
                         CheckpointError);
  }
  struct Deeper : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    torch::nn::Sequential build_model() {
      return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Dropout(0.25), torch::nn::Linear(8, 1),
                                   torch::nn::Linear(1, 1));
    }
  };
  {
    test::Context c(test::hparams(), ContextOptions{.trial_seed = 4});
    Trainer<Deeper> t(c);
    FitOptions o = test::quiet({.max_length = Batch(8)});
    o.latest_checkpoint = older;
    CHECK_THROWS_WITH_AS(t.fit(o), doctest::Contains("has no entry '4.weight', which the model has"), CheckpointError);
  }
  // Nothing was deleted by the failed loads, and the repaired newest checkpoint resumes.
  CHECK(count_dirs(r.checkpoint_dir) == before);
  CHECK(fs::exists(older / "metadata.json"));
  CHECK(resume(r.output_dir).resumed_from_batch == 4);
}

TEST_CASE("SIGTERM finishes the batch, checkpoints and returns, the run resumes from there") {
  struct SignalsAtFive : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    Metrics train_batch(test::Batch& b, torch::nn::Sequential& m, std::int64_t e, std::int64_t i) {
      if (i == 4) std::raise(SIGTERM);  // as if sent from outside, in the middle of batch 4
      return DeclarativeRegression::train_batch(b, m, e, i);
    }
  };
  struct sigaction before{};
  ::sigaction(SIGTERM, nullptr, &before);
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 2});
  Trainer<SignalsAtFive> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(50)}));
  CHECK(r.signal == SIGTERM);
  CHECK(r.stopped_early);
  CHECK(r.batches_trained == 5);
  REQUIRE(r.checkpoints.size() == 1);
  CHECK(r.checkpoints[0].batches_trained == 5);
  // dettrial's handler is gone after fit: the one before it is back.
  struct sigaction now{};
  ::sigaction(SIGTERM, nullptr, &now);
  const bool restored = now.sa_handler == before.sa_handler;
  CHECK(restored);
  // The signal belonged to that fit: later fits in the process train to the end, with dettrial's
  // handlers or without them.
  for (const bool handle_signals : {false, true}) {
    CAPTURE(handle_signals);
    test::Context again(test::hparams(), ContextOptions{.trial_seed = 3});
    Trainer<test::DeclarativeRegression> next(again);
    FitOptions o = test::quiet({.max_length = Batch(7)});
    o.handle_signals = handle_signals;
    const FitResult full = next.fit(o);
    CHECK(full.signal == 0);
    CHECK_FALSE(full.stop_requested);
    CHECK(full.batches_trained == 7);
  }
}

// ---- crash safety: child processes killed while they write checkpoints --------------------------

namespace {

/// Parameters set to the batch count after every batch, so a checkpoint's weights show which batch
/// they belong to; a checkpoint after every batch, keeping the latest two.
struct FillTrial {
  Context& context;
  torch::nn::Linear model;
  torch::optim::SGD opt;
  explicit FillTrial(Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(256, 512))), opt(model->parameters(), 0.0) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() { return DataLoader(TensorDataset(torch::zeros({64, 1})), {.batch_size = 8}); }
  auto build_validation_data_loader() { return DataLoader(TensorDataset(torch::zeros({8, 1})), {.batch_size = 8}); }
  Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t batch_idx) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(static_cast<float>(batch_idx + 1));
    return {{"loss", 0.0}};
  }
  Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {{"validation_loss", 0.0}}; }
};

/// The file a child writes when its first batch starts: the parent's clock for the kill starts
/// there, not at the child's start, which a sanitizer's build or a loaded machine can make last
/// seconds.
fs::path training_marker(const fs::path& dir, pid_t child) { return dir / ("training." + std::to_string(child)); }

}  // namespace

TEST_CASE("child process: writes checkpoints until killed" * doctest::skip()) {
  const char* dir = std::getenv("DETTRIAL_CHILD_DIR");
  REQUIRE(dir != nullptr);
  struct AnnouncedTrial : FillTrial {
    using FillTrial::FillTrial;
    bool announced = false;
    Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t e, std::int64_t i) {
      if (!announced) {
        std::ofstream(training_marker(std::getenv("DETTRIAL_CHILD_DIR"), ::getpid())) << i << '\n';
        announced = true;
      }
      return FillTrial::train_batch(b, e, i);
    }
  };
  test::Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
  Trainer<AnnouncedTrial> trainer(context);
  FitOptions o{.max_length = Batch(1'000'000), .checkpoint_period = Batch(1), .reporting_period = Batch(1'000'000)};
  o.output_dir = dir;
  o.report.quiet = true;
  o.retention = {.save_trial_best = 0, .save_trial_latest = 2};
  if (!list_checkpoints(fs::path(dir) / "checkpoints").empty()) o.latest_checkpoint = dir;  // restarted after a crash
  trainer.fit(o);
}

TEST_CASE("child process: a second stop signal aborts at once" * doctest::skip()) {
  struct TwoSignals : FillTrial {
    using FillTrial::FillTrial;
    Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t e, std::int64_t i) {
      if (i == 2) {
        std::raise(SIGINT);
        std::raise(SIGINT);  // the second one: the process ends here, by SIGINT
      }
      return FillTrial::train_batch(b, e, i);
    }
  };
  test::Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
  Trainer<TwoSignals> trainer(context);
  FitOptions o{.max_length = Batch(100)};
  o.output_dir = std::getenv("DETTRIAL_CHILD_DIR");
  o.report.quiet = true;
  trainer.fit(o);
}

TEST_CASE("a process killed (SIGKILL) at any moment while checkpointing leaves loadable checkpoints") {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::mt19937 rng(2024);
  // After the child's first batch: a checkpoint follows every batch, so the kill lands in a write,
  // between two, or before the first has finished.
  std::uniform_int_distribution<int> delay_ms(0, 600);
  std::int64_t last_seen = 0;
  int kills_with_checkpoints = 0;
  // 16 kills at least, and more (up to 64) until 8 of them came with checkpoints on disk: on a
  // loaded machine the first rounds may end before the child has finished writing one.
  for (int round = 0; round < 16 || (kills_with_checkpoints < 8 && round < 64); ++round) {
    CAPTURE(round);
    const pid_t child = test::spawn_self("child process: writes checkpoints until killed", {"DETTRIAL_CHILD_DIR=" + dir.string()});
    // Waits for the child's first batch (a child that ends before it fails the test, with its status).
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    int status = 0;
    while (!fs::exists(training_marker(dir, child))) {
      const pid_t ended = ::waitpid(child, &status, WNOHANG);
      REQUIRE_MESSAGE(ended == 0, "the child ended before its first batch, status ", status);
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < give_up, "the child did not start training within 5 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    fs::remove(training_marker(dir, child));

    const auto all = list_checkpoints(dir / "checkpoints");
    CHECK(all.size() <= 3);  // two kept, plus at most one written before the older could go
    for (const auto& info : all) {
      CAPTURE(info.path);
      const CheckpointInfo checked = read_checkpoint_info(info.path);  // sizes
      torch::nn::Linear probe(256, 512);
      load_model(info.path, *probe);  // CRC, names, shapes
      const float expected = static_cast<float>(checked.batches_trained);
      CHECK(torch::all(probe->weight == expected).item<bool>());
      CHECK(TrialProgress::from_json(info.path / "trial_state.json").batches_trained == checked.batches_trained);
    }
    if (!all.empty()) {
      ++kills_with_checkpoints;
      CHECK(all.back().batches_trained >= last_seen);  // each restart resumed; nothing went backwards
      last_seen = all.back().batches_trained;
    }
  }
  CHECK(kills_with_checkpoints >= 8);
  CHECK(last_seen > 0);
}

TEST_CASE("a second stop signal aborts the process") {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  const pid_t child = test::spawn_self("child process: a second stop signal aborts at once", {"DETTRIAL_CHILD_DIR=" + dir.string()});
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
}

// ---- format 2 (each tensor once), format 1 still read, background writes, the run folder's lock ----

namespace {

/// ResumableTrial's regression through a wide network: a checkpoint of it is megabytes, so that
/// a background write takes long enough to be caught in flight, and sizes are not overhead.
struct WideTrial : ResumableTrial {
  explicit WideTrial(Context& c) : ResumableTrial(c) {}
  torch::nn::Sequential build_model() {
    const std::int64_t width = context.get_hparam<std::int64_t>("width");
    return torch::nn::Sequential(torch::nn::Linear(4, width), torch::nn::ReLU(), torch::nn::Dropout(0.25), torch::nn::Linear(width, width),
                                 torch::nn::ReLU(), torch::nn::Linear(width, 1));
  }
};

/// The same network with SGD and momentum, and dettrial::optim's StepLR (which writes Python's state).
struct WideMomentumTrial : WideTrial {
  explicit WideMomentumTrial(Context& c) : WideTrial(c) {}
  torch::optim::SGD optimizer(torch::nn::Sequential& model) {
    return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  auto lr_scheduler(torch::optim::SGD& opt) { return dettrial::optim::StepLR(opt, /*step_size=*/3, /*gamma=*/0.7); }
};

/// Calls `check` when training starts (after a resumed checkpoint was restored).
struct AtTrainingStart {
  std::function<void()> check;
  void on_training_start() { check(); }
};

std::uintmax_t folder_bytes(const fs::path& dir) {
  std::uintmax_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.file_size();
  return n;
}

std::size_t state_tensor_bytes(torch::optim::Optimizer& optimizer, const torch::nn::Module& model) {
  std::size_t n = 0;
  for (const auto& p : model.parameters()) n += p.nbytes();
  for (const auto& [key, state] : optimizer.state()) {
    c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
    dettrial::detail::python_param_state(optimizer, *state, entries);
    for (const auto& e : entries)
      if (e.value().isTensor()) n += e.value().toTensor().nbytes();
  }
  return n;
}

}  // namespace

TEST_CASE("a format-1 checkpoint (LibTorch's archive of every optimizer) still resumes with its optimizer, scheduler and gradients") {
  // Written by dettrial before format 2: ResumableTrial (Adam, LibTorch's StepLR), aggregation
  // frequency 2, stopped after batch 9 with one batch of gradients pending.
  const fs::path out = test::quiet({}).output_dir;
  fs::create_directories(out / "checkpoints");
  fs::copy(fs::path(test::tests_source_dir()) / "unit/fixtures/format1-checkpoint", out / "checkpoints/format1");
  const fs::path fixture = out / "checkpoints/format1";
  REQUIRE(read_checkpoint_info(fixture).format == 1);
  const StateDict python = dettrial::detail::read_state_dict_file(fixture).at("optimizers_state_dict").toList().get(0).toGenericDict();

  test::Context context(test::hparams(), ContextOptions{.trial_seed = 99, .aggregation_frequency = 2});
  Trainer<ResumableTrial> trainer(context);
  int checked = 0;
  AtTrainingStart restored{[&] {
    auto& optimizer = trainer.optimizer();
    using Map = std::remove_cvref_t<decltype(optimizer.state())>;
    const auto params = optimizer.param_groups()[0].params();
    const StateDict per_param = python.at("state").toGenericDict();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const StateDict saved = per_param.at(static_cast<std::int64_t>(i)).toGenericDict();
      const auto& state =
          static_cast<torch::optim::AdamParamState&>(*optimizer.state().at(dettrial::detail::optimizer_state_key<Map>(params[i])));
      // On the host: the fixture's tensors are CPU tensors, the trainer's on its device (a GPU's).
      CHECK(torch::equal(state.exp_avg().cpu(), saved.at("exp_avg").toTensor()));
      CHECK(torch::equal(state.exp_avg_sq().cpu(), saved.at("exp_avg_sq").toTensor()));
      CHECK(state.step() == static_cast<std::int64_t>(saved.at("step").toTensor().item<double>()));
      CHECK(params[i].grad().defined());  // batch 9's gradients, pending at the checkpoint
      ++checked;
    }
    CHECK(optimizer.param_groups()[0].options().get_lr() < 0.05);  // LibTorch's StepLR lowered it
    CHECK(optimizer.param_groups()[0].options().get_lr() == python.at("param_groups").toList().get(0).toGenericDict().at("lr").toDouble());
  }};
  FitOptions o = resumable_options(12);
  o.output_dir = out;
  o.latest_checkpoint = fixture;
  const FitResult r = trainer.fit(o, restored);
  CHECK(checked == 4);
  CHECK(r.resumed_from_batch == 9);
  CHECK(r.batches_trained == 12);
  // What this run wrote is format 2: LibTorch's StepLR and the pending gradients (if any) in the
  // archive, Adam in Python's layout only.
  CHECK(read_checkpoint_info(r.checkpoints.back().path).format == checkpoint_format_version);
}

TEST_CASE("a format-2 checkpoint stores each tensor once, and resumes SGD with momentum and Adam exactly from Python's layout") {
  const auto check = [](auto tag, bool archive) {
    using Trial = typename decltype(tag)::type;
    const Hyperparameters hparams = test::hparams("width: 512\n");
    test::Context straight_context(hparams, ContextOptions{.trial_seed = 3});
    Trainer<Trial> straight(straight_context);
    straight.fit(resumable_options(10));

    test::Context first_context(hparams, ContextOptions{.trial_seed = 3});
    Trainer<Trial> first(first_context);
    first.trial().stop_at = 6;
    const FitResult stopped = first.fit(resumable_options(10));
    REQUIRE(stopped.checkpoints.size() >= 1);
    const fs::path checkpoint = stopped.checkpoints.back().path;
    CHECK(stopped.checkpoints.back().batches_trained == 6);
    CHECK(fs::exists(checkpoint / "dettrial_state.pt") == archive);
    // The optimizer's state is in state_dict.pth only: the files are the model's and the
    // optimizer's tensors plus a little (generator states, progress, config).
    const std::size_t tensors = state_tensor_bytes(first.optimizer(), *first.model());
    const std::uintmax_t files = folder_bytes(checkpoint);
    CAPTURE(tensors);
    CAPTURE(files);
    CHECK(files < tensors + tensors / 20);
    CHECK(files > tensors);
    if (const char* dir = std::getenv("DETTRIAL_CHECKPOINT_SIZE_DIR")) {  // for Python's torch.save of the same state
      const fs::path keep = fs::path(dir) / typeid(Trial).name();
      fs::remove_all(keep);
      fs::create_directories(keep.parent_path());
      fs::copy(checkpoint, keep);
    }

    test::Context second_context(hparams, ContextOptions{.trial_seed = 44});
    Trainer<Trial> second(second_context);
    FitOptions resume = resumable_options(10);
    resume.latest_checkpoint = stopped.output_dir;
    second.fit(resume);
    CHECK(test::bit_identical(test::parameters_of(straight_context), test::parameters_of(second_context)));
  };
  SUBCASE("Adam and LibTorch's StepLR (in the archive: it has no Python state)") { check(std::type_identity<WideTrial>{}, true); }
  SUBCASE("SGD with momentum and dettrial's StepLR (no archive at all)") { check(std::type_identity<WideMomentumTrial>{}, false); }
}

TEST_CASE("checkpoints written in the background hold the state at their batch and are durable before anything acts on them") {
  struct Durable {
    std::vector<fs::path> written;
    std::vector<std::string> uploaded;
    int not_durable = 0;
    void on_checkpoint_write_end(const fs::path& p) {
      written.push_back(p);
      // Complete and in place: every file of its metadata present with its size.
      if (dettrial::detail::is_hidden(p) || !fs::exists(p / "metadata.json")) ++not_durable;
      else (void)read_checkpoint_info(p);
    }
    void on_checkpoint_upload_end(const std::string& uuid) { uploaded.push_back(uuid); }
  };
  const auto run = [](bool async, Durable& durable) {
    test::Context context(test::hparams("width: 256\n"), ContextOptions{.trial_seed = 5});
    Trainer<WideTrial> trainer(context);
    FitOptions o = test::quiet({.max_length = Batch(12),
                                .validation_period = Batch(4),
                                .checkpoint_period = Batch(1),
                                .reporting_period = Batch(2),
                                .checkpoint_policy = CheckpointPolicy::none,
                                .retention = {.save_trial_best = 0, .save_trial_latest = 100}});
    o.async_checkpoints = async;
    const FitResult r = trainer.fit(o, durable);
    return std::pair{r, test::parameters_of(context)};
  };
  Durable in_background, in_loop;
  const auto [background, background_params] = run(true, in_background);
  const auto [loop, loop_params] = run(false, in_loop);
  CHECK(test::bit_identical(background_params, loop_params));
  REQUIRE(background.checkpoints.size() == 12);
  REQUIRE(loop.checkpoints.size() == 12);
  CHECK(in_background.not_durable == 0);
  CHECK(in_background.written.size() == 12);
  CHECK(in_background.uploaded.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    CAPTURE(i);
    CHECK(background.checkpoints[i].batches_trained == static_cast<std::int64_t>(i + 1));
    CHECK(in_background.written[i] == background.checkpoints[i].path);
    CHECK(in_background.uploaded[i] == background.checkpoints[i].uuid);
    // The snapshot holds the state of its own batch, not of a later one training reached while it was written.
    const StateDict a = dettrial::detail::read_state_dict_file(background.checkpoints[i].path);
    const StateDict b = dettrial::detail::read_state_dict_file(loop.checkpoints[i].path);
    const auto model_a = a.at("models_state_dict").toList().get(0).toGenericDict();
    const auto model_b = b.at("models_state_dict").toList().get(0).toGenericDict();
    for (const auto& entry : model_b) CHECK(torch::equal(model_a.at(entry.key()).toTensor(), entry.value().toTensor()));
    const auto adam_a = a.at("optimizers_state_dict").toList().get(0).toGenericDict().at("state").toGenericDict();
    const auto adam_b = b.at("optimizers_state_dict").toList().get(0).toGenericDict().at("state").toGenericDict();
    for (const auto& entry : adam_b)
      CHECK(torch::equal(adam_a.at(entry.key()).toGenericDict().at("exp_avg").toTensor(),
                         entry.value().toGenericDict().at("exp_avg").toTensor()));
  }
  // The report: a checkpoint record per checkpoint, with its write time; the wait is a training phase.
  int checkpoint_records = 0;
  for (const auto& record : test::read_reports(background.output_dir / "metrics.jsonl")) {
    if (record["type"] == "checkpoint") {
      ++checkpoint_records;
      CHECK(record.contains("write_seconds"));
    }
    if (record["type"] == "training") CHECK(record["seconds"].contains("checkpoint_wait"));
  }
  CHECK(checkpoint_records == 12);
}

TEST_CASE("a background write that fails is an error at the next boundary, naming what failed, and earlier checkpoints stay") {
  const fs::path out = test::quiet({}).output_dir;
  const fs::path storage = out / "checkpoints", moved = out / "kept";
  // After the first checkpoint is durable, its storage is moved away and a file put in its place:
  // the next write cannot create its directory there.
  struct BreakStorage {
    fs::path storage, moved;
    void on_checkpoint_write_end(const fs::path&) {
      if (fs::exists(moved)) return;
      fs::rename(storage, moved);
      std::ofstream(storage) << "not a directory";
    }
  } breaker{storage, moved};
  test::Context context(test::hparams("width: 64\n"), ContextOptions{.trial_seed = 5});
  Trainer<WideTrial> trainer(context);
  FitOptions o = test::quiet({.max_length = Batch(20), .checkpoint_period = Batch(2), .checkpoint_policy = CheckpointPolicy::none});
  o.output_dir = out;
  CHECK_THROWS_WITH_AS(trainer.fit(o, breaker), doctest::Contains("checkpoint could not be written: cannot create"), CheckpointError);
  const auto kept = list_checkpoints(moved);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].batches_trained == 2);
  CHECK(read_checkpoint_info(kept[0].path).batches_trained == 2);  // complete: every file's size as written
}

TEST_CASE("the snapshot's host memory is allocated once and reused by every later checkpoint") {
  dettrial::detail::HostSnapshot snapshot;
  torch::nn::Linear layer(64, 32);
  StateDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("model", module_state_dict(*layer));
  state.insert("tied", layer->weight);  // the same tensor again: stored once
  std::vector<const void*> first;
  for (int round = 0; round < 3; ++round) {
    {
      torch::NoGradGuard no_grad;
      layer->weight.add_(1.0);
    }
    snapshot.begin();
    const c10::IValue copy = snapshot.take(state);
    snapshot.finish();
    const torch::Tensor weight = copy.toGenericDict().at("model").toGenericDict().at("weight").toTensor();
    CHECK(torch::equal(weight, layer->weight));
    CHECK(weight.data_ptr() != layer->weight.data_ptr());
    CHECK(copy.toGenericDict().at("tied").toTensor().data_ptr() == weight.data_ptr());
    std::vector<const void*> pointers{weight.data_ptr(), copy.toGenericDict().at("model").toGenericDict().at("bias").toTensor().data_ptr()};
    if (round == 0) first = pointers;
    CHECK(pointers == first);
    CHECK(snapshot.bytes() == static_cast<std::size_t>((64 * 32 + 32) * 4));
  }
}

TEST_CASE("a background write is paced over its budget, and hurried at once when someone waits for it") {
  const auto dir = std::filesystem::temp_directory_path() / ("dettrial-pace-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string bytes(std::size_t{16} << 20, 'x');  // four pieces of 4 MB
  using Clock = std::chrono::steady_clock;
  // Paced over 0.4 s: the last piece is not written before then (the writer sleeps while ahead).
  {
    dettrial::detail::WritePace pace(std::chrono::milliseconds(400), bytes.size());
    const auto start = Clock::now();
    CheckpointWriter writer(dir, "paced", &pace);
    writer.add_file("data", bytes);
    CHECK(Clock::now() - start >= std::chrono::milliseconds(400));
    CHECK(std::filesystem::file_size(writer.commit(dettrial::detail::Json::object()) / "data") == bytes.size());
  }
  // Paced over a minute, hurried by another thread: it ends long before the minute.
  {
    auto pace = std::make_shared<dettrial::detail::WritePace>(std::chrono::seconds(60), bytes.size());
    dettrial::detail::BackgroundWrite write;
    const auto start = Clock::now();
    write.start(
        [&] {
          CheckpointWriter writer(dir, "hurried", pace.get());
          writer.add_file("data", bytes);
          return CheckpointInfo{.path = writer.commit(dettrial::detail::Json::object()), .uuid = "hurried"};
        },
        pace);
    CHECK(write.collect().uuid == "hurried");  // collect() hurries
    CHECK(Clock::now() - start < std::chrono::seconds(30));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("child process: writes large checkpoints in the background until killed" * doctest::skip()) {
  const char* dir = std::getenv("DETTRIAL_CHILD_DIR");
  REQUIRE(dir != nullptr);
  test::Context context(test::hparams("width: 2048\n"), ContextOptions{.trial_seed = 21});
  Trainer<WideTrial> trainer(context);
  FitOptions o = resumable_options(400);
  o.checkpoint_period = Batch(4);
  o.output_dir = dir;
  o.retention = {.save_trial_best = 0, .save_trial_latest = 2};
  trainer.fit(o);
}

TEST_CASE("a process killed (SIGKILL) while a checkpoint is written in the background resumes bit-identically") {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  const pid_t child =
      test::spawn_self("child process: writes large checkpoints in the background until killed", {"DETTRIAL_CHILD_DIR=" + dir.string()});
  // Killed while a write is in flight (its hidden temporary directory exists) after at least one
  // checkpoint is complete: training went on meanwhile.
  bool caught = false;
  for (int i = 0; i < 60000 && !caught; ++i) {
    std::error_code ec;
    bool writing = false;
    for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec))
      writing = writing || e.path().filename().string().rfind(".tmp-", 0) == 0;
    caught = writing && !list_checkpoints(dir / "checkpoints").empty();
    if (caught) ::kill(child, SIGKILL);
    else std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(caught);
  REQUIRE(WIFSIGNALED(status));
  const auto all = list_checkpoints(dir / "checkpoints");
  REQUIRE(!all.empty());
  for (const auto& info : all) (void)read_checkpoint_info(info.path);  // only complete ones are listed
  const std::int64_t resumed_at = all.back().batches_trained;
  CAPTURE(resumed_at);

  test::Context straight_context(test::hparams("width: 2048\n"), ContextOptions{.trial_seed = 21});
  Trainer<WideTrial> straight(straight_context);
  FitOptions whole = resumable_options(resumed_at + 8);
  whole.checkpoint_period = Batch(1000);
  straight.fit(whole);

  test::Context resumed_context(test::hparams("width: 2048\n"), ContextOptions{.trial_seed = 22});
  Trainer<WideTrial> resumed(resumed_context);
  FitOptions rest = resumable_options(resumed_at + 8);
  rest.checkpoint_period = Batch(1000);
  rest.output_dir = dir;
  rest.latest_checkpoint = dir;
  const FitResult r = resumed.fit(rest);
  CHECK(r.resumed_from_batch == resumed_at);
  CHECK(test::bit_identical(test::parameters_of(straight_context), test::parameters_of(resumed_context)));
}

TEST_CASE("child process: holds a run folder" * doctest::skip()) {
  const char* dir = std::getenv("DETTRIAL_CHILD_DIR");
  REQUIRE(dir != nullptr);
  test::Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
  Trainer<FillTrial> trainer(context);
  FitOptions o{.max_length = Batch(100'000'000), .checkpoint_period = Batch(100'000'000), .reporting_period = Batch(100'000'000)};
  o.output_dir = dir;
  o.report.quiet = true;
  trainer.fit(o);
}

TEST_CASE("a second process in a live run folder is refused naming the holder, and a SIGKILLed holder leaves no lock") {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  const pid_t child = test::spawn_self("child process: holds a run folder", {"DETTRIAL_CHILD_DIR=" + dir.string()});
  const std::string holder = "pid " + std::to_string(child) + " on host ";
  for (int i = 0; i < 3000 && test::read_text(dir / ".lock").find(holder) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(test::read_text(dir / ".lock").find(holder) != std::string::npos);
  // The holder's start-up writes (its metrics.jsonl, event files) are over before the folder is listed.
  for (int i = 0; i < 3000 && !fs::exists(dir / "metrics.jsonl"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto fit_here = [&] {
    test::Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
    Trainer<FillTrial> trainer(context);
    FitOptions o = test::quiet({.max_length = Batch(3)});
    o.output_dir = dir;
    return trainer.fit(o);
  };
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string expected = holder + host;
  const auto listing = [&] {
    std::set<std::pair<std::string, std::uintmax_t>> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) files.emplace(e.path().string(), e.file_size());
    return files;
  };
  const auto before = listing();
  CHECK_THROWS_WITH_AS(fit_here(), doctest::Contains(expected.c_str()), FolderInUseError);
  CHECK(listing() == before);  // the refused process wrote nothing
  {
    // A search's trial waits for its folder's holder to end (a dead runner's trial, checkpointing);
    // the holder is killed with SIGKILL meanwhile, and the kernel releases its lock.
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::kill(child, SIGKILL);
    });
    const auto waited = dettrial::detail::FolderLock::acquire(dir / ".lock", "run folder", std::chrono::seconds(60));
    killer.join();
    CHECK(waited.held());
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));
  }
  const FitResult r = fit_here();
  CHECK(r.batches_trained == 3);
  // Within one process the lock is shared (the command line and the trainer it starts).
  const auto outer = dettrial::detail::FolderLock::acquire(dir / ".lock", "run folder");
  CHECK(fit_here().batches_trained == 3);
}

namespace {

/// torchvision's reference recipe in small: SGD with momentum, a LinearLR warmup then cosine
/// (SequentialLR, stepped every batch), and an EMA of the weights updated every 2 optimizer steps
/// after a warmup of 3, on which validation runs; a stop request at a chosen batch.
struct RecipeTrial : test::ImperativeRegression {
  dettrial::optim::SequentialLR<dettrial::optim::LinearLR, dettrial::optim::CosineAnnealingLR> schedule;
  dettrial::optim::AveragedModel<torch::nn::Sequential> ema;
  std::int64_t stop_at = -1;
  explicit RecipeTrial(Context& c)
      : ImperativeRegression(c),
        schedule(opt, std::tuple{dettrial::optim::LinearLR(opt, 0.1, 1.0, 4), dettrial::optim::CosineAnnealingLR(opt, 16)}, {4}),
        ema(model, dettrial::optim::ema(0.8)) {
    c.wrap_lr_scheduler(schedule, lr_step::every_batch{});
    if (c.get_hparam<bool>("ema")) c.wrap_averaged_model(ema, model, {.every_n_steps = 2, .warmup_steps = 3});
  }
  Metrics train_batch(test::Batch& b, std::int64_t e, std::int64_t i) {
    if (i + 1 == stop_at) context.set_stop_requested(true);
    return ImperativeRegression::train_batch(b, e, i);
  }
  Metrics evaluate_batch(test::Batch& b) {  // validation on the averaged weights
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(ema.module()->forward(x), y)}};
  }
};

std::vector<torch::Tensor> averaged_state(RecipeTrial& t) {
  std::vector<torch::Tensor> out;
  for (const auto& entry : dettrial::module_state_dict(*t.ema.weights())) out.push_back(entry.value().toTensor().clone());
  return out;
}

}  // namespace

TEST_CASE(
    "an EMA of the weights (torchvision's recipe: warmup, cosine, EMA) is checkpointed as torchvision's model_ema and resumes "
    "bit-identically") {
  const ContextOptions options{.trial_seed = 11};
  test::Context straight_context(test::hparams("ema: true"), options);
  Trainer<RecipeTrial> straight(straight_context);
  MetricsRecorder straight_metrics;
  const FitResult a = straight.fit(resumable_options(20), straight_metrics);
  REQUIRE(a.batches_trained == 20);
  // 20 optimizer steps: an update after steps 2, 4, ..., 20; those up to step 3 restart the average.
  CHECK(straight.trial().ema.n_averaged() == 9);

  test::Context first_context(test::hparams("ema: true"), options);
  Trainer<RecipeTrial> first(first_context);
  first.trial().stop_at = 9;
  const FitResult b1 = first.fit(resumable_options(20));
  REQUIRE(b1.batches_trained == 9);
  // The checkpoint holds the average under torchvision's key, in Python's AveragedModel layout.
  const StateDict top = dettrial::detail::read_state_dict_file(b1.checkpoints.back().path);
  REQUIRE(top.contains("model_ema"));
  const auto ema_state = top.at("model_ema").toGenericDict();
  CHECK(ema_state.at("n_averaged").toTensor().item<std::int64_t>() == 3);
  CHECK(ema_state.contains("module.0.weight"));

  test::Context second_context(test::hparams("ema: true"), ContextOptions{.trial_seed = 99});
  Trainer<RecipeTrial> second(second_context);
  MetricsRecorder resumed_metrics;
  FitOptions resume = resumable_options(20);
  resume.latest_checkpoint = b1.output_dir;
  const FitResult b2 = second.fit(resume, resumed_metrics);
  CHECK(b2.batches_trained == 20);
  CHECK(test::bit_identical(averaged_state(straight.trial()), averaged_state(second.trial())));
  const bool same_reports = resumed_metrics.rows == straight_metrics.after(9);
  CHECK(same_reports);  // validations ran on the same averaged weights

  // It learns: the averaged weights' last validation loss is below the first one's.
  std::vector<double> losses;
  for (const auto& [kind, batches, name, value] : straight_metrics.rows)
    if (name == "validation_loss") losses.push_back(value);
  REQUIRE(losses.size() >= 2);
  CHECK(losses.back() < losses.front());

  // A checkpoint without the average is refused by name for a trial that has one.
  test::Context plain_context(test::hparams("ema: false"), options);
  Trainer<RecipeTrial> plain(plain_context);
  const FitResult p = plain.fit(resumable_options(3));
  test::Context into_context(test::hparams("ema: true"), options);
  Trainer<RecipeTrial> into(into_context);
  FitOptions from_plain = resumable_options(6);
  from_plain.latest_checkpoint = p.output_dir;
  CHECK_THROWS_WITH_AS(into.fit(from_plain), doctest::Contains("has no 'model_ema' (the trial's averaged model)"), CheckpointError);
}

// ---- validation changes nothing the training reads; a stop on a validation boundary ------------

namespace {

/// What a validation could disturb, together: a model whose blocks are checkpointed
/// (nn::CheckpointEach) with BatchNorm (running statistics) and dropout (random draws), AdamW, a
/// warmup then cosine stepped every batch, and an EMA of the weights and buffers, validated on
/// beside the model. evaluate_batch notes the modes it finds; SIGTERM is raised in a chosen batch.
struct DisturbableTrial {
  Context& context;
  dettrial::nn::CheckpointEach model;
  torch::optim::AdamW opt;
  optim::SequentialLR<optim::LinearLR, optim::CosineAnnealingLR> schedule;
  optim::AveragedModel<dettrial::nn::CheckpointEach> ema;
  std::int64_t signal_in_batch = -1;
  /// Whether the model, then the average, was in training mode, for each validation batch.
  std::vector<bool> evaluated_training;
  explicit DisturbableTrial(Context& c)
      : context(c),
        model(c.wrap_model(dettrial::nn::CheckpointEach(torch::nn::Sequential(
            torch::nn::Linear(4, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(), torch::nn::Dropout(0.3), torch::nn::Linear(16, 1))))),
        opt(model->parameters(), torch::optim::AdamWOptions(c.get_hparam<double>("lr"))),
        schedule(opt, std::tuple{optim::LinearLR(opt, 0.1, 1.0, 4), optim::CosineAnnealingLR(opt, 30)}, {4}),
        ema(model, optim::ema(0.8, /*use_buffers=*/true)) {
    c.wrap_optimizer(opt);
    c.wrap_lr_scheduler(schedule, lr_step::every_batch{});
    c.wrap_averaged_model(ema, model, {.every_n_steps = 1});
  }
  auto build_training_data_loader() {
    auto [x, y] = test::regression_data(60);  // 7 batches of 8 and one of 4 an epoch
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = test::regression_data(20);
    return DataLoader(TensorDataset(x, y), {.batch_size = 6});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t batch_idx) {
    if (batch_idx == signal_in_batch) std::raise(SIGTERM);  // as if sent from outside
    auto& [x, y] = b;
    const torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    evaluated_training.push_back(model->is_training());
    evaluated_training.push_back(ema.module()->is_training());
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}, {"ema_loss", torch::mse_loss(ema.module()->forward(x), y)}};
  }
};

/// Everything the training reads after a fit: the model's parameters and buffers, the average's
/// state (Python's AveragedModel layout) and AdamW's state of each parameter.
std::vector<torch::Tensor> trained_state(DisturbableTrial& t) {
  std::vector<torch::Tensor> out;
  for (const auto& p : t.model->named_parameters()) out.push_back(p.value().detach().clone());
  for (const auto& b : t.model->named_buffers()) out.push_back(b.value().clone());
  for (const auto& e : dettrial::module_state_dict(*t.ema.weights())) out.push_back(e.value().toTensor().clone());
  for (const auto& p : t.opt.param_groups().at(0).params()) {
    const auto key = dettrial::detail::optimizer_state_key<std::decay_t<decltype(t.opt.state())>>(p);
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*t.opt.state().at(key));
    out.insert(out.end(), {state.exp_avg().clone(), state.exp_avg_sq().clone(), torch::tensor(static_cast<std::int64_t>(state.step()))});
  }
  return out;
}

FitOptions disturbable_options(TrainUnit validation_period) {
  return test::quiet({.max_length = Batch(20),
                      .validation_period = validation_period,
                      .checkpoint_policy = CheckpointPolicy::none,
                      .searcher_metric = "validation_loss"});
}

}  // namespace

TEST_CASE(
    "validation changes nothing the training reads: runs validating every 3 batches and never end with the same model, optimizer and "
    "average, bit for bit, and the average is evaluated in eval mode") {
  const auto train = [](TrainUnit validation_period, std::int64_t& validations) {
    test::Context context(test::hparams("lr: 0.01"), ContextOptions{.trial_seed = 7});
    Trainer<DisturbableTrial> trainer(context);
    validations = trainer.fit(disturbable_options(validation_period)).validations;
    for (const bool training : trainer.trial().evaluated_training) CHECK_FALSE(training);
    return trained_state(trainer.trial());
  };
  std::int64_t often = 0, once = 0, again = 0;
  const auto validating = train(Batch(3), often), plain = train(never(), once), plain_again = train(never(), again);
  CHECK(often == 7);                                 // at 3, 6, ..., 18 and at the end
  CHECK(once == 1);                                  // at the end only
  REQUIRE(test::bit_identical(plain, plain_again));  // a config trains the same numbers twice
  CHECK(test::bit_identical(validating, plain));
}

TEST_CASE(
    "a stop signal on a validation boundary validates there first, and the resumed run neither repeats it nor departs from the "
    "uninterrupted one") {
  const auto fresh_context = [] { return test::Context(test::hparams("lr: 0.01"), ContextOptions{.trial_seed = 7}); };
  auto straight_context = fresh_context();
  Trainer<DisturbableTrial> straight(straight_context);
  MetricsRecorder straight_metrics;
  REQUIRE(straight.fit(disturbable_options(Batch(4)), straight_metrics).batches_trained == 20);

  // SIGTERM in batch index 7: batch 8 ends on a validation boundary.
  auto first_context = fresh_context();
  Trainer<DisturbableTrial> first(first_context);
  first.trial().signal_in_batch = 7;
  MetricsRecorder first_metrics;
  const FitResult stopped = first.fit(disturbable_options(Batch(4)), first_metrics);
  CHECK(stopped.signal == SIGTERM);
  REQUIRE(stopped.batches_trained == 8);
  CHECK(stopped.validations == 2);  // at 4 and at 8, before the stop
  REQUIRE(!stopped.checkpoints.empty());
  CHECK(stopped.checkpoints.back().batches_trained == 8);
  auto up_to_8 = straight_metrics.rows;
  std::erase_if(up_to_8, [](const auto& row) { return std::get<1>(row) > 8; });
  const bool same_until_the_stop = first_metrics.rows == up_to_8;
  CHECK(same_until_the_stop);  // the validation at 8 included

  auto second_context = fresh_context();
  Trainer<DisturbableTrial> second(second_context);
  MetricsRecorder resumed_metrics;
  FitOptions resume = disturbable_options(Batch(4));
  resume.latest_checkpoint = stopped.output_dir;
  const FitResult resumed = second.fit(resume, resumed_metrics);
  CHECK(resumed.batches_trained == 20);
  const bool same_reports = resumed_metrics.rows == straight_metrics.after(8);
  CHECK(same_reports);  // no second validation at 8
  CHECK(test::bit_identical(trained_state(straight.trial()), trained_state(second.trial())));

  // A checkpoint taken on a validation boundary whose validation did not run (a run that did not
  // validate there, resumed with a period that does): the resumed run validates there first.
  auto unvalidated_context = fresh_context();
  Trainer<DisturbableTrial> unvalidated(unvalidated_context);
  unvalidated.trial().signal_in_batch = 7;
  const FitResult at_8 = unvalidated.fit(disturbable_options(never()));
  REQUIRE(at_8.batches_trained == 8);
  REQUIRE(at_8.validations == 0);
  auto late_context = fresh_context();
  Trainer<DisturbableTrial> late(late_context);
  MetricsRecorder late_metrics;
  FitOptions late_resume = disturbable_options(Batch(4));
  late_resume.latest_checkpoint = at_8.output_dir;
  const FitResult late_result = late.fit(late_resume, late_metrics);
  CHECK(late_result.validations == 4);  // at 8 first, then 12, 16, 20
  REQUIRE(!late_metrics.rows.empty());
  CHECK(std::get<0>(late_metrics.rows.front()) == "validation");
  // Its first validation is the straight run's at batch 8, before any training.
  const auto loss_at_8 = [](const MetricsRecorder& m, std::int64_t batches) {
    for (const auto& [kind, at, name, value] : m.rows)
      if (kind == "validation" && at == batches && name == "validation_loss") return value;
    return -1.0;
  };
  CHECK(loss_at_8(late_metrics, 0) == loss_at_8(straight_metrics, 8));
  CHECK(loss_at_8(straight_metrics, 8) > 0);
  CHECK(test::bit_identical(trained_state(straight.trial()), trained_state(late.trial())));
}
