// Data: the loader's order and lengths, the IDX reader on files the test writes, and the real datasets.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <vector>

#include <zlib.h>

#include <dettrial/dettrial.hpp>
#include <dettrial/samplers.hpp>

#include "skip.hpp"

using namespace dettrial;

namespace {
using Loader = DataLoader<TensorDataset<1>>;

/// The record ids of a stream of batches, flattened.
template <class Range>
std::vector<std::int64_t> ids_of(Range&& batches, std::int64_t max_batches = std::numeric_limits<std::int64_t>::max()) {
  std::vector<std::int64_t> out;
  std::int64_t n = 0;
  for (auto&& [x] : batches) {
    for (std::int64_t i = 0; i < x.size(0); ++i) out.push_back(x[i].template item<std::int64_t>());
    if (++n == max_batches) break;
  }
  return out;
}
Loader loader_of(std::int64_t n, DataLoaderOptions o) { return DataLoader(TensorDataset(torch::arange(n, torch::kLong)), o); }
std::vector<std::int64_t> iota_vector(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// Counts the records it reads, to prove skipping reads nothing.
struct CountingDataset {
  std::shared_ptr<std::atomic<std::int64_t>> reads = std::make_shared<std::atomic<std::int64_t>>(0);
  std::int64_t size() const { return 1000; }
  std::tuple<torch::Tensor> get_batch(const torch::Tensor& indices) const {
    *reads += indices.numel();
    return {indices.clone()};
  }
};
}  // namespace

TEST_CASE("DataLoader: lengths with and without drop_last, in-order reads, Determined's sharded lengths") {
  auto keep = loader_of(10, {.batch_size = 4});
  CHECK(keep.size() == 3);
  CHECK(ids_of(keep) == iota_vector(10));
  auto drop = loader_of(10, {.batch_size = 4, .drop_last = true});
  CHECK(drop.size() == 2);
  CHECK(ids_of(drop) == iota_vector(8));
  // len // n + (len % n > rank), with 10 batches of 1 over 3 ranks.
  auto ones = loader_of(10, {.batch_size = 1});
  CHECK(ones.batches_for({.num_replicas = 3, .rank = 0}) == 4);
  CHECK(ones.batches_for({.num_replicas = 3, .rank = 1}) == 3);
  CHECK(ones.batches_for({.num_replicas = 3, .rank = 2}) == 3);
}

TEST_CASE("DataLoader: bad settings and empty data are named") {
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 0}), "DataLoader batch_size must be at least 1, not 0", DataError);
  CHECK_THROWS_WITH_AS(loader_of(0, {.batch_size = 4}), "DataLoader: the dataset is empty", DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 16, .drop_last = true}),
                       "DataLoader: batch_size 16 is larger than the dataset's 10 records, so drop_last leaves no batch", DataError);
  CHECK_NOTHROW(loader_of(10, {.batch_size = 16}));  // one short batch is fine without drop_last
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 1, .workers = -1}), "DataLoader workers must not be negative", DataError);
  CHECK_THROWS_AS(DataLoader(TensorDataset(torch::zeros({3}), torch::zeros({4})), {.batch_size = 1}), DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 1}).batches({.num_replicas = 2, .rank = 2}),
                       "DataLoader: rank 2 is not among 2 replicas", DataError);
}

TEST_CASE("DataLoader: the same seed gives the same order, a new but reproducible one each epoch") {
  auto a = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 5});
  auto b = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 5});
  auto c = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 6});
  const auto two_epochs = ids_of(a.batches({.repeat = true}), 2 * a.size());
  const std::vector<std::int64_t> e0(two_epochs.begin(), two_epochs.begin() + 100), e1(two_epochs.begin() + 100, two_epochs.end());
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota_vector(100));
  CHECK(e0 != iota_vector(100));
  CHECK(e1 != e0);
  sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota_vector(100));
  CHECK(ids_of(b.batches({.repeat = true}), 2 * b.size()) == two_epochs);
  CHECK(ids_of(c) != e0);
  CHECK(ids_of(a) == e0);  // plain iteration is epoch 0
  // Without a seed, the order follows LibTorch's generator (which the trial seed seeds).
  torch::manual_seed(3);
  auto d = loader_of(100, {.batch_size = 7, .shuffle = true});
  torch::manual_seed(3);
  auto e = loader_of(100, {.batch_size = 7, .shuffle = true});
  CHECK(ids_of(d) == ids_of(e));
}

