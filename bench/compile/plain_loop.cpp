// SPDX-License-Identifier: Apache-2.0
// The compile-time baseline: the MNIST example's network trained by a hand-written LibTorch loop
// (random data, SGD with momentum, an accuracy pass), with LibTorch alone. bench/compile_time.sh
// compiles it beside a dettrial trial of the same network.
#include <cstdio>

#include <torch/torch.h>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                              torch::nn::Flatten(), torch::nn::Linear(16 * 64, 50), torch::nn::ReLU(), torch::nn::Dropout(0.5),
                              torch::nn::Linear(50, 10), torch::nn::LogSoftmax(1));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.03).momentum(0.9));
  const torch::Tensor images = torch::randn({256, 1, 28, 28}), labels = torch::randint(0, 10, {256});
  for (int epoch = 0; epoch < 2; ++epoch) {
    model->train();
    for (int first = 0; first < 256; first += 64) {
      const torch::Tensor x = images.narrow(0, first, 64), y = labels.narrow(0, first, 64);
      optimizer.zero_grad();
      const torch::Tensor loss = torch::nll_loss(model->forward(x), y);
      loss.backward();
      optimizer.step();
    }
    torch::NoGradGuard no_grad;
    model->eval();
    const double accuracy = model->forward(images).argmax(1).eq(labels).to(torch::kFloat).mean().item<double>();
    std::printf("epoch %d: accuracy %.4f\n", epoch, accuracy);
  }
}
