// Image data: decoding against PIL, the transforms against torchvision, ImageFolder's listing against
// torchvision's, damaged files, CIFAR's binary format, and reproducible augmentation in the loader.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dettrial/vision.hpp>

#include "skip.hpp"

namespace fs = std::filesystem;
namespace vision = dettrial::vision;
using dettrial::DataError;
using dettrial::ImageError;
using vision::Image;
using vision::ImageMode;

namespace {

/// The fixtures tests/python/vision_fixtures.py wrote (CTest's fixture sets the variable), or why not.
std::optional<fs::path> fixtures(std::string& why) {
  const char* dir = std::getenv("DETTRIAL_VISION_FIXTURES");
  if (!dir || !fs::exists(fs::path(dir) / "manifest.json")) {
    why = "no image fixtures (tests/python/vision_fixtures.py needs a Python with PIL and NumPy: -DDETTRIAL_PYTHON)";
    return std::nullopt;
  }
  if (!vision::decodes_jpeg || !vision::decodes_png) {
    why = "this build has no JPEG or PNG decoder (libjpeg-turbo's TurboJPEG, libspng)";
    return std::nullopt;
  }
  return fs::path(dir);
}

nlohmann::json manifest_of(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<std::uint8_t> file_bytes(const fs::path& path) {
  std::vector<std::uint8_t> bytes;
  vision::read_file(path, bytes);
  return bytes;
}

template <class T>
std::vector<T> raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

Image image_of(std::int64_t h, std::int64_t w, std::int64_t c) {
  Image image(h, w, c);
  for (std::size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<std::uint8_t>(i);
  return image;
}

/// A 1-channel image's rows, for readable comparisons.
std::vector<std::vector<int>> rows_of(const Image& image) {
  std::vector<std::vector<int>> rows;
  for (std::int64_t y = 0; y < image.height; ++y) rows.emplace_back(image.row(y), image.row(y) + image.width);
  return rows;
}

vision::RecordRandom any_random() { return vision::RecordRandom(1, 0, 0); }

}  // namespace

TEST_CASE("vision: JPEG and PNG files decode to PIL's pixels, bit for bit, in RGB and L") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const auto manifest = manifest_of(*dir);
  int compared = 0;
  for (const auto& entry : manifest["pil"]) {
    const std::string file = entry["file"], mode = entry["mode"];
    CAPTURE(file);
    CAPTURE(mode);
    const Image image = vision::read_image(*dir / "images" / file, mode == "RGB" ? ImageMode::rgb : ImageMode::gray);
    const auto expected = raw<std::uint8_t>(*dir / "pil" / (file + "." + mode + ".raw"));
    CHECK(image.height == entry["height"].get<std::int64_t>());
    CHECK(image.width == entry["width"].get<std::int64_t>());
    CHECK(image.channels == (mode == "RGB" ? 3 : 1));
    REQUIRE(image.pixels.size() == expected.size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) differing += image.pixels[i] != expected[i];
    CHECK(differing == 0);
    ++compared;
  }
  CHECK(compared >= 22);
}

TEST_CASE("vision: Resize, CenterCrop, ToFloat and Normalize give torchvision's tensors") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const auto manifest = manifest_of(*dir);
  if (manifest["torchvision"].contains("missing")) return test::skip(manifest["torchvision"]["missing"].get<std::string>());
  const std::vector<double> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  const vision::Compose pipeline(vision::Resize(20), vision::CenterCrop(16), vision::ToFloat{}, vision::Normalize(mean, std));
  float worst_tensor = 0, worst_pil = 0;
  for (const auto& entry : manifest["tv"]) {
    const std::string file = entry["file"];
    CAPTURE(file);
    auto random = any_random();
    const Image image = pipeline.apply(vision::read_image(*dir / "images" / file, ImageMode::rgb), random);
    std::vector<float> ours(static_cast<std::size_t>(image.channels * image.height * image.width));
    pipeline.write(image, ours.data());
    const auto shape = entry["shape"].get<std::vector<std::int64_t>>();
    CHECK(shape == std::vector<std::int64_t>{image.channels, image.height, image.width});
    const auto tensor_path = raw<float>(*dir / "tv" / (file + ".tensor.raw"));
    const auto pil_path = raw<float>(*dir / "tv" / (file + ".pil.raw"));
    REQUIRE(tensor_path.size() == ours.size());
    REQUIRE(pil_path.size() == ours.size());
    for (std::size_t i = 0; i < ours.size(); ++i) {
      // In pixel units: a normalised difference times std times 255.
      const double scale = std[i / static_cast<std::size_t>(image.height * image.width)] * 255.0;
      worst_tensor = std::max(worst_tensor, static_cast<float>(std::abs(ours[i] - tensor_path[i]) * scale));
      worst_pil = std::max(worst_pil, static_cast<float>(std::abs(ours[i] - pil_path[i]) * scale));
    }
  }
  MESSAGE("torchvision " << manifest["torchvision"]["version"].get<std::string>() << ": largest difference from its tensor path "
                         << worst_tensor << "/255, from its PIL path " << worst_pil << "/255");
  // The tensor path (decode, v2 Resize through the same LibTorch kernel, CenterCrop, ToDtype,
  // Normalize) is the same arithmetic: bit-equal. PIL's resize is its own fixed-point code: within 1/255.
  CHECK(worst_tensor == 0.0f);
  CHECK(worst_pil <= 1.0f + 1e-4f);
}

