// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Small text helpers for error messages.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <string>

#include "linkage.hpp"

namespace dettrial::detail {
/// The first line of a message (LibTorch's errors append a backtrace).
DETTRIAL_INLINE std::string first_line(std::string text);
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE std::string first_line(std::string text) {
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
