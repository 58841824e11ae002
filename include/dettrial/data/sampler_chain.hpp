// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The sampler chain: which records make up each batch a rank reads, with Determined's order of
/// operations (an epoch's order, batch, repeat, shard by rank, skip) and O(1) random access. The
/// epoch's order is the built-in one (in order, or shuffled per epoch), a user's sampler's, or a
/// user's batch sampler's batches; the chain steps are those of sampler_views.hpp, computed directly.
#pragma once

#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../vocabulary/data.hpp"
#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "epoch_order.hpp"

namespace dettrial {

/**
 * @brief The shuffle seeds of the epochs of one pass, drawn from LibTorch's global CPU generator as
 * Python's `RandomSampler` draws them (one int64 `random_()` when the epoch's first batch is asked
 * for): the order Determined's `pytorch.DataLoader(shuffle=True)` reads, and every random draw after
 * it (dropout) as a Determined run makes them. The training thread draws; workers reading ahead wait.
 */
class EpochSeeds {
 public:
  /// A new pass (a new iterator in Python): nothing drawn yet.
  void reset();
  /// Draws, in order, the seeds of the epochs up to `epoch` that are not drawn yet.
  void draw_through(std::int64_t epoch);
  /// Epoch `epoch`'s seed, once it is drawn (blocks until then).
  std::uint64_t wait(std::int64_t epoch) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable drawn_;
  std::vector<std::uint64_t> seeds_;
};

/// The records of one batch: `count` positions of the epoch's order starting at `first`.
struct BatchSlice {
  std::int64_t epoch = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  /// The record indices (int64, CPU) when the order is shuffled or a user's sampler or batch sampler
  /// gives it; undefined for the identity order (records `first .. first+count-1`).
  torch::Tensor indices;
  /// A share of a regrouped global batch across an epoch's end: where in it each next epoch's records
  /// begin (`first` is then meaningless; `indices` holds the records). Empty otherwise.
  std::vector<std::int64_t> epoch_starts;
};

/**
 * @brief Record order and batching for one dataset size, with Determined's sampler semantics.
 *
 * Epoch `e`'s order is a permutation drawn from (seed, e) alone (or the identity without shuffling),
 * or what a user's sampler or batch sampler gives for `e`, so any batch of any epoch can be computed
 * on its own: that is what makes skipping O(1) and prefetching order-preserving. Batches of the
 * endless (repeated) stream are numbered globally and dealt out to ranks by stride, like Determined's
 * Repeat → DistributedBatch → Skip chain (samplers::repeat, samplers::distribute, samplers::skip).
 *
 * A shuffled or user-given epoch is computed once, on first use, and kept while it is read (the
 * last epochs used, enough for the loader's prefetch): a user's sampler is called at most once per
 * epoch read in order, never per batch, and never for epochs that a skip passes over whole (epoch 0
 * excepted, called by the constructor to learn the epoch's length).
 */
class BatchSampler {
 public:
  /// The built-in order: the records in order, or shuffled per epoch from (seed, epoch).
  BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle, std::uint64_t seed);
  /// A sampler's order of each epoch (Python's `sampler=`), cut into batches of `batch_size`.
  BatchSampler(std::int64_t records, SamplerFunction sampler, std::int64_t batch_size, bool drop_last, std::uint64_t seed);
  /// A batch sampler's batches of each epoch (Python's `batch_sampler=`).
  BatchSampler(std::int64_t records, BatchSamplerFunction batch_sampler, std::uint64_t seed);

  /// The dataset's records.
  std::int64_t records() const { return records_; }
  /// Records per batch (the last one of an epoch may be short); 0 with a batch sampler.
  std::int64_t batch_size() const { return batch_size_; }
  bool shuffle() const { return shuffle_; }
  bool has_sampler() const { return user_ && user_->sampler; }
  bool has_batch_sampler() const { return user_ && user_->batch_sampler; }
  std::uint64_t seed() const { return seed_; }
  /// Changes the shuffle seed (a resumed trial gets back the order it was trained with). A user's
  /// sampler does not depend on it: its cached epochs are kept.
  void set_seed(std::uint64_t seed);

