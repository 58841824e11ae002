// SPDX-License-Identifier: Apache-2.0
// dettrial on a GPU (bench/gpu runs it beside bench/gpu_bench.py and prints the ratios):
//  - the MNIST example's trial on Fashion-MNIST (batch 64, SGD 0.03 momentum 0.9), through the full
//    Trainer (metrics, boundaries, a validation at the end), with LibTorch's SGD as before, and with
//    its default FusedSGD eager and with the training step
//    captured in a CUDA graph, with the data on the host (pinned) or kept on the GPU;
//  - a compute-bound network (a small ResNet-style convnet, batch 256, synthetic images on the GPU),
//    fp32 against bf16 autocast and fp16 autocast with a gradient scaler.
// Each run's training rate is timed from the start of its first epoch to the end of its last, with
// the GPU synchronized at both ends; one JSON line per run on stdout. Without a GPU it says so and
// exits 77 (skipped).
//   gpu_bench [--data DIR] [--epochs N] [--quick] [--only TEXT]   (--only: the runs whose name holds TEXT)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include <dettrial/dettrial.hpp>

#include "mnist/mnist_trial.hpp"

namespace {

/// Times training: from the first epoch's start to the last epoch's end, the GPU synchronized.
struct EpochTimer {
  std::int64_t epochs = 0;
  std::chrono::steady_clock::time_point start{}, end{};
  void on_training_epoch_start(std::int64_t epoch) {
    if (epoch > 0 && start != std::chrono::steady_clock::time_point{}) return;
    torch::cuda::synchronize();
    start = std::chrono::steady_clock::now();
  }
  void on_training_epoch_end(std::int64_t) {
    torch::cuda::synchronize();
    end = std::chrono::steady_clock::now();
    ++epochs;
  }
  double seconds() const { return std::chrono::duration<double>(end - start).count(); }
};

/// A small ResNet-style convnet: a stem, three stages of two residual blocks (64, 128, 256
/// channels, stride 2 between stages), global pooling and a linear classifier; 32 x 32 inputs.
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      shortcut = register_module("shortcut",
                                 torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                                       torch::nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(Block);

torch::nn::Sequential small_resnet() {
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1).bias(false)), torch::nn::BatchNorm2d(64),
                            torch::nn::ReLU());
  std::int64_t in = 64;
  for (const std::int64_t out : {64, 128, 256})
    for (int b = 0; b < 2; ++b) {
      net->push_back(Block(in, out, b == 0 && out != 64 ? 2 : 1));
      in = out;
    }
  net->push_back(torch::nn::AdaptiveAvgPool2d(1));
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(256, 10));
  return net;
}

