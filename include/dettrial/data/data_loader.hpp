// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batch-level datasets and the DataLoader the trainer iterates, epoch by epoch, in a
/// reproducible order.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "../vocabulary/data.hpp"
#include "to_device.hpp"
#include "../error.hpp"
#include "collate.hpp"
#include "detail/prefetch.hpp"
#include "sampler_chain.hpp"
#include "epoch_order.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

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
        throw DataError("TensorDataset tensors disagree on the number of records: " + std::to_string(tensors_[0].size(0)) + " and " +
                        std::to_string(t.size(0)));
    }
  }

  std::int64_t size() const { return tensors_[0].size(0); }

  /// The records at `indices`, gathered where the tensors are: on a GPU for a dataset moved there
  /// (see to()), with the indices copied to it first (pinned, without waiting for the device).
  auto get_batch(const torch::Tensor& indices) const {
    const torch::Tensor on_device = indices.device() == tensors_[0].device() ? indices : device_indices(indices);
    return make([&](const torch::Tensor& t) { return t.index_select(0, on_device); });
  }
  /**
   * @brief The same records on `device`: kept there, each shuffled batch is gathered on the device
   * (the same records in the same order as on the CPU, for the same seed), and nothing is copied per
   * batch but its indices.
   * @code{.cpp}
   * dettrial::TensorDataset(images, labels).to(context.device())
   * @endcode
   */
  TensorDataset to(const torch::Device& device) const {
    TensorDataset moved = *this;
    for (auto& t : moved.tensors_) t = t.to(device);
    return moved;
  }
  torch::Device device() const { return tensors_[0].device(); }
  /// Records [begin, end) as fresh tensors (one contiguous copy each), so in-place changes to a batch
  /// never reach the dataset.
  auto get_range(std::int64_t begin, std::int64_t end) const {
    return make([&](const torch::Tensor& t) { return t.narrow(0, begin, end - begin).clone(); });
  }
  const torch::Tensor& tensor(std::size_t i) const { return tensors_[i]; }

 private:
  torch::Tensor device_indices(const torch::Tensor& indices) const {
    // A copy from pageable memory would wait for the device's queue; from pinned memory it does not.
    const bool pin = tensors_[0].is_cuda() && indices.device().is_cpu();
    return (pin ? indices.pin_memory() : indices).to(tensors_[0].device(), /*non_blocking=*/pin);
  }
  template <class F>
  auto make(F&& f) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::tuple{f(tensors_[I])...}; }(std::make_index_sequence<N>{});
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
  /// A sampler (Python's `sampler=`): the record order of each epoch, `torch::Tensor(std::int64_t epoch)`
  /// (1-D, integer record indices), cut into batches by batch_size and drop_last. Every epoch must
  /// have the same length. Mutually exclusive with shuffle: shuffle in the sampler
  /// (samplers::ReproducibleShuffleSampler). Called once per epoch, never per batch (under the
  /// loader's lock, possibly on a worker thread); it must be a function of the epoch, the same on
  /// every rank, since a resumed run recomputes the epoch it resumes in.
  SamplerFunction sampler{};
  /// A batch sampler (Python's `batch_sampler=`): the batches of each epoch,
  /// `std::vector<torch::Tensor>(std::int64_t epoch)`, of any sizes; every epoch must have the same
  /// number of them. batch_size, shuffle, drop_last and sampler must then be left at their defaults.
  /// Called like a sampler: once per epoch, a function of the epoch.
  BatchSamplerFunction batch_sampler{};
  /// The shuffle seed; unset means one drawn from LibTorch's global generator (which the trial
  /// seed has seeded), so the order follows the trial seed.
  std::optional<std::uint64_t> seed{};
  /// Threads reading batches in the background (0: read on the training thread). The order of
  /// batches is the same whatever the number. The dataset's get_batch must then be thread-safe.
  /// Unset: what the dataset asks for with `default_workers()` (image datasets: the process's share
  /// of the CPUs), else 0.
  std::optional<int> workers{};
  /// Batches read ahead per worker (the bounded queue's depth is workers x prefetch).
  int prefetch = 2;
  /// Read in the order Determined 0.38's `pytorch.DataLoader` (Python's DataLoader) reads, drawing
  /// from LibTorch's global CPU generator as it does: one int64 when a pass starts (the iterator's
  /// base seed; a resumed training pass draws none, as Determined draws it before it restores the
  /// generator) and, with shuffle, one when each epoch's first batch is read (RandomSampler's seed,
  /// its order `randperm(records, seed)`). A run continued from a Determined checkpoint then reads
  /// the records Determined would, and its dropout masks match. Not with sampler, batch_sampler or seed.
  bool determined_order = false;
  /// Copy batches into pinned (page-locked) memory, so copies to the GPU can be non-blocking.
  /// Unset: when LibTorch has CUDA and a GPU is present.
  std::optional<bool> pin_memory{};
};

}  // namespace dettrial