TEST_CASE("vision: ImageFolder lists the files, classes and labels torchvision's ImageFolder does") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const auto manifest = manifest_of(*dir);
  if (manifest["torchvision"].contains("missing")) return test::skip(manifest["torchvision"]["missing"].get<std::string>());
  const vision::ImageFolder folder(*dir / "folder", {.allow_empty = true});
  std::vector<std::pair<std::string, std::int64_t>> ours, theirs;
  for (const auto& s : folder.samples()) ours.emplace_back(s.path.lexically_relative(*dir / "folder").string(), s.label);
  for (const auto& s : manifest["folder_samples"]) theirs.emplace_back(s[0].get<std::string>(), s[1].get<std::int64_t>());
  CHECK(ours == theirs);
  CHECK(folder.classes() == manifest["folder_classes"].get<std::vector<std::string>>());
  // Without allow_empty, the class folder with no image is named.
  CHECK_THROWS_WITH_AS(vision::ImageFolder(*dir / "folder", {.extensions = {".jpg"}}),
                       doctest::Contains("found no image file for the class(es) C_upper, b_class, c_link_target, d_linked_class"),
                       DataError);
}

TEST_CASE(
    "vision: files this build cannot decode are refused when the folder is listed, counted by ending, and the bytes pick the decoder") {
  const fs::path root = fs::temp_directory_path() / ("dettrial-vision-kinds-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  for (const char* name : {"a/1.bmp", "a/2.BMP", "b/3.tif", "b/4.png", "b/5.gif"}) std::ofstream(root / name) << "not decoded when listed";
  // torchvision's endings list .bmp and .tif (not .gif): three files, refused before any record is read.
  const std::string refusal =
      "3 file(s) listed in '" + root.string() + "' are of kinds this build cannot decode (2 .bmp, 1 .tif; the first: '";
  CHECK_THROWS_WITH_AS(vision::ImageFolder{root}, doctest::Contains(refusal.c_str()), DataError);
  // Listing without their endings is the way round.
  CHECK(vision::ImageFolder(root, {.extensions = {".png"}, .allow_empty = true}).size() == 1);
  fs::remove_all(root);

  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  // ImageNet holds a PNG named .JPEG: its bytes, not its name, pick the decoder.
  const fs::path renamed = fs::temp_directory_path() / ("dettrial-png-named-jpeg-" + std::to_string(::getpid()) + ".JPEG");
  fs::copy_file(*dir / "images" / "rgb.png", renamed, fs::copy_options::overwrite_existing);
  CHECK(vision::read_image(renamed, ImageMode::rgb).pixels == vision::read_image(*dir / "images" / "rgb.png", ImageMode::rgb).pixels);
  fs::remove(renamed);
}

TEST_CASE("vision: a JPEG's window decodes to the whole decode's pixels, bit for bit, at any place and size") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const auto files = manifest_of(*dir)["window_files"].get<std::vector<std::string>>();
  REQUIRE(files.size() >= 7);
  std::mt19937_64 rng(2024);
  std::int64_t windows = 0;
  for (const std::string& file : files) {
    const auto bytes = file_bytes(*dir / "windows" / file);
    for (const ImageMode mode : {ImageMode::rgb, ImageMode::gray}) {
      const Image whole = vision::decode_image(bytes, mode, file);
      const std::int64_t h = whole.height, w = whole.width;
      // The corners, the edges, a single pixel, the whole image, blocks' and chroma's boundaries
      // met and missed, then windows of every size and place.
      std::vector<vision::PixelWindow> picks{{0, 0, h, w},        {0, 0, 1, 1},         {h - 1, w - 1, 1, 1},
                                             {0, w - 1, h, 1},    {h - 1, 0, 1, w},     {16, 16, 16, 16},
                                             {15, 17, 18, 14},    {7, 9, h - 7, w - 9}, {h / 2, w / 2, h - h / 2, w - w / 2},
                                             {1, 1, h - 2, w - 2}};
      for (int i = 0; i < 60; ++i) {
        const auto top = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(h));
        const auto left = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w));
        picks.push_back({top, left, 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(h - top)),
                         1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w - left))});
      }
      for (const auto& pick : picks) {
        CAPTURE(file);
        CAPTURE(pick.top);
        CAPTURE(pick.left);
        CAPTURE(pick.height);
        CAPTURE(pick.width);
        std::int64_t asked_height = 0, asked_width = 0;
        const Image window = vision::decode_image_window(bytes, mode, file, [&](std::int64_t height, std::int64_t width) {
          asked_height = height, asked_width = width;
          return pick;
        });
        CHECK((asked_height == h && asked_width == w));
        const Image expected = dettrial::detail::crop(whole, pick.top, pick.left, pick.height, pick.width);
        REQUIRE(window.pixels.size() == expected.pixels.size());
        CHECK(window.pixels == expected.pixels);
        ++windows;
      }
    }
  }
  MESSAGE(
      windows << " windows of " << files.size() << " files equal to the whole decode's pixels"
              << std::string(vision::decodes_jpeg_windows ? " (JPEGs decoded in part)" : " (decoded whole: no libjpeg API in this build)"));
  const auto bytes = file_bytes(*dir / "windows" / "odd444.jpg");
  CHECK_THROWS_WITH_AS(vision::decode_image_window(bytes, ImageMode::rgb, "odd444.jpg",
                                                   [](std::int64_t height, std::int64_t width) {
                                                     return vision::PixelWindow{.top = height - 2, .height = 3, .width = width};
                                                   }),
                       doctest::Contains("does not lie inside 'odd444.jpg' (257x301)"), DataError);
  // Damage up to the window's last row is refused as the whole decode refuses it.
  const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2));
  CHECK_THROWS_WITH_AS(vision::decode_image_window(
                           cut, ImageMode::rgb, "cut.jpg",
                           [](std::int64_t height, std::int64_t width) { return vision::PixelWindow{.height = height, .width = width}; }),
                       doctest::Contains("cannot decode 'cut.jpg' as JPEG"), ImageError);
}

