// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
#include "dettrial.hpp"
// ---- begin dettrial/vision.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image data for dettrial: JPEG and PNG decoding, torchvision's ImageFolder and CIFAR
/// readers, torchvision's transforms and ResNets, and the ImageDataset that a DataLoader decodes and augments
/// in parallel, straight into batch tensors. Opt-in, next to <dettrial/dettrial.hpp>.


// ---- begin dettrial/vision/auto_augment.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's automatic augmentation policies on 8-bit images: AutoAugment (its ImageNet,
/// CIFAR-10 and SVHN policies), RandAugment and TrivialAugmentWide, with torchvision's operations
/// (image_ops.hpp, bit for bit) and magnitude tables (computed with LibTorch's linspace, as
/// torchvision computes them); the draws come from the record's RecordRandom, so a record is
/// augmented the same way on any worker, rank count or resume.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

// ---- begin dettrial/vision/image.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An 8-bit image between decoding and the batch (rows of interleaved channels, as decoders
/// write them), the colour modes images are decoded to, and the per-record random draws of
/// augmentations.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>


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
// ---- end dettrial/vision/image.hpp
// ---- begin dettrial/vision/image_ops.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The image operations of torchvision's augmentation policies, on 8-bit images, as
/// `torchvision.transforms.v2.functional` computes them on uint8 tensors: the same arithmetic in the
/// same order (through LibTorch's own kernels where torchvision blends, convolves or samples a grid,
/// so float rounding and fused multiply-adds come out as torchvision's), bit for bit on the same
/// LibTorch.
///
/// Each takes an Image and returns one; the policies (auto_augment.hpp) call them with the
/// magnitudes torchvision's tables give, and a user may call them alone.

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>


namespace dettrial::vision {

/// How a geometric operation samples the source: torchvision's `InterpolationMode.NEAREST` (the
/// policies' default) or `BILINEAR` (what torchvision's reference recipe passes them).
enum class Interpolation {
  nearest,
  bilinear,
};

/// What a geometric operation puts where no source pixel lands: empty is torchvision's `fill=None`
/// (zeros), one value fills every channel, or one value per channel (0 to 255).
using Fill = std::vector<double>;

/// The arguments of torchvision's `affine`: a rotation in degrees (counter-clockwise), a translation
/// in pixels, a scale, shears in degrees along x and y, about `center` (pixels from the top-left
/// corner; the image's centre when unset).
struct AffineParams {
  double angle = 0.0;
  std::array<double, 2> translate{0.0, 0.0};
  double scale = 1.0;
  std::array<double, 2> shear{0.0, 0.0};
  std::optional<std::array<double, 2>> center{};
};

}  // namespace dettrial::vision

namespace dettrial::vision::functional {

/// torchvision's `adjust_brightness`: each sample times `factor`, clamped, truncated.
DETTRIAL_INLINE Image adjust_brightness(Image image, double factor);
/// torchvision's `adjust_saturation`: a blend with the (floored) gray image; gray images unchanged.
DETTRIAL_INLINE Image adjust_saturation(const Image& image, double factor);
/// torchvision's `adjust_contrast`: a blend with the mean of the (floored) gray image.
DETTRIAL_INLINE Image adjust_contrast(const Image& image, double factor);
/// torchvision's `adjust_sharpness`: a blend with the image smoothed by its 3x3 kernel (1s around,
/// 5 in the middle, over 13), the border left as it is.
DETTRIAL_INLINE Image adjust_sharpness(const Image& image, double factor);
/// torchvision's `posterize`: the `bits` high bits of each sample kept.
DETTRIAL_INLINE Image posterize(Image image, int bits);
/// torchvision's `solarize`: the samples at or above `threshold` inverted.
DETTRIAL_INLINE Image solarize(Image image, double threshold);
/// torchvision's `autocontrast`: each channel stretched to [0, 255].
DETTRIAL_INLINE Image autocontrast(Image image);
/// torchvision's `equalize`: each channel's histogram equalised as PIL's `ImageOps.equalize` does.
DETTRIAL_INLINE Image equalize(Image image);
/// torchvision's `invert`: 255 minus each sample.
DETTRIAL_INLINE Image invert(Image image);
/// torchvision's `affine` (tensor path): the inverse map sampled on a grid, the image's size kept.
DETTRIAL_INLINE Image affine(const Image& image, const AffineParams& params, Interpolation interpolation = Interpolation::nearest,
                             const Fill& fill = {});
/// torchvision's `rotate` (expand false, about the centre): `angle` degrees counter-clockwise.
DETTRIAL_INLINE Image rotate(const Image& image, double angle, Interpolation interpolation = Interpolation::nearest, const Fill& fill = {});

}  // namespace dettrial::vision::functional

namespace dettrial::detail {
/// The image as torchvision holds it: a contiguous C x H x W uint8 tensor (a copy).
DETTRIAL_INLINE torch::Tensor to_chw(const vision::Image& image);
/// A C x H x W uint8 tensor back into an Image.
DETTRIAL_INLINE vision::Image from_chw(const torch::Tensor& chw);
/// torchvision's `_get_inverse_affine_matrix` (inverted): the 2 x 3 map from output to source pixels.
DETTRIAL_INLINE std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle, std::array<double, 2> translate,
                                                            double scale, std::array<double, 2> shear);
/// Python's `x % 360` for a float: in [0, 360), -0.0 becoming 0.0.
DETTRIAL_INLINE double degrees_mod_360(double x);
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>


namespace dettrial::detail {

DETTRIAL_INLINE torch::Tensor to_chw(const vision::Image& image) {
  return torch::from_blob(const_cast<std::uint8_t*>(image.pixels.data()), {image.height, image.width, image.channels}, torch::kUInt8)
      .permute({2, 0, 1})
      .contiguous();
}

DETTRIAL_INLINE vision::Image from_chw(const torch::Tensor& chw) {
  vision::Image out(chw.size(1), chw.size(2), chw.size(0));
  const torch::Tensor hwc = chw.permute({1, 2, 0}).contiguous();
  std::memcpy(out.pixels.data(), hwc.data_ptr<std::uint8_t>(), out.pixels.size());
  return out;
}

/// Checks an operation's image: 1 or 3 channels, as torchvision's kernels require.
inline void check_channels(const vision::Image& image, const char* op) {
  if (image.channels != 1 && image.channels != 3)
    throw DataError(std::string(op) + ": images of 1 or 3 channels, not " + std::to_string(image.channels));
}

/// torchvision's `_rgb_to_grayscale_image` without casting back, floored as its 8-bit paths floor it: 1 x H x W float.
inline torch::Tensor floored_gray(const torch::Tensor& chw) {
  const std::vector<torch::Tensor> rgb = chw.unbind(0);
  return rgb[0].mul(0.2989).add_(rgb[1], 0.587).add_(rgb[2], 0.114).unsqueeze(0).floor_();
}

/// torchvision's `_blend` of an 8-bit image with a float one: `x * ratio + other * (1 - ratio)`,
/// clamped, truncated (LibTorch's add with alpha: a fused multiply-add where its kernel fuses).
inline torch::Tensor blend(const torch::Tensor& chw, const torch::Tensor& other, double ratio) {
  return chw.mul(ratio).add_(other, 1.0 - ratio).clamp_(0, 255).to(torch::kUInt8);
}

DETTRIAL_INLINE std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle, std::array<double, 2> translate,
                                                            double scale, std::array<double, 2> shear) {
  // The same operations in the same order as torchvision's Python (math.radians is x * (pi / 180)),
  // so the doubles, and the float32 grid made from them, are its own.
  constexpr double to_radians = std::numbers::pi / 180.0;
  const double rot = angle * to_radians, sx = shear[0] * to_radians, sy = shear[1] * to_radians;
  const double cos_sy = std::cos(sy), tan_sx = std::tan(sx), rot_minus_sy = rot - sy;
  const double cx_plus_tx = center[0] + translate[0], cy_plus_ty = center[1] + translate[1];
  const double a = std::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + std::sin(rot));
  const double c = std::sin(rot_minus_sy) / cos_sy;
  const double d = std::cos(rot) - c * tan_sx;
  std::array<double, 6> m{d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += center[0] - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += center[1] - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

DETTRIAL_INLINE double degrees_mod_360(double x) {
  double r = std::fmod(x, 360.0);
  if (r != 0.0 && r < 0.0) r += 360.0;
  return r == 0.0 ? 0.0 : r;
}

/// torchvision's `_affine_grid`: the output pixels' centres mapped through `matrix` and normalised
/// by the source's size (1 x oh x ow x 2, for grid_sample without corner alignment).
inline torch::Tensor affine_grid(const std::array<double, 6>& matrix, std::int64_t w, std::int64_t h, std::int64_t ow, std::int64_t oh) {
  std::vector<float> entries(matrix.begin(), matrix.end());
  const torch::Tensor theta = torch::tensor(entries, torch::kFloat).reshape({1, 2, 3});
  torch::Tensor base = torch::empty({1, oh, ow, 3}, torch::kFloat);
  base.select(-1, 0).copy_(torch::linspace((1.0 - static_cast<double>(ow)) * 0.5, (static_cast<double>(ow) - 1.0) * 0.5, ow));
  base.select(-1, 1).copy_(
      torch::linspace((1.0 - static_cast<double>(oh)) * 0.5, (static_cast<double>(oh) - 1.0) * 0.5, oh).unsqueeze_(-1));
  base.select(-1, 2).fill_(1);
  const std::vector<float> half{static_cast<float>(0.5 * static_cast<double>(w)), static_cast<float>(0.5 * static_cast<double>(h))};
  const torch::Tensor rescaled = theta.transpose(1, 2).div_(torch::tensor(half, torch::kFloat));
  return base.view({1, oh * ow, 3}).bmm(rescaled).view({1, oh, ow, 2});
}

/// torchvision's `_apply_grid_transform` on an 8-bit image: sampled in float32 with zeros outside,
/// `fill` through a mask channel as torchvision adds it, rounded back to 8 bits.
inline vision::Image grid_transform(const vision::Image& image, const torch::Tensor& grid, vision::Interpolation interpolation,
                                    const vision::Fill& fill) {
  const std::int64_t c = image.channels;
  torch::Tensor input = to_chw(image).unsqueeze(0).to(torch::kFloat);
  if (!fill.empty()) input = torch::cat({input, torch::ones({1, 1, image.height, image.width}, torch::kFloat)}, 1);
  const std::int64_t mode = interpolation == vision::Interpolation::nearest ? 1 : 0;  // grid_sample's enum: 0 bilinear, 1 nearest
  torch::Tensor sampled = at::grid_sampler(input, grid, mode, /*padding_mode=zeros*/ 0, /*align_corners=*/false);
  if (!fill.empty()) {
    torch::Tensor mask = sampled.narrow(1, c, 1);  // torchvision's tensor_split at the last channel
    sampled = sampled.narrow(1, 0, c);
    mask = mask.expand_as(sampled);
    const std::vector<float> values(fill.begin(), fill.end());
    const torch::Tensor fill_image = torch::tensor(values, torch::kFloat).view({1, -1, 1, 1});
    if (interpolation == vision::Interpolation::nearest) sampled = torch::where(mask < 0.5, fill_image.expand_as(sampled), sampled);
    else sampled = sampled.sub_(fill_image).mul_(mask).add_(fill_image);
  }
  return from_chw(sampled.round_().to(torch::kUInt8).squeeze(0));
}

inline void check_fill(const vision::Image& image, const vision::Fill& fill, const char* op) {
  if (!fill.empty() && fill.size() != 1 && static_cast<std::int64_t>(fill.size()) != image.channels)
    throw DataError(std::string(op) + ": fill takes one value or one per channel (" + std::to_string(image.channels) + "), not " +
                    std::to_string(fill.size()));
  for (const double v : fill)
    if (!(v >= 0.0 && v <= 255.0)) throw DataError(std::string(op) + ": fill values lie in [0, 255], not " + std::to_string(v));
}

}  // namespace dettrial::detail

namespace dettrial::vision::functional {

DETTRIAL_INLINE Image adjust_brightness(Image image, double factor) {
  if (!(factor >= 0)) throw DataError("adjust_brightness: the factor must not be negative, not " + std::to_string(factor));
  // uint8 times a Python float is float32 in torch: the factor rounded to float, one product.
  const auto f = static_cast<float>(factor);
  for (std::uint8_t& v : image.pixels) v = static_cast<std::uint8_t>(std::clamp(static_cast<float>(v) * f, 0.0f, 255.0f));
  return image;
}

DETTRIAL_INLINE Image adjust_saturation(const Image& image, double factor) {
  if (!(factor >= 0)) throw DataError("adjust_saturation: the factor must not be negative, not " + std::to_string(factor));
  detail::check_channels(image, "adjust_saturation");
  if (image.channels == 1) return image;  // as PIL, and torchvision after it
  const torch::Tensor chw = detail::to_chw(image);
  return detail::from_chw(detail::blend(chw, detail::floored_gray(chw), factor));
}

DETTRIAL_INLINE Image adjust_contrast(const Image& image, double factor) {
  if (!(factor >= 0)) throw DataError("adjust_contrast: the factor must not be negative, not " + std::to_string(factor));
  detail::check_channels(image, "adjust_contrast");
  const torch::Tensor chw = detail::to_chw(image);
  const torch::Tensor gray = image.channels == 3 ? detail::floored_gray(chw) : chw.to(torch::kFloat);
  return detail::from_chw(detail::blend(chw, gray.mean({-3, -2, -1}, /*keepdim=*/true), factor));
}

DETTRIAL_INLINE Image adjust_sharpness(const Image& image, double factor) {
  if (!(factor >= 0)) throw DataError("adjust_sharpness: the factor must not be negative, not " + std::to_string(factor));
  detail::check_channels(image, "adjust_sharpness");
  if (image.height <= 2 || image.width <= 2) return image;
  const float a = static_cast<float>(1.0 / 13.0), b = static_cast<float>(5.0 / 13.0);
  const torch::Tensor kernel = torch::tensor({a, a, a, a, b, a, a, a, a}, torch::kFloat).view({3, 3}).expand({image.channels, 1, 3, 3});
  torch::Tensor output = detail::to_chw(image).to(torch::kFloat);
  // torchvision convolves the unbatched C x H x W image, one group per channel, rounds the smoothed
  // image, and blends it into the interior in place: x + (1 - factor) * (smoothed - x).
  const std::vector<std::int64_t> ones{1, 1}, zeros{0, 0};  // stride, padding, dilation
  torch::Tensor smoothed = torch::conv2d(output, kernel, /*bias=*/torch::Tensor(), ones, zeros, ones, image.channels).round_();
  torch::Tensor interior = output.slice(-2, 1, -1).slice(-1, 1, -1);
  interior.add_(smoothed.sub_(interior), 1.0 - factor);
  return detail::from_chw(output.clamp_(0, 255).to(torch::kUInt8));
}

DETTRIAL_INLINE Image posterize(Image image, int bits) {
  if (bits < 0 || bits > 8) throw DataError("posterize: bits lie in [0, 8], not " + std::to_string(bits));
  if (bits == 8) return image;
  const auto mask = static_cast<std::uint8_t>(((1u << bits) - 1u) << (8 - bits));
  for (std::uint8_t& v : image.pixels) v &= mask;
  return image;
}

DETTRIAL_INLINE Image solarize(Image image, double threshold) {
  if (threshold > 255.0) throw DataError("solarize: the threshold is at most 255, not " + std::to_string(threshold));
  // torch compares uint8 with a Python float in float32: the threshold rounded to float.
  const auto t = static_cast<float>(threshold);
  for (std::uint8_t& v : image.pixels)
    if (static_cast<float>(v) >= t) v = static_cast<std::uint8_t>(255 - v);
  return image;
}

DETTRIAL_INLINE Image autocontrast(Image image) {
  detail::check_channels(image, "autocontrast");
  const std::int64_t c = image.channels, n = image.height * image.width;
  if (n == 0) return image;
  for (std::int64_t k = 0; k < c; ++k) {
    std::uint8_t lo = 255, hi = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, image.pixels[static_cast<std::size_t>(i * c + k)]);
      hi = std::max(hi, image.pixels[static_cast<std::size_t>(i * c + k)]);
    }
    // In float32 as torchvision: (max - min) * (1 / 255) is the step, a flat channel left as it is.
    float minimum = static_cast<float>(lo), inv_scale = (static_cast<float>(hi) - minimum) * static_cast<float>(1.0 / 255.0);
    if (hi == lo) minimum = 0.0f, inv_scale = 1.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint8_t& v = image.pixels[static_cast<std::size_t>(i * c + k)];
      v = static_cast<std::uint8_t>(std::clamp((static_cast<float>(v) - minimum) / inv_scale, 0.0f, 255.0f));
    }
  }
  return image;
}

