// ZeRO-1 against unsharded data parallel: one rank of a Gloo job (RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT from the launcher, bench/zero.sh) training a 100.7-million-parameter network (six
// 4096 x 4096 linear layers) with Adam, through the Trainer. Prints one line per rank: the mode, the
// rank count, the peak resident memory (MiB) at the end of the last timed update, the optimizer
// state this rank keeps (MiB), and the median time of an update (ms: forward, backward, gradient
// all-reduce, the step and, with ZeRO, the parameters' all-gather).
//   zero_bench --mode unsharded|zero1 [--updates N] [--output DIR]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t width = 4096, layers = 6, batch = 8;

double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

struct WideTrial {
  dettrial::Context& context;
  torch::nn::Sequential model;
  torch::optim::Adam adam;
  std::vector<Clock::time_point> starts{};
  double peak_mib = 0;

  static torch::nn::Sequential network() {
    torch::nn::Sequential s;
    for (std::int64_t i = 0; i < layers; ++i) {
      s->push_back(torch::nn::Linear(width, width));
      if (i + 1 < layers) s->push_back(torch::nn::ReLU());
    }
    return s;
  }
  explicit WideTrial(dettrial::Context& c)
      : context(c), model(c.wrap_model(network())), adam(model->parameters(), torch::optim::AdamOptions(1e-4)) {
    context.wrap_optimizer(adam);
  }
  auto build_training_data_loader() {
    const torch::Tensor x = torch::randn({256, width});
    return dettrial::DataLoader(dettrial::TensorDataset(x, x.narrow(1, 0, 1).clone()), {.batch_size = batch, .shuffle = true});
  }
  auto build_validation_data_loader() {
    const torch::Tensor x = torch::randn({batch * 4, width});
    return dettrial::DataLoader(dettrial::TensorDataset(x, x.narrow(1, 0, 1).clone()), {.batch_size = batch});
  }
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& b, std::int64_t, std::int64_t) {
    starts.push_back(Clock::now());
    peak_mib = peak_resident_mib();  // before this update: the last update's peak included
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x).narrow(1, 0, 1), y);
    context.backward(loss);
    context.step_optimizer(adam);
    return {{"loss", loss}};
  }
  dettrial::Metrics evaluate_batch(Batch& b) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x).narrow(1, 0, 1), y)}};
  }
};

std::string argument(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argument(argc, argv, "--mode", "unsharded");
  const std::int64_t updates = std::stoll(argument(argc, argv, "--updates", "8"));
  const std::filesystem::path output = argument(argc, argv, "--output", "zero_bench_run");
  const dettrial::LaunchEnvironment env = dettrial::LaunchEnvironment::detect();
  auto comm = dettrial::Communicator::create(env, std::chrono::minutes(10), dettrial::backend::gloo{});
  dettrial::ContextOptions options{.trial_seed = 5, .communicator = comm};
  options.threads = 1;
  dettrial::Context context(dettrial::Hyperparameters::parse("global_batch_size: " + std::to_string(batch * env.size) + "\n"),
                            std::move(options));
  context.process_settings().apply();
  dettrial::Trainer<WideTrial> trainer(context);
  // Two updates more than timed: the first allocates the state, and the last's start ends the timing.
  dettrial::FitOptions o{.max_length = dettrial::Batch(updates + 2), .reporting_period = dettrial::Batch(1000)};
  o.output_dir = output / ("rank" + std::to_string(env.rank));
  o.checkpoint_dir = output / "checkpoints";
  o.checkpoint_policy = dettrial::CheckpointPolicy::none;
  o.report.quiet = true;
  o.zero_stage = mode == "zero1" ? dettrial::ZeroStage::optimizer_state : dettrial::ZeroStage::off;
  trainer.fit(o);
  const WideTrial& trial = trainer.trial();
  std::vector<double> ms;
  for (std::size_t i = 2; i < trial.starts.size(); ++i)
    ms.push_back(std::chrono::duration<double, std::milli>(trial.starts[i] - trial.starts[i - 1]).count());
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  double state_bytes = 0;
  for (const auto& [key, state] : trial.adam.state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*state);
    state_bytes += static_cast<double>((s.exp_avg().numel() + s.exp_avg_sq().numel()) * s.exp_avg().element_size());
  }
  std::printf("%s ranks %d peak_mib %.0f state_mib %.1f update_ms %.0f rank %d\n", mode.c_str(), env.size, trial.peak_mib,
              state_bytes / (1 << 20), ms[ms.size() / 2], env.rank);
  return 0;
}