namespace dettrial::detail {
template <class D>
auto as_batch_dataset(D dataset) {
  if constexpr (BatchDataset<D>) return dataset;
  else return ExampleBatches<D>(std::move(dataset));
}
/// The loader's record order and batching for its options: built-in, a sampler's or a batch
/// sampler's. Throws DataError naming an option that conflicts with a sampler or batch sampler.
DETTRIAL_INLINE BatchSampler make_batch_sampler(std::int64_t records, const DataLoaderOptions& options, std::uint64_t seed);
/// See DataLoader::layout_sampler.
DETTRIAL_INLINE BatchSampler layout_sampler(const BatchSampler& sampler, const LoaderChain& chain);
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief Reads a dataset in batches, in a reproducible order, optionally on background threads.
 *
 * Takes a batch-level dataset (`get_batch(indices)`, vectorised: dettrial::TensorDataset) or a
 * per-example one (`get(index)`, collated by dettrial::collate_fn or by `with_collate`). The trainer
 * reads it through `batches(chain)`, which applies Determined's repeat, shard and skip; iterating the
 * loader itself is one unsharded pass (what `evaluate_full_dataset` sees). The order of an epoch is the
 * built-in one (`shuffle`), or a user's `sampler` or `batch_sampler` (see DataLoaderOptions), with the
 * same repeat, shard and skip on top.
 * @code{.cpp}
 * dettrial::DataLoader loader(dettrial::TensorDataset(images, labels),
 *                             {.batch_size = ctx.get_per_slot_batch_size(), .shuffle = true, .workers = 2});
 * @endcode
 */
template <class D>
class DataLoader {
  static_assert(BatchDataset<D> || ExampleDataset<D>,
                "dettrial::DataLoader<D>: D must be a dettrial::BatchDataset (size() and get_batch(indices) taking a "
                "1-D int64 tensor of record indices, like dettrial::TensorDataset) or a dettrial::ExampleDataset "
                "(size() and get(index))");

 public:
  using dataset_type = decltype(detail::as_batch_dataset(std::declval<D>()));
  using batch_type = std::remove_cvref_t<decltype(std::declval<const dataset_type&>().get_batch(std::declval<const torch::Tensor&>()))>;

  DataLoader(D dataset, DataLoaderOptions options);

  /// Batches per epoch (one process).
  std::int64_t size() const { return sampler_.batches_per_epoch(); }
  /// Batches one rank reads per epoch under `chain` (Determined's sharded length; with a layout
  /// of other ranks, that layout's chief's).
  std::int64_t batches_for(const LoaderChain& chain) const;
  /// Keeps the global batches of another rank count (LoaderChain::layout_replicas).
  static constexpr bool keeps_global_batches = true;

  /**
   * @brief The sampler of the stream `chain.layout_replicas` ranks read, when it is not this job's:
   * batches of `batch_size * num_replicas / layout_replicas` records (the loader's batch size is a
   * rank's share of the global batch, `get_per_slot_batch_size()`). Throws when the global batch
   * does not divide among the layout's ranks, or when a global batch could hold fewer records than
   * this job has ranks.
   */
  BatchSampler layout_sampler(const LoaderChain& chain) const { return detail::layout_sampler(sampler_, chain); }
  std::int64_t num_records() const { return sampler_.records(); }
  const DataLoaderOptions& options() const { return options_; }
  /// The threads reading batches in the background (the option, or the dataset's default).
  int workers() const { return workers_; }
  /// What the trainer's start line says of this loader: "60000 records in batches of 64, shuffled,
  /// read by 2 worker threads (the dataset's default), 4 batches ahead".
  std::string describe() const;
  std::uint64_t seed() const { return sampler_.seed(); }
  /// Changes the shuffle seed; streams made before keep the old one. (A user's sampler ignores it.)
  void set_seed(std::uint64_t seed) { sampler_.set_seed(seed); }
  const dataset_type& dataset() const { return *dataset_; }
  const BatchSampler& sampler() const { return sampler_; }

  /// Reads the records of one slice (thread-safe when the dataset is).
  batch_type read(const BatchSlice& slice) const;

