// SPDX-License-Identifier: Apache-2.0
// Activation checkpointing's price and gain on a deep network (bench/activation_checkpointing.sh
// runs it): one process per measurement, so that each has its own peak resident memory.
//
//   activation_checkpointing_bench --mode plain|each [--depth 32] [--width 1024] [--batch 2048] [--steps 6]
//
// The network is `depth` blocks, each Linear(width, width), ReLU and Dropout(0.1) (so a block keeps
// three activations of batch x width floats for backward), trained with SGD on
// random data; `each` wraps the blocks in dettrial::nn::CheckpointEach (every block recomputed in
// backward). Prints one line: the mode, the milliseconds per training step (the median of the steps
// after the first), the peak resident memory after the model and optimizer were made and at the end,
// and the memory the forward pass holds for backward (malloc's bytes in use after it, less before it).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace {

/// Linear, ReLU and Dropout(0.1): three activations kept for backward.
struct BlockImpl : torch::nn::Cloneable<BlockImpl> {
  explicit BlockImpl(std::int64_t width) : width(width) { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(width, width)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::dropout(torch::relu(linear(x)), 0.1, is_training()); }
  std::int64_t width;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(Block);

/// Memory malloc has handed out and not taken back now (heap and mmapped chunks), in MiB.
double in_use_mib() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd) / (1024.0 * 1024.0);
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "plain";
  std::int64_t depth = 32, width = 1024, batch = 2048, steps = 6;
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
  // Tensors of 1 MiB and more straight from mmap and back to the system when freed (glibc otherwise
  // raises its threshold after the first free and keeps freed activations in its heap), so that the
  // peak resident memory is the peak of what is live, in both modes alike.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  torch::manual_seed(0);
  torch::nn::Sequential blocks;
  for (std::int64_t i = 0; i < depth; ++i) blocks->push_back(Block(width));
  dettrial::nn::CheckpointEach each(blocks);
  torch::optim::SGD opt(blocks->parameters(), torch::optim::SGDOptions(1e-4));
  const torch::Tensor x = torch::randn({batch, width});
  const double model_mib = peak_rss_mib();
  std::vector<double> ms;
  double held_mib = 0;  // what the forward keeps for backward: the activations (or the blocks' inputs)
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    for (auto& p : blocks->parameters()) p.mutable_grad() = torch::Tensor();  // set to none (LibTorch 1.x has no flag for it)
    const double before = in_use_mib();
    const torch::Tensor loss = (mode == "each" ? each->forward(x) : blocks->forward(x)).pow(2).mean();
    held_mib = std::max(held_mib, in_use_mib() - before);
    loss.backward();
    opt.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::vector<double> timed(ms.begin() + (ms.size() > 1 ? 1 : 0), ms.end());
  std::sort(timed.begin(), timed.end());
  std::printf("%s ms_per_step %.1f model_mib %.0f peak_mib %.0f held_mib %.0f\n", mode.c_str(), timed[timed.size() / 2], model_mib,
              peak_rss_mib(), held_mib);
  return 0;
}
