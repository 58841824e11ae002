// The Keras-style trial: compile by names, Keras's losses and metrics, the steps dettrial writes,
// val_ names, early stopping, and exact resume.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dettrial/keras.hpp>

#include "ranks.hpp"  // test_trials.hpp, and running ranks
#include "applied_context.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

/// Three separable clusters in 2-D, 90 points (an epoch of 3 batches of 32: the last one partial).
struct Clusters {
  torch::Tensor x, y;
};
Clusters clusters(std::int64_t n = 90) {
  auto gen = at::detail::createCPUGenerator(42);
  torch::Tensor y = torch::arange(n, torch::kLong) % 3;
  torch::Tensor centres = torch::tensor({{3.0f, 0.0f}, {-3.0f, 3.0f}, {0.0f, -3.0f}});
  return {centres.index_select(0, y) + 0.5 * torch::randn({n, 2}, gen), y};
}

/// The tutorial's shape in small: a compiled model and two in-memory sequences, no train_batch.
struct ClusterTrial {
  Context& context;
  Clusters data = clusters();
  explicit ClusterTrial(Context& c) : context(c) {}
  auto build_model() {
    torch::nn::Sequential model(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
    keras::initialize_like_keras(*model);
    model = context.wrap_model(model);
    return keras::compile(model,
                          {.optimizer = "adam", .loss = keras::losses::sparse_categorical_crossentropy(true), .metrics = {"accuracy"}});
  }
  keras::InMemorySequence build_training_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 32}; }
  keras::InMemorySequence build_validation_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 30, .shuffle = false}; }
};

/// Builds its model without wrapping it (dettrial wraps it), with an optimizer object, and stops early.
struct EarlyTrial {
  Context& context;
  Clusters data = clusters();
  explicit EarlyTrial(Context& c) : context(c) {}
  auto build_model() {
    torch::nn::Sequential model(torch::nn::Linear(2, 3));
    // Learning rate 0: val_loss never improves after the first validation.
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.0));
    return keras::compile(model, {.optimizer = sgd, .loss = keras::losses::sparse_categorical_crossentropy(true)});
  }
  keras::InMemorySequence build_training_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 10}; }
  keras::InMemorySequence build_validation_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 90}; }
  auto keras_callbacks() { return std::make_tuple(keras::EarlyStopping(context, {.monitor = "val_loss", .patience = 2})); }
};

std::vector<torch::Tensor> weights(Context& c) { return test::parameters_of(c); }

/// A tensor for the Python checks: {"shape": [...], "values": [...]} (doubles, on the CPU).
nlohmann::json tensor_json(const torch::Tensor& t) {
  const torch::Tensor flat = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape({-1});
  return nlohmann::json{{"shape", t.sizes().vec()},
                        {"values", std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel())}};
}

}  // namespace

TEST_CASE("keras::compile resolves names as Keras does, and names what it does not know") {
  torch::nn::Linear model(2, 3);
  auto adam = keras::compile(model, {.optimizer = "adam", .metrics = {"accuracy", "mse"}});
  auto* options = dynamic_cast<torch::optim::AdamOptions*>(&adam.optimizer->param_groups()[0].options());
  REQUIRE(options != nullptr);
  CHECK(options->lr() == doctest::Approx(1e-3));
  CHECK(options->eps() == doctest::Approx(1e-7));  // Keras's epsilon, not LibTorch's 1e-8
  REQUIRE(adam.metrics.size() == 2);
  CHECK(adam.metrics[0].kind == keras::CompiledMetric::Kind::sparse_categorical_accuracy);
  CHECK(adam.metrics[0].validation_name.view() == "val_accuracy");
  CHECK(adam.metrics[1].kind == keras::CompiledMetric::Kind::mean_squared_error);
  auto categorical = keras::compile(model, {.loss = keras::losses::categorical_crossentropy(), .metrics = {"accuracy"}});
  CHECK(categorical.metrics[0].kind == keras::CompiledMetric::Kind::categorical_accuracy);
  CHECK(dynamic_cast<torch::optim::RMSprop*>(categorical.optimizer.get()) != nullptr);  // Keras's default optimizer
  CHECK_THROWS_WITH_AS(keras::compile(model, {.optimizer = "adamm"}), doctest::Contains("unknown optimizer 'adamm'; did you mean 'adam'?"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(keras::compile(model, {.metrics = {"acuracy"}}),
                       doctest::Contains("unknown metric 'acuracy'; did you mean 'accuracy'?"), ConfigError);
  CHECK_THROWS_WITH_AS(keras::compile(model, {.metrics = {"loss"}}), doctest::Contains("'loss' is always reported"), ConfigError);
}

TEST_CASE("Keras's losses and metrics: the batch means Keras computes") {
  const torch::Tensor logits = torch::tensor({{2.0f, 0.5f, -1.0f}, {0.1f, 0.2f, 3.0f}, {1.0f, 1.0f, 0.0f}});
  const torch::Tensor labels = torch::tensor({0, 2, 1}, torch::kLong);
  const torch::Tensor probabilities = torch::softmax(logits, 1);
  const double expected = torch::cross_entropy_loss(logits, labels).item<double>();
  using dettrial::detail::loss_value;
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(true), logits, labels).item<double>() == doctest::Approx(expected));
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(false), probabilities, labels).item<double>() ==
        doctest::Approx(expected).epsilon(1e-5));
  // Labels of shape (N, 1), as keras.datasets gives some: squeezed as Keras does.
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(true), logits, labels.unsqueeze(1)).item<double>() ==
        doctest::Approx(expected));
  CHECK(dettrial::detail::metric_value(keras::CompiledMetric::Kind::sparse_categorical_accuracy, logits, labels.unsqueeze(1))
            .item<double>() == doctest::Approx(2.0 / 3.0));
  // Outputs under autocast (bf16) give the loss in float32.
  CHECK((loss_value(keras::losses::sparse_categorical_crossentropy(true), logits.to(torch::kBFloat16), labels).scalar_type() ==
         torch::kFloat));
  const torch::Tensor one_hot = torch::one_hot(labels, 3);
  CHECK(loss_value(keras::losses::categorical_crossentropy(true), logits, one_hot).item<double>() == doctest::Approx(expected));
  // Probabilities are clipped to [1e-7, 1 - 1e-7] before the logarithm, as Keras does: a zero costs -log(1e-7).
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(false), torch::tensor({{0.0f, 1.0f}}), torch::tensor({0}, torch::kLong))
            .item<double>() == doctest::Approx(-std::log(1e-7)).epsilon(1e-4));
  using Kind = keras::CompiledMetric::Kind;
  CHECK(dettrial::detail::metric_value(Kind::sparse_categorical_accuracy, logits, labels).item<double>() == doctest::Approx(2.0 / 3.0));
  CHECK(dettrial::detail::metric_value(Kind::categorical_accuracy, logits, one_hot).item<double>() == doctest::Approx(2.0 / 3.0));
  CHECK(dettrial::detail::metric_value(Kind::binary_accuracy, torch::tensor({0.9f, 0.2f, 0.6f}), torch::tensor({1.0f, 0.0f, 0.0f}))
            .item<double>() == doctest::Approx(2.0 / 3.0));
}

