// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The checkpoint vocabulary: StateDict (the `state_dict.pth` a checkpoint holds, as LibTorch
/// reads it) and what a checkpoint policy is.
#pragma once

#include <concepts>
#include <string_view>

#include <torch/torch.h>

namespace dettrial {

/// A `torch.save`d state dict as LibTorch holds it: string keys to tensors, numbers, lists and dicts.
using StateDict = c10::impl::GenericDict;

/// A checkpoint policy: a name and whether to checkpoint after a validation, given whether it
/// improved on the best searcher metric so far.
template <class P>
concept CheckpointPolicyType = requires(bool improved) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::after_validation(improved) } -> std::same_as<bool>;
};

}  // namespace dettrial