DETTRIAL_INLINE Image equalize(Image image) {
  const std::int64_t c = image.channels, n = image.height * image.width;
  for (std::int64_t k = 0; k < c; ++k) {
    std::array<std::int64_t, 256> histogram{};
    for (std::int64_t i = 0; i < n; ++i) ++histogram[image.pixels[static_cast<std::size_t>(i * c + k)]];
    // PIL's scheme, as torchvision follows it: the pixels but those of the largest value present,
    // over 255, is the step; a channel with step 0 (one value, or nearly) stays as it is.
    std::size_t largest = 255;
    while (largest > 0 && histogram[largest] == 0) --largest;
    const std::int64_t step = (n - histogram[largest]) / 255;
    if (step == 0) continue;
    std::array<std::uint8_t, 256> lut{};
    std::int64_t cumulative = 0;
    for (std::size_t v = 1; v < 256; ++v) {
      cumulative += histogram[v - 1];
      lut[v] = static_cast<std::uint8_t>(std::min<std::int64_t>((cumulative + step / 2) / step, 255));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint8_t& v = image.pixels[static_cast<std::size_t>(i * c + k)];
      v = lut[v];
    }
  }
  return image;
}

DETTRIAL_INLINE Image invert(Image image) {
  for (std::uint8_t& v : image.pixels) v = static_cast<std::uint8_t>(255 - v);
  return image;
}

DETTRIAL_INLINE Image affine(const Image& image, const AffineParams& params, Interpolation interpolation, const Fill& fill) {
  if (!(params.scale > 0)) throw DataError("affine: the scale must be positive, not " + std::to_string(params.scale));
  detail::check_fill(image, fill, "affine");
  const auto w = static_cast<double>(image.width), h = static_cast<double>(image.height);
  std::array<double, 2> center{0.0, 0.0};  // relative to the image's centre, as torchvision's tensor path takes it
  if (params.center) center = {(*params.center)[0] - w * 0.5, (*params.center)[1] - h * 0.5};
  const auto matrix = detail::inverse_affine_matrix(center, params.angle, params.translate, params.scale, params.shear);
  return detail::grid_transform(image, detail::affine_grid(matrix, image.width, image.height, image.width, image.height), interpolation,
                                fill);
}

DETTRIAL_INLINE Image rotate(const Image& image, double angle, Interpolation interpolation, const Fill& fill) {
  detail::check_fill(image, fill, "rotate");
  angle = detail::degrees_mod_360(angle);
  // torchvision's exact paths: no turn, a half turn, and quarter turns of a square image.
  if (angle == 0.0) return image;
  if (angle == 180.0) return detail::from_chw(torch::rot90(detail::to_chw(image), 2, {-2, -1}).contiguous());
  if (image.height == image.width && (angle == 90.0 || angle == 270.0))
    return detail::from_chw(torch::rot90(detail::to_chw(image), angle == 90.0 ? 1 : 3, {-2, -1}).contiguous());
  // affine and rotate turn opposite ways in torchvision: rotate passes -angle.
  const auto matrix = detail::inverse_affine_matrix({0.0, 0.0}, -angle, {0.0, 0.0}, 1.0, {0.0, 0.0});
  return detail::grid_transform(image, detail::affine_grid(matrix, image.width, image.height, image.width, image.height), interpolation,
                                fill);
}

}  // namespace dettrial::vision::functional

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/image_ops.hpp

namespace dettrial::vision {

/// The operations of torchvision's augmentation spaces, by its names ("ShearX", "Color", ...).
enum class AugmentOp {
  identity,
  shear_x,
  shear_y,
  translate_x,
  translate_y,
  rotate,
  brightness,
  color,
  contrast,
  sharpness,
  posterize,
  solarize,
  auto_contrast,
  equalize,
  invert,
};

/// torchvision's name of `op`: "Identity", "ShearX", ..., "Invert".
DETTRIAL_INLINE std::string_view name_of(AugmentOp op);

/// Where an operation's magnitude comes from: AutoAugment's and RandAugment's table, or
/// TrivialAugmentWide's wider one.
enum class MagnitudeSpace {
  auto_augment,
  trivial_augment_wide,
};

/**
 * @brief Magnitude `bin` of `num_bins` for `op` in `space` on an image of `height` x `width`, as
 * torchvision's `_AUGMENTATION_SPACE` tables give it (float32 values, as its linspace makes them);
 * nullopt for the operations without one (Identity, AutoContrast, Equalize, Invert).
 */
DETTRIAL_INLINE std::optional<double> augment_magnitude(MagnitudeSpace space, AugmentOp op, std::int64_t bin, std::int64_t num_bins,
                                                        std::int64_t height, std::int64_t width);
/// Whether `op`'s magnitude is negated half of the time (the geometric and colour operations).
DETTRIAL_INLINE bool signed_magnitude(AugmentOp op);

/// The options every policy shares: how geometric operations sample and what they fill with.
struct AugmentOptions {
  /// torchvision's default is nearest; its reference recipe passes bilinear.
  Interpolation interpolation = Interpolation::nearest;
  /// Empty: zeros (torchvision's fill=None).
  Fill fill{};
};

/**
 * @brief torchvision's `_apply_image_or_video_transform`: `op` at `magnitude` (a shear's magnitude
 * is its tangent, about the top-left corner; a translation truncated to whole pixels; colour
 * factors `1 + magnitude`; Posterize's bits; Solarize's threshold `255 * magnitude`).
 */
DETTRIAL_INLINE Image apply_augment_op(Image image, AugmentOp op, double magnitude, const AugmentOptions& options = {});

/// The policies of torchvision's `AutoAugmentPolicy`.
enum class AutoAugmentPolicy {
  imagenet,
  cifar10,
  svhn,
};

/// torchvision's `AutoAugment(policy)`: one of the policy's 25 pairs of (operation, probability,
/// magnitude bin of 10), each applied with its probability.
class AutoAugment {
 public:
  explicit AutoAugment(AutoAugmentPolicy policy = AutoAugmentPolicy::imagenet, AugmentOptions options = {})
      : policy_(policy), options_(std::move(options)) {}
  DETTRIAL_INLINE Image operator()(Image image, RecordRandom& random) const;
  AutoAugmentPolicy policy() const { return policy_; }

 private:
  AutoAugmentPolicy policy_;
  AugmentOptions options_;
};

/// Options of RandAugment: torchvision's keyword arguments.
struct RandAugmentOptions {
  int num_ops = 2;
  /// The bin of `num_magnitude_bins` every operation uses.
  int magnitude = 9;
  int num_magnitude_bins = 31;
  Interpolation interpolation = Interpolation::nearest;
  Fill fill{};
};

/// torchvision's `RandAugment(num_ops, magnitude, num_magnitude_bins)`: `num_ops` operations drawn
/// uniformly from its 14, each at the one magnitude.
class RandAugment {
 public:
  DETTRIAL_INLINE explicit RandAugment(RandAugmentOptions options = {});
  DETTRIAL_INLINE Image operator()(Image image, RecordRandom& random) const;

 private:
  RandAugmentOptions options_;
};

/// Options of TrivialAugmentWide: torchvision's keyword arguments.
struct TrivialAugmentWideOptions {
  int num_magnitude_bins = 31;
  Interpolation interpolation = Interpolation::nearest;
  Fill fill{};
};

/// torchvision's `TrivialAugmentWide(num_magnitude_bins)`: one operation of its 14 and one
/// magnitude bin, both drawn uniformly, from its wider magnitude table.
class TrivialAugmentWide {
 public:
  DETTRIAL_INLINE explicit TrivialAugmentWide(TrivialAugmentWideOptions options = {});
  DETTRIAL_INLINE Image operator()(Image image, RecordRandom& random) const;

 private:
  TrivialAugmentWideOptions options_;
};

/**
 * @brief One of the policies, or none, chosen when the trial starts: what torchvision's reference
 * classification recipe picks with `--auto-augment` ("ra", "ta_wide", "imagenet", "cifar10",
 * "svhn"; empty or "none" for none), so one pipeline type serves every choice a config makes.
 */
class AnyAutoAugment {
 public:
  AnyAutoAugment() = default;
  template <class Policy>
    requires(std::is_same_v<Policy, AutoAugment> || std::is_same_v<Policy, RandAugment> || std::is_same_v<Policy, TrivialAugmentWide>)
  AnyAutoAugment(Policy policy) : policy_(std::move(policy)) {}  // NOLINT(google-explicit-constructor): any policy is one
  /// The recipe's names; RandAugment takes `ra_magnitude`. An unknown name is a ConfigError that lists the known ones.
  DETTRIAL_INLINE static AnyAutoAugment from_name(std::string_view name, AugmentOptions options = {}, int ra_magnitude = 9);
  Image operator()(Image image, RecordRandom& random) const {
    return std::visit(
        [&](const auto& policy) -> Image {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(policy)>, std::monostate>) return image;
          else return policy(std::move(image), random);
        },
        policy_);
  }
  /// Whether a policy is chosen.
  bool active() const { return policy_.index() != 0; }

 private:
  std::variant<std::monostate, AutoAugment, RandAugment, TrivialAugmentWide> policy_{};
};

}  // namespace dettrial::vision

namespace dettrial::detail::augment {

/// One step of an AutoAugment policy: the operation, its probability, its magnitude bin (-1: none).
struct PolicyStep {
  vision::AugmentOp op;
  double probability;
  int bin;
};
using PolicyPair = std::array<PolicyStep, 2>;
using Policy = std::array<PolicyPair, 25>;

using O = vision::AugmentOp;
// The policies of the AutoAugment paper (Cubuk et al., 2018), in torchvision's order: the order is
// part of the draw (the pair is drawn by index).
inline constexpr Policy imagenet{{
    {{{O::posterize, 0.4, 8}, {O::rotate, 0.6, 9}}},    {{{O::solarize, 0.6, 5}, {O::auto_contrast, 0.6, -1}}},
    {{{O::equalize, 0.8, -1}, {O::equalize, 0.6, -1}}}, {{{O::posterize, 0.6, 7}, {O::posterize, 0.6, 6}}},
    {{{O::equalize, 0.4, -1}, {O::solarize, 0.2, 4}}},  {{{O::equalize, 0.4, -1}, {O::rotate, 0.8, 8}}},
    {{{O::solarize, 0.6, 3}, {O::equalize, 0.6, -1}}},  {{{O::posterize, 0.8, 5}, {O::equalize, 1.0, -1}}},
    {{{O::rotate, 0.2, 3}, {O::solarize, 0.6, 8}}},     {{{O::equalize, 0.6, -1}, {O::posterize, 0.4, 6}}},
    {{{O::rotate, 0.8, 8}, {O::color, 0.4, 0}}},        {{{O::rotate, 0.4, 9}, {O::equalize, 0.6, -1}}},
    {{{O::equalize, 0.0, -1}, {O::equalize, 0.8, -1}}}, {{{O::invert, 0.6, -1}, {O::equalize, 1.0, -1}}},
    {{{O::color, 0.6, 4}, {O::contrast, 1.0, 8}}},      {{{O::rotate, 0.8, 8}, {O::color, 1.0, 2}}},
    {{{O::color, 0.8, 8}, {O::solarize, 0.8, 7}}},      {{{O::sharpness, 0.4, 7}, {O::invert, 0.6, -1}}},
    {{{O::shear_x, 0.6, 5}, {O::equalize, 1.0, -1}}},   {{{O::color, 0.4, 0}, {O::equalize, 0.6, -1}}},
    {{{O::equalize, 0.4, -1}, {O::solarize, 0.2, 4}}},  {{{O::solarize, 0.6, 5}, {O::auto_contrast, 0.6, -1}}},
    {{{O::invert, 0.6, -1}, {O::equalize, 1.0, -1}}},   {{{O::color, 0.6, 4}, {O::contrast, 1.0, 8}}},
    {{{O::equalize, 0.8, -1}, {O::equalize, 0.6, -1}}},
}};
inline constexpr Policy cifar10{{
    {{{O::invert, 0.1, -1}, {O::contrast, 0.2, 6}}},           {{{O::rotate, 0.7, 2}, {O::translate_x, 0.3, 9}}},
    {{{O::sharpness, 0.8, 1}, {O::sharpness, 0.9, 3}}},        {{{O::shear_y, 0.5, 8}, {O::translate_y, 0.7, 9}}},
    {{{O::auto_contrast, 0.5, -1}, {O::equalize, 0.9, -1}}},   {{{O::shear_y, 0.2, 7}, {O::posterize, 0.3, 7}}},
    {{{O::color, 0.4, 3}, {O::brightness, 0.6, 7}}},           {{{O::sharpness, 0.3, 9}, {O::brightness, 0.7, 9}}},
    {{{O::equalize, 0.6, -1}, {O::equalize, 0.5, -1}}},        {{{O::contrast, 0.6, 7}, {O::sharpness, 0.6, 5}}},
    {{{O::color, 0.7, 7}, {O::translate_x, 0.5, 8}}},          {{{O::equalize, 0.3, -1}, {O::auto_contrast, 0.4, -1}}},
    {{{O::translate_y, 0.4, 3}, {O::sharpness, 0.2, 6}}},      {{{O::brightness, 0.9, 6}, {O::color, 0.2, 8}}},
    {{{O::solarize, 0.5, 2}, {O::invert, 0.0, -1}}},           {{{O::equalize, 0.2, -1}, {O::auto_contrast, 0.6, -1}}},
    {{{O::equalize, 0.2, -1}, {O::equalize, 0.6, -1}}},        {{{O::color, 0.9, 9}, {O::equalize, 0.6, -1}}},
    {{{O::auto_contrast, 0.8, -1}, {O::solarize, 0.2, 8}}},    {{{O::brightness, 0.1, 3}, {O::color, 0.7, 0}}},
    {{{O::solarize, 0.4, 5}, {O::auto_contrast, 0.9, -1}}},    {{{O::translate_y, 0.9, 9}, {O::translate_y, 0.7, 9}}},
    {{{O::auto_contrast, 0.9, -1}, {O::solarize, 0.8, 3}}},    {{{O::equalize, 0.8, -1}, {O::invert, 0.1, -1}}},
    {{{O::translate_y, 0.7, 9}, {O::auto_contrast, 0.9, -1}}},
}};
inline constexpr Policy svhn{{
    {{{O::shear_x, 0.9, 4}, {O::invert, 0.2, -1}}},        {{{O::shear_y, 0.9, 8}, {O::invert, 0.7, -1}}},
    {{{O::equalize, 0.6, -1}, {O::solarize, 0.6, 6}}},     {{{O::invert, 0.9, -1}, {O::equalize, 0.6, -1}}},
    {{{O::equalize, 0.6, -1}, {O::rotate, 0.9, 3}}},       {{{O::shear_x, 0.9, 4}, {O::auto_contrast, 0.8, -1}}},
    {{{O::shear_y, 0.9, 8}, {O::invert, 0.4, -1}}},        {{{O::shear_y, 0.9, 5}, {O::solarize, 0.2, 6}}},
    {{{O::invert, 0.9, -1}, {O::auto_contrast, 0.8, -1}}}, {{{O::equalize, 0.6, -1}, {O::rotate, 0.9, 3}}},
    {{{O::shear_x, 0.9, 4}, {O::solarize, 0.3, 3}}},       {{{O::shear_y, 0.8, 8}, {O::invert, 0.7, -1}}},
    {{{O::equalize, 0.9, -1}, {O::translate_y, 0.6, 6}}},  {{{O::invert, 0.9, -1}, {O::equalize, 0.6, -1}}},
    {{{O::contrast, 0.3, 3}, {O::rotate, 0.8, 4}}},        {{{O::invert, 0.8, -1}, {O::translate_y, 0.0, 2}}},
    {{{O::shear_y, 0.7, 6}, {O::solarize, 0.4, 8}}},       {{{O::invert, 0.6, -1}, {O::rotate, 0.8, 4}}},
    {{{O::shear_y, 0.3, 7}, {O::translate_x, 0.9, 3}}},    {{{O::shear_x, 0.1, 6}, {O::invert, 0.6, -1}}},
    {{{O::solarize, 0.7, 2}, {O::translate_y, 0.6, 7}}},   {{{O::shear_y, 0.8, 4}, {O::invert, 0.8, -1}}},
    {{{O::shear_x, 0.7, 9}, {O::translate_y, 0.8, 3}}},    {{{O::shear_y, 0.8, 5}, {O::auto_contrast, 0.7, -1}}},
    {{{O::shear_x, 0.7, 2}, {O::invert, 0.1, -1}}},
}};

/// RandAugment's and TrivialAugmentWide's 14 operations, in torchvision's dictionary order (the
/// draw picks by index).
inline constexpr std::array<vision::AugmentOp, 14> random_ops{O::identity,  O::shear_x,    O::shear_y,       O::translate_x, O::translate_y,
                                                              O::rotate,    O::brightness, O::color,         O::contrast,    O::sharpness,
                                                              O::posterize, O::solarize,   O::auto_contrast, O::equalize};

}  // namespace dettrial::detail::augment

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <numbers>

