// The trial of the elastic tests: a small regression on 99 records (the first feature is the record's
// index), global batch 6. Every rank appends one line per batch it trains to
// <output>/records/rank<R>.txt: the job's attempt (the launcher's restart count), the batch index,
// a draw from its generator and the record indices; flushed per batch, so a killed rank's lines
// survive. With ELASTIC_KILL=RANK:BATCH (RANK `*`: any), that rank kills itself with SIGKILL at that
// batch on the job's first attempt; with ELASTIC_KILL_AGENT=1 it first kills its parent (torchrun's
// agent: a node lost). data.batch_sleep_ms slows each batch down (for a requeue from outside).
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <dettrial/main.hpp>

struct ElasticTrial {
  dettrial::Context& context;
  int attempt = dettrial::LaunchEnvironment::detect().restart;
  std::ofstream records;

  explicit ElasticTrial(dettrial::Context& c) : context(c) {}

  torch::nn::Sequential build_model() { return torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1)); }
  torch::optim::SGD optimizer(torch::nn::Sequential& model) {
    return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(context.get_hparam<double>("lr")).momentum(0.5));
  }
  static dettrial::TensorDataset<2> data(std::int64_t n, std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    torch::Tensor x = torch::randn({n, 4}, gen);
    x.select(1, 0).copy_(torch::arange(n, torch::kFloat));
    return dettrial::TensorDataset(x, x.narrow(1, 1, 3).matmul(torch::tensor({1.5f, -2.0f, 0.5f})).unsqueeze(1));
  }
  auto build_training_data_loader() {
    return dettrial::DataLoader(data(99, 11), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() { return dettrial::DataLoader(data(40, 12), {.batch_size = 4}); }

  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& b, torch::nn::Sequential& model, std::int64_t, std::int64_t batch_idx) {
    auto& [x, y] = b;
    log(batch_idx, x.select(1, 0).to(torch::kLong));
    if (const auto sleep = context.get_data_config()["batch_sleep_ms"])
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep.as<int>()));
    return {{"loss", torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& b, torch::nn::Sequential& model) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y)}};
  }

 private:
  void log(std::int64_t batch_idx, const torch::Tensor& ids) {
    const int rank = context.distributed().rank;
    if (!records.is_open()) {
      std::filesystem::create_directories(context.output_dir() / "records");
      records.open(context.output_dir() / "records" / ("rank" + std::to_string(rank) + ".txt"), std::ios::app);
    }
    records << attempt << ' ' << batch_idx << ' ' << torch::rand({1}).item<double>();
    for (std::int64_t i = 0; i < ids.numel(); ++i) records << ' ' << ids[i].item<std::int64_t>();
    records << std::endl;
    if (const char* kill = std::getenv("ELASTIC_KILL"); kill && attempt == 0) {
      const std::string spec = kill;
      const auto colon = spec.find(':');
      const std::string who = spec.substr(0, colon);
      if ((who == "*" || std::stoi(who) == rank) && std::stoll(spec.substr(colon + 1)) == batch_idx) {
        if (const char* agent = std::getenv("ELASTIC_KILL_AGENT"); agent && std::string(agent) == "1") ::kill(::getppid(), SIGKILL);
        std::raise(SIGKILL);
      }
    }
  }
};

int main(int argc, char** argv) { return dettrial::main<ElasticTrial>(argc, argv); }
