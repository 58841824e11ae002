// Trains a tiny trial through an installed dettrial; exits 0 when it learned and the version matches.
#include <cstdio>
#include <cstring>

#include <dettrial/dettrial.hpp>

struct TinyTrial {
  dettrial::Context& context;
  torch::nn::Linear model;
  torch::optim::SGD opt;
  explicit TinyTrial(dettrial::Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(2, 1))), opt(model->parameters(), 0.1) {
    c.wrap_optimizer(opt);
  }
  static dettrial::TensorDataset<2> data() {
    auto x = torch::randn({256, 2});
    return dettrial::TensorDataset(x, x.sum(1, true));
  }
  auto build_training_data_loader() { return dettrial::DataLoader(data(), {.batch_size = 16, .shuffle = true}); }
  auto build_validation_data_loader() { return dettrial::DataLoader(data(), {.batch_size = 64}); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor, torch::Tensor>& b, std::int64_t, std::int64_t) {
    auto loss = torch::mse_loss(model->forward(std::get<0>(b)), std::get<1>(b));
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor, torch::Tensor>& b) {
    return {{"mse", torch::mse_loss(model->forward(std::get<0>(b)), std::get<1>(b))}};
  }
};

int main() {
  dettrial::Context context(dettrial::Hyperparameters::parse("global_batch_size: 16"), {.trial_seed = 1});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<TinyTrial> trainer(context);
  const auto result = trainer.fit({.max_length = dettrial::Epoch{4}, .output_dir = "consumer-run", .report = {.quiet = true}});
  const double mse = result.last_validation_metrics.at("mse");
  std::printf("dettrial %s (%d.%d.%d) installed package: validation mse %g\n", dettrial::version, DETTRIAL_VERSION_MAJOR,
              DETTRIAL_VERSION_MINOR, DETTRIAL_VERSION_PATCH, mse);
  return mse < 0.01 && std::strcmp(dettrial::version, DETTRIAL_VERSION_STRING) == 0 ? 0 : 1;
}