TEST_CASE("a Keras-style trial trains under Trainer: loss and accuracy, val_ names, metrics.jsonl") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<ClusterTrial> trainer(context);
  static_assert(std::is_same_v<decltype(trainer.trial()), ClusterTrial&>);
  const FitResult r = trainer.fit(test::quiet(
      {.max_length = Epoch(200), .validation_period = Epoch(50), .searcher_metric = "val_accuracy", .smaller_is_better = false}));
  CHECK(r.batches_trained == 600);  // 3 batches an epoch (32, 32, 26)
  CHECK(r.last_training_metrics.contains("loss"));
  CHECK(r.last_training_metrics.contains("accuracy"));
  CHECK(r.last_validation_metrics.at("val_accuracy") > 0.95);
  CHECK(r.last_validation_metrics.at("val_loss") < 0.3);
  CHECK_FALSE(r.last_validation_metrics.contains("accuracy"));
  std::ifstream in(r.output_dir / "metrics.jsonl");
  std::string line, last_validation;
  while (std::getline(in, line))
    if (line.find("\"type\":\"validation\"") != std::string::npos) last_validation = line;
  CHECK(last_validation.find("\"val_loss\"") != std::string::npos);
  CHECK(last_validation.find("\"val_accuracy\"") != std::string::npos);
}

TEST_CASE("a Keras-style trial's epochs follow records_per_epoch, as Determined's TFKerasTrial counts them") {
  // 90 records in sequences of 32 are 3 batches; records_per_epoch 64 of global batches of 8 is 8.
  const ExperimentConfig config = ExperimentConfig::parse("hyperparameters: {global_batch_size: 8}\nrecords_per_epoch: 64\n", "test");
  test::Context context(config, ContextOptions{.trial_seed = 3});
  Trainer<ClusterTrial> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(2)}));
  CHECK(r.batches_trained == 16);
  CHECK(r.epochs_trained == 2);
}

TEST_CASE("a Keras-style trial stops and resumes bit-identically (model, Adam's state, the data order)") {
  const auto options = [](std::int64_t length) {
    return test::quiet({.max_length = Batch(length), .checkpoint_period = Batch(4), .searcher_metric = "val_loss"});
  };
  test::Context straight_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<ClusterTrial> straight(straight_context);
  straight.fit(options(10));

  test::Context first_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<ClusterTrial> first(first_context);
  const FitResult stopped = first.fit(options(5));  // checkpoints at 4 and at the end, 5: mid-epoch
  REQUIRE(stopped.checkpoints.back().batches_trained == 5);

  test::Context second_context(test::hparams(), ContextOptions{.trial_seed = 99});
  Trainer<ClusterTrial> second(second_context);
  FitOptions resume = options(10);
  resume.latest_checkpoint = stopped.output_dir;
  const FitResult resumed = second.fit(resume);
  CHECK(resumed.resumed_from_batch == 5);
  const auto a = weights(straight_context), b = weights(second_context);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
}

