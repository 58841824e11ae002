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
/// The shortest text that reads back as `value` ("0.1", not "0.100000"): numbers in error messages.
DETTRIAL_INLINE std::string number_text(double value);
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <charconv>

namespace dettrial::detail {

DETTRIAL_INLINE std::string first_line(std::string text) {
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

DETTRIAL_INLINE std::string number_text(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
