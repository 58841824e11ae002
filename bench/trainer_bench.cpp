// SPDX-License-Identifier: Apache-2.0
// Trainer overhead and parity, measured side by side in one process:
//  - dettrial's Trainer against a hand-written LibTorch loop doing the same work (same model, optimizer,
//    data order, seed and metric reporting) on a tiny MLP (batch 32) and on the MNIST example network,
//    with the losses and final parameters compared bit for bit;
//  - the MLP's data, initial weights and batch order written to a folder for bench/parity.py, which
//    replays them in Python PyTorch and compares the losses (to 5 decimals) and the time.
// Usage: trainer_bench [--quick] [--parity-dir DIR]   or   trainer_bench --epoch (one MNIST epoch end to end)
// Prints one JSON object per measurement; exits 1 when losses or parameters are not bit-identical.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <mnist/mnist_trial.hpp>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::uint64_t seed = 17;
constexpr std::int64_t report_every = 100;

/// The tiny model where per-batch overhead shows: 32 -> 64 -> 10, batch 32, SGD with momentum.
struct MlpTrial {
  dettrial::Context& context;
  torch::Tensor x, y;
  explicit MlpTrial(dettrial::Context& c) : context(c) {
    auto generator = at::detail::createCPUGenerator(3);
    x = torch::randn({8192, 32}, generator);
    y = torch::randint(0, 10, {8192}, generator, torch::kLong);
  }
  torch::nn::Sequential build_model() {
    return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  }
  torch::optim::SGD optimizer(torch::nn::Sequential& m) {
    return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  auto build_training_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = 32, .shuffle = true, .seed = 5});
  }
  auto build_validation_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(x, y), {.batch_size = 4096}); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor, torch::Tensor>& b, torch::nn::Sequential& m, std::int64_t, std::int64_t) {
    return {{"loss", torch::cross_entropy_loss(m->forward(std::get<0>(b)), std::get<1>(b))}};
  }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor, torch::Tensor>& b, torch::nn::Sequential& m) {
    return {{"validation_loss", torch::cross_entropy_loss(m->forward(std::get<0>(b)), std::get<1>(b))}};
  }
};

struct Run {
  double seconds_per_batch = 0;
  std::vector<float> losses;          // per batch, when recorded
  std::vector<torch::Tensor> params;  // at the end
};

/// Keeps per-batch losses (only in the verification runs: it costs a copy per batch).
struct LossRecorder {
  std::vector<float>* losses;
  void on_training_workload_end(const dettrial::MetricValues&, std::span<const dettrial::Metrics> batches) {
    for (const auto& m : batches) losses->push_back(m.at("loss").tensor().item<float>());
  }
};
struct Clock {
  clock_type::time_point start, end;
  void on_training_start() { start = clock_type::now(); }
  void on_training_workload_end(const dettrial::MetricValues&) { end = clock_type::now(); }
};

std::vector<torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

template <class Trial>
Run with_trainer(const dettrial::ExperimentConfig& config, std::int64_t batches, bool record) {
  dettrial::Context context(config, {.trial_seed = seed});
  dettrial::Trainer<Trial> trainer(context);
  Run run;
  Clock clock;
  LossRecorder recorder{&run.losses};
  const dettrial::FitOptions options{.max_length = dettrial::Batch(batches),
                                     .reporting_period = dettrial::Batch(report_every),
                                     .checkpoint_policy = dettrial::CheckpointPolicy::none,
                                     .output_dir = "/tmp/dettrial-trainer-bench",
                                     .report = {.quiet = true}};
  if (record) trainer.fit(options, clock, recorder);
  else trainer.fit(options, clock);
  run.seconds_per_batch = std::chrono::duration<double>(clock.end - clock.start).count() / static_cast<double>(batches);
  run.params = snapshot(*trainer.model().ptr());
  return run;
}