TEST_CASE("DataLoader: shards are disjoint and cover the data") {
  auto loader = loader_of(50, {.batch_size = 5, .shuffle = true, .seed = 1});  // 10 batches per epoch
  for (std::int64_t n : {2, 3, 4}) {
    std::vector<std::int64_t> all;
    for (std::int64_t r = 0; r < n; ++r) {
      const auto shard = ids_of(loader.batches({.num_replicas = n, .rank = r}));
      CHECK(static_cast<std::int64_t>(shard.size()) == loader.batches_for({.num_replicas = n, .rank = r}) * 5);
      all.insert(all.end(), shard.begin(), shard.end());
    }
    std::sort(all.begin(), all.end());
    CHECK(all == iota_vector(50));  // each record exactly once
  }
  // Strided over the endless stream: rank r of n reads global batches r, r + n, r + 2n, ...
  const auto global = ids_of(loader.batches({.repeat = true}), 30);
  const auto rank1 = ids_of(loader.batches({.repeat = true, .num_replicas = 3, .rank = 1}), 10);
  for (std::size_t k = 0; k < 10; ++k)
    CHECK(std::vector(rank1.begin() + 5 * k, rank1.begin() + 5 * k + 5) ==
          std::vector(global.begin() + 5 * (3 * k + 1), global.begin() + 5 * (3 * k + 1) + 5));
}

TEST_CASE("DataLoader: skipping resumes the exact order, mid-epoch included, without reading skipped records") {
  auto loader = loader_of(64, {.batch_size = 6, .shuffle = true, .seed = 9});  // 11 batches per epoch
  const auto straight = ids_of(loader.batches({.repeat = true, .num_replicas = 2, .rank = 1}), 20);
  for (std::int64_t k : {0, 3, 5, 6, 13}) {  // 5 and 6 straddle this rank's epoch boundary
    const auto resumed = ids_of(loader.batches({.repeat = true, .skip = k, .num_replicas = 2, .rank = 1}), 20 - k);
    std::vector<std::int64_t> tail;
    std::int64_t seen = 0;
    // The straight run's batches from k on (batch sizes vary: the last batch of an epoch is short).
    auto stream = loader.batches({.repeat = true, .num_replicas = 2, .rank = 1});
    for (auto&& [x] : stream) {
      if (seen >= k)
        for (std::int64_t i = 0; i < x.size(0); ++i) tail.push_back(x[i].item<std::int64_t>());
      if (++seen == 20) break;
    }
    CHECK(resumed == tail);
  }
  // The sampler's range-v3 view of slices is the same chain, for code that wants indices only.
  std::vector<std::int64_t> from_view;
  std::int64_t taken = 0;
  for (const BatchSlice& slice : loader.sampler().slices({.repeat = true, .skip = 5, .num_replicas = 2, .rank = 1})) {
    for (std::int64_t i = 0; i < slice.count; ++i) from_view.push_back(slice.indices[i].item<std::int64_t>());
    if (++taken == 15) break;
  }
  CHECK(from_view == ids_of(loader.batches({.repeat = true, .skip = 5, .num_replicas = 2, .rank = 1}), 15));
  // The loader reads each slice directly (chain_batch), not through the view: the same slices for
  // endless and one-epoch chains, rank counts that do not divide the 11 batches, skips across epochs.
  for (const LoaderChain chain : {LoaderChain{.repeat = true, .skip = 7, .num_replicas = 3, .rank = 2},
                                  LoaderChain{.repeat = false, .num_replicas = 4, .rank = 3}, LoaderChain{.repeat = true, .skip = 30}}) {
    std::int64_t k = chain.skip;
    for (const BatchSlice& slice : loader.sampler().slices(chain)) {
      const BatchSlice direct = loader.sampler().chain_batch(chain, k++);
      CHECK(direct.epoch == slice.epoch);
      CHECK(direct.count == slice.count);
      CHECK(torch::equal(direct.indices, slice.indices));
      if (k == chain.skip + 25) break;
    }
    CHECK(k == (chain.repeat ? chain.skip + 25 : 2));  // rank 3 of 4 reads 2 of an epoch's 11 batches
  }
  CHECK_THROWS_WITH_AS(loader.sampler().check_chain({.num_replicas = 2, .rank = 2}), "samplers::distribute: rank 2 is not among 2 replicas",
                       DataError);

  CountingDataset counting;
  DataLoader skipper(counting, {.batch_size = 10});
  auto stream = skipper.batches({.repeat = true, .skip = 1'000'000});
  auto it = stream.begin();
  CHECK(std::get<0>(*it).size(0) == 10);
  CHECK(*counting.reads == 10);  // one batch read, none of the million skipped
}

TEST_CASE("DataLoader: background workers change no order and pass errors on") {
  auto reference = loader_of(200, {.batch_size = 7, .shuffle = true, .seed = 4});
  const auto expected = ids_of(reference.batches({.repeat = true, .skip = 3}), 90);
  for (int workers : {1, 2, 5}) {
    auto loader = loader_of(200, {.batch_size = 7, .shuffle = true, .seed = 4, .workers = workers, .prefetch = 3});
    CHECK(ids_of(loader.batches({.repeat = true, .skip = 3}), 90) == expected);
  }
  struct Failing {
    std::int64_t size() const { return 100; }
    std::tuple<torch::Tensor> get_batch(const torch::Tensor& indices) const {
      if (indices[0].item<std::int64_t>() >= 50) throw DataError("record 50 is unreadable");
      return {indices.clone()};
    }
  };
  DataLoader failing(Failing{}, {.batch_size = 10, .workers = 2});
  CHECK_THROWS_WITH_AS(ids_of(failing), "record 50 is unreadable", DataError);
}