  /// Batches in one epoch, before sharding.
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  /// Batches one rank reads per epoch: Determined's `len(DistributedBatchSampler)`, `len//n + (len%n > rank)`.
  std::int64_t batches_for(const LoaderChain& chain) const {
    return samplers::distributed_length(batches_per_epoch_, chain.num_replicas, chain.rank);
  }

  /// Batch `index` of epoch `epoch`.
  BatchSlice batch(std::int64_t epoch, std::int64_t index) const;
  /// Batch `global` of the endless stream of epochs (batch `global % len` of epoch `global / len`).
  BatchSlice global_batch(std::int64_t global) const;

  /// The same order cut into batches of `batch_size` (a batch sampler's batches are its own). It
  /// shares this sampler's epochs: a run resumed on another rank count reads the stream of the rank
  /// count it began with, whose batches are a different share of the same global batch.
  BatchSampler with_batch_size(std::int64_t batch_size) const;

  /**
   * @brief Rank `rank` of `ranks`' share of global batch `step` of the endless stream as `layout`
   * ranks read it: the records of this sampler's batches `step*layout .. step*layout+layout-1` (what
   * those ranks' batches `step` hold), in that order, cut into `ranks` contiguous runs whose sizes
   * differ by at most one (equal when `ranks` divides the batch), run `rank`. O(layout) whatever `step`.
   */
  BatchSlice share_of_global_batch(std::int64_t step, std::int64_t layout, std::int64_t ranks, std::int64_t rank) const;

  /// The fewest records any global batch of `layout` of this sampler's batches can hold: the size of
  /// a batch, less what the epochs' short last batches leave out. Unknown (0) for a batch sampler.
  std::int64_t fewest_records_per_global_batch(std::int64_t layout) const;

  /**
   * @brief The slices a rank reads under `chain`: Determined's chain, as views. The batches of the
   * epochs (endless when repeating, one epoch otherwise), this rank's share of them (every
   * `num_replicas`-th, from its rank on), without the first `skip` of those. A random-access view:
   * skipping costs nothing, and the loader's workers read any position of it. Defined in
   * <dettrial/samplers.hpp> (range-v3's views), which a translation unit that reads it includes.
   */
  // A template defined with the views, so that only a translation unit that reads them compiles
  // range-v3: the loader reads the same batches through chain_batch.
  template <std::same_as<LoaderChain> Chain = LoaderChain>
  auto slices(const Chain& chain) const;

  /// Checks `chain` as slices(chain) does (an epoch of at least one batch, the rank among the
  /// replicas, no negative skip), with its sentences.
  void check_chain(const LoaderChain& chain) const;
  /// Batch `k` of the batches a rank reads under `chain`, counted from the chain's start (the
  /// skipped ones too): `slices(chain)[k - chain.skip]`, computed directly. Random access, O(1).
  BatchSlice chain_batch(const LoaderChain& chain, std::int64_t k) const { return global_batch(chain.rank + k * chain.num_replicas); }

  /// The order of epoch `e`: the records of its batches, in order (int64, CPU). For a batch sampler,
  /// its batches concatenated.
  torch::Tensor order(std::int64_t epoch) const;

  /// Draws each epoch's shuffle seed from LibTorch's global generator, in Python's DataLoader's
  /// way (see EpochSeeds), instead of from (seed, epoch).
  void use_global_generator() { epoch_seeds_ = std::make_shared<EpochSeeds>(); }
  /// Whether the order draws from LibTorch's global generator (DataLoaderOptions::determined_order).
  bool draws_from_global_generator() const { return epoch_seeds_ != nullptr; }
  /// With the global generator: a new pass begins, whose epochs draw their seeds anew.
  void begin_pass() const;
  /// With the global generator and shuffling: draws the seeds of the epochs up to `epoch`.
  void draw_seeds_through(std::int64_t epoch) const {
    if (epoch_seeds_ && shuffle_) epoch_seeds_->draw_through(epoch);
  }

