// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What orders an epoch's records: the sampler and batch-sampler functions a loader takes,
/// Determined's reproducible shuffle, and a rank's share of an epoch. The chain steps over them
/// (repeat, distribute, skip as range-v3 views) are in <dettrial/samplers.hpp>.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

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

namespace dettrial::detail {
// The chain's checks, with the sentences samplers::repeat, distribute and skip (and the loader) give.
DETTRIAL_INLINE void check_batches_per_epoch(std::int64_t batches_per_epoch, const char* who);
DETTRIAL_INLINE void check_replicas(std::int64_t num_replicas, std::int64_t rank);
DETTRIAL_INLINE void check_skip(std::int64_t skip);
}  // namespace dettrial::detail

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
  const std::uint64_t mixed = detail::mix64(seed ^ (static_cast<std::uint64_t>(epoch) * detail::golden_gamma));
  auto generator = at::detail::createCPUGenerator(mixed);
  return torch::randperm(n, generator, torch::TensorOptions().dtype(torch::kLong));
}

}  // namespace dettrial::samplers

namespace dettrial::detail {
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
}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