#include <torch/torch.h>


namespace dettrial::detail::augment {

/// Bin `bin` of torch.linspace(0, high, num_bins): float32, as torchvision's table holds it.
inline double linspace_at(double low, double high, std::int64_t num_bins, std::int64_t bin) {
  return static_cast<double>(torch::linspace(low, high, num_bins).index({bin}).item<float>());
}

/// torchvision's Posterize table: (top - arange(n) / ((n - 1) / divisor)).round().int().
inline double posterize_bits(std::int64_t top, double divisor, std::int64_t num_bins, std::int64_t bin) {
  const torch::Tensor bins = (top - (torch::arange(num_bins) / ((static_cast<double>(num_bins) - 1.0) / divisor))).round().to(torch::kInt);
  return static_cast<double>(bins.index({bin}).item<int>());
}

/// Whether `op` takes a magnitude (all but Identity, AutoContrast, Equalize and Invert).
inline bool has_magnitude(vision::AugmentOp op) {
  return op != vision::AugmentOp::identity && op != vision::AugmentOp::auto_contrast && op != vision::AugmentOp::equalize &&
         op != vision::AugmentOp::invert;
}

/// The magnitude's sign: torchvision negates it when `torch.rand(()) <= 0.5`.
inline double signed_draw(vision::AugmentOp op, double magnitude, vision::RecordRandom& random) {
  return vision::signed_magnitude(op) && random.uniform(0.0, 1.0) <= 0.5 ? -magnitude : magnitude;
}

inline void check_bins(int num_magnitude_bins, const char* policy) {
  if (num_magnitude_bins < 2)
    throw DataError(std::string(policy) + ": num_magnitude_bins must be at least 2, not " + std::to_string(num_magnitude_bins));
}

}  // namespace dettrial::detail::augment

namespace dettrial::vision {

DETTRIAL_INLINE std::string_view name_of(AugmentOp op) {
  constexpr std::array<std::string_view, 15> names{"Identity",  "ShearX",     "ShearY",       "TranslateX", "TranslateY",
                                                   "Rotate",    "Brightness", "Color",        "Contrast",   "Sharpness",
                                                   "Posterize", "Solarize",   "AutoContrast", "Equalize",   "Invert"};
  return names[static_cast<std::size_t>(op)];
}

DETTRIAL_INLINE bool signed_magnitude(AugmentOp op) {
  switch (op) {
    case AugmentOp::shear_x:
    case AugmentOp::shear_y:
    case AugmentOp::translate_x:
    case AugmentOp::translate_y:
    case AugmentOp::rotate:
    case AugmentOp::brightness:
    case AugmentOp::color:
    case AugmentOp::contrast:
    case AugmentOp::sharpness: return true;
    default: return false;
  }
}

DETTRIAL_INLINE std::optional<double> augment_magnitude(MagnitudeSpace space, AugmentOp op, std::int64_t bin, std::int64_t num_bins,
                                                        std::int64_t height, std::int64_t width) {
  using detail::augment::linspace_at;
  const bool wide = space == MagnitudeSpace::trivial_augment_wide;
  switch (op) {
    case AugmentOp::shear_x:
    case AugmentOp::shear_y: return linspace_at(0.0, wide ? 0.99 : 0.3, num_bins, bin);
    case AugmentOp::translate_x: return linspace_at(0.0, wide ? 32.0 : 150.0 / 331.0 * static_cast<double>(width), num_bins, bin);
    case AugmentOp::translate_y: return linspace_at(0.0, wide ? 32.0 : 150.0 / 331.0 * static_cast<double>(height), num_bins, bin);
    case AugmentOp::rotate: return linspace_at(0.0, wide ? 135.0 : 30.0, num_bins, bin);
    case AugmentOp::brightness:
    case AugmentOp::color:
    case AugmentOp::contrast:
    case AugmentOp::sharpness: return linspace_at(0.0, wide ? 0.99 : 0.9, num_bins, bin);
    case AugmentOp::posterize: return detail::augment::posterize_bits(8, wide ? 6.0 : 4.0, num_bins, bin);
    case AugmentOp::solarize: return linspace_at(1.0, 0.0, num_bins, bin);
    default: return std::nullopt;
  }
}

DETTRIAL_INLINE Image apply_augment_op(Image image, AugmentOp op, double magnitude, const AugmentOptions& options) {
  namespace F = functional;
  constexpr double to_degrees = 180.0 / std::numbers::pi;  // Python's math.degrees: x * (180 / pi)
  const Interpolation mode = options.interpolation;
  switch (op) {
    case AugmentOp::identity: return image;
    // torchvision shears about the top-left corner by atan(magnitude) degrees (the paper's shear
    // matrix has the magnitude itself), and translates by whole pixels (int() truncates).
    case AugmentOp::shear_x:
      return F::affine(image, {.shear = {std::atan(magnitude) * to_degrees, 0.0}, .center = std::array{0.0, 0.0}}, mode, options.fill);
    case AugmentOp::shear_y:
      return F::affine(image, {.shear = {0.0, std::atan(magnitude) * to_degrees}, .center = std::array{0.0, 0.0}}, mode, options.fill);
    case AugmentOp::translate_x: return F::affine(image, {.translate = {std::trunc(magnitude), 0.0}}, mode, options.fill);
    case AugmentOp::translate_y: return F::affine(image, {.translate = {0.0, std::trunc(magnitude)}}, mode, options.fill);
    case AugmentOp::rotate: return F::rotate(image, magnitude, mode, options.fill);
    case AugmentOp::brightness: return F::adjust_brightness(std::move(image), 1.0 + magnitude);
    case AugmentOp::color: return F::adjust_saturation(image, 1.0 + magnitude);
    case AugmentOp::contrast: return F::adjust_contrast(image, 1.0 + magnitude);
    case AugmentOp::sharpness: return F::adjust_sharpness(image, 1.0 + magnitude);
    case AugmentOp::posterize: return F::posterize(std::move(image), static_cast<int>(magnitude));
    case AugmentOp::solarize: return F::solarize(std::move(image), 255.0 * magnitude);
    case AugmentOp::auto_contrast: return F::autocontrast(std::move(image));
    case AugmentOp::equalize: return F::equalize(std::move(image));
    case AugmentOp::invert: return F::invert(std::move(image));
  }
  return image;
}

DETTRIAL_INLINE Image AutoAugment::operator()(Image image, RecordRandom& random) const {
  const detail::augment::Policy& policy = policy_ == AutoAugmentPolicy::imagenet  ? detail::augment::imagenet
                                          : policy_ == AutoAugmentPolicy::cifar10 ? detail::augment::cifar10
                                                                                  : detail::augment::svhn;
  const auto& pair = policy[static_cast<std::size_t>(random.integer(0, static_cast<std::int64_t>(policy.size())))];
  const std::int64_t height = image.height, width = image.width;
  for (const auto& step : pair) {
    if (!(random.uniform(0.0, 1.0) <= step.probability)) continue;
    double magnitude = 0.0;
    if (const auto m = augment_magnitude(MagnitudeSpace::auto_augment, step.op, step.bin, 10, height, width))
      magnitude = detail::augment::signed_draw(step.op, *m, random);
    image = apply_augment_op(std::move(image), step.op, magnitude, options_);
  }
  return image;
}

DETTRIAL_INLINE RandAugment::RandAugment(RandAugmentOptions options) : options_(std::move(options)) {
  detail::augment::check_bins(options_.num_magnitude_bins, "RandAugment");
  if (options_.num_ops < 0) throw DataError("RandAugment: num_ops must not be negative, not " + std::to_string(options_.num_ops));
  if (options_.magnitude < 0 || options_.magnitude >= options_.num_magnitude_bins)
    throw DataError("RandAugment: magnitude is a bin in [0, num_magnitude_bins = " + std::to_string(options_.num_magnitude_bins) +
                    "), not " + std::to_string(options_.magnitude));
}

DETTRIAL_INLINE Image RandAugment::operator()(Image image, RecordRandom& random) const {
  const auto& ops = detail::augment::random_ops;
  const AugmentOptions geometry{options_.interpolation, options_.fill};
  for (int i = 0; i < options_.num_ops; ++i) {
    const AugmentOp op = ops[static_cast<std::size_t>(random.integer(0, static_cast<std::int64_t>(ops.size())))];
    double magnitude = 0.0;
    if (const auto m =
            augment_magnitude(MagnitudeSpace::auto_augment, op, options_.magnitude, options_.num_magnitude_bins, image.height, image.width))
      magnitude = detail::augment::signed_draw(op, *m, random);
    image = apply_augment_op(std::move(image), op, magnitude, geometry);
  }
  return image;
}

DETTRIAL_INLINE TrivialAugmentWide::TrivialAugmentWide(TrivialAugmentWideOptions options) : options_(std::move(options)) {
  detail::augment::check_bins(options_.num_magnitude_bins, "TrivialAugmentWide");
}

DETTRIAL_INLINE Image TrivialAugmentWide::operator()(Image image, RecordRandom& random) const {
  const auto& ops = detail::augment::random_ops;
  const AugmentOp op = ops[static_cast<std::size_t>(random.integer(0, static_cast<std::int64_t>(ops.size())))];
  double magnitude = 0.0;
  // torchvision draws the bin only for an operation with a magnitude.
  if (detail::augment::has_magnitude(op)) {
    const std::int64_t bin = random.integer(0, options_.num_magnitude_bins);
    const auto m = augment_magnitude(MagnitudeSpace::trivial_augment_wide, op, bin, options_.num_magnitude_bins, image.height, image.width);
    magnitude = detail::augment::signed_draw(op, *m, random);
  }
  return apply_augment_op(std::move(image), op, magnitude, {options_.interpolation, options_.fill});
}

DETTRIAL_INLINE AnyAutoAugment AnyAutoAugment::from_name(std::string_view name, AugmentOptions options, int ra_magnitude) {
  if (name.empty() || name == "none") return {};
  if (name == "ra") return RandAugment({.magnitude = ra_magnitude, .interpolation = options.interpolation, .fill = options.fill});
  if (name == "ta_wide") return TrivialAugmentWide({.interpolation = options.interpolation, .fill = options.fill});
  if (name == "imagenet") return AutoAugment(AutoAugmentPolicy::imagenet, std::move(options));
  if (name == "cifar10") return AutoAugment(AutoAugmentPolicy::cifar10, std::move(options));
  if (name == "svhn") return AutoAugment(AutoAugmentPolicy::svhn, std::move(options));
  throw ConfigError("unknown augmentation policy '" + std::string(name) +
                    "': the names of torchvision's reference recipe are 'ra' (RandAugment), 'ta_wide' (TrivialAugmentWide), "
                    "'imagenet', 'cifar10' and 'svhn' (AutoAugment's policies), or 'none' ('augmix' is not in dettrial)");
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/auto_augment.hpp
// ---- begin dettrial/vision/cifar.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CIFAR-10 and CIFAR-100 in their published binary format (the "binary version" archives:
/// cifar-10-batches-bin/, cifar-100-binary/), read whole into memory.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>


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
// ---- end dettrial/vision/cifar.hpp
// ---- begin dettrial/vision/decode.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Decoding JPEG and PNG files into 8-bit images, converted as PIL converts them.
///
/// JPEG goes through libjpeg-turbo's TurboJPEG API, PNG through libspng: both are in Debian, Conan
/// and vcpkg, both decode from memory with no global state, and libjpeg-turbo is what PIL and
/// torchvision decode JPEG with, so the pixels are the same. Both are optional at build time: CMake
/// defines `DETTRIAL_HAS_TURBOJPEG` and `DETTRIAL_HAS_SPNG` where it finds them, and without one
/// decoding that format throws an ImageError saying so.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>


namespace dettrial::vision {

/// Whether this build decodes JPEG (libjpeg-turbo was found), PNG (libspng was found) and WebP
/// (libwebp was found).
#if defined(DETTRIAL_HAS_TURBOJPEG)
inline constexpr bool decodes_jpeg = true;
#else
inline constexpr bool decodes_jpeg = false;
#endif
#if defined(DETTRIAL_HAS_SPNG)
inline constexpr bool decodes_png = true;
#else
inline constexpr bool decodes_png = false;
#endif
#if defined(DETTRIAL_HAS_WEBP)
inline constexpr bool decodes_webp = true;
#else
inline constexpr bool decodes_webp = false;
#endif

/**
 * @brief Decodes a JPEG (gray, colour, CMYK), PNG (8- or 16-bit; grayscale, gray with alpha, RGB,
 * RGBA or palette) or WebP (lossy or lossless, with or without alpha) file's bytes into `mode`, as
 * PIL's `Image.open(f).convert(mode)`: 16-bit samples keep their high byte, alpha is dropped. Throws ImageError naming `name` and
 * the decoder's reason for anything else: a truncated or corrupt file (a JPEG the decoder would only
 * warn about included: a silently grey-filled image is a wrong batch), another format, or a format
 * this build has no decoder for.
 */
DETTRIAL_INLINE Image decode_image(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name);

/// Reads and decodes the image file at `path` (see decode_image).
DETTRIAL_INLINE Image read_image(const std::filesystem::path& path, ImageMode mode);

/// Whether this build decodes a window of a JPEG without the rest (libjpeg-turbo's libjpeg API was found).
#if defined(DETTRIAL_HAS_LIBJPEG)
inline constexpr bool decodes_jpeg_windows = true;
#else
inline constexpr bool decodes_jpeg_windows = false;
#endif

/**
 * @brief The window `choose(height, width)` picks of the image in `bytes`: decode_image's pixels
 * cropped to it, bit for bit. A JPEG decodes only what the window needs where this build has
 * libjpeg's API (decodes_jpeg_windows): no row below it, the rows above it entropy-decoded and
 * skipped, and only the block columns it covers transformed. Damage below the window's last row
 * therefore goes unseen (every pixel returned is the file's own); damage up to it is an ImageError
 * as in decode_image. Other formats decode whole, then crop. A window that allows it
 * (PixelWindow::at_least_height and at_least_width) comes back from a JPEG at the smallest DCT
 * scale that keeps it that large: not the full decode's pixels, as the caller asked.
 */
DETTRIAL_INLINE Image decode_image_window(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name,
                                          WindowChooser choose);

/// Reads the image file at `path` and decodes the window `choose` picks (see decode_image_window).
DETTRIAL_INLINE Image read_image_window(const std::filesystem::path& path, ImageMode mode, WindowChooser choose);

/// Reads a whole file into `buffer` (reusing its capacity). Throws ImageError naming the file.
DETTRIAL_INLINE void read_file(const std::filesystem::path& path, std::vector<std::uint8_t>& buffer);

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#if defined(DETTRIAL_HAS_TURBOJPEG)
#include <turbojpeg.h>
#endif
#if defined(DETTRIAL_HAS_LIBJPEG)
#include <csetjmp>
#include <cstdio>  // jpeglib.h uses FILE without including it

#include <jpeglib.h>
#endif
#if defined(DETTRIAL_HAS_SPNG)
#include <spng.h>
#endif
#if defined(DETTRIAL_HAS_WEBP)
#include <webp/decode.h>
#endif

namespace dettrial::detail {

/// The largest image accepted, a guard against decompression bombs (a damaged header can claim any
/// size): 32768 a side, and PIL's own limit in all (twice its MAX_IMAGE_PIXELS, where it refuses).
inline constexpr std::int64_t max_image_side = 1 << 15;
inline constexpr std::int64_t max_image_pixels = 2 * 89'478'485;

inline void check_size(std::int64_t width, std::int64_t height, const std::string& name) {
  if (width < 1 || height < 1 || width > max_image_side || height > max_image_side || width * height > max_image_pixels)
    throw ImageError("cannot decode '" + name + "': its header claims " + std::to_string(width) + "x" + std::to_string(height) +
                     " pixels (the limit is " + std::to_string(max_image_side) + " a side and " + std::to_string(max_image_pixels) +
                     " in all)");
}

/// PIL's RGB to L conversion, in place: the first third of `pixels` becomes the gray image.
inline void rgb_to_gray(vision::Image& image) {
  const std::int64_t n = image.height * image.width;
  std::uint8_t* p = image.pixels.data();
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = vision::pil_luma(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
  }
  image.pixels.resize(static_cast<std::size_t>(n));
  image.channels = 1;
}

/// A CMYK JPEG's samples as PIL reads and converts them to RGB: PIL takes every CMYK JPEG's samples
/// as Adobe writes them, inverted (its raw mode "CMYK;I"), then `convert("RGB")` computes each
/// channel as (255 - K) - C (255 - K) / 255, rounded as its MULDIV255. `cmyk` holds the file's samples.
inline vision::Image pil_cmyk_to_rgb(const std::vector<std::uint8_t>& cmyk, std::int64_t height, std::int64_t width) {
  vision::Image rgb(height, width, 3);
  const std::int64_t n = height * width;
  const std::uint8_t* in = cmyk.data();
  std::uint8_t* out = rgb.pixels.data();
  for (std::int64_t i = 0; i < n; ++i, in += 4, out += 3) {
    const int not_black = in[3];  // 255 - K, K being the inverted sample 255 - in[3]
    for (int c = 0; c < 3; ++c) {
      const int t = (255 - in[c]) * not_black + 128;
      out[c] = static_cast<std::uint8_t>(not_black - (((t >> 8) + t) >> 8));
    }
  }
  return rgb;
}

/// PIL's L to RGB conversion: each gray sample three times.
inline vision::Image gray_to_rgb(const vision::Image& gray) {
  vision::Image rgb(gray.height, gray.width, 3);
  const std::int64_t n = gray.height * gray.width;
  for (std::int64_t i = 0; i < n; ++i) rgb.pixels[3 * i] = rgb.pixels[3 * i + 1] = rgb.pixels[3 * i + 2] = gray.pixels[i];
  return rgb;
}

#if defined(DETTRIAL_HAS_TURBOJPEG)
/// One TurboJPEG decompressor per thread (a handle is not thread-safe; creating one costs more than
/// decoding a small image).
/// A handle that failed is replaced: after an error TurboJPEG 2.x can leave state behind that breaks
/// the next, valid file.
struct JpegDecompressor {
  tjhandle handle = tjInitDecompress();
  JpegDecompressor() = default;
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;
  ~JpegDecompressor() {
    if (handle) tjDestroy(handle);
  }
  void renew() {
    if (handle) tjDestroy(handle);
    handle = tjInitDecompress();
  }
};

inline JpegDecompressor& jpeg_decompressor() {
  thread_local JpegDecompressor d;
  if (!d.handle) throw ImageError(std::string("cannot start libjpeg-turbo's decompressor: ") + tjGetErrorStr2(nullptr));
  return d;
}

inline vision::Image decode_jpeg(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  JpegDecompressor& decompressor = jpeg_decompressor();
  tjhandle tj = decompressor.handle;
  const auto fail = [&] {
    ImageError error("cannot decode '" + name + "' as JPEG: " + tjGetErrorStr2(tj));
    decompressor.renew();
    return error;
  };
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height, &subsampling, &colorspace) != 0)
    throw fail();
  check_size(width, height, name);
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    // libjpeg-turbo converts YCCK to CMYK; the samples come out as the file holds them.
    std::vector<std::uint8_t> cmyk(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 4);
    if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), cmyk.data(), width, 0, height, TJPF_CMYK,
                      TJFLAG_STOPONWARNING) != 0)
      throw fail();
    vision::Image image = pil_cmyk_to_rgb(cmyk, height, width);
    if (mode == vision::ImageMode::gray) rgb_to_gray(image);  // PIL's CMYK to L is its CMYK to RGB, then RGB to L
    return image;
  }
  // A gray JPEG decodes to gray; a colour one to RGB (to gray after that, as PIL converts).
  const bool gray_source = colorspace == TJCS_GRAY;
  vision::Image image(height, width, gray_source ? 1 : 3);
  // Stop on warnings: libjpeg fills a truncated file's missing rows with grey and only warns.
  if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), image.pixels.data(), width, 0, height,
                    gray_source ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0)
    throw fail();
  if (mode == vision::ImageMode::rgb && gray_source) return gray_to_rgb(image);
  if (mode == vision::ImageMode::gray && !gray_source) rgb_to_gray(image);
  return image;
}
#endif