  /// Keeps enough epochs cached for a reader up to `batches_in_flight` of this rank's batches ahead
  /// under `chain` (the loader's prefetch), so no epoch is computed twice while it is being read.
  /// Only grows the cache (a few epoch orders: O(records) each).
  void keep_epochs_in_flight(std::int64_t batches_in_flight, const LoaderChain& chain) const;

 private:
  struct User {
    SamplerFunction sampler;
    BatchSamplerFunction batch_sampler;
  };
  /// One epoch's order, computed once.
  struct EpochOrder {
    std::int64_t epoch = -1;
    torch::Tensor order;
    /// A batch sampler's batch `i` is `order[offsets[i], offsets[i+1])`; empty otherwise.
    std::vector<std::int64_t> offsets;
    std::uint64_t used = 0;  // when last used, for least-recently-used replacement
  };
  // The last epochs used: at least the two live at an epoch boundary while prefetching, more when
  // the prefetch spans several epochs. Shared by copies of the sampler.
  struct Cache {
    std::mutex mutex;
    std::vector<EpochOrder> epochs;
    std::size_t capacity = 2;
    std::uint64_t clock = 0;
  };

  /// Epoch `epoch`'s order, from the cache or computed; the cache's mutex must be held.
  const EpochOrder& cached(std::int64_t epoch) const;
  /// Computes epoch `epoch`'s order: the permutation, or the user's sampler or batch sampler (checked).
  EpochOrder compute(std::int64_t epoch) const;
  /// Checks and converts what a user's sampler gave: 1-D, integer, within the dataset; an owned int64 copy.
  torch::Tensor user_indices(const torch::Tensor& given, const std::string& what, std::int64_t epoch) const;
  bool identity() const { return !user_ && !shuffle_; }

  std::int64_t records_;
  std::int64_t batch_size_;
  bool drop_last_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t batches_per_epoch_ = 0;
  std::int64_t order_length_ = -1;  // a sampler's epoch length, once known
  std::shared_ptr<const User> user_;
  std::shared_ptr<Cache> cache_;
  std::shared_ptr<EpochSeeds> epoch_seeds_;  // set by use_global_generator
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>

namespace dettrial {

DETTRIAL_INLINE void EpochSeeds::reset() {
  std::lock_guard lock(mutex_);
  seeds_.clear();
}

DETTRIAL_INLINE void EpochSeeds::draw_through(std::int64_t epoch) {
  {
    std::lock_guard lock(mutex_);
    while (static_cast<std::int64_t>(seeds_.size()) <= epoch)
      seeds_.push_back(static_cast<std::uint64_t>(torch::empty({}, torch::kLong).random_().item<std::int64_t>()));
  }
  drawn_.notify_all();
}

DETTRIAL_INLINE std::uint64_t EpochSeeds::wait(std::int64_t epoch) const {
  std::unique_lock lock(mutex_);
  drawn_.wait(lock, [&] { return static_cast<std::int64_t>(seeds_.size()) > epoch; });
  return seeds_[static_cast<std::size_t>(epoch)];
}

DETTRIAL_INLINE void BatchSampler::begin_pass() const {
  if (!epoch_seeds_) return;
  epoch_seeds_->reset();
  std::lock_guard lock(cache_->mutex);
  cache_->epochs.clear();  // the last pass's orders
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, std::int64_t batch_size, bool drop_last, bool shuffle, std::uint64_t seed)
    : records_(records), batch_size_(batch_size), drop_last_(drop_last), shuffle_(shuffle), seed_(seed), cache_(std::make_shared<Cache>()) {
  if (batch_size_ < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size_));
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  if (drop_last_ && batch_size_ > records_)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size_) + " is larger than the dataset's " + std::to_string(records_) +
                    " records, so drop_last leaves no batch");
  batches_per_epoch_ = drop_last_ ? records_ / batch_size_ : (records_ + batch_size_ - 1) / batch_size_;
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, SamplerFunction sampler, std::int64_t batch_size, bool drop_last,
                                           std::uint64_t seed)
    : records_(records),
      batch_size_(batch_size),
      drop_last_(drop_last),
      shuffle_(false),
      seed_(seed),
      user_(std::make_shared<const User>(User{std::move(sampler), {}})),
      cache_(std::make_shared<Cache>()) {
  if (!user_->sampler) throw DataError("DataLoader: the sampler is an empty function");
  if (batch_size_ < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size_));
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  {
    std::lock_guard lock(cache_->mutex);
    order_length_ = cached(0).order.size(0);
  }
  if (drop_last_ && batch_size_ > order_length_)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size_) + " is larger than the sampler's " +
                    std::to_string(order_length_) + " records, so drop_last leaves no batch");
  batches_per_epoch_ = drop_last_ ? order_length_ / batch_size_ : (order_length_ + batch_size_ - 1) / batch_size_;
}