TEST_CASE("keras::EarlyStopping stops after patience validations without improvement, counting on after a resume") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<EarlyTrial> trainer(context);  // the model is wrapped by dettrial: build_model did not
  CHECK(context.models().size() == 1);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(50), .validation_period = Batch(3), .searcher_metric = "val_loss"}));
  // Validations at 3 (the best), 6 (wait 1), 9 (wait 2: stop).
  CHECK(r.stop_requested);
  CHECK(r.batches_trained == 9);

  keras::EarlyStopping early(context, {.monitor = "val_accuracy", .patience = 1});  // "acc": larger is better
  MetricValues m;
  m.set("val_accuracy", 0.5);
  early.on_validation_end(m);
  CHECK(early.wait() == 0);
  early.on_validation_end(m);  // no improvement
  CHECK(early.wait() == 1);
  keras::EarlyStopping restored(context, {.monitor = "val_accuracy", .patience = 1});
  restored.load_state_dict(early.state_dict());
  CHECK(restored.wait() == 1);
  MetricValues other;
  other.set("accuracy", 1.0);
  CHECK_THROWS_WITH_AS(restored.on_validation_end(other),
                       doctest::Contains("monitors 'val_accuracy', which validation does not report (it reports accuracy)"), TrialError);
}

TEST_CASE("Keras-style validation means are weighted by records, as Keras's evaluate weights them") {
  // 90 validation records in batches of 32: 32, 32 and a partial 26, which counts by its size.
  struct PartialBatches : ClusterTrial {
    using ClusterTrial::ClusterTrial;
    keras::InMemorySequence build_validation_data_loader() {
      return {.data = data.x, .labels = data.y, .batch_size = 32, .shuffle = false};
    }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<PartialBatches> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(4), .validation_period = Batch(4)}));
  // One pass over the whole set, as Keras's evaluate reports it.
  torch::NoGradGuard no_grad;
  const auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(context.models().at(0));
  REQUIRE(model);
  model->eval();
  const Clusters data = clusters();
  const torch::Tensor labels = data.y.to(context.device());
  const torch::Tensor logits = model->forward(data.x.to(context.device()));
  const double loss = torch::nn::functional::cross_entropy(logits, labels).item<double>();
  const double accuracy = logits.argmax(-1).eq(labels).to(torch::kDouble).mean().item<double>();
  CHECK(r.last_validation_metrics.at("val_loss") == doctest::Approx(loss).epsilon(1e-6));
  CHECK(r.last_validation_metrics.at("val_accuracy") == doctest::Approx(accuracy).epsilon(1e-6));
  // Averaging the three batch means alone would be off by more than that.
  double batch_mean = 0;
  for (const std::int64_t first : {0, 32, 64}) {
    const std::int64_t n = std::min<std::int64_t>(32, 90 - first);
    batch_mean += torch::nn::functional::cross_entropy(logits.narrow(0, first, n), labels.narrow(0, first, n)).item<double>() / 3;
  }
  CHECK(batch_mean != doctest::Approx(loss).epsilon(1e-6));

  // For Keras itself (tests/python/keras_evaluate.py): the data, the weights and what dettrial reported.
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    nlohmann::json out;
    out["x"] = tensor_json(data.x);
    out["y"] = tensor_json(data.y);
    for (const auto& item : model->named_parameters()) out["weights"][item.key()] = tensor_json(item.value());
    out["batch_size"] = 32;
    out["val_loss"] = r.last_validation_metrics.at("val_loss");
    out["val_accuracy"] = r.last_validation_metrics.at("val_accuracy");
    fs::create_directories(keep);
    std::ofstream(fs::path(keep) / "evaluate.json") << out.dump();
  }
}

namespace {
nlohmann::json as_json_array(const torch::Tensor& t) {
  const torch::Tensor flat = t.detach().to(torch::kDouble).contiguous().reshape({-1});
  return nlohmann::json{{"shape", t.sizes().vec()},
                        {"values", std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel())}};
}

/// A Keras-style regression trial whose training data come weighted.
struct WeightedTrial {
  Context& context;
  Clusters data = clusters();
  double learning_rate;
  keras::WeightedSequence training;
  WeightedTrial(Context& c, double lr, keras::WeightedSequence train) : context(c), learning_rate(lr), training(std::move(train)) {}
  auto build_model() {
    torch::manual_seed(11);
    torch::nn::Sequential model(torch::nn::Linear(2, 3));
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(learning_rate));
    return keras::compile(model, {.optimizer = sgd, .loss = keras::losses::sparse_categorical_crossentropy(true)});
  }
  keras::WeightedSequence build_training_data_loader() { return training; }
  keras::InMemorySequence build_validation_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 30, .shuffle = false}; }
};
}  // namespace