#if defined(DETTRIAL_HAS_SPNG)
inline vision::Image decode_png(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(0), spng_ctx_free);
  if (!ctx) throw ImageError("cannot decode '" + name + "': libspng could not start");
  const auto fail = [&](const char* what, int status) {
    return ImageError("cannot decode '" + name + "' as PNG: " + what + ": " + spng_strerror(status));
  };
  int status = spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_DISCARD);
  if (status == 0) status = spng_set_image_limits(ctx.get(), max_image_side, max_image_side);
  if (status == 0) status = spng_set_chunk_limits(ctx.get(), 1u << 26, 1u << 26);
  if (status == 0) status = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  if (status != 0) throw fail("setup", status);
  spng_ihdr header{};
  if ((status = spng_get_ihdr(ctx.get(), &header)) != 0) throw fail("header", status);
  check_size(header.width, header.height, name);
  // libspng's gray output takes gray sources of up to 8 bits; everything else decodes to RGB first.
  const bool gray_source = header.color_type == SPNG_COLOR_TYPE_GRAYSCALE || header.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA;
  const bool direct_gray = gray_source && header.bit_depth <= 8 && header.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
  const int format = direct_gray ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
  std::size_t size = 0;
  if ((status = spng_decoded_image_size(ctx.get(), format, &size)) != 0) throw fail("size", status);
  vision::Image image(header.height, header.width, direct_gray ? 1 : 3);
  if (size != image.pixels.size()) throw ImageError("cannot decode '" + name + "' as PNG: unexpected decoded size");
  if ((status = spng_decode_image(ctx.get(), image.pixels.data(), size, format, 0)) != 0) throw fail("pixels", status);
  // The chunks after the pixels, to IEND: a file cut short there is damaged too.
  if ((status = spng_decode_chunks(ctx.get())) != 0) throw fail("after the pixels", status);
  if (mode == vision::ImageMode::rgb && direct_gray) return gray_to_rgb(image);
  if (mode == vision::ImageMode::gray && !direct_gray) {
    if (gray_source) {  // gray with alpha or 16-bit gray: the gray sample, which RGB8 replicated
      const std::int64_t n = image.height * image.width;
      for (std::int64_t i = 0; i < n; ++i) image.pixels[i] = image.pixels[3 * i];
      image.pixels.resize(static_cast<std::size_t>(n));
      image.channels = 1;
    } else {
      rgb_to_gray(image);
    }
  }
  return image;
}
#endif

#if defined(DETTRIAL_HAS_WEBP)
/// libwebp's reasons, in words.
inline const char* webp_status(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "its data is damaged";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "it uses a feature libwebp does not support";
    case VP8_STATUS_SUSPENDED: return "decoding was suspended";
    case VP8_STATUS_USER_ABORT: return "decoding was aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "it ends early";
    default: return "libwebp refused it";
  }
}

inline vision::Image decode_webp(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  WebPBitstreamFeatures features{};
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status != VP8_STATUS_OK) throw ImageError("cannot decode '" + name + "' as WebP: " + webp_status(status));
  if (features.has_animation)
    throw ImageError("cannot decode '" + name + "': it is an animated WebP, and dettrial decodes still images only");
  check_size(features.width, features.height, name);
  // RGB straight from the decoder: alpha dropped, not composited, as PIL's convert("RGB").
  vision::Image image(features.height, features.width, 3);
  if (WebPDecodeRGBInto(bytes.data(), bytes.size(), image.pixels.data(), image.pixels.size(), static_cast<int>(image.width * 3)) == nullptr)
    throw ImageError("cannot decode '" + name + "' as WebP: its data is damaged or ends early");
  if (mode == vision::ImageMode::gray) rgb_to_gray(image);
  return image;
}
#endif

inline std::string leading_bytes(std::span<const std::uint8_t> bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 8; ++i) {
    if (i) out += ' ';
    out += hex[bytes[i] >> 4];
    out += hex[bytes[i] & 15];
  }
  return out.empty() ? "nothing: the file is empty" : out;
}

/// `window`, which must lie inside the `height` x `width` image `name`: a DataError says where it does not.
inline vision::PixelWindow checked_window(const vision::PixelWindow& w, std::int64_t height, std::int64_t width, const std::string& name) {
  if (w.top < 0 || w.left < 0 || w.height < 1 || w.width < 1 || w.top + w.height > height || w.left + w.width > width)
    throw DataError("a window of " + std::to_string(w.height) + "x" + std::to_string(w.width) + " at (" + std::to_string(w.top) + ", " +
                    std::to_string(w.left) + ") does not lie inside '" + name + "' (" + std::to_string(height) + "x" +
                    std::to_string(width) + ")");
  return w;
}

