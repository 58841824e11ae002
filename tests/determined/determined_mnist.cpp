// SPDX-License-Identifier: Apache-2.0
// determined_mnist.py's trial in dettrial: examples/mnist's network, the optimizer and scheduler the
// config's data section names, Determined's data order (DataLoaderOptions::determined_order), and
// one JSON line per trained batch (its index, loss, learning rate, record ids and the stateful
// callback's count), so that the suite compares dettrial and Determined continuing each other's
// checkpoints record for record and loss for loss.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <dettrial/main.hpp>

namespace {

/// Counts the batches trained, in a state dict: restored by name from Determined's `callbacks`.
struct Counter {
  std::int64_t* batches;
  static std::string name() { return "counter"; }
  c10::IValue state_dict() const {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("batches", *batches);
    return d;
  }
  void load_state_dict(const c10::IValue& state) { *batches = state.toGenericDict().at("batches").toInt(); }
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<torch::Tensor> params, double lr) {
  using namespace torch::optim;
  if (name == "sgd") return std::make_unique<SGD>(params, SGDOptions(lr).momentum(0.9));
  if (name == "adam") return std::make_unique<Adam>(params, AdamOptions(lr));
  if (name == "adamw") return std::make_unique<AdamW>(params, AdamWOptions(lr).weight_decay(0.01).amsgrad(true));
  if (name == "rmsprop") return std::make_unique<RMSprop>(params, RMSpropOptions(lr).momentum(0.5));
  if (name == "adagrad") return std::make_unique<Adagrad>(params, AdagradOptions(lr));
  throw dettrial::ConfigError("data.optimizer '" + name + "' is not sgd, adam, adamw, rmsprop or adagrad");
}

class DeterminedMnistTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>;

  explicit DeterminedMnistTrial(dettrial::Context& c) : context_(c) {
    const YAML::Node& data = c.get_data_config();
    load(data["dir"].as<std::string>(), data["split"] ? data["split"].as<std::string>() : "t10k", data["records"].as<std::int64_t>(),
         data["validation_records"].as<std::int64_t>());
    if (data["log"]) log_.open(data["log"].as<std::string>(), std::ios::app);
    const auto n1 = c.get_hparam<std::int64_t>("n_filters1"), n2 = c.get_hparam<std::int64_t>("n_filters2");
    // The layers made one after another, as Python's constructor makes them: their initial weights
    // are drawn from the global generator in that order (a function's arguments are made in an
    // order C++ leaves open).
    torch::nn::Conv2d conv1(torch::nn::Conv2dOptions(1, n1, 5));
    torch::nn::Conv2d conv2(torch::nn::Conv2dOptions(n1, n2, 5));
    torch::nn::Linear hidden(16 * n2, 50);
    torch::nn::Linear output(50, 10);
    torch::nn::Sequential network(conv1);
    // data.net: batchnorm puts a BatchNorm2d after the first convolution, as determined_mnist.py does.
    if (data["net"] && data["net"].as<std::string>() == "batchnorm") network->push_back(torch::nn::BatchNorm2d(n1));
    network->extend(*torch::nn::Sequential(torch::nn::MaxPool2d(2), torch::nn::ReLU(), conv2, torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                                           torch::nn::Flatten(), hidden, torch::nn::ReLU(),
                                           torch::nn::Dropout(c.get_hparam<double>("dropout")), output, torch::nn::LogSoftmax(1)));
    model_ = c.wrap_model(network);
    optimizer_ = make_optimizer(data["optimizer"] ? data["optimizer"].as<std::string>() : "sgd", model_->parameters(),
                                c.get_hparam<double>("learning_rate"));
    c.wrap_optimizer(*optimizer_);
    // A warm start from another run's weights (a Determined checkpoint directory, say).
    if (data["weights_from"]) dettrial::load_weights(model_, data["weights_from"].as<std::string>());
    const std::string scheduler = data["scheduler"] ? data["scheduler"].as<std::string>() : "none";
    if (scheduler == "step") {
      step_ = std::make_unique<dettrial::optim::StepLR>(*optimizer_, 7, 0.5);
      c.wrap_lr_scheduler(*step_, dettrial::lr_step::every_batch{});
    } else if (scheduler == "multistep") {
      multistep_ = std::make_unique<dettrial::optim::MultiStepLR>(*optimizer_, std::vector<std::int64_t>{25, 30, 30}, 0.5);
      c.wrap_lr_scheduler(*multistep_, dettrial::lr_step::every_batch{});
    } else if (scheduler == "lambda") {
      // 10 steps of linear warmup, then linear decay to 0 at step 100 (determined_mnist.py's warmup_then_decay).
      lambda_ = std::make_unique<dettrial::optim::LambdaLR>(*optimizer_, [](std::int64_t s) {
        return s < 10 ? static_cast<double>(s + 1) / 10 : std::max(0.0, static_cast<double>(100 - s) / 90);
      });
      c.wrap_lr_scheduler(*lambda_, dettrial::lr_step::every_batch{});
    } else if (scheduler == "onecycle") {
      onecycle_ = std::make_unique<dettrial::optim::OneCycleLR>(
          *optimizer_, dettrial::optim::OneCycleLROptions{.max_lr = c.get_hparam<double>("learning_rate") * 4, .total_steps = 50});
      c.wrap_lr_scheduler(*onecycle_, dettrial::lr_step::every_batch{});
    }
  }

