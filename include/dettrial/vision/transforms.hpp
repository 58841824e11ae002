// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image transforms with torchvision's names and semantics (its `v2` tensor semantics where
/// they differ from PIL's), composed at compile time into a pipeline that ends in the batch.
///
/// An image transform takes an Image and the record's RecordRandom and returns an Image: the 8-bit
/// steps (crops, flips, Resize, ColorJitter). ToFloat and Normalize are the output steps: they say
/// what the batch holds, and are applied as each image is written into it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "image.hpp"
#include "image_ops.hpp"

namespace dettrial::vision {

/// A height and a width; one number is a square (torchvision's `size=28`).
struct Size {
  std::int64_t height = 0;
  std::int64_t width = 0;
  Size(std::int64_t side) : height(side), width(side) {}  // NOLINT(google-explicit-constructor): torchvision's int size
  Size(std::int64_t h, std::int64_t w) : height(h), width(w) {}
};

/// What fills the border that RandomCrop pads: torchvision's `padding_mode`.
enum class PaddingMode {
  /// The `fill` value.
  constant,
  /// The edge pixel repeated.
  edge,
  /// Mirrored without repeating the edge (3 2 | 1 2 3 | 2 1).
  reflect,
  /// Mirrored with the edge repeated (2 1 | 1 2 3 | 3 2).
  symmetric,
};

/// An 8-bit step of a pipeline: `Image(Image, RecordRandom&)`.
template <class T>
concept ImageTransform = requires(const T& t, Image image, RecordRandom& random) {
  { t(std::move(image), random) } -> std::same_as<Image>;
};

}  // namespace dettrial::vision

namespace dettrial::detail {
/// The source index of position `i` (which may lie outside [0, n)) under `mode`; -1 for constant fill.
DETTRIAL_INLINE std::int64_t padded_source(std::int64_t i, std::int64_t n, vision::PaddingMode mode);
/**
 * @brief The `height` x `width` window of `image` at (`top`, `left`), which may reach outside the
 * image: what lies outside is filled as `mode` says (`fill` for constant). Crops and pads in one pass.
 */
DETTRIAL_INLINE vision::Image window(const vision::Image& image, std::int64_t top, std::int64_t left, std::int64_t height,
                                     std::int64_t width, vision::PaddingMode mode = vision::PaddingMode::constant, std::uint8_t fill = 0);
/// Bilinear resize with antialiasing through LibTorch's own kernel, as torchvision's v2 resize calls
/// it: on 8-bit samples where torchvision does (LibTorch 2.1 and later on an AVX2 CPU), on floats
/// rounded back to 8 bits otherwise.
DETTRIAL_INLINE vision::Image resize_bilinear(const vision::Image& image, std::int64_t height, std::int64_t width);
/// torchvision's `_compute_resized_output_size` for one number: the shorter side becomes `size`.
DETTRIAL_INLINE vision::Size resized_size(std::int64_t height, std::int64_t width, std::int64_t size);
/// The draw RandomResizedCrop and RandomErasing share: an area of `area` times a fraction uniform in
/// `scale`, an aspect log-uniform in `ratio`; the sides (sqrt(area * aspect), sqrt(area / aspect)),
/// rounded as Python rounds (RandomResizedCrop takes them as width and height, RandomErasing as
/// height and width).
inline std::array<std::int64_t, 2> random_rectangle(double area, const std::array<double, 2>& scale, const std::array<double, 2>& ratio,
                                                    vision::RecordRandom& random) {
  const double target = area * random.uniform(scale[0], scale[1]);
  const double aspect = std::exp(random.uniform(std::log(ratio[0]), std::log(ratio[1])));
  return {static_cast<std::int64_t>(std::nearbyint(std::sqrt(target * aspect))),
          static_cast<std::int64_t>(std::nearbyint(std::sqrt(target / aspect)))};
}
/// Python's round() of `x / 2` for an integer x: halves go to the even neighbour.
constexpr std::int64_t round_half(std::int64_t x) {
  const std::int64_t q = x >= 0 ? x / 2 : -((-x) / 2);
  if (x % 2 == 0) return q;
  // x / 2 = q + 0.5 (or q - 0.5 for negative x): Python's round goes to the even one.
  const std::int64_t other = x > 0 ? q + 1 : q - 1;
  return q % 2 == 0 ? q : other;
}
}  // namespace dettrial::detail