TEST_CASE("keras::WeightedSequence: sample and class weights weigh each sample's loss as Keras does") {
  using dettrial::detail::weighted_loss_value;
  auto gen = at::detail::createCPUGenerator(5);
  const torch::Tensor logits = torch::randn({6, 3}, gen), weights = torch::tensor({1.0f, 2.0f, 0.0f, 0.5f, 1.5f, 3.0f});
  const torch::Tensor labels = torch::tensor({0, 2, 1, 1, 0, 2}, torch::kLong);
  const torch::Tensor probabilities = torch::softmax(logits, -1), one_hot = torch::one_hot(labels, 3).to(torch::kFloat);
  const torch::Tensor targets = torch::randn({6, 2}, gen), outputs = torch::randn({6, 2}, gen);
  const torch::Tensor binary = torch::tensor({{1.0f}, {0.0f}, {1.0f}, {1.0f}, {0.0f}, {0.0f}}), binary_logits = torch::randn({6, 1}, gen);
  struct Case {
    const char* name;
    bool from_logits;
    keras::Loss loss;
    torch::Tensor y_true, y_pred;
  };
  namespace L = keras::losses;
  const std::vector<Case> cases = {
      {"sparse_categorical_crossentropy", true, L::sparse_categorical_crossentropy(true), labels, logits},
      {"sparse_categorical_crossentropy", false, L::sparse_categorical_crossentropy(false), labels, probabilities},
      {"categorical_crossentropy", true, L::categorical_crossentropy(true), one_hot, logits},
      {"binary_crossentropy", true, L::binary_crossentropy(true), binary, binary_logits},
      {"binary_crossentropy", false, L::binary_crossentropy(false), binary, torch::sigmoid(binary_logits)},
      {"mean_squared_error", false, L::MeanSquaredError{}, targets, outputs},
      {"mean_absolute_error", false, L::MeanAbsoluteError{}, targets, outputs},
  };
  nlohmann::json out = nlohmann::json::array();
  for (const Case& c : cases) {
    CAPTURE(c.name);
    // Weights of 1 are the unweighted loss; the weighted one is sum(w x loss) / batch size.
    CHECK(weighted_loss_value(c.loss, c.y_pred, c.y_true, torch::ones({6})).item<double>() ==
          doctest::Approx(dettrial::detail::loss_value(c.loss, c.y_pred, c.y_true).item<double>()).epsilon(1e-6));
    const double value = weighted_loss_value(c.loss, c.y_pred, c.y_true, weights).item<double>();
    out.push_back({{"loss", c.name},
                   {"from_logits", c.from_logits},
                   {"y_true", as_json_array(c.y_true)},
                   {"y_pred", as_json_array(c.y_pred)},
                   {"sample_weight", as_json_array(weights)},
                   {"value", value}});
  }
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    fs::create_directories(keep);
    std::ofstream(fs::path(keep) / "weighted_losses.json") << out.dump();
  }
  // Sample weights times class weights; a label without a class weight weighs 1.
  const keras::WeightedSequence both{.data = torch::zeros({4, 2}),
                                     .labels = torch::tensor({0, 1, 2, 1}),
                                     .sample_weights = torch::tensor({1.0, 2.0, 3.0, 4.0}),
                                     .class_weight = {{1, 0.5}, {2, 2.0}}};
  CHECK(torch::equal(dettrial::detail::combined_weights(both), torch::tensor({1.0f, 1.0f, 6.0f, 2.0f})));
  CHECK_THROWS_WITH_AS(
      dettrial::detail::combined_weights({.data = torch::zeros({4, 2}), .labels = torch::zeros({4}), .sample_weights = torch::ones({3})}),
      "keras::WeightedSequence has 4 inputs but 3 sample weights", TrialError);
  CHECK_THROWS_WITH_AS(
      weighted_loss_value(L::Custom([](const torch::Tensor& p, const torch::Tensor&) { return p.sum(); }), logits, labels, weights),
      doctest::Contains("a custom loss returns one number for the batch"), TrialError);
}

TEST_CASE("keras::WeightedSequence trains weighted: weights of 2 step as twice the learning rate, class_weight only for training") {
  const Clusters data = clusters();
  auto run = [&](double lr, keras::WeightedSequence train) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
    Trainer<WeightedTrial> trainer(context, lr, std::move(train));
    trainer.fit(test::quiet({.max_length = Batch(3), .validation_period = Batch(3)}));
    return test::parameters_of(context);
  };
  const auto doubled =
      run(0.05, {.data = data.x, .labels = data.y, .sample_weights = torch::full({90}, 2.0), .batch_size = 32, .shuffle = false});
  const auto by_class =
      run(0.05, {.data = data.x, .labels = data.y, .class_weight = {{0, 2.0}, {1, 2.0}, {2, 2.0}}, .batch_size = 32, .shuffle = false});
  const auto plain = run(0.1, {.data = data.x, .labels = data.y, .batch_size = 32, .shuffle = false});
  REQUIRE(doubled.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CHECK(torch::allclose(doubled[i], plain[i], 1e-5, 1e-6));
    CHECK(torch::allclose(by_class[i], plain[i], 1e-5, 1e-6));
  }
  // Keras's evaluate takes no class_weight: a validation sequence with one is refused, by name.
  struct ClassWeightedValidation : WeightedTrial {
    using WeightedTrial::WeightedTrial;
    keras::WeightedSequence build_validation_data_loader() { return {.data = data.x, .labels = data.y, .class_weight = {{0, 2.0}}}; }
  };
  auto refused = [&] {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
    Trainer<ClassWeightedValidation> trainer(context, 0.1, keras::WeightedSequence{.data = data.x, .labels = data.y});
    trainer.fit(test::quiet({.max_length = Batch(1)}));
  };
  CHECK_THROWS_WITH_AS(refused(), doctest::Contains("class_weight applies to training only"), TrialError);
}