TEST_CASE("DataLoader over a per-example dataset: nested batches collated") {
  struct Records {
    std::int64_t size() const { return 10; }
    std::tuple<torch::Tensor, std::int64_t, std::map<std::string, torch::Tensor>, std::vector<double>> get(std::int64_t i) const {
      return {torch::full({2}, static_cast<float>(i)), i, {{"mask", torch::ones({3}) * i}}, {double(i), double(-i)}};
    }
  };
  static_assert(ExampleDataset<Records>);
  DataLoader loader(Records{}, {.batch_size = 4, .shuffle = true, .seed = 2, .workers = 2});
  auto vectorised = loader_of(10, {.batch_size = 4, .shuffle = true, .seed = 2});
  const auto order = ids_of(vectorised);
  std::size_t at = 0;
  for (auto&& [x, id, map, pair] : loader) {
    CHECK(x.sizes() == torch::IntArrayRef({id.size(0), 2}));
    CHECK((id.scalar_type() == torch::kLong));
    CHECK(map.at("mask").sizes() == torch::IntArrayRef({id.size(0), 3}));
    REQUIRE(pair.size() == 2);
    CHECK(torch::equal(pair[1], -pair[0]));
    for (std::int64_t i = 0; i < id.size(0); ++i) CHECK(id[i].item<std::int64_t>() == order[at++]);
  }
  CHECK(at == 10);
  auto custom = DataLoader(with_collate(Records{}, [](const auto& examples) { return static_cast<std::int64_t>(examples.size()); }),
                           {.batch_size = 3});
  std::vector<std::int64_t> sizes;
  for (auto&& n : custom) sizes.push_back(n);
  CHECK(sizes == std::vector<std::int64_t>{3, 3, 3, 1});
}

namespace {
using Batches = std::vector<std::vector<std::int64_t>>;

std::vector<std::int64_t> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU, torch::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}
/// The record ids of a stream of batches, batch by batch.
template <class Range>
Batches batches_of(Range&& batches, std::int64_t max_batches) {
  Batches out;
  for (auto&& [x] : batches) {
    out.push_back(to_vector(x));
    if (static_cast<std::int64_t>(out.size()) == max_batches) break;
  }
  return out;
}

/// A user's batch sampler: 13 records in batches of 3, 5, 2 and 3, rotated by one record each epoch.
/// It counts the calls for each epoch.
struct RotatingBatches {
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::map<std::int64_t, int>> calls = std::make_shared<std::map<std::int64_t, int>>();

  static Batches expected(std::int64_t epoch) {
    Batches out;
    std::int64_t at = 0;
    for (std::int64_t size : {3, 5, 2, 3}) {
      std::vector<std::int64_t> batch;
      for (std::int64_t i = 0; i < size; ++i) batch.push_back((epoch + at++) % 13);
      out.push_back(batch);
    }
    return out;
  }
  std::vector<torch::Tensor> operator()(std::int64_t epoch) const {
    {
      std::lock_guard lock(*mutex);
      ++(*calls)[epoch];
    }
    std::vector<torch::Tensor> out;
    for (const auto& batch : expected(epoch)) out.push_back(torch::tensor(batch, torch::kLong));
    return out;
  }
};
}  // namespace

TEST_CASE("DataLoader: a user batch sampler, repeated, sharded over 3 replicas and skipped across epoch boundaries") {
  RotatingBatches sampler;
  auto loader = loader_of(13, {.batch_sampler = sampler});
  CHECK(loader.size() == 4);
  CHECK(loader.num_records() == 13);
  CHECK(loader.batches_for({.num_replicas = 3, .rank = 0}) == 2);
  CHECK(loader.batches_for({.num_replicas = 3, .rank = 1}) == 1);
  CHECK(*sampler.calls == std::map<std::int64_t, int>{{0, 1}});  // epoch 0 only, for the number of batches
  // Rank 1 of 3 reads global batches 1, 4, 7, ...; skipping 5 of them starts at 16: epoch 4's first
  // batch, then 19 (epoch 4's last), 22 (epoch 5's third), 25 (epoch 6's second).
  CHECK(batches_of(loader.batches({.repeat = true, .skip = 5, .num_replicas = 3, .rank = 1}), 4) ==
        Batches{{4, 5, 6}, {1, 2, 3}, {0, 1}, {9, 10, 11, 12, 0}});
  // Each epoch read was asked for once; the skipped epochs 1 to 3 never.
  CHECK(*sampler.calls == std::map<std::int64_t, int>{{0, 1}, {4, 1}, {5, 1}, {6, 1}});
  // Skipping 2 starts at global batch 7: epoch 1's last batch, then one batch of each next epoch.
  CHECK(batches_of(loader.batches({.repeat = true, .skip = 2, .num_replicas = 3, .rank = 1}), 4) ==
        Batches{{11, 12, 0}, {10, 11}, {6, 7, 8, 9, 10}, {4, 5, 6}});
  // Every rank and skip: global batch g = rank + 3 (skip + j) is batch g % 4 of epoch g / 4.
  for (std::int64_t rank = 0; rank < 3; ++rank)
    for (std::int64_t skip : {0, 1, 4, 7}) {
      Batches expected;
      for (std::int64_t j = 0; j < 6; ++j) {
        const std::int64_t g = rank + 3 * (skip + j);
        expected.push_back(RotatingBatches::expected(g / 4)[static_cast<std::size_t>(g % 4)]);
      }
      CHECK(batches_of(loader.batches({.repeat = true, .skip = skip, .num_replicas = 3, .rank = rank}), 6) == expected);
    }
  // One pass (validation): epoch 0, sharded.
  CHECK(batches_of(loader.batches({.num_replicas = 3, .rank = 0}), 10) == Batches{{0, 1, 2}, {10, 11, 12}});
  CHECK(batches_of(loader.batches({.num_replicas = 3, .rank = 2}), 10) == Batches{{8, 9}});
  CHECK(batches_of(loader, 10) == RotatingBatches::expected(0));
}