namespace dettrial::vision {
/// torchvision's `Resize(size)`: one number resizes the shorter side to it (keeping the aspect), two
/// give the size; bilinear with antialiasing (v2's default), through LibTorch's interpolation.
struct Resize {
  std::vector<std::int64_t> size;
  explicit Resize(std::int64_t shorter_side) : size{shorter_side} {}
  Resize(std::int64_t height, std::int64_t width) : size{height, width} {}
  Image operator()(Image image, RecordRandom& /*random*/) const {
    const Size to = size.size() == 1 ? detail::resized_size(image.height, image.width, size[0]) : Size(size[0], size[1]);
    return detail::resize_bilinear(image, to.height, to.width);
  }
};

/// torchvision's `CenterCrop(size)`: the centred window, rounded as Python rounds; an image smaller
/// than the window is padded with zeros first (v2).
struct CenterCrop {
  Size size;
  explicit CenterCrop(Size s) : size(s) {}
  Image operator()(Image image, RecordRandom& /*random*/) const {
    if (image.height == size.height && image.width == size.width) return image;
    // v2 pads symmetrically (the extra pixel on the bottom/right), then crops at the rounded centre,
    // which comes to the same window as this, measured from the unpadded image.
    const std::int64_t top =
        image.height >= size.height ? detail::round_half(image.height - size.height) : -((size.height - image.height) / 2);
    const std::int64_t left = image.width >= size.width ? detail::round_half(image.width - size.width) : -((size.width - image.width) / 2);
    return detail::window(image, top, left, size.height, size.width);
  }
  /// The window, known from the image's size alone, so a JPEG decodes only it; none when it does
  /// not fit (the image is then padded as above).
  std::optional<PixelWindow> window_in(std::int64_t height, std::int64_t width, RecordRandom& /*random*/) const {
    if (height < size.height || width < size.width) return std::nullopt;
    return PixelWindow{.top = detail::round_half(height - size.height),
                       .left = detail::round_half(width - size.width),
                       .height = size.height,
                       .width = size.width};
  }
  /// The step's work on its decoded window: none.
  Image finish_window(Image window) const { return window; }
};

/// Options of RandomCrop: torchvision's keyword arguments.
struct RandomCropOptions {
  /// Border added on every side before cropping: one number, {left/right, top/bottom}, or {left, top, right, bottom}.
  std::vector<std::int64_t> padding{};
  /// Pad an image smaller than the crop up to it (after `padding`).
  bool pad_if_needed = false;
  std::uint8_t fill = 0;
  PaddingMode padding_mode = PaddingMode::constant;
};

/// torchvision's `RandomCrop(size, padding, pad_if_needed, fill, padding_mode)`: a window at a
/// uniformly drawn position of the padded image.
struct RandomCrop {
  Size size;
  RandomCropOptions options;
  std::array<std::int64_t, 4> pad{};  // left, top, right, bottom

