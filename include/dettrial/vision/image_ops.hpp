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
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "image.hpp"

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

#include "../error.hpp"

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
