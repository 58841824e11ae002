// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Activation checkpointing, which LibTorch's C++ API never had: a module's or a function's
/// forward run without keeping its activations, and run again in backward with the random
/// generators as they were (as Python's `torch.utils.checkpoint` does with `preserve_rng_state=True`,
/// dropout included, and autocast as it was), so that the gradients are the ones the plain run
/// computes, bit for bit.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "../detail/generators.hpp"
#include "../detail/linkage.hpp"
#include "../optim/mixed_precision.hpp"

namespace dettrial::nn {

/// A checkpointed function: tensors in, tensors out.
using CheckpointedFunction = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

/**
 * @brief Runs `function(inputs)` without keeping its activations; backward runs it again (the CPU
 * generator and those of the inputs' CUDA devices restored to their state before the first run) and
 * back-propagates through that. `parameters` are the tensors the function reads besides its inputs
 * (a module's parameters): their gradients come out of the checkpoint like the inputs', in the
 * order the plain run's engine gives them, also when no input requires a gradient (the first
 * block's, whose input is data). Without them, the parameters' gradients are accumulated by a
 * backward inside the backward, as Python's reentrant checkpoint does, and only reach them when an
 * input requires a gradient. With grad mode off, it is a plain call.
 */
DETTRIAL_INLINE std::vector<torch::Tensor> checkpoint(const CheckpointedFunction& function, const std::vector<torch::Tensor>& inputs,
                                                      const std::vector<torch::Tensor>& parameters = {});

/// A module holder's forward(input), checkpointed with its parameters.
template <class M>
  requires requires(M& m, const torch::Tensor& x) {
    { m->forward(x) } -> std::convertible_to<torch::Tensor>;
    m->parameters();
  }
torch::Tensor checkpoint(M& module, const torch::Tensor& input) {
  return checkpoint([&module](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{module->forward(in[0])}; }, {input},
                    module->parameters())
      .front();
}

/**
 * @brief Python's `torch.utils.checkpoint.checkpoint_sequential(functions, segments, input)`: the
 * Sequential's modules split into `segments` runs of equal length (the last takes the rest), each
 * checkpointed but the last, which runs as usual (its activations are needed at once).
 */
DETTRIAL_INLINE torch::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, std::int64_t segments, const torch::Tensor& input);

/**
 * @brief A Sequential whose every block is checkpointed while training with gradients (in
 * evaluation, or without grad mode, its blocks run as usual): memory for one block's activations
 * at a time plus the blocks' inputs, for one more forward of each block in backward. Its
 * `state_dict()` names are the Sequential's (`blocks.0.weight`, ...: the blocks are its `blocks`).
 */
class CheckpointEachImpl : public torch::nn::Cloneable<CheckpointEachImpl> {
 public:
  explicit CheckpointEachImpl(torch::nn::Sequential blocks) : blocks_(std::move(blocks)) { register_module("blocks", blocks_); }
  /// Nothing of its own to reset: its parameters are the blocks'.
  void reset() override {}
  /// A deep copy, modes included, that draws nothing from the random generators. Cloneable's own
  /// clone() rebuilds a copy's children with reset(), which cannot make this wrapper's blocks (they
  /// are given, not built): the blocks are cloned as a Sequential clones its modules.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Sequential& blocks() { return blocks_; }

 private:
  torch::nn::Sequential blocks_;
};
TORCH_MODULE(CheckpointEach);

}  // namespace dettrial::nn

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <optional>
#include <string>
#include <utility>

#include "../error.hpp"

namespace dettrial::detail::checkpoint {

/// What the checkpoint keeps between the forward and the backward.
struct Saved : torch::CustomClassHolder {
  nn::CheckpointedFunction function;
  std::size_t inputs = 0;
  bool with_parameters = false;
  /// The generators (the CPU's and the inputs' CUDA devices') as they were for the first run.
  detail::GeneratorStates generators;
  /// Autocast's state in the first run (none: off), for the run in backward.
  std::optional<at::ScalarType> cpu_autocast, cuda_autocast;
};

/// Python's CheckpointFunction: forward without a graph, backward by running again.
struct Function : torch::autograd::Function<Function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<Saved> saved,
                                                at::TensorList tensors) {
    const std::vector<torch::Tensor> inputs(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(saved->inputs));
    c10::List<torch::Tensor> parameters;
    for (std::size_t i = saved->inputs; i < tensors.size(); ++i) parameters.push_back(tensors[i]);
    ctx->saved_data["parameters"] = parameters;
    saved->generators = detail::GeneratorStates::record(inputs);
    saved->cpu_autocast = AutocastGuard::current(torch::kCPU);
    saved->cuda_autocast = AutocastGuard::current(torch::kCUDA);
    std::vector<torch::Tensor> outputs;
    {
      torch::NoGradGuard no_grad;
      outputs = saved->function(inputs);
    }
    ctx->save_for_backward(inputs);
    ctx->saved_data["saved"] = c10::IValue::make_capsule(saved);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
    auto saved = c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data["saved"].toCapsule());
    const auto originals = ctx->get_saved_variables();
    std::vector<torch::Tensor> inputs;
    for (const auto& x : originals) inputs.push_back(x.defined() ? x.detach().requires_grad_(x.requires_grad()) : x);
    // The generators as they were for the first run, and back as they are after this one.
    const auto now = detail::GeneratorStates::record(inputs);
    saved->generators.restore();
    std::vector<torch::Tensor> outputs;
    {
      torch::AutoGradMode enable(true);
      AutocastGuard cpu(torch::kCPU, saved->cpu_autocast), cuda(torch::kCUDA, saved->cuda_autocast);
      outputs = saved->function(inputs);
    }
    now.restore();

    std::vector<torch::Tensor> with_grad, grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    torch::autograd::variable_list result{torch::Tensor()};  // for `saved`, which is no tensor
    if (!saved->with_parameters) {                           // Python's reentrant nn::checkpoint: a backward inside the backward
      if (!with_grad.empty()) torch::autograd::backward(with_grad, grads);
      for (const auto& x : inputs) result.push_back(x.defined() && x.requires_grad() ? x.grad() : torch::Tensor());
      return result;
    }
    // Inputs and parameters as the function's differentiable arguments: their gradients go out.
    std::vector<torch::Tensor> wrt;
    std::vector<std::size_t> index;
    const auto params = ctx->saved_data["parameters"].toTensorList();
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        index.push_back(i);
      }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor p = params.get(i);
      if (p.requires_grad()) {
        wrt.push_back(p);
        index.push_back(inputs.size() + i);
      }
    }
    std::vector<torch::Tensor> got(inputs.size() + params.size());
    if (!with_grad.empty() && !wrt.empty()) {
      const auto g = torch::autograd::grad(with_grad, wrt, grads, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
      for (std::size_t k = 0; k < g.size(); ++k) got[index[k]] = g[k];
    }
    result.insert(result.end(), got.begin(), got.end());
    return result;
  }
};

}  // namespace dettrial::detail::checkpoint

