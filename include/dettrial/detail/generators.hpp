// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::GeneratorStates: the default random generators' states (the CPU's and chosen CUDA
/// devices'), kept and put back. One mechanism for every place that must leave the random stream as
/// it found it: activation checkpointing's recompute (nn/activation_checkpoint.hpp) and validation, which must
/// change nothing the training reads (trainer/fit_loop.hpp).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <mutex>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>

namespace dettrial::detail {

/// The states of the default CPU generator and of the default generators of some CUDA devices.
class GeneratorStates {
 public:
  GeneratorStates() = default;
  /// The CPU generator's state now, and those of `device` (when it is a CUDA device).
  static GeneratorStates record(const torch::Device& device) {
    GeneratorStates s;
    s.record_cpu();
    s.add_device(device);
    return s;
  }
  /// The CPU generator's state now, and those of the CUDA devices `tensors` live on.
  static GeneratorStates record(const std::vector<torch::Tensor>& tensors) {
    GeneratorStates s;
    s.record_cpu();
    for (const auto& t : tensors)
      if (t.defined()) s.add_device(t.device());
    return s;
  }
  /// `make()`'s result, with the CPU generator put back after it: for a copy of a module, which
  /// LibTorch's Cloneable (and a rebuild) initialises from it before copying the values in, and
  /// Python's deepcopy draws nothing for.
  template <class Make>
  static decltype(auto) drawing_nothing(Make&& make) {
    const GeneratorStates before = record(torch::Device(torch::kCPU));
    decltype(auto) made = std::forward<Make>(make)();
    before.restore();
    return made;
  }

  /// Puts every recorded generator back to its recorded state.
  void restore() const {
    if (cpu_.defined()) set(at::detail::getDefaultCPUGenerator(), cpu_);
    for (const auto& [device, state] : devices_) set(at::globalContext().defaultGenerator(device), state);
  }

 private:
  void record_cpu() { cpu_ = at::detail::getDefaultCPUGenerator().get_state(); }
  void add_device(const torch::Device& device) {
    if (!device.is_cuda()) return;
    for (const auto& [seen, state] : devices_)
      if (seen == device) return;
    devices_.emplace_back(device, at::globalContext().defaultGenerator(device).get_state());
  }
  static void set(at::Generator generator, const torch::Tensor& state) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

  torch::Tensor cpu_;
  std::vector<std::pair<torch::Device, torch::Tensor>> devices_;
};

}  // namespace dettrial::detail
