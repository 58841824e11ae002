// SPDX-License-Identifier: Apache-2.0
// Trainer overhead and parity, measured side by side in one process:
//  - dettrial's Trainer against a hand-written LibTorch loop doing the same work (same model, optimizer,
//    data order, seed and metric reporting) on a tiny MLP (batch 32) and on the MNIST example network,
//    with the losses and final parameters compared bit for bit;
//  - for both models, the initial weights, the batches in the loader's order, the generator state
//    (dropout) and the losses written to a folder for bench/parity.py, which replays them in Python
//    PyTorch and compares the losses (to 5 decimals) and the time.
// Usage: trainer_bench [--quick] [--overhead all|mlp|mnist|none] [--parity-dir DIR]
//        trainer_bench --epoch [--batches N] [--trace FILE]
//                                                one MNIST epoch (or N batches) end to end; with
//                                                --trace, its training under LibTorch's profiler
//        trainer_bench --profile trainer|hand [--model mlp|mnist] [--batches N]
//                                                one side of a comparison alone, for profilers
// Every side runs on the CPU (the claims are the CPU's, whatever GPU the machine has).
// Prints one JSON object per measurement; exits 1 when losses or parameters are not bit-identical.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <mnist/mnist_trial.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

// Under valgrind's callgrind (bench/run's instruction counts, `--instr-atstart=no`), only the timed
// region is measured; outside valgrind these are a few no-op instructions.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BENCH_MEASURE_START() CALLGRIND_START_INSTRUMENTATION
#define BENCH_MEASURE_STOP() CALLGRIND_STOP_INSTRUMENTATION
#else
#define BENCH_MEASURE_START() (void)0
#define BENCH_MEASURE_STOP() (void)0
#endif

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

/// What bench/parity.py needs to replay a run in Python: the batches as the loader delivered them,
/// the generator's state when the loop began (dropout draws from it) and the SGD settings used.
struct Recording {
  std::vector<torch::Tensor> inputs, labels;
  torch::Tensor rng_state;
  double lr = 0, momentum = 0;
};

/// Keeps per-batch losses (only in the verification runs: it costs a copy per batch).
struct LossRecorder {
  std::vector<float>* losses;
  void on_training_workload_end(const dettrial::MetricValues&, std::span<const dettrial::Metrics> batches) {
    for (const auto& m : batches) losses->push_back(m.at("loss").tensor().item<float>());
  }
};
struct Clock {
  std::int64_t batches;  // the run's length: its last report ends the timed region
  clock_type::time_point start, end;
  void on_training_start() {
    BENCH_MEASURE_START();
    start = clock_type::now();
  }
  void on_training_workload_end(const dettrial::MetricValues& m) {
    end = clock_type::now();
    if (static_cast<std::int64_t>(m.at("batches")) == batches) BENCH_MEASURE_STOP();
  }
};

double per_batch(clock_type::duration d, std::int64_t batches) {
  return std::chrono::duration<double>(d).count() / static_cast<double>(batches);
}

std::vector<torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

template <class Trial>
Run with_trainer(const dettrial::ExperimentConfig& config, std::int64_t batches, bool record) {
  dettrial::Context context(config, {.trial_seed = seed, .device = torch::Device(torch::kCPU), .threads = 1});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<Trial> trainer(context);
  Run run;
  Clock clock{batches};
  LossRecorder recorder{&run.losses};
  const dettrial::FitOptions options{.max_length = dettrial::Batch(batches),
                                     .reporting_period = dettrial::Batch(report_every),
                                     .checkpoint_policy = dettrial::CheckpointPolicy::none,
                                     .output_dir = "/tmp/dettrial-trainer-bench",
                                     .report = {.quiet = true}};
  if (record) trainer.fit(options, clock, recorder);
  else trainer.fit(options, clock);
  run.seconds_per_batch = per_batch(clock.end - clock.start, batches);
  run.params = snapshot(*trainer.model().ptr());
  return run;
}

