// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `determined.pytorch.samplers`, for loaders and batch samplers a trial writes
/// itself: the reproducible shuffle, and the chain steps repeat, distribute (shard by rank) and skip
/// as range-v3 views with O(1) random access. dettrial's own loader reads its batches through them.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/range/traits.hpp>
#include <range/v3/view/all.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "../detail/random.hpp"

namespace dettrial {

/**
 * @brief A sampler: the record order of epoch `e` (Python's `DataLoader(sampler=...)`), a 1-D tensor
 * of record indices (int64; other integer types are converted). It may leave records out or repeat
 * them (weighted sampling), but every epoch must have the same length, and it must be a function of
 * the epoch (the same order whenever it is asked, and on every rank): skipping to a resumed position
 * recomputes an epoch instead of replaying the ones before it.
 */
using SamplerFunction = std::function<torch::Tensor(std::int64_t epoch)>;

/**
 * @brief A batch sampler: the batches of epoch `e` (Python's `DataLoader(batch_sampler=...)`), each a
 * 1-D tensor of record indices; batches may differ in size, but every epoch must have the same number
 * of them. Like a SamplerFunction, a function of the epoch.
 */
using BatchSamplerFunction = std::function<std::vector<torch::Tensor>(std::int64_t epoch)>;

/// Determined's `determined.pytorch.samplers`, with the epoch made explicit so that any batch of any
/// epoch can be computed on its own (O(1) skipping).
}  // namespace dettrial

namespace dettrial::samplers {

/**
 * @brief Determined's `ReproducibleShuffleSampler`: the record order of epoch `e` is a permutation
 * drawn from (seed, e) alone, the very permutation dettrial's `DataLoader{.shuffle = true, .seed = seed}`
 * uses. Usable directly as `DataLoaderOptions::sampler`; over an inner sampler it shuffles that
 * sampler's order of each epoch (Determined's `ReproducibleShuffleSampler(sampler, seed)`).
 * @code{.cpp}
 * dettrial::DataLoader loader(dataset, {.batch_size = 32,
 *                                       .sampler = dettrial::samplers::ReproducibleShuffleSampler(dataset.size(), seed)});
 * @endcode
 */
class ReproducibleShuffleSampler {
 public:
  /// Shuffles the records `0 .. records-1`.
  ReproducibleShuffleSampler(std::int64_t records, std::uint64_t seed);
  /// Shuffles `inner(e)`, the order another sampler gives epoch `e`.
  ReproducibleShuffleSampler(SamplerFunction inner, std::uint64_t seed);

  /// The record order of epoch `epoch` (CPU; int64, or the inner sampler's integer type).
  torch::Tensor operator()(std::int64_t epoch) const;
  std::uint64_t seed() const { return seed_; }

  /// The permutation of `0 .. n-1` for (seed, epoch): one CPU generator seeded from both, one randperm.
  static torch::Tensor permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

 private:
  std::int64_t records_ = 0;
  SamplerFunction inner_;
  std::uint64_t seed_;
};

/// Determined's `len(DistributedBatchSampler)`: of `length` items, rank `rank` of `num_replicas` takes
/// `length // num_replicas + (length % num_replicas > rank)`.
constexpr std::int64_t distributed_length(std::int64_t length, std::int64_t num_replicas, std::int64_t rank) {
  return length / num_replicas + (length % num_replicas > rank ? 1 : 0);
}

}  // namespace dettrial::samplers

