// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief nn::rebuilt_clone: the deep copy behind the clone() of modules whose structure comes from
/// their constructor's arguments (dettrial's ResNets and their blocks). LibTorch's Cloneable copies a
/// module by calling reset() on a copy, which such a module cannot rebuild itself with; Python's
/// `copy.deepcopy` copies anything. This builds the module anew, then copies its state and modes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "../detail/generators.hpp"
#include "../error.hpp"

namespace dettrial::detail::rebuilt_clone {

/// `to`'s tensor named `name` takes `from`'s values (on `device` when given) and gradient flag.
inline void copy_tensor(torch::Tensor& to, const torch::Tensor& from, const std::string& name, const std::string& what,
                        const c10::optional<torch::Device>& device) {
  if (!from.defined()) return;
  if (!to.defined() || to.sizes() != from.sizes())
    throw ConfigError(what + ".clone(): the rebuilt copy's '" + name + "' does not have the original's shape");
  to.set_data(device && from.device() != *device ? from.to(*device) : from.clone());
  if (to.is_leaf()) to.set_requires_grad(from.requires_grad());
}

}  // namespace dettrial::detail::rebuilt_clone

namespace dettrial::nn {

/**
 * @brief A deep copy of `original`: `build()` makes a module of the same structure (with the random
 * generators put back after it, so a clone draws nothing from the training's stream), which then
 * takes every parameter and buffer of `original` by name (on `device` when given) and every
 * module's training mode. Throws ConfigError when the rebuilt structure differs.
 */
template <class Build>
std::shared_ptr<torch::nn::Module> rebuilt_clone(const torch::nn::Module& original, Build&& build,
                                                 const c10::optional<torch::Device>& device = c10::nullopt) {
  torch::NoGradGuard no_grad;
  const std::string what = original.name();
  const std::shared_ptr<torch::nn::Module> copy = detail::GeneratorStates::drawing_nothing(std::forward<Build>(build));
  auto parameters = copy->named_parameters();
  for (const auto& p : original.named_parameters()) {
    torch::Tensor* to = parameters.find(p.key());
    if (!to) throw ConfigError(what + ".clone(): the rebuilt copy has no parameter '" + p.key() + "'");
    detail::rebuilt_clone::copy_tensor(*to, p.value(), p.key(), what, device);
  }
  auto buffers = copy->named_buffers();
  for (const auto& b : original.named_buffers()) {
    torch::Tensor* to = buffers.find(b.key());
    if (!to) throw ConfigError(what + ".clone(): the rebuilt copy has no buffer '" + b.key() + "'");
    detail::rebuilt_clone::copy_tensor(*to, b.value(), b.key(), what, device);
  }
  if (parameters.size() != original.named_parameters().size() || buffers.size() != original.named_buffers().size())
    throw ConfigError(what + ".clone(): the rebuilt copy has other parameters or buffers than the original");
  // Modes in pre-order: train() sets a module's subtree, and each module after it sets its own.
  const auto from = original.modules(), to = copy->modules();
  if (from.size() != to.size()) throw ConfigError(what + ".clone(): the rebuilt copy has another module tree than the original");
  for (std::size_t i = 0; i < from.size(); ++i) to[i]->train(from[i]->is_training());
  return copy;
}

}  // namespace dettrial::nn