/// The loop a user would write by hand: same construction order (so the same initial weights and RNG
/// draws), same data order, the trial's own train_batch for the forward pass and its metrics, then
/// backward / step / zero_grad, with every metric summed on the device and read every `report_every`
/// batches, as the Trainer reports them.
template <class Trial>
Run by_hand(const dettrial::ExperimentConfig& config, std::int64_t batches, bool record) {
  dettrial::Context context(config, {.trial_seed = seed});
  Trial trial(context);
  auto model = trial.build_model();
  auto optimizer = trial.optimizer(model);
  auto loader = trial.build_training_data_loader();
  auto validation = trial.build_validation_data_loader();  // the Trainer builds it too (same RNG draws)
  (void)validation;
  Run run;
  model->train();
  std::vector<torch::Tensor> sums;
  std::int64_t n = 0;
  double reported = 0;
  const auto start = clock_type::now();
  for (auto&& batch : loader.batches({.repeat = true})) {
    const dettrial::Metrics metrics = trial.train_batch(batch, model, n / loader.size(), n);
    const torch::Tensor& loss = metrics.at("loss").tensor();
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    {
      torch::NoGradGuard no_grad;
      if (sums.empty())
        for (std::size_t i = 0; i < metrics.size(); ++i) sums.push_back(torch::zeros({}, torch::kDouble));
      for (std::size_t i = 0; i < metrics.size(); ++i) sums[i].add_(metrics[i].value.tensor());
    }
    if (record) run.losses.push_back(loss.item<float>());
    if (++n % report_every == 0 || n == batches) {
      for (auto& sum : sums) {
        reported += sum.item<double>();
        sum.zero_();
      }
    }
    if (n == batches) break;
  }
  run.seconds_per_batch = std::chrono::duration<double>(clock_type::now() - start).count() / static_cast<double>(batches);
  (void)reported;
  run.params = snapshot(*model.ptr());
  return run;
}

bool identical(const Run& a, const Run& b) {
  if (a.losses != b.losses || a.params.size() != b.params.size()) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (!torch::equal(a.params[i], b.params[i])) return false;
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void report(const std::string& name, double value, const char* unit, double spread, const char* extra = "") {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g%s}\n", name.c_str(), value, unit, spread, extra);
  std::fflush(stdout);
}