  /// The batches a rank reads under `chain`, in order, prefetched by the loader's workers.
  class Stream {
   public:
    class iterator {
     public:
      using value_type = batch_type;
      using difference_type = std::ptrdiff_t;
      iterator() = default;
      explicit iterator(Stream* stream) : stream_(stream) {}
      /// Reads the batch here when first asked for, not before: a batch is read when the training
      /// loop takes it, never one ahead (what it reads may draw from the global generator).
      batch_type& operator*() const {
        if (!current_) current_.emplace(stream_->next());
        return *current_;
      }
      iterator& operator++() {
        advance();
        return *this;
      }
      void operator++(int) { advance(); }
      friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.at_end(); }

     private:
      bool at_end() const { return !current_ && (!stream_ || stream_->exhausted()); }
      void advance() {
        if (!current_ && stream_ && !stream_->exhausted()) stream_->next();  // passed over unread
        current_.reset();
      }
      Stream* stream_ = nullptr;
      mutable std::optional<batch_type> current_;
    };

    Stream(const DataLoader& loader, LoaderChain chain);
    Stream(Stream&&) = default;
    ~Stream();

    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() const { return {}; }
    /// The position (in this rank's batches) of the next batch.
    std::int64_t position() const { return position_; }

   private:
    bool exhausted() const { return position_ >= end_; }
    batch_type next();

    /// The slice of this rank's batch `k`: Determined's chain, or a share of the layout's global batch `k`.
    struct SliceAt {
      SliceAt(const DataLoader& loader, const LoaderChain& chain)
          : sampler(checked(loader.sampler_, chain)),
            chain(chain),
            layout(loader.regroups(chain) ? std::optional(loader.layout_sampler(chain)) : std::nullopt) {}
      BatchSlice operator()(std::int64_t k) const {
        if (layout) return layout->share_of_global_batch(k, chain.layout_replicas, chain.num_replicas, chain.rank);
        return sampler.chain_batch(chain, k);
      }
      static const BatchSampler& checked(const BatchSampler& sampler, const LoaderChain& chain) {
        sampler.check_chain(chain);
        return sampler;
      }
      BatchSampler sampler;  // the sampler chain this stream reads (its epochs shared with the loader's)
      LoaderChain chain;
      std::optional<BatchSampler> layout;  // the layout's stream, when the job regroups its global batches
    };
    const DataLoader* loader_;
    SliceAt slice_at_;
    LoaderChain chain_;
    std::int64_t position_;
    std::int64_t end_;
    std::unique_ptr<detail::Prefetcher<batch_type>> prefetcher_;
  };

  /// Determined's `get_data_loader(repeat, skip, num_replicas, rank)`: the batches this rank reads.
  Stream batches(const LoaderChain& chain) const;

  /// One unsharded pass over the data (epoch 0's order).
  class PassIterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    PassIterator() = default;
    explicit PassIterator(const DataLoader& loader)
        : stream_(std::make_shared<Stream>(loader.batches(LoaderChain{}))), it_(stream_->begin()) {}
    batch_type& operator*() const { return *it_; }
    PassIterator& operator++() {
      ++it_;
      return *this;
    }
    void operator++(int) { ++it_; }
    friend bool operator==(const PassIterator& p, std::default_sentinel_t s) { return !p.stream_ || p.it_ == s; }

   private:
    std::shared_ptr<Stream> stream_;  // shared: input iterators are copied by range algorithms
    typename Stream::iterator it_;
  };
  PassIterator begin() const { return PassIterator(*this); }
  std::default_sentinel_t end() const { return {}; }

 private:
  /// Whether `chain` reads the global batches of another rank count than its own.
  static bool regroups(const LoaderChain& chain) {
    return chain.repeat && chain.layout_replicas > 0 && chain.layout_replicas != chain.num_replicas;
  }
  static std::uint64_t draw_seed() {
    return static_cast<std::uint64_t>(torch::randint(0, std::numeric_limits<std::int64_t>::max(), {1}, torch::kLong).item<std::int64_t>());
  }
  static int default_workers(const dataset_type& dataset) {
    if constexpr (requires { dataset.default_workers(); }) return static_cast<int>(dataset.default_workers());
    else return 0;
  }
  static void pin_in_place(batch_type& batch) {
    detail::for_each_tensor(batch, [](torch::Tensor& t) {
      if (t.defined() && t.device().is_cpu() && !t.is_pinned()) t = t.pin_memory();
    });
  }

  std::shared_ptr<const dataset_type> dataset_;  // shared with worker threads of live streams
  DataLoaderOptions options_;
  BatchSampler sampler_;
  int workers_ = 0;
  bool pin_ = false;
};