#if defined(DETTRIAL_HAS_LIBJPEG)
/// libjpeg's error manager, turned into exceptions: an error, and a warning too (libjpeg only warns
/// about a file cut short, filling the rest with grey), jumps back to the decoding function with
/// the message, which then throws (nothing with a destructor lives between the jump's two ends).
struct JpegErrors {
  jpeg_error_mgr manager{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {};

  static void fail(j_common_ptr info) {
    auto* self = reinterpret_cast<JpegErrors*>(info->err);
    (*info->err->format_message)(info, self->message);
    std::longjmp(self->jump, 1);
  }
  static void message_or_warning(j_common_ptr info, int level) {
    if (level < 0) fail(info);  // a warning; trace messages (level >= 0) are dropped
  }
};

/// Where `w` allows it, the largest DCT reduction (1/8, 1/4, 1/2) that keeps the window at least its
/// asked size: sets the decoder's scale and returns the window in the reduced image's pixels (its
/// edges rounded outwards, within the image).
inline vision::PixelWindow reduced_window(jpeg_decompress_struct& info, const vision::PixelWindow& w) {
  for (const unsigned denominator : {8u, 4u, 2u}) {
    const auto d = static_cast<std::int64_t>(denominator);
    if (w.height / d < w.at_least_height || w.width / d < w.at_least_width) continue;
    info.scale_num = 1;
    info.scale_denom = denominator;
    jpeg_calc_output_dimensions(&info);
    const std::int64_t top = w.top / d, left = w.left / d;
    const std::int64_t bottom = std::min<std::int64_t>(info.output_height, (w.top + w.height + d - 1) / d);
    const std::int64_t right = std::min<std::int64_t>(info.output_width, (w.left + w.width + d - 1) / d);
    return vision::PixelWindow{.top = top, .left = left, .height = bottom - top, .width = right - left};
  }
  return w;
}

/// The window of a JPEG through libjpeg's API: the rows above it skipped (entropy-decoded only), the
/// block columns around it decoded (and one more each side), the rows below never read. The decoder's settings are TurboJPEG's defaults
/// (islow DCT, fancy upsampling), so the pixels are decode_jpeg's.
inline vision::Image decode_jpeg_window(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name,
                                        vision::WindowChooser choose) {
  JpegErrors errors;
  jpeg_decompress_struct info{};
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = &JpegErrors::fail;
  errors.manager.emit_message = &JpegErrors::message_or_warning;
  // Creating checks that the library is the version of the jpeglib.h and jconfig.h this was compiled
  // with, and fails through error_exit: its jump target is set first (a libjpeg 8 jconfig.h beside
  // libjpeg 6.2's jpeglib.h crashed here on a machine that had both). Nothing is allocated yet.
  if (setjmp(errors.jump) != 0)
    throw ImageError("cannot decode '" + name + "' as JPEG: " + errors.message +
                     " (dettrial was compiled with another libjpeg's jpeglib.h or jconfig.h than the library it runs with)");
  jpeg_create_decompress(&info);
  const std::unique_ptr<jpeg_decompress_struct, void (*)(jpeg_decompress_struct*)> destroy(&info, jpeg_destroy_decompress);
  // Made before the jump target: nothing between setjmp and a longjmp may need destroying.
  std::vector<std::uint8_t> rows;
  vision::Image window;
  if (setjmp(errors.jump) != 0) throw ImageError("cannot decode '" + name + "' as JPEG: " + errors.message);
  jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  const std::int64_t height = info.image_height, width = info.image_width;
  check_size(width, height, name);
  const bool cmyk = info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK;
  const bool gray_source = info.jpeg_color_space == JCS_GRAYSCALE;
  info.out_color_space = cmyk ? JCS_CMYK : gray_source ? JCS_GRAYSCALE : JCS_RGB;
  vision::PixelWindow w = checked_window(choose(height, width), height, width, name);
  if (w.at_least_height > 0 && w.at_least_width > 0) w = reduced_window(info, w);
  jpeg_start_decompress(&info);
  // One block column more on each side than the window: fancy upsampling of subsampled chroma reads
  // its neighbours, and at the edge of a cropped scanline libjpeg-turbo has none (it repeats the
  // edge), so the window's outer pixels would differ from the whole decode's. jpeg_crop_scanline
  // then widens to whole blocks.
  const std::int64_t margin = static_cast<std::int64_t>(info.max_h_samp_factor) * DCTSIZE;
  const std::int64_t output_width = info.output_width;
  const std::int64_t from = std::max<std::int64_t>(0, w.left - margin), to = std::min(output_width, w.left + w.width + margin);
  auto first_column = static_cast<JDIMENSION>(from), columns = static_cast<JDIMENSION>(to - from);
  jpeg_crop_scanline(&info, &first_column, &columns);
  if (w.top > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(w.top));
  const std::int64_t channels = info.output_components, stride = static_cast<std::int64_t>(columns) * channels;
  const std::int64_t offset = (w.left - static_cast<std::int64_t>(first_column)) * channels;
  rows.resize(static_cast<std::size_t>(stride));
  window = vision::Image(w.height, w.width, channels);
  for (std::int64_t y = 0; y < w.height; ++y) {
    JSAMPROW row = rows.data();
    jpeg_read_scanlines(&info, &row, 1);
    std::memcpy(window.row(y), rows.data() + offset, static_cast<std::size_t>(w.width * channels));
  }
  jpeg_abort_decompress(&info);  // the rows below the window are not needed
  if (cmyk) {
    vision::Image rgb = pil_cmyk_to_rgb(window.pixels, window.height, window.width);
    if (mode == vision::ImageMode::gray) rgb_to_gray(rgb);
    return rgb;
  }
  if (mode == vision::ImageMode::rgb && gray_source) return gray_to_rgb(window);
  if (mode == vision::ImageMode::gray && !gray_source) rgb_to_gray(window);
  return window;
}
#endif

/// The bytes' format by their signature.
enum class ImageFormat { jpeg, png, webp, other };
inline ImageFormat format_of(std::span<const std::uint8_t> bytes) {
  static constexpr std::uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return ImageFormat::jpeg;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_signature, 8) == 0) return ImageFormat::png;
  if (bytes.size() >= 12 && std::memcmp(bytes.data(), "RIFF", 4) == 0 && std::memcmp(bytes.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::webp;
  return ImageFormat::other;
}

}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE Image decode_image(std::span<const std::uint8_t> bytes, [[maybe_unused]] ImageMode mode, const std::string& name) {
  const detail::ImageFormat format = detail::format_of(bytes);
  if (format == detail::ImageFormat::jpeg) {
#if defined(DETTRIAL_HAS_TURBOJPEG)
    return detail::decode_jpeg(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no JPEG decoder (libjpeg-turbo was not found when it was configured)");
#endif
  }
  if (format == detail::ImageFormat::png) {
#if defined(DETTRIAL_HAS_SPNG)
    return detail::decode_png(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no PNG decoder (libspng was not found when it was configured)");
#endif
  }
  if (format == detail::ImageFormat::webp) {
#if defined(DETTRIAL_HAS_WEBP)
    return detail::decode_webp(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no WebP decoder (libwebp was not found when it was configured)");
#endif
  }
  throw ImageError("cannot decode '" + name + "': it is not JPEG, PNG or WebP (it begins with " + detail::leading_bytes(bytes) + ")");
}

DETTRIAL_INLINE void read_file(const std::filesystem::path& path, std::vector<std::uint8_t>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ImageError("cannot open '" + path.string() + "': " + std::strerror(errno));
  struct stat info{};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw ImageError("cannot read '" + path.string() + "': not a regular file");
  }
  buffer.resize(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n = ::read(fd, buffer.data() + done, buffer.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      throw ImageError("cannot read '" + path.string() + "': " + (n == 0 ? std::string("it ended early") : std::strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

DETTRIAL_INLINE Image read_image(const std::filesystem::path& path, ImageMode mode) {
  thread_local std::vector<std::uint8_t> buffer;
  read_file(path, buffer);
  return decode_image(buffer, mode, path.string());
}

DETTRIAL_INLINE Image decode_image_window(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name,
                                          WindowChooser choose) {
#if defined(DETTRIAL_HAS_LIBJPEG)
  if (detail::format_of(bytes) == detail::ImageFormat::jpeg) return detail::decode_jpeg_window(bytes, mode, name, choose);
#endif
  const Image image = decode_image(bytes, mode, name);
  const PixelWindow w = detail::checked_window(choose(image.height, image.width), image.height, image.width, name);
  return detail::crop(image, w.top, w.left, w.height, w.width);
}

DETTRIAL_INLINE Image read_image_window(const std::filesystem::path& path, ImageMode mode, WindowChooser choose) {
  thread_local std::vector<std::uint8_t> buffer;
  read_file(path, buffer);
  return decode_image_window(buffer, mode, path.string(), choose);
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/decode.hpp
// ---- begin dettrial/vision/image_dataset.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Images decoded, augmented and written straight into batch tensors: the dataset a
/// DataLoader reads image files and CIFAR records through, on its worker threads.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <torch/torch.h>

// ---- begin dettrial/vision/mixing.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's batch transforms MixUp and CutMix (and RandomChoice between them): each image
/// mixed with the batch's previous one (torchvision's `roll(1, 0)` pairing) and the labels made soft
/// in the same proportion, for a loss that takes class probabilities (cross-entropy does, with label
/// smoothing too). ImageDataset applies one to each batch it makes, as torchvision's reference
/// recipe applies it in the loader's collate, with draws keyed by (seed, epoch, the batch's first
/// record), so a resumed run mixes the same batches the same way.

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>


namespace dettrial::vision {

/// Images (N x C x H x W) and labels: class indices (N) or probabilities (N x classes).
using LabelledBatch = std::tuple<torch::Tensor, torch::Tensor>;

/// A transform of a whole batch: `LabelledBatch(images, labels, RecordRandom&)`.
template <class T>
concept BatchTransform = requires(const T& t, const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) {
  { t(images, labels, random) } -> std::same_as<LabelledBatch>;
};

/// The rectangle CutMix pastes: columns [x1, x2) and rows [y1, y2).
struct CutMixBox {
  std::int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

/**
 * @brief torchvision's `MixUp(alpha, num_classes)`: `lam` drawn from Beta(alpha, alpha), each image
 * becomes `lam * image + (1 - lam) * previous image` and each label the same mix of the two one-hot
 * labels. The batch must be float (ToFloat in the pipeline); it is mixed in place.
 */
class MixUp {
 public:
  DETTRIAL_INLINE explicit MixUp(std::int64_t num_classes, double alpha = 1.0);
  LabelledBatch operator()(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) const {
    return mix(images, labels, draw_lambda(random));
  }
  /// The mix at a given `lam`, as torchvision computes it.
  DETTRIAL_INLINE LabelledBatch mix(const torch::Tensor& images, const torch::Tensor& labels, double lam) const;
  /// Beta(alpha, alpha).
  DETTRIAL_INLINE double draw_lambda(RecordRandom& random) const;

 private:
  std::int64_t num_classes_;
  double alpha_;
};

/**
 * @brief torchvision's `CutMix(alpha, num_classes)`: `lam` drawn from Beta(alpha, alpha), a box of
 * about `1 - lam` of the area (centred at a uniformly drawn pixel, clipped to the image) pasted from
 * the previous image into each, and the labels mixed by the area actually pasted. Float or 8-bit
 * batches; pasted in place.
 */
class CutMix {
 public:
  DETTRIAL_INLINE explicit CutMix(std::int64_t num_classes, double alpha = 1.0);
  DETTRIAL_INLINE LabelledBatch operator()(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) const;
  /// torchvision's box for `lam` centred at (`center_x`, `center_y`) in a `height` x `width` image.
  DETTRIAL_INLINE static CutMixBox box_of(std::int64_t height, std::int64_t width, double lam, std::int64_t center_x,
                                          std::int64_t center_y);
  /// The paste of `box`, the labels mixed by its area, as torchvision computes them.
  DETTRIAL_INLINE LabelledBatch cut(const torch::Tensor& images, const torch::Tensor& labels, const CutMixBox& box) const;

 private:
  std::int64_t num_classes_;
  double alpha_;
};

/// torchvision's `RandomChoice([...])` of batch transforms: one of them per batch, uniformly.
template <BatchTransform... Transforms>
  requires(sizeof...(Transforms) > 0)
class RandomChoice {
 public:
  explicit RandomChoice(Transforms... transforms) : transforms_(std::move(transforms)...) {}
  LabelledBatch operator()(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) const {
    const std::int64_t pick = random.integer(0, static_cast<std::int64_t>(sizeof...(Transforms)));
    return pick_one(images, labels, random, pick, std::index_sequence_for<Transforms...>{});
  }

 private:
  template <std::size_t... I>
  LabelledBatch pick_one(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random, std::int64_t pick,
                         std::index_sequence<I...> /*indices*/) const {
    LabelledBatch out;
    ((static_cast<std::int64_t>(I) == pick ? (out = std::get<I>(transforms_)(images, labels, random), true) : false) || ...);
    return out;
  }
  std::tuple<Transforms...> transforms_;
};

/**
 * @brief torchvision's reference recipe's `get_mixup_cutmix(mixup_alpha, cutmix_alpha,
 * num_classes)`, chosen when the trial starts: MixUp where `mixup_alpha > 0`, CutMix where
 * `cutmix_alpha > 0`, one of the two per batch where both, and the batch left as it is (class
 * indices for labels) where neither.
 */
class MixUpCutMix {
 public:
  DETTRIAL_INLINE MixUpCutMix(std::int64_t num_classes, double mixup_alpha, double cutmix_alpha);
  DETTRIAL_INLINE LabelledBatch operator()(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) const;
  /// Whether batches are mixed at all.
  bool active() const { return mixup_.has_value() || cutmix_.has_value(); }

 private:
  std::optional<MixUp> mixup_;
  std::optional<CutMix> cutmix_;
};

/// ImageDataset's default: batches as they are.
struct NoMixing {};

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <string>


namespace dettrial::detail::mixing {

/// Gamma(shape, 1) by Marsaglia and Tsang's method (shape below 1 boosted by U^(1/shape)).
inline double gamma(double shape, vision::RecordRandom& random) {
  if (shape < 1.0) return gamma(shape + 1.0, random) * std::pow(1.0 - random.uniform(0.0, 1.0), 1.0 / shape);
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = random.normal();
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = 1.0 - random.uniform(0.0, 1.0);
    if (u < 1.0 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

/// Beta(alpha, alpha) as X / (X + Y) of two Gamma(alpha) draws.
inline double symmetric_beta(double alpha, vision::RecordRandom& random) {
  const double x = gamma(alpha, random), y = gamma(alpha, random);
  return x / (x + y);
}

inline void check(std::int64_t num_classes, double alpha, const char* name) {
  if (num_classes < 1) throw DataError(std::string(name) + ": num_classes must be positive, not " + std::to_string(num_classes));
  if (!(alpha > 0)) throw DataError(std::string(name) + ": alpha must be positive, not " + std::to_string(alpha));
}

/// torchvision's `_mixup_label`: one-hot (if class indices), then `lam * label + (1 - lam) * previous label`.
inline torch::Tensor mixed_labels(const torch::Tensor& labels, std::int64_t num_classes, double lam, bool pinned, const char* name) {
  torch::Tensor soft;
  if (labels.dim() == 1) {
    if (labels.numel() > 0) {
      const auto [low, high] = torch::aminmax(labels);
      if (low.item<std::int64_t>() < 0 || high.item<std::int64_t>() >= num_classes)
        throw DataError(std::string(name) + ": a label lies outside [0, num_classes = " + std::to_string(num_classes) + ") (labels " +
                        std::to_string(low.item<std::int64_t>()) + " to " + std::to_string(high.item<std::int64_t>()) + ")");
    }
    soft = torch::one_hot(labels.to(torch::kLong), num_classes).to(torch::kFloat);
  } else if (labels.dim() == 2 && labels.size(1) == num_classes) {
    soft = labels.is_floating_point() ? labels : labels.to(torch::kFloat);
  } else {
    throw DataError(std::string(name) + ": labels are class indices (N) or probabilities (N x " + std::to_string(num_classes) +
                    "), not a tensor of " + std::to_string(labels.dim()) + " dimensions");
  }
  torch::Tensor out = soft.roll(1, 0).mul_(1.0 - lam).add_(soft.mul(lam));
  return pinned ? out.pin_memory() : out;
}

inline void check_batch(const torch::Tensor& images, const torch::Tensor& labels, const char* name) {
  if (images.dim() != 4 || images.size(0) != labels.size(0))
    throw DataError(std::string(name) + ": a batch of N images (N x C x H x W) and N labels");
}

}  // namespace dettrial::detail::mixing

namespace dettrial::vision {

DETTRIAL_INLINE MixUp::MixUp(std::int64_t num_classes, double alpha) : num_classes_(num_classes), alpha_(alpha) {
  detail::mixing::check(num_classes, alpha, "MixUp");
}

DETTRIAL_INLINE double MixUp::draw_lambda(RecordRandom& random) const { return detail::mixing::symmetric_beta(alpha_, random); }

DETTRIAL_INLINE LabelledBatch MixUp::mix(const torch::Tensor& images, const torch::Tensor& labels, double lam) const {
  detail::mixing::check_batch(images, labels, "MixUp");
  if (!images.is_floating_point())
    throw DataError(
        "MixUp: the images must be float to be mixed: end the pipeline with ToFloat (and Normalize), as torchvision's MixUp "
        "needs float tensors");
  // torchvision: roll(1, 0) * (1 - lam) + images * lam. The two products are rounded apart and
  // then added, so adding them the other way round, in place, gives its bits in the batch's own
  // (possibly pinned) memory.
  const torch::Tensor previous = images.roll(1, 0).mul_(1.0 - lam);
  images.mul_(lam).add_(previous);
  return {images, detail::mixing::mixed_labels(labels, num_classes_, lam, images.is_pinned(), "MixUp")};
}

DETTRIAL_INLINE CutMix::CutMix(std::int64_t num_classes, double alpha) : num_classes_(num_classes), alpha_(alpha) {
  detail::mixing::check(num_classes, alpha, "CutMix");
}

DETTRIAL_INLINE CutMixBox CutMix::box_of(std::int64_t height, std::int64_t width, double lam, std::int64_t center_x,
                                         std::int64_t center_y) {
  const double r = 0.5 * std::sqrt(1.0 - lam);
  const auto half_w = static_cast<std::int64_t>(r * static_cast<double>(width));
  const auto half_h = static_cast<std::int64_t>(r * static_cast<double>(height));
  return {std::max<std::int64_t>(center_x - half_w, 0), std::max<std::int64_t>(center_y - half_h, 0), std::min(center_x + half_w, width),
          std::min(center_y + half_h, height)};
}

DETTRIAL_INLINE LabelledBatch CutMix::operator()(const torch::Tensor& images, const torch::Tensor& labels, RecordRandom& random) const {
  detail::mixing::check_batch(images, labels, "CutMix");
  const double lam = detail::mixing::symmetric_beta(alpha_, random);
  const std::int64_t height = images.size(2), width = images.size(3);
  const std::int64_t center_x = random.integer(0, width), center_y = random.integer(0, height);
  return cut(images, labels, box_of(height, width, lam, center_x, center_y));
}

DETTRIAL_INLINE LabelledBatch CutMix::cut(const torch::Tensor& images, const torch::Tensor& labels, const CutMixBox& box) const {
  detail::mixing::check_batch(images, labels, "CutMix");
  const std::int64_t height = images.size(2), width = images.size(3);
  torch::Tensor region = images.slice(2, box.y1, box.y2).slice(3, box.x1, box.x2);
  region.copy_(region.roll(1, 0));  // roll copies first: each image gets its predecessor's pixels
  const double lam = 1.0 - static_cast<double>((box.x2 - box.x1) * (box.y2 - box.y1)) / static_cast<double>(width * height);
  return {images, detail::mixing::mixed_labels(labels, num_classes_, lam, images.is_pinned(), "CutMix")};
}

DETTRIAL_INLINE MixUpCutMix::MixUpCutMix(std::int64_t num_classes, double mixup_alpha, double cutmix_alpha) {
  if (mixup_alpha < 0 || cutmix_alpha < 0)
    throw DataError("MixUpCutMix: mixup_alpha and cutmix_alpha are 0 (off) or positive, not " + std::to_string(mixup_alpha) + " and " +
                    std::to_string(cutmix_alpha));
  if (mixup_alpha > 0) mixup_.emplace(num_classes, mixup_alpha);
  if (cutmix_alpha > 0) cutmix_.emplace(num_classes, cutmix_alpha);
}

DETTRIAL_INLINE LabelledBatch MixUpCutMix::operator()(const torch::Tensor& images, const torch::Tensor& labels,
                                                      RecordRandom& random) const {
  if (mixup_ && cutmix_) return random.integer(0, 2) == 0 ? (*mixup_)(images, labels, random) : (*cutmix_)(images, labels, random);
  if (mixup_) return (*mixup_)(images, labels, random);
  if (cutmix_) return (*cutmix_)(images, labels, random);
  return {images, labels};
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/mixing.hpp
// ---- begin dettrial/vision/transforms.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image transforms with torchvision's names and semantics (its `v2` tensor semantics where
/// they differ from PIL's), composed at compile time into a pipeline that ends in the batch.
///
/// An image transform takes an Image and the record's RecordRandom and returns an Image: the 8-bit
/// steps (crops, flips, Resize, ColorJitter). ToFloat and Normalize are the output steps: they say
/// what the batch holds, and are applied as each image is written into it.

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
// ---- end dettrial/vision/transforms.hpp

namespace dettrial::vision {

/// What an ImageDataset reads records from: ImageFolder, Cifar, or a type of the same shape.
template <class S>
concept ImageSource = requires(const S& s, std::int64_t i, ImageMode mode) {
  { s.size() } -> std::convertible_to<std::int64_t>;
  { s.label(i) } -> std::convertible_to<std::int64_t>;
  { s.load(i, mode) } -> std::same_as<Image>;
  { s.name(i) } -> std::convertible_to<std::string>;
};

}  // namespace dettrial::vision

namespace dettrial::detail {
/**
 * @brief Batch tensors handed out again once nothing refers to them any more. A float batch of 64
 * images of 224 pixels is 38 MB, above glibc's largest mmap threshold (32 MiB): a fresh one every
 * batch is a fresh mapping, each of its pages faulting and zeroed as it is first written, a quarter
 * of the pipeline's time at ImageNet's sizes. A buffer is reused only when its storage has no other
 * owner (no batch, view or copy of it is alive). Pinned buffers are not kept: a non-blocking copy
 * to the GPU may still be reading one its owner has dropped, and CUDA's host allocator, which
 * serves them, already reuses its blocks once such copies end.
 */
class BatchBuffers {
 public:
  torch::Tensor take(at::IntArrayRef shape, torch::Dtype dtype, bool pinned) {
    if (pinned) return torch::empty(shape, torch::TensorOptions(dtype).pinned_memory(true));
    std::lock_guard lock(mutex_);
    for (const torch::Tensor& buffer : buffers_)
      if (buffer.use_count() == 1 && buffer.storage().use_count() == 1 && buffer.scalar_type() == dtype && buffer.sizes() == shape)
        return buffer;  // the copy returned makes it owned again before the lock is released
    torch::Tensor fresh = torch::empty(shape, dtype);
    if (buffers_.size() < max_buffers) buffers_.push_back(fresh);
    return fresh;
  }

 private:
  // Enough for a loader's batches in flight (workers x prefetch) and the one being trained on.
  static constexpr std::size_t max_buffers = 16;
  std::mutex mutex_;
  std::vector<torch::Tensor> buffers_;
};
}  // namespace dettrial::detail

namespace dettrial::vision {

/// A source that decodes a record's window alone (ImageFolder), for a pipeline whose first step
/// crops a window drawn before decoding (Compose::crops_first).
template <class S, class T>
concept DecodesWindowsFor = T::crops_first && requires(const S& s, std::int64_t i, ImageMode mode, WindowChooser choose) {
  { s.load_window(i, mode, choose) } -> std::same_as<Image>;
};

/// What an ImageDataset transforms with: a Compose (the 8-bit steps, then what the batch holds).
template <class T>
concept ImagePipeline = requires(const T& t, Image image, RecordRandom& random, void* out) {
  { t.apply(std::move(image), random) } -> std::same_as<Image>;
  { t.dtype() } -> std::convertible_to<torch::Dtype>;
  t.write(image, out, random);
};

/// A pipeline that leaves its last flip to the batch writer (Compose): prepare() and write(PreparedImage).
template <class T>
concept PreparesForWriter = requires(const T& t, Image image, RecordRandom& random, const PreparedImage& prepared, void* out) {
  { t.prepare(std::move(image), random) } -> std::same_as<PreparedImage>;
  t.write(prepared, out, random);
};

/// Options of ImageDataset.
struct ImageDatasetOptions {
  /// The colour mode images are decoded to (PIL's convert("RGB") or convert("L")).
  ImageMode mode = ImageMode::rgb;
  /// Leave out a record whose file cannot be read or decoded, instead of failing: its batch is then
  /// shorter. The first few are named on the standard error, the rest counted (skipped()).
  bool skip_unreadable = false;
  /// Batches in page-locked memory, for non-blocking copies to a GPU. Unset: when a GPU is present.
  std::optional<bool> pin_memory{};
};

/**
 * @brief A BatchDataset of images and labels: for each record of a batch, its image is read and
 * decoded, transformed with draws keyed by (loader seed, epoch, record index), and written into the
 * batch tensor in place (N x C x H x W, float or 8-bit as the transform ends); labels are int64. A
 * DataLoader runs it on its worker threads, by default as many as the process's share of the CPUs.
 * A batch transform (MixUp, CutMix, MixUpCutMix: mixing.hpp) then mixes each batch, drawing from
 * (loader seed, epoch, the batch's first record), and the labels become class probabilities.
 * @code{.cpp}
 * namespace vision = dettrial::vision;
 * vision::ImageDataset train(vision::ImageFolder("data/train"),
 *                            vision::Compose(vision::RandomResizedCrop(64), vision::RandomHorizontalFlip{}, vision::ToFloat{},
 *                                            vision::Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})));
 * dettrial::DataLoader loader(train, {.batch_size = 64, .shuffle = true});
 * @endcode
 */
template <class Source, class Transform, class Mixing = NoMixing>
class ImageDataset {
  static_assert(ImageSource<Source>,
                "dettrial::vision::ImageDataset<Source, Transform>: Source must have size(), label(index), load(index, mode) returning "
                "a dettrial::vision::Image, and name(index) (like dettrial::vision::ImageFolder or dettrial::vision::Cifar)");
  static_assert(ImagePipeline<Transform>,
                "dettrial::vision::ImageDataset<Source, Transform>: Transform must be a dettrial::vision::Compose of transforms");
  static_assert(std::is_same_v<Mixing, NoMixing> || BatchTransform<Mixing>,
                "dettrial::vision::ImageDataset<Source, Transform, Mixing>: Mixing must be a batch transform (LabelledBatch(images, "
                "labels, RecordRandom&) const, like dettrial::vision::MixUp, CutMix, RandomChoice or MixUpCutMix)");

 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  ImageDataset(Source source, Transform transform, ImageDatasetOptions options = {})
    requires(std::is_same_v<Mixing, NoMixing>)
      : ImageDataset(std::move(source), std::move(transform), NoMixing{}, options, 0) {}
  /// With a batch transform applied to each batch.
  ImageDataset(Source source, Transform transform, Mixing mixing, ImageDatasetOptions options = {})
    requires(!std::is_same_v<Mixing, NoMixing>)
      : ImageDataset(std::move(source), std::move(transform), std::move(mixing), options, 0) {}

  std::int64_t size() const { return static_cast<std::int64_t>(source_.size()); }
  const Source& source() const { return source_; }
  const ImageDatasetOptions& options() const { return options_; }
  /// The worker threads a DataLoader gives it unless told otherwise: the process's share of the CPUs,
  /// as dettrial sizes LibTorch's intra-op pool (choose_threads: OMP_NUM_THREADS, Slurm's CPUs per
  /// task, the launcher's binding, else the cores over the ranks on this node).
  int default_workers() const {
    return std::max(1, choose_threads(LaunchEnvironment::detect(), std::nullopt, CoreCount::of_this_process()).threads);
  }
  /// Records left out so far because their file could not be read (skip_unreadable).
  std::int64_t skipped() const {
    std::lock_guard lock(skips_->mutex);
    return skips_->count;
  }

  /// The records at `indices` (a 1-D integer tensor), augmented as `origin` keys them.
  Batch get_batch(const torch::Tensor& indices, const BatchOrigin& origin) const {
    const torch::NoGradGuard no_autograd;  // not InferenceMode: its tensors could not enter autograd
    const torch::Tensor order = indices.to(torch::kLong).contiguous();
    const std::int64_t n = order.numel();
    const std::int64_t* records = order.data_ptr<std::int64_t>();
    torch::Tensor images;
    const torch::Tensor labels = torch::empty({n}, torch::TensorOptions(torch::kLong).pinned_memory(pin_));
    std::int64_t* label_out = labels.data_ptr<std::int64_t>();
    std::int64_t kept = 0, bytes_per_image = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t record = records[r];
      RecordRandom random(origin.seed, origin.epoch_of(r), record);
      std::optional<PreparedImage> prepared = transformed(record, random);
      if (!prepared) continue;
      const Image& image = prepared->image;
      if (!images.defined()) {
        images = buffers_->take({n, image.channels, image.height, image.width}, transform_.dtype(), pin_);
        bytes_per_image = image.channels * image.height * image.width * static_cast<std::int64_t>(images.element_size());
      } else if (image.channels != images.size(1) || image.height != images.size(2) || image.width != images.size(3)) {
        throw DataError("record " + std::to_string(record) + " ('" + source_.name(record) + "') is " + shape(image) +
                        " after the transforms, but its batch's first image is " + std::to_string(images.size(1)) + "x" +
                        std::to_string(images.size(2)) + "x" + std::to_string(images.size(3)) +
                        ": end the transforms in one size (Resize with two numbers, CenterCrop, RandomCrop, RandomResizedCrop)");
      }
      void* out = static_cast<char*>(images.data_ptr()) + kept * bytes_per_image;
      if constexpr (PreparesForWriter<Transform>) transform_.write(*prepared, out, random);
      else transform_.write(image, out, random);
      label_out[kept++] = source_.label(record);
    }
    if (!images.defined()) return {torch::empty({0}, transform_.dtype()), labels.narrow(0, 0, 0)};
    Batch batch = kept < n ? Batch{images.narrow(0, 0, kept), labels.narrow(0, 0, kept)} : Batch{images, labels};
    if constexpr (!std::is_same_v<Mixing, NoMixing>) {
      if (n > 0) {
        RecordRandom random = RecordRandom::of_batch(origin.seed, origin.epoch_of(0), records[0]);
        return mixing_(std::get<0>(batch), std::get<1>(batch), random);
      }
    }
    return batch;
  }
  /// The records at `indices` as epoch 0 with seed 0 (a DataLoader passes the batch's origin).
  Batch get_batch(const torch::Tensor& indices) const { return get_batch(indices, BatchOrigin{}); }

 private:
  ImageDataset(Source source, Transform transform, Mixing mixing, ImageDatasetOptions options, int /*all*/)
      : source_(std::move(source)),
        transform_(std::move(transform)),
        mixing_(std::move(mixing)),
        options_(options),
        pin_(options.pin_memory.value_or(torch::cuda::is_available())),
        skips_(std::make_shared<Skips>()),
        buffers_(std::make_shared<detail::BatchBuffers>()) {}

  struct Skips {
    std::mutex mutex;
    std::int64_t count = 0;
  };
  static constexpr std::int64_t named_skips = 5;

  static std::string shape(const Image& image) {
    return std::to_string(image.channels) + "x" + std::to_string(image.height) + "x" + std::to_string(image.width);
  }

  /// Record `record`, read and transformed with its draws; nullopt when it is unreadable and skipped.
  /// A pipeline that crops first (RandomResizedCrop, CenterCrop) reads only the crop's window of a
  /// JPEG, with the same draws and pixels.
  std::optional<PreparedImage> transformed(std::int64_t record, RecordRandom& random) const {
    try {
      if constexpr (DecodesWindowsFor<Source, Transform>) {
        const auto load_window = [&](WindowChooser choose) { return source_.load_window(record, options_.mode, choose); };
        if constexpr (PreparesForWriter<Transform>) return transform_.prepare_windowed(load_window, random);
        else return PreparedImage{transform_.apply_windowed(load_window, random)};
      } else if constexpr (PreparesForWriter<Transform>) return transform_.prepare(source_.load(record, options_.mode), random);
      else return PreparedImage{transform_.apply(source_.load(record, options_.mode), random)};
    } catch (const ImageError& e) {  // the file: skipped if the options say so
      const std::string what = std::string(e.what()) + " (record " + std::to_string(record) + ")";
      if (!options_.skip_unreadable) throw ImageError(what);
      note_skip(what);
      return std::nullopt;
    } catch (const DataError& e) {  // the transforms
      throw DataError(std::string(e.what()) + " (record " + std::to_string(record) + ", '" + source_.name(record) + "')");
    }
  }

  void note_skip(const std::string& what) const {
    std::lock_guard lock(skips_->mutex);
    const std::int64_t n = ++skips_->count;
    if (n <= named_skips) std::fprintf(stderr, "dettrial: skipping an unreadable image: %s\n", what.c_str());
    if (n == named_skips)
      std::fprintf(stderr, "dettrial: further unreadable images are skipped without a message, and counted (skip_unreadable)\n");
  }

  Source source_;
  Transform transform_;
  [[no_unique_address]] Mixing mixing_;
  ImageDatasetOptions options_;
  bool pin_ = false;
  std::shared_ptr<Skips> skips_;                   // shared by copies: the loader's copy counts for the trial's
  std::shared_ptr<detail::BatchBuffers> buffers_;  // shared by copies, as the loader's workers share them
};

}  // namespace dettrial::vision
// ---- end dettrial/vision/image_dataset.hpp
// ---- begin dettrial/vision/image_folder.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image files with labels: torchvision's ImageFolder (one subfolder per class), or an
/// explicit list of (path, label) pairs, in code or in a CSV file.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>


namespace dettrial::vision {

/// torchvision's IMG_EXTENSIONS: the files ImageFolder lists by default, so the records are
/// torchvision's (dettrial decodes the JPEG, PNG and WebP ones and refuses a listing with the others).
inline const std::vector<std::string>& default_image_extensions() {
  static const std::vector<std::string> extensions{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return extensions;
}

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// The file name endings listed, compared in lower case (torchvision's `extensions`).
  std::vector<std::string> extensions = default_image_extensions();
  /// Allow a class folder with no such file (torchvision's `allow_empty`); otherwise an error names them.
  bool allow_empty = false;
};

/**
 * @brief Labelled image files, as torchvision's `ImageFolder` lists them: the classes are the
 * subfolders of `root` (symbolic links followed), sorted, indexed from 0; the records are every file
 * with a listed extension anywhere below a class folder, folder by folder in sorted path order, each
 * folder's files sorted. So a record's index and label are the ones torchvision gives it.
 * @code{.cpp}
 * dettrial::vision::ImageFolder train("data/train");   // data/train/cat/1.png, data/train/dog/2.jpg, ...
 * train.classes();                                      // {"cat", "dog"}
 * @endcode
 */
class ImageFolder {
 public:
  struct Sample {
    std::filesystem::path path;
    std::int64_t label = 0;
  };

  explicit ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options = {});
  /// An explicit list of files and labels; `classes` names the labels (optional).
  static ImageFolder from_samples(std::vector<Sample> samples, std::vector<std::string> classes = {});
  /**
   * @brief The samples of a CSV file with a `path` and a `label` column (a header line naming them, in
   * any order, or no header: path then label). Relative paths are relative to the CSV file's folder.
   * Labels are integers, or class names, which are then sorted and indexed as ImageFolder's classes.
   */
  static ImageFolder from_csv(const std::filesystem::path& csv);

  std::int64_t size() const { return static_cast<std::int64_t>(samples_.size()); }
  const std::vector<Sample>& samples() const { return samples_; }
  /// The class names, in label order (empty for integer labels given without names).
  const std::vector<std::string>& classes() const { return classes_; }
  std::int64_t label(std::int64_t index) const { return samples_[static_cast<std::size_t>(index)].label; }
  /// Reads and decodes record `index` (thread-safe).
  Image load(std::int64_t index, ImageMode mode) const { return read_image(samples_[static_cast<std::size_t>(index)].path, mode); }
  /// Record `index`'s window that `choose` picks from its size: a JPEG decodes only that (read_image_window).
  Image load_window(std::int64_t index, ImageMode mode, WindowChooser choose) const {
    return read_image_window(samples_[static_cast<std::size_t>(index)].path, mode, choose);
  }
  /// The record's file, for messages.
  std::string name(std::int64_t index) const { return samples_[static_cast<std::size_t>(index)].path.string(); }

 private:
  ImageFolder() = default;
  std::vector<Sample> samples_;
  std::vector<std::string> classes_;
};

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <system_error>

namespace dettrial::detail {

/// `text` in lower case (ASCII: file name endings).
inline std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return text;
}

inline bool has_extension(const std::string& file, const std::vector<std::string>& extensions) {
  const std::string lower = lowercase(file);
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) {
    return lower.size() >= e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0;
  });
}

/// os.walk(top, followlinks=True): every folder below `top` (itself included) with its entries that
/// are not folders (broken links included), as (path text, file names); a link cycle is walked once.
inline void walk(const std::string& top, std::vector<std::pair<std::string, std::vector<std::string>>>& out,
                 std::set<std::filesystem::path>& seen) {
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(top, ec);
  if (ec || !seen.insert(canonical).second) return;
  std::vector<std::string> files, folders;
  for (std::filesystem::directory_iterator it(top, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    (it->is_directory(kind) ? folders : files).push_back(it->path().filename().string());
  }
  if (ec) throw DataError("ImageFolder: cannot list '" + top + "': " + ec.message());
  out.emplace_back(top, std::move(files));
  for (const std::string& folder : folders) walk(top + "/" + folder, out, seen);
}

/// One CSV line's fields (RFC 4180 quotes: "a,b" and "" inside them).
inline std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;
      else if (ch == '"') quoted = false;
      else fields.back() += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      fields.emplace_back();
    } else if (ch != '\r') {
      fields.back() += ch;
    }
  }
  return fields;
}

inline bool is_integer(const std::string& text) {
  std::size_t i = text.size() > 1 && text[0] == '-' ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

/// The ending of `file` in lower case when it names an image kind this build cannot decode: BMP,
/// TIFF, PPM/PGM and GIF, and JPEG, PNG or WebP where their library was not found; else empty.
inline std::string undecodable_ending(const std::string& file) {
  const std::string lower = lowercase(std::filesystem::path(file).extension().string());
  const bool readable = ((lower == ".jpg" || lower == ".jpeg") && vision::decodes_jpeg) || (lower == ".png" && vision::decodes_png) ||
                        (lower == ".webp" && vision::decodes_webp);
  const auto& listed = vision::default_image_extensions();
  const bool image = lower == ".gif" || std::find(listed.begin(), listed.end(), lower) != listed.end();  // and GIF, which a user may list
  return !readable && image ? lower : std::string();
}

/// Refuses a listing that holds files this build cannot decode, before any training: one sentence
/// with how many of each ending (the file's content decides the decoder, so a PNG named .JPEG is read).
inline void check_decodable(const std::vector<vision::ImageFolder::Sample>& samples, const std::string& where) {
  std::map<std::string, std::int64_t> counts;
  std::string first;
  for (const auto& sample : samples) {
    const std::string ending = undecodable_ending(sample.path.filename().string());
    if (ending.empty()) continue;
    if (first.empty()) first = sample.path.string();
    ++counts[ending];
  }
  if (counts.empty()) return;
  std::int64_t total = 0;
  std::string kinds;
  for (const auto& [ending, n] : counts) {
    total += n;
    kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + ending;
  }
  std::string decoded =
      std::string(vision::decodes_jpeg ? " JPEG" : "") + (vision::decodes_png ? " PNG" : "") + (vision::decodes_webp ? " WebP" : "");
  throw DataError("ImageFolder: " + std::to_string(total) + " file(s) listed in " + where + " are of kinds this build cannot decode (" +
                  kinds + "; the first: '" + first + "'); it decodes" + (decoded.empty() ? std::string(" none") : decoded) +
                  ": convert them, or list without their endings (ImageFolderOptions::extensions)");
}

}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE ImageFolder::ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec))
    throw DataError("ImageFolder: '" + root.string() + "' is not a folder (expected one subfolder per class)");
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    if (it->is_directory(kind)) classes_.push_back(it->path().filename().string());
  }
  if (ec) throw DataError("ImageFolder: cannot list '" + root.string() + "': " + ec.message());
  if (classes_.empty()) throw DataError("ImageFolder: found no class folder in '" + root.string() + "'");
  std::sort(classes_.begin(), classes_.end());
  std::vector<std::string> empty;
  for (std::size_t label = 0; label < classes_.size(); ++label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    std::set<std::filesystem::path> seen;
    detail::walk((root / classes_[label]).string(), folders, seen);
    std::sort(folders.begin(), folders.end());
    const std::size_t before = samples_.size();
    for (auto& [folder, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const std::string& file : files)
        if (detail::has_extension(file, options.extensions))
          samples_.push_back({std::filesystem::path(folder) / file, static_cast<std::int64_t>(label)});
    }
    if (samples_.size() == before) empty.push_back(classes_[label]);
  }
  detail::check_decodable(samples_, "'" + root.string() + "'");
  if (!empty.empty() && !options.allow_empty) {
    std::string names, endings;
    for (const auto& n : empty) names += (names.empty() ? "" : ", ") + n;
    for (const auto& e : options.extensions) endings += (endings.empty() ? "" : " ") + e;
    throw DataError("ImageFolder: found no image file for the class(es) " + names + " in '" + root.string() +
                    "' (listed endings: " + endings + "; allow_empty accepts empty classes)");
  }
}

DETTRIAL_INLINE ImageFolder ImageFolder::from_samples(std::vector<Sample> samples, std::vector<std::string> classes) {
  ImageFolder folder;
  for (const Sample& s : samples)
    if (s.label < 0 || (!classes.empty() && s.label >= static_cast<std::int64_t>(classes.size())))
      throw DataError("ImageFolder: '" + s.path.string() + "' has label " + std::to_string(s.label) + ", outside the " +
                      (classes.empty() ? std::string("non-negative integers") : std::to_string(classes.size()) + " classes"));
  folder.samples_ = std::move(samples);
  folder.classes_ = std::move(classes);
  return folder;
}

DETTRIAL_INLINE ImageFolder ImageFolder::from_csv(const std::filesystem::path& csv) {
  std::ifstream in(csv);
  if (!in) throw DataError("ImageFolder: cannot open the CSV file '" + csv.string() + "'");
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  std::size_t path_column = 0, label_column = 1, number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line == "\r") continue;
    const auto fields = detail::csv_fields(line);
    if (rows.empty() && number == 1) {
      const auto path_at = std::find(fields.begin(), fields.end(), "path");
      const auto label_at = std::find(fields.begin(), fields.end(), "label");
      if (path_at != fields.end() && label_at != fields.end()) {
        path_column = static_cast<std::size_t>(path_at - fields.begin());
        label_column = static_cast<std::size_t>(label_at - fields.begin());
        continue;
      }
    }
    if (fields.size() <= std::max(path_column, label_column))
      throw DataError("ImageFolder: line " + std::to_string(number) + " of '" + csv.string() + "' has " + std::to_string(fields.size()) +
                      " field(s); it needs a path and a label");
    rows.emplace_back(fields[path_column], fields[label_column]);
  }
  if (rows.empty()) throw DataError("ImageFolder: the CSV file '" + csv.string() + "' lists no image");
  const bool numeric = std::all_of(rows.begin(), rows.end(), [](const auto& r) { return detail::is_integer(r.second); });
  std::vector<std::string> classes;
  std::map<std::string, std::int64_t> index;
  if (!numeric) {
    std::set<std::string> names;
    for (const auto& r : rows) names.insert(r.second);
    classes.assign(names.begin(), names.end());
    for (std::size_t i = 0; i < classes.size(); ++i) index[classes[i]] = static_cast<std::int64_t>(i);
  }
  std::vector<Sample> samples;
  samples.reserve(rows.size());
  for (const auto& [path, label] : rows) {
    const std::filesystem::path p(path);
    samples.push_back({p.is_absolute() ? p : csv.parent_path() / p, numeric ? std::stoll(label) : index.at(label)});
  }
  detail::check_decodable(samples, "the CSV file '" + csv.string() + "'");
  return from_samples(std::move(samples), std::move(classes));
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/image_folder.hpp
// ---- begin dettrial/vision/resnet.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's ResNets in LibTorch: ResNet-18, 34, 50, 101 and 152, ResNeXt-50 32x4d and
/// Wide ResNet-50-2, built as torchvision builds them, so `state_dict()` names and shapes are
/// torchvision's and a file Python saved from one loads with `dettrial::load_weights` (strict).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

// ---- begin dettrial/nn/rebuilt_clone.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief nn::rebuilt_clone: the deep copy behind the clone() of modules whose structure comes from
/// their constructor's arguments (dettrial's ResNets and their blocks). LibTorch's Cloneable copies a
/// module by calling reset() on a copy, which such a module cannot rebuild itself with; Python's
/// `copy.deepcopy` copies anything. This builds the module anew, then copies its state and modes.

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <torch/torch.h>


namespace dettrial::detail::rebuilt_clone {

/// `to`'s tensor named `name` takes `from`'s values (on `device` when given) and gradient flag.
inline void copy_tensor(torch::Tensor& to, const torch::Tensor& from, const std::string& name, const std::string& what,
                        const c10::optional<torch::Device>& device) {
  if (!from.defined()) return;
  if (!to.defined() || to.sizes() != from.sizes())
    throw ConfigError(what + ".clone(): the rebuilt copy's '" + name + "' does not have the original's shape");
  to.set_data(device && from.device() != *device ? from.to(*device) : from.clone());
  if (to.is_leaf()) to.set_requires_grad(from.requires_grad());
}

}  // namespace dettrial::detail::rebuilt_clone

namespace dettrial::nn {

/**
 * @brief A deep copy of `original`: `build()` makes a module of the same structure (with the random
 * generators put back after it, so a clone draws nothing from the training's stream), which then
 * takes every parameter and buffer of `original` by name (on `device` when given) and every
 * module's training mode. Throws ConfigError when the rebuilt structure differs.
 */
template <class Build>
std::shared_ptr<torch::nn::Module> rebuilt_clone(const torch::nn::Module& original, Build&& build,
                                                 const c10::optional<torch::Device>& device = c10::nullopt) {
  torch::NoGradGuard no_grad;
  const std::string what = original.name();
  const std::shared_ptr<torch::nn::Module> copy = detail::GeneratorStates::drawing_nothing(std::forward<Build>(build));
  auto parameters = copy->named_parameters();
  for (const auto& p : original.named_parameters()) {
    torch::Tensor* to = parameters.find(p.key());
    if (!to) throw ConfigError(what + ".clone(): the rebuilt copy has no parameter '" + p.key() + "'");
    detail::rebuilt_clone::copy_tensor(*to, p.value(), p.key(), what, device);
  }
  auto buffers = copy->named_buffers();
  for (const auto& b : original.named_buffers()) {
    torch::Tensor* to = buffers.find(b.key());
    if (!to) throw ConfigError(what + ".clone(): the rebuilt copy has no buffer '" + b.key() + "'");
    detail::rebuilt_clone::copy_tensor(*to, b.value(), b.key(), what, device);
  }
  if (parameters.size() != original.named_parameters().size() || buffers.size() != original.named_buffers().size())
    throw ConfigError(what + ".clone(): the rebuilt copy has other parameters or buffers than the original");
  // Modes in pre-order: train() sets a module's subtree, and each module after it sets its own.
  const auto from = original.modules(), to = copy->modules();
  if (from.size() != to.size()) throw ConfigError(what + ".clone(): the rebuilt copy has another module tree than the original");
  for (std::size_t i = 0; i < from.size(); ++i) to[i]->train(from[i]->is_training());
  return copy;
}

}  // namespace dettrial::nn
// ---- end dettrial/nn/rebuilt_clone.hpp

namespace dettrial::vision::models {

/// torchvision's `ResNet(...)` arguments beyond the block and the layer counts.
struct ResNetOptions {
  /// The classifier's outputs (`fc`).
  std::int64_t num_classes = 1000;
  /// Each residual branch's last BatchNorm starts at zero, so each block starts as the identity
  /// (torchvision's `zero_init_residual`, from "Bag of Tricks", +0.2-0.3% top-1 in its recipe).
  bool zero_init_residual = false;
  /// Grouped 3x3 convolutions (ResNeXt's cardinality; BasicBlock takes only 1).
  std::int64_t groups = 1;
  /// The bottleneck width for 64 planes (ResNeXt's 4, Wide ResNet's 128; BasicBlock takes only 64).
  std::int64_t width_per_group = 64;
  /// Dilation in place of the stride in layer2, layer3, layer4 (torchvision's
  /// `replace_stride_with_dilation`, for dense prediction; Bottleneck networks only).
  std::array<bool, 3> replace_stride_with_dilation{false, false, false};
};

/// ResNet-18's and 34's block: two 3x3 convolutions (`conv1`, `bn1`, `conv2`, `bn2`, `downsample`).
class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr std::int64_t expansion = 1;
  /// torchvision's `BasicBlock(inplanes, planes, stride, downsample, groups, base_width, dilation)`;
  /// `downsample` may be empty.
  BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride, torch::nn::Sequential downsample, std::int64_t groups,
                 std::int64_t base_width, std::int64_t dilation);
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes included (nn::rebuilt_clone: built again from its arguments).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  /// BatchNorm2d's state and arithmetic (see ResNetImpl's norm layers).
  nn::SyncBatchNorm bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};

 private:
  std::int64_t inplanes_, planes_, stride_, groups_, base_width_, dilation_;
};
TORCH_MODULE(BasicBlock);

/// ResNet-50's and deeper networks' block: 1x1, 3x3 (strided, grouped), 1x1 with 4x the planes
/// (`conv1`..`conv3`, `bn1`..`bn3`, `downsample`), the stride on the 3x3 as torchvision's V1.5.
class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr std::int64_t expansion = 4;
  /// torchvision's `Bottleneck(inplanes, planes, stride, downsample, groups, base_width, dilation)`.
  BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride, torch::nn::Sequential downsample, std::int64_t groups,
                 std::int64_t base_width, std::int64_t dilation);
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes included (nn::rebuilt_clone: built again from its arguments).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::SyncBatchNorm bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};

 private:
  std::int64_t inplanes_, planes_, stride_, groups_, base_width_, dilation_;
};
TORCH_MODULE(Bottleneck);