namespace dettrial::nn {
DETTRIAL_INLINE std::vector<torch::Tensor> checkpoint(const CheckpointedFunction& function, const std::vector<torch::Tensor>& inputs,
                                                      const std::vector<torch::Tensor>& parameters) {
  if (!function) throw ConfigError("dettrial::nn::checkpoint: the function is empty");
  if (!torch::GradMode::is_enabled()) return function(inputs);  // nothing to recompute
  auto saved = c10::make_intrusive<detail::checkpoint::Saved>();
  saved->function = function;
  saved->inputs = inputs.size();
  saved->with_parameters = !parameters.empty();
  torch::autograd::variable_list tensors(inputs.begin(), inputs.end());
  tensors.insert(tensors.end(), parameters.begin(), parameters.end());
  // The parameters reach backward through the context, as a list (the autograd function's own
  // saved variables are the inputs): Function::apply sees them as differentiable arguments too.
  return detail::checkpoint::Function::apply(saved, at::TensorList(tensors));  // a TensorList: each tensor an input
}

DETTRIAL_INLINE torch::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, std::int64_t segments, const torch::Tensor& input) {
  const auto n = static_cast<std::int64_t>(sequential->size());
  if (segments < 1 || segments > std::max<std::int64_t>(n, 1))
    throw ConfigError("dettrial::nn::checkpoint_sequential: segments must be in [1, " + std::to_string(n) + "], not " +
                      std::to_string(segments));
  const std::int64_t length = n / segments;
  const auto run = [&sequential](std::int64_t from, std::int64_t to) {  // modules from..to, inclusive
    return [&sequential, from, to](const std::vector<torch::Tensor>& in) {
      torch::Tensor x = in[0];
      for (std::int64_t i = from; i <= to; ++i) x = (sequential->begin() + i)->forward(x);
      return std::vector<torch::Tensor>{x};
    };
  };
  torch::Tensor x = input;
  std::int64_t end = -1;
  for (std::int64_t start = 0; start < length * (segments - 1); start += length) {
    end = start + length - 1;
    std::vector<torch::Tensor> params;
    for (std::int64_t i = start; i <= end; ++i)
      for (const auto& p : sequential->ptr(static_cast<std::size_t>(i))->parameters()) params.push_back(p);
    x = checkpoint(run(start, end), {x}, params).front();
  }
  return run(end + 1, n - 1)({x}).front();
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> CheckpointEachImpl::clone(const c10::optional<torch::Device>& device) const {
  // LibTorch's clone of a block draws its reset()'s initialisation from the random generators;
  // a copy draws nothing (Python's deepcopy), so they are put back after it.
  auto blocks = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
      detail::GeneratorStates::drawing_nothing([&] { return blocks_->clone(device); }));
  auto copy = std::make_shared<CheckpointEachImpl>(torch::nn::Sequential(std::move(blocks)));
  // A Sequential's clone starts in training mode: the wrapper's mode (whether it recomputes) and
  // each block's are the original's.
  copy->train(is_training());
  for (std::size_t i = 0; i < blocks_->size(); ++i) copy->blocks_->ptr(i)->train(blocks_->ptr(i)->is_training());
  return copy;
}

DETTRIAL_INLINE torch::Tensor CheckpointEachImpl::forward(torch::Tensor x) {
  const bool recompute = is_training() && torch::GradMode::is_enabled();
  for (auto& block : *blocks_) {
    if (!recompute) {
      x = block.forward(x);
      continue;
    }
    x = checkpoint([&block](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{block.forward(in[0])}; }, {x},
                   block.ptr()->parameters())
            .front();
  }
  return x;
}

}  // namespace dettrial::nn

#endif  // DETTRIAL_HEADER_DEFINITIONS