/// The loop a user would write by hand: same construction order (so the same initial weights and RNG
/// draws), same data order, the trial's own train_batch for the forward pass and its metrics, then
/// backward / step / zero_grad, with every metric summed on the device and read every `report_every`
/// batches, as the Trainer reports them.
template <class Trial>
Run by_hand(const dettrial::ExperimentConfig& config, std::int64_t batches, bool record, Recording* recording = nullptr) {
  dettrial::Context context(config, {.trial_seed = seed, .device = torch::Device(torch::kCPU), .threads = 1});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
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
  if (recording) {
    static_assert(std::is_base_of_v<torch::optim::SGD, decltype(optimizer)>,
                  "parity.py replays SGD (FusedSGD is SGD on the CPU, to the bit)");
    const auto& sgd = static_cast<const torch::optim::SGDOptions&>(optimizer.param_groups().front().options());
    recording->lr = sgd.lr(), recording->momentum = sgd.momentum();
    recording->rng_state = at::detail::getDefaultCPUGenerator().get_state();
  }
  BENCH_MEASURE_START();
  const auto start = clock_type::now();
  for (auto&& batch : loader.batches({.repeat = true})) {
    if (recording) {
      recording->inputs.push_back(std::get<0>(batch).clone());
      recording->labels.push_back(std::get<1>(batch).clone());
    }
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
  run.seconds_per_batch = per_batch(clock_type::now() - start, batches);
  BENCH_MEASURE_STOP();
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

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}
double median(const std::vector<double>& v) { return quantile(v, 0.5); }
double spread(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi / *lo;
}

void report(const std::string& name, double value, const char* unit, double spread, const std::string& extra = "") {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g%s}\n", name.c_str(), value, unit, spread,
              extra.c_str());
  std::fflush(stdout);
}

/// Verifies bit-identity once, then alternates trainer and hand loop `rounds` times (which one goes
/// first alternates too) and reports the median of the per-round ratios with their quartiles: this
/// VM's speed drifts by up to 1.7x over seconds, so only ratios of runs adjacent in time mean much.
template <class Trial>
bool compare(const char* label, const dettrial::ExperimentConfig& config, std::int64_t batches, int rounds) {
  const Run trainer = with_trainer<Trial>(config, batches, true);
  const Run hand = by_hand<Trial>(config, batches, true);
  const bool same = identical(trainer, hand);
  std::vector<double> ratios, t_trainer, t_hand;
  for (int r = 0; r < rounds; ++r) {
    double a = 0, b = 0;
    if (r % 2 == 0) {
      a = with_trainer<Trial>(config, batches, false).seconds_per_batch;
      b = by_hand<Trial>(config, batches, false).seconds_per_batch;
    } else {
      b = by_hand<Trial>(config, batches, false).seconds_per_batch;
      a = with_trainer<Trial>(config, batches, false).seconds_per_batch;
    }
    t_trainer.push_back(a), t_hand.push_back(b), ratios.push_back(a / b);
  }
  char extra[160];
  std::snprintf(extra, sizeof extra, ", \"bit_identical\": %s, \"quartiles\": \"%.3f-%.3f\", \"rounds\": %d", same ? "true" : "false",
                quantile(ratios, 0.25), quantile(ratios, 0.75), rounds);
  report(std::string(label) + ": Trainer", median(t_trainer), "s/batch", spread(t_trainer));
  report(std::string(label) + ": hand-written loop", median(t_hand), "s/batch", spread(t_hand));
  report(std::string(label) + ": Trainer / hand-written loop", median(ratios), "ratio", spread(ratios), extra);
  return same;
}

