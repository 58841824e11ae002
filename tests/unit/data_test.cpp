// Data: the loader's order and lengths, the IDX reader on files the test writes, and the real datasets.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>

#include <zlib.h>

#include <dettrial/dettrial.hpp>

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
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) return test::skip("Debian's dataset-fashion-mnist is not installed (scripts/test installs it)");
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
