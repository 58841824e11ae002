// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradient clipping policies for `step_optimizer`.
#pragma once

#include <concepts>
#include <vector>

#include <torch/torch.h>

namespace dettrial {

/// A clipping policy: called with the optimizer's parameters before the step.
template <class C>
concept GradientClipper = std::invocable<C&, std::vector<torch::Tensor>&>;

namespace clip {

/// No clipping (the default).
struct none {
  void operator()(std::vector<torch::Tensor>&) const noexcept {}
};
/// Scales gradients so their total `norm_type`-norm is at most `max_norm` (torch's clip_grad_norm_).
struct by_norm {
  double max_norm;
  double norm_type = 2.0;
  void operator()(std::vector<torch::Tensor>& params) const {
    torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
  }
};
/// Clamps every gradient element to [-clip_value, clip_value] (torch's clip_grad_value_).
struct by_value {
  double clip_value;
  void operator()(std::vector<torch::Tensor>& params) const {
    torch::nn::utils::clip_grad_value_(params, clip_value);
  }
};

}  // namespace clip
}  // namespace dettrial