DETTRIAL_INLINE BatchSampler::BatchSampler(std::int64_t records, BatchSamplerFunction batch_sampler, std::uint64_t seed)
    : records_(records),
      batch_size_(0),
      drop_last_(false),
      shuffle_(false),
      seed_(seed),
      user_(std::make_shared<const User>(User{{}, std::move(batch_sampler)})),
      cache_(std::make_shared<Cache>()) {
  if (!user_->batch_sampler) throw DataError("DataLoader: the batch_sampler is an empty function");
  if (records_ < 1) throw DataError("DataLoader: the dataset is empty");
  std::lock_guard lock(cache_->mutex);
  batches_per_epoch_ = static_cast<std::int64_t>(cached(0).offsets.size()) - 1;
}

DETTRIAL_INLINE void BatchSampler::set_seed(std::uint64_t seed) {
  seed_ = seed;
  if (!user_) cache_ = std::make_shared<Cache>();
}

DETTRIAL_INLINE BatchSlice BatchSampler::batch(std::int64_t epoch, std::int64_t index) const {
  BatchSlice s;
  s.epoch = epoch;
  if (identity()) {
    s.first = index * batch_size_;
    s.count = std::min(batch_size_, records_ - s.first);
    return s;
  }
  if (epoch_seeds_) epoch_seeds_->wait(epoch);  // before the cache's lock: the training thread draws
  std::lock_guard lock(cache_->mutex);
  const EpochOrder& e = cached(epoch);
  if (e.offsets.empty()) {
    s.first = index * batch_size_;
    s.count = std::min(batch_size_, e.order.size(0) - s.first);
  } else {
    s.first = e.offsets[static_cast<std::size_t>(index)];
    s.count = e.offsets[static_cast<std::size_t>(index) + 1] - s.first;
  }
  s.indices = e.order.narrow(0, s.first, s.count);
  return s;
}

DETTRIAL_INLINE BatchSlice BatchSampler::global_batch(std::int64_t global) const {
  return batch(global / batches_per_epoch_, global % batches_per_epoch_);
}

DETTRIAL_INLINE void BatchSampler::check_chain(const LoaderChain& chain) const {
  detail::check_batches_per_epoch(batches_per_epoch_, chain.repeat ? "repeat" : "one_epoch");
  detail::check_replicas(chain.num_replicas, chain.rank);
  detail::check_skip(chain.skip);
}

DETTRIAL_INLINE BatchSampler BatchSampler::with_batch_size(std::int64_t batch_size) const {
  if (batch_size == batch_size_ || has_batch_sampler()) return *this;
  if (batch_size < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(batch_size));
  BatchSampler other = *this;
  other.batch_size_ = batch_size;
  const std::int64_t length = has_sampler() ? order_length_ : records_;
  if (drop_last_ && batch_size > length)
    throw DataError("DataLoader: batch_size " + std::to_string(batch_size) + " is larger than the " + std::to_string(length) +
                    " records of an epoch, so drop_last leaves no batch");
  other.batches_per_epoch_ = drop_last_ ? length / batch_size : (length + batch_size - 1) / batch_size;
  return other;
}

