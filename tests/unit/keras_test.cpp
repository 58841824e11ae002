// The Keras-style trial: compile by names, Keras's losses and metrics, the steps dettrial writes,
// val_ names, early stopping, and exact resume.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_trials.hpp"

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
    return keras::compile(model, {.optimizer = "adam", .loss = keras::losses::sparse_categorical_crossentropy(true),
                                  .metrics = {"accuracy"}});
  }
  keras::InMemorySequence build_training_data_loader() { return {.data = data.x, .labels = data.y, .batch_size = 32}; }
  keras::InMemorySequence build_validation_data_loader() {
    return {.data = data.x, .labels = data.y, .batch_size = 30, .shuffle = false};
  }
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
  CHECK_THROWS_WITH_AS(keras::compile(model, {.optimizer = "adamm"}),
                       doctest::Contains("unknown optimizer 'adamm'; did you mean 'adam'?"), ConfigError);
  CHECK_THROWS_WITH_AS(keras::compile(model, {.metrics = {"acuracy"}}),
                       doctest::Contains("unknown metric 'acuracy'; did you mean 'accuracy'?"), ConfigError);
  CHECK_THROWS_WITH_AS(keras::compile(model, {.metrics = {"loss"}}), doctest::Contains("'loss' is always reported"), ConfigError);
}

TEST_CASE("Keras's losses and metrics: the batch means Keras computes") {
  const torch::Tensor logits = torch::tensor({{2.0f, 0.5f, -1.0f}, {0.1f, 0.2f, 3.0f}, {1.0f, 1.0f, 0.0f}});
  const torch::Tensor labels = torch::tensor({0, 2, 1}, torch::kLong);
  const torch::Tensor probabilities = torch::softmax(logits, 1);
  const double expected = torch::cross_entropy_loss(logits, labels).item<double>();
  using keras::detail::loss_value;
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(true), logits, labels).item<double>() == doctest::Approx(expected));
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(false), probabilities, labels).item<double>() ==
        doctest::Approx(expected).epsilon(1e-5));
  // Labels of shape (N, 1), as keras.datasets gives some: squeezed as Keras does.
  CHECK(loss_value(keras::losses::sparse_categorical_crossentropy(true), logits, labels.unsqueeze(1)).item<double>() ==
        doctest::Approx(expected));
  CHECK(keras::detail::metric_value(keras::CompiledMetric::Kind::sparse_categorical_accuracy, logits, labels.unsqueeze(1))
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
  CHECK(keras::detail::metric_value(Kind::sparse_categorical_accuracy, logits, labels).item<double>() == doctest::Approx(2.0 / 3.0));
  CHECK(keras::detail::metric_value(Kind::categorical_accuracy, logits, one_hot).item<double>() == doctest::Approx(2.0 / 3.0));
  CHECK(keras::detail::metric_value(Kind::binary_accuracy, torch::tensor({0.9f, 0.2f, 0.6f}), torch::tensor({1.0f, 0.0f, 0.0f}))
            .item<double>() == doctest::Approx(2.0 / 3.0));
}

TEST_CASE("a Keras-style trial trains under Trainer: loss and accuracy, val_ names, metrics.jsonl") {
  Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<ClusterTrial> trainer(context);
  static_assert(std::is_same_v<decltype(trainer.trial()), ClusterTrial&>);
  const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(200), .validation_period = Epoch(50),
                                               .searcher_metric = "val_accuracy", .smaller_is_better = false}));
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