TEST_CASE("vision: a pipeline that crops first reads only the window, with the same draws and batches as the whole image") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  // The window files as a source that can decode windows, and the same files through load() alone.
  struct Files {
    std::vector<fs::path> paths;
    std::int64_t size() const { return static_cast<std::int64_t>(paths.size()); }
    std::int64_t label(std::int64_t i) const { return i; }
    std::string name(std::int64_t i) const { return paths[static_cast<std::size_t>(i)].string(); }
    Image load(std::int64_t i, ImageMode mode) const { return vision::read_image(paths[static_cast<std::size_t>(i)], mode); }
  };
  struct WindowFiles : Files {
    Image load_window(std::int64_t i, ImageMode mode, vision::WindowChooser choose) const {
      ++*windows;
      return vision::read_image_window(paths[static_cast<std::size_t>(i)], mode, choose);
    }
    std::shared_ptr<int> windows = std::make_shared<int>(0);
  };
  Files files;
  // The manifest named: a range over a member of a temporary would outlive it (AddressSanitizer's
  // heap-use-after-free in the asan build).
  const nlohmann::json manifest = manifest_of(*dir);
  for (const auto& file : manifest["window_files"]) files.paths.push_back(*dir / "windows" / file.get<std::string>());
  const WindowFiles window_files{files};
  const auto check_same = [&](const auto& pipeline) {
    static_assert(std::decay_t<decltype(pipeline)>::crops_first);
    const vision::ImageDataset whole(files, pipeline, {.pin_memory = false});
    const vision::ImageDataset windowed(window_files, pipeline, {.pin_memory = false});
    const torch::Tensor indices = torch::arange(files.size());
    for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
      const dettrial::BatchOrigin origin{.epoch = epoch, .seed = 5};
      CHECK(torch::equal(std::get<0>(whole.get_batch(indices, origin)), std::get<0>(windowed.get_batch(indices, origin))));
    }
  };
  check_same(vision::Compose(vision::RandomResizedCrop(64), vision::RandomHorizontalFlip{}, vision::ToFloat{}));
  check_same(vision::Compose(vision::RandomResizedCrop(32, {.scale = {0.01, 0.05}}), vision::TrivialAugmentWide{}));
  check_same(vision::Compose(vision::CenterCrop(180), vision::ToFloat{}));  // larger than some: those are padded, decoded whole
  CHECK(*window_files.windows == 3 * 4 * files.size());
  CHECK_FALSE(vision::Compose(vision::Resize(64), vision::CenterCrop(56)).crops_first);  // the resize needs the whole image
}

