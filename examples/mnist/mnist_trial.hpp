// SPDX-License-Identifier: Apache-2.0
// The seed tutorial's MNIST trial, in dettrial's declarative style: two 5x5 convolutions with pooling,
// a 50-unit hidden layer with dropout, log-softmax over 10 classes, trained with SGD and momentum.
// On a GPU:  mnist --config examples/mnist/fashion.yaml --set optimizations.step_capture=cuda_graph
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <dettrial/dettrial.hpp>

namespace mnist {

/// Images as float N x 1 x 28 x 28, normalised with the training images' mean and spread; labels as int64.
struct Data {
  torch::Tensor images;
  torch::Tensor labels;
};

/// The trial, with the optimizer as a parameter: dettrial::optim::FusedSGD by default (LibTorch's SGD
/// to the bit on the CPU, ATen's fused kernel on a GPU, its learning rate on the device so that
/// `optimizations.step_capture: cuda_graph` can capture the step), or LibTorch's own SGD.
template <class Optimizer = dettrial::optim::FusedSGD>
class BasicMnistTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  explicit BasicMnistTrial(dettrial::Context& context) : context_(context) {
    dir_ = context.get_data_or<std::string>("dir", "/usr/share/datasets/fashion-mnist");
    train_split_ = context.get_data_or<std::string>("train_split", "train");
    validation_split_ = context.get_data_or<std::string>("validation_split", "t10k");
    holdout_ = context.get_data_or<std::int64_t>("holdout", 0);
    on_device_ = context.get_data_or<bool>("on_device", false);
    load();
  }

  torch::nn::Sequential build_model() {
    const auto n1 = context_.get_hparam<std::int64_t>("n_filters1");
    const auto n2 = context_.get_hparam<std::int64_t>("n_filters2");
    const auto dropout = context_.get_hparam<double>("dropout");
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, n1, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(n1, n2, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                                 torch::nn::Flatten(), torch::nn::Linear(16 * n2, 50), torch::nn::ReLU(), torch::nn::Dropout(dropout),
                                 torch::nn::Linear(50, 10), torch::nn::LogSoftmax(1));
  }

  Optimizer optimizer(torch::nn::Sequential& model) {
    return Optimizer(model->parameters(), torch::optim::SGDOptions(context_.get_hparam<double>("learning_rate")).momentum(0.9));
  }

  /// Optional decay of the learning rate after every epoch (hyperparameter `lr_decay`, default 1: none).
  /// dettrial's StepLR decays as Python's does, after the first epoch (LibTorch's waits one more).
  auto lr_scheduler(Optimizer& optimizer) {
    return dettrial::scheduled(dettrial::optim::StepLR(optimizer, 1, context_.get_hparams().get_or<double>("lr_decay", 1.0)),
                               dettrial::lr_step::every_epoch{});
  }

  /// `data.on_device: true` keeps the images on the trial's device (a GPU) and gathers each batch there.
  auto build_training_data_loader() {
    return dettrial::DataLoader(dataset(train_), {.batch_size = context_.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    // Validation batches of 500 divide the 10,000 test images evenly, so the (per-batch) average
    // accuracy is exactly the test accuracy.
    return dettrial::DataLoader(dataset(validation_), {.batch_size = 500});
  }

  dettrial::Metrics train_batch(Batch& batch, torch::nn::Sequential& model, std::int64_t /*epoch_idx*/, std::int64_t /*batch_idx*/) {
    auto& [images, labels] = batch;
    const torch::Tensor output = model->forward(images);
    const torch::Tensor loss = torch::nll_loss(output, labels);
    return {{"loss", loss}, {"train_error", error_rate(output, labels)}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch, torch::nn::Sequential& model) {
    auto& [images, labels] = batch;
    const torch::Tensor output = model->forward(images);
    const torch::Tensor error = error_rate(output, labels);
    return {{"validation_loss", torch::nll_loss(output, labels)}, {"validation_error", error}, {"accuracy", 1.0 - error}};
  }

  /// The seed's error rate, kept as a tensor so the device is not synchronised per batch.
  static torch::Tensor error_rate(const torch::Tensor& output, const torch::Tensor& labels) {
    return 1.0 - output.argmax(1).eq(labels).to(torch::kFloat).mean();
  }

 private:
  dettrial::TensorDataset<2> dataset(const Data& d) const {
    dettrial::TensorDataset<2> set(d.images, d.labels);
    return on_device_ ? set.to(context_.device()) : set;
  }

  void load() {
    dettrial::MnistSplit train = dettrial::load_mnist(dir_, train_split_);
    dettrial::MnistSplit validation = validation_split_ == train_split_ ? train : dettrial::load_mnist(dir_, validation_split_);
    if (validation_split_ == train_split_) {
      // One file for both: the last `holdout` records (default a sixth) validate, the rest train.
      const std::int64_t n = train.images.size(0);
      const std::int64_t hold = holdout_ > 0 ? holdout_ : n / 6;
      if (hold >= n)
        throw dettrial::DataError("data.holdout (" + std::to_string(hold) + ") leaves no training records of " + std::to_string(n));
      validation = {train.images.narrow(0, n - hold, hold), train.labels.narrow(0, n - hold, hold)};
      train = {train.images.narrow(0, 0, n - hold), train.labels.narrow(0, 0, n - hold)};
    }
    const torch::Tensor train_images = train.images.to(torch::kFloat).div_(255.0);
    const double mean = train_images.mean().item<double>();
    const double spread = train_images.std().item<double>();
    train_ = {train_images.sub(mean).div_(spread).unsqueeze(1).contiguous(), train.labels.to(torch::kLong)};
    validation_ = {validation.images.to(torch::kFloat).div_(255.0).sub_(mean).div_(spread).unsqueeze(1).contiguous(),
                   validation.labels.to(torch::kLong)};
  }

  dettrial::Context& context_;
  std::filesystem::path dir_;
  std::string train_split_, validation_split_;
  std::int64_t holdout_ = 0;
  bool on_device_ = false;
  Data train_, validation_;
};

using MnistTrial = BasicMnistTrial<>;

}  // namespace mnist