/// Which block a ResNet stacks.
enum class ResNetBlock { basic, bottleneck };

/**
 * @brief torchvision's `ResNet`: `conv1`, `bn1`, `maxpool`, `layer1`..`layer4` (Sequentials of
 * blocks), `avgpool`, `fc`; the same module tree, parameter and buffer names, shapes and
 * initialisation (Kaiming normal, fan out, for every convolution; BatchNorm at 1 and 0; the Linear
 * layer's default), module by module in torchvision's order, so a network built after
 * `torch::manual_seed(s)` holds the weights torchvision's does after `torch.manual_seed(s)` on the
 * same LibTorch release. Takes N x 3 x H x W images (any H, W of at least 32); returns N x num_classes logits.
 * Its norm layers are dettrial::nn::SyncBatchNorm: BatchNorm2d's names, state and arithmetic in one
 * process, and the job's statistics once `nn::convert_sync_batchnorm(model, context.communicator())`
 * gives them the communicator (a BatchNorm2d member could not be swapped from outside).
 * @code{.cpp}
 * auto model = dettrial::vision::models::resnet50({.num_classes = 1000});
 * dettrial::load_weights(model, "resnet50.pt");  // torch.save(torchvision.models.resnet50().state_dict(), ...)
 * @endcode
 */
class ResNetImpl : public torch::nn::Module {
 public:
  /// `layers`: the blocks in layer1..layer4 (ResNet-50: {3, 4, 6, 3}).
  ResNetImpl(ResNetBlock block, std::array<std::int64_t, 4> layers, ResNetOptions options = {});
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes and a replaced classifier included (an EMA's copy: optim::AveragedModel).
  /// Built again from its arguments (nn::rebuilt_clone), drawing nothing from the random stream.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr};
  nn::SyncBatchNorm bn1{nullptr};
  torch::nn::MaxPool2d maxpool{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};
  /// The classifier; replace it to fine-tune on other classes (`replace_module("fc", ...)`).
  torch::nn::Linear fc{nullptr};

 private:
  torch::nn::Sequential make_layer(std::int64_t planes, std::int64_t blocks, std::int64_t stride, bool dilate);
  void initialise(bool zero_init_residual);
  /// The block's output channels over its `planes`: 1 for BasicBlock, 4 for Bottleneck.
  std::int64_t expansion() const { return block_ == ResNetBlock::basic ? BasicBlockImpl::expansion : BottleneckImpl::expansion; }

  ResNetBlock block_;
  std::array<std::int64_t, 4> layers_;
  ResNetOptions options_;
  std::int64_t inplanes_ = 64;
  std::int64_t dilation_ = 1;
  std::int64_t groups_;
  std::int64_t base_width_;
};
TORCH_MODULE(ResNet);

/// torchvision's builders, by its names (each takes the options but the block and layer counts).
DETTRIAL_INLINE ResNet resnet18(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet34(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet50(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet101(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet152(ResNetOptions options = {});
/// ResNet-50 with 32 groups of width 4 (its `groups` and `width_per_group` are set).
DETTRIAL_INLINE ResNet resnext50_32x4d(ResNetOptions options = {});
/// ResNet-50 with bottlenecks twice as wide (its `width_per_group` is set to 128).
DETTRIAL_INLINE ResNet wide_resnet50_2(ResNetOptions options = {});

/// The architectures `resnet(name)` builds, in torchvision's names.
DETTRIAL_INLINE const std::vector<std::string>& resnet_architectures();
/// The network torchvision's `models.__dict__[name](...)` builds (the porting guide's `arch`
/// hyperparameter); throws ConfigError naming the architectures it knows for any other name.
DETTRIAL_INLINE ResNet resnet(const std::string& name, ResNetOptions options = {});

}  // namespace dettrial::vision::models

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

/// torchvision's `conv3x3`: padding as the dilation, no bias.
inline torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t groups, std::int64_t dilation) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(dilation).groups(groups).bias(false).dilation(dilation));
}

/// torchvision's `conv1x1`: no bias.
inline torch::nn::Conv2d conv1x1(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

/// torchvision's default `norm_layer`, nn.BatchNorm2d(planes): as a SyncBatchNorm without a
/// communicator, which normalizes as BatchNorm2d until convert_sync_batchnorm gives it one.
inline nn::SyncBatchNorm norm2d(std::int64_t planes) { return nn::SyncBatchNorm(torch::nn::BatchNormOptions(planes)); }

/// The block's downsample, deeply copied (or none).
inline torch::nn::Sequential cloned_downsample(const torch::nn::Sequential& downsample) {
  if (!downsample) return torch::nn::Sequential(nullptr);
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(downsample->clone()));
}

}  // namespace dettrial::detail

