// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The checkpoint vocabulary: StateDict (the `state_dict.pth` a checkpoint holds, as LibTorch
/// reads it) and what a checkpoint policy is.
#pragma once

#include <concepts>
#include <string_view>

#include <torch/torch.h>

#include "../detail/linkage.hpp"

namespace dettrial {

/// A `torch.save`d state dict as LibTorch holds it: string keys to tensors, numbers, lists and dicts.
using StateDict = c10::impl::GenericDict;

/// An empty dict of names to any values (a state dict's `{}`), made where dettrial is compiled.
DETTRIAL_INLINE StateDict empty_state_dict();

/// A checkpoint policy: a name and whether to checkpoint after a validation, given whether it
/// improved on the best searcher metric so far.
template <class P>
concept CheckpointPolicyType = requires(bool improved) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::after_validation(improved) } -> std::same_as<bool>;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE StateDict empty_state_dict() { return StateDict(c10::StringType::get(), c10::AnyType::get()); }

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