TEST_CASE("a Keras-style trial stops and resumes bit-identically (model, Adam's state, the data order)") {
  const auto options = [](std::int64_t length) {
    return test::quiet({.max_length = Batch(length), .checkpoint_period = Batch(4), .searcher_metric = "val_loss"});
  };
  Context straight_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<ClusterTrial> straight(straight_context);
  straight.fit(options(10));

  Context first_context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<ClusterTrial> first(first_context);
  const FitResult stopped = first.fit(options(5));  // checkpoints at 4 and at the end, 5: mid-epoch
  REQUIRE(stopped.checkpoints.back().batches_trained == 5);

  Context second_context(test::hparams(), ContextOptions{.trial_seed = 99});
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
  Context context(test::hparams(), ContextOptions{.trial_seed = 1});
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
  Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<PartialBatches> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(4), .validation_period = Batch(4)}));
  // One pass over the whole set, as Keras's evaluate reports it.
  torch::NoGradGuard no_grad;
  const auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(context.models().at(0));
  REQUIRE(model);
  model->eval();
  const Clusters data = clusters();
  const torch::Tensor logits = model->forward(data.x);
  const double loss = torch::nn::functional::cross_entropy(logits, data.y).item<double>();
  const double accuracy = logits.argmax(-1).eq(data.y).to(torch::kDouble).mean().item<double>();
  CHECK(r.last_validation_metrics.at("val_loss") == doctest::Approx(loss).epsilon(1e-6));
  CHECK(r.last_validation_metrics.at("val_accuracy") == doctest::Approx(accuracy).epsilon(1e-6));
  // Averaging the three batch means alone would be off by more than that.
  double batch_mean = 0;
  for (const std::int64_t first : {0, 32, 64}) {
    const std::int64_t n = std::min<std::int64_t>(32, 90 - first);
    batch_mean += torch::nn::functional::cross_entropy(logits.narrow(0, first, n), data.y.narrow(0, first, n)).item<double>() / 3;
  }
  CHECK(batch_mean != doctest::Approx(loss).epsilon(1e-6));

  // For Keras itself (tests/python/keras_evaluate.py): the data, the weights and what dettrial reported.
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    auto as_list = [](const torch::Tensor& t) {
      const torch::Tensor flat = t.detach().to(torch::kDouble).contiguous().reshape({-1});
      nlohmann::json shape = t.sizes().vec();
      return nlohmann::json{{"shape", shape}, {"values", std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel())}};
    };
    nlohmann::json out;
    out["x"] = as_list(data.x);
    out["y"] = as_list(data.y);
    for (const auto& item : model->named_parameters()) out["weights"][item.key()] = as_list(item.value());
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
  using keras::detail::weighted_loss_value;
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
          doctest::Approx(keras::detail::loss_value(c.loss, c.y_pred, c.y_true).item<double>()).epsilon(1e-6));
    const double value = weighted_loss_value(c.loss, c.y_pred, c.y_true, weights).item<double>();
    out.push_back({{"loss", c.name}, {"from_logits", c.from_logits}, {"y_true", as_json_array(c.y_true)},
                   {"y_pred", as_json_array(c.y_pred)}, {"sample_weight", as_json_array(weights)}, {"value", value}});
  }
  if (const char* keep = std::getenv("DETTRIAL_KERAS_DIR")) {
    fs::create_directories(keep);
    std::ofstream(fs::path(keep) / "weighted_losses.json") << out.dump();
  }
  // Sample weights times class weights; a label without a class weight weighs 1.
  const keras::WeightedSequence both{.data = torch::zeros({4, 2}), .labels = torch::tensor({0, 1, 2, 1}),
                                     .sample_weights = torch::tensor({1.0, 2.0, 3.0, 4.0}), .class_weight = {{1, 0.5}, {2, 2.0}}};
  CHECK(torch::equal(keras::detail::combined_weights(both), torch::tensor({1.0f, 1.0f, 6.0f, 2.0f})));
  CHECK_THROWS_WITH_AS(keras::detail::combined_weights({.data = torch::zeros({4, 2}), .labels = torch::zeros({4}), .sample_weights = torch::ones({3})}),
                       "keras::WeightedSequence has 4 inputs but 3 sample weights", TrialError);
  CHECK_THROWS_WITH_AS(weighted_loss_value(L::Custom([](const torch::Tensor& p, const torch::Tensor&) { return p.sum(); }), logits, labels, weights),
                       doctest::Contains("a custom loss returns one number for the batch"), TrialError);
}

TEST_CASE("keras::WeightedSequence trains weighted: weights of 2 step as twice the learning rate; class_weight only for training") {
  const Clusters data = clusters();
  auto run = [&](double lr, keras::WeightedSequence train) {
    Context context(test::hparams(), ContextOptions{.trial_seed = 3});
    Trainer<WeightedTrial> trainer(context, lr, std::move(train));
    trainer.fit(test::quiet({.max_length = Batch(3), .validation_period = Batch(3)}));
    return test::parameters_of(context);
  };
  const auto doubled = run(0.05, {.data = data.x, .labels = data.y, .sample_weights = torch::full({90}, 2.0), .batch_size = 32, .shuffle = false});
  const auto by_class = run(0.05, {.data = data.x, .labels = data.y, .class_weight = {{0, 2.0}, {1, 2.0}, {2, 2.0}}, .batch_size = 32, .shuffle = false});
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
    Context context(test::hparams(), ContextOptions{.trial_seed = 3});
    Trainer<ClassWeightedValidation> trainer(context, 0.1, keras::WeightedSequence{.data = data.x, .labels = data.y});
    trainer.fit(test::quiet({.max_length = Batch(1)}));
  };
  CHECK_THROWS_WITH_AS(refused(), doctest::Contains("class_weight applies to training only"), TrialError);
}
