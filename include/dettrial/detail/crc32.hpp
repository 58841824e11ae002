// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief zlib's CRC-32, the one checksum dettrial computes: of bytes (checkpoint files, their
/// manifests) and of a tensor's values (a rank's seed from the chief's generator state, the
/// fingerprints ranks compare their parameters by).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <string_view>

#include <torch/types.h>

#include "linkage.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE std::uint32_t crc32_of(std::string_view bytes);
/// The CRC-32 of what `crc` covered followed by `bytes`.
DETTRIAL_INLINE std::uint32_t crc32_continue(std::uint32_t crc, std::string_view bytes);
/// The CRC-32 of `tensor`'s values as its bytes (a contiguous copy on the host).
DETTRIAL_INLINE std::uint32_t tensor_crc32(const torch::Tensor& tensor);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cstddef>

#include <zlib.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::uint32_t crc32_continue(std::uint32_t crc, std::string_view bytes) {
  uLong value = crc;
  // zlib takes uInt lengths: feed large buffers in pieces.
  while (!bytes.empty()) {
    const std::size_t n = std::min<std::size_t>(bytes.size(), 1u << 30);
    value = ::crc32(value, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<std::uint32_t>(value);
}

DETTRIAL_INLINE std::uint32_t crc32_of(std::string_view bytes) {
  return crc32_continue(static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0)), bytes);
}

DETTRIAL_INLINE std::uint32_t tensor_crc32(const torch::Tensor& tensor) {
  const torch::Tensor bytes = tensor.detach().to(torch::kCPU).contiguous();
  return crc32_of(std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
