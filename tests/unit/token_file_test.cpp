// Token data: files of token ids as NumPy's tofile writes nanoGPT's train.bin, their windows in
// both orders through the DataLoader (ranks, workers, resume), and every bad file named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <dettrial/dettrial.hpp>
#include <dettrial/tokens.hpp>

#include "skip.hpp"

namespace {
namespace fs = std::filesystem;
using dettrial::DataError;
using dettrial::TokenFile;
using dettrial::TokenWidth;
using dettrial::TokenWindows;
using dettrial::WindowOrder;

fs::path token_dir() {
  const fs::path dir = fs::temp_directory_path() / ("dettrial-tokens-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

/// Token i of the test files: a pattern that differs at every place and passes 255 (a byte's range).
std::int64_t token_at(std::int64_t i, std::int64_t vocab) { return (i * 7919 + i / 3) % vocab; }

/// `count` tokens of token_at written as NumPy writes nanoGPT's train.bin (`np.array(ids,
/// dtype=np.uint16).tofile(path)`), by the Python of this LibTorch's torch; by this process where
/// there is none (the layout is the same: little-endian ids back to back).
fs::path numpy_token_file(const std::string& name, std::int64_t count, std::int64_t vocab, const std::string& dtype) {
  const fs::path path = token_dir() / name;
  const char* python = std::getenv("DETTRIAL_TEST_PYTHON");
  if (python && *python) {
    const std::string command = "'" + std::string(python) + "' -c 'import numpy as np, sys; i = np.arange(" + std::to_string(count) +
                                ", dtype=np.int64); np.array((i * 7919 + i // 3) % " + std::to_string(vocab) + ", dtype=np." + dtype +
                                ").tofile(sys.argv[1])' '" + path.string() + "'";
    if (std::system(command.c_str()) == 0) return path;
  }
  std::ofstream out(path, std::ios::binary);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto id = static_cast<std::uint32_t>(token_at(i, vocab));
    out.write(reinterpret_cast<const char*>(&id), dtype == "uint16" ? 2 : 4);
  }
  return path;
}

std::vector<std::int64_t> values(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

/// The (input, target) batches of a rank's stream, as offsets of their first tokens.
template <class Loader>
std::vector<std::int64_t> first_tokens(const Loader& loader, dettrial::LoaderChain chain, std::int64_t batches) {
  std::vector<std::int64_t> out;
  std::int64_t n = 0;
  for (auto&& [x, y] : loader.batches(chain)) {
    for (std::int64_t i = 0; i < x.size(0); ++i)
      out.push_back(x[i][0].template item<std::int64_t>() * 100000 + y[i][0].template item<std::int64_t>());
    if (++n == batches) break;
  }
  return out;
}
}  // namespace

TEST_CASE("TokenFile: NumPy's uint16 and uint32 token files read as they were written, any range") {
  const fs::path u16 = numpy_token_file("train.bin", 10'007, 65, "uint16");
  const TokenFile file(u16);
  CHECK(file.size() == 10'007);
  const std::vector<std::int64_t> got = values(file.tokens(9'000, 1'007));
  for (std::int64_t i = 0; i < 1'007; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == token_at(9'000 + i, 65));
  const fs::path u32 = numpy_token_file("large.bin", 5'001, 100'000, "uint32");
  const TokenFile large(u32, TokenWidth::u32, 100'000);
  CHECK(large.size() == 5'001);
  CHECK(values(large.tokens(4'990, 11)) == [] {
    std::vector<std::int64_t> v;
    for (std::int64_t i = 4'990; i < 5'001; ++i) v.push_back(token_at(i, 100'000));
    return v;
  }());
  // Copies share the mapping, which outlives the first.
  const TokenFile copy = [&] { return TokenFile(u16); }();
  CHECK(copy.tokens(0, 3).equal(file.tokens(0, 3)));
}

TEST_CASE("TokenFile: a missing, empty, odd-sized or out-of-vocabulary file, and a range past its end, are named") {
  const fs::path dir = token_dir();
  CHECK_THROWS_WITH_AS(TokenFile(dir / "absent.bin"), doctest::Contains("cannot read token file '"), DataError);
  std::ofstream(dir / "empty.bin").close();
  CHECK_THROWS_WITH_AS(TokenFile(dir / "empty.bin"), doctest::Contains("empty.bin': it is empty"), DataError);
  std::ofstream(dir / "odd.bin", std::ios::binary) << "abcde";
  CHECK_THROWS_WITH_AS(TokenFile(dir / "odd.bin"), doctest::Contains("5 bytes, not a whole number of 2-byte token ids"), DataError);
  CHECK_THROWS_WITH_AS(TokenFile(dir / "odd.bin", TokenWidth::u32), doctest::Contains("not a whole number of 4-byte"), DataError);
  CHECK_THROWS_WITH_AS(TokenFile{dir}, doctest::Contains("not a file"), DataError);
  const fs::path u16 = numpy_token_file("vocab.bin", 1'000, 65, "uint16");
  const TokenFile small_vocab(u16, TokenWidth::u16, 60);
  CHECK_NOTHROW(small_vocab.tokens(0, 1));  // token 0 is id 0
  CHECK_THROWS_WITH_AS(small_vocab.tokens(0, 1'000), doctest::Contains("past the vocabulary of 60"), DataError);
  const TokenFile file(u16);
  CHECK_THROWS_WITH_AS(file.tokens(990, 11), doctest::Contains("tokens [990, 1001) asked for, but it has 1000"), DataError);
  CHECK_THROWS_WITH_AS(file.tokens(-1, 2), doctest::Contains("asked for"), DataError);
  CHECK_THROWS_WITH_AS(TokenWindows(file, {.block_size = 1'000}), doctest::Contains("fewer than one window of block_size + 1 = 1001"),
                       DataError);
  CHECK_THROWS_WITH_AS(TokenWindows(file, {.block_size = 0}), doctest::Contains("block_size must be positive"), DataError);
  CHECK_THROWS_WITH_AS(TokenWindows(file, {.block_size = 8, .windows_per_epoch = 5}),
                       doctest::Contains("windows_per_epoch is for WindowOrder::random"), DataError);
}

TEST_CASE("TokenWindows: consecutive windows cover the file once an epoch, the target the input one token on") {
  const TokenFile file(numpy_token_file("windows.bin", 1'001, 65, "uint16"));
  const TokenWindows windows(file, {.block_size = 64});
  CHECK(windows.size() == 15);  // (1001 - 1) / 64: the last 40 tokens make no whole window
  const auto [x, y] = windows.get_batch(torch::tensor({14, 0, 3}, torch::kLong), {});
  CHECK(x.sizes() == torch::IntArrayRef({3, 64}));
  CHECK(x.is_contiguous());
  CHECK(y.is_contiguous());
  for (const auto& [row, record] : std::initializer_list<std::pair<int, int>>{{0, 14}, {1, 0}, {2, 3}}) {
    CHECK(values(x[row]) == values(file.tokens(record * 64, 64)));
    CHECK(values(y[row]) == values(file.tokens(record * 64 + 1, 64)));
  }
  // A batch owns its tensors: changing one changes neither the other nor the next read.
  x.fill_(-1);
  CHECK(y[0][0].item<std::int64_t>() == token_at(14 * 64 + 1, 65));
  CHECK(std::get<0>(windows.get_batch(torch::tensor({14}, torch::kLong), {}))[0][0].item<std::int64_t>() == token_at(14 * 64, 65));

  // Through the loader, shuffled: an epoch is every window once, in an order of the seed's.
  const auto loader = dettrial::DataLoader(windows, {.batch_size = 4, .shuffle = true, .seed = 5});
  std::multiset<std::int64_t> epoch;
  for (auto&& [bx, by] : loader.batches({})) {
    for (std::int64_t i = 0; i < bx.size(0); ++i) epoch.insert(bx[i][0].item<std::int64_t>() * 100000 + by[i][63].item<std::int64_t>());
  }
  std::multiset<std::int64_t> expected;
  for (std::int64_t r = 0; r < 15; ++r) expected.insert(token_at(r * 64, 65) * 100000 + token_at(r * 64 + 64, 65));
  CHECK(epoch == expected);
}

TEST_CASE("TokenWindows: random windows are the seed's, differ by rank, and a resumed or threaded loader draws the same") {
  const TokenFile file(numpy_token_file("random.bin", 20'000, 65, "uint16"));
  const TokenWindows windows(file, {.block_size = 32, .order = WindowOrder::random, .windows_per_epoch = 90});
  CHECK(windows.size() == 90);
  // Offsets: within nanoGPT's [0, size - block_size), a pure function of (record, epoch, seed).
  std::set<std::int64_t> offsets;
  for (std::int64_t r = 0; r < 90; ++r) {
    const std::int64_t o = windows.offset(r, 0, 11);
    CHECK(o >= 0);
    CHECK(o < 20'000 - 32);
    CHECK(o == windows.offset(r, 0, 11));
    offsets.insert(o);
  }
  CHECK(offsets.size() > 85);  // 90 draws from 19,968 places: a few coincide at most
  CHECK(windows.offset(3, 1, 11) != windows.offset(3, 0, 11));
  CHECK(windows.offset(3, 0, 12) != windows.offset(3, 0, 11));
  const auto [x, y] = windows.get_batch(torch::tensor({7}, torch::kLong), {.epoch = 2, .seed = 11});
  CHECK(values(x[0]) == values(file.tokens(windows.offset(7, 2, 11), 32)));
  CHECK(values(y[0]) == values(file.tokens(windows.offset(7, 2, 11) + 1, 32)));

  // 90 windows in batches of 8 (the last of an epoch 2 short) over 3 ranks (12 batches an epoch:
  // divisible, but the epochs cross the ranks' turns): ranks read different windows, a resume at
  // batch 5 of rank 2 continues its stream, and worker threads change nothing.
  const auto loader = dettrial::DataLoader(windows, {.batch_size = 8, .seed = 11});
  const auto rank0 = first_tokens(loader, {.repeat = true, .num_replicas = 3, .rank = 0}, 10);
  const auto rank2 = first_tokens(loader, {.repeat = true, .num_replicas = 3, .rank = 2}, 10);
  CHECK(rank0 != rank2);
  const auto resumed = first_tokens(loader, {.repeat = true, .skip = 5, .num_replicas = 3, .rank = 2}, 5);
  auto tail = first_tokens(loader, {.repeat = true, .num_replicas = 3, .rank = 2}, 10);
  tail.erase(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() - resumed.size()));
  CHECK(resumed == tail);
  const auto threaded = dettrial::DataLoader(windows, {.batch_size = 8, .seed = 11, .workers = 2});
  CHECK(first_tokens(threaded, {.repeat = true, .num_replicas = 3, .rank = 2}, 10) == rank2);

  // A resume a million batches in reads its batch without the million before it: the batch is the
  // one its epoch, record and seed give.
  const auto far = first_tokens(loader, {.repeat = true, .skip = 1'000'000}, 1);
  const std::int64_t epoch = 1'000'000 / 12, record = (1'000'000 % 12) * 8;
  const std::int64_t o = windows.offset(record, epoch, 11);
  CHECK(far.front() == file.tokens(o, 1)[0].item<std::int64_t>() * 100000 + file.tokens(o + 1, 1)[0].item<std::int64_t>());
}