namespace dettrial::samplers::detail {
/// Item `k` of a stream of epochs: `batch_of(k / batches_per_epoch, k % batches_per_epoch)`.
template <class BatchOf>
struct EpochBatch {
  std::int64_t batches_per_epoch;
  BatchOf batch_of;
  auto operator()(std::int64_t k) const { return batch_of(k / batches_per_epoch, k % batches_per_epoch); }
};

/// `end` items of the stream of epochs (the type repeat and one_epoch share).
template <class BatchOf>
auto epochs(std::int64_t batches_per_epoch, BatchOf batch_of, std::int64_t end) {
  return ranges::views::iota(std::int64_t{0}, end) | ranges::views::transform(EpochBatch<BatchOf>{batches_per_epoch, std::move(batch_of)});
}

/// A fixed sequence of batches, kept for repeat: a view of an lvalue (or the view itself), or the
/// container moved into shared ownership.
template <class R>
auto hold(R&& batches) {
  if constexpr (std::is_lvalue_reference_v<R> || ranges::view_<std::remove_cvref_t<R>>) return ranges::views::all(std::forward<R>(batches));
  else return std::make_shared<const std::remove_cvref_t<R>>(std::forward<R>(batches));
}

template <class T>
inline constexpr bool is_shared_ptr = false;
template <class T>
inline constexpr bool is_shared_ptr<std::shared_ptr<T>> = true;

/// Batch `index` of a held sequence, whatever the epoch (a copy: a tensor costs a reference count).
template <class Held, class Value>
struct HeldBatch {
  Held held;
  Value operator()(std::int64_t /*epoch*/, std::int64_t index) const {
    if constexpr (is_shared_ptr<Held>) return Value(ranges::begin(*held)[index]);
    else return Value(ranges::begin(held)[index]);
  }
};

DETTRIAL_INLINE void check_batches_per_epoch(std::int64_t batches_per_epoch, const char* who);
DETTRIAL_INLINE void check_replicas(std::int64_t num_replicas, std::int64_t rank);
DETTRIAL_INLINE void check_skip(std::int64_t skip);
}  // namespace dettrial::samplers::detail

namespace dettrial::samplers {
/**
 * @brief Determined's `RepeatBatchSampler` (and `RepeatSampler`): epoch after epoch, endlessly.
 * - `samplers::repeat(batches_per_epoch, batch_of)`: batch `k` of the stream is
 *   `batch_of(k / batches_per_epoch, k % batches_per_epoch)`, so each epoch may differ (a shuffle).
 * - `batches | samplers::repeat` (or `samplers::repeat(batches)`): a fixed sequence (random access,
 *   sized), the same every epoch. An lvalue is viewed (keep it alive), an rvalue container is kept.
 * Random access: position `k` costs one call, whatever `k`.
 */
struct repeat_fn {
  template <class BatchOf>
    requires std::invocable<const BatchOf&, std::int64_t, std::int64_t>
  auto operator()(std::int64_t batches_per_epoch, BatchOf batch_of) const {
    detail::check_batches_per_epoch(batches_per_epoch, "repeat");
    return detail::epochs(batches_per_epoch, std::move(batch_of), std::numeric_limits<std::int64_t>::max());
  }
  template <class R>
    requires ranges::random_access_range<R> && ranges::sized_range<R>
  auto operator()(R&& batches) const {
    const auto n = static_cast<std::int64_t>(ranges::size(batches));
    using Held = decltype(detail::hold(std::forward<R>(batches)));
    return (*this)(n, detail::HeldBatch<Held, ranges::range_value_t<R>>{detail::hold(std::forward<R>(batches))});
  }
  template <class R>
    requires ranges::random_access_range<R> && ranges::sized_range<R>
  friend auto operator|(R&& batches, const repeat_fn& self) {
    return self(std::forward<R>(batches));
  }
};
/// See repeat_fn.
inline constexpr repeat_fn repeat{};

/// One epoch of `batch_of(0, index)`: the chain without repeat (validation). The same view type as
/// `samplers::repeat(batches_per_epoch, batch_of)`, so either can be chosen at run time.
struct one_epoch_fn {
  template <class BatchOf>
    requires std::invocable<const BatchOf&, std::int64_t, std::int64_t>
  auto operator()(std::int64_t batches_per_epoch, BatchOf batch_of) const {
    detail::check_batches_per_epoch(batches_per_epoch, "one_epoch");
    return detail::epochs(batches_per_epoch, std::move(batch_of), batches_per_epoch);
  }
};
/// See one_epoch_fn.
inline constexpr one_epoch_fn one_epoch{};

/**
 * @brief Determined's `DistributedBatchSampler` (and `DistributedSampler`): rank `rank` of
 * `num_replicas` takes every `num_replicas`-th item, starting at item `rank`. A view adaptor:
 * `stream | samplers::distribute(num_replicas, rank)`; over a sized sequence its length is
 * `distributed_length(size, num_replicas, rank)`. Apply it after repeat (Determined's rule: shard the
 * endless stream, so ranks never drift apart at epoch ends).
 */
struct distribute_fn {
  auto operator()(std::int64_t num_replicas, std::int64_t rank) const {
    detail::check_replicas(num_replicas, rank);
    return ranges::views::drop(rank) | ranges::views::stride(num_replicas);
  }
};
/// See distribute_fn.
inline constexpr distribute_fn distribute{};

/**
 * @brief Determined's `SkipBatchSampler` (and `SkipSampler`): passes over the first `n` items. A view
 * adaptor: `stream | samplers::skip(n)`; on a random-access stream nothing of the skipped items is
 * computed. Apply it last, after repeat and distribute, counting this rank's batches (Determined's
 * `steps_completed`).
 */
struct skip_fn {
  auto operator()(std::int64_t n) const {
    detail::check_skip(n);
    return ranges::views::drop(n);
  }
};
/// See skip_fn.
inline constexpr skip_fn skip{};

}  // namespace dettrial::samplers

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