TEST_CASE("DataLoader: a batch sampler is called once per epoch, never per batch, with workers prefetching across epochs") {
  RotatingBatches sampler;
  auto loader = loader_of(13, {.batch_sampler = sampler, .workers = 3, .prefetch = 4});
  auto reference = loader_of(13, {.batch_sampler = RotatingBatches{}});
  const LoaderChain chain{.repeat = true, .skip = 5, .num_replicas = 3, .rank = 2};
  // Rank 2's batches from its 6th: global batches 17, 20, ..., epochs 4 onwards, 3 workers 12 batches ahead.
  CHECK(batches_of(loader.batches(chain), 30) == batches_of(reference.batches(chain), 30));
  for (const auto& entry : *sampler.calls) {
    INFO("epoch " << entry.first);
    CHECK(entry.second == 1);
  }
  CHECK(sampler.calls->count(1) + sampler.calls->count(2) + sampler.calls->count(3) == 0);
  CHECK(sampler.calls->count(26) == 1);  // global batch 104, the 30th read
}

TEST_CASE("DataLoader: a user sampler's order cut into batches of 4, with and without drop_last") {
  // The 11 even records of 22, in order in even epochs and reversed in odd ones (int32: converted).
  auto evens = [](std::int64_t epoch) {
    const torch::Tensor order = torch::arange(0, 22, 2, torch::kInt);
    return epoch % 2 == 0 ? order : order.flip({0});
  };
  auto keep = loader_of(22, {.batch_size = 4, .sampler = evens});
  CHECK(keep.size() == 3);
  CHECK(keep.num_records() == 22);
  CHECK(batches_of(keep.batches({.repeat = true}), 6) ==
        Batches{{0, 2, 4, 6}, {8, 10, 12, 14}, {16, 18, 20}, {20, 18, 16, 14}, {12, 10, 8, 6}, {4, 2, 0}});
  auto drop = loader_of(22, {.batch_size = 4, .drop_last = true, .sampler = evens});
  CHECK(drop.size() == 2);
  CHECK(batches_of(drop.batches({.repeat = true}), 4) == Batches{{0, 2, 4, 6}, {8, 10, 12, 14}, {20, 18, 16, 14}, {12, 10, 8, 6}});
  // Sharded and skipped like built-in batches: rank 2 of 3 reads global batches 2, 5, 8, 11; skipping one starts at 5.
  CHECK(batches_of(keep.batches({.repeat = true, .skip = 1, .num_replicas = 3, .rank = 2}), 3) ==
        Batches{{4, 2, 0}, {16, 18, 20}, {4, 2, 0}});
  CHECK(batches_of(drop.batches({.repeat = true, .num_replicas = 3, .rank = 1}), 3) ==
        Batches{{8, 10, 12, 14}, {0, 2, 4, 6}, {12, 10, 8, 6}});
  CHECK(ids_of(drop) == std::vector<std::int64_t>{0, 2, 4, 6, 8, 10, 12, 14});  // one pass: epoch 0
  // A sampler may repeat records (weighted sampling) and leave others out.
  auto weighted = loader_of(5, {.batch_size = 2, .sampler = [](std::int64_t) { return torch::tensor({4, 4, 1, 4, 0}); }});
  CHECK(batches_of(weighted.batches({.repeat = true, .skip = 2}), 2) == Batches{{0}, {4, 4}});  // batches {4, 4}, {1, 4}, {0}
}

