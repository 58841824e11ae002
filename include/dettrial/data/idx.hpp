// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Reading IDX files (the MNIST format), raw or gzip-compressed, and MNIST-layout folders.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief Reads an IDX file (raw, or gzip: zlib reads both) into a tensor of its element type and
 * dimensions. Errors name the file and what is wrong with it.
 */
DETTRIAL_INLINE torch::Tensor read_idx(const std::filesystem::path& path);

/// Images (uint8, N x rows x cols) and labels (uint8, N) of one split of an MNIST-format folder.
struct MnistSplit {
  torch::Tensor images;
  torch::Tensor labels;
};

/**
 * @brief Loads split `train` or `t10k` of a folder in MNIST's layout (MNIST, Fashion-MNIST, ...):
 * `<split>-images-idx3-ubyte[.gz]` and `<split>-labels-idx1-ubyte[.gz]` (also `-images.idx3-ubyte`).
 */
DETTRIAL_INLINE MnistSplit load_mnist(const std::filesystem::path& dir, const std::string& split);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <zlib.h>

namespace dettrial::detail::idx {

/// An open IDX file (plain or gzip), read by what its header says.
struct Reader {
  gzFile file;
  const std::string& name;

  /// Exactly `bytes` bytes into `dst`, or a DataError naming the part (`what`) that is cut short.
  void read_exact(void* dst, std::size_t bytes, const char* what) {
    std::size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < bytes) {
      const int got = read_some(out + done, std::min<std::size_t>(bytes - done, 1u << 30));
      if (got == 0)
        throw DataError("IDX file '" + name + "' is truncated: its " + what + " needs " + std::to_string(bytes) + " bytes, found " +
                        std::to_string(done));
      done += static_cast<std::size_t>(got);
    }
  }
  int read_some(void* dst, std::size_t bytes) {
    const int got = gzread(file, dst, static_cast<unsigned>(bytes));
    if (got < 0) {
      int code = 0;
      throw DataError("cannot read IDX file '" + name + "': " + gzerror(file, &code));
    }
    return got;
  }
  /// The `declared` bytes of data, in a tensor grown in chunks as they arrive: the memory taken
  /// follows the bytes the file holds, not its header's claim (a gzip file's size says nothing of
  /// its contents').
  torch::Tensor read_data(std::uint64_t declared) {
    torch::Tensor data = torch::empty({static_cast<std::int64_t>(std::min<std::uint64_t>(declared, 1 << 24))}, torch::kUInt8);
    std::uint64_t have = 0;
    while (have < declared) {
      if (have == static_cast<std::uint64_t>(data.numel()))
        data.resize_({static_cast<std::int64_t>(std::min<std::uint64_t>(declared, 2 * have))});
      const int got = read_some(data.data_ptr<std::uint8_t>() + have,
                                std::min<std::uint64_t>(static_cast<std::uint64_t>(data.numel()) - have, 1u << 30));
      if (got == 0)
        throw DataError("IDX file '" + name + "' is truncated: its data needs " + std::to_string(declared) + " bytes, found " +
                        std::to_string(have));
      have += static_cast<std::uint64_t>(got);
    }
    return data;
  }
};

/// The element type of IDX's type code, and its size in bytes.
inline std::pair<torch::ScalarType, std::size_t> element_type(unsigned char code, const std::string& name) {
  switch (code) {
    case 0x08: return {torch::kUInt8, 1};
    case 0x09: return {torch::kInt8, 1};
    case 0x0B: return {torch::kInt16, 2};
    case 0x0C: return {torch::kInt32, 4};
    case 0x0D: return {torch::kFloat32, 4};
    case 0x0E: return {torch::kFloat64, 8};
    default: {
      char text[8];
      std::snprintf(text, sizeof text, "0x%02X", code);
      throw DataError("IDX file '" + name + "' has unknown element type " + text);
    }
  }
}

}  // namespace dettrial::detail::idx

namespace dettrial {

DETTRIAL_INLINE torch::Tensor read_idx(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw DataError("cannot read IDX file '" + name + "': " + (std::filesystem::exists(path, ec) ? "not a file" : "no such file"));
  gzFile file = gzopen(name.c_str(), "rb");
  if (!file) throw DataError("cannot open IDX file '" + name + "': " + std::strerror(errno));
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{file};
  gzbuffer(file, 1 << 20);
  detail::idx::Reader reader{file, name};

  std::array<unsigned char, 4> magic{};
  reader.read_exact(magic.data(), 4, "header");
  if (magic[0] != 0 || magic[1] != 0) throw DataError("'" + name + "' is not an IDX file (its first two bytes are not zero)");
  const auto [dtype, element_size] = detail::idx::element_type(magic[2], name);
  const int rank = magic[3];
  if (rank < 1) throw DataError("IDX file '" + name + "' declares no dimensions");
  // The header's sizes are checked before anything is allocated for them: a crafted file must not
  // choose the size of an allocation.
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  std::uint64_t count = 1, declared = 0;
  bool overflow = false;
  std::string shape;
  for (auto& d : dims) {
    std::array<unsigned char, 4> b{};
    reader.read_exact(b.data(), 4, "header");
    d = (std::int64_t{b[0]} << 24) | (std::int64_t{b[1]} << 16) | (std::int64_t{b[2]} << 8) | std::int64_t{b[3]};
    overflow = overflow || __builtin_mul_overflow(count, static_cast<std::uint64_t>(d), &count);
    shape += (shape.empty() ? "" : " x ") + std::to_string(d);
  }
  overflow = overflow || __builtin_mul_overflow(count, element_size, &declared);
  constexpr std::uint64_t largest = std::uint64_t{1} << 46;  // 64 TiB: more than any data set's file
  if (overflow || declared > largest)
    throw DataError("IDX file '" + name + "' declares " + shape + " elements: more data than an IDX file holds");
  torch::Tensor out = reader.read_data(declared).view(dtype).reshape(dims);
  if (element_size > 1) {  // IDX is big-endian
    auto* bytes = static_cast<unsigned char*>(out.data_ptr());
    for (std::size_t i = 0; i < count; ++i) std::reverse(bytes + i * element_size, bytes + (i + 1) * element_size);
  }
  return out;
}

DETTRIAL_INLINE MnistSplit load_mnist(const std::filesystem::path& dir, const std::string& split) {
  auto find = [&](const std::string& kind, const std::string& idx) {
    const std::array<std::string, 4> names = {split + "-" + kind + "-" + idx + "-ubyte.gz", split + "-" + kind + "-" + idx + "-ubyte",
                                              split + "-" + kind + "." + idx + "-ubyte.gz", split + "-" + kind + "." + idx + "-ubyte"};
    std::error_code ec;
    for (const auto& n : names)
      if (std::filesystem::is_regular_file(dir / n, ec)) return dir / n;
    throw DataError("no MNIST " + kind + " file for split '" + split + "' in '" + dir.string() + "' (looked for " + names[0] + ", " +
                    names[1] + ", " + names[2] + " and " + names[3] + ")");
  };
  MnistSplit s{read_idx(find("images", "idx3")), read_idx(find("labels", "idx1"))};
  if (s.images.dim() != 3 || s.labels.dim() != 1 || s.images.size(0) != s.labels.size(0))
    throw DataError("MNIST split '" + split + "' in '" + dir.string() + "' is inconsistent: images " + std::to_string(s.images.size(0)) +
                    " x ..., labels " + std::to_string(s.labels.size(0)));
  return s;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
