// SPDX-License-Identifier: Apache-2.0
// Activation checkpointing's price and gain on a deep network (bench/activation_checkpointing.sh
// runs it): one process per measurement, so that each has its own peak resident memory.
//
//   activation_checkpointing_bench --mode plain|each [--depth 32] [--width 2048] [--batch 512] [--steps 6]
//
// The network is `depth` blocks of Linear(width, width), ReLU and Dropout(0.1), trained with SGD on
// random data; `each` wraps the blocks in dettrial::nn::CheckpointEach (every block recomputed in
// backward). Prints one line: the mode, the milliseconds per training step (the median of the steps
// after the first), the peak resident memory after the model and optimizer were made, and at the end.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace {

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "plain";
  std::int64_t depth = 32, width = 2048, batch = 512, steps = 6;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--mode") mode = value;
    else if (flag == "--depth") depth = std::stoll(value);
    else if (flag == "--width") width = std::stoll(value);
    else if (flag == "--batch") batch = std::stoll(value);
    else if (flag == "--steps") steps = std::stoll(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (mode != "plain" && mode != "each") {
    std::fprintf(stderr, "--mode is plain or each, not %s\n", mode.c_str());
    return 2;
  }
  torch::manual_seed(0);
  torch::nn::Sequential blocks;
  for (std::int64_t i = 0; i < depth; ++i) {
    blocks->push_back(torch::nn::Linear(width, width));
    blocks->push_back(torch::nn::ReLU());
    blocks->push_back(torch::nn::Dropout(0.1));
  }
  dettrial::nn::CheckpointEach each(blocks);
  torch::optim::SGD opt(blocks->parameters(), torch::optim::SGDOptions(1e-4));
  const torch::Tensor x = torch::randn({batch, width});
  const double model_mib = peak_rss_mib();
  std::vector<double> ms;
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad();
    const torch::Tensor y = mode == "each" ? each->forward(x) : blocks->forward(x);
    y.pow(2).mean().backward();
    opt.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::vector<double> timed(ms.begin() + (ms.size() > 1 ? 1 : 0), ms.end());
  std::sort(timed.begin(), timed.end());
  std::printf("%s ms_per_step %.1f model_mib %.0f peak_mib %.0f\n", mode.c_str(), timed[timed.size() / 2], model_mib, peak_rss_mib());
  return 0;
}