  explicit RandomCrop(Size s, RandomCropOptions o = {}) : size(s), options(std::move(o)) {
    const auto& p = options.padding;
    if (p.size() == 1) pad = {p[0], p[0], p[0], p[0]};
    else if (p.size() == 2) pad = {p[0], p[1], p[0], p[1]};
    else if (p.size() == 4) pad = {p[0], p[1], p[2], p[3]};
    else if (!p.empty())
      throw DataError("RandomCrop: padding takes 1, 2 or 4 numbers (all sides; left/right and top/bottom; left, top, right, bottom), not " +
                      std::to_string(p.size()));
    for (const std::int64_t side : pad)
      if (side < 0) throw DataError("RandomCrop: padding must not be negative");
  }
  Image operator()(Image image, RecordRandom& random) const {
    std::int64_t left = pad[0], top = pad[1];
    std::int64_t height = image.height + pad[1] + pad[3], width = image.width + pad[0] + pad[2];
    // pad_if_needed pads the shortfall on both sides, as torchvision does.
    if (options.pad_if_needed && height < size.height) {
      const std::int64_t short_by = size.height - height;
      top += short_by;
      height += 2 * short_by;
    }
    if (options.pad_if_needed && width < size.width) {
      const std::int64_t short_by = size.width - width;
      left += short_by;
      width += 2 * short_by;
    }
    if (height < size.height || width < size.width)
      throw DataError("RandomCrop: the crop (" + std::to_string(size.height) + "x" + std::to_string(size.width) +
                      ") is larger than the padded image (" + std::to_string(height) + "x" + std::to_string(width) +
                      "): pad more, or set pad_if_needed");
    const std::int64_t i = random.integer(0, height - size.height + 1);
    const std::int64_t j = random.integer(0, width - size.width + 1);
    return detail::window(image, i - top, j - left, size.height, size.width, options.padding_mode, options.fill);
  }
};

/// Options of RandomResizedCrop: torchvision's keyword arguments.
struct RandomResizedCropOptions {
  /// The crop's area as a fraction of the image's, drawn uniformly.
  std::array<double, 2> scale{0.08, 1.0};
  /// The crop's aspect ratio (width / height), drawn log-uniformly.
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  /// Decode a JPEG's window at 1/2, 1/4 or 1/8 scale where it stays at least `size` (libjpeg's DCT
  /// scaling): much less work for large images, but not torchvision's pixels (a smaller image
  /// resized less), so off unless asked for. Only where the window is decoded alone
  /// (ImageDataset over ImageFolder, this step first).
  bool reduced_decode = false;
};

/// torchvision's `RandomResizedCrop(size, scale, ratio)`: a window of random area and aspect (ten
/// tries, then the centred window of the clamped aspect, as torchvision falls back), resized to
/// `size` with bilinear antialiasing.
struct RandomResizedCrop {
  Size size;
  RandomResizedCropOptions options;
  explicit RandomResizedCrop(Size s, RandomResizedCropOptions o = {}) : size(s), options(o) {
    if (options.scale[0] > options.scale[1] || options.ratio[0] > options.ratio[1] || options.scale[0] < 0 || options.ratio[0] <= 0)
      throw DataError("RandomResizedCrop: scale and ratio must be (low, high) ranges, low <= high, ratio above 0");
  }
  Image operator()(Image image, RecordRandom& random) const {
    const auto [top, left, h, w] = window_of(image.height, image.width, random);
    return detail::resize_bilinear(detail::window(image, top, left, h, w), size.height, size.width);
  }
  /// The window, drawn from the image's size alone (the same draws as above), so a JPEG decodes only it.
  std::optional<PixelWindow> window_in(std::int64_t height, std::int64_t width, RecordRandom& random) const {
    const auto [top, left, h, w] = window_of(height, width, random);
    PixelWindow window{.top = top, .left = left, .height = h, .width = w};
    if (options.reduced_decode) {
      window.at_least_height = size.height;
      window.at_least_width = size.width;
    }
    return window;
  }
  /// The step's work on its decoded window: the resize.
  Image finish_window(Image window) const { return detail::resize_bilinear(window, size.height, size.width); }
  /// torchvision's `get_params`: (top, left, height, width).
  std::array<std::int64_t, 4> window_of(std::int64_t height, std::int64_t width, RecordRandom& random) const {
    const double area = static_cast<double>(height * width);
    for (int attempt = 0; attempt < 10; ++attempt) {
      const auto [w, h] = detail::random_rectangle(area, options.scale, options.ratio, random);
      if (0 < w && w <= width && 0 < h && h <= height) return {random.integer(0, height - h + 1), random.integer(0, width - w + 1), h, w};
    }
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    std::int64_t w = width, h = height;
    if (in_ratio < options.ratio[0]) h = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(w) / options.ratio[0]));
    else if (in_ratio > options.ratio[1]) w = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(h) * options.ratio[1]));
    return {(height - h) / 2, (width - w) / 2, h, w};
  }
};

/// torchvision's `RandomHorizontalFlip(p)`.
struct RandomHorizontalFlip {
  double p = 0.5;
  Image operator()(Image image, RecordRandom& random) const {
    if (draws_mirror(random)) mirror(image);
    return image;
  }
  /// The step's one draw: whether this image is mirrored (Compose's batch writer mirrors by it too).
  bool draws_mirror(RecordRandom& random) const { return random.chance(p); }
  /// The image mirrored left to right, in place.
  static void mirror(Image& image) {
    const std::int64_t c = image.channels;
    for (std::int64_t y = 0; y < image.height; ++y) {
      std::uint8_t* row = image.row(y);
      for (std::int64_t a = 0, b = image.width - 1; a < b; ++a, --b)
        for (std::int64_t k = 0; k < c; ++k) std::swap(row[a * c + k], row[b * c + k]);
    }
  }
};

/// An image through a pipeline's 8-bit steps, for the batch writer: whether it is to be mirrored left
/// to right as it is written (a last RandomHorizontalFlip left to the write, one pass over the
/// pixels fewer; the batch is the same).
struct PreparedImage {
  Image image;
  bool mirrored = false;
};

/// torchvision's `RandomVerticalFlip(p)`.
struct RandomVerticalFlip {
  double p = 0.5;
  Image operator()(Image image, RecordRandom& random) const {
    if (!random.chance(p)) return image;
    const std::int64_t stride = image.width * image.channels;
    for (std::int64_t a = 0, b = image.height - 1; a < b; ++a, --b) std::swap_ranges(image.row(a), image.row(a) + stride, image.row(b));
    return image;
  }
};

/// torchvision's `ColorJitter(brightness, contrast, saturation)`: each factor drawn uniformly from
/// [max(0, 1 - x), 1 + x] (0: left alone), applied in a random order, each as torchvision's v2
/// functional computes it (image_ops.hpp). Saturation leaves a gray image alone, as torchvision does.
struct ColorJitter {
  double brightness = 0;
  double contrast = 0;
  double saturation = 0;
  Image operator()(Image image, RecordRandom& random) const;
};

