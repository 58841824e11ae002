// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial's version: the one place it is written (CMake reads it from here).
#pragma once

#define DETTRIAL_VERSION_MAJOR 0
#define DETTRIAL_VERSION_MINOR 1
#define DETTRIAL_VERSION_PATCH 0
#define DETTRIAL_VERSION_STRING "0.1.0"

namespace dettrial {
inline constexpr const char* version = DETTRIAL_VERSION_STRING;
}  // namespace dettrial