TEST_CASE("samplers::ReproducibleShuffleSampler is the loader's own shuffle, and works as its sampler") {
  auto shuffled = loader_of(37, {.batch_size = 5, .shuffle = true, .seed = 11});  // 8 batches, the last of 2
  const samplers::ReproducibleShuffleSampler shuffle(37, 11);
  std::vector<std::int64_t> expected = to_vector(shuffle(0));
  const std::vector<std::int64_t> epoch1 = to_vector(shuffle(1));
  expected.insert(expected.end(), epoch1.begin(), epoch1.end());
  CHECK(ids_of(shuffled.batches({.repeat = true}), 2 * shuffled.size()) == expected);
  CHECK(torch::equal(shuffled.sampler().order(3), shuffle(3)));
  auto as_sampler = loader_of(37, {.batch_size = 5, .sampler = shuffle});
  for (const LoaderChain& chain : {LoaderChain{.repeat = true}, LoaderChain{.repeat = true, .skip = 4, .num_replicas = 3, .rank = 2},
                                   LoaderChain{.num_replicas = 3, .rank = 1}})
    CHECK(batches_of(as_sampler.batches(chain), 20) == batches_of(shuffled.batches(chain), 20));
  // Over an inner sampler: that sampler's order of each epoch, shuffled reproducibly.
  const samplers::ReproducibleShuffleSampler odd_shuffle([](std::int64_t) { return torch::arange(1, 37, 2); }, 11);
  std::vector<std::int64_t> odd = to_vector(odd_shuffle(2));
  CHECK(odd != to_vector(torch::arange(1, 37, 2)));
  std::sort(odd.begin(), odd.end());
  CHECK(odd == to_vector(torch::arange(1, 37, 2)));
  CHECK(torch::equal(odd_shuffle(2), odd_shuffle(2)));
  CHECK(!torch::equal(odd_shuffle(2), odd_shuffle(3)));
}

TEST_CASE("samplers::repeat, distribute and skip are the loader's chain") {
  auto loader = loader_of(29, {.batch_size = 4, .shuffle = true, .seed = 3});  // 8 batches, the last of 1
  const samplers::ReproducibleShuffleSampler shuffle(29, 3);
  // A user's batches: batch i of epoch e cut from the epoch's shuffled order.
  auto batch_of = [shuffle](std::int64_t epoch, std::int64_t i) {
    return shuffle(epoch).narrow(0, 4 * i, std::min<std::int64_t>(4, 29 - 4 * i));
  };
  for (std::int64_t n : {1, 3})
    for (std::int64_t rank = 0; rank < n; ++rank)
      for (std::int64_t skip : {0, 2, 7}) {
        INFO("rank " << rank << " of " << n << ", skip " << skip);
        CHECK(samplers::distributed_length(loader.size(), n, rank) == loader.batches_for({.num_replicas = n, .rank = rank}));
        Batches endless;
        for (const torch::Tensor& b : samplers::repeat(loader.size(), batch_of) | samplers::distribute(n, rank) | samplers::skip(skip)) {
          endless.push_back(to_vector(b));
          if (endless.size() == 12) break;
        }
        CHECK(endless == batches_of(loader.batches({.repeat = true, .skip = skip, .num_replicas = n, .rank = rank}), 12));
        Batches once;
        for (const torch::Tensor& b : samplers::one_epoch(loader.size(), batch_of) | samplers::distribute(n, rank) | samplers::skip(skip))
          once.push_back(to_vector(b));
        CHECK(once == batches_of(loader.batches({.skip = skip, .num_replicas = n, .rank = rank}), 100));
      }
  // A fixed sequence of batches, the same every epoch: the unshuffled loader's chain.
  auto plain = loader_of(10, {.batch_size = 3});
  const std::vector<torch::Tensor> epoch = {torch::arange(0, 3), torch::arange(3, 6), torch::arange(6, 9), torch::arange(9, 10)};
  Batches fixed;
  for (const torch::Tensor& b : epoch | samplers::repeat | samplers::distribute(3, 1) | samplers::skip(2)) {
    fixed.push_back(to_vector(b));
    if (fixed.size() == 3) break;
  }
  CHECK(fixed == Batches{{9}, {6, 7, 8}, {3, 4, 5}});  // global batches 7, 10, 13
  CHECK(fixed == batches_of(plain.batches({.repeat = true, .skip = 2, .num_replicas = 3, .rank = 1}), 3));
  // An rvalue sequence is kept by the view.
  auto kept = samplers::repeat(std::vector<torch::Tensor>{torch::arange(2), torch::arange(2, 5)}) | samplers::skip(3);
  CHECK(to_vector(*ranges::begin(kept)) == std::vector<std::int64_t>{2, 3, 4});
}

