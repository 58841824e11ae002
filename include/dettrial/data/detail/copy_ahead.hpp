// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batches moved to the device one ahead: while the GPU computes batch k, batch k+1 copies on
/// a stream of its own.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <memory>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>

#include "../../detail/linkage.hpp"
#include "../../detail/scope_exit.hpp"
#include "../to_device.hpp"

namespace dettrial::detail {

/**
 * @brief A CUDA stream of its own for copies to the device, and the event that orders the compute
 * stream after them. Compiled once (dettrial::compiled in separate-compilation mode), so that a
 * trial's translation unit reads no CUDA header. Made only for a CUDA device with a CUDA-built
 * LibTorch; CopyAhead copies on the compute stream without one.
 */
class SideCopyStream {
 public:
  /// A side stream on `device` (a CUDA device).
  DETTRIAL_INLINE explicit SideCopyStream(torch::Device device);
  DETTRIAL_INLINE ~SideCopyStream();
  SideCopyStream(const SideCopyStream&) = delete;
  SideCopyStream& operator=(const SideCopyStream&) = delete;

  /// Whether side streams exist in this build (LibTorch is CUDA-built).
  DETTRIAL_INLINE static bool available();
  /// Makes the side stream current, until leave().
  DETTRIAL_INLINE void enter();
  /// Marks the copies queued on the side stream so far, for order_compute_after().
  DETTRIAL_INLINE void record_copies();
  /// Makes the stream current before enter() current again.
  DETTRIAL_INLINE void leave() noexcept;
  /// Makes the device's compute stream wait for the recorded copies (the host does not wait), and
  /// returns that stream, for the tensors it will read (Tensor::record_stream).
  DETTRIAL_INLINE c10::Stream order_compute_after();

 private:
  /// The stream, the event and the stream guard (CUDA types, complete where compiled).
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  torch::Device device_;
};

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
    // A batch with tensors for_each_tensor cannot reach (inside a user type) is copied on the compute
    // stream: its tensors could not be marked as used there.
    if (device_.is_cuda() && tensors_only_batch<batch_type>() && SideCopyStream::available()) copy_stream_.emplace(device_);
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
    if (copy_stream_) {
      copy_stream_->enter();
      const auto back = on_scope_exit([&] { copy_stream_->leave(); });
      to_device_in_place(batch, device_, /*non_blocking=*/true);
      copy_stream_->record_copies();
      staged_.emplace(std::move(batch));
      return;
    }
    to_device_in_place(batch, device_, /*non_blocking=*/device_.is_cuda());
    staged_.emplace(std::move(batch));
  }

  /// The staged batch (staged now if none was), its copy ordered before the compute stream's next work.
  batch_type take() {
    stage();
    if (!staged_) throw std::logic_error("CopyAhead::take: the batch stream has ended");
    batch_type batch = std::move(*staged_);
    staged_.reset();
    if (copy_stream_) {
      const c10::Stream compute = copy_stream_->order_compute_after();
      // Memory allocated on the copy stream is otherwise free for it again as soon as the batch dies,
      // while the compute stream may still be reading it.
      for_each_tensor(batch, [&](torch::Tensor& t) {
        if (t.defined() && t.is_cuda()) t.record_stream(compute);
      });
    }
    return batch;
  }

 private:
  Stream stream_;
  std::ranges::iterator_t<Stream> it_;
  std::ranges::sentinel_t<Stream> end_;
  torch::Device device_;
  std::optional<batch_type> staged_;
  std::optional<SideCopyStream> copy_stream_;
};

template <class Stream>
CopyAhead(Stream&&, torch::Device) -> CopyAhead<std::remove_cvref_t<Stream>>;

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
// DETTRIAL_HAS_CUDA: LibTorch is CUDA-built (dettrial's CMake defines it).
#if defined(DETTRIAL_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dettrial::detail {

#if defined(DETTRIAL_HAS_CUDA)
struct SideCopyStream::Cuda {
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAEvent copied{};
  std::optional<c10::cuda::CUDAStreamGuard> on_stream{};
};
DETTRIAL_INLINE SideCopyStream::SideCopyStream(torch::Device device)
    // Built in place: the guard it holds cannot be moved.
    : cuda_(new Cuda{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())}), device_(device) {}
DETTRIAL_INLINE bool SideCopyStream::available() { return true; }
DETTRIAL_INLINE void SideCopyStream::enter() { cuda_->on_stream.emplace(cuda_->stream); }
DETTRIAL_INLINE void SideCopyStream::record_copies() { cuda_->copied.record(cuda_->stream); }
DETTRIAL_INLINE void SideCopyStream::leave() noexcept { cuda_->on_stream.reset(); }
DETTRIAL_INLINE c10::Stream SideCopyStream::order_compute_after() {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  cuda_->copied.block(compute);
  return compute;
}
#else
struct SideCopyStream::Cuda {};
DETTRIAL_INLINE SideCopyStream::SideCopyStream(torch::Device device) : device_(device) {}
DETTRIAL_INLINE bool SideCopyStream::available() { return false; }
DETTRIAL_INLINE void SideCopyStream::enter() {}
DETTRIAL_INLINE void SideCopyStream::record_copies() {}
DETTRIAL_INLINE void SideCopyStream::leave() noexcept {}
DETTRIAL_INLINE c10::Stream SideCopyStream::order_compute_after() { return c10::Stream(c10::Stream::DEFAULT, device_); }
#endif
DETTRIAL_INLINE SideCopyStream::~SideCopyStream() = default;

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
