// SPDX-License-Identifier: Apache-2.0
// The TFKerasTrial tutorial's MNIST trial in C++: a compiled model (Flatten, Dense 128 relu, Dense 10;
// Adam; sparse categorical cross-entropy from logits; accuracy) and the images in memory. No
// train_batch or evaluate_batch: dettrial writes them, as Determined's TFKerasTrial does.
#pragma once

#include <filesystem>
#include <string>

#include <dettrial/keras.hpp>

namespace keras_mnist {

class MnistKerasTrial {
 public:
  explicit MnistKerasTrial(dettrial::Context& context) : context_(context) {
    // The tutorial reads MNIST through keras.datasets; here a folder in MNIST's layout (default:
    // Debian's Fashion-MNIST), and optionally one split for both with the last `holdout` validating.
    const YAML::Node& data = context.get_data_config();
    dir_ = data["dir"] ? data["dir"].as<std::string>() : std::string("/usr/share/datasets/fashion-mnist");
    train_split_ = data["train_split"] ? data["train_split"].as<std::string>() : "train";
    validation_split_ = data["validation_split"] ? data["validation_split"].as<std::string>() : "t10k";
    holdout_ = data["holdout"] ? data["holdout"].as<std::int64_t>() : 0;
    load();
  }

  auto build_model() {
    torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
    dettrial::keras::initialize_like_keras(*model);  // Keras's Dense starts Glorot-uniform, biases zero
    model = context_.wrap_model(model);
    return dettrial::keras::compile(model, {.optimizer = "adam",
                                            .loss = dettrial::keras::losses::sparse_categorical_crossentropy(/*from_logits=*/true),
                                            .metrics = {"accuracy"}});
  }

  // The tutorial gives the training sequence the global batch size and validation the per-slot one;
  // a loader here is one process's, so both take the per-slot size (the same on one slot).
  dettrial::keras::InMemorySequence build_training_data_loader() {
    return {.data = train_images_, .labels = train_labels_, .batch_size = context_.get_per_slot_batch_size()};
  }
  dettrial::keras::InMemorySequence build_validation_data_loader() {
    return {.data = validation_images_, .labels = validation_labels_, .batch_size = context_.get_per_slot_batch_size()};
  }

 private:
  void load() {
    dettrial::MnistSplit train = dettrial::load_mnist(dir_, train_split_);
    dettrial::MnistSplit validation = validation_split_ == train_split_ ? train : dettrial::load_mnist(dir_, validation_split_);
    if (validation_split_ == train_split_) {
      const std::int64_t n = train.images.size(0);
      const std::int64_t hold = holdout_ > 0 ? holdout_ : n / 6;
      if (hold >= n)
        throw dettrial::DataError("data.holdout (" + std::to_string(hold) + ") leaves no training records of " + std::to_string(n));
      validation = {train.images.narrow(0, n - hold, hold), train.labels.narrow(0, n - hold, hold)};
      train = {train.images.narrow(0, 0, n - hold), train.labels.narrow(0, 0, n - hold)};
    }
    // Pixels scaled to [0, 1], as the TensorFlow tutorial the seed follows does.
    train_images_ = train.images.to(torch::kFloat).div_(255.0).contiguous();
    train_labels_ = train.labels.to(torch::kLong);
    validation_images_ = validation.images.to(torch::kFloat).div_(255.0).contiguous();
    validation_labels_ = validation.labels.to(torch::kLong);
  }

  dettrial::Context& context_;
  std::filesystem::path dir_;
  std::string train_split_, validation_split_;
  std::int64_t holdout_ = 0;
  torch::Tensor train_images_, train_labels_, validation_images_, validation_labels_;
};

}  // namespace keras_mnist
