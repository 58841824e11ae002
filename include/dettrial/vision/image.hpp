// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An 8-bit image between decoding and the batch (rows of interleaved channels, as decoders
/// write them), the colour modes images are decoded to, and the per-record random draws of
/// augmentations.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../detail/random.hpp"

namespace dettrial::vision {

/// The colour mode images are converted to as they are decoded: PIL's `convert("RGB")` or `convert("L")`.
enum class ImageMode {
  /// Three channels. Grayscale is replicated; alpha is dropped (not composited), as PIL drops it.
  rgb,
  /// One channel. Colour becomes PIL's ITU-R 601-2 luma, `(19595 R + 38470 G + 7471 B + 2^15) >> 16`.
  gray,
};

/// PIL's RGB to L conversion of one pixel (ITU-R 601-2 luma in 16-bit fixed point, rounded).
constexpr std::uint8_t pil_luma(std::uint32_t r, std::uint32_t g, std::uint32_t b) {
  return static_cast<std::uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

/// The channels of an image in `mode`.
constexpr std::int64_t channels_of(ImageMode mode) { return mode == ImageMode::rgb ? 3 : 1; }

/// "RGB" or "L", PIL's names.
constexpr std::string_view name_of(ImageMode mode) { return mode == ImageMode::rgb ? "RGB" : "L"; }

/**
 * @brief An 8-bit image: `height` rows of `width` pixels of `channels` interleaved samples (HWC), the
 * layout decoders write and the cheapest to crop and flip. The batch gets it as C x H x W.
 */
struct Image {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t channels = 0;
  std::vector<std::uint8_t> pixels;

  Image() = default;
  Image(std::int64_t h, std::int64_t w, std::int64_t c) : height(h), width(w), channels(c), pixels(static_cast<std::size_t>(h * w * c)) {}

  std::uint8_t* row(std::int64_t y) { return pixels.data() + y * width * channels; }
  const std::uint8_t* row(std::int64_t y) const { return pixels.data() + y * width * channels; }
};

/// A rectangle of an image's pixels: rows [top, top + height) and columns [left, left + width).
struct PixelWindow {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  /// Where above 0: the window may come back decoded at a reduced scale (a JPEG's DCT scaling, 1/2,
  /// 1/4 or 1/8) as long as it keeps at least these many rows and columns. Not the full decode's
  /// pixels: for a step that resizes the window to that size anyway, and only when asked for.
  std::int64_t at_least_height = 0;
  std::int64_t at_least_width = 0;
};

/// What picks the window once the file's header gives the image's height and width: a reference
/// to any callable `PixelWindow(height, width)`, valid for the call it is passed to (no allocation).
class WindowChooser {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, WindowChooser> && std::is_invocable_r_v<PixelWindow, F&, std::int64_t, std::int64_t>)
  WindowChooser(F&& choose)  // NOLINT(google-explicit-constructor): a reference to the callable
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(choose)))),
        call_([](void* object, std::int64_t height, std::int64_t width) {
          return (*static_cast<std::remove_reference_t<F>*>(object))(height, width);
        }) {}
  PixelWindow operator()(std::int64_t height, std::int64_t width) const { return call_(object_, height, width); }

 private:
  void* object_;
  PixelWindow (*call_)(void*, std::int64_t, std::int64_t);
};

}  // namespace dettrial::vision

namespace dettrial::detail {
/// The `height` x `width` pixels of `image` at (`top`, `left`), which lie inside it: one copy a row.
inline vision::Image crop(const vision::Image& image, std::int64_t top, std::int64_t left, std::int64_t height, std::int64_t width) {
  vision::Image out(height, width, image.channels);
  const auto row_bytes = static_cast<std::size_t>(width * image.channels);
  for (std::int64_t y = 0; y < height; ++y) std::memcpy(out.row(y), image.row(top + y) + left * image.channels, row_bytes);
  return out;
}
}  // namespace dettrial::detail

namespace dettrial::vision {

/**
 * @brief The random draws of one record's augmentation in one epoch: a splitmix64 stream keyed by
 * (seed, epoch, record index) alone, so a record is augmented the same way whatever the worker
 * count, the rank count, the batch it falls in, or a resume. The draws are not torch's (torchvision
 * draws from torch's global generator, shared by every record); their distributions are torchvision's.
 */
class RecordRandom {
 public:
  RecordRandom(std::uint64_t seed, std::int64_t epoch, std::int64_t record) : RecordRandom(augmentation_domain, seed, epoch, record) {}
  /// The draws of a whole batch's transform (MixUp, CutMix), keyed by (seed, epoch, the batch's first
  /// record), apart from every record's own stream.
  static RecordRandom of_batch(std::uint64_t seed, std::int64_t epoch, std::int64_t first_record) {
    return RecordRandom(batch_domain, seed, epoch, first_record);
  }

  /// The next 64 random bits.
  std::uint64_t bits() {
    state_ += detail::golden_gamma;
    return detail::mix64(state_);
  }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(bits() >> 11) * 0x1.0p-53; }
  /// Uniform among the integers [lo, hi), hi > lo (Lemire's multiply-shift).
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    const auto range = static_cast<wide>(hi - lo);
    return lo + static_cast<std::int64_t>((static_cast<wide>(bits()) * range) >> 64);
  }
  /// True with probability `p`.
  bool chance(double p) { return uniform(0.0, 1.0) < p; }
  /// Standard normal (Box-Muller, one value per two draws).
  double normal() {
    const double u = 1.0 - uniform(0.0, 1.0);  // in (0, 1]: the logarithm stays finite
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * 3.14159265358979323846 * uniform(0.0, 1.0));
  }

 private:
  RecordRandom(std::uint64_t domain, std::uint64_t seed, std::int64_t epoch, std::int64_t key)
      : state_(detail::mix64(detail::mix64(detail::mix64(seed ^ domain) + static_cast<std::uint64_t>(epoch)) +
                             static_cast<std::uint64_t>(key))) {}

  __extension__ typedef unsigned __int128 wide;  // GCC's and Clang's; __extension__: no -Wpedantic warning
  // Keeps augmentation streams apart from the shuffles drawn from the same loader seed.
  static constexpr std::uint64_t augmentation_domain = 0x61756720696d6167ULL;
  static constexpr std::uint64_t batch_domain = 0x6d697820626174ULL;
  std::uint64_t state_;
};

}  // namespace dettrial::vision
