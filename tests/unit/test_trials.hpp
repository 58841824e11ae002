// Small trials and data for dettrial's tests: a linear regression that trains in milliseconds.
#pragma once

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <string>
#include <vector>

#include <dettrial/main.hpp>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <nlohmann/json.hpp>

#include "skip.hpp"

namespace test {

/// LibTorch's lazy (TorchScript) device, a stand-in for a GPU in tests: not the CPU device, but its
/// data lives on the host and can be read. Its backend is set up once per process (a second set-up
/// throws), whichever test asks first.
inline torch::Device lazy_device() {
  static const bool initialized = [] {
    torch::lazy::InitTorchScriptBackend();
    return true;
  }();
  (void)initialized;
  return torch::Device(torch::kLazy, 0);
}

/// 64 records of y = x . w + noise, the same every time.
inline std::tuple<torch::Tensor, torch::Tensor> regression_data(std::int64_t n = 64) {
  auto gen = at::detail::createCPUGenerator(1234);
  torch::Tensor x = torch::randn({n, 4}, gen);
  torch::Tensor w = torch::tensor({1.5f, -2.0f, 0.5f, 3.0f});
  torch::Tensor y = x.matmul(w).unsqueeze(1) + 0.1 * torch::randn({n, 1}, gen);
  return {x, y};
}

inline dettrial::Hyperparameters hparams(const std::string& extra = "") {
  return dettrial::Hyperparameters::parse("global_batch_size: 8\nlr: 0.05\n" + extra);
}

inline torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Dropout(0.25), torch::nn::Linear(8, 1));
}

using Batch = std::tuple<torch::Tensor, torch::Tensor>;

/// The declarative style: build_model / optimizer / train_batch(batch, model, epoch_idx, batch_idx).
struct DeclarativeRegression {
  dettrial::Context& context;
  std::int64_t records = 64;
  bool shuffle = true;
  explicit DeclarativeRegression(dettrial::Context& c) : context(c) {}

  torch::nn::Sequential build_model() { return make_model(); }
  torch::optim::SGD optimizer(torch::nn::Sequential& model) {
    return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(context.get_hparam<double>("lr")));
  }
  auto build_training_data_loader() {
    auto [x, y] = regression_data(records);
    return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = shuffle});
  }
  auto build_validation_data_loader() {
    auto [x, y] = regression_data(records);
    return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size()});
  }
  dettrial::Metrics train_batch(Batch& b, torch::nn::Sequential& model, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    return {{"loss", torch::mse_loss(model->forward(x), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& b, torch::nn::Sequential& model) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

/// The same trial in the imperative style: the constructor wraps, train_batch steps.
struct ImperativeRegression {
  dettrial::Context& context;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  explicit ImperativeRegression(dettrial::Context& c)
      : context(c), model(c.wrap_model(make_model())), opt(model->parameters(), torch::optim::SGDOptions(c.get_hparam<double>("lr"))) {
    context.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    auto [x, y] = regression_data();
    return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = regression_data();
    return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size()});
  }
  dettrial::Metrics train_batch(Batch& b, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  dettrial::Metrics evaluate_batch(Batch& b) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

/// A quiet run writing into a fresh temporary directory.
inline dettrial::FitOptions quiet(dettrial::FitOptions o) {
  o.report.quiet = true;
  if (o.output_dir.empty()) {
    static int counter = 0;
    o.output_dir =
        std::filesystem::temp_directory_path() / ("dettrial-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(o.output_dir);
  }
  return o;
}

inline std::vector<torch::Tensor> parameters_of(const dettrial::Context& c) {
  std::vector<torch::Tensor> out;
  for (const auto& m : c.models())
    for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

/// Same sizes and bits (compared on the CPU: a run on a GPU against a reference made on it).
inline bool bit_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].device() != b[i].device() || !torch::equal(a[i].cpu(), b[i].cpu())) return false;
  return true;
}

/// The device a Context picks by default: CUDA device 0 when there is a GPU, else the CPU.
inline torch::Device default_device() { return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU); }

/// Waits for `pid` up to `limit`; kills it when late. `in_time` says whether it ended by itself.
inline int wait_for(pid_t pid, std::chrono::seconds limit, bool& in_time) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      in_time = false;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  in_time = true;
  return status;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The records of a metrics.jsonl, each parsed.
inline std::vector<nlohmann::json> read_reports(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// True (and the test case marked skipped) when this build has no Gloo backend for multi-process jobs.
inline bool skip_without_gloo() {
  if (dettrial::backend::has_gloo) return false;
  skip("the Gloo backend is not in this build (LibTorch without c10d Gloo, or no gloo headers: Debian's libgloo-dev)");
  return true;
}

/// Starts this test program again running only `test_case` (skipped ones included), with `extra_env`
/// added to the environment and its output sent to `output` (or discarded).
inline pid_t spawn_self(const std::string& test_case, const std::vector<std::string>& extra_env, const std::string& output = "/dev/null") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return dettrial::detail::spawn_process(self, {self, "--test-case=" + test_case, "--no-skip", "--no-version"},
                                         {.extra_env = extra_env, .output = output});
}

}  // namespace test
