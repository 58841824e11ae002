// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Small text helpers for error messages.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <string>

namespace dettrial::detail {
/// The first line of a message (LibTorch's errors append a backtrace).
inline std::string first_line(std::string text) {
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}
}  // namespace dettrial::detail
