// SPDX-License-Identifier: Apache-2.0
// docs/trials.md's imperative-style trial: the constructor wraps the model, optimizer and scheduler;
// train_batch calls backward and step_optimizer itself. Exits 0 when it has learned y = sum(x).
#include <cstdio>

#include <dettrial/dettrial.hpp>

struct RegressionTrial {
  dettrial::Context& context;
  torch::nn::Linear model;
  torch::optim::Adam opt;
  dettrial::optim::StepLR scheduler;  // Python's StepLR (LibTorch's decays one step later)

  explicit RegressionTrial(dettrial::Context& c)
      : context(c),
        model(c.wrap_model(torch::nn::Linear(4, 1))),  // moved to the device, registered
        opt(model->parameters(), c.get_hparam<double>("lr")),
        scheduler(opt, /*step_size=*/50, /*gamma=*/0.5) {
    c.wrap_optimizer(opt);
    c.wrap_lr_scheduler(scheduler, dettrial::lr_step::every_batch{}, /*frequency=*/1);
  }

  auto build_training_data_loader() {
    return dettrial::DataLoader(dataset(), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() { return dettrial::DataLoader(dataset(), {.batch_size = 256}); }

  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& batch, int64_t /*epoch_idx*/, int64_t /*batch_idx*/) {
    auto& [x, y] = batch;
    auto loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    context.step_optimizer(opt, dettrial::clip::by_norm{1.0});  // aggregates, clips, steps, zeroes
    return {{"loss", loss}};
  }
  dettrial::Metrics evaluate_batch(Batch& batch) {
    auto& [x, y] = batch;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }

  static dettrial::TensorDataset<2> dataset() {
    auto x = torch::randn({1024, 4});
    return dettrial::TensorDataset(x, x.sum(1, true));
  }
};

int main() {
  // Determined's det.pytorch.init(): the context, with threads, determinism, allocator and seed applied.
  const auto context = dettrial::init({.hparams = dettrial::Hyperparameters::parse("lr: 0.05\nglobal_batch_size: 32")});
  dettrial::Trainer<RegressionTrial> trainer(*context);
  dettrial::FitResult result = trainer.fit({.max_length = dettrial::Epoch{5}, .validation_period = dettrial::Epoch{1}});
  return result.last_validation_metrics.at("validation_loss") < 0.01 ? 0 : 1;
}