void write_raw(const std::filesystem::path& path, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

/// Writes what bench/parity.py needs to replay a run in Python (initial weights, the batches in order,
/// the generator state, the C++ losses) and the Trainer's time per batch on the same run.
/// `network` names the model and its hyperparameters for parity.py, as JSON members.
template <class Trial>
void write_parity(const std::filesystem::path& dir, const dettrial::ExperimentConfig& config, std::int64_t batches,
                  const std::string& network) {
  std::filesystem::create_directories(dir);
  {  // the initial weights, as the Trainer and the hand loop get them
    dettrial::Context context(config, {.trial_seed = seed, .device = torch::Device(torch::kCPU), .threads = 1});
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
    Trial trial(context);
    auto model = trial.build_model();
    std::int64_t i = 0;
    for (const auto& p : model->parameters()) write_raw(dir / ("param" + std::to_string(i++) + ".f32"), p.detach());
  }
  Recording recording;
  const Run run = by_hand<Trial>(config, batches, true, &recording);
  const torch::Tensor inputs = torch::stack(recording.inputs);
  write_raw(dir / "inputs.f32", inputs);
  write_raw(dir / "labels.i64", torch::stack(recording.labels));
  write_raw(dir / "rng_state.u8", recording.rng_state);
  write_raw(dir / "losses.f32", torch::tensor(run.losses));
  const Run timed = with_trainer<Trial>(config, batches, false);
  std::string shape;
  for (const auto d : inputs.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  std::ofstream(dir / "meta.json") << "{" << network << ", \"lr\": " << recording.lr << ", \"momentum\": " << recording.momentum
                                   << ", \"input_shape\": [" << shape << "], \"params\": " << run.params.size()
                                   << ", \"cpp_seconds_per_batch\": " << timed.seconds_per_batch << ", \"torch\": \"" << TORCH_VERSION_MAJOR
                                   << "." << TORCH_VERSION_MINOR << "\"}\n";
}

/// The MNIST example's settings used throughout (the seed's network with 40/40 filters). `small`
/// trains on the 10,000 test images (a sixth held out), for --quick's few batches: each trial
/// built reads its files, and the 60,000 training images took most of a quick run.
dettrial::ExperimentConfig mnist_config(const char* fashion, bool small = false) {
  return dettrial::ExperimentConfig::parse(
      "hyperparameters: {learning_rate: 0.03, dropout: 0.3, global_batch_size: 64, n_filters1: 40, n_filters2: 40}\n"
      "data: {dir: " +
      std::string(fashion) + (small ? ", train_split: t10k" : "") + "}\n");
}

}  // namespace

/// Times an epoch's phases: everything before training (reading the files, building the trial),
/// training, validation.
struct PhaseClock {
  clock_type::time_point training_start, validation_start, validation_end;
  void on_training_start() { training_start = clock_type::now(); }
  void on_validation_start() { validation_start = clock_type::now(); }
  void on_validation_end(const dettrial::MetricValues&) { validation_end = clock_type::now(); }
};

/// One epoch of the MNIST example end to end, as a user runs it: read the IDX files, build the trial,
/// train one epoch (or `batches`), validate on the 10,000 test images. Wall time, its phases and the
/// accuracy reached.
/// A training phase under LibTorch's (legacy, CPU) profiler, written as a Chrome trace to `file`.
struct TrainingTrace {
  std::string file;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  void on_training_start() {
    if (!file.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(file);
  }
  void on_validation_start() { profile.reset(); }
};

void mnist_epoch_end_to_end(const char* fashion, std::int64_t batches, const std::string& trace_file) {
  const auto start = clock_type::now();
  // The thread count a user's run gets (no .threads: OMP_NUM_THREADS when set, else every CPU this
  // process may run on), as Python's and Determined's sides get theirs; each row says what it ran with.
  dettrial::Context context(mnist_config(fashion), {.trial_seed = seed, .device = torch::Device(torch::kCPU)});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<mnist::MnistTrial> trainer(context);
  PhaseClock phases;
  TrainingTrace trace{trace_file, nullptr};
  const auto result = trainer.fit({.max_length = batches > 0 ? dettrial::TrainUnit(dettrial::Batch(batches)) : dettrial::Epoch(1),
                                   .reporting_period = dettrial::Batch(report_every),
                                   .checkpoint_policy = dettrial::CheckpointPolicy::none,
                                   .output_dir = "/tmp/dettrial-trainer-bench",
                                   .report = {.quiet = true}},
                                  phases, trace);
  const auto end = clock_type::now();
  const auto seconds = [](clock_type::duration d) { return std::chrono::duration<double>(d).count(); };
  char extra[160];
  std::snprintf(extra, sizeof extra, ", \"accuracy\": %.4f, \"phases\": \"load %.2f s, train %.2f s, validate %.2f s\"",
                result.last_validation_metrics.at("accuracy"), seconds(phases.training_start - start),
                seconds(phases.validation_start - phases.training_start), seconds(phases.validation_end - phases.validation_start));
  const std::string what = batches > 0 ? std::to_string(batches) + " batches" : "one Fashion-MNIST epoch";
  std::snprintf(extra + std::strlen(extra), sizeof extra - std::strlen(extra), ", \"threads\": %d", torch::get_num_threads());
  report("MNIST example, " + what + " end to end: dettrial", seconds(end - start), "s", 1.0, extra);
}

int main(int argc, char** argv) {
  bool quick = false, epoch = false;
  std::string parity_dir, overhead = "all", profile, profile_model = "mlp", trace_file;
  std::int64_t profile_batches = 20000;
  bool batches_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") quick = true;
    else if (arg == "--epoch") epoch = true;
    else if (arg == "--parity-dir" && has_value) parity_dir = argv[++i];
    else if (arg == "--trace" && has_value) trace_file = argv[++i];
    else if (arg == "--overhead" && has_value) overhead = argv[++i];
    else if (arg == "--profile" && has_value) profile = argv[++i];
    else if (arg == "--model" && has_value) profile_model = argv[++i];
    else if (arg == "--batches" && has_value) profile_batches = std::stoll(argv[++i]), batches_given = true;
    else {
      std::fprintf(stderr,
                   "usage: trainer_bench [--quick] [--overhead all|mlp|mnist|none] [--parity-dir DIR]\n"
                   "       trainer_bench --epoch [--batches N] [--trace FILE]\n"
                   "       trainer_bench --profile trainer|hand [--model mlp|mnist] [--batches N]   (one side alone, for profilers)\n");
      return 2;
    }
  }
  const char* fashion = "/usr/share/datasets/fashion-mnist";
  if (epoch) {  // uses the default thread count, as a user's run does
    mnist_epoch_end_to_end(fashion, batches_given ? profile_batches : 0, trace_file);
    return 0;
  }
  torch::set_num_threads(1);  // one thread: the per-batch cost of the framework shows most clearly
  const auto mlp = dettrial::ExperimentConfig::parse("hyperparameters: {global_batch_size: 32}\n");
  const bool have_fashion = std::filesystem::exists(std::filesystem::path(fashion) / "train-images-idx3-ubyte.gz");
  if (!have_fashion) std::fprintf(stderr, "skipping the MNIST network: %s is absent\n", fashion);
  const auto net = mnist_config(fashion, quick);
  if (!profile.empty()) {
    const bool trainer = profile == "trainer";
    const Run run = profile_model == "mnist"
                        ? (trainer ? with_trainer<mnist::MnistTrial>(net, profile_batches, false)
                                   : by_hand<mnist::MnistTrial>(net, profile_batches, false))
                        : (trainer ? with_trainer<MlpTrial>(mlp, profile_batches, false) : by_hand<MlpTrial>(mlp, profile_batches, false));
    std::printf("%s %s: %.2f us/batch\n", profile_model.c_str(), profile.c_str(), 1e6 * run.seconds_per_batch);
    return 0;
  }

  bool ok = true;
  if (overhead == "all" || overhead == "mlp") ok &= compare<MlpTrial>("MLP 32-64-10, batch 32", mlp, quick ? 50 : 300, quick ? 1 : 201);
  if ((overhead == "all" || overhead == "mnist") && have_fashion)
    ok &= compare<mnist::MnistTrial>("MNIST example network, batch 64", net, quick ? 5 : 50, quick ? 1 : 15);
  if (!ok) std::fprintf(stderr, "trainer_bench: the Trainer's losses or parameters differ from the hand-written loop's\n");
  if (!parity_dir.empty()) {
    const std::filesystem::path dir(parity_dir);
    std::filesystem::remove_all(dir);
    write_parity<MlpTrial>(dir / "mlp", mlp, quick ? 50 : 200, "\"model\": \"mlp\", \"label\": \"MLP\"");
    if (have_fashion) {
      const YAML::Node& h = net.hyperparameters;
      write_parity<mnist::MnistTrial>(dir / "mnist", net, quick ? 5 : 200,
                                      "\"model\": \"mnist\", \"label\": \"MNIST example network\", \"n_filters1\": " +
                                          std::to_string(h["n_filters1"].as<std::int64_t>()) +
                                          ", \"n_filters2\": " + std::to_string(h["n_filters2"].as<std::int64_t>()) +
                                          ", \"dropout\": " + std::to_string(h["dropout"].as<double>()));
    }
  }
  return ok ? 0 : 1;
}
