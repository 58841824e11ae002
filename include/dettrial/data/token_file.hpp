// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Token data for language models (opt-in: `#include <dettrial/tokens.hpp>`): a
/// file of token ids as nanoGPT's `prepare.py` writes `train.bin` and `val.bin` (uint16, or uint32
/// for vocabularies past 65,536), memory-mapped and never copied whole, and its windows of
/// `block_size + 1` tokens as (input, target) batches, in two orders: nanoGPT's random windows, or
/// epochs over non-overlapping windows shuffled as dettrial shuffles records. Either is a
/// BatchDataset for `DataLoader`: its place in the data is the loader's (exact epochs, resume,
/// ranks, elastic), so the first batch after resuming at batch 10^6 is one computation, not 10^6 reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "../vocabulary/data.hpp"

namespace dettrial {

/// The width of a token file's ids, little-endian: nanoGPT's uint16 (vocabularies up to 65,536), or uint32.
enum class TokenWidth : int { u16 = 2, u32 = 4 };

/**
 * @brief A file of token ids, memory-mapped read-only: opening a file of any size is immediate, and
 * what a batch reads is what the system pages in. Copies share the mapping (and are thread-safe:
 * nothing is written). Throws DataError naming the file when it cannot be read, is empty, or its
 * size is not a whole number of ids.
 */
class TokenFile {
 public:
  /// `vocab_size`, when given, is checked on every read: an id at or past it is a DataError naming
  /// the file and the token's place (an embedding would fail far from the cause).
  DETTRIAL_INLINE explicit TokenFile(const std::filesystem::path& path, TokenWidth width = TokenWidth::u16,
                                     std::optional<std::int64_t> vocab_size = std::nullopt);
  /// The number of tokens.
  std::int64_t size() const { return tokens_; }
  TokenWidth width() const { return width_; }
  const std::filesystem::path& path() const;
  /// Tokens [begin, begin + count) as int64 into `out` (one pass: widen and check).
  DETTRIAL_INLINE void copy(std::int64_t begin, std::int64_t count, std::int64_t* out) const;
  /// Tokens [begin, begin + count) as a 1-D int64 tensor of their own.
  DETTRIAL_INLINE torch::Tensor tokens(std::int64_t begin, std::int64_t count) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> map_;
  std::int64_t tokens_ = 0;
  TokenWidth width_ = TokenWidth::u16;
  std::optional<std::int64_t> vocab_size_;
};

/// The order of a TokenWindows' windows.
enum class WindowOrder {
  /// nanoGPT's `get_batch`: each record a window at a random offset, drawn from the record's
  /// index, the epoch and the loader's seed (never from a shared generator), so ranks draw
  /// different windows, any worker count draws the same, and a resumed run continues the draws.
  random,
  /// Non-overlapping windows, record i at token i x block_size: an epoch sees each token once
  /// (shuffle them with the loader's `shuffle`).
  consecutive,
};

struct TokenWindowsOptions {
  /// Tokens of input per window (nanoGPT's `block_size`); each window reads one more, the last target.
  std::int64_t block_size = 0;
  WindowOrder order = WindowOrder::consecutive;
  /// WindowOrder::random: how many windows make an epoch (unset: as many as consecutive windows
  /// would, about the file's size over block_size).
  std::optional<std::int64_t> windows_per_epoch{};
};

/**
 * @brief Windows of a TokenFile as (input, target) batches: both `batch x block_size` int64
 * tensors, the target the input shifted by one token, as nanoGPT's `x` and `y`.
 * @code{.cpp}
 * dettrial::TokenFile train("data/shakespeare/train.bin");
 * auto loader = dettrial::DataLoader(dettrial::TokenWindows(train, {.block_size = 64, .order = dettrial::WindowOrder::random}),
 *                                    {.batch_size = context.get_per_slot_batch_size()});
 * @endcode
 */
class TokenWindows {
 public:
  /// Throws DataError when block_size is not positive or the file has no window of block_size + 1 tokens.
  DETTRIAL_INLINE TokenWindows(TokenFile file, TokenWindowsOptions options);
  std::int64_t size() const { return windows_; }
  const TokenFile& file() const { return file_; }
  const TokenWindowsOptions& options() const { return options_; }
  /// The first token of record `record` in epoch `epoch` of a loader seeded with `seed`.
  DETTRIAL_INLINE std::int64_t offset(std::int64_t record, std::int64_t epoch, std::uint64_t seed) const;
  /// The records at `indices` (what the DataLoader calls, with the batch's epoch and seed).
  DETTRIAL_INLINE std::tuple<torch::Tensor, torch::Tensor> get_batch(const torch::Tensor& indices, const BatchOrigin& origin = {}) const;