/// The output step that makes the batch float in [0, 1]: torchvision's `ToDtype(torch.float32,
/// scale=True)`, `x * (1 / 255)` in float32 (v1's ToTensor divides by 255, which can differ in the
/// last bit). Without it the batch holds the 8-bit samples.
struct ToFloat {
  static constexpr bool output_step = true;
};

/// torchvision's `Normalize(mean, std)`, per channel, on the float batch (one number: every channel).
struct Normalize {
  static constexpr bool output_step = true;
  std::vector<double> mean;
  std::vector<double> std;
  Normalize(std::vector<double> m, std::vector<double> s) : mean(std::move(m)), std(std::move(s)) {
    if (mean.empty() || mean.size() != std.size())
      throw DataError("Normalize: mean and std need the same number of values (one, or one per channel)");
    for (const double v : std)
      if (v == 0) throw DataError("Normalize: a std of 0 divides by zero");
  }
};

/// Options of RandomErasing: torchvision's keyword arguments.
struct RandomErasingOptions {
  /// The probability that a rectangle is erased.
  double p = 0.5;
  /// The rectangle's area as a fraction of the image's, drawn uniformly.
  std::array<double, 2> scale{0.02, 0.33};
  /// The rectangle's aspect ratio (height / width, as torchvision draws it), drawn log-uniformly.
  std::array<double, 2> ratio{0.3, 3.3};
  /// What the rectangle holds, in the batch's units (after Normalize, 0 is the mean): one value for
  /// every channel or one per channel; empty: standard normal values per sample (torchvision's
  /// `value="random"`).
  std::vector<double> value{0.0};
};

/**
 * @brief torchvision's `RandomErasing(p, scale, ratio, value)`, where its reference recipe puts it:
 * on the batch's image after ToFloat and Normalize (an output step, so it comes last). With `p`, a
 * rectangle of random area and aspect (ten tries to fit inside the image, else nothing) is set to
 * `value`. On an 8-bit batch (no ToFloat) the values are whole numbers in [0, 255].
 */
class RandomErasing {
 public:
  static constexpr bool output_step = true;
  DETTRIAL_INLINE explicit RandomErasing(RandomErasingOptions options = {});
  /// torchvision's `make_params`: (top, left, height, width) of the rectangle, or nullopt.
  DETTRIAL_INLINE std::optional<std::array<std::int64_t, 4>> window_of(std::int64_t channels, std::int64_t height, std::int64_t width,
                                                                       RecordRandom& random) const;
  /// Erases in the image written at `out` (C x H x W, float or 8-bit as `is_float` says).
  DETTRIAL_INLINE void erase(void* out, bool is_float, std::int64_t channels, std::int64_t height, std::int64_t width,
                             RecordRandom& random) const;
  const RandomErasingOptions& options() const { return options_; }

 private:
  RandomErasingOptions options_;
};

/// A crop whose window is known from the image's size before its pixels are (RandomResizedCrop,
/// CenterCrop): first in a pipeline, it lets a JPEG decode only that window.
template <class T>
concept WindowStep = requires(const T& t, std::int64_t side, RecordRandom& random, Image image) {
  { t.window_in(side, side, random) } -> std::same_as<std::optional<PixelWindow>>;
  { t.finish_window(std::move(image)) } -> std::same_as<Image>;
};

/// A step that says what the batch holds (ToFloat, Normalize) or acts on it (RandomErasing) rather than changing the image.
template <class T>
concept OutputStep = requires {
  { T::output_step } -> std::convertible_to<bool>;
} && T::output_step;

}  // namespace dettrial::vision

namespace dettrial::detail {
template <class... Steps>
constexpr bool output_steps_last() {
  bool seen_output = false, ok = true;
  ((seen_output = seen_output || vision::OutputStep<Steps>, ok = ok && (vision::OutputStep<Steps> || !seen_output)), ...);
  return ok;
}
template <class... Steps>
constexpr bool erasing_last() {
  bool seen_erasing = false, ok = true;
  ((ok = ok && (std::is_same_v<Steps, vision::RandomErasing> || !seen_erasing),
    seen_erasing = seen_erasing || std::is_same_v<Steps, vision::RandomErasing>),
   ...);
  return ok;
}
template <class... Steps>
constexpr bool normalize_after_to_float() {
  bool seen_float = false, ok = true;
  ((ok = ok && (!std::is_same_v<Steps, vision::Normalize> || seen_float),
    seen_float = seen_float || std::is_same_v<Steps, vision::ToFloat>),
   ...);
  return ok;
}
}  // namespace dettrial::detail