TEST_CASE("DataLoader: every misuse of a sampler or batch sampler is named") {
  auto evens = [](std::int64_t) { return torch::arange(0, 10, 2); };
  auto pairs = [](std::int64_t) { return std::vector<torch::Tensor>{torch::arange(0, 2), torch::arange(2, 4)}; };
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 2, .shuffle = true, .sampler = evens}),
                       "DataLoader: the sampler option is mutually exclusive with shuffle (shuffle in the sampler, with "
                       "dettrial::samplers::ReproducibleShuffleSampler)",
                       DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 2, .batch_sampler = pairs}),
                       "DataLoader: the batch_sampler option is mutually exclusive with batch_size (the batch sampler makes "
                       "the batches: leave batch_size at its default)",
                       DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.shuffle = true, .batch_sampler = pairs}),
                       doctest::Contains("the batch_sampler option is mutually exclusive with shuffle"), DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.drop_last = true, .batch_sampler = pairs}),
                       doctest::Contains("the batch_sampler option is mutually exclusive with drop_last"), DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.sampler = evens, .batch_sampler = pairs}),
                       doctest::Contains("the batch_sampler option is mutually exclusive with sampler"), DataError);
  CHECK_NOTHROW(loader_of(10, {.batch_sampler = pairs}));

  // A length that changes between epochs: found when the epoch is read.
  auto shrinking = loader_of(10, {.batch_size = 4, .sampler = [](std::int64_t epoch) { return torch::arange(10 - epoch); }});
  CHECK_THROWS_WITH_AS(ids_of(shrinking.batches({.repeat = true}), 4),
                       "DataLoader: the sampler gave 9 records in epoch 1 but 10 in epoch 0; every epoch must have the same "
                       "length (repeat, shard and skip count on it)",
                       DataError);
  auto fewer =
      loader_of(10, {.batch_sampler = [](std::int64_t epoch) { return std::vector<torch::Tensor>(epoch == 0 ? 3 : 2, torch::arange(3)); }});
  CHECK_THROWS_WITH_AS(batches_of(fewer.batches({.repeat = true}), 4),
                       doctest::Contains("the batch_sampler gave 2 batches in epoch 1 but 3 in epoch 0"), DataError);

  // Indices out of range, by value.
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 2, .sampler = [](std::int64_t) { return torch::tensor({0, 12, 3}); }}),
                       "DataLoader: the sampler gave record index 12 in epoch 0, but the dataset has 10 records", DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 2, .sampler = [](std::int64_t) { return torch::tensor({-1, 2}); }}),
                       doctest::Contains("gave record index -1 in epoch 0"), DataError);
  CHECK_THROWS_WITH_AS(
      loader_of(10, {.batch_sampler = [](std::int64_t) { return std::vector<torch::Tensor>{torch::tensor({1, 2}), torch::tensor({10})}; }}),
      "DataLoader: batch 1 of the batch_sampler gave record index 10 in epoch 0, but the dataset has 10 records", DataError);
  // Not 1-D integer indices, nothing to read.
  CHECK_THROWS_WITH_AS(loader_of(10, {.sampler = [](std::int64_t) { return torch::zeros({2, 2}, torch::kLong); }}),
                       doctest::Contains("the sampler must give a 1-D tensor of record indices, not a 2-D tensor in epoch 0"), DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.sampler = [](std::int64_t) { return torch::arange(0., 3.); }}),
                       doctest::Contains("the sampler must give integer record indices, not Float in epoch 0"), DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.sampler = [](std::int64_t) { return torch::empty({0}, torch::kLong); }}),
                       "DataLoader: the sampler gave no records in epoch 0", DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_sampler = [](std::int64_t) { return std::vector<torch::Tensor>{}; }}),
                       "DataLoader: the batch_sampler gave no batches in epoch 0", DataError);
  CHECK_THROWS_WITH_AS(
      loader_of(10, {.batch_sampler =
                         [](std::int64_t) { return std::vector<torch::Tensor>{torch::tensor({1}), torch::empty({0}, torch::kLong)}; }}),
      "DataLoader: batch 1 of the batch_sampler is empty in epoch 0", DataError);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 8, .drop_last = true, .sampler = evens}),
                       "DataLoader: batch_size 8 is larger than the sampler's 5 records, so drop_last leaves no batch", DataError);

  // The chain adaptors check their arguments.
  CHECK_THROWS_WITH_AS(samplers::distribute(3, 3), "samplers::distribute: rank 3 is not among 3 replicas", DataError);
  CHECK_THROWS_WITH_AS(samplers::skip(-1), "samplers::skip: cannot skip a negative number of batches (-1)", DataError);
  CHECK_THROWS_WITH_AS(samplers::repeat(std::vector<torch::Tensor>{}), "samplers::repeat: an epoch needs at least one batch, not 0",
                       DataError);
}

namespace {
std::string idx_bytes(const std::vector<std::uint8_t>& data, std::vector<std::uint32_t> dims, std::uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims) {
    s += static_cast<char>(d >> 24), s += static_cast<char>(d >> 16), s += static_cast<char>(d >> 8), s += static_cast<char>(d);
  }
  s.append(data.begin(), data.end());
  return s;
}
void write_file(const std::filesystem::path& p, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(p.string().c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary) << bytes;
  }
}
}  // namespace

