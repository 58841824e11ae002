// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a trial hands dettrial to train: a LibTorch model (a module holder or a shared
/// pointer to a module) and a LibTorch optimizer.
#pragma once

#include <concepts>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include "../vocabulary/optim.hpp"

namespace dettrial {

/// The `std::shared_ptr<torch::nn::Module>` behind a model handle.
template <ModelHandle M>
std::shared_ptr<torch::nn::Module> module_of(M& m) {
  if constexpr (requires { m.ptr(); }) return m.ptr();
  else return std::shared_ptr<torch::nn::Module>(m);
}

}  // namespace dettrial

namespace dettrial::detail {
/// The key of a parameter in `Optimizer::state()`: LibTorch 1.x keys it by the TensorImpl's address
/// printed as a string, 2.x by the address itself. The state map's key type tells which.
template <class StateMap>
auto optimizer_state_key(const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return Key(p.unsafeGetTensorImpl());
  }
}
}  // namespace dettrial::detail