/// Verifies bit-identity once, then alternates trainer and hand loop `rounds` times.
template <class Trial>
bool compare(const char* label, const dettrial::ExperimentConfig& config, std::int64_t batches, int rounds) {
  const Run trainer = with_trainer<Trial>(config, batches, true);
  const Run hand = by_hand<Trial>(config, batches, true);
  const bool same = identical(trainer, hand);
  std::vector<double> ratios, t_trainer, t_hand;
  for (int r = 0; r < rounds; ++r) {
    const double a = with_trainer<Trial>(config, batches, false).seconds_per_batch;
    const double b = by_hand<Trial>(config, batches, false).seconds_per_batch;
    t_trainer.push_back(a), t_hand.push_back(b), ratios.push_back(a / b);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  report(std::string(label) + ": Trainer", median(t_trainer), "s/batch", 0);
  report(std::string(label) + ": hand-written loop", median(t_hand), "s/batch", 0);
  report(std::string(label) + ": Trainer / hand-written loop", median(ratios), "ratio", *hi / *lo,
         same ? ", \"bit_identical\": true" : ", \"bit_identical\": false");
  return same;
}

void write_raw(const std::filesystem::path& path, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

/// Writes what bench/parity.py needs to replay the MLP run in Python: data, batch order, initial
/// weights, and the C++ losses and time.
void write_parity(const std::filesystem::path& dir, const dettrial::ExperimentConfig& config, std::int64_t batches) {
  std::filesystem::create_directories(dir);
  dettrial::Context context(config, {.trial_seed = seed});
  MlpTrial trial(context);
  auto model = trial.build_model();
  std::int64_t i = 0;
  for (const auto& p : model->parameters()) write_raw(dir / ("param" + std::to_string(i++) + ".f32"), p.detach());
  write_raw(dir / "x.f32", trial.x);
  write_raw(dir / "y.i64", trial.y);
  auto loader = trial.build_training_data_loader();
  std::vector<torch::Tensor> order;
  for (const auto& slice : loader.sampler().slices({.repeat = true})) {
    order.push_back(slice.indices);
    if (static_cast<std::int64_t>(order.size()) == batches) break;
  }
  write_raw(dir / "order.i64", torch::stack(order));
  const Run run = by_hand<MlpTrial>(config, batches, true);
  write_raw(dir / "losses.f32", torch::tensor(run.losses));
  const Run timed = with_trainer<MlpTrial>(config, batches, false);
  std::ofstream(dir / "meta.json") << "{\"batches\": " << batches << ", \"batch_size\": 32, \"records\": " << trial.x.size(0)
                                   << ", \"features\": 32, \"params\": " << i << ", \"cpp_seconds_per_batch\": " << timed.seconds_per_batch
                                   << ", \"torch\": \"" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "\"}\n";
}

}  // namespace

/// One epoch of the MNIST example end to end, as a user runs it: read the IDX files, build the trial,
/// train one epoch, validate on the 10,000 test images. Wall time and the accuracy reached.
void mnist_epoch_end_to_end(const char* fashion) {
  const auto start = clock_type::now();
  const auto config = dettrial::ExperimentConfig::parse(
      "hyperparameters: {learning_rate: 0.03, dropout: 0.3, global_batch_size: 64, n_filters1: 40, n_filters2: 40}\n"
      "data: {dir: " + std::string(fashion) + "}\n");
  dettrial::Context context(config, {.trial_seed = seed});
  dettrial::Trainer<mnist::MnistTrial> trainer(context);
  const auto result = trainer.fit({.max_length = dettrial::Epoch(1),
                                   .reporting_period = dettrial::Batch(report_every),
                                   .checkpoint_policy = dettrial::CheckpointPolicy::none,
                                   .output_dir = "/tmp/dettrial-trainer-bench",
                                   .report = {.quiet = true}});
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  char extra[64];
  std::snprintf(extra, sizeof extra, ", \"accuracy\": %.4f", result.last_validation_metrics.at("accuracy"));
  report("MNIST example, one Fashion-MNIST epoch end to end: dettrial", seconds, "s", 1.0, extra);
}

int main(int argc, char** argv) {
  bool quick = false, epoch = false;
  std::string parity_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") quick = true;
    else if (arg == "--epoch") epoch = true;
    else if (arg == "--parity-dir" && i + 1 < argc) parity_dir = argv[++i];
  }
  if (epoch) {  // uses the default thread count, as a user's run does
    mnist_epoch_end_to_end("/usr/share/datasets/fashion-mnist");
    return 0;
  }
  torch::set_num_threads(1);  // one thread: the per-batch cost of the framework shows most clearly
  bool ok = true;
  const auto mlp = dettrial::ExperimentConfig::parse("hyperparameters: {global_batch_size: 32}\n");
  ok &= compare<MlpTrial>("MLP 32-64-10, batch 32", mlp, quick ? 50 : 2000, quick ? 1 : 5);
  const char* fashion = "/usr/share/datasets/fashion-mnist";
  if (std::filesystem::exists(std::filesystem::path(fashion) / "train-images-idx3-ubyte.gz")) {
    const auto net = dettrial::ExperimentConfig::parse(
        "hyperparameters: {learning_rate: 0.03, dropout: 0.3, global_batch_size: 64, n_filters1: 40, n_filters2: 40}\n"
        "data: {dir: /usr/share/datasets/fashion-mnist}\n");
    ok &= compare<mnist::MnistTrial>("MNIST example network, batch 64", net, quick ? 5 : 200, quick ? 1 : 3);
  } else {
    std::fprintf(stderr, "skipping the MNIST network: %s is absent\n", fashion);
  }
  if (!parity_dir.empty()) write_parity(parity_dir, mlp, quick ? 50 : 200);
  if (!ok) std::fprintf(stderr, "trainer_bench: the Trainer's losses or parameters differ from the hand-written loop's\n");
  return ok ? 0 : 1;
}
