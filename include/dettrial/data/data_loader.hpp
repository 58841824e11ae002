// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batch-level datasets and the DataLoader the trainer iterates, epoch by epoch, in a
/// reproducible order.
#pragma once

#include <concepts>
#include <cstdint>
#include <iterator>
#include <optional>
#include <ranges>
#include <tuple>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "../detail/error.hpp"

namespace dettrial {

/**
 * @brief A dataset read a batch at a time: `size()` records, and `get_batch(indices)` with a 1-D
 * int64 CPU tensor of record indices (vectorised: one gather per batch, not one call per record).
 * A dataset may also offer `get_range(begin, end)` for contiguous, unshuffled reads. Either way a
 * batch must not alias the dataset's storage: a trial may change its batch in place.
 */
template <class D>
concept BatchDataset = requires(D& d, const torch::Tensor& indices) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get_batch(indices);
};

/**
 * @brief What the trainer needs of a data loader: `size()` batches per epoch, `set_epoch(e)` to fix
 * the order of epoch `e`, and iteration over that epoch's batches.
 */
template <class L>
concept BatchLoader = std::ranges::input_range<L> && requires(L& l, std::int64_t epoch) {
  { l.size() } -> std::convertible_to<std::int64_t>;
  l.set_epoch(epoch);
};

/// The batch type a loader yields.
template <BatchLoader L>
using batch_of = std::remove_cvref_t<std::ranges::range_reference_t<L>>;

/**
 * @brief Tensors indexed together along their first dimension (features, labels, ...).
 * Batches are `std::tuple<torch::Tensor, ...>`, one element per tensor.
 */
template <std::size_t N>
class TensorDataset {
 public:
  template <class... Ts>
    requires(sizeof...(Ts) == N && (std::same_as<std::remove_cvref_t<Ts>, torch::Tensor> && ...))
  explicit TensorDataset(Ts&&... tensors) : tensors_{std::forward<Ts>(tensors)...} {
    for (const auto& t : tensors_) {
      if (!t.defined() || t.dim() == 0) throw DataError("TensorDataset needs tensors with a first (record) dimension");
      if (t.size(0) != tensors_[0].size(0))
        throw DataError("TensorDataset tensors disagree on the number of records: " + std::to_string(tensors_[0].size(0)) +
                        " and " + std::to_string(t.size(0)));
    }
  }

  std::int64_t size() const { return tensors_[0].size(0); }

  auto get_batch(const torch::Tensor& indices) const {
    return make([&](const torch::Tensor& t) { return t.index_select(0, indices); });
  }
  /// Records [begin, end) as fresh tensors (one contiguous copy each), so in-place changes to a batch
  /// never reach the dataset.
  auto get_range(std::int64_t begin, std::int64_t end) const {
    return make([&](const torch::Tensor& t) { return t.narrow(0, begin, end - begin).clone(); });
  }
  const torch::Tensor& tensor(std::size_t i) const { return tensors_[i]; }

 private:
  template <class F>
  auto make(F&& f) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{f(tensors_[I])...};
    }(std::make_index_sequence<N>{});
  }
  std::array<torch::Tensor, N> tensors_;
};

template <class... Ts>
TensorDataset(Ts&&...) -> TensorDataset<sizeof...(Ts)>;

/// Options of a DataLoader.
struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  /// A different, reproducible order every epoch.
  bool shuffle = false;
  /// Drop the last, short batch of an epoch.
  bool drop_last = false;
  /// The shuffle seed; unset means one drawn from LibTorch's global generator (which the trial
  /// seed has seeded), so the order follows the trial seed.
  std::optional<std::uint64_t> seed;
};

/**
 * @brief Iterates a BatchDataset in batches, one epoch at a time.
 *
 * The order of epoch `e` depends only on (seed, e): any epoch can be replayed on its own, which is
 * what exact resume needs. Unshuffled loaders read contiguous ranges when the dataset can.
 * @code{.cpp}
 * dettrial::DataLoader loader(dettrial::TensorDataset(images, labels),
 *                             {.batch_size = ctx.get_per_slot_batch_size(), .shuffle = true});
 * @endcode
 */
template <class D>
class DataLoader {
  static_assert(BatchDataset<D>,
                "dettrial::DataLoader<D>: D must be a dettrial::BatchDataset: size() records and get_batch(indices) "
                "taking a 1-D int64 tensor of record indices (see dettrial::TensorDataset)");

 public:
  using dataset_type = D;
  using batch_type = std::remove_cvref_t<decltype(std::declval<const D&>().get_batch(std::declval<const torch::Tensor&>()))>;

  DataLoader(D dataset, DataLoaderOptions options) : dataset_(std::move(dataset)), options_(options) {
    if (options_.batch_size < 1) throw DataError("DataLoader batch_size must be at least 1, not " + std::to_string(options_.batch_size));
    records_ = static_cast<std::int64_t>(dataset_.size());
    seed_ = options_.seed ? *options_.seed : draw_seed();
    set_epoch(0);
  }

  /// Batches per epoch.
  std::int64_t size() const {
    return options_.drop_last ? records_ / options_.batch_size : (records_ + options_.batch_size - 1) / options_.batch_size;
  }
  std::int64_t num_records() const { return records_; }
  const DataLoaderOptions& options() const { return options_; }
  std::uint64_t seed() const { return seed_; }
  const D& dataset() const { return dataset_; }

  /// Fixes the order of epoch `epoch` (a permutation drawn from (seed, epoch) when shuffling).
  void set_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    if (!options_.shuffle) return;
    auto generator = at::detail::createCPUGenerator(mix(seed_, static_cast<std::uint64_t>(epoch)));
    order_ = torch::randperm(records_, generator, torch::TensorOptions().dtype(torch::kLong));
  }
  std::int64_t epoch() const { return epoch_; }

  /// Batch `i` of the current epoch.
  batch_type batch(std::int64_t i) const {
    const std::int64_t begin = i * options_.batch_size;
    const std::int64_t end = std::min(begin + options_.batch_size, records_);
    if (options_.shuffle) return dataset_.get_batch(order_.narrow(0, begin, end - begin));
    if constexpr (requires { dataset_.get_range(begin, end); }) return dataset_.get_range(begin, end);
    else return dataset_.get_batch(torch::arange(begin, end, torch::kLong));
  }

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const DataLoader* loader, std::int64_t i) : loader_(loader), i_(i) {}
    batch_type operator*() const { return loader_->batch(i_); }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    void operator++(int) { ++i_; }
    friend bool operator==(const iterator& a, const iterator& b) { return a.i_ == b.i_; }

   private:
    const DataLoader* loader_ = nullptr;
    std::int64_t i_ = 0;
  };
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(this, size()); }

 private:
  static std::uint64_t mix(std::uint64_t seed, std::uint64_t epoch) {
    std::uint64_t x = seed ^ (epoch * 0x9E3779B97F4A7C15ULL);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  }
  static std::uint64_t draw_seed() {
    return static_cast<std::uint64_t>(torch::randint(0, std::numeric_limits<std::int64_t>::max(), {1}, torch::kLong).item<std::int64_t>());
  }

  D dataset_;
  DataLoaderOptions options_;
  std::int64_t records_ = 0;
  std::uint64_t seed_ = 0;
  std::int64_t epoch_ = 0;
  torch::Tensor order_;
};

}  // namespace dettrial