DETTRIAL_INLINE BatchSlice BatchSampler::share_of_global_batch(std::int64_t step, std::int64_t layout, std::int64_t ranks,
                                                               std::int64_t rank) const {
  std::vector<BatchSlice> parts;
  parts.reserve(static_cast<std::size_t>(layout));
  std::int64_t total = 0;
  for (std::int64_t j = 0; j < layout; ++j) {
    parts.push_back(global_batch(step * layout + j));
    total += parts.back().count;
  }
  const std::int64_t begin = rank * total / ranks, end = (rank + 1) * total / ranks;
  if (begin == end)
    throw DataError("DataLoader: global batch " + std::to_string(step) + " holds " + std::to_string(total) + " records, too few for " +
                    std::to_string(ranks) + " ranks to share (an epoch's short last batch); resume on " + std::to_string(layout) +
                    " rank(s), or set drop_last");
  // The runs of the parts that fall in [begin, end), in order.
  std::vector<BatchSlice> pieces;
  std::int64_t offset = 0;
  for (BatchSlice& part : parts) {
    const std::int64_t count = part.count;
    const std::int64_t from = std::max(begin, offset), to = std::min(end, offset + count);
    if (from < to) {
      BatchSlice piece = std::move(part);
      const std::int64_t skipped = from - offset;
      piece.first += skipped;
      piece.count = to - from;
      if (piece.indices.defined()) piece.indices = piece.indices.narrow(0, skipped, piece.count);
      pieces.push_back(std::move(piece));
    }
    offset += count;
  }
  if (pieces.size() == 1) return std::move(pieces.front());
  // Runs of several batches: their records, and where each later epoch's begin.
  BatchSlice share;
  share.epoch = pieces.front().epoch;
  share.first = pieces.front().first;
  share.count = end - begin;
  std::vector<torch::Tensor> records;
  records.reserve(pieces.size());
  std::int64_t position = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const BatchSlice& piece = pieces[i];
    if (i > 0 && piece.epoch != pieces[i - 1].epoch) share.epoch_starts.push_back(position);
    records.push_back(piece.indices.defined() ? piece.indices : torch::arange(piece.first, piece.first + piece.count, torch::kLong));
    position += piece.count;
  }
  share.indices = torch::cat(records);
  return share;
}

DETTRIAL_INLINE std::int64_t BatchSampler::fewest_records_per_global_batch(std::int64_t layout) const {
  if (has_batch_sampler()) return 0;
  const std::int64_t length = has_sampler() ? order_length_ : records_;
  const std::int64_t short_by = drop_last_ || length % batch_size_ == 0 ? 0 : batch_size_ - length % batch_size_;
  // `layout` consecutive batches hold at most ceil(layout / batches_per_epoch) epochs' last batches.
  const std::int64_t last_batches = (layout + batches_per_epoch_ - 1) / batches_per_epoch_;
  return layout * batch_size_ - last_batches * short_by;
}

DETTRIAL_INLINE torch::Tensor BatchSampler::order(std::int64_t epoch) const {
  if (identity()) return torch::arange(records_, torch::kLong);
  if (epoch_seeds_) epoch_seeds_->wait(epoch);
  std::lock_guard lock(cache_->mutex);
  return cached(epoch).order;
}

DETTRIAL_INLINE void BatchSampler::keep_epochs_in_flight(std::int64_t batches_in_flight, const LoaderChain& chain) const {
  // Read in order on one thread, one epoch is live (two at a boundary). With workers reading up to
  // `batches_in_flight` ahead, in any order within that window, an epoch may still be needed while
  // positions up to a window either side of it are read: the epochs of two windows, and the ends.
  const std::int64_t window_epochs = batches_in_flight * chain.num_replicas / batches_per_epoch_;
  const auto needed = static_cast<std::size_t>(batches_in_flight <= 1 ? 2 : 2 * window_epochs + 4);
  std::lock_guard lock(cache_->mutex);
  cache_->capacity = std::max(cache_->capacity, needed);
}

DETTRIAL_INLINE const BatchSampler::EpochOrder& BatchSampler::cached(std::int64_t epoch) const {
  Cache& cache = *cache_;
  const std::uint64_t now = ++cache.clock;
  for (EpochOrder& e : cache.epochs)
    if (e.epoch == epoch) {
      e.used = now;
      return e;
    }
  EpochOrder fresh = compute(epoch);
  fresh.used = now;
  if (cache.epochs.size() < cache.capacity) return cache.epochs.emplace_back(std::move(fresh));
  auto oldest =
      std::min_element(cache.epochs.begin(), cache.epochs.end(), [](const EpochOrder& a, const EpochOrder& b) { return a.used < b.used; });
  *oldest = std::move(fresh);
  return *oldest;
}