namespace dettrial::vision {
/**
 * @brief torchvision's `Compose([...])`, as a type: the 8-bit transforms in order, then the output
 * steps, which the batch writer applies as it converts each image into the batch (C x H x W).
 * @code{.cpp}
 * using namespace dettrial::vision;
 * Compose train(RandomCrop(32, {.padding = {4}}), RandomHorizontalFlip{}, ToFloat{},
 *               Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}));
 * @endcode
 */
template <class... Steps>
class Compose {
  static_assert(((ImageTransform<Steps> || OutputStep<Steps>) && ...),
                "dettrial::vision::Compose: every step must be an image transform (Image operator()(Image, RecordRandom&) const) "
                "or an output step (ToFloat, Normalize)");
  static_assert(detail::output_steps_last<Steps...>(),
                "dettrial::vision::Compose: ToFloat and Normalize come last: they convert the image as it is written into the batch, "
                "so no image transform may follow them");
  static_assert(detail::normalize_after_to_float<Steps...>(),
                "dettrial::vision::Compose: Normalize works on float images: put ToFloat before it (torchvision's ToDtype(torch.float32, "
                "scale=True))");
  static_assert(detail::erasing_last<Steps...>(),
                "dettrial::vision::Compose: RandomErasing comes last: it erases the batch's image after ToFloat and Normalize, as "
                "torchvision's reference recipe places it");

 public:
  /// Whether the batch is float (ToFloat is a step) or 8-bit.
  static constexpr bool to_float = (std::is_same_v<Steps, ToFloat> || ...);
  /// Whether a RandomErasing step acts on the written image.
  static constexpr bool erases = (std::is_same_v<Steps, RandomErasing> || ...);
  /// Whether the first step is a crop drawn before decoding (WindowStep): then apply_windowed decodes only its window.
  static constexpr bool crops_first = [] {
    if constexpr (sizeof...(Steps) == 0) return false;
    else return WindowStep<std::tuple_element_t<0, std::tuple<Steps...>>>;
  }();
  /// The number of 8-bit steps (the output steps follow them).
  static constexpr std::size_t image_steps = (std::size_t{0} + ... + std::size_t{!OutputStep<Steps>});
  /// Whether the last 8-bit step is RandomHorizontalFlip: prepare() leaves the mirroring to write().
  static constexpr bool flips_last = [] {
    if constexpr (image_steps == 0) return false;
    else return std::is_same_v<std::tuple_element_t<image_steps - 1, std::tuple<Steps...>>, RandomHorizontalFlip>;
  }();

  explicit Compose(Steps... steps) : steps_(std::move(steps)...) {
    std::apply([&](const auto&... s) { (take_normalize(s), ...); }, steps_);
    if constexpr (erases && !to_float) std::apply([](const auto&... s) { (check_byte_erasing(s), ...); }, steps_);
    // Plain x / 255 without Normalize; one mean and std serve every channel.
    if (mean_.empty())
      for (auto& channel : table_)
        for (int v = 0; v < 256; ++v) channel[static_cast<std::size_t>(v)] = static_cast<float>(v) * static_cast<float>(1.0 / 255.0);
    else if (mean_.size() == 1)
      for (std::size_t k = 1; k < table_.size(); ++k) table_[k] = table_[0];
  }

  /// The 8-bit transforms, in order.
  Image apply(Image image, RecordRandom& random) const { return mirrored(prepare(std::move(image), random)); }

  /// apply() for the batch writer: the same draws, but a last RandomHorizontalFlip is left to
  /// write(PreparedImage), which mirrors as it converts.
  PreparedImage prepare(Image image, RecordRandom& random) const { return prepare_from<0>(std::move(image), random); }

  /**
   * @brief The transforms on an image read through `load_window(WindowChooser)` (a source's
   * load_window): the first step draws its window from the image's size, the file is decoded only
   * there, and the step finishes on the window (RandomResizedCrop resizes it). The same draws and
   * the same pixels as apply() on the whole decoded image.
   */
  template <class LoadWindow>
  Image apply_windowed(LoadWindow&& load_window, RecordRandom& random) const
    requires crops_first
  {
    return mirrored(prepare_windowed(std::forward<LoadWindow>(load_window), random));
  }
  /// apply_windowed() for the batch writer, as prepare() is apply()'s.
  template <class LoadWindow>
  PreparedImage prepare_windowed(LoadWindow&& load_window, RecordRandom& random) const
    requires crops_first
  {
    const auto& first = std::get<0>(steps_);
    bool windowed = false;
    auto choose = [&](std::int64_t height, std::int64_t width) {
      const std::optional<PixelWindow> window = first.window_in(height, width, random);
      windowed = window.has_value();
      return window.value_or(PixelWindow{.height = height, .width = width});
    };
    Image image = std::forward<LoadWindow>(load_window)(WindowChooser(choose));
    image = windowed ? first.finish_window(std::move(image)) : first(std::move(image), random);
    return prepare_from<1>(std::move(image), random);
  }

