// End to end: the MNIST example trial on real data (the 10,000 MNIST digits, and Fashion-MNIST).
#include <doctest/doctest.h>

#include "../../examples/mnist/mnist_trial.hpp"

using namespace dettrial;

namespace {
FitResult train_mnist(const std::string& config_yaml, FitOptions options) {
  const ExperimentConfig config = ExperimentConfig::parse(config_yaml, "mnist test config");
  Context context(config);
  Trainer<mnist::MnistTrial> trainer(context);
  options.report.quiet = true;
  options.output_dir = std::filesystem::temp_directory_path() / ("dettrial-mnist-" + std::to_string(::getpid()));
  return trainer.fit(std::move(options));
}
}  // namespace

#ifdef DETTRIAL_MNIST10K_DIR
TEST_CASE("the MNIST trial learns the 10,000 real digits") {
  if (!std::filesystem::exists(DETTRIAL_MNIST10K_DIR)) {
    MESSAGE("skipped: " DETTRIAL_MNIST10K_DIR " is absent");
    return;
  }
  // Train on the first 8,000 digits, validate on the last 2,000.
  const FitResult r = train_mnist(R"(
hyperparameters: {learning_rate: 0.05, dropout: 0.2, global_batch_size: 64, n_filters1: 10, n_filters2: 20}
reproducibility: {experiment_seed: 7}
data: {dir: )" DETTRIAL_MNIST10K_DIR R"(, train_split: t10k, validation_split: t10k, holdout: 2000}
)",
                                  {.max_length = Epoch(3), .validation_period = Epoch(1)});
  CHECK(r.validations == 3);
  CHECK(r.batches_trained == 3 * 125);
  MESSAGE("MNIST-10k holdout accuracy: " << r.last_validation_metrics.at("accuracy"));
  CHECK(r.last_validation_metrics.at("accuracy") > 0.93);
}
#endif

TEST_CASE("the MNIST trial learns Fashion-MNIST (a short run)") {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: Debian's dataset-fashion-mnist is not installed (scripts/test installs it)");
    return;
  }
  const FitResult r = train_mnist(R"(
hyperparameters: {learning_rate: 0.05, dropout: 0.2, global_batch_size: 64, n_filters1: 10, n_filters2: 20}
reproducibility: {experiment_seed: 7}
)",
                                  {.max_length = Batch(400)});
  MESSAGE("Fashion-MNIST test accuracy after 400 batches: " << r.last_validation_metrics.at("accuracy"));
  CHECK(r.last_validation_metrics.at("accuracy") > 0.75);
}