TEST_CASE("vision: reduced_decode decodes a JPEG's window at the DCT scale that keeps it the crop's size, near the full decode resized") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  if (!vision::decodes_jpeg_windows) return test::skip("this build has no libjpeg API (libjpeg62-turbo-dev): windows are decoded whole");
  const auto bytes = file_bytes(*dir / "windows" / "imagenet420.jpg");
  const Image whole = vision::decode_image(bytes, ImageMode::rgb, "imagenet420.jpg");
  const auto window_of = [&](vision::PixelWindow pick) {
    return vision::decode_image_window(bytes, ImageMode::rgb, "imagenet420.jpg", [&](std::int64_t, std::int64_t) { return pick; });
  };
  // 300 x 400 to keep at least 64 x 64: a quarter (75 x 100) is the smallest scale that does.
  const Image reduced = window_of({.top = 40, .left = 60, .height = 300, .width = 400, .at_least_height = 64, .at_least_width = 64});
  CHECK((reduced.height == 75 && reduced.width == 100));
  const Image resized = dettrial::detail::resize_bilinear(dettrial::detail::crop(whole, 40, 60, 300, 400), 75, 100);
  const auto mean_difference = [](const Image& a, const Image& b) {  // in levels, over every sample
    REQUIRE(a.pixels.size() == b.pixels.size());
    double total = 0;
    for (std::size_t i = 0; i < a.pixels.size(); ++i) total += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
    return total / static_cast<double>(a.pixels.size());
  };
  const double mean = mean_difference(reduced, resized);
  MESSAGE("a quarter-scale decode differs from the full decode resized by " << mean << " levels on average");
  CHECK(mean < 6.0);
  CHECK(reduced.pixels != resized.pixels);  // not the same pixels: why it is opt-in
  // Every kind of JPEG in the fixtures (4:2:0, 4:2:2, 4:4:4, progressive, gray, CMYK, YCCK): the
  // scale each window allows, its size, and pixels near the full decode's resized.
  for (const auto& entry : fs::directory_iterator(*dir / "windows")) {
    if (entry.path().extension() != ".jpg") continue;
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    const auto file = file_bytes(entry.path());
    const Image full = vision::decode_image(file, ImageMode::rgb, name);
    const std::int64_t top = full.height / 7, left = full.width / 5, height = full.height * 2 / 3, width = full.width * 3 / 5;
    std::int64_t d = 1;
    for (const std::int64_t denominator : {8, 4, 2})
      if (d == 1 && height / denominator >= 48 && width / denominator >= 48) d = denominator;
    const Image scaled = vision::decode_image_window(file, ImageMode::rgb, name, [&](std::int64_t, std::int64_t) {
      return vision::PixelWindow{.top = top, .left = left, .height = height, .width = width, .at_least_height = 48, .at_least_width = 48};
    });
    CHECK(scaled.height == (top + height + d - 1) / d - top / d);
    CHECK(scaled.width == (left + width + d - 1) / d - left / d);
    const Image expected =
        dettrial::detail::resize_bilinear(dettrial::detail::crop(full, top, left, height, width), scaled.height, scaled.width);
    CHECK(mean_difference(scaled, expected) < 8.0);
  }
  // A window that cannot shrink and keep its size, or asks nothing, is the full decode's, exactly.
  CHECK(window_of({.top = 40, .left = 60, .height = 100, .width = 120, .at_least_height = 64, .at_least_width = 64}).pixels ==
        dettrial::detail::crop(whole, 40, 60, 100, 120).pixels);
  CHECK(window_of({.top = 40, .left = 60, .height = 300, .width = 400}).pixels == dettrial::detail::crop(whole, 40, 60, 300, 400).pixels);
  // In a pipeline: RandomResizedCrop's output is its size either way, and the same for the same record.
  const auto pipeline = vision::Compose(vision::RandomResizedCrop(64, {.reduced_decode = true}), vision::ToFloat{});
  vision::RecordRandom a(3, 0, 1), b(3, 0, 1);
  const auto load = [&](vision::WindowChooser choose) {
    return vision::decode_image_window(bytes, ImageMode::rgb, "imagenet420.jpg", choose);
  };
  const Image first = pipeline.apply_windowed(load, a), again = pipeline.apply_windowed(load, b);
  CHECK((first.height == 64 && first.width == 64));
  CHECK(first.pixels == again.pixels);
}

TEST_CASE("vision: a batch's memory is used again only once nothing refers to it, and holds the new batch's images") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  struct Files {  // the window files, labelled by index
    fs::path dir;
    std::vector<std::string> names;
    std::int64_t size() const { return static_cast<std::int64_t>(names.size()); }
    std::int64_t label(std::int64_t i) const { return i; }
    std::string name(std::int64_t i) const { return names[static_cast<std::size_t>(i)]; }
    Image load(std::int64_t i, ImageMode mode) const { return vision::read_image(dir / name(i), mode); }
  };
  const Files files{*dir / "windows", manifest_of(*dir)["window_files"].get<std::vector<std::string>>()};
  const vision::ImageDataset data(files, vision::Compose(vision::RandomResizedCrop(48), vision::ToFloat{}), {.pin_memory = false});
  const vision::ImageDataset copy = data;  // copies share the buffers, as the loader's workers do
  const torch::Tensor some = torch::tensor({0, 1, 2}, torch::kLong), others = torch::tensor({3, 4, 5}, torch::kLong);
  torch::Tensor first = std::get<0>(data.get_batch(some));
  const void* first_memory = first.data_ptr();
  const torch::Tensor view = first.narrow(0, 1, 1), view_was = view.clone();
  first = torch::Tensor();  // only a view of it is left
  torch::Tensor second = std::get<0>(copy.get_batch(others));
  const void* second_memory = second.data_ptr();
  CHECK(second_memory != first_memory);  // the view still owns the first batch's memory
  const torch::Tensor second_was = second.clone();
  second = torch::Tensor();  // nothing refers to the second any more
  const torch::Tensor third = std::get<0>(data.get_batch(others));
  CHECK(third.data_ptr() == second_memory);  // handed out again
  CHECK(torch::equal(third, second_was));    // and written anew: the same records, the same draws
  CHECK(torch::equal(view, view_was));       // the view's memory was never written over
}

