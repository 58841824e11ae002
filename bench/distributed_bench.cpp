// Data parallel on one machine: the time of a training step (an MLP, global batch 64) in one process
// against 2 Gloo ranks, and how much of a rank's step is the gradient all-reduce (and how many bytes
// it moves). On a 2-core machine both ranks share the cores, so this shows the communication cost
// and what it overlaps, not a speed-up. Then the cost of reproducibility.rank_invariant: the same 2
// ranks with aggregation_frequency 2, gradients gathered and summed in stream order against the
// default all-reduce, alternated in the same run. Prints JSON lines for bench/table.py.
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
  const std::int64_t agg = context.aggregation_frequency();
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
  // Times per update (aggregation_frequency batches): the whole update, and the part inside
  // step_optimizer and finish_batch (gradients kept, reduced, stepped).
  std::vector<double> step_ms, sync_ms;
  for (int u = 0; u < steps + 5; ++u) {  // 5 warm-up updates
    const auto t0 = Clock::now();
    double sync = 0;
    for (std::int64_t j = 0; j < agg; ++j) {
      const std::int64_t s = u * agg + j;
      dettrial::detail::ContextAccess::position(context).current_batch = s;
      dettrial::detail::ContextAccess::begin_training_batch(context, per_rank);
      const torch::Tensor loss = torch::nll_loss(torch::log_softmax(model->forward(x), 1), y);
      context.backward(loss);
      const auto t1 = Clock::now();
      context.step_optimizer(opt);
      dettrial::detail::ContextAccess::finish_batch(context, s);
      sync += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    }
    if (u >= 5) {
      step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      sync_ms.push_back(sync);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  dettrial::detail::ContextAccess::release_registrations(context);
  return {median(step_ms), median(sync_ms), gradient_bytes};
}

void print(const std::string& name, double value, const char* unit, double spread, const std::string& extra = "") {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g%s}\n", name.c_str(), value, unit, spread,
              extra.c_str());
  std::fflush(stdout);
}

/// Starts 2 ranks of this program (`mode`: "plain", or "agg2" and "invariant" with aggregation 2); returns rank 0's output.
std::string run_two_ranks(int steps, int port, const std::string& mode = "plain") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::filesystem::path out = std::filesystem::temp_directory_path() / ("dettrial-distributed-bench-" + std::to_string(::getpid()));
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank)
    pids.push_back(dettrial::detail::spawn_process(
        self, {self, "--rank-steps", std::to_string(steps), mode},
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
  if (argc == 4 && std::string(argv[1]) == "--rank-steps") {
    const auto env = dettrial::LaunchEnvironment::detect();
    auto comm = dettrial::Communicator::create(env, std::chrono::seconds(60), dettrial::backend::gloo{});
    const std::string mode = argv[3];
    dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 1,
                                                                                    .aggregation_frequency = mode == "plain" ? 1 : 2,
                                                                                    .communicator = comm,
                                                                                    .rank_invariant = mode == "invariant",
                                                                                    .threads = 1});
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
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
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
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

  // rank_invariant against the default, 2 ranks aggregating 2 batches of 32 per update (an update of 4
  // micro-batches), alternated.
  std::vector<double> plain_update, invariant_update;
  for (int round = 0; round < rounds; ++round) {
    double step = 0, sync = 0;
    std::istringstream(run_two_ranks(steps, 29700 + (::getpid() + 7 * round + 3) % 1000, "agg2")) >> step >> sync;
    plain_update.push_back(step);
    std::istringstream(run_two_ranks(steps, 29700 + (::getpid() + 7 * round + 5) % 1000, "invariant")) >> step >> sync;
    invariant_update.push_back(step);
  }
  print("data parallel MLP update, 2 ranks x aggregation 2, all-reduce (default)", median(plain_update), "ms/update", spread(plain_update));
  print("data parallel MLP update, 2 ranks x aggregation 2, rank_invariant (ordered all-gather)", median(invariant_update), "ms/update",
        spread(invariant_update));
  print("rank_invariant / default all-reduce, update time (2 ranks x aggregation 2)", median(invariant_update) / median(plain_update), "x",
        1.0);
  return 0;
}
