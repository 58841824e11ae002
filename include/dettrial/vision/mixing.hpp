// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's batch transforms MixUp and CutMix (and RandomChoice between them): each image
/// mixed with the batch's previous one (torchvision's `roll(1, 0)` pairing) and the labels made soft
/// in the same proportion, for a loss that takes class probabilities (cross-entropy does, with label
/// smoothing too). ImageDataset applies one to each batch it makes, as torchvision's reference
/// recipe applies it in the loader's collate, with draws keyed by (seed, epoch, the batch's first
/// record), so a resumed run mixes the same batches the same way.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "image.hpp"

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

#include "../error.hpp"

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