  /// The batch's element type.
  torch::Dtype dtype() const { return to_float ? torch::kFloat : torch::kUInt8; }

  /**
   * @brief Writes `image` as C x H x W at `out` (floats or bytes, as dtype() says), converting and
   * normalising on the way: `(x * (1 / 255) - mean) / std` in float32, as torchvision v2's ToDtype and
   * Normalize compute it (a table of the 256 values per channel, so every sample costs one lookup).
   */
  void write(const Image& image, void* out) const
    requires(!erases)
  {
    write_pixels(image, /*mirror=*/false, out);
  }

  /// write(), then the RandomErasing steps on what was written, drawing from the record's `random`.
  void write(const Image& image, void* out, RecordRandom& random) const {
    write_pixels(image, /*mirror=*/false, out);
    erase_written(image, out, random);
  }

  /// What prepare() made, written as write() writes apply()'s image: mirrored on the way where the
  /// last flip drew so.
  void write(const PreparedImage& prepared, void* out, RecordRandom& random) const {
    write_pixels(prepared.image, prepared.mirrored, out);
    erase_written(prepared.image, out, random);
  }

 private:
  static Image mirrored(PreparedImage prepared) {
    if (prepared.mirrored) RandomHorizontalFlip::mirror(prepared.image);
    return std::move(prepared.image);
  }

  void erase_written([[maybe_unused]] const Image& image, [[maybe_unused]] void* out, [[maybe_unused]] RecordRandom& random) const {
    if constexpr (erases)
      std::apply(
          [&](const auto&... s) {
            (
                [&](const auto& step) {
                  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(step)>, RandomErasing>)
                    step.erase(out, to_float, image.channels, image.height, image.width, random);
                }(s),
                ...);
          },
          steps_);
  }

  /// The image as C x H x W at `out`, each row read right to left when `mirror`.
  void write_pixels(const Image& image, bool mirror, void* out) const {
    const std::int64_t plane = image.height * image.width, c = image.channels;
    if constexpr (to_float) {
      if (!mean_.empty() && mean_.size() != 1 && static_cast<std::int64_t>(mean_.size()) != c)
        throw DataError("Normalize: " + std::to_string(mean_.size()) + " means and stds for an image of " + std::to_string(c) +
                        " channels");
      for (std::int64_t k = 0; k < c; ++k) {
        const auto& lookup = table_[static_cast<std::size_t>(k)];
        convert_channel(image, k, mirror, static_cast<float*>(out) + k * plane, [&](std::uint8_t v) { return lookup[v]; });
      }
    } else {
      for (std::int64_t k = 0; k < c; ++k)
        convert_channel(image, k, mirror, static_cast<std::uint8_t*>(out) + k * plane, [](std::uint8_t v) { return v; });
    }
  }
  /// Channel `k` of the interleaved image into its plane at `dst`, each sample through `convert`.
  template <class T, class Convert>
  static void convert_channel(const Image& image, std::int64_t k, bool mirror, T* dst, Convert convert) {
    const std::int64_t c = image.channels, w = image.width, plane = image.height * w;
    const std::uint8_t* src = image.pixels.data() + k;
    if (!mirror) {
      for (std::int64_t i = 0; i < plane; ++i) dst[i] = convert(src[i * c]);
      return;
    }
    for (std::int64_t y = 0; y < image.height; ++y) {
      const std::uint8_t* row_end = src + (y * w + w - 1) * c;  // the row's last pixel, read first
      T* out_row = dst + y * w;
      for (std::int64_t x = 0; x < w; ++x) out_row[x] = convert(row_end[-x * c]);
    }
  }