/// Global batch `step` of `layout` ranks reading `loader` (batch size `global / layout` each): the
/// records of every rank's batch `step`, in rank order.
std::vector<std::int64_t> global_batch_of(std::int64_t records, DataLoaderOptions o, std::int64_t global, std::int64_t ranks,
                                          std::int64_t layout, std::int64_t step, int workers = 0) {
  o.batch_size = global / ranks;
  o.workers = workers;
  const Loader loader = loader_of(records, o);
  std::vector<std::int64_t> out;
  for (std::int64_t rank = 0; rank < ranks; ++rank) {
    const auto ids =
        ids_of(loader.batches({.repeat = true, .skip = step, .num_replicas = ranks, .rank = rank, .layout_replicas = layout}), 1);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

TEST_CASE("DataLoader: a job of another rank count reads the global batches of the one it began as, skipping to any of them") {
  // 99 records, global batch 6: 2 ranks read batches of 3 (33 an epoch, odd), 3 ranks batches of 2
  // (50, the last of 1 record), 1 rank batches of 6 (17, the last of 3): global batches across an
  // epoch's end hold records of two epochs, in the begun count's own way.
  for (const DataLoaderOptions o : {DataLoaderOptions{.shuffle = true, .seed = 5}, DataLoaderOptions{},
                                    DataLoaderOptions{.sampler = samplers::ReproducibleShuffleSampler(99, 3)}})
    for (const std::int64_t layout : {1, 2, 3})
      for (const std::int64_t ranks : {1, 2, 3}) {
        CAPTURE(layout);
        CAPTURE(ranks);
        for (const std::int64_t step : {0, 15, 16, 17, 33, 34, 50, 1000}) {
          CAPTURE(step);
          const auto expected = global_batch_of(99, o, 6, layout, layout, step);
          CHECK(global_batch_of(99, o, 6, ranks, layout, step) == expected);
          if (step == 16) CHECK(global_batch_of(99, o, 6, ranks, layout, step, /*workers=*/2) == expected);
        }
      }
  // Resumed at global batch 10, a 3-rank job reads on as the 2-rank one would, batch after batch.
  const DataLoaderOptions shuffled{.shuffle = true, .seed = 9};
  std::vector<std::int64_t> two, three;
  for (std::int64_t step = 10; step < 60; ++step) {
    const auto a = global_batch_of(99, shuffled, 6, 2, 2, step), b = global_batch_of(99, shuffled, 6, 3, 2, step);
    two.insert(two.end(), a.begin(), a.end());
    three.insert(three.end(), b.begin(), b.end());
  }
  CHECK(two == three);
}

TEST_CASE("BatchSampler: a share of a global batch across an epoch's end says where the next epoch begins") {
  // 2 ranks' batches of 3 over 99 records: global batch 16 is epoch 0's last batch (3 records) and
  // epoch 1's first. On 3 ranks, rank 1 takes records 2..3 of it: one of each epoch.
  const BatchSampler stream(99, 3, /*drop_last=*/false, /*shuffle=*/true, 4);
  const BatchSlice share = stream.share_of_global_batch(16, 2, 3, 1);
  CHECK(share.epoch == 0);
  CHECK(share.count == 2);
  CHECK(share.epoch_starts == std::vector<std::int64_t>{1});
  CHECK(share.indices[0].item<std::int64_t>() == stream.order(0)[98].item<std::int64_t>());
  CHECK(share.indices[1].item<std::int64_t>() == stream.order(1)[0].item<std::int64_t>());
  const BatchOrigin origin{share.epoch, 4, share.epoch_starts};
  CHECK(origin.epoch_of(0) == 0);
  CHECK(origin.epoch_of(1) == 1);
  // Rank 2 takes records 4..5, both of epoch 1: one piece, no epoch start.
  const BatchSlice last = stream.share_of_global_batch(16, 2, 3, 2);
  CHECK(last.epoch == 1);
  CHECK(last.epoch_starts.empty());
}

TEST_CASE("DataLoader: a global batch that cannot be shared among a job's ranks is refused in one sentence") {
  const Loader five = loader_of(99, {.batch_size = 5});
  CHECK_THROWS_WITH_AS(five.batches({.repeat = true, .num_replicas = 2, .layout_replicas = 3}),
                       "DataLoader: the global batch of 10 records (batch_size 5 on each of 2 ranks) does not divide among the 3 ranks "
                       "of a run begun on 3 ranks, whose global batches a resumed run keeps",
                       DataError);
  // 97 records in batches of 6 end each epoch in a batch of 1 record, which 2 ranks cannot share.
  const Loader three = loader_of(97, {.batch_size = 3});
  CHECK_THROWS_WITH_AS(three.batches({.repeat = true, .num_replicas = 2, .layout_replicas = 1}),
                       "DataLoader: a run begun on 1 rank has global batches of only 1 record at its epochs' ends (a short last batch), "
                       "too few for 2 ranks to share; resume on at most 1 rank, or set drop_last",
                       DataError);
  CHECK_NOTHROW(loader_of(97, {.batch_size = 3, .drop_last = true}).batches({.repeat = true, .num_replicas = 2, .layout_replicas = 1}));
}

TEST_CASE("read_idx reads raw and gzip IDX files and names what is wrong with broken ones") {
  const auto dir = std::filesystem::temp_directory_path() / ("dettrial-idx-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::uint8_t> pixels = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (bool gzip : {false, true}) {
    const auto p = dir / (gzip ? "images.gz" : "images");
    write_file(p, idx_bytes(pixels, {3, 2, 2}), gzip);
    const torch::Tensor t = read_idx(p);
    CHECK(t.sizes() == torch::IntArrayRef({3, 2, 2}));
    CHECK((t.scalar_type() == torch::kUInt8));
    CHECK(t[2][1][1].item<int>() == 12);
  }
  // int32 elements are big-endian on disk.
  write_file(dir / "ints", idx_bytes({0, 0, 1, 2, 255, 255, 255, 255}, {2}, 0x0C), false);
  const torch::Tensor ints = read_idx(dir / "ints");
  CHECK(ints[0].item<int>() == 258);
  CHECK(ints[1].item<int>() == -1);

  write_file(dir / "short.gz", idx_bytes({1, 2, 3}, {3, 2, 2}), true);
  CHECK_THROWS_WITH_AS(read_idx(dir / "short.gz"), doctest::Contains("is truncated: its data needs 12 bytes, found 3"), DataError);
  // Headers the fuzzer found (tests/fuzz/regressions/idx): one declaring 60000 x 28 x 1000000 floats
  // (6.7 TB) over 16 bytes of data, read in chunks as the data arrives (it was allocated whole before
  // the read), and one whose sizes overflow 64 bits.
  for (bool gzip : {false, true}) {
    write_file(dir / "huge", idx_bytes(std::vector<std::uint8_t>(16, 0), {60000, 28, 1000000}, 0x0D), gzip);
    CHECK_THROWS_WITH_AS(read_idx(dir / "huge"), doctest::Contains("is truncated: its data needs 6720000000000 bytes, found 16"),
                         DataError);
  }
  write_file(dir / "overflow", idx_bytes(std::vector<std::uint8_t>(8, 0), {0xffffffffU, 0xffffffffU, 0xffffffffU, 2}, 0x0E), false);
  CHECK_THROWS_WITH_AS(read_idx(dir / "overflow"),
                       doctest::Contains("declares 4294967295 x 4294967295 x 4294967295 x 2 elements: more data than an IDX file holds"),
                       DataError);
  write_file(dir / "text", "hello world", false);
  CHECK_THROWS_WITH_AS(read_idx(dir / "text"), doctest::Contains("is not an IDX file"), DataError);
  CHECK_THROWS_WITH_AS(read_idx(dir / "absent"), doctest::Contains("absent': no such file"), DataError);
  CHECK_THROWS_WITH_AS(load_mnist(dir, "train"), doctest::Contains("no MNIST images file for split 'train'"), DataError);
  write_file(dir / "train-images-idx3-ubyte.gz", idx_bytes(pixels, {3, 2, 2}), true);
  write_file(dir / "train-labels-idx1-ubyte.gz", idx_bytes({1, 2}, {2}), true);
  CHECK_THROWS_WITH_AS(load_mnist(dir, "train"), doctest::Contains("inconsistent: images 3 x ..., labels 2"), DataError);
  write_file(dir / "wrong-type", idx_bytes({1, 2}, {2}, 0x0A), false);
  CHECK_THROWS_WITH_AS(read_idx(dir / "wrong-type"), doctest::Contains("unknown element type 0x0A"), DataError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("real data: Fashion-MNIST from Debian's dataset-fashion-mnist") {
  const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz"))
    return test::skip("Debian's dataset-fashion-mnist is not installed (scripts/test installs it)");
  const MnistSplit train = load_mnist(dir, "train");
  const MnistSplit test = load_mnist(dir, "t10k");
  CHECK(train.images.sizes() == torch::IntArrayRef({60000, 28, 28}));
  CHECK(test.images.sizes() == torch::IntArrayRef({10000, 28, 28}));
  CHECK(train.labels.max().item<int>() == 9);
  CHECK(torch::bincount(test.labels.to(torch::kLong)).eq(1000).all().item<bool>());  // 1000 of each class
}

#ifdef DETTRIAL_MNIST10K_DIR
TEST_CASE("real data: the 10,000 MNIST digits") {
  const std::filesystem::path dir = DETTRIAL_MNIST10K_DIR;
  if (!std::filesystem::exists(dir)) return test::skip(dir.string() + " is absent (the 10,000 MNIST digits)");
  const MnistSplit digits = load_mnist(dir, "t10k");
  CHECK(digits.images.sizes() == torch::IntArrayRef({10000, 28, 28}));
  CHECK(digits.labels.min().item<int>() == 0);
  CHECK(digits.labels.max().item<int>() == 9);
}
#endif
