// Data parallel on one machine: the time of a training step (an MLP, global batch 64) in one process
// against 2 Gloo ranks, and how much of a rank's step is the gradient all-reduce (and how many bytes
// it moves). On a 2-core machine both ranks share the cores, so this shows the communication cost
// and what it overlaps, not a speed-up. Prints JSON lines for bench/table.py.
//   distributed_bench [--quick]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <dettrial/detail/process.hpp>

namespace {

using Clock = std::chrono::steady_clock;

struct StepTimes {
  double step_ms;
  double all_reduce_ms;
  double gradient_bytes;
};

/// Trains `steps` steps of an MLP on this process's share of a global batch of 64, through
/// Context::step_optimizer (which all-reduces the gradients in a job). Times the whole step and the
/// part inside step_optimizer beyond the optimizer's own step.
StepTimes run_steps(dettrial::Context& context, int steps) {
  torch::manual_seed(1);
  auto model = context.wrap_model(torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                                                        torch::nn::ReLU(), torch::nn::Linear(256, 10)));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  context.wrap_optimizer(opt);
  const int per_rank = 64 / context.distributed().size;
  const torch::Tensor x = torch::randn({per_rank, 784});
  const torch::Tensor y = torch::randint(0, 10, {per_rank});
  double gradient_bytes = 0;
  for (const auto& p : model->parameters()) gradient_bytes += static_cast<double>(p.numel() * p.element_size());
  std::vector<double> step_ms, sync_ms;
  for (int s = 0; s < steps + 5; ++s) {  // 5 warm-up steps
    const auto t0 = Clock::now();
    const torch::Tensor loss = torch::nll_loss(torch::log_softmax(model->forward(x), 1), y);
    context.backward(loss);
    const auto t1 = Clock::now();
    context.step_optimizer(opt);
    const auto t2 = Clock::now();
    if (s >= 5) {
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      sync_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  context.release_registrations();
  return {median(step_ms), median(sync_ms), gradient_bytes};
}

void print(const std::string& name, double value, const char* unit, double spread, const std::string& extra = "") {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g%s}\n", name.c_str(), value, unit, spread,
              extra.c_str());
  std::fflush(stdout);
}

/// Starts 2 ranks of this program; returns rank 0's output.
std::string run_two_ranks(int steps, int port) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::filesystem::path out = std::filesystem::temp_directory_path() / ("dettrial-distributed-bench-" + std::to_string(::getpid()));
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank)
    pids.push_back(dettrial::detail::spawn_process(
        self, {self, "--rank-steps", std::to_string(steps)},
        {.extra_env = {"RANK=" + std::to_string(rank), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)},
         .output = out.string() + "-rank" + std::to_string(rank),
         .merge_stderr = false}));
  for (const pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a rank failed");
  }
  std::ifstream in(out.string() + "-rank0");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);  // one core per rank; the single process gets the same
  if (argc == 3 && std::string(argv[1]) == "--rank-steps") {
    const auto env = dettrial::LaunchEnvironment::detect();
    auto comm = dettrial::Communicator::create(env, std::chrono::seconds(60), dettrial::backend::gloo{});
    dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 1, .communicator = comm, .threads = 1});
    const StepTimes t = run_steps(context, std::atoi(argv[2]));
    if (env.rank == 0) std::printf("%.6g %.6g %.6g\n", t.step_ms, t.all_reduce_ms, t.gradient_bytes);
    return 0;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int steps = quick ? 10 : 300, rounds = quick ? 1 : 3;
  std::vector<double> single_ms, single_opt_ms, two_ms, two_sync_ms;
  double bytes = 0;
  for (int round = 0; round < rounds; ++round) {  // alternate A and B
    dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 1, .threads = 1});
    const StepTimes one = run_steps(context, steps);
    single_ms.push_back(one.step_ms);
    single_opt_ms.push_back(one.all_reduce_ms);
    std::istringstream two(run_two_ranks(steps, 29700 + (::getpid() + round) % 1000));
    double step = 0, sync = 0;
    two >> step >> sync >> bytes;
    two_ms.push_back(step);
    two_sync_ms.push_back(sync);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto spread = [](std::vector<double> v) { return *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end()); };
  print("data parallel MLP step, 1 process, batch 64", median(single_ms), "ms/step", spread(single_ms));
  print("data parallel MLP step, 2 Gloo ranks, 32 each", median(two_ms), "ms/step", spread(two_ms));
  const double all_reduce = median(two_sync_ms) - median(single_opt_ms);
  char extra[96];
  std::snprintf(extra, sizeof extra, ", \"bytes\": %.0f", bytes);
  print("data parallel gradient all-reduce per step (2 ranks)", all_reduce, "ms/step", spread(two_sync_ms), extra);
  return 0;
}