  /// The 8-bit steps from the `First`-th on; a last RandomHorizontalFlip only draws (the writer mirrors).
  template <std::size_t First>
  PreparedImage prepare_from(Image image, RecordRandom& random) const {
    bool mirror = false;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            constexpr std::size_t index = First + I;
            using Step = std::tuple_element_t<index, std::tuple<Steps...>>;
            if constexpr (flips_last && index + 1 == image_steps) mirror = std::get<index>(steps_).draws_mirror(random);
            else if constexpr (!OutputStep<Step>) image = std::get<index>(steps_)(std::move(image), random);
          }(),
          ...);
    }(std::make_index_sequence<sizeof...(Steps) - First>{});
    return {std::move(image), mirror};
  }

  static void check_byte_erasing(const RandomErasing& erasing) {
    const auto& value = erasing.options().value;
    if (value.empty())
      throw DataError(
          "RandomErasing: random values need a float batch: put ToFloat (and Normalize) before it, as torchvision's recipe does");
    for (const double v : value)
      if (!(v >= 0 && v <= 255) || v != std::floor(v))
        throw DataError("RandomErasing: an 8-bit batch (no ToFloat) erases with whole numbers in [0, 255], not " + std::to_string(v));
  }
  template <class S>
  static void check_byte_erasing(const S& /*step*/) {}

  void take_normalize(const Normalize& n) {
    if (n.mean.size() > 4) throw DataError("Normalize: at most 4 channels");
    mean_ = n.mean;
    for (std::size_t k = 0; k < n.mean.size(); ++k) {
      for (int v = 0; v < 256; ++v) {
        // torchvision v2: image.to(float32).mul_(1 / 255), then sub_(mean), div_(std), each in float32.
        const float scaled = static_cast<float>(v) * static_cast<float>(1.0 / 255.0);
        table_[k][static_cast<std::size_t>(v)] = (scaled - static_cast<float>(n.mean[k])) / static_cast<float>(n.std[k]);
      }
    }
  }
  template <class S>
  void take_normalize(const S& /*step*/) {}

  std::tuple<Steps...> steps_;
  std::vector<double> mean_;  // Normalize's means (empty without it): how many channels the tables serve
  std::array<std::array<float, 256>, 4> table_{};
};

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstring>
#include <numeric>

#include <ATen/Version.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::int64_t padded_source(std::int64_t i, std::int64_t n, vision::PaddingMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case vision::PaddingMode::constant: return -1;
    case vision::PaddingMode::edge: return i < 0 ? 0 : n - 1;
    case vision::PaddingMode::reflect: {
      if (n == 1) return 0;
      const std::int64_t period = 2 * (n - 1);
      std::int64_t m = ((i % period) + period) % period;
      return m < n ? m : period - m;
    }
    case vision::PaddingMode::symmetric: {
      const std::int64_t period = 2 * n;
      std::int64_t m = ((i % period) + period) % period;
      return m < n ? m : period - 1 - m;
    }
  }
  return -1;
}

DETTRIAL_INLINE vision::Image window(const vision::Image& image, std::int64_t top, std::int64_t left, std::int64_t height,
                                     std::int64_t width, vision::PaddingMode mode, std::uint8_t fill) {
  const std::int64_t c = image.channels;
  const bool inside = top >= 0 && left >= 0 && top + height <= image.height && left + width <= image.width;
  if (inside) return crop(image, top, left, height, width);
  vision::Image out(height, width, c);
  std::vector<std::int64_t> columns(static_cast<std::size_t>(width));
  for (std::int64_t x = 0; x < width; ++x) columns[static_cast<std::size_t>(x)] = padded_source(left + x, image.width, mode);
  for (std::int64_t y = 0; y < height; ++y) {
    std::uint8_t* dst = out.row(y);
    const std::int64_t sy = padded_source(top + y, image.height, mode);
    if (sy < 0) {
      std::memset(dst, fill, static_cast<std::size_t>(width * c));
      continue;
    }
    const std::uint8_t* src = image.row(sy);
    for (std::int64_t x = 0; x < width; ++x) {
      const std::int64_t sx = columns[static_cast<std::size_t>(x)];
      for (std::int64_t k = 0; k < c; ++k) dst[x * c + k] = sx < 0 ? fill : src[sx * c + k];
    }
  }
  return out;
}

DETTRIAL_INLINE vision::Size resized_size(std::int64_t height, std::int64_t width, std::int64_t size) {
  const std::int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto new_longer = static_cast<std::int64_t>(static_cast<double>(size * longer) / static_cast<double>(shorter));
  return width <= height ? vision::Size(new_longer, size) : vision::Size(size, new_longer);
}

/// Whether torchvision resizes 8-bit images without converting to float: its rule
/// (`_do_native_uint8_resize_on_cpu`), LibTorch 2.1 and later (8-bit antialiased bilinear on the
/// CPU) on an ARM64 CPU or with a CPU capability of exactly "AVX2" or "AVX512".
inline bool resizes_uint8() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#if defined(__aarch64__)
  return true;
#else
  static const bool native = [] {
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX2" || capability == "AVX512";
  }();
  return native;
#endif
#else
  return false;
#endif
}