TEST_CASE("vision: damaged files are errors that name the file, never a crash or a grey-filled image") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  std::mt19937_64 rng(12345);
  int truncations = 0, flips = 0, flips_refused = 0;
  for (const auto& entry : fs::directory_iterator(*dir / "images")) {
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    const auto good = file_bytes(entry.path());
    const Image clean = vision::decode_image(good, ImageMode::rgb, name);
    const bool png = entry.path().extension() == ".png";
    // Every truncation short of the whole pixel data is refused, naming the file.
    for (int trial = 0; trial < 60; ++trial) {
      const std::size_t keep = std::uniform_int_distribution<std::size_t>(0, good.size() - 13)(rng);
      const std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep));
      CHECK_THROWS_WITH_AS(vision::decode_image(cut, ImageMode::rgb, name), doctest::Contains(("'" + name + "'").c_str()), ImageError);
      ++truncations;
    }
    // Damaged bytes: refused, or (JPEG has no checksums) an image of the size the header says; a PNG
    // (CRC-checked) is refused unless the damage missed the pixels.
    for (int trial = 0; trial < 150; ++trial) {
      std::vector<std::uint8_t> damaged = good;
      const int hits = 1 + static_cast<int>(rng() % 4);
      for (int h = 0; h < hits; ++h) damaged[rng() % damaged.size()] ^= static_cast<std::uint8_t>(1 + rng() % 255);
      ++flips;
      try {
        const Image image = vision::decode_image(damaged, ImageMode::rgb, name);
        CHECK(image.pixels.size() == static_cast<std::size_t>(image.height * image.width * 3));
        if (png) CHECK(image.pixels == clean.pixels);
      } catch (const ImageError& e) {
        CHECK(std::string(e.what()).find("'" + name + "'") != std::string::npos);
        ++flips_refused;
      }
    }
  }
  MESSAGE(truncations << " truncated files refused; " << flips_refused << " of " << flips << " damaged files refused");
  CHECK_THROWS_WITH_AS(vision::decode_image(std::vector<std::uint8_t>{'G', 'I', 'F', '8', '9', 'a'}, ImageMode::rgb, "x.gif"),
                       "cannot decode 'x.gif': it is not JPEG, PNG or WebP (it begins with 47 49 46 38 39 61)", ImageError);
  CHECK_THROWS_WITH_AS(vision::read_image(*dir / "no-such.png", ImageMode::rgb), doctest::Contains("no-such.png"), ImageError);
}

TEST_CASE("vision: an unreadable record is an error naming file, record and reason, skip_unreadable leaves it out and counts it") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const fs::path root = fs::temp_directory_path() / ("dettrial-vision-bad-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  for (const char* f : {"rgb.png", "gray.png", "rgb.jpg"}) fs::copy_file(*dir / "images" / f, root / "a" / f);
  fs::copy_file(*dir / "images" / "rgba.png", root / "b" / "ok.png");
  std::ofstream(root / "b" / "notes.png") << "not an image";
  auto cut = file_bytes(*dir / "images" / "rgb444.jpg");
  cut.resize(cut.size() / 2);
  std::ofstream(root / "b" / "truncated.jpg", std::ios::binary)
      .write(reinterpret_cast<const char*>(cut.data()), static_cast<std::streamsize>(cut.size()));
  const vision::ImageFolder folder(root);  // a: gray.png rgb.jpg rgb.png; b: notes.png ok.png truncated.jpg
  REQUIRE(folder.size() == 6);
  const vision::Compose pipeline(vision::Resize(12, 12), vision::ToFloat{});
  const vision::ImageDataset strict(folder, pipeline);
  CHECK_THROWS_WITH_AS(strict.get_batch(torch::tensor({0, 3}, torch::kLong)),
                       doctest::Contains("notes.png': it is not JPEG, PNG or WebP (it begins with 6e 6f 74 20 61 6e 20 69) (record 3)"),
                       ImageError);
  CHECK_THROWS_WITH_AS(strict.get_batch(torch::tensor({5}, torch::kLong)), doctest::Contains("truncated.jpg' as JPEG"), ImageError);
  const vision::ImageDataset lenient(folder, pipeline, {.skip_unreadable = true});
  dettrial::DataLoader loader(lenient, {.batch_size = 4, .workers = 2});
  std::vector<std::int64_t> labels;
  std::int64_t images = 0;
  for (auto& [x, y] : loader) {
    CHECK(x.size(0) == y.size(0));
    images += x.size(0);
    for (std::int64_t i = 0; i < y.size(0); ++i) labels.push_back(y[i].item<std::int64_t>());
  }
  CHECK(images == 4);
  CHECK(labels == std::vector<std::int64_t>{0, 0, 0, 1});
  CHECK(lenient.skipped() == 2);
  fs::remove_all(root);
}