// ---- Keras's callbacks --------------------------------------------------------------------------

namespace {
/// Eight epochs' logs (training means and validation metrics), the same for dettrial and for Keras.
struct EpochLog {
  double loss, accuracy, val_loss, val_accuracy;
};
const std::vector<EpochLog> epoch_logs = {{1.1, 0.45, 1.0, 0.5},      {0.9, 0.55, 0.8, 0.6},    {0.85, 0.58, 0.8, 0.6},
                                          {0.84, 0.6, 0.79995, 0.61}, {0.86, 0.57, 0.85, 0.55}, {0.75, 0.66, 0.7, 0.7},
                                          {0.74, 0.68, 0.7, 0.7},     {0.73, 0.69, 0.71, 0.69}};
MetricValues training_of(const EpochLog& e) {
  MetricValues m;
  m.set("loss", e.loss);
  m.set("accuracy", e.accuracy);
  return m;
}
MetricValues validation_of(const EpochLog& e) {
  MetricValues m;
  m.set("val_loss", e.val_loss);
  m.set("val_accuracy", e.val_accuracy);
  return m;
}
}  // namespace

TEST_CASE("Keras's callbacks over eight epochs: ReduceLROnPlateau, EarlyStopping, ModelCheckpoint and CSVLogger as Keras 3 acts") {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  // One context each: EarlyStopping's stop request must be its own.
  test::Context lr_context(test::hparams()), stop_context(test::hparams()), file_context(test::hparams());
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
  lr_context.wrap_optimizer(sgd);
  file_context.wrap_model(torch::nn::Linear(2, 1));

  keras::ReduceLROnPlateau reduce(lr_context, {.monitor = "val_loss", .factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.002});
  keras::EarlyStopping early(stop_context, {.monitor = "val_accuracy", .min_delta = 0.005, .patience = 2});
  const std::string pattern = (dir / "ckpt" / "w-{epoch:02d}-{val_loss:.3f}.pt").string();
  keras::ModelCheckpoint best(file_context, {.filepath = pattern, .monitor = "val_loss", .save_best_only = true});
  const fs::path csv = dir / "log.csv";
  keras::CSVLogger logger(file_context, {.filename = csv});
  best.on_trial_startup(0, "");
  logger.on_trial_startup(0, "");
  logger.on_training_start();

  std::vector<double> lrs;
  std::int64_t stopped_epoch = -1;
  for (std::size_t e = 0; e < epoch_logs.size(); ++e) {
    const MetricValues validation = validation_of(epoch_logs[e]);
    reduce.on_validation_end(validation);
    lrs.push_back(sgd.param_groups()[0].options().get_lr());
    early.on_validation_end(validation);
    if (stopped_epoch < 0 && stop_context.get_stop_requested()) stopped_epoch = static_cast<std::int64_t>(e);
    best.on_training_workload_end(training_of(epoch_logs[e]));
    best.on_validation_end(validation);
    logger.on_training_workload_end(training_of(epoch_logs[e]));
    logger.on_validation_end(validation);
  }
  // Worked by hand from Keras 3's rules (monitor - min_delta strictly better; patience counted
  // after the cooldown; the rate halved to float32 0.005, then 0.0025 above min_lr).
  const std::vector<double> expected_lrs = {0.01,           0.01,           0.01,           double(0.005f),
                                            double(0.005f), double(0.005f), double(0.005f), double(0.0025f)};
  CHECK(lrs == expected_lrs);
  CHECK(stopped_epoch == 7);
  std::vector<std::string> saved;
  for (const fs::path& p : best.saved()) saved.push_back(p.filename().string());
  CHECK(saved == std::vector<std::string>{"w-01-1.000.pt", "w-02-0.800.pt", "w-04-0.800.pt", "w-06-0.700.pt"});
  CHECK(fs::exists(dir / "ckpt" / "w-06-0.700.pt"));
  const std::string text = test::read_text(csv);
  CHECK(text.rfind("epoch,accuracy,loss,val_accuracy,val_loss\r\n0,0.45,1.1,0.5,1.0\r\n1,0.55,0.9,0.6,0.8\r\n", 0) == 0);
  CHECK(text.find("3,0.6,0.84,0.61,0.79995\r\n") != std::string::npos);

  // Python's float text and str.format, which the file names and rows follow.
  CHECK(dettrial::detail::python_float(0.0001) == "0.0001");
  CHECK(dettrial::detail::python_float(1e-5) == "1e-05");
  CHECK(dettrial::detail::python_float(123456789.0) == "123456789.0");
  CHECK(dettrial::detail::python_float(1e16) == "1e+16");
  CHECK(dettrial::detail::python_float(-2.5e-7) == "-2.5e-07");
  CHECK(dettrial::detail::python_float(0.1 + 0.2) == "0.30000000000000004");
  CHECK(dettrial::detail::python_float(std::nan("")) == "nan");
  MetricValues logs;
  logs.set("val_loss", 0.123456);
  CHECK(dettrial::detail::python_format("m-{epoch:03d}-{val_loss:.2f}-{val_loss}-{{x}}", 7, logs, "t") == "m-007-0.12-0.123456-{x}");
  CHECK_THROWS_WITH_AS(
      dettrial::detail::python_format("m-{val_acc:.2f}", 1, logs, "keras::ModelCheckpoint"),
      doctest::Contains("keras::ModelCheckpoint: cannot format 'm-{val_acc:.2f}': no value named 'val_acc' (there are epoch, val_loss)"),
      ConfigError);
  CHECK_THROWS_WITH_AS(dettrial::detail::python_format("{val_loss:d}", 1, logs, "t"), doctest::Contains("Unknown format code 'd'"),
                       ConfigError);

  // Refusals in Keras's words, or one sentence where Keras would guess.
  CHECK_THROWS_WITH_AS(keras::ReduceLROnPlateau(lr_context, {.factor = 1.0}), doctest::Contains("does not support a factor >= 1.0"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(keras::EarlyStopping(stop_context, {.monitor = "val_f1"}),
                       doctest::Contains("cannot tell whether 'val_f1' should be maximized or minimized"), ConfigError);

  // A resumed callback counts on: its state is checkpointed.
  keras::ReduceLROnPlateau again(lr_context, {.monitor = "val_loss", .factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.002});
  again.load_state_dict(reduce.state_dict());
  CHECK(again.cooldown_counter() == reduce.cooldown_counter());
  CHECK(again.best() == reduce.best());

  // For Keras itself (tests/python/keras_callbacks.py): the logs and what dettrial did with them.
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    nlohmann::json out;
    for (const EpochLog& e : epoch_logs)
      out["logs"].push_back({{"loss", e.loss}, {"accuracy", e.accuracy}, {"val_loss", e.val_loss}, {"val_accuracy", e.val_accuracy}});
    out["reduce_lr"] = {{"initial_lr", 0.01}, {"factor", 0.5}, {"patience", 2}, {"cooldown", 1}, {"min_lr", 0.002}, {"lrs", lrs}};
    out["early_stopping"] = {{"monitor", "val_accuracy"}, {"min_delta", 0.005}, {"patience", 2}, {"stopped_epoch", stopped_epoch}};
    out["model_checkpoint"] = {{"filepath", "w-{epoch:02d}-{val_loss:.3f}.pt"}, {"saved", saved}};
    out["csv"] = text;
    fs::create_directories(keep);
    std::ofstream(fs::path(keep) / "callbacks.json") << out.dump();
  }
}

namespace {
/// ClusterTrial with Keras's callbacks writing into `dir`, validating every 3 batches.
struct LoggingTrial : ClusterTrial {
  fs::path dir;
  LoggingTrial(Context& c, fs::path d) : ClusterTrial(c), dir(std::move(d)) {}
  auto keras_callbacks() {
    return std::make_tuple(keras::CSVLogger(context, {.filename = dir / "log.csv"}),
                           keras::ModelCheckpoint(context, {.filepath = (dir / "latest.pt").string()}));
  }
};
FitResult logging_run(const fs::path& dir, std::int64_t length, std::optional<fs::path> resume = std::nullopt) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
  Trainer<LoggingTrial> trainer(context, dir);
  FitOptions o = test::quiet(
      {.max_length = Batch(length), .validation_period = Batch(3), .checkpoint_period = Batch(3), .reporting_period = Batch(2)});
  o.latest_checkpoint = std::move(resume);
  return trainer.fit(o);
}
}  // namespace