  std::tuple<Counter> build_callbacks() { return {Counter{&batches_}}; }

  auto build_training_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset<3>(train_x_, train_y_, train_ids_),
                                {.batch_size = context_.get_per_slot_batch_size(), .shuffle = true, .determined_order = true});
  }
  auto build_validation_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset<3>(val_x_, val_y_, val_ids_), {.batch_size = 500, .determined_order = true});
  }

  dettrial::Metrics train_batch(Batch& batch, std::int64_t /*epoch_idx*/, std::int64_t batch_idx) {
    auto& [x, y, ids] = batch;
    const torch::Tensor loss = torch::nll_loss(model_->forward(x), y);
    context_.backward(loss);
    context_.step_optimizer(*optimizer_);
    ++batches_;
    if (log_) {
      char number[64];
      std::snprintf(number, sizeof number, "%.17g", static_cast<double>(loss.item<float>()));
      std::string records;
      const torch::Tensor r = ids.contiguous();
      for (std::int64_t i = 0; i < r.numel(); ++i) records += (i ? ", " : "") + std::to_string(r.data_ptr<std::int64_t>()[i]);
      char lr[64];
      std::snprintf(lr, sizeof lr, "%.17g", optimizer_->param_groups()[0].options().get_lr());
      log_ << "{\"batch\": " << batch_idx << ", \"loss\": " << number << ", \"lr\": " << lr << ", \"counter\": " << batches_
           << ", \"records\": [" << records << "]}\n"
           << std::flush;
    }
    return {{"loss", loss}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch) {
    auto& [x, y, ids] = batch;
    return {{"validation_loss", torch::nll_loss(model_->forward(x), y)}};
  }

 private:
  /// As determined_mnist.py: the first `records` images train, the next `validation_records`
  /// validate, both normalised with the training images' mean and spread.
  void load(const std::string& dir, const std::string& split, std::int64_t records, std::int64_t validation_records) {
    const dettrial::MnistSplit s = dettrial::load_mnist(dir, split);
    const torch::Tensor x = s.images.narrow(0, 0, records + validation_records).to(torch::kFloat).div_(255.0);
    const torch::Tensor y = s.labels.narrow(0, 0, records + validation_records).to(torch::kLong);
    const torch::Tensor ids = torch::arange(records + validation_records, torch::kLong);
    const torch::Tensor train = x.narrow(0, 0, records);
    const double mean = train.mean().item<double>(), spread = train.std().item<double>();
    train_x_ = train.sub(mean).div_(spread).unsqueeze(1).contiguous();
    val_x_ = x.narrow(0, records, validation_records).sub(mean).div_(spread).unsqueeze(1).contiguous();
    train_y_ = y.narrow(0, 0, records);
    val_y_ = y.narrow(0, records, validation_records);
    train_ids_ = ids.narrow(0, 0, records);
    val_ids_ = ids.narrow(0, records, validation_records);
  }

  dettrial::Context& context_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<dettrial::optim::StepLR> step_;
  std::unique_ptr<dettrial::optim::MultiStepLR> multistep_;
  std::unique_ptr<dettrial::optim::LambdaLR> lambda_;
  std::unique_ptr<dettrial::optim::OneCycleLR> onecycle_;
  std::int64_t batches_ = 0;
  std::ofstream log_;
  torch::Tensor train_x_, train_y_, train_ids_, val_x_, val_y_, val_ids_;
};

}  // namespace

int main(int argc, char** argv) { return dettrial::main<DeterminedMnistTrial>(argc, argv); }
