// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A file replaced whole: written beside itself, then renamed over the old one, so a reader
/// (TensorBoard, a browser, a resumed run) never sees half of it.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string_view>

#include "../error.hpp"
#include "linkage.hpp"

namespace dettrial::detail {

/// Writes `bytes` to `path` through a temporary in the same folder (named with this process's id,
/// so two writers never share one) renamed over it; throws dettrial::Error naming the file.
DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, std::string_view bytes);

/// The same, with the contents streamed into the temporary by `write` (a file too large to hold
/// whole as one string: a model's weights).
DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <fstream>
#include <string>
#include <system_error>

namespace dettrial::detail {

DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, std::string_view bytes) {
  write_atomically(path, [bytes](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

DETTRIAL_INLINE void write_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write) {
  const std::filesystem::path temporary = path.parent_path() / ("." + path.filename().string() + "." + std::to_string(::getpid()) + ".tmp");
  std::error_code ignored;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    try {
      if (out) write(out);
    } catch (...) {
      out.close();
      std::filesystem::remove(temporary, ignored);
      throw;
    }
    out.flush();
    if (!out) {
      std::filesystem::remove(temporary, ignored);
      throw Error("cannot write '" + temporary.string() + "'");
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::filesystem::remove(temporary, ignored);
    throw Error("cannot replace '" + path.string() + "': " + ec.message());
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
