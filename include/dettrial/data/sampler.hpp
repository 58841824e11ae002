// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The sampler chain: which records make up each batch a rank reads, with Determined's order of
/// operations (shuffle per epoch, batch, repeat, shard by rank, skip) and O(1) random access.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/torch.h>

#include "../error.hpp"
#include "../detail/random.hpp"
#include "../detail/linkage.hpp"

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
};

/// The records of one batch: `count` positions of the epoch's order starting at `first`.
struct BatchSlice {
  std::int64_t epoch = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  /// The record indices (int64, CPU) when the order is shuffled; undefined for the identity order.
  torch::Tensor indices;
};

/**
 * @brief Record order and batching for one dataset size, with Determined's sampler semantics.
 *
 * Epoch `e`'s order is a permutation drawn from (seed, e) alone (or the identity without shuffling),
 * so any batch of any epoch can be computed on its own: that is what makes skipping O(1) and
 * prefetching order-preserving. Batches of the endless (repeated) stream are numbered globally and
 * dealt out to ranks by stride, like Determined's Repeat → DistributedBatch → Skip chain.
 */
class BatchSampler {
 public:
  BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle, std::uint64_t seed);

  std::int64_t records() const { return records_; }
  std::int64_t batch_size() const { return batch_size_; }
  bool shuffle() const { return shuffle_; }
  std::uint64_t seed() const { return seed_; }
  /// Changes the shuffle seed (a resumed trial gets back the order it was trained with).
  void set_seed(std::uint64_t seed);

  /// Batches in one epoch, before sharding.
  std::int64_t batches_per_epoch() const {
    return drop_last_ ? records_ / batch_size_ : (records_ + batch_size_ - 1) / batch_size_;
  }
  /// Batches one rank reads per epoch: Determined's `len(DistributedBatchSampler)`, `len//n + (len%n > rank)`.
  std::int64_t batches_for(const LoaderChain& chain) const;

  /// Batch `global` of the endless stream of epochs (batch `global % len` of epoch `global / len`).
  BatchSlice global_batch(std::int64_t global) const;

  /**
   * @brief The slices a rank reads under `chain`: Determined's chain, as views. The global batches of
   * the epochs (endless when repeating, one epoch otherwise), this rank's share of them (every
   * `num_replicas`-th, from its rank on), without the first `skip` of those. A random-access view:
   * skipping costs nothing, and the loader's workers read any position of it.
   */
  auto slices(const LoaderChain& chain) const {
    namespace views = ranges::views;
    const std::int64_t global_end = chain.repeat ? std::numeric_limits<std::int64_t>::max() : batches_per_epoch();
    return views::iota(std::int64_t{0}, global_end)                                   // repeat (or one epoch)
           | views::drop(chain.rank) | views::stride(chain.num_replicas)            // shard
           | views::drop(chain.skip)                                                  // skip
           | views::transform([self = *this](std::int64_t global) { return self.global_batch(global); });
  }

  /// The order of epoch `e` (a permutation of the records; computed once and kept for the last epochs used).
  torch::Tensor order(std::int64_t epoch) const;

 private:
  static std::uint64_t mix(std::uint64_t seed, std::uint64_t epoch) { return detail::mix64(seed ^ (epoch * detail::golden_gamma)); }
  // Two epochs are live at an epoch boundary while prefetching; shared by copies of the sampler.
  struct Cache {
    std::mutex mutex;
    std::array<std::pair<std::int64_t, torch::Tensor>, 2> orders{};
    std::size_t next = 0;
  };

  std::int64_t records_;
  std::int64_t batch_size_;
  bool drop_last_;
  bool shuffle_;
  std::uint64_t seed_;
  std::shared_ptr<Cache> cache_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle,
                                           std::uint64_t seed)
    : records_(records), batch_size_(batch_size), drop_last_(drop_last), shuffle_(shuffle), seed_(seed),
      cache_(std::make_shared<Cache>()) {
  if (batch_size_ < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size_));
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  if (drop_last_ && batch_size_ > records_)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size_) + " is larger than the dataset's " +
                    std::to_string(records_) + " records, so drop_last leaves no batch");
}

DETTRIAL_INLINE void BatchSampler::set_seed(std::uint64_t seed) {
  seed_ = seed;
  cache_ = std::make_shared<Cache>();
}

DETTRIAL_INLINE std::int64_t BatchSampler::batches_for(const LoaderChain& chain) const {
  const std::int64_t len = batches_per_epoch();
  return len / chain.num_replicas + (len % chain.num_replicas > chain.rank ? 1 : 0);
}

DETTRIAL_INLINE BatchSlice BatchSampler::global_batch(std::int64_t global) const {
  const std::int64_t len = batches_per_epoch();
  BatchSlice s;
  s.epoch = global / len;
  s.first = (global % len) * batch_size_;
  s.count = std::min(batch_size_, records_ - s.first);
  if (shuffle_) s.indices = order(s.epoch).narrow(0, s.first, s.count);
  return s;
}

DETTRIAL_INLINE torch::Tensor BatchSampler::order(std::int64_t epoch) const {
  std::lock_guard lock(cache_->mutex);
  for (const auto& [e, perm] : cache_->orders)
    if (e == epoch && perm.defined()) return perm;
  auto generator = at::detail::createCPUGenerator(mix(seed_, static_cast<std::uint64_t>(epoch)));
  torch::Tensor perm = torch::randperm(records_, generator, torch::TensorOptions().dtype(torch::kLong));
  cache_->orders[cache_->next] = {epoch, perm};
  cache_->next = (cache_->next + 1) % cache_->orders.size();
  return perm;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
