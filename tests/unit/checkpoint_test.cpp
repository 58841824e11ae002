// Checkpoints: exact resume, crash safety (processes killed while saving), policies and retention,
// loading for use, stop signals, and clear errors for missing, damaged or mismatching checkpoints.
#include <doctest/doctest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "test_trials.hpp"

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

}  // namespace

TEST_CASE("stopping and resuming is bit-identical to training straight through") {
  // 64 records in batches of 8: an epoch is 8 batches. Aggregation frequency 2 and a stop after
  // batch 9 leave one batch of gradients pending in the checkpoint.
  const ContextOptions options{.trial_seed = 7, .aggregation_frequency = 2};
  Context straight_context(test::hparams(), options);
  Trainer<ResumableTrial> straight(straight_context);
  MetricsRecorder straight_metrics;
  BatchCounter straight_counter;
  const FitResult a = straight.fit(resumable_options(20), straight_metrics, straight_counter);
  REQUIRE(a.batches_trained == 20);

  Context first_context(test::hparams(), options);
  Trainer<ResumableTrial> first(first_context);
  first.trial().stop_at = 9;
  BatchCounter first_counter;
  const FitResult b1 = first.fit(resumable_options(20), first_counter);
  REQUIRE(b1.stop_requested);
  REQUIRE(b1.batches_trained == 9);
  REQUIRE(!b1.checkpoints.empty());
  CHECK(b1.checkpoints.back().batches_trained == 9);

  // A new process would have another seed; everything that matters comes from the checkpoint.
  Context second_context(test::hparams(), ContextOptions{.trial_seed = 99, .aggregation_frequency = 2});
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

TEST_CASE("a checkpoint directory has Determined's layout and metadata") {
  Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(5), .searcher_metric = "validation_loss"}));
  REQUIRE(r.checkpoints.size() == 1);
  const CheckpointInfo& info = r.checkpoints.back();
  CHECK(info.path == r.checkpoint_dir / info.uuid);
  CHECK(info.batches_trained == 5);
  CHECK(info.validation_metric == r.last_validation_metrics.get("validation_loss"));
  for (const char* file : {"state_dict.pth", "dettrial_state.pt", "trial_state.json", "load_data.json", "metadata.json"})
    CHECK_MESSAGE(fs::exists(info.path / file), file);
  const YAML::Node meta = YAML::LoadFile((info.path / "metadata.json").string());
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
    Context context(test::hparams(), ContextOptions{.trial_seed = 5});
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
  Context trained_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<test::DeclarativeRegression> trained(trained_context);
  const FitResult r = trained.fit(test::quiet({.max_length = Batch(6)}));

  Context fresh_context(test::hparams(), ContextOptions{.trial_seed = 12});
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
  Context c1(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<test::DeclarativeRegression> t1(c1);
  const FitResult r1 = t1.fit(test::quiet({.max_length = Batch(4), .trial_id = 1}));
  Context c2(test::hparams(), ContextOptions{.trial_seed = 2});
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
  Context context(test::hparams(), ContextOptions{.trial_seed = 4});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(
      test::quiet({.max_length = Batch(4), .checkpoint_period = Batch(2), .retention = {.save_trial_best = 0, .save_trial_latest = 5}}));
  REQUIRE(r.checkpoints.size() == 2);
  const fs::path older = r.checkpoints[0].path, newer = r.checkpoints[1].path;
  const std::size_t before = count_dirs(r.checkpoint_dir);

  auto resume = [&](const fs::path& from) {
    Context c(test::hparams(), ContextOptions{.trial_seed = 4});
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
  future.replace(future.find("\"dettrial_format\": 1"), 20, "\"dettrial_format\": 99");
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
    Context c(test::hparams(), ContextOptions{.trial_seed = 4});
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
    Context c(test::hparams(), ContextOptions{.trial_seed = 4});
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
  Context context(test::hparams(), ContextOptions{.trial_seed = 2});
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
    Context again(test::hparams(), ContextOptions{.trial_seed = 3});
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

}  // namespace

TEST_CASE("child process: writes checkpoints until killed" * doctest::skip()) {
  const char* dir = std::getenv("DETTRIAL_CHILD_DIR");
  REQUIRE(dir != nullptr);
  Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
  Trainer<FillTrial> trainer(context);
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
  Context context(Hyperparameters{}, ContextOptions{.trial_seed = 1});
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
  std::uniform_int_distribution<int> delay_ms(150, 1200);
  std::int64_t last_seen = 0;
  int kills_with_checkpoints = 0;
  for (int round = 0; round < 16; ++round) {
    const pid_t child = test::spawn_self("child process: writes checkpoints until killed", {"DETTRIAL_CHILD_DIR=" + dir.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));

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
