// torchvision's ResNets in dettrial::vision::models against torchvision itself: the files Python
// saved load strictly, the logits and BatchNorm updates are torchvision's, and a network built after
// the same seed holds torchvision's initial weights.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <dettrial/vision.hpp>

#include "skip.hpp"
#include "torch_release.hpp"

namespace fs = std::filesystem;
namespace models = dettrial::vision::models;

namespace {

/// What tests/python/torchvision_resnets.py wrote (CTest's fixture sets the variable), or why not.
std::optional<nlohmann::json> resnet_manifest(fs::path& dir, std::string& why) {
  const char* where = std::getenv("DETTRIAL_RESNET_FIXTURES");
  if (!where || !fs::exists(fs::path(where) / "manifest.json")) {
    why = "no ResNet fixtures (tests/python/torchvision_resnets.py needs a Python with torchvision: -DDETTRIAL_TORCHVISION_PYTHON)";
    return std::nullopt;
  }
  dir = where;
  std::ifstream in(dir / "manifest.json");
  auto manifest = nlohmann::json::parse(in);
  if (manifest.contains("missing")) {
    why = manifest["missing"].get<std::string>();
    return std::nullopt;
  }
  return manifest;
}

torch::Tensor entry(const dettrial::StateDict& state, const std::string& name) {
  REQUIRE_MESSAGE(state.contains(name), "no '" << name << "' in the file");
  return state.at(name).toTensor();
}

/// The largest difference relative to the reference's largest magnitude.
double relative_difference(const torch::Tensor& ours, const torch::Tensor& theirs) {
  const double scale = std::max(theirs.abs().max().item<double>(), 1e-30);
  return (ours.to(torch::kDouble) - theirs.to(torch::kDouble)).abs().max().item<double>() / scale;
}

/// One thread for the test's length: Python computed its numbers on one, and the reduction order of
/// a convolution depends on how many split it.
struct OneThread {
  int before = torch::get_num_threads();
  OneThread() { torch::set_num_threads(1); }
  ~OneThread() { torch::set_num_threads(before); }
};

}  // namespace

TEST_CASE("vision: torchvision's ResNets load strictly here and compute its logits and BatchNorm statistics") {
  fs::path dir;
  std::string why;
  const auto manifest = resnet_manifest(dir, why);
  if (!manifest) return test::skip(why);
  const bool exact = test::same_release(*manifest);
  const OneThread one_thread;
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (const auto& arch : (*manifest)["architectures"]) {
    const std::string name = arch.get<std::string>();
    CAPTURE(name);
    auto model = models::resnet(name, {.num_classes = (*manifest)["num_classes"].get<std::int64_t>()});
    // Strict: every name and shape of torchvision's state dict, and none more.
    const auto keys = dettrial::load_weights(model, dir / (name + ".pt"));
    CHECK(keys.empty());
    const auto io = dettrial::read_model_state_dict(dir / (name + ".io.pt"));
    const torch::Tensor images = entry(io, "input");
    model->eval();
    const torch::Tensor evaluated = model->forward(images);
    model->train();
    const torch::Tensor trained = model->forward(images);
    std::vector<std::pair<std::string, double>> differences{{"eval", relative_difference(evaluated, entry(io, "eval"))},
                                                            {"train", relative_difference(trained, entry(io, "train"))}};
    for (const auto& buffer : model->named_buffers())
      differences.emplace_back(buffer.key(), relative_difference(buffer.value(), entry(io, "after." + buffer.key())));
    for (const auto& [what, difference] : differences) {
      CAPTURE(what);
      worst = std::max(worst, difference);
      // The same release runs the same kernels on one thread: the same bits. Another release (Debian's
      // LibTorch 1.13 against PyPI's torchvision) blocks its convolutions otherwise: float32 rounding
      // over up to 152 layers, within 1e-4 of the largest logit in eval mode. In train mode BatchNorm
      // divides by statistics of the batch itself, over as few as 12 values a channel in layer4 (3
      // images of 2 x 2), which multiplies those differences, and by how much depends on the CPU's
      // kernels: measured up to 3.4e-4 on one machine and 1.1e-3 (ResNet-152) on another, held to
      // 5e-3 (a wrong layer or weight is off by the size of the logits themselves).
      const double tolerance = what == "eval" ? 1e-4 : 5e-3;
      if (exact) CHECK(difference == 0.0);
      else CHECK(difference < tolerance);
    }
  }
  MESSAGE("torchvision " << (*manifest)["torchvision"].get<std::string>() << " on torch " << (*manifest)["torch"].get<std::string>()
                         << ": largest difference " << worst << " of the largest value ("
                         << std::string(exact ? "same release" : "another release") << ")");
}

