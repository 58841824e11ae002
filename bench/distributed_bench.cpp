// Data parallel on one machine: the time of a training step (an MLP, global batch 64) in one process
// against 2 Gloo ranks, and how much of a rank's step is the gradient all-reduce (and how many bytes
// it moves). On a 2-core machine both ranks share the cores, so this shows the communication cost
// and what it overlaps, not a speed-up. Then the cost of reproducibility.rank_invariant: the same 2
// ranks with aggregation_frequency 2, gradients gathered and summed in stream order against the
// default all-reduce, alternated in the same run. The MLP is a trial a Trainer trains (the loop a
// trial really gets); its train_batch times the updates. Prints JSON lines for bench/table.py.
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
#include <tuple>
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

/// Per-update times a trial measures: the whole update (from one update's first micro-batch to the
/// next's), and the part inside Context::step_optimizer (gradients kept, reduced, stepped).
struct UpdateTimes {
  std::vector<double> update_ms, sync_ms;
};

/// An MLP on this process's share of a global batch of 64, trained by a Trainer: the loop, the
/// gradient aggregation and (in a job) the all-reduce a trial really gets.
struct MlpTrial {
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  static constexpr std::int64_t warm_up_updates = 5;

  dettrial::Context& context;
  UpdateTimes& times;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  Clock::time_point update_start{};
  double update_sync_ms = 0;

  MlpTrial(dettrial::Context& c, UpdateTimes& t)
      : context(c),
        times(t),
        model((torch::manual_seed(1),
               c.wrap_model(torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                                                  torch::nn::ReLU(), torch::nn::Linear(256, 10))))),
        opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)) {
    c.wrap_optimizer(opt);
  }

  static dettrial::TensorDataset<2> dataset(std::int64_t records) {
    return dettrial::TensorDataset(torch::randn({records, 784}), torch::randint(0, 10, {records}));
  }
  /// 20 updates' records an epoch; each batch is this rank's share of a global batch of 64.
  auto build_training_data_loader() {
    return dettrial::DataLoader(dataset(64 * context.aggregation_frequency() * 20), {.batch_size = context.get_per_slot_batch_size()});
  }
  auto build_validation_data_loader() { return dettrial::DataLoader(dataset(64), {.batch_size = 64}); }

  dettrial::Metrics train_batch(Batch& batch, std::int64_t /*epoch_idx*/, std::int64_t batch_idx) {
    const std::int64_t agg = context.aggregation_frequency();
    if (batch_idx % agg == 0) {  // an update begins: the one before it ended
      const auto now = Clock::now();
      if (batch_idx / agg > warm_up_updates) {
        times.update_ms.push_back(std::chrono::duration<double, std::milli>(now - update_start).count());
        times.sync_ms.push_back(update_sync_ms);
      }
      update_start = now;
      update_sync_ms = 0;
    }
    auto& [x, y] = batch;
    const torch::Tensor loss = torch::nll_loss(torch::log_softmax(model->forward(x), 1), y);
    context.backward(loss);
    const auto t1 = Clock::now();
    context.step_optimizer(opt);
    update_sync_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    return {{"loss", loss}};
  }
  dettrial::Metrics evaluate_batch(Batch& batch) {
    auto& [x, y] = batch;
    return {{"validation_loss", torch::nll_loss(torch::log_softmax(model->forward(x), 1), y)}};
  }
};

/// Trains `steps` updates (after 5 warm-up ones) of the MLP with a Trainer; returns the medians of
/// the update time and of its part inside step_optimizer, and the gradient's bytes.
StepTimes run_steps(dettrial::Context& context, int steps) {
  UpdateTimes times;
  double gradient_bytes = 0;
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("dettrial-distributed-bench-run-" + std::to_string(::getpid()));
  {
    dettrial::Trainer<MlpTrial> trainer(context, times);
    for (const auto& p : trainer.trial().model->parameters()) gradient_bytes += static_cast<double>(p.numel() * p.element_size());
    trainer.fit({.max_length = dettrial::Batch{(steps + MlpTrial::warm_up_updates + 1) * context.aggregation_frequency()},
                 .reporting_period = dettrial::never(),
                 .output_dir = out,
                 .handle_signals = false,
                 .report = {.quiet = true}});
  }
  std::filesystem::remove_all(out);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(times.update_ms), median(times.sync_ms), gradient_bytes};
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
    dettrial::Context context(dettrial::Hyperparameters::parse("global_batch_size: 64"),
                              dettrial::ContextOptions{.trial_seed = 1,
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
    dettrial::Context context(dettrial::Hyperparameters::parse("global_batch_size: 64"),
                              dettrial::ContextOptions{.trial_seed = 1, .threads = 1});
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
