// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's automatic augmentation policies on 8-bit images: AutoAugment (its ImageNet,
/// CIFAR-10 and SVHN policies), RandAugment and TrivialAugmentWide, with torchvision's operations
/// (image_ops.hpp, bit for bit) and magnitude tables (computed with LibTorch's linspace, as
/// torchvision computes them); the draws come from the record's RecordRandom, so a record is
/// augmented the same way on any worker, rank count or resume.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "../detail/linkage.hpp"
#include "image.hpp"
#include "image_ops.hpp"

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

#include "../error.hpp"

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