TEST_CASE(
    "keras::CSVLogger and ModelCheckpoint in a fit: a row per validation with the training means since the last, and a resumed run writes "
    "no row twice") {
  const fs::path straight = test::quiet({}).output_dir, split = test::quiet({}).output_dir;
  logging_run(straight, 12);
  const std::string rows = test::read_text(straight / "log.csv");
  // A header and one row per validation (3, 6, 9 and 12 batches), epochs counted from 0.
  CHECK(rows.rfind("epoch,accuracy,loss,val_accuracy,val_loss\r\n0,", 0) == 0);
  CHECK(std::count(rows.begin(), rows.end(), '\n') == 5);
  CHECK(rows.find("\r\n3,") != std::string::npos);
  // The model's weights as Python's torch.save(model.state_dict()) writes them, read back.
  torch::nn::Sequential model(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  load_weights(model, straight / "latest.pt");

  // Stopped after its checkpoint at 6, a row written past it (as if it died after validating at 9),
  // then resumed: the file ends as the straight run's.
  const FitResult first = logging_run(split, 6);
  std::ofstream(split / "log.csv", std::ios::app) << "2,0.1,0.2,0.3,0.4\r\n";
  logging_run(split, 12, first.output_dir);
  CHECK(test::read_text(split / "log.csv") == rows);
}

namespace {
/// ClusterTrial whose loss turns NaN from its 8th training batch.
struct DivergingTrial : ClusterTrial {
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  using ClusterTrial::ClusterTrial;
  auto build_model() {
    auto compiled = ClusterTrial::build_model();
    compiled.loss = keras::losses::Custom([calls = calls](const torch::Tensor& y_pred, const torch::Tensor& y) {
      const torch::Tensor loss = torch::nn::functional::cross_entropy(y_pred, y);
      return ++*calls >= 8 ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
    });
    return compiled;
  }
  auto keras_callbacks() { return std::make_tuple(keras::TerminateOnNaN(context)); }
};
}  // namespace

TEST_CASE("keras::TerminateOnNaN stops at the end of the reporting period whose loss is NaN, without a wait a batch") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 2});
  Trainer<DivergingTrial> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(30), .validation_period = Batch(100), .reporting_period = Batch(4)}));
  CHECK(r.stop_requested);
  CHECK(r.batches_trained == 8);  // NaN in batch 8 (index 7): the period of batches 5-8 reports it
  CHECK(std::isnan(r.last_training_metrics.at("loss")));
}