/// The convnet on synthetic images kept on the GPU (the same seed gives the same images as Python's
/// bench: both draw them with torch's generator on the GPU, but only the shapes matter for speed).
class ResNetTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  explicit ResNetTrial(dettrial::Context& context) : context_(context) {
    const std::int64_t n = context.get_hparams().get_or<std::int64_t>("records", 256 * 40);
    images_ = torch::randn({n, 3, 32, 32}, torch::TensorOptions().device(context.device()));
    labels_ = torch::randint(0, 10, {n}, torch::TensorOptions().dtype(torch::kLong).device(context.device()));
  }
  torch::nn::Sequential build_model() { return small_resnet(); }
  dettrial::optim::FusedSGD optimizer(torch::nn::Sequential& model) {
    return dettrial::optim::FusedSGD(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  auto build_training_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset(images_, labels_),
                                {.batch_size = context_.get_per_slot_batch_size(), .shuffle = true, .drop_last = true});
  }
  auto build_validation_data_loader() {
    return dettrial::DataLoader(dettrial::TensorDataset(images_.narrow(0, 0, 1024), labels_.narrow(0, 0, 1024)), {.batch_size = 256});
  }
  dettrial::Metrics train_batch(Batch& batch, torch::nn::Sequential& model, std::int64_t, std::int64_t) {
    auto& [x, y] = batch;
    return {{"loss", torch::cross_entropy_loss(model->forward(x), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& batch, torch::nn::Sequential& model) {
    auto& [x, y] = batch;
    return {{"validation_loss", torch::cross_entropy_loss(model->forward(x), y)}};
  }

 private:
  dettrial::Context& context_;
  torch::Tensor images_, labels_;
};

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 2;
  bool quick = false;
  std::string only;  // run just the runs whose name holds this text
};

template <class Trial>
void run(const std::string& name, const std::string& yaml, const Options& opt, std::int64_t records_per_epoch, const char* note) {
  if (name.find(opt.only) == std::string::npos) {
    std::printf("left out (--only %s): %s\n", opt.only.c_str(), name.c_str());
    return;
  }
  dettrial::Context context(dettrial::ExperimentConfig::parse(yaml));
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<Trial> trainer(context);
  EpochTimer timer;
  dettrial::FitOptions fit = dettrial::FitOptions::from_config(context.get_experiment_config());
  fit.max_length = opt.quick ? dettrial::TrainUnit(dettrial::Batch(40)) : dettrial::TrainUnit(dettrial::Epoch(opt.epochs));
  fit.reporting_period = dettrial::Batch(1000000);
  fit.report = {.live_progress = false, .quiet = true};
  fit.output_dir = std::filesystem::temp_directory_path() / ("dettrial-gpu-bench-" + std::to_string(::getpid()));
  fit.checkpoint_policy = dettrial::CheckpointPolicy::none;
  const dettrial::FitResult result = trainer.fit(fit, timer);
  std::filesystem::remove_all(fit.output_dir);
  const double records = opt.quick ? 40.0 * context.get_global_batch_size() : static_cast<double>(records_per_epoch * timer.epochs);
  std::printf(
      "{\"name\": \"%s\", \"value\": %.1f, \"unit\": \"samples/s\", \"seconds\": %.3f, \"epochs\": %lld, "
      "\"validation_loss\": %.6f, \"note\": \"%s\"}\n",
      name.c_str(), records / timer.seconds(), timer.seconds(), static_cast<long long>(timer.epochs),
      result.last_validation_metrics.get("validation_loss").value_or(-1.0), note);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data" && i + 1 < argc) opt.data = argv[++i];
    else if (a == "--epochs" && i + 1 < argc) opt.epochs = std::atoll(argv[++i]);
    else if (a == "--quick") opt.quick = true;
    else if (a == "--only" && i + 1 < argc) opt.only = argv[++i];
    else {
      std::fprintf(stderr, "usage: gpu_bench [--data DIR] [--epochs N] [--quick] [--only TEXT]\n");
      return 2;
    }
  }
  if (!dettrial::detail::step_capture_built || !torch::cuda::is_available()) {
    std::printf("skipped: gpu_bench needs a CUDA device and a CUDA-built LibTorch (%s)\n",
                dettrial::detail::step_capture_built ? "no CUDA device" : "this LibTorch is CPU-only");
    return 77;
  }
  const std::string mnist_hparams =
      "hyperparameters: {learning_rate: 0.03, dropout: 0.5, global_batch_size: 64, n_filters1: 40, n_filters2: 40}\n"
      "searcher: {name: single, metric: validation_loss, max_length: {epochs: 1}}\n";
  const std::string data = "data: {dir: " + opt.data + ", on_device: ";
  const std::string graph = "optimizations: {step_capture: cuda_graph}\n";
  using Eager = mnist::BasicMnistTrial<torch::optim::SGD>;
  using Graphed = mnist::BasicMnistTrial<dettrial::optim::FusedSGD>;
  const std::int64_t fashion = 60000;
  run<Eager>("MNIST example with LibTorch's SGD, eager (pinned host data)", mnist_hparams + data + "false}\n", opt, fashion, "");
  run<Graphed>("MNIST example, eager (pinned host data)", mnist_hparams + data + "false}\n", opt, fashion, "");
  run<Graphed>("MNIST example, eager, data on the GPU", mnist_hparams + data + "true}\n", opt, fashion, "");
  run<Graphed>("MNIST example, graphed (pinned host data)", mnist_hparams + data + "false}\n" + graph, opt, fashion, "");
  run<Graphed>("MNIST example, graphed, data on the GPU", mnist_hparams + data + "true}\n" + graph, opt, fashion, "");
  run<Graphed>("MNIST example, graphed, fp16 with its scaler in the graph, data on the GPU",
               mnist_hparams + data + "true}\noptimizations: {step_capture: cuda_graph, mixed_precision: fp16}\n", opt, fashion, "");
  const std::string resnet =
      "hyperparameters: {global_batch_size: 256, records: 10240}\n"
      "searcher: {name: single, metric: validation_loss, max_length: {epochs: 1}}\n";
  run<ResNetTrial>("ResNet-style convnet, batch 256, fp32", resnet, opt, 10240, "");
  run<ResNetTrial>("ResNet-style convnet, batch 256, bf16 autocast", resnet + "optimizations: {mixed_precision: bf16}\n", opt, 10240, "");
  run<ResNetTrial>("ResNet-style convnet, batch 256, fp16 autocast and scaler", resnet + "optimizations: {mixed_precision: fp16}\n", opt,
                   10240, "");
  return 0;
}