DETTRIAL_INLINE BatchSampler::EpochOrder BatchSampler::compute(std::int64_t epoch) const {
  EpochOrder e;
  e.epoch = epoch;
  const std::string in_epoch = " in epoch " + std::to_string(epoch);
  if (!user_ && epoch_seeds_) {
    // Python's RandomSampler: torch.randperm(n, generator=torch.Generator().manual_seed(seed)).
    e.order = torch::randperm(records_, at::detail::createCPUGenerator(epoch_seeds_->wait(epoch)), torch::kLong);
  } else if (!user_) {
    e.order = samplers::ReproducibleShuffleSampler::permutation(records_, seed_, epoch);
  } else if (user_->sampler) {
    e.order = user_indices(user_->sampler(epoch), "the sampler", epoch);
    const std::int64_t length = e.order.size(0);
    if (length == 0) throw DataError("DataLoader: the sampler gave no records" + in_epoch);
    if (order_length_ >= 0 && length != order_length_)
      throw DataError("DataLoader: the sampler gave " + std::to_string(length) + " records" + in_epoch + " but " +
                      std::to_string(order_length_) +
                      " in epoch 0; every epoch must have the same length (repeat, "
                      "shard and skip count on it)");
  } else {
    std::vector<torch::Tensor> batches = user_->batch_sampler(epoch);
    const auto count = static_cast<std::int64_t>(batches.size());
    if (count == 0) throw DataError("DataLoader: the batch_sampler gave no batches" + in_epoch);
    if (batches_per_epoch_ > 0 && count != batches_per_epoch_)
      throw DataError("DataLoader: the batch_sampler gave " + std::to_string(count) + " batches" + in_epoch + " but " +
                      std::to_string(batches_per_epoch_) +
                      " in epoch 0; every epoch must have the same number of batches "
                      "(repeat, shard and skip count on it)");
    e.offsets.reserve(batches.size() + 1);
    e.offsets.push_back(0);
    for (std::size_t i = 0; i < batches.size(); ++i) {
      batches[i] = user_indices(batches[i], "batch " + std::to_string(i) + " of the batch_sampler", epoch);
      if (batches[i].size(0) == 0) throw DataError("DataLoader: batch " + std::to_string(i) + " of the batch_sampler is empty" + in_epoch);
      e.offsets.push_back(e.offsets.back() + batches[i].size(0));
    }
    e.order = torch::cat(batches);
  }
  return e;
}

DETTRIAL_INLINE torch::Tensor BatchSampler::user_indices(const torch::Tensor& given, const std::string& what, std::int64_t epoch) const {
  const std::string in_epoch = " in epoch " + std::to_string(epoch);
  if (!given.defined() || given.dim() != 1)
    throw DataError("DataLoader: " + what + " must give a 1-D tensor of record indices, not " +
                    (given.defined() ? "a " + std::to_string(given.dim()) + "-D tensor" : std::string("an undefined tensor")) + in_epoch);
  if (!c10::isIntegralType(given.scalar_type(), /*includeBool=*/false))
    throw DataError("DataLoader: " + what + " must give integer record indices, not " + std::string(c10::toString(given.scalar_type())) +
                    in_epoch);
  torch::Tensor indices = given.to(torch::kCPU, torch::kLong, /*non_blocking=*/false, /*copy=*/true).contiguous();
  if (indices.numel() > 0) {
    const std::int64_t low = indices.min().item<std::int64_t>();
    const std::int64_t high = indices.max().item<std::int64_t>();
    if (low < 0 || high >= records_)
      throw DataError("DataLoader: " + what + " gave record index " + std::to_string(low < 0 ? low : high) + in_epoch +
                      ", but the dataset has " + std::to_string(records_) + " records");
  }
  return indices;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