DETTRIAL_INLINE vision::Image resize_bilinear(const vision::Image& image, std::int64_t height, std::int64_t width) {
  if (height < 1 || width < 1)
    throw DataError("Resize: the size must be positive, not " + std::to_string(height) + "x" + std::to_string(width));
  if (height == image.height && width == image.width) return image;
  // The operator F::interpolate(size, bilinear, antialias, align_corners false) calls, called
  // directly: its options object made GCC 12 warn (-Wmaybe-uninitialized, in the destructor of its
  // unset scale_factor) at -O2 with one LibTorch's headers and at -O3 with the other's.
  const std::vector<std::int64_t> size{height, width};
  const auto resize = [&](const torch::Tensor& input) {
    return at::_upsample_bilinear2d_aa(input, size, /*align_corners=*/false);  // scales: none, the size given
  };
  // The image's own memory as N x C x H x W in channels-last strides: no copy in.
  const torch::Tensor nchw =
      torch::from_blob(const_cast<std::uint8_t*>(image.pixels.data()), {1, image.height, image.width, image.channels}, torch::kUInt8)
          .permute({0, 3, 1, 2});
  vision::Image out(height, width, image.channels);
  torch::Tensor resized;
  if (resizes_uint8()) {
    // The 8-bit kernel works in channels-last order whatever the input's layout (the same
    // arithmetic as torchvision's contiguous call), and returns channels-last: H x W x C memory.
    resized = resize(nchw);
  } else {
    // The float kernel, on torchvision's layout (C x H x W contiguous), rounded back to 8 bits.
    resized = resize(nchw.contiguous().to(torch::kFloat)).round_().clamp_(0, 255).to(torch::kUInt8);
  }
  const torch::Tensor hwc = resized.permute({0, 2, 3, 1}).contiguous();
  std::memcpy(out.pixels.data(), hwc.data_ptr<std::uint8_t>(), out.pixels.size());
  return out;
}

}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE Image ColorJitter::operator()(Image image, RecordRandom& random) const {
  // torchvision draws the order first (a permutation of its four adjustments), then each factor.
  std::array<int, 3> order{0, 1, 2};
  for (int i = 2; i > 0; --i) std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(random.integer(0, i + 1))]);
  const auto factor = [&](double x) { return x > 0 ? random.uniform(std::max(0.0, 1.0 - x), 1.0 + x) : -1.0; };
  const double factors[3] = {factor(brightness), factor(contrast), factor(saturation)};
  for (const int which : order) {
    const double f = factors[which];
    if (f < 0) continue;
    if (which == 0) image = functional::adjust_brightness(std::move(image), f);
    else if (which == 1) image = functional::adjust_contrast(image, f);
    else image = functional::adjust_saturation(image, f);
  }
  return image;
}

DETTRIAL_INLINE RandomErasing::RandomErasing(RandomErasingOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (!(o.p >= 0 && o.p <= 1)) throw DataError("RandomErasing: p is a probability in [0, 1], not " + std::to_string(o.p));
  if (!(o.scale[0] >= 0 && o.scale[0] <= o.scale[1] && o.scale[1] <= 1))
    throw DataError("RandomErasing: scale is a (low, high) range within [0, 1]");
  if (!(o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1])) throw DataError("RandomErasing: ratio is a (low, high) range above 0");
}

DETTRIAL_INLINE std::optional<std::array<std::int64_t, 4>> RandomErasing::window_of(std::int64_t channels, std::int64_t height,
                                                                                    std::int64_t width, RecordRandom& random) const {
  const auto& o = options_;
  if (o.value.size() > 1 && static_cast<std::int64_t>(o.value.size()) != channels)
    throw DataError("RandomErasing: " + std::to_string(o.value.size()) + " values for an image of " + std::to_string(channels) +
                    " channels (one value, or one per channel)");
  if (!random.chance(o.p)) return std::nullopt;
  const double area = static_cast<double>(height * width);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const auto [h, w] = detail::random_rectangle(area, o.scale, o.ratio, random);
    if (!(h < height && w < width)) continue;
    return std::array<std::int64_t, 4>{random.integer(0, height - h + 1), random.integer(0, width - w + 1), h, w};
  }
  return std::nullopt;  // torchvision's fallback (the whole image, no value) erases nothing
}

DETTRIAL_INLINE void RandomErasing::erase(void* out, bool is_float, std::int64_t channels, std::int64_t height, std::int64_t width,
                                          RecordRandom& random) const {
  const auto window = window_of(channels, height, width, random);
  if (!window) return;
  const auto [top, left, h, w] = *window;
  const auto& value = options_.value;
  for (std::int64_t k = 0; k < channels; ++k) {
    const double v = value.empty() ? 0.0 : value[value.size() == 1 ? 0 : static_cast<std::size_t>(k)];
    for (std::int64_t y = top; y < top + h; ++y) {
      const std::int64_t at = (k * height + y) * width + left;
      if (!is_float) {
        std::fill_n(static_cast<std::uint8_t*>(out) + at, w, static_cast<std::uint8_t>(v));
      } else if (value.empty()) {
        float* row = static_cast<float*>(out) + at;
        for (std::int64_t x = 0; x < w; ++x) row[x] = static_cast<float>(random.normal());
      } else {
        std::fill_n(static_cast<float*>(out) + at, w, static_cast<float>(v));
      }
    }
  }
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