TEST_CASE("vision: the crops, pads and flips follow torchvision's geometry") {
  auto random = any_random();
  const Image three = image_of(3, 3, 1);  // 0 1 2 / 3 4 5 / 6 7 8
  using M = vision::PaddingMode;
  const auto padded = [&](M mode) { return rows_of(dettrial::detail::window(three, -2, -2, 7, 7, mode, 9)); };
  // torchvision's documented examples, padding [1, 2, 3, 4] by 2 on each side.
  CHECK(padded(M::reflect)[2] == std::vector<int>{2, 1, 0, 1, 2, 1, 0});
  CHECK(padded(M::symmetric)[2] == std::vector<int>{1, 0, 0, 1, 2, 2, 1});
  CHECK(padded(M::edge)[0] == std::vector<int>{0, 0, 0, 1, 2, 2, 2});
  CHECK(padded(M::constant)[0] == std::vector<int>(7, 9));
  CHECK(padded(M::constant)[3] == std::vector<int>{9, 9, 3, 4, 5, 9, 9});
  // CenterCrop rounds the offset as Python's round does, half to even: 3 / 2 -> 2, 5 / 2 -> 2, 1 / 2 -> 0.
  CHECK(dettrial::detail::round_half(3) == 2);
  CHECK(dettrial::detail::round_half(5) == 2);
  CHECK(dettrial::detail::round_half(1) == 0);
  CHECK(dettrial::detail::round_half(4) == 2);
  const Image five = image_of(5, 7, 1);
  CHECK(rows_of(vision::CenterCrop(2)(five, random)) == std::vector<std::vector<int>>{{16, 17}, {23, 24}});
  // Larger than the image: padded with zeros, (4 - 3) // 2 = 0 above and left, the rest below and right.
  CHECK(rows_of(vision::CenterCrop(4)(three, random)) ==
        std::vector<std::vector<int>>{{0, 1, 2, 0}, {3, 4, 5, 0}, {6, 7, 8, 0}, {0, 0, 0, 0}});
  // The shorter side to 20, the longer truncated as torchvision computes it.
  CHECK(dettrial::detail::resized_size(29, 37, 20).height == 20);
  CHECK(dettrial::detail::resized_size(29, 37, 20).width == 25);
  CHECK(dettrial::detail::resized_size(37, 29, 20).height == 25);
  // Every RandomCrop window lies in the padded image, and every position is drawn.
  std::set<std::vector<std::vector<int>>> windows;
  const vision::RandomCrop crop(3, {.padding = {1}, .fill = 9});
  for (int record = 0; record < 400; ++record) {
    vision::RecordRandom r(7, 0, record);
    windows.insert(rows_of(crop(three, r)));
  }
  CHECK(windows.size() == 9);
  // RandomResizedCrop's windows stay inside; its fallback is the centred window of the clamped ratio.
  const vision::RandomResizedCrop rrc(8, {.scale = {0.5, 1.0}});
  for (int record = 0; record < 200; ++record) {
    vision::RecordRandom r(3, 1, record);
    const auto [top, left, h, w] = rrc.window_of(30, 40, r);
    CHECK(top >= 0);
    CHECK(left >= 0);
    CHECK(top + h <= 30);
    CHECK(left + w <= 40);
    CHECK(h * w >= 0.45 * 1200);
  }
  const vision::RandomResizedCrop impossible(8, {.scale = {2.0, 3.0}});
  vision::RecordRandom r(1, 1, 1);
  CHECK(impossible.window_of(10, 40, r) == std::array<std::int64_t, 4>{0, 13, 10, 13});
  CHECK_THROWS_WITH_AS(vision::RandomCrop(5, {.padding = {1, 2, 3}}), doctest::Contains("padding takes 1, 2 or 4 numbers"), DataError);
  CHECK_THROWS_WITH_AS(vision::RandomCrop(9)(three, random), doctest::Contains("larger than the padded image"), DataError);
  CHECK(rows_of(vision::RandomCrop(5, {.pad_if_needed = true})(three, random)).size() == 5);
}