namespace dettrial::vision::models {

DETTRIAL_INLINE BasicBlockImpl::BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                               torch::nn::Sequential downsample, std::int64_t groups, std::int64_t base_width,
                                               std::int64_t dilation)
    : inplanes_(inplanes), planes_(planes), stride_(stride), groups_(groups), base_width_(base_width), dilation_(dilation) {
  if (groups != 1 || base_width != 64)
    throw ConfigError("vision::models: BasicBlock only supports groups 1 and width_per_group 64 (got " + std::to_string(groups) + " and " +
                      std::to_string(base_width) + "), as torchvision's; use a Bottleneck network (resnet50 and deeper)");
  if (dilation > 1)
    throw ConfigError("vision::models: BasicBlock does not support dilation (replace_stride_with_dilation), as torchvision's does not");
  // Registered in torchvision's attribute order: the order of the module tree and of the initialisation.
  conv1 = register_module("conv1", detail::conv3x3(inplanes, planes, stride, 1, 1));
  bn1 = register_module("bn1", detail::norm2d(planes));
  conv2 = register_module("conv2", detail::conv3x3(planes, planes, 1, 1, 1));
  bn2 = register_module("bn2", detail::norm2d(planes));
  if (downsample) this->downsample = register_module("downsample", std::move(downsample));
}

