// SPDX-License-Identifier: Apache-2.0
// Data loading, measured side by side in one process: dettrial's DataLoader against LibTorch's
// torch::data::DataLoader on the same in-memory 60,000 x 28 x 28 data (batch 64, shuffled), and the
// MNIST example's training against the same steps over batches prepared in memory beforehand.
// Prints one JSON object per measurement (bench/run turns them into a table).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <mnist/mnist_trial.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds(const std::function<void()>& f) {
  const auto start = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// LibTorch's per-example dataset: get(i) per record, then Stack.
struct InMemory : torch::data::datasets::Dataset<InMemory> {
  torch::Tensor images, labels;
  InMemory(torch::Tensor x, torch::Tensor y) : images(std::move(x)), labels(std::move(y)) {}
  torch::data::Example<> get(size_t i) override {
    const auto j = static_cast<std::int64_t>(i);
    return {images[j], labels[j]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(images.size(0)); }
};

void report(const char* name, double value, const char* unit, double spread) {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.3g}\n", name, value, unit, spread);
  std::fflush(stdout);
}

/// Runs each measurement once untimed (warm-up), then alternates them `rounds` times; reports each
/// one's median and its spread (max / min).
void side_by_side(int rounds, std::vector<std::pair<const char*, std::function<double()>>> measures, const char* unit) {
  for (auto& m : measures) (void)m.second();
  std::vector<std::vector<double>> results(measures.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < measures.size(); ++i) results[i].push_back(measures[i].second());
  for (std::size_t i = 0; i < measures.size(); ++i) {
    const auto [lo, hi] = std::minmax_element(results[i].begin(), results[i].end());
    report(measures[i].first, median(results[i]), unit, *hi / *lo);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  torch::manual_seed(0);
  const torch::Tensor images = torch::rand({60000, 1, 28, 28});
  const torch::Tensor labels = torch::randint(0, 10, {60000}, torch::kLong);
  const int rounds = quick ? 1 : 5;

  // ---- loaders: batches per second over one shuffled epoch (938 batches of 64) ----
  auto dettrial_epoch = [&](int workers) {
    dettrial::DataLoader loader(dettrial::TensorDataset(images, labels),
                                {.batch_size = 64, .shuffle = true, .seed = 1, .workers = workers});
    std::int64_t n = 0;
    const double s = seconds([&] {
      for (auto&& [x, y] : loader.batches({})) n += x.size(0) > 0;
    });
    return static_cast<double>(n) / s;
  };
  auto libtorch_epoch = [&](int workers) {
    auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        InMemory(images, labels).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions().batch_size(64).workers(static_cast<size_t>(workers)));
    std::int64_t n = 0;
    const double s = seconds([&] {
      for (auto& batch : *loader) n += batch.data.size(0) > 0;
    });
    return static_cast<double>(n) / s;
  };
  side_by_side(rounds,
               {{"dettrial DataLoader (workers 0)", [&] { return dettrial_epoch(0); }},
                {"dettrial DataLoader (workers 2)", [&] { return dettrial_epoch(2); }},
                {"torch::data::DataLoader (workers 0)", [&] { return libtorch_epoch(0); }},
                {"torch::data::DataLoader (workers 2)", [&] { return libtorch_epoch(2); }}},
               "batches/s");

  // ---- the MNIST example: Trainer over its DataLoader vs the same steps over pre-built batches ----
  const char* fashion = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(std::filesystem::path(fashion) / "train-images-idx3-ubyte.gz")) {
    std::fprintf(stderr, "skipping the MNIST comparison: %s is absent\n", fashion);
    return 0;
  }
  const std::int64_t steps = quick ? 20 : 200;
  torch::set_num_threads(1);  // steadier on a small shared machine
  const auto config = dettrial::ExperimentConfig::parse(
      "hyperparameters: {learning_rate: 0.03, dropout: 0.3, global_batch_size: 64, n_filters1: 40, n_filters2: 40}\n"
      "data: {dir: /usr/share/datasets/fashion-mnist}\n");
  struct Clock {
    clock_type::time_point start, end;
    void on_training_start() { start = clock_type::now(); }
    void on_training_workload_end(const dettrial::MetricValues&) { end = clock_type::now(); }
  };
  auto with_trainer = [&] {
    dettrial::Context context(config, {.trial_seed = 1, .threads = 1});
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
    dettrial::Trainer<mnist::MnistTrial> trainer(context);
    Clock clock;
    trainer.fit({.max_length = dettrial::Batch(steps),
                 .reporting_period = dettrial::Batch(100),
                 .output_dir = "/tmp/dettrial-bench",
                 .report = {.quiet = true}},
                clock);
    return std::chrono::duration<double>(clock.end - clock.start).count() / static_cast<double>(steps);
  };
  auto prebatched = [&] {
    dettrial::Context context(config, {.trial_seed = 1, .threads = 1});
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
    mnist::MnistTrial trial(context);
    auto model = trial.build_model();
    auto optimizer = trial.optimizer(model);
    auto loader = trial.build_training_data_loader();
    std::vector<std::tuple<torch::Tensor, torch::Tensor>> batches;
    for (auto&& b : loader.batches({.repeat = true})) {
      batches.push_back(std::move(b));
      if (static_cast<std::int64_t>(batches.size()) == steps) break;
    }
    model->train();
    torch::Tensor loss_sum = torch::zeros({}, torch::kDouble);
    const double s = seconds([&] {
      for (auto& [x, y] : batches) {
        auto output = model->forward(x);
        auto loss = torch::nll_loss(output, y);
        auto error = mnist::MnistTrial::error_rate(output, y);
        loss.backward();
        optimizer.step();
        optimizer.zero_grad();
        torch::NoGradGuard no_grad;
        loss_sum.add_(loss);
        loss_sum.add_(error);
      }
      (void)loss_sum.item<double>();
    });
    return s / static_cast<double>(steps);
  };
  side_by_side(quick ? 1 : 5, {{"MNIST example: Trainer + DataLoader", with_trainer}, {"MNIST example: pre-batched loop", prebatched}},
               "s/batch");
  return 0;
}
