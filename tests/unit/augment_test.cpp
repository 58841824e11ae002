// torchvision's augmentation against torchvision itself: every operation of AutoAugment,
// RandAugment and TrivialAugmentWide at the magnitudes of their tables (both interpolations, with
// and without fill), the tables and policies themselves, MixUp and CutMix at given draws; then what
// only dettrial decides: the draws keyed by record, RandomErasing's rule, the batch mixing in
// ImageDataset, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dettrial/vision.hpp>

#include "skip.hpp"
#include "torch_release.hpp"

namespace fs = std::filesystem;
namespace vision = dettrial::vision;
using dettrial::DataError;
using vision::AugmentOp;
using vision::Image;

namespace {

/// What tests/python/torchvision_augment.py wrote (CTest's fixture sets the variable), or why not.
std::optional<nlohmann::json> augment_manifest(fs::path& dir, std::string& why) {
  const char* where = std::getenv("DETTRIAL_AUGMENT_FIXTURES");
  if (!where || !fs::exists(fs::path(where) / "manifest.json")) {
    why = "no augmentation fixtures (tests/python/torchvision_augment.py needs a Python with torchvision: -DDETTRIAL_TORCHVISION_PYTHON)";
    return std::nullopt;
  }
  dir = where;
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Image read_image(const fs::path& dir, const nlohmann::json& manifest, const std::string& name) {
  const auto shape = manifest["images"][name].get<std::vector<std::int64_t>>();
  Image image(shape[0], shape[1], shape[2]);
  const auto bytes = read_bytes(dir / "in" / (name + ".raw"));
  REQUIRE(bytes.size() == image.pixels.size());
  std::memcpy(image.pixels.data(), bytes.data(), bytes.size());
  return image;
}

torch::Tensor read_tensor(const fs::path& path, std::vector<std::int64_t> shape, torch::Dtype dtype) {
  const auto bytes = read_bytes(path);
  torch::Tensor t = torch::empty(shape, dtype);
  REQUIRE(bytes.size() == static_cast<std::size_t>(t.nbytes()));
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

AugmentOp op_named(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(AugmentOp::invert); ++i)
    if (vision::name_of(static_cast<AugmentOp>(i)) == name) return static_cast<AugmentOp>(i);
  FAIL("no operation named " << name);
  return AugmentOp::identity;
}

/// An image source in memory for ImageDataset: `n` images of 20 x 24, labels record % 10.
struct MemorySource {
  std::int64_t n = 13;
  std::int64_t size() const { return n; }
  std::int64_t label(std::int64_t i) const { return i % 10; }
  std::string name(std::int64_t i) const { return "image-" + std::to_string(i); }
  Image load(std::int64_t i, vision::ImageMode /*mode*/) const {
    Image image(20, 24, 3);
    for (std::size_t k = 0; k < image.pixels.size(); ++k)
      image.pixels[k] = static_cast<std::uint8_t>((k * 7 + static_cast<std::size_t>(i) * 31) % 251);
    return image;
  }
};

}  // namespace

TEST_CASE("augment: each operation of AutoAugment, RandAugment and TrivialAugmentWide gives torchvision's pixels") {
  fs::path dir;
  std::string why;
  const auto manifest = augment_manifest(dir, why);
  if (!manifest) return test::skip(why);
  std::map<std::string, std::int64_t> differing;  // cases by operation
  std::int64_t cases = 0;
  double worst_share = 0;  // the largest share of a case's samples that differ
  for (const auto& c : (*manifest)["ops"]) {
    const Image input = read_image(dir, *manifest, c["image"].get<std::string>());
    const vision::AugmentOptions options{
        c["interpolation"] == "bilinear" ? vision::Interpolation::bilinear : vision::Interpolation::nearest,
        c["fill"].get<std::vector<double>>()};
    const Image ours = vision::apply_augment_op(input, op_named(c["op"].get<std::string>()), c["magnitude"].get<double>(), options);
    const auto theirs = read_bytes(dir / "op" / (c["name"].get<std::string>() + ".raw"));
    REQUIRE(ours.pixels.size() == theirs.size());
    std::int64_t samples_off = 0, largest = 0;
    for (std::size_t i = 0; i < theirs.size(); ++i) {
      const int d = std::abs(static_cast<int>(ours.pixels[i]) - static_cast<int>(static_cast<std::uint8_t>(theirs[i])));
      samples_off += d != 0;
      largest = std::max<std::int64_t>(largest, d);
    }
    if (samples_off > 0) {
      const std::string op = c["op"].get<std::string>();
      ++differing[op];
      const double share = static_cast<double>(samples_off) / static_cast<double>(theirs.size());
      worst_share = std::max(worst_share, share);
      INFO(c["name"].get<std::string>() << ": " << samples_off << " samples differ, by up to " << largest);
      // On its own release torchvision's numbers are dettrial's, bit for bit. Another release's
      // linspace rounds the sampling grid's last bit differently, so a geometric operation's nearest
      // neighbour can fall on the other side of a tie; nothing else may differ.
      const bool geometric = op == "ShearX" || op == "ShearY" || op == "TranslateX" || op == "TranslateY" || op == "Rotate";
      CHECK((!test::same_release(*manifest) && geometric && share < 0.01));
    }
    ++cases;
  }
  std::string summary;
  for (const auto& [op, n] : differing) summary += " " + op + ":" + std::to_string(n);
  MESSAGE("torch " << (*manifest)["torch"].get<std::string>() << ", torchvision " << (*manifest)["torchvision"].get<std::string>() << ": "
                   << cases << " cases, differing" << (summary.empty() ? " none" : summary) << ", at most " << 100 * worst_share
                   << "% of a case's samples");
  CHECK(cases > 1000);
}

TEST_CASE("augment: rotate's quarter and half turns and its angles modulo 360 are torchvision's") {
  fs::path dir;
  std::string why;
  const auto manifest = augment_manifest(dir, why);
  if (!manifest) return test::skip(why);
  for (const auto& c : (*manifest)["rotations"]) {
    const Image input = read_image(dir, *manifest, c["image"].get<std::string>());
    const Image ours = vision::functional::rotate(input, c["angle"].get<double>());
    const auto theirs = read_bytes(dir / "op" / (c["name"].get<std::string>() + ".raw"));
    INFO(c["name"].get<std::string>() << " at " << c["angle"].get<double>() << " degrees");
    REQUIRE(ours.pixels.size() == theirs.size());
    CHECK(std::memcmp(ours.pixels.data(), theirs.data(), theirs.size()) == 0);
  }
}

TEST_CASE("augment: the magnitude tables, the AutoAugment policies and the operations' order are torchvision's") {
  fs::path dir;
  std::string why;
  const auto manifest = augment_manifest(dir, why);
  if (!manifest) return test::skip(why);
  std::int64_t values = 0;
  for (const auto& [key, table] : (*manifest)["tables"].items()) {
    const auto first_dot = key.find('.'), last_dot = key.rfind('.');
    const auto space =
        key.substr(0, first_dot) == "wide" ? vision::MagnitudeSpace::trivial_augment_wide : vision::MagnitudeSpace::auto_augment;
    const AugmentOp op = op_named(key.substr(first_dot + 1, last_dot - first_dot - 1));
    const std::int64_t bins = std::stoll(key.substr(last_dot + 1));
    INFO(key);
    CHECK(vision::signed_magnitude(op) == table["signed"].get<bool>());
    if (table["values"].is_null()) {
      CHECK_FALSE(vision::augment_magnitude(space, op, 0, bins, 29, 37).has_value());
      continue;
    }
    const auto expected = table["values"].get<std::vector<double>>();
    // torch's linspace changed its rounding between releases: another release's tables may differ in
    // the last bit of a float, nothing more.
    const double tolerance = test::same_release(*manifest) ? 0.0 : 2e-7;
    for (std::int64_t b = 0; b < bins; ++b, ++values) {
      const double ours = vision::augment_magnitude(space, op, b, bins, 29, 37).value(), theirs = expected[static_cast<std::size_t>(b)];
      CHECK(std::abs(ours - theirs) <= tolerance * std::max(1.0, std::abs(theirs)));
    }
  }
  CHECK(values > 400);
  const std::map<std::string, const dettrial::detail::augment::Policy*> policies{{"imagenet", &dettrial::detail::augment::imagenet},
                                                                                 {"cifar10", &dettrial::detail::augment::cifar10},
                                                                                 {"svhn", &dettrial::detail::augment::svhn}};
  for (const auto& [name, policy] : policies) {
    const auto& theirs = (*manifest)["policies"][name];
    REQUIRE(theirs.size() == policy->size());
    for (std::size_t i = 0; i < policy->size(); ++i)
      for (std::size_t k = 0; k < 2; ++k) {
        const auto& step = (*policy)[i][k];
        INFO(name << " pair " << i << " step " << k);
        CHECK(vision::name_of(step.op) == theirs[i][k][0].get<std::string>());
        CHECK(step.probability == theirs[i][k][1].get<double>());
        CHECK(step.bin == theirs[i][k][2].get<int>());
      }
  }
  for (const char* recipe : {"ra", "ta_wide"}) {
    const auto& theirs = (*manifest)["op_orders"][recipe];
    REQUIRE(theirs.size() == dettrial::detail::augment::random_ops.size());
    for (std::size_t i = 0; i < theirs.size(); ++i)
      CHECK(vision::name_of(dettrial::detail::augment::random_ops[i]) == theirs[i].get<std::string>());
  }
}

TEST_CASE("augment: MixUp and CutMix give torchvision's images and soft labels at the same draws") {
  fs::path dir;
  std::string why;
  const auto manifest = augment_manifest(dir, why);
  if (!manifest) return test::skip(why);
  for (const auto& c : (*manifest)["mix"]) {
    const std::string name = c["name"].get<std::string>();
    INFO(name);
    const auto shape = c["shape"].get<std::vector<std::int64_t>>();
    const torch::Dtype dtype = c["dtype"] == "uint8" ? torch::kUInt8 : torch::kFloat;
    const torch::Tensor images = read_tensor(dir / "mix" / (name + ".in.raw"), shape, dtype);
    const torch::Tensor labels = torch::tensor(c["labels"].get<std::vector<std::int64_t>>(), torch::kLong);
    const torch::Tensor want_images = read_tensor(dir / "mix" / (name + ".images.raw"), shape, dtype);
    const torch::Tensor want_labels = read_tensor(dir / "mix" / (name + ".labels.raw"), {shape[0], 10}, torch::kFloat);
    vision::LabelledBatch got;
    if (c["kind"] == "mixup") {
      got = vision::MixUp(10, 0.4).mix(images.clone(), labels, c["lam"].get<double>());
    } else {
      const auto center = c["center"].get<std::vector<std::int64_t>>();
      const vision::CutMixBox box = vision::CutMix::box_of(shape[2], shape[3], c["lam"].get<double>(), center[0], center[1]);
      CHECK(std::vector<std::int64_t>{box.x1, box.y1, box.x2, box.y2} == c["box"].get<std::vector<std::int64_t>>());
      got = vision::CutMix(10).cut(images.clone(), labels, box);
    }
    CHECK(torch::equal(std::get<0>(got), want_images));
    CHECK(torch::equal(std::get<1>(got), want_labels));
  }
}

TEST_CASE("augment: a policy draws from the record's stream: the same record the same image, other records others") {
  const MemorySource source;
  const Image image = source.load(3, vision::ImageMode::rgb);
  Image gray(17, 19, 1);
  for (std::size_t k = 0; k < gray.pixels.size(); ++k) gray.pixels[k] = static_cast<std::uint8_t>(k * 13 % 256);
  const std::vector<vision::AnyAutoAugment> policies{
      vision::AutoAugment(vision::AutoAugmentPolicy::imagenet), vision::AutoAugment(vision::AutoAugmentPolicy::cifar10),
      vision::AutoAugment(vision::AutoAugmentPolicy::svhn, {.interpolation = vision::Interpolation::bilinear, .fill = {128}}),
      vision::RandAugment({.num_ops = 3, .magnitude = 15}), vision::TrivialAugmentWide()};
  for (std::size_t p = 0; p < policies.size(); ++p) {
    INFO("policy " << p);
    std::set<std::vector<std::uint8_t>> outcomes;
    for (std::int64_t record = 0; record < 40; ++record) {
      vision::RecordRandom a(7, 2, record), b(7, 2, record);
      const Image first = policies[p](image, a), again = policies[p](image, b);
      CHECK(first.pixels == again.pixels);
      CHECK((first.height == image.height && first.width == image.width && first.channels == 3));
      outcomes.insert(first.pixels);
      vision::RecordRandom g(7, 2, record);
      CHECK(policies[p](gray, g).channels == 1);  // gray images go through every operation
    }
    CHECK(outcomes.size() > 10);  // the records are augmented differently
  }
  vision::RecordRandom r(1, 0, 0);
  CHECK(vision::RandAugment({.num_ops = 0})(image, r).pixels == image.pixels);
  CHECK_FALSE(vision::AnyAutoAugment::from_name("none").active());
  CHECK(vision::AnyAutoAugment::from_name("none")(image, r).pixels == image.pixels);
}

TEST_CASE("augment: RandomErasing erases one rectangle of torchvision's sizes after Normalize, with p and value as given") {
  const MemorySource source;
  const Image image = source.load(1, vision::ImageMode::rgb);
  const std::int64_t plane = image.height * image.width, n = 3 * plane;
  const vision::Compose plain(vision::ToFloat{}, vision::Normalize({0.4, 0.5, 0.6}, {0.2, 0.2, 0.2}));
  const vision::Compose erasing(vision::ToFloat{}, vision::Normalize({0.4, 0.5, 0.6}, {0.2, 0.2, 0.2}),
                                vision::RandomErasing({.p = 1.0, .value = {-9.0}}));  // outside what Normalize makes here
  std::vector<float> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
  plain.write(image, want.data());
  for (std::int64_t record = 0; record < 50; ++record) {
    vision::RecordRandom random(3, 0, record);
    erasing.write(image, got.data(), random);
    // The samples that changed form one rectangle, the same in every channel, set to the value.
    std::int64_t top = image.height, left = image.width, bottom = -1, right = -1, changed = 0;
    for (std::int64_t k = 0; k < 3; ++k)
      for (std::int64_t y = 0; y < image.height; ++y)
        for (std::int64_t x = 0; x < image.width; ++x) {
          const auto i = static_cast<std::size_t>(k * plane + y * image.width + x);
          if (got[i] == want[i]) continue;
          CHECK(got[i] == -9.0f);
          ++changed;
          top = std::min(top, y), left = std::min(left, x), bottom = std::max(bottom, y), right = std::max(right, x);
        }
    REQUIRE(changed > 0);
    const std::int64_t h = bottom - top + 1, w = right - left + 1;
    CHECK(changed == 3 * h * w);
    CHECK((h < image.height && w < image.width));
    const double fraction = static_cast<double>(h * w) / static_cast<double>(plane);
    CHECK((fraction > 0.01 && fraction < 0.45));  // scale (0.02, 0.33), with the sides rounded
  }
  // p = 0 leaves the image as Normalize made it; random values are standard normal, not constant.
  const vision::Compose never(vision::ToFloat{}, vision::Normalize({0.4, 0.5, 0.6}, {0.2, 0.2, 0.2}), vision::RandomErasing({.p = 0.0}));
  vision::RecordRandom r0(3, 0, 0);
  never.write(image, got.data(), r0);
  CHECK(got == want);
  const vision::Compose noisy(vision::ToFloat{}, vision::RandomErasing({.p = 1.0, .value = {}}));
  std::set<float> values;
  vision::RecordRandom r1(3, 0, 1);
  noisy.write(image, got.data(), r1);
  for (const float v : got)
    if (v < 0.0f || v > 1.0f) values.insert(v);
  CHECK(values.size() > 5);
  // An 8-bit batch erases with whole numbers; random values need a float batch.
  CHECK_THROWS_WITH_AS(vision::Compose(vision::RandomErasing({.value = {}})), doctest::Contains("random values need a float batch"),
                       DataError);
  CHECK_THROWS_WITH_AS(vision::Compose(vision::RandomErasing({.value = {0.5}})), doctest::Contains("whole numbers in [0, 255]"), DataError);
  CHECK_THROWS_WITH_AS(vision::RandomErasing({.p = 1.5}), doctest::Contains("p is a probability"), DataError);
  const vision::Compose two_values(vision::ToFloat{}, vision::RandomErasing({.p = 1.0, .value = {1.0, 2.0}}));
  vision::RecordRandom r2(3, 0, 2);
  CHECK_THROWS_WITH_AS(two_values.write(image, got.data(), r2), doctest::Contains("2 values for an image of 3 channels"), DataError);
}

TEST_CASE(
    "augment: ImageDataset mixes each batch with soft labels, the same way again for the same batch, and refuses what cannot be mixed") {
  const MemorySource source;
  const vision::Compose pipeline(vision::RandomHorizontalFlip{}, vision::ToFloat{});
  const vision::ImageDataset mixed(source, pipeline, vision::RandomChoice(vision::MixUp(10, 0.2), vision::CutMix(10, 1.0)),
                                   {.pin_memory = false});
  const vision::ImageDataset unmixed(source, pipeline, {.pin_memory = false});
  const torch::Tensor indices = torch::tensor({12, 4, 7, 0, 9}, torch::kLong);  // 5 records: an odd batch
  std::int64_t batches_changed = 0;
  for (std::int64_t epoch = 0; epoch < 8; ++epoch) {
    const dettrial::BatchOrigin origin{.epoch = epoch, .seed = 21};
    const auto [images, labels] = mixed.get_batch(indices, origin);
    const auto [again_images, again_labels] = mixed.get_batch(indices, origin);
    const auto [plain_images, plain_labels] = unmixed.get_batch(indices, origin);
    CHECK(torch::equal(images, again_images));
    CHECK(torch::equal(labels, again_labels));
    REQUIRE(labels.sizes() == torch::IntArrayRef({5, 10}));
    CHECK(torch::allclose(labels.sum(1), torch::ones({5})));
    // Each soft label mixes the record's own class with its predecessor's in the batch.
    for (std::int64_t i = 0; i < 5; ++i) {
      const std::int64_t own = plain_labels[i].item<std::int64_t>(), previous = plain_labels[(i + 4) % 5].item<std::int64_t>();
      const torch::Tensor others = labels[i].clone().index_fill_(0, torch::tensor({own, previous}), 0.0);
      CHECK(others.abs().max().item<float>() == 0.0f);
    }
    batches_changed += torch::equal(images, plain_images) ? 0 : 1;
  }
  CHECK(batches_changed >= 6);
  // MixUp needs float images; labels outside the classes are named.
  const vision::ImageDataset bytes(source, vision::Compose(vision::RandomHorizontalFlip{}), vision::MixUp(10), {.pin_memory = false});
  CHECK_THROWS_WITH_AS(bytes.get_batch(indices), doctest::Contains("MixUp: the images must be float"), DataError);
  CHECK_THROWS_WITH_AS(vision::MixUp(4).mix(torch::zeros({2, 1, 2, 2}), torch::tensor({1, 4}), 0.5),
                       doctest::Contains("a label lies outside [0, num_classes = 4)"), DataError);
  CHECK_THROWS_WITH_AS(vision::CutMix(0), doctest::Contains("num_classes must be positive"), DataError);
  CHECK_THROWS_WITH_AS(vision::MixUpCutMix(10, -1.0, 0.0), doctest::Contains("0 (off) or positive"), DataError);
  // Neither alpha: the batch stays as it was, class indices and all.
  const vision::ImageDataset off(source, pipeline, vision::MixUpCutMix(10, 0.0, 0.0), {.pin_memory = false});
  CHECK(std::get<1>(off.get_batch(indices)).dim() == 1);
}

TEST_CASE("augment: a wrong policy name, bin, operation count or fill is an error that says what is allowed") {
  CHECK_THROWS_WITH_AS(vision::AnyAutoAugment::from_name("augmix"), doctest::Contains("'ra' (RandAugment), 'ta_wide'"),
                       dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(vision::RandAugment({.magnitude = 31}), doctest::Contains("magnitude is a bin in [0, num_magnitude_bins = 31)"),
                       DataError);
  CHECK_THROWS_WITH_AS(vision::RandAugment({.num_ops = -1}), doctest::Contains("num_ops must not be negative"), DataError);
  CHECK_THROWS_WITH_AS(vision::TrivialAugmentWide({.num_magnitude_bins = 1}), doctest::Contains("at least 2"), DataError);
  const Image image = MemorySource{}.load(0, vision::ImageMode::rgb);
  CHECK_THROWS_WITH_AS(vision::functional::rotate(image, 10.0, vision::Interpolation::nearest, {1.0, 2.0}),
                       doctest::Contains("fill takes one value or one per channel (3), not 2"), DataError);
  CHECK_THROWS_WITH_AS(vision::functional::affine(image, {.angle = 5.0}, vision::Interpolation::nearest, {300.0}),
                       doctest::Contains("fill values lie in [0, 255]"), DataError);
  CHECK_THROWS_WITH_AS(vision::functional::posterize(image, 9), doctest::Contains("bits lie in [0, 8]"), DataError);
  Image four(3, 3, 4);
  CHECK_THROWS_WITH_AS(vision::functional::adjust_contrast(four, 1.5), doctest::Contains("images of 1 or 3 channels, not 4"), DataError);
}

TEST_CASE("augment: a last RandomHorizontalFlip is mirrored as the batch is written, the same batch as flipping first") {
  const MemorySource source;
  const torch::Tensor indices = torch::tensor({12, 4, 7, 0, 9, 3, 11}, torch::kLong);
  const auto expected_batch = [&](const auto& pipeline, const dettrial::BatchOrigin& origin) {
    torch::Tensor out = torch::empty({indices.size(0), 3, 16, 16}, pipeline.dtype());
    for (std::int64_t r = 0; r < indices.size(0); ++r) {
      const std::int64_t record = indices[r].item<std::int64_t>();
      vision::RecordRandom random(origin.seed, origin.epoch, record);
      const Image image = pipeline.apply(source.load(record, vision::ImageMode::rgb), random);  // flipped in place
      pipeline.write(image, out[r].data_ptr(), random);
    }
    return out;
  };
  const auto check = [&](const auto& pipeline, bool deferred) {
    CHECK(std::remove_cvref_t<decltype(pipeline)>::flips_last == deferred);
    const vision::ImageDataset dataset(source, pipeline, {.pin_memory = false});
    std::int64_t mirrored = 0;
    for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
      const dettrial::BatchOrigin origin{.epoch = epoch, .seed = 17};
      CHECK(torch::equal(std::get<0>(dataset.get_batch(indices, origin)), expected_batch(pipeline, origin)));
      for (std::int64_t r = 0; r < indices.size(0); ++r) {
        vision::RecordRandom random(origin.seed, origin.epoch, indices[r].item<std::int64_t>());
        mirrored += pipeline.prepare(source.load(0, vision::ImageMode::rgb), random).mirrored ? 1 : 0;
      }
    }
    // Both ways drawn (21 draws at p = 0.5): a writer that ignored the flag would have failed above.
    if (deferred) CHECK((mirrored > 0 && mirrored < 21));
  };
  const std::vector<double> mean{0.5, 0.4, 0.3}, std{0.2, 0.25, 0.3};
  // Float with Normalize and RandomErasing after the write; 8-bit; and a flip that is not last.
  check(vision::Compose(vision::RandomCrop(16), vision::RandomHorizontalFlip{}, vision::ToFloat{}, vision::Normalize(mean, std),
                        vision::RandomErasing({.p = 0.5})),
        true);
  check(vision::Compose(vision::RandomCrop(16), vision::RandomHorizontalFlip{}), true);
  check(vision::Compose(vision::RandomHorizontalFlip{}, vision::RandomCrop(16), vision::ToFloat{}), false);
}