DETTRIAL_INLINE torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1(conv1(x)));
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

DETTRIAL_INLINE BottleneckImpl::BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                               torch::nn::Sequential downsample, std::int64_t groups, std::int64_t base_width,
                                               std::int64_t dilation)
    : inplanes_(inplanes), planes_(planes), stride_(stride), groups_(groups), base_width_(base_width), dilation_(dilation) {
  // torchvision's int(planes * (base_width / 64.0)) * groups.
  const auto width = static_cast<std::int64_t>(static_cast<double>(planes) * (static_cast<double>(base_width) / 64.0)) * groups;
  conv1 = register_module("conv1", detail::conv1x1(inplanes, width, 1));
  bn1 = register_module("bn1", detail::norm2d(width));
  conv2 = register_module("conv2", detail::conv3x3(width, width, stride, groups, dilation));
  bn2 = register_module("bn2", detail::norm2d(width));
  conv3 = register_module("conv3", detail::conv1x1(width, planes * expansion, 1));
  bn3 = register_module("bn3", detail::norm2d(planes * expansion));
  if (downsample) this->downsample = register_module("downsample", std::move(downsample));
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> BasicBlockImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        return std::make_shared<BasicBlockImpl>(inplanes_, planes_, stride_, detail::cloned_downsample(downsample), groups_, base_width_,
                                                dilation_);
      },
      device);
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> BottleneckImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        return std::make_shared<BottleneckImpl>(inplanes_, planes_, stride_, detail::cloned_downsample(downsample), groups_, base_width_,
                                                dilation_);
      },
      device);
}

DETTRIAL_INLINE torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1(conv1(x)));
  out = torch::relu(bn2(conv2(out)));
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

DETTRIAL_INLINE ResNetImpl::ResNetImpl(ResNetBlock block, std::array<std::int64_t, 4> layers, ResNetOptions options)
    : block_(block), layers_(layers), options_(options), groups_(options.groups), base_width_(options.width_per_group) {
  for (const std::int64_t blocks : layers)
    if (blocks < 1)
      throw ConfigError("vision::models: every layer of a ResNet needs at least one block (got " + std::to_string(blocks) + ")");
  if (options.num_classes < 1)
    throw ConfigError("vision::models: num_classes must be at least 1 (got " + std::to_string(options.num_classes) + ")");
  if (groups_ < 1 || base_width_ < 1)
    throw ConfigError("vision::models: groups and width_per_group must be at least 1 (got " + std::to_string(groups_) + " and " +
                      std::to_string(base_width_) + ")");
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, inplanes_, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", detail::norm2d(inplanes_));
  maxpool = register_module("maxpool", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  layer1 = register_module("layer1", make_layer(64, layers[0], 1, false));
  layer2 = register_module("layer2", make_layer(128, layers[1], 2, options.replace_stride_with_dilation[0]));
  layer3 = register_module("layer3", make_layer(256, layers[2], 2, options.replace_stride_with_dilation[1]));
  layer4 = register_module("layer4", make_layer(512, layers[3], 2, options.replace_stride_with_dilation[2]));
  avgpool = register_module("avgpool", torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({1, 1})));
  fc = register_module("fc", torch::nn::Linear(512 * expansion(), options.num_classes));
  initialise(options.zero_init_residual);
}

DETTRIAL_INLINE torch::nn::Sequential ResNetImpl::make_layer(std::int64_t planes, std::int64_t blocks, std::int64_t stride, bool dilate) {
  const std::int64_t expansion = this->expansion();
  const std::int64_t previous_dilation = dilation_;
  if (dilate) {
    dilation_ *= stride;
    stride = 1;
  }
  // As torchvision: the shortcut's layers are made before the block's (the order the random
  // initialisation of the modules draws in).
  torch::nn::Sequential downsample{nullptr};
  if (stride != 1 || inplanes_ != planes * expansion)
    downsample = torch::nn::Sequential(detail::conv1x1(inplanes_, planes * expansion, stride), detail::norm2d(planes * expansion));
  torch::nn::Sequential layer;
  auto add = [&](std::int64_t block_stride, torch::nn::Sequential block_downsample, std::int64_t dilation) {
    if (block_ == ResNetBlock::basic)
      layer->push_back(BasicBlock(inplanes_, planes, block_stride, std::move(block_downsample), groups_, base_width_, dilation));
    else layer->push_back(Bottleneck(inplanes_, planes, block_stride, std::move(block_downsample), groups_, base_width_, dilation));
  };
  add(stride, std::move(downsample), previous_dilation);
  inplanes_ = planes * expansion;
  for (std::int64_t i = 1; i < blocks; ++i) add(1, torch::nn::Sequential(nullptr), dilation_);
  return layer;
}

DETTRIAL_INLINE void ResNetImpl::initialise(bool zero_init_residual) {
  torch::NoGradGuard no_grad;
  // torchvision's loop over self.modules(): the same modules in the same order (pre-order, as registered).
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* norm = module->as<nn::SyncBatchNorm>()) {
      torch::nn::init::constant_(norm->weight, 1);
      torch::nn::init::constant_(norm->bias, 0);
    }
  }
  if (!zero_init_residual) return;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* bottleneck = module->as<BottleneckImpl>()) torch::nn::init::constant_(bottleneck->bn3->weight, 0);
    if (auto* basic = module->as<BasicBlockImpl>()) torch::nn::init::constant_(basic->bn2->weight, 0);
  }
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> ResNetImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        auto copy = std::make_shared<ResNetImpl>(block_, layers_, options_);
        // The classifier as it is now: fine-tuning replaces it (`replace_module("fc", ...)`).
        copy->fc = copy->replace_module("fc", std::dynamic_pointer_cast<torch::nn::LinearImpl>(fc->clone()));
        return copy;
      },
      device);
}

DETTRIAL_INLINE torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = maxpool(torch::relu(bn1(conv1(x))));
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  return fc(torch::flatten(avgpool(x), 1));
}

DETTRIAL_INLINE ResNet resnet18(ResNetOptions options) {
  return ResNet(ResNetBlock::basic, std::array<std::int64_t, 4>{2, 2, 2, 2}, options);
}
DETTRIAL_INLINE ResNet resnet34(ResNetOptions options) {
  return ResNet(ResNetBlock::basic, std::array<std::int64_t, 4>{3, 4, 6, 3}, options);
}
DETTRIAL_INLINE ResNet resnet50(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 4, 6, 3}, options);
}
DETTRIAL_INLINE ResNet resnet101(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 4, 23, 3}, options);
}
DETTRIAL_INLINE ResNet resnet152(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 8, 36, 3}, options);
}
DETTRIAL_INLINE ResNet resnext50_32x4d(ResNetOptions options) {
  options.groups = 32;
  options.width_per_group = 4;
  return resnet50(options);
}
DETTRIAL_INLINE ResNet wide_resnet50_2(ResNetOptions options) {
  options.width_per_group = 64 * 2;
  return resnet50(options);
}

DETTRIAL_INLINE const std::vector<std::string>& resnet_architectures() {
  static const std::vector<std::string> names{"resnet18",  "resnet34",        "resnet50",       "resnet101",
                                              "resnet152", "resnext50_32x4d", "wide_resnet50_2"};
  return names;
}

DETTRIAL_INLINE ResNet resnet(const std::string& name, ResNetOptions options) {
  if (name == "resnet18") return resnet18(options);
  if (name == "resnet34") return resnet34(options);
  if (name == "resnet50") return resnet50(options);
  if (name == "resnet101") return resnet101(options);
  if (name == "resnet152") return resnet152(options);
  if (name == "resnext50_32x4d") return resnext50_32x4d(options);
  if (name == "wide_resnet50_2") return wide_resnet50_2(options);
  std::string known;
  for (const auto& n : resnet_architectures()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("vision::models: no architecture named '" + name + "' (dettrial builds " + known + ")");
}

}  // namespace dettrial::vision::models

#endif  // DETTRIAL_HEADER_DEFINITIONS
// ---- end dettrial/vision/resnet.hpp
// ---- end dettrial/vision.hpp