#include <ATen/CPUGeneratorImpl.h>

namespace dettrial::samplers {

DETTRIAL_INLINE ReproducibleShuffleSampler::ReproducibleShuffleSampler(std::int64_t records, std::uint64_t seed)
    : records_(records), seed_(seed) {
  if (records_ < 0) throw DataError("samplers::ReproducibleShuffleSampler: cannot shuffle " + std::to_string(records_) + " records");
}

DETTRIAL_INLINE ReproducibleShuffleSampler::ReproducibleShuffleSampler(SamplerFunction inner, std::uint64_t seed)
    : inner_(std::move(inner)), seed_(seed) {
  if (!inner_) throw DataError("samplers::ReproducibleShuffleSampler: the inner sampler is empty");
}

DETTRIAL_INLINE torch::Tensor ReproducibleShuffleSampler::operator()(std::int64_t epoch) const {
  if (!inner_) return permutation(records_, seed_, epoch);
  const torch::Tensor order = inner_(epoch);
  if (!order.defined() || order.dim() != 1)
    throw DataError("samplers::ReproducibleShuffleSampler: the inner sampler must return a 1-D tensor of record indices (epoch " +
                    std::to_string(epoch) + ")");
  return order.to(torch::kCPU).index_select(0, permutation(order.size(0), seed_, epoch));
}

DETTRIAL_INLINE torch::Tensor ReproducibleShuffleSampler::permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  const std::uint64_t mixed = dettrial::detail::mix64(seed ^ (static_cast<std::uint64_t>(epoch) * dettrial::detail::golden_gamma));
  auto generator = at::detail::createCPUGenerator(mixed);
  return torch::randperm(n, generator, torch::TensorOptions().dtype(torch::kLong));
}

}  // namespace dettrial::samplers

namespace dettrial::samplers::detail {
DETTRIAL_INLINE void check_batches_per_epoch(std::int64_t batches_per_epoch, const char* who) {
  if (batches_per_epoch < 1)
    throw DataError(std::string("samplers::") + who + ": an epoch needs at least one batch, not " + std::to_string(batches_per_epoch));
}
DETTRIAL_INLINE void check_replicas(std::int64_t num_replicas, std::int64_t rank) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw DataError("samplers::distribute: rank " + std::to_string(rank) + " is not among " + std::to_string(num_replicas) + " replicas");
}
DETTRIAL_INLINE void check_skip(std::int64_t skip) {
  if (skip < 0) throw DataError("samplers::skip: cannot skip a negative number of batches (" + std::to_string(skip) + ")");
}
}  // namespace dettrial::samplers::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
