// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The 64-bit mixing function dettrial derives seeds with (trial seeds, per-epoch shuffles).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>

namespace dettrial::detail {

/// The golden-ratio increment of splitmix64.
inline constexpr std::uint64_t golden_gamma = 0x9E3779B97F4A7C15ULL;

/// splitmix64's finaliser: a bijection that spreads every input bit over the output.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace dettrial::detail