// The members that read data, defined outside the class: not inline, so that the explicit
// instantiations below keep a trial's translation unit from compiling them for the common datasets.
template <class D>
DataLoader<D>::DataLoader(D dataset, DataLoaderOptions options)
    : dataset_(std::make_shared<const dataset_type>(detail::as_batch_dataset(std::move(dataset)))),
      options_(options),
      sampler_(detail::make_batch_sampler(static_cast<std::int64_t>(dataset_->size()), options_,
                                          options.seed || options.determined_order ? options.seed.value_or(0) : draw_seed())) {
  if (options_.workers && *options_.workers < 0) throw DataError("DataLoader workers must not be negative");
  if (options_.prefetch < 1) throw DataError("DataLoader prefetch must be at least 1");
  workers_ = options_.workers.value_or(default_workers(*dataset_));
  pin_ = options_.pin_memory.value_or(torch::cuda::is_available());
}

template <class D>
std::int64_t DataLoader<D>::batches_for(const LoaderChain& chain) const {
  if (regroups(chain)) return samplers::distributed_length(layout_sampler(chain).batches_per_epoch(), chain.layout_replicas, 0);
  return sampler_.batches_for(chain);
}

template <class D>
std::string DataLoader<D>::describe() const {
  std::string text =
      std::to_string(num_records()) + " records in " +
      (sampler_.has_batch_sampler() ? std::string("a batch sampler's batches") : "batches of " + std::to_string(sampler_.batch_size())) +
      (sampler_.draws_from_global_generator() ? (sampler_.shuffle() ? ", shuffled in Determined's order" : ", in Determined's order")
       : sampler_.shuffle()                   ? ", shuffled"
       : sampler_.has_sampler()               ? ", in a sampler's order"
                                              : "");
  if (workers_ == 0) return text + ", read on the training thread";
  return text + ", read by " + std::to_string(workers_) + " worker thread" + (workers_ == 1 ? "" : "s") +
         (options_.workers ? "" : " (the dataset's default)") + ", " + std::to_string(workers_ * options_.prefetch) + " batches ahead";
}

template <class D>
auto DataLoader<D>::read(const BatchSlice& slice) const -> batch_type {
  batch_type batch = [&] {
    const auto in_order = [&] { return torch::arange(slice.first, slice.first + slice.count, torch::kLong); };
    if constexpr (requires { dataset_->get_batch(slice.indices, BatchOrigin{}); }) {
      return dataset_->get_batch(slice.indices.defined() ? slice.indices : in_order(),
                                 BatchOrigin{slice.epoch, sampler_.seed(), slice.epoch_starts});
    } else {
      if (slice.indices.defined()) return dataset_->get_batch(slice.indices);
      if constexpr (requires { dataset_->get_range(slice.first, slice.first + slice.count); })
        return dataset_->get_range(slice.first, slice.first + slice.count);
      else return dataset_->get_batch(in_order());
    }
  }();
  if (pin_) pin_in_place(batch);
  return batch;
}

template <class D>
DataLoader<D>::Stream::Stream(const DataLoader& loader, LoaderChain chain)
    : loader_(&loader),
      slice_at_(loader, chain),
      chain_(chain),
      position_(chain.skip),
      end_(chain.repeat ? std::numeric_limits<std::int64_t>::max() : loader.batches_for(chain)) {
  if (loader.sampler_.draws_from_global_generator()) {
    loader.sampler_.begin_pass();
    // Python's iterator draws its base seed when made; Determined makes its training iterator
    // before it restores a checkpoint's generator, so a resumed pass (skip > 0) shows no draw.
    if (chain.skip == 0) torch::empty({}, torch::kLong).random_();
  }
  const int workers = loader.workers_;
  const std::int64_t in_flight = workers > 0 ? std::max(workers * loader.options_.prefetch, workers) : 1;
  if (slice_at_.layout) slice_at_.layout->keep_epochs_in_flight(in_flight * chain.layout_replicas, LoaderChain{.repeat = true});
  else loader.sampler_.keep_epochs_in_flight(in_flight, chain);
  if (workers > 0 && position_ < end_)
    prefetcher_ = std::make_unique<detail::Prefetcher<batch_type>>(
        [loader = loader_, slice_at = slice_at_](std::int64_t k) { return loader->read(slice_at(k)); }, position_, end_, workers,
        workers * loader.options_.prefetch);
}

template <class D>
DataLoader<D>::Stream::~Stream() = default;

