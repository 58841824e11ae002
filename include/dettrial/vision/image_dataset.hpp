// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Images decoded, augmented and written straight into batch tensors: the dataset a
/// DataLoader reads image files and CIFAR records through, on its worker threads.
#pragma once

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

#include "../vocabulary/data.hpp"
#include "../error.hpp"
#include "../process/threads.hpp"
#include "image.hpp"
#include "mixing.hpp"
#include "transforms.hpp"

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
