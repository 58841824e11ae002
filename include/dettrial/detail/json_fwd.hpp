// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::detail::Json declared, without nlohmann/json's 25,000 lines: what a header needs
/// for declarations that take or return JSON. The definitions (and header-only mode) include
/// json.hpp, so a trial's translation unit in separate-compilation mode does not parse the library.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <nlohmann/json_fwd.hpp>

namespace dettrial::detail {

/// A JSON value whose objects keep their keys in insertion order (the order dettrial writes them).
using Json = nlohmann::ordered_json;

}  // namespace dettrial::detail