template <class D>
auto DataLoader<D>::Stream::next() -> batch_type {
  const std::int64_t k = position_++;
  // The epoch of this rank's batch k in the stream of all ranks' batches: its seed is drawn
  // now, on the training thread, as Python's sampler draws it when that epoch's first batch is asked for.
  if (loader_->sampler_.draws_from_global_generator()) {
    if (slice_at_.layout)  // the last of the layout's batches that make up global batch k
      slice_at_.layout->draw_seeds_through(((k + 1) * chain_.layout_replicas - 1) / slice_at_.layout->batches_per_epoch());
    else loader_->sampler_.draw_seeds_through((chain_.rank + chain_.num_replicas * k) / loader_->sampler_.batches_per_epoch());
  }
  if (prefetcher_) return prefetcher_->take();
  return loader_->read(slice_at_(k));
}

template <class D>
auto DataLoader<D>::batches(const LoaderChain& chain) const -> Stream {
  if (chain.num_replicas < 1 || chain.rank < 0 || chain.rank >= chain.num_replicas)
    throw DataError("DataLoader: rank " + std::to_string(chain.rank) + " is not among " + std::to_string(chain.num_replicas) + " replicas");
  if (chain.skip < 0) throw DataError("DataLoader: cannot skip a negative number of batches");
  return Stream(*this, chain);
}

// TensorDataset's loaders (1 to 3 tensors) are compiled once, in dettrial::compiled (separate
// compilation): a trial's translation unit then compiles none of their reading, sampling and
// prefetching code.
#if defined(DETTRIAL_SEPARATE_COMPILATION)
#if DETTRIAL_HEADER_DEFINITIONS
template class DataLoader<TensorDataset<1>>;
template class DataLoader<TensorDataset<2>>;
template class DataLoader<TensorDataset<3>>;
#else
extern template class DataLoader<TensorDataset<1>>;
extern template class DataLoader<TensorDataset<2>>;
extern template class DataLoader<TensorDataset<3>>;
#endif
#endif

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE BatchSampler layout_sampler(const BatchSampler& sampler, const LoaderChain& chain) {
  const std::int64_t ranks = chain.num_replicas, layout = chain.layout_replicas;
  const std::string job = std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s");
  const std::string begun = "a run begun on " + std::to_string(layout) + " rank" + (layout == 1 ? "" : "s");
  BatchSampler stream = sampler;
  if (!sampler.has_batch_sampler()) {
    const std::int64_t global = sampler.batch_size() * ranks;
    if (global % layout != 0)
      throw DataError("DataLoader: the global batch of " + std::to_string(global) + " records (batch_size " +
                      std::to_string(sampler.batch_size()) + " on each of " + job + ") does not divide among the " +
                      std::to_string(layout) + " ranks of " + begun + ", whose global batches a resumed run keeps");
    stream = sampler.with_batch_size(global / layout);
  }
  if (const std::int64_t fewest = stream.fewest_records_per_global_batch(layout); fewest > 0 && fewest < ranks)
    throw DataError("DataLoader: " + begun + " has global batches of only " + std::to_string(fewest) + " record" +
                    (fewest == 1 ? "" : "s") + " at its epochs' ends (a short last batch), too few for " + job +
                    " to share; resume on at most " + std::to_string(fewest) + " rank" + (fewest == 1 ? "" : "s") + ", or set drop_last");
  return stream;
}

DETTRIAL_INLINE BatchSampler make_batch_sampler(std::int64_t records, const DataLoaderOptions& options, std::uint64_t seed) {
  if (options.determined_order) {
    const char* conflict = options.sampler ? "sampler" : options.batch_sampler ? "batch_sampler" : options.seed ? "seed" : nullptr;
    if (conflict)
      throw DataError(std::string("DataLoader: determined_order draws the order from LibTorch's global generator, as Determined does; "
                                  "it cannot be combined with ") +
                      conflict);
    BatchSampler sampler(records, options.batch_size, options.drop_last, options.shuffle, seed);
    sampler.use_global_generator();
    return sampler;
  }
  if (options.batch_sampler) {
    const char* conflict = options.sampler           ? "sampler"
                           : options.batch_size != 1 ? "batch_size"
                           : options.shuffle         ? "shuffle"
                           : options.drop_last       ? "drop_last"
                                                     : nullptr;
    if (conflict)
      throw DataError(std::string("DataLoader: the batch_sampler option is mutually exclusive with ") + conflict +
                      " (the batch sampler makes the batches: leave " + conflict + " at its default)");
    return BatchSampler(records, options.batch_sampler, seed);
  }
  if (options.sampler) {
    if (options.shuffle)
      throw DataError(
          "DataLoader: the sampler option is mutually exclusive with shuffle (shuffle in the sampler, with "
          "dettrial::samplers::ReproducibleShuffleSampler)");
    return BatchSampler(records, options.sampler, options.batch_size, options.drop_last, seed);
  }
  return BatchSampler(records, options.batch_size, options.drop_last, options.shuffle, seed);
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
