// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The precision of a trial's forward passes (`optimizations.mixed_precision`).
#pragma once

#include <string>

#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// fp32 (autocast off), or autocast to bf16 or to fp16 (with a gradient scaler).
enum class Precision { fp32, bf16, fp16 };

DETTRIAL_INLINE const char* to_string(Precision p);

/// `optimizations.mixed_precision`: O0 / fp32 (off), bf16, fp16, and Apex's O1 read as fp16 autocast
/// (what O1 amounts to). Apex's O2 and O3 (fp16 master weights) and anything else are a ConfigError.
DETTRIAL_INLINE Precision parse_precision(const std::string& text);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

DETTRIAL_INLINE Precision parse_precision(const std::string& text) {
  if (text == "O0" || text == "fp32" || text == "off") return Precision::fp32;
  if (text == "bf16" || text == "bfloat16") return Precision::bf16;
  if (text == "fp16" || text == "float16" || text == "O1") return Precision::fp16;
  if (text == "O2" || text == "O3")
    throw ConfigError("mixed_precision '" + text +
                      "' is Apex's fp16 master weights, which dettrial does not do; "
                      "use O1 or fp16 (autocast with a gradient scaler), or bf16");
  throw ConfigError("mixed_precision is '" + text + "'; expected O0 (off), fp16 (or O1) or bf16");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