 private:
  TokenFile file_;
  TokenWindowsOptions options_;
  std::int64_t windows_ = 0;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include "../detail/random.hpp"
#include "../error.hpp"

namespace dettrial {

/// The file's pages, mapped once and unmapped with the last copy of the TokenFile.
struct TokenFile::Mapping {
  std::filesystem::path path;
  const unsigned char* bytes = nullptr;
  std::size_t length = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (bytes) ::munmap(const_cast<unsigned char*>(bytes), length);
  }
};

DETTRIAL_INLINE TokenFile::TokenFile(const std::filesystem::path& path, TokenWidth width, std::optional<std::int64_t> vocab_size)
    : width_(width), vocab_size_(vocab_size) {
  static_assert(std::endian::native == std::endian::little, "token files are little-endian, as NumPy's tofile writes them here");
  if (width != TokenWidth::u16 && width != TokenWidth::u32) throw DataError("a token file's ids are 2 or 4 bytes (TokenWidth::u16 or u32)");
  if (vocab_size && *vocab_size <= 0) throw DataError("a token file's vocab_size must be positive, not " + std::to_string(*vocab_size));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot read token file '" + path.string() + "': " + std::strerror(errno));
  struct stat st{};
  const bool stated = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  auto map = std::make_shared<Mapping>();
  map->path = path;
  map->length = stated ? static_cast<std::size_t>(st.st_size) : 0;
  const std::size_t id_bytes = static_cast<std::size_t>(width);
  std::string problem = !stated                       ? std::string("cannot read it: ") + std::strerror(stat_errno)
                        : !S_ISREG(st.st_mode)        ? std::string("not a file")
                        : map->length == 0            ? std::string("it is empty")
                        : map->length % id_bytes != 0 ? std::to_string(map->length) + " bytes, not a whole number of " +
                                                            std::to_string(id_bytes) + "-byte token ids (written with another width?)"
                                                      : std::string();
  if (problem.empty()) {
    void* p = ::mmap(nullptr, map->length, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) problem = std::string("cannot map it: ") + std::strerror(errno);
    else map->bytes = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
  if (!problem.empty()) throw DataError("token file '" + path.string() + "': " + problem);
  tokens_ = static_cast<std::int64_t>(map->length / id_bytes);
  map_ = std::move(map);
}

DETTRIAL_INLINE const std::filesystem::path& TokenFile::path() const { return map_->path; }

DETTRIAL_INLINE void TokenFile::copy(std::int64_t begin, std::int64_t count, std::int64_t* out) const {
  if (begin < 0 || count < 0 || begin > tokens_ - count)
    throw DataError("token file '" + map_->path.string() + "': tokens [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                    ") asked for, but it has " + std::to_string(tokens_));
  std::int64_t largest = 0;
  const auto widen = [&]<class Id>(Id) {
    const unsigned char* p = map_->bytes + sizeof(Id) * static_cast<std::size_t>(begin);
    for (std::int64_t i = 0; i < count; ++i) {
      Id id;
      std::memcpy(&id, p + sizeof(Id) * static_cast<std::size_t>(i), sizeof(Id));
      out[i] = id;
      largest = std::max<std::int64_t>(largest, id);
    }
  };
  if (width_ == TokenWidth::u16) widen(std::uint16_t{});
  else widen(std::uint32_t{});
  if (vocab_size_ && largest >= *vocab_size_)
    for (std::int64_t i = 0; i < count; ++i)
      if (out[i] >= *vocab_size_)
        throw DataError("token file '" + map_->path.string() + "': token " + std::to_string(begin + i) + " is id " +
                        std::to_string(out[i]) + ", past the vocabulary of " + std::to_string(*vocab_size_));
}

DETTRIAL_INLINE torch::Tensor TokenFile::tokens(std::int64_t begin, std::int64_t count) const {
  torch::Tensor t = torch::empty({std::max<std::int64_t>(count, 0)}, torch::kLong);
  copy(begin, count, t.data_ptr<std::int64_t>());
  return t;
}

DETTRIAL_INLINE TokenWindows::TokenWindows(TokenFile file, TokenWindowsOptions options) : file_(std::move(file)), options_(options) {
  const std::string name = "TokenWindows over '" + file_.path().string() + "'";
  if (options_.block_size <= 0) throw DataError(name + ": block_size must be positive, not " + std::to_string(options_.block_size));
  if (file_.size() < options_.block_size + 1)
    throw DataError(name + ": " + std::to_string(file_.size()) +
                    " tokens, fewer than one window of block_size + 1 = " + std::to_string(options_.block_size + 1));
  const std::int64_t consecutive = (file_.size() - 1) / options_.block_size;
  if (options_.order == WindowOrder::consecutive) {
    if (options_.windows_per_epoch)
      throw DataError(name + ": windows_per_epoch is for WindowOrder::random (consecutive windows are the file's)");
    windows_ = consecutive;
  } else {
    if (options_.windows_per_epoch && *options_.windows_per_epoch <= 0)
      throw DataError(name + ": windows_per_epoch must be positive, not " + std::to_string(*options_.windows_per_epoch));
    windows_ = options_.windows_per_epoch.value_or(consecutive);
  }
}

DETTRIAL_INLINE std::int64_t TokenWindows::offset(std::int64_t record, std::int64_t epoch, std::uint64_t seed) const {
  if (options_.order == WindowOrder::consecutive) return record * options_.block_size;
  // A splitmix64 draw keyed by (seed, epoch, record) alone, as vision's RecordRandom keys a
  // record's augmentation; uniform over nanoGPT's [0, size - block_size) by Lemire's multiply-shift.
  using detail::golden_gamma, detail::mix64;
  const std::uint64_t key = mix64(seed ^ mix64(static_cast<std::uint64_t>(epoch + 1) * golden_gamma));
  const std::uint64_t draw = mix64(key + static_cast<std::uint64_t>(record + 1) * golden_gamma);
  __extension__ typedef unsigned __int128 wide;  // GCC's and Clang's; __extension__: no -Wpedantic warning
  const auto range = static_cast<wide>(file_.size() - options_.block_size);
  return static_cast<std::int64_t>((static_cast<wide>(draw) * range) >> 64);
}

DETTRIAL_INLINE std::tuple<torch::Tensor, torch::Tensor> TokenWindows::get_batch(const torch::Tensor& indices,
                                                                                 const BatchOrigin& origin) const {
  const torch::Tensor records = indices.to(torch::kLong).contiguous();
  const std::int64_t batch = records.numel(), block = options_.block_size;
  torch::Tensor input = torch::empty({batch, block}, torch::kLong), target = torch::empty({batch, block}, torch::kLong);
  const std::int64_t* r = records.data_ptr<std::int64_t>();
  std::int64_t* x = input.data_ptr<std::int64_t>();
  std::int64_t* y = target.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < batch; ++i) {
    if (r[i] < 0 || r[i] >= windows_)
      throw DataError("TokenWindows over '" + file_.path().string() + "': record " + std::to_string(r[i]) + " asked for, but it has " +
                      std::to_string(windows_));
    // The input's tokens, then the target's: the same but one token on (each batch owns both).
    const std::int64_t at = offset(r[i], origin.epoch_of(i), origin.seed);
    file_.copy(at, block, x + i * block);
    std::copy(x + i * block + 1, x + (i + 1) * block, y + i * block);
    file_.copy(at + block, 1, y + (i + 1) * block - 1);
  }
  return {std::move(input), std::move(target)};
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
