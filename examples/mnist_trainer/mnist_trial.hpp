// SPDX-License-Identifier: Apache-2.0
// Seed 004's trial (Determined's mnist_pytorch example for the PyTorch Trainer API), as model.py and
// train.py write it: two 3x3 convolutions (n_filters1, n_filters2), max pooling, Dropout2d, a
// 128-unit layer, Dropout2d, log-softmax over 10 classes; Adadelta at the learning_rate
// hyperparameter; batches of 64 split over the ranks; the NLL loss; accuracy in validation. The
// trial takes its hyperparameters in its constructor, as train.py's MNistTrial(context, hparams).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include <dettrial/dettrial.hpp>

namespace mnist_trainer {

/// Where the digits are (data.py's get_dataset): a folder in MNIST's layout, the split names to
/// train and validate on, and, when both are one file, how many of its last records validate.
struct DataSource {
  std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  std::string train_split = "train", validation_split = "t10k";
  std::int64_t holdout = 0;
};

class MNistTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  MNistTrial(dettrial::Context& context, const dettrial::Hyperparameters& hparams, DataSource data = {})
      : context_(context),
        // The trial's constants: train.py's batch_size, split over the ranks.
        per_slot_batch_size_(64 / context.distributed().size),
        model_(context.wrap_model(build_model(hparams))),
        optimizer_(model_->parameters(), dettrial::optim::AdadeltaOptions(hparams.get<double>("learning_rate"))),
        data_(std::move(data)) {
    context.wrap_optimizer(optimizer_);
    load();
  }

  /// model.py's build_model(hparams).
  static torch::nn::Sequential build_model(const dettrial::Hyperparameters& hparams) {
    const auto n1 = hparams.get<std::int64_t>("n_filters1"), n2 = hparams.get<std::int64_t>("n_filters2");
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, n1, 3).stride(1)), torch::nn::ReLU(),
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(n1, n2, 3)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                                 torch::nn::Dropout2d(hparams.get<double>("dropout1")), torch::nn::Flatten(),
                                 torch::nn::Linear(144 * n2, 128), torch::nn::ReLU(), torch::nn::Dropout2d(hparams.get<double>("dropout2")),
                                 torch::nn::Linear(128, 10), torch::nn::LogSoftmax(1));
  }

  auto build_training_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset(train_.images, train_.labels), {.batch_size = per_slot_batch_size_});
  }
  auto build_validation_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset(validation_.images, validation_.labels), {.batch_size = per_slot_batch_size_});
  }

  dettrial::Metrics train_batch(Batch& batch, std::int64_t /*epoch_idx*/, std::int64_t /*batch_idx*/) {
    auto& [data, labels] = batch;
    const torch::Tensor loss = torch::nll_loss(model_->forward(data), labels);
    context_.backward(loss);
    context_.step_optimizer(optimizer_);
    return {{"loss", loss}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch, std::int64_t /*batch_idx*/) {
    auto& [data, labels] = batch;
    const torch::Tensor output = model_->forward(data);
    return {{"validation_loss", torch::nll_loss(output, labels)}, {"accuracy", output.argmax(1).eq(labels).to(torch::kFloat).mean()}};
  }

 private:
  /// data.py's transforms: ToTensor() and Normalize((0.1307,), (0.3081,)).
  static dettrial::MnistSplit normalized(dettrial::MnistSplit split) {
    split.images = split.images.unsqueeze(1).to(torch::kFloat).div(255).sub(0.1307).div(0.3081);
    split.labels = split.labels.to(torch::kLong);
    return split;
  }

  void load() {
    train_ = normalized(dettrial::load_mnist(data_.dir, data_.train_split));
    if (data_.validation_split != data_.train_split) {
      validation_ = normalized(dettrial::load_mnist(data_.dir, data_.validation_split));
      return;
    }
    // One file for both: its last `holdout` records (a sixth when unset) validate, the rest train.
    const std::int64_t n = train_.images.size(0), hold = data_.holdout > 0 ? data_.holdout : n / 6;
    if (hold >= n)
      throw dettrial::DataError("the holdout (" + std::to_string(hold) + ") leaves no training records of " + std::to_string(n));
    validation_ = {train_.images.narrow(0, n - hold, hold), train_.labels.narrow(0, n - hold, hold)};
    train_ = {train_.images.narrow(0, 0, n - hold), train_.labels.narrow(0, 0, n - hold)};
  }

  dettrial::Context& context_;
  std::int64_t per_slot_batch_size_;
  torch::nn::Sequential model_;
  dettrial::optim::Adadelta optimizer_;
  DataSource data_;
  dettrial::MnistSplit train_, validation_;
};

}  // namespace mnist_trainer
