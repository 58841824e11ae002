// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CIFAR-10 and CIFAR-100 in their published binary format (the "binary version" archives:
/// cifar-10-batches-bin/, cifar-100-binary/), read whole into memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "image.hpp"

namespace dettrial::vision {

/// Which split of a CIFAR data set.
enum class CifarSplit { train, test };
/// Which CIFAR-100 label a record carries: the 100 fine classes (torchvision's `targets`) or the 20 superclasses.
enum class CifarLabel { fine, coarse };

/**
 * @brief CIFAR-10 or CIFAR-100 records: 32 x 32 RGB images with their labels, from the binary files
 * as published (CIFAR-10: data_batch_1.bin ... data_batch_5.bin and test_batch.bin, each record a
 * label byte and 3072 bytes, the red, green and blue planes; CIFAR-100: train.bin and test.bin, a
 * coarse and a fine label byte before the planes). `root` is the folder holding the files, or the
 * folder the archive was unpacked in. A missing, short or damaged file is a DataError naming it.
 * @code{.cpp}
 * auto train = dettrial::vision::Cifar::ten("data", dettrial::vision::CifarSplit::train);
 * @endcode
 */
class Cifar {
 public:
  static Cifar ten(const std::filesystem::path& root, CifarSplit split);
  static Cifar hundred(const std::filesystem::path& root, CifarSplit split, CifarLabel label = CifarLabel::fine);

  std::int64_t size() const { return static_cast<std::int64_t>(labels_.size()); }
  std::int64_t label(std::int64_t index) const { return labels_[static_cast<std::size_t>(index)]; }
  /// The classes' count: 10, 100 or 20.
  std::int64_t classes() const { return classes_; }
  /// Record `index` as an Image in `mode` (thread-safe).
  DETTRIAL_INLINE Image load(std::int64_t index, ImageMode mode) const;
  std::string name(std::int64_t index) const { return "CIFAR record " + std::to_string(index); }

 private:
  DETTRIAL_INLINE void read(const std::filesystem::path& file, bool two_labels, CifarLabel which);
  static constexpr std::int64_t side = 32;
  static constexpr std::int64_t plane = side * side;
  std::vector<std::uint8_t> planes_;  // records x 3 x 32 x 32, as in the files
  std::vector<std::int64_t> labels_;
  std::int64_t classes_ = 10;
};

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fstream>
#include <iterator>

namespace dettrial::detail {
/// `root/name`, or `root/folder/name` when the archive's folder is still there.
inline std::filesystem::path cifar_file(const std::filesystem::path& root, const char* folder, const std::string& name) {
  std::error_code ec;
  if (std::filesystem::exists(root / name, ec)) return root / name;
  if (std::filesystem::exists(root / folder / name, ec)) return root / folder / name;
  throw DataError("CIFAR: found no '" + name + "' in '" + root.string() + "' or '" + (root / folder).string() +
                  "' (the binary version of the data set, as published)");
}
}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE void Cifar::read(const std::filesystem::path& file, bool two_labels, CifarLabel which) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::int64_t record = (two_labels ? 2 : 1) + 3 * plane;
  const auto total = static_cast<std::int64_t>(bytes.size());
  if (!in.eof() && in.fail()) throw DataError("CIFAR: cannot read '" + file.string() + "'");
  if (total == 0 || total % record != 0)
    throw DataError("CIFAR: '" + file.string() + "' has " + std::to_string(total) + " bytes, not a whole number of " +
                    std::to_string(record) + "-byte records (truncated, or not this data set's binary version)");
  const std::int64_t records = total / record;
  planes_.reserve(planes_.size() + static_cast<std::size_t>(records * 3 * plane));
  for (std::int64_t r = 0; r < records; ++r) {
    const std::uint8_t* at = bytes.data() + r * record;
    const std::int64_t label = two_labels ? (which == CifarLabel::coarse ? at[0] : at[1]) : at[0];
    if (label >= classes_)
      throw DataError("CIFAR: record " + std::to_string(r) + " of '" + file.string() + "' has label " + std::to_string(label) + " of " +
                      std::to_string(classes_) + " classes (a damaged file, or another data set's)");
    labels_.push_back(label);
    planes_.insert(planes_.end(), at + (two_labels ? 2 : 1), at + record);
  }
}

DETTRIAL_INLINE Cifar Cifar::ten(const std::filesystem::path& root, CifarSplit split) {
  Cifar data;
  data.classes_ = 10;
  if (split == CifarSplit::train)
    for (int b = 1; b <= 5; ++b)
      data.read(detail::cifar_file(root, "cifar-10-batches-bin", "data_batch_" + std::to_string(b) + ".bin"), false, CifarLabel::fine);
  else data.read(detail::cifar_file(root, "cifar-10-batches-bin", "test_batch.bin"), false, CifarLabel::fine);
  return data;
}

DETTRIAL_INLINE Cifar Cifar::hundred(const std::filesystem::path& root, CifarSplit split, CifarLabel label) {
  Cifar data;
  data.classes_ = label == CifarLabel::fine ? 100 : 20;
  data.read(detail::cifar_file(root, "cifar-100-binary", split == CifarSplit::train ? "train.bin" : "test.bin"), true, label);
  return data;
}

DETTRIAL_INLINE Image Cifar::load(std::int64_t index, ImageMode mode) const {
  const std::uint8_t* planes = planes_.data() + index * 3 * plane;
  Image image(side, side, channels_of(mode));
  for (std::int64_t i = 0; i < plane; ++i) {
    const std::uint32_t r = planes[i], g = planes[plane + i], b = planes[2 * plane + i];
    if (mode == ImageMode::rgb) {
      image.pixels[static_cast<std::size_t>(3 * i)] = static_cast<std::uint8_t>(r);
      image.pixels[static_cast<std::size_t>(3 * i + 1)] = static_cast<std::uint8_t>(g);
      image.pixels[static_cast<std::size_t>(3 * i + 2)] = static_cast<std::uint8_t>(b);
    } else {
      image.pixels[static_cast<std::size_t>(i)] = pil_luma(r, g, b);
    }
  }
  return image;
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