// ---- Data parallel -------------------------------------------------------------------------------

namespace {
/// The cluster trial over 90 training records in global batches of 30 (15 a rank) and 91 validation
/// records in batches of 20: the ranks' validation shards and last batches differ in size.
struct RankedKerasTrial {
  Context& context;
  Clusters train = clusters(90), validation = clusters(91);
  explicit RankedKerasTrial(Context& c) : context(c) {}
  auto build_model() {
    torch::nn::Sequential model(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
    keras::initialize_like_keras(*model);
    return keras::compile(context.wrap_model(model),
                          {.optimizer = "adam", .loss = keras::losses::sparse_categorical_crossentropy(true), .metrics = {"accuracy"}});
  }
  keras::InMemorySequence build_training_data_loader() {
    return {.data = train.x, .labels = train.y, .batch_size = context.get_per_slot_batch_size()};
  }
  keras::InMemorySequence build_validation_data_loader() {
    return {.data = validation.x, .labels = validation.y, .batch_size = 20, .shuffle = false};
  }
};
FitResult ranked_keras_fit(Context& context, const fs::path& out, std::vector<torch::Tensor>* parameters = nullptr) {
  Trainer<RankedKerasTrial> trainer(context);
  FitOptions o = test::quiet({.max_length = Batch(12), .validation_period = Batch(6)});
  o.output_dir = out;
  FitResult r = trainer.fit(o);
  if (parameters) *parameters = test::parameters_of(context);  // while the trainer holds the model
  return r;
}
}  // namespace

TEST_CASE("child process: a Keras-style rank" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  test::Context context(Hyperparameters::parse("global_batch_size: 30\n"), ContextOptions{.trial_seed = 4, .communicator = comm});
  const FitResult r = ranked_keras_fit(context, dir / "run");
  nlohmann::json out = {{"val_loss", r.last_validation_metrics.at("val_loss")},
                        {"val_accuracy", r.last_validation_metrics.at("val_accuracy")},
                        {"loss", r.last_training_metrics.at("loss")}};
  std::ofstream(dir / ("rank" + std::to_string(env.rank) + ".json")) << out.dump();
}

TEST_CASE("a Keras-style trial on 2 ranks trains and validates as one process with the whole batch") {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  test::run_ranks("child process: a Keras-style rank", 2, dir);
  test::Context context(Hyperparameters::parse("global_batch_size: 30\n"), ContextOptions{.trial_seed = 4});
  std::vector<torch::Tensor> a;
  const FitResult one = ranked_keras_fit(context, test::quiet({}).output_dir, &a);

  std::vector<nlohmann::json> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(nlohmann::json::parse(test::read_text(dir / ("rank" + std::to_string(rank) + ".json"))));
  CHECK(ranks[0] == ranks[1]);  // every rank reports the job's metrics
  // Validation over all 91 records, each batch weighted by its records across the ranks' shards.
  CHECK(ranks[0]["val_loss"].get<double>() == doctest::Approx(one.last_validation_metrics.at("val_loss")).epsilon(1e-5));
  CHECK(ranks[0]["val_accuracy"].get<double>() == doctest::Approx(one.last_validation_metrics.at("val_accuracy")).epsilon(1e-6));
  CHECK(ranks[0]["loss"].get<double>() == doctest::Approx(one.last_training_metrics.at("loss")).epsilon(1e-5));
  // The weights: the 2-rank checkpoint against the one process's model.
  torch::nn::Sequential ranked(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  load_model(dir / "run", *ranked);
  const auto b = ranked->parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    const torch::Tensor single = a[i].cpu();
    CHECK(((single - b[i]).norm() / single.norm()).item<double>() < 1e-5);
  }
}

// ---- Several inputs ------------------------------------------------------------------------------

namespace {
/// Two inputs (2 and 3 features) concatenated into one dense layer: Keras's Concatenate then Dense.
/// Takes them as a list, or by name ("a", "b").
template <bool ByName>
struct TwoInputNetImpl : torch::nn::Module {
  using Inputs = std::conditional_t<ByName, std::map<std::string, torch::Tensor>, std::vector<torch::Tensor>>;
  torch::nn::Linear dense{nullptr};
  TwoInputNetImpl() { dense = register_module("dense", torch::nn::Linear(5, 3)); }
  torch::Tensor forward(const Inputs& in) {
    if constexpr (ByName) return dense(torch::cat({in.at("a"), in.at("b")}, 1));
    else return dense(torch::cat({in.at(0), in.at(1)}, 1));
  }
};
template <bool ByName>
using TwoInputNet = torch::nn::ModuleHolder<TwoInputNetImpl<ByName>>;

template <bool ByName>
struct TwoInputTrial {
  Context& context;
  Clusters data = clusters(91);
  torch::Tensor extra = torch::randn({91, 3}, at::detail::createCPUGenerator(7));
  explicit TwoInputTrial(Context& c) : context(c) {}
  auto build_model() {
    TwoInputNet<ByName> model;
    keras::initialize_like_keras(*model);
    return keras::compile(context.wrap_model(model),
                          {.optimizer = "adam", .loss = keras::losses::sparse_categorical_crossentropy(true), .metrics = {"accuracy"}});
  }
  auto sequence(std::int64_t batch_size, bool shuffle) {
    if constexpr (ByName)
      return keras::DictInputSequence{
          .inputs = {{"a", data.x}, {"b", extra}}, .labels = data.y, .batch_size = batch_size, .shuffle = shuffle};
    else return keras::MultiInputSequence{.inputs = {data.x, extra}, .labels = data.y, .batch_size = batch_size, .shuffle = shuffle};
  }
  auto build_training_data_loader() { return sequence(32, true); }
  auto build_validation_data_loader() { return sequence(30, false); }  // 30, 30, 30 and 1
};

template <bool ByName>
void check_two_inputs(const char* name) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 6});
  Trainer<TwoInputTrial<ByName>> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(6), .validation_period = Batch(6)}));
  REQUIRE(r.validations == 1);
  // One pass over all 91 records, as Keras's evaluate reports it.
  torch::NoGradGuard no_grad;
  const auto model = std::dynamic_pointer_cast<TwoInputNetImpl<ByName>>(context.models().at(0));
  REQUIRE(model);
  model->eval();
  const TwoInputTrial<ByName> fresh(context);
  const torch::Device device = context.device();
  typename TwoInputNetImpl<ByName>::Inputs all;
  if constexpr (ByName) all = {{"a", fresh.data.x.to(device)}, {"b", fresh.extra.to(device)}};
  else all = {fresh.data.x.to(device), fresh.extra.to(device)};
  const torch::Tensor labels = fresh.data.y.to(device);
  const torch::Tensor logits = model->forward(all);
  const double loss = torch::nn::functional::cross_entropy(logits, labels).item<double>();
  const double accuracy = logits.argmax(-1).eq(labels).to(torch::kDouble).mean().item<double>();
  CHECK(r.last_validation_metrics.at("val_loss") == doctest::Approx(loss).epsilon(1e-6));
  CHECK(r.last_validation_metrics.at("val_accuracy") == doctest::Approx(accuracy).epsilon(1e-6));  // float32 batch means
  // For Keras itself (tests/python/keras_evaluate.py): a functional model of two inputs, same weights.
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    nlohmann::json out = {{"by_name", ByName},
                          {"a", tensor_json(fresh.data.x)},
                          {"b", tensor_json(fresh.extra)},
                          {"y", tensor_json(fresh.data.y)},
                          {"kernel", tensor_json(model->dense->weight)},
                          {"bias", tensor_json(model->dense->bias)},
                          {"batch_size", 30},
                          {"val_loss", r.last_validation_metrics.at("val_loss")},
                          {"val_accuracy", r.last_validation_metrics.at("val_accuracy")}};
    fs::create_directories(keep);
    std::ofstream(fs::path(keep) / name) << out.dump();
  }
}
}  // namespace

TEST_CASE("Keras-style models of several inputs: a list (MultiInputSequence) or by name (DictInputSequence), validated as Keras does") {
  check_two_inputs<false>("multi_input_list.json");
  check_two_inputs<true>("multi_input_dict.json");
  // Inputs that disagree with the labels are refused, naming the input.
  using NamedInputs = dettrial::detail::InputsDataset<std::map<std::string, torch::Tensor>>;
  const std::map<std::string, torch::Tensor> uneven{{"a", torch::zeros({4, 2})}, {"b", torch::zeros({3, 2})}};
  CHECK_THROWS_WITH_AS(NamedInputs(uneven, torch::zeros({4}), "keras::DictInputSequence"),
                       doctest::Contains("keras::DictInputSequence: input 'b' has 3 records but there are 4 labels"), TrialError);
}
