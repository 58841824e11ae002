// Data: the loader's order and lengths, the IDX reader on files the test writes, and the real datasets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>

#include <zlib.h>

#include <dettrial/dettrial.hpp>

using namespace dettrial;

namespace {
std::vector<std::int64_t> order_of(DataLoader<TensorDataset<1>>& loader) {
  std::vector<std::int64_t> out;
  for (auto&& [x] : loader)
    for (std::int64_t i = 0; i < x.size(0); ++i) out.push_back(x[i].item<std::int64_t>());
  return out;
}
DataLoader<TensorDataset<1>> loader_of(std::int64_t n, DataLoaderOptions o) {
  return DataLoader(TensorDataset(torch::arange(n, torch::kLong)), o);
}
}  // namespace

TEST_CASE("DataLoader: lengths with and without drop_last, in-order reads") {
  auto keep = loader_of(10, {.batch_size = 4});
  CHECK(keep.size() == 3);
  CHECK(order_of(keep) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto drop = loader_of(10, {.batch_size = 4, .drop_last = true});
  CHECK(drop.size() == 2);
  CHECK(order_of(drop).size() == 8);
  CHECK_THROWS_WITH_AS(loader_of(10, {.batch_size = 0}), "DataLoader batch_size must be at least 1, not 0", DataError);
  CHECK_THROWS_AS(DataLoader(TensorDataset(torch::zeros({3}), torch::zeros({4})), {.batch_size = 1}), DataError);
}

TEST_CASE("DataLoader: shuffling is a permutation per epoch, reproducible by seed and epoch") {
  auto a = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 5});
  auto b = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 5});
  auto c = loader_of(100, {.batch_size = 7, .shuffle = true, .seed = 6});
  const auto e0 = order_of(a);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> all(100);
  std::iota(all.begin(), all.end(), 0);
  CHECK(sorted == all);
  CHECK(e0 != all);
  CHECK(order_of(b) == e0);
  CHECK(order_of(c) != e0);
  a.set_epoch(1);
  const auto e1 = order_of(a);
  CHECK(e1 != e0);
  b.set_epoch(3);
  b.set_epoch(1);  // an epoch's order does not depend on what came before
  CHECK(order_of(b) == e1);
  // Without a seed, the order follows LibTorch's generator (which the trial seed seeds).
  torch::manual_seed(3);
  auto d = loader_of(100, {.batch_size = 7, .shuffle = true});
  torch::manual_seed(3);
  auto e = loader_of(100, {.batch_size = 7, .shuffle = true});
  CHECK(order_of(d) == order_of(e));
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
  std::filesystem::remove_all(dir);
}

TEST_CASE("real data: Fashion-MNIST from Debian's dataset-fashion-mnist") {
  const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: Debian's dataset-fashion-mnist is not installed (scripts/test installs it)");
    return;
  }
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
  if (!std::filesystem::exists(dir)) {
    MESSAGE("skipped: " << dir << " is absent");
    return;
  }
  const MnistSplit digits = load_mnist(dir, "t10k");
  CHECK(digits.images.sizes() == torch::IntArrayRef({10000, 28, 28}));
  CHECK(digits.labels.min().item<int>() == 0);
  CHECK(digits.labels.max().item<int>() == 9);
}
#endif
