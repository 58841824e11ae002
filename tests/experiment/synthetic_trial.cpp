// A tiny trial for the experiment tests: a regression whose validation loss depends on the learning
// rate, fast enough to run a dozen trials in seconds. With the hyperparameter `crash: 1` it crashes
// once (abort) at batch 7, leaving a marker in data.marker_dir, so the runner must restart it; with
// `crash: 2` it fails at batch 3 every time; with `crash: 3` it throws once at batch 7; with `crash: 4`
// it fails once at each of batches 5, 9 and 13 (after checkpoints). `data.batch_sleep_ms` slows each batch down (for
// interrupting a search while its trials train); while the file `data.pause_file` names exists, a batch
// waits (a test holds the trials' jobs running for as long as it needs them running).
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <filesystem>
#include <fstream>

#include <dettrial/main.hpp>

struct SyntheticTrial {
  dettrial::Context& context;
  explicit SyntheticTrial(dettrial::Context& c) : context(c) {}

  torch::nn::Sequential build_model() {
    const auto hidden = context.get_hparams().get_or<std::int64_t>("hidden", 16);
    return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 1));
  }
  torch::optim::SGD optimizer(torch::nn::Sequential& model) {
    return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(context.get_hparam<double>("lr")));
  }
  static dettrial::TensorDataset<2> data(std::int64_t n) {
    auto gen = at::detail::createCPUGenerator(99);
    torch::Tensor x = torch::randn({n, 4}, gen);
    return dettrial::TensorDataset(x, x.matmul(torch::tensor({1.0f, -2.0f, 0.5f, 3.0f})).unsqueeze(1));
  }
  auto build_training_data_loader() {
    return dettrial::DataLoader(data(256), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() { return dettrial::DataLoader(data(128), {.batch_size = 64}); }

  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& b, torch::nn::Sequential& model, std::int64_t, std::int64_t batch_idx) {
    if (const auto sleep = context.get_data_config()["batch_sleep_ms"])
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep.as<int>()));
    if (const auto pause = context.get_data_config()["pause_file"])
      while (std::filesystem::exists(pause.as<std::string>())) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (batch_idx == 3 && context.get_hparams().get_or<std::int64_t>("crash", 0) == 2)
      throw std::runtime_error("synthetic failure at batch 3");
    // crash: 4 fails once at each of batches 5, 9 and 13 (a marker per batch in data.marker_dir): an
    // attempt resumed from its predecessor's checkpoint passes the batch that one failed at,
    // checkpoints (every 2 batches) and fails at the next, so every failure comes after progress.
    if (context.get_hparams().get_or<std::int64_t>("crash", 0) == 4 && batch_idx % 4 == 1 && batch_idx > 1) {
      const std::filesystem::path marker =
          std::filesystem::path(context.get_data_config()["marker_dir"].as<std::string>()) / ("failed-at-" + std::to_string(batch_idx));
      if (!std::filesystem::exists(marker)) {
        std::ofstream(marker) << "failed at batch " << batch_idx << "\n";
        throw std::runtime_error("synthetic failure at batch " + std::to_string(batch_idx) + ", after a checkpoint");
      }
    }
    if (const auto crash = context.get_hparams().get_or<std::int64_t>("crash", 0); batch_idx == 7 && (crash == 1 || crash == 3)) {
      const std::filesystem::path marker = std::filesystem::path(context.get_data_config()["marker_dir"].as<std::string>()) / "crashed";
      if (!std::filesystem::exists(marker)) {
        std::ofstream(marker) << "crashed once at batch 7\n";
        if (crash == 1) std::abort();
        throw std::runtime_error("synthetic failure at batch 7, once");
      }
    }
    auto& [x, y] = b;
    return {{"loss", torch::mse_loss(model->forward(x), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& b, torch::nn::Sequential& model) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

int main(int argc, char** argv) { return dettrial::main<SyntheticTrial>(argc, argv); }