TEST_CASE("vision: ToFloat and Normalize compute torchvision's float32 arithmetic, ColorJitter keeps 8 bits in range") {
  const Image image = image_of(4, 5, 3);
  const vision::Compose pipeline(vision::ToFloat{}, vision::Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}));
  CHECK((pipeline.dtype() == torch::kFloat));
  std::vector<float> ours(60);
  pipeline.write(image, ours.data());
  const torch::Tensor chw = torch::from_blob(const_cast<std::uint8_t*>(image.pixels.data()), {4, 5, 3}, torch::kUInt8).permute({2, 0, 1});
  const torch::Tensor theirs = chw.to(torch::kFloat)
                                   .mul(1.0 / 255)
                                   .sub(torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1}))
                                   .div(torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}))
                                   .contiguous();
  CHECK(torch::equal(torch::from_blob(ours.data(), {3, 4, 5}), theirs));
  const vision::Compose bytes(vision::RandomHorizontalFlip{1.0});
  CHECK((bytes.dtype() == torch::kUInt8));
  std::vector<std::uint8_t> out(60);
  auto random = any_random();
  bytes.write(bytes.apply(image, random), out.data());
  CHECK(static_cast<int>(out[0]) == image.pixels[3 * 4]);  // row 0, last column, red
  CHECK_THROWS_WITH_AS(vision::Normalize({0.5, 0.5}, {0.5}), doctest::Contains("same number of values"), DataError);
  const vision::ColorJitter jitter{.brightness = 0.8, .contrast = 0.8, .saturation = 0.8};
  std::set<int> seen;
  for (int record = 0; record < 50; ++record) {
    vision::RecordRandom r(5, 0, record);
    const Image j = jitter(image_of(6, 6, 3), r);
    seen.insert(j.pixels[40]);
  }
  CHECK(seen.size() > 20);  // the factors vary by record
  vision::RecordRandom a(5, 0, 9), b(5, 0, 9);
  CHECK(jitter(image, a).pixels == jitter(image, b).pixels);
}

