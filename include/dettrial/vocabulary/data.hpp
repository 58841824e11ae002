// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The data vocabulary: what a dataset and a data loader are to dettrial (concepts), and the
/// LoaderChain by which the trainer reads a loader.
#pragma once

#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include <torch/torch.h>

namespace dettrial {

/// How the trainer reads a loader: Determined's `get_data_loader(repeat, skip, num_replicas, rank)`.
struct LoaderChain {
  /// Endless epochs (training) or one pass (validation).
  bool repeat = false;
  /// Batches of this rank's stream to pass over (already trained); none of their records are read.
  std::int64_t skip = 0;
  /// Ranks sharing the data; rank `r` takes every `num_replicas`-th batch, starting at `r`.
  std::int64_t num_replicas = 1;
  std::int64_t rank = 0;
  /**
   * @brief The rank count whose global batches an endless stream keeps (0: `num_replicas`). A run
   * resumed on another rank count than it began with reads the global batches it would have read on
   * its first count: global batch `k` is that count's `k`-th batch of every rank, in rank order, and
   * rank `r` of `num_replicas` takes the `r`-th of `num_replicas` equal runs of its records (see
   * docs/distributed.md, "Elastic"). `skip` then counts global batches.
   */
  std::int64_t layout_replicas = 0;
};

/**
 * @brief Where a batch comes from in the loader's stream: its epoch and the loader's seed. A dataset
 * whose records are drawn at random as they are read (augmented images) keys its draws on it and on
 * the record index, so a record comes out the same whatever the workers, the ranks or a resume.
 */
struct BatchOrigin {
  std::int64_t epoch = 0;
  std::uint64_t seed = 0;
  /// The positions in the batch at which the next epoch begins: empty but for a batch regrouped
  /// across an epoch's end (LoaderChain::layout_replicas), whose records come from two epochs.
  std::span<const std::int64_t> epoch_starts{};
  /// The epoch of the batch's record at `position`.
  std::int64_t epoch_of(std::int64_t position) const {
    std::int64_t e = epoch;
    for (const std::int64_t start : epoch_starts) e += position >= start ? 1 : 0;
    return e;
  }
};

/// A dataset read one record at a time: `size()` records and `get(index)`.
template <class D>
concept ExampleDataset = requires(const D& d, std::int64_t i) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get(i);
};

/**
 * @brief A dataset read a batch at a time: `size()` records, and `get_batch(indices)` with a 1-D
 * int64 CPU tensor of record indices (vectorised: one gather per batch, not one call per record).
 * A dataset may also offer `get_range(begin, end)` for contiguous, unshuffled reads, and
 * `get_batch(indices, origin)` (BatchOrigin) to draw per-record randomness reproducibly; the loader
 * then calls that one. Either way a batch must not alias the dataset's storage: a trial may change
 * its batch in place.
 */
template <class D>
concept BatchDataset = requires(D& d, const torch::Tensor& indices) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get_batch(indices);
};

/**
 * @brief What the trainer needs of a data loader: `size()` batches per epoch, and `batches(chain)`,
 * the batches one rank reads under Determined's repeat / shard / skip chain (see LoaderChain).
 */
template <class L>
concept BatchLoader = requires(const L& l, const LoaderChain& chain) {
  { l.size() } -> std::convertible_to<std::int64_t>;
  { l.batches(chain) };
  requires std::ranges::input_range<decltype(l.batches(chain))>;
};

/// The batch type a loader yields.
template <BatchLoader L>
using batch_of = std::remove_cvref_t<std::ranges::range_reference_t<decltype(std::declval<const L&>().batches(LoaderChain{}))>>;

}  // namespace dettrial