TEST_CASE("vision: torchvision's ResNets saved as safetensors load into the same weights as their torch.save files") {
  fs::path dir;
  std::string why;
  const auto manifest = resnet_manifest(dir, why);
  if (!manifest) return test::skip(why);
  if (!manifest->contains("safetensors") || (*manifest)["safetensors"].empty())
    return test::skip("the fixtures' Python has no safetensors (PyPI's safetensors: scripts/test installs it with transformers)");
  for (const auto& arch : (*manifest)["safetensors"]) {
    const std::string name = arch.get<std::string>();
    CAPTURE(name);
    auto from_pickle = models::resnet(name, {.num_classes = (*manifest)["num_classes"].get<std::int64_t>()});
    auto from_safetensors = models::resnet(name, {.num_classes = (*manifest)["num_classes"].get<std::int64_t>()});
    dettrial::load_weights(from_pickle, dir / (name + ".pt"));
    CHECK(dettrial::load_weights(from_safetensors, dir / (name + ".safetensors")).empty());  // strictly: every name, none more
    const auto expected = dettrial::module_state_dict(*from_pickle);
    const auto loaded = dettrial::module_state_dict(*from_safetensors);
    REQUIRE(expected.size() == loaded.size());
    for (const auto& e : expected) {
      CAPTURE(e.key().toStringRef());
      CHECK(torch::equal(e.value().toTensor(), loaded.at(e.key()).toTensor()));
    }
  }
}

TEST_CASE("vision: a ResNet built after manual_seed holds torchvision's initial weights, zero_init_residual included") {
  fs::path dir;
  std::string why;
  const auto manifest = resnet_manifest(dir, why);
  if (!manifest) return test::skip(why);
  const bool exact = test::same_release(*manifest);
  for (const auto& [name, options] : (*manifest)["initialised"].items()) {
    CAPTURE(name);
    torch::manual_seed(7);
    auto model = models::resnet(name, {.num_classes = (*manifest)["num_classes"].get<std::int64_t>(),
                                       .zero_init_residual = options.value("zero_init_residual", false)});
    const auto theirs = dettrial::read_model_state_dict(dir / (name + ".init.pt"));
    const auto ours = model->named_parameters();
    const auto buffers = model->named_buffers();
    CHECK(theirs.size() == ours.size() + buffers.size());
    std::size_t zero_weights = 0;
    for (const auto& parameter : ours) {
      const std::string& key = parameter.key();
      const torch::Tensor& value = parameter.value();
      CAPTURE(key);
      const torch::Tensor reference = entry(theirs, key);
      REQUIRE(reference.sizes() == value.sizes());
      // On the same release the random draws are the same, in the same order: the same bits.
      if (exact) CHECK(torch::equal(reference, value));
      if (value.dim() == 4) {
        // Kaiming normal, fan out, gain sqrt(2): std sqrt(2 / (out channels x kernel area)).
        const double expected = std::sqrt(2.0 / static_cast<double>(value.size(0) * value.size(2) * value.size(3)));
        if (value.numel() >= 4096) CHECK(std::abs(value.std().item<double>() / expected - 1.0) < 0.05);
      }
      if (value.dim() == 1 && value.abs().sum().item<double>() == 0 && key.find(".bn") != std::string::npos && key.size() > 7 &&
          key.compare(key.size() - 7, 7, ".weight") == 0)
        ++zero_weights;
    }
    // zero_init_residual: the last BatchNorm of every residual branch starts at zero, and only those.
    const bool zero_init = options.value("zero_init_residual", false);
    std::size_t blocks = 0;
    for (const auto& module : model->modules(false))
      if (module->as<models::BottleneckImpl>() != nullptr || module->as<models::BasicBlockImpl>() != nullptr) ++blocks;
    const std::size_t expected_zero = zero_init ? blocks : 0;
    CHECK(zero_weights == expected_zero);
  }
}

TEST_CASE("vision: resnet(name) builds torchvision's architectures by name and refuses others, naming them") {
  CHECK(models::resnet_architectures().size() == 7);
  auto r18 = models::resnet("resnet18", {.num_classes = 3});
  CHECK(r18->fc->weight.sizes() == torch::IntArrayRef({3, 512}));
  // torchvision's parameter counts at 1000 classes.
  auto count = [](const models::ResNet& m) {
    std::int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    return n;
  };
  CHECK(count(models::resnet18()) == 11689512);
  CHECK(count(models::resnet50()) == 25557032);
  CHECK(count(models::resnext50_32x4d()) == 25028904);
  CHECK(count(models::wide_resnet50_2()) == 68883240);
  CHECK_THROWS_WITH_AS(models::resnet("resnet19"),
                       doctest::Contains("no architecture named 'resnet19' (dettrial builds resnet18, resnet34"), dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(models::resnet18({.groups = 32}), doctest::Contains("BasicBlock only supports groups 1 and width_per_group 64"),
                       dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(models::resnet34({.replace_stride_with_dilation = {false, true, true}}),
                       doctest::Contains("BasicBlock does not support dilation"), dettrial::ConfigError);
  // Dilation in place of stride (a Bottleneck network): layer4 keeps layer3's resolution.
  torch::NoGradGuard no_grad;
  auto dilated = models::resnet50({.num_classes = 4, .replace_stride_with_dilation = {false, false, true}});
  CHECK((*dilated->layer4[0]->as<models::BottleneckImpl>()->conv2->options.dilation())[0] == 1);
  CHECK((*dilated->layer4[1]->as<models::BottleneckImpl>()->conv2->options.dilation())[0] == 2);
  CHECK(dilated->forward(torch::zeros({1, 3, 64, 64})).sizes() == torch::IntArrayRef({1, 4}));
}