TEST_CASE("vision: CIFAR-10 and CIFAR-100 binary files, and their damage named") {
  const fs::path root = fs::temp_directory_path() / ("dettrial-cifar-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "cifar-10-batches-bin");
  const auto record = [](int label, int seed, bool two_labels) {
    std::string bytes;
    if (two_labels) bytes += static_cast<char>(label % 20);
    bytes += static_cast<char>(label);
    for (int i = 0; i < 3072; ++i) bytes += static_cast<char>((i * 7 + seed) % 256);
    return bytes;
  };
  for (int b = 1; b <= 5; ++b) {
    std::ofstream f(root / "cifar-10-batches-bin" / ("data_batch_" + std::to_string(b) + ".bin"), std::ios::binary);
    for (int r = 0; r < 3; ++r) f << record((b + r) % 10, b * 10 + r, false);
  }
  std::ofstream(root / "cifar-10-batches-bin" / "test_batch.bin", std::ios::binary) << record(4, 99, false);
  const auto train = vision::Cifar::ten(root, vision::CifarSplit::train);
  CHECK(train.size() == 15);
  CHECK(train.label(4) == 3);  // batch 2, record 1
  const Image image = train.load(4, ImageMode::rgb);
  CHECK(image.height == 32);
  // Pixel (0, 1) is plane byte 1 of each colour plane: (7 + 21) % 256, (1024 * 7 + 7 + 21), ...
  CHECK(static_cast<int>(image.pixels[3]) == (1 * 7 + 21) % 256);
  CHECK(static_cast<int>(image.pixels[4]) == (1025 * 7 + 21) % 256);
  CHECK(static_cast<int>(image.pixels[5]) == (2049 * 7 + 21) % 256);
  CHECK(vision::Cifar::ten(root / "cifar-10-batches-bin", vision::CifarSplit::test).size() == 1);
  // CIFAR-100: coarse and fine labels.
  fs::create_directories(root / "c100");
  {
    std::ofstream f(root / "c100" / "train.bin", std::ios::binary);
    f << record(57, 1, true) << record(99, 2, true);
  }
  CHECK(vision::Cifar::hundred(root / "c100", vision::CifarSplit::train).label(1) == 99);
  CHECK(vision::Cifar::hundred(root / "c100", vision::CifarSplit::train, vision::CifarLabel::coarse).label(0) == 17);
  // A truncated file and a label out of range are named.
  std::ofstream(root / "c100" / "test.bin", std::ios::binary) << record(3, 1, true).substr(0, 1000);
  CHECK_THROWS_WITH_AS(vision::Cifar::hundred(root / "c100", vision::CifarSplit::test), doctest::Contains("test.bin' has 1000 bytes"),
                       DataError);
  std::ofstream(root / "cifar-10-batches-bin" / "test_batch.bin", std::ios::binary) << record(12, 1, false);
  CHECK_THROWS_WITH_AS(vision::Cifar::ten(root, vision::CifarSplit::test), doctest::Contains("record 0 of"), DataError);
  CHECK_THROWS_WITH_AS(vision::Cifar::ten(root / "nowhere", vision::CifarSplit::test), doctest::Contains("found no 'test_batch.bin'"),
                       DataError);
  fs::remove_all(root);
}

namespace {
/// A source of synthetic images whose pixels encode the record, for augmentation tests without files.
struct Synthetic {
  std::int64_t records = 37;
  std::int64_t size() const { return records; }
  std::int64_t label(std::int64_t i) const { return i; }
  Image load(std::int64_t i, ImageMode mode) const {
    Image image(9, 11, vision::channels_of(mode));
    for (std::size_t k = 0; k < image.pixels.size(); ++k)
      image.pixels[k] = static_cast<std::uint8_t>((k * 13 + static_cast<std::size_t>(i) * 7) % 251);
    return image;
  }
  std::string name(std::int64_t i) const { return "synthetic " + std::to_string(i); }
};

/// Each record's augmented image in one epoch's batches, by record (the label is the record).
template <class Range>
std::map<std::int64_t, torch::Tensor> by_record(Range&& batches, std::int64_t limit) {
  std::map<std::int64_t, torch::Tensor> out;
  std::int64_t n = 0;
  for (auto&& [x, y] : batches) {
    for (std::int64_t i = 0; i < y.size(0); ++i) out[y[i].template item<std::int64_t>()] = x[i].clone();
    if (++n == limit) break;
  }
  return out;
}
}  // namespace

TEST_CASE("vision: a record is augmented the same whatever the workers, the ranks or a resume, and differently each epoch") {
  const vision::Compose augment(vision::RandomResizedCrop(6), vision::RandomHorizontalFlip{},
                                vision::ColorJitter{.brightness = 0.4, .contrast = 0.4, .saturation = 0.4}, vision::ToFloat{});
  const vision::ImageDataset data(Synthetic{}, augment);
  // 37 records in batches of 5: 8 batches an epoch, the last one short. Each record's image in the
  // `limit` batches a rank reads from batch `skip` of its endless stream.
  const auto images = [&](int workers, std::int64_t replicas, std::int64_t rank, std::int64_t skip, std::int64_t limit) {
    const dettrial::DataLoader loader(data, {.batch_size = 5, .shuffle = true, .seed = 11, .workers = workers});
    return by_record(loader.batches({.repeat = true, .skip = skip, .num_replicas = replicas, .rank = rank}), limit);
  };
  const auto reference = images(0, 1, 0, 0, 8);  // epoch 0, one rank, no workers
  REQUIRE(reference.size() == 37);
  for (const int workers : {1, 3}) {
    const auto again = images(workers, 1, 0, 0, 8);
    REQUIRE(again.size() == 37);
    for (const auto& [record, image] : reference) CHECK(torch::equal(again.at(record), image));
  }
  // Two ranks (the 8 batches dealt out by stride, 4 each): together the same images.
  auto both = images(2, 2, 0, 0, 4);
  const auto rank1 = images(0, 2, 1, 0, 4);
  both.insert(rank1.begin(), rank1.end());
  REQUIRE(both.size() == 37);
  for (const auto& [record, image] : reference) CHECK(torch::equal(both.at(record), image));
  // A resume at batch 3 reads the rest of the epoch with the same augmentation.
  const auto resumed = images(2, 1, 0, 3, 5);
  CHECK(resumed.size() == 37 - 15);
  for (const auto& [record, image] : resumed) CHECK(torch::equal(reference.at(record), image));
  // Epoch 1 draws again.
  const auto second = images(0, 1, 0, 8, 8);
  REQUIRE(second.size() == 37);
  int same = 0;
  for (const auto& [record, image] : reference) same += torch::equal(second.at(record), image);
  CHECK(same < 5);
}

TEST_CASE("vision: batches are N x C x H x W in the pipeline's type, labels int64, mixed sizes are named") {
  const vision::ImageDataset gray(Synthetic{}, vision::Compose(vision::CenterCrop(8)), {.mode = ImageMode::gray});
  auto [x, y] = gray.get_batch(torch::arange(0, 4, torch::kLong));
  CHECK(x.sizes() == torch::IntArrayRef{4, 1, 8, 8});
  CHECK((x.scalar_type() == torch::kUInt8));
  CHECK((y.scalar_type() == torch::kLong));
  struct Mixed : Synthetic {
    Image load(std::int64_t i, ImageMode mode) const { return i == 2 ? Image(5, 5, vision::channels_of(mode)) : Synthetic::load(i, mode); }
  };
  const vision::ImageDataset mixed(Mixed{}, vision::Compose(vision::ToFloat{}));
  CHECK_THROWS_WITH_AS(
      mixed.get_batch(torch::arange(0, 4, torch::kLong)),
      "record 2 ('synthetic 2') is 3x5x5 after the transforms, but its batch's first image is 3x9x11: end the transforms in "
      "one size (Resize with two numbers, CenterCrop, RandomCrop, RandomResizedCrop)",
      DataError);
  dettrial::DataLoader loader(gray, {.batch_size = 4});
  CHECK(loader.workers() >= 1);  // the process's share of the CPUs
  CHECK(loader.describe().find("37 records in batches of 4, read by ") == 0);
}
