// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batches moved to the device one ahead: while the GPU computes batch k, batch k+1 copies on
/// a stream of its own.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <optional>
#include <ranges>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>

#include "to_device.hpp"

// DETTRIAL_HAS_CUDA: LibTorch is CUDA-built (dettrial's CMake defines it).
#if defined(DETTRIAL_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dettrial::detail {

/**
 * @brief Reads a batch stream (which it holds) with one batch staged on the device ahead of the one
 * in use.
 *
 * `stage()` takes the stream's next batch and starts its copy to the device; `take()` hands over the
 * staged batch (staging it first if none is) once its copy is done on the device's queue, without the
 * host waiting. On a CUDA device the copy runs on a side stream: the compute stream waits for it with
 * an event, and each copied tensor is marked as used by the compute stream, so its memory is not reused
 * while kernels still read it. Elsewhere, and for batches holding user types, the batch is moved as
 * `to_device_in_place` moves it, on the compute stream.
 *
 * The caller decides when to stage: the trainer stages the next batch only when it will train it
 * right away, never across a boundary, so batches are read from the stream in the same order relative
 * to the training steps as without staging (a checkpoint never follows a read that was not trained).
 */
template <std::ranges::input_range Stream>
class CopyAhead {
 public:
  using batch_type = std::remove_cvref_t<std::ranges::range_reference_t<Stream>>;

  CopyAhead(Stream stream, torch::Device device)
      : stream_(std::move(stream)), it_(std::ranges::begin(stream_)), end_(std::ranges::end(stream_)), device_(device) {
#if defined(DETTRIAL_HAS_CUDA)
    // A batch with tensors for_each_tensor cannot reach (inside a user type) is copied on the compute
    // stream: its tensors could not be marked as used there.
    if (device_.is_cuda() && tensors_only_batch<batch_type>())
      copy_stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
#endif
  }

  // Its iterator points into the stream it holds.
  CopyAhead(const CopyAhead&) = delete;
  CopyAhead& operator=(const CopyAhead&) = delete;

  /// Whether the stream has a next batch to stage (staged or not).
  bool has_next() const { return staged_.has_value() || it_ != end_; }

  /// Reads the stream's next batch and starts its copy to the device; nothing when one is staged
  /// already or the stream has ended.
  void stage() {
    if (staged_ || it_ == end_) return;
    batch_type batch = std::move(*it_);  // a stream's batch is read once: taken, not copied
    ++it_;
#if defined(DETTRIAL_HAS_CUDA)
    if (copy_stream_) {
      const c10::cuda::CUDAStreamGuard on_copy_stream(*copy_stream_);
      to_device_in_place(batch, device_, /*non_blocking=*/true);
      copied_.record(*copy_stream_);
      staged_.emplace(std::move(batch));
      return;
    }
#endif
    to_device_in_place(batch, device_, /*non_blocking=*/device_.is_cuda());
    staged_.emplace(std::move(batch));
  }

  /// The staged batch (staged now if none was), its copy ordered before the compute stream's next work.
  batch_type take() {
    stage();
    if (!staged_) throw std::logic_error("CopyAhead::take: the batch stream has ended");
    batch_type batch = std::move(*staged_);
    staged_.reset();
#if defined(DETTRIAL_HAS_CUDA)
    if (copy_stream_) {
      const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
      copied_.block(compute);
      // Memory allocated on the copy stream is otherwise free for it again as soon as the batch dies,
      // while the compute stream may still be reading it.
      for_each_tensor(batch, [&](torch::Tensor& t) {
        if (t.defined() && t.is_cuda()) t.record_stream(compute);
      });
    }
#endif
    return batch;
  }

 private:
  Stream stream_;
  std::ranges::iterator_t<Stream> it_;
  std::ranges::sentinel_t<Stream> end_;
  torch::Device device_;
  std::optional<batch_type> staged_;
#if defined(DETTRIAL_HAS_CUDA)
  std::optional<c10::cuda::CUDAStream> copy_stream_;
  at::cuda::CUDAEvent copied_;
#endif
};

template <class Stream>
CopyAhead(Stream&&, torch::Device) -> CopyAhead<std::remove_cvref_t<Stream>>;

}  // namespace dettrial::detail
