// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
#pragma once
#include "dettrial.hpp"
// ---- begin dettrial/samplers.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `determined.pytorch.samplers` chain for loaders and batch samplers a trial
/// writes itself: `samplers::repeat`, `distribute` and `skip` as range-v3 views with O(1) random
/// access, and `BatchSampler::slices`, dettrial's own loader's chain as such a view. Opt-in, next to
/// <dettrial/dettrial.hpp> (which has the sampler functions and `samplers::ReproducibleShuffleSampler`):
/// a trial that reads none of the views does not compile range-v3.


// ---- begin dettrial/data/sampler_views.hpp
// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `determined.pytorch.samplers` chain steps, for loaders and batch samplers a
/// trial writes itself: repeat, distribute (shard by rank) and skip as range-v3 views with O(1)
/// random access, and BatchSampler::slices, the loader's chain as such a view. Included by
/// <dettrial/samplers.hpp>, not by <dettrial/dettrial.hpp>: a trial that does not read them does not
/// compile range-v3 (the loader reads its chain directly, BatchSampler::chain_batch).

#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/range/traits.hpp>
#include <range/v3/view/all.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/transform.hpp>


namespace dettrial::detail {
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
}  // namespace dettrial::detail

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

namespace dettrial {
template <std::same_as<LoaderChain> Chain>
auto BatchSampler::slices(const Chain& chain) const {
  auto batch_of = [self = *this](std::int64_t epoch, std::int64_t index) { return self.batch(epoch, index); };
  auto epochs = chain.repeat ? samplers::repeat(batches_per_epoch_, batch_of) : samplers::one_epoch(batches_per_epoch_, batch_of);
  return std::move(epochs) | samplers::distribute(chain.num_replicas, chain.rank) | samplers::skip(chain.skip);
}
}  // namespace dettrial
// ---- end dettrial/data/sampler_views.hpp
// ---- end dettrial/samplers.hpp
