// SPDX-License-Identifier: Apache-2.0
// The porting guide's ImageNet trial (Determined's imagenet_pytorch tutorial, from PyTorch's
// examples/imagenet), written as the guide writes it: imperative style, the model, the optimizer and
// the StepLR scheduler wrapped in the constructor, `train_batch` stepping the optimizer itself, top-1
// and top-5 accuracy as the guide's `accuracy(output, target, topk=(1, 5))` computes them. Optional
// hyperparameters add torchvision's reference recipe: auto_augment ("ra", "ta_wide", "imagenet", ...),
// random_erase, mixup_alpha, cutmix_alpha and label_smoothing, under its names.
//   scripts/imagenet-folder    # an ImageNet-shaped folder from Fashion-MNIST, or your ImageNet
//   imagenet --config examples/imagenet/const.yaml --set data.train_dir=... --set data.validation_dir=...
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dettrial/vision.hpp>

namespace imagenet {

namespace vision = dettrial::vision;
namespace models = dettrial::vision::models;

/// The guide's `accuracy(output, target, topk)`: for each k, the percentage of the batch whose
/// label is among the k largest outputs (k is capped at the number of classes).
inline std::vector<torch::Tensor> accuracy(const torch::Tensor& output, torch::Tensor target, std::vector<std::int64_t> topk) {
  torch::NoGradGuard no_grad;
  if (target.dim() == 2) target = target.argmax(1);  // MixUp's and CutMix's soft labels: the larger share, as the recipe counts
  const std::int64_t maxk = std::min(*std::max_element(topk.begin(), topk.end()), output.size(1));
  const torch::Tensor predicted = std::get<1>(output.topk(maxk, 1, /*largest=*/true, /*sorted=*/true)).t();
  const torch::Tensor correct = predicted.eq(target.view({1, -1}).expand_as(predicted));
  std::vector<torch::Tensor> result;
  for (const std::int64_t k : topk)
    result.push_back(
        correct.slice(0, 0, std::min(k, maxk)).reshape(-1).to(torch::kFloat).sum().mul(100.0 / static_cast<double>(target.size(0))));
  return result;
}

/// A data path: absolute, or under $DETTRIAL_IMAGE_FOLDER (the tests' folder).
inline std::filesystem::path under_image_folder(const std::filesystem::path& path) {
  const char* root = std::getenv("DETTRIAL_IMAGE_FOLDER");
  return path.is_absolute() || !root || !*root ? path : std::filesystem::path(root) / path;
}

/// The training (`key` train_dir) or validation (validation_dir) folder: data.`key`, else, as the
/// guide's const.yaml gives it, `hyperparameters.data` as ImageNet's root with `train/` and `val/`
/// below it (PyTorch's examples/imagenet: os.path.join(args.data, "train"), "val").
inline std::filesystem::path data_path(const dettrial::Context& context, const char* key) {
  const YAML::Node& data = context.get_data_config();
  if (data[key]) return under_image_folder(data[key].as<std::string>());
  if (context.get_hparams().contains("data")) {
    const std::filesystem::path root = context.get_hparam<std::string>("data");
    return under_image_folder(root / (std::string(key) == "train_dir" ? "train" : "val"));
  }
  throw dettrial::ConfigError(std::string("the ImageNet example needs data.") + key +
                              " (a folder of class folders, ImageNet's layout), or the guide's hyperparameters.data (ImageNet's "
                              "root, with train/ and val/ below it)");
}

/// data.`key` as a T, or `fallback` when absent; a value of another type is an error naming the key.
template <class T>
T data_or(const YAML::Node& data, const char* key, T fallback) {
  static_assert(std::is_same_v<T, bool> || std::is_integral_v<T>, "data_or names the expected type for flags and whole numbers only");
  const YAML::Node value = data[key];
  if (!value) return fallback;
  try {
    return value.as<T>();
  } catch (const YAML::Exception&) {
    throw dettrial::ConfigError(std::string("data.") + key + ": '" + YAML::Dump(value) + "' is not " +
                                (std::is_same_v<T, bool> ? "true or false" : "a whole number"));
  }
}

/// torch.hub's cache, where torchvision keeps the weights it downloads: $TORCH_HOME, else
/// $XDG_CACHE_HOME/torch, else ~/.cache/torch (torch.hub's _get_torch_home).
inline std::filesystem::path torch_home() {
  const auto set = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value && *value ? value : nullptr;
  };
  if (const char* home = set("TORCH_HOME")) return home;
  if (const char* cache = set("XDG_CACHE_HOME")) return std::filesystem::path(cache) / "torch";
  const char* user = set("HOME");
  return std::filesystem::path(user ? user : "/") / ".cache" / "torch";
}

/// The file torchvision's `models.<arch>(pretrained=True)` loads (its IMAGENET1K_V1 weights), as
/// torch.hub names it in its cache.
inline std::string torchvision_weights_file(const std::string& arch) {
  static const std::pair<const char*, const char*> files[] = {{"resnet18", "resnet18-f37072fd.pth"},
                                                              {"resnet34", "resnet34-b627a593.pth"},
                                                              {"resnet50", "resnet50-0676ba61.pth"},
                                                              {"resnet101", "resnet101-63fe2227.pth"},
                                                              {"resnet152", "resnet152-394f9c45.pth"},
                                                              {"resnext50_32x4d", "resnext50_32x4d-7cdf4587.pth"},
                                                              {"wide_resnet50_2", "wide_resnet50_2-95faca4d.pth"}};
  for (const auto& [name, file] : files)
    if (arch == name) return file;
  return arch + ".pth";
}

/// The weights file the `pretrained` hyperparameter asks for: none (false, an empty string, absent),
/// the file it names, or (true, as the guide's const.yaml says) torchvision's ImageNet weights for
/// `arch` in torch.hub's cache; nothing is downloaded, and weights that are not there are refused in
/// one sentence saying how to put them there.
inline std::optional<std::filesystem::path> pretrained_weights(const dettrial::Context& context, const std::string& arch) {
  if (!context.get_hparams().contains("pretrained")) return std::nullopt;
  const YAML::Node value = context.get_hparams().node("pretrained");
  bool flag = false;
  if (value.IsScalar() && YAML::convert<bool>::decode(value, flag)) {
    if (!flag) return std::nullopt;
    const std::filesystem::path cached = torch_home() / "hub" / "checkpoints" / torchvision_weights_file(arch);
    if (!std::filesystem::exists(cached))
      throw dettrial::ConfigError(
          "hyperparameters.pretrained is true, but torchvision's ImageNet weights for " + arch + " are not in " + cached.string() +
          " (torch.hub's cache, $TORCH_HOME); put them there with python3 -c \"import torchvision; " + "torchvision.models." + arch +
          "(weights='IMAGENET1K_V1')\" (it downloads them), or give pretrained " + "the path of a state dict file");
    return cached;
  }
  const auto path = context.get_hparam<std::string>("pretrained");
  if (path.empty()) return std::nullopt;
  return std::filesystem::path(path);
}

/// `models.__dict__[arch]()`, or with the weights `pretrained` asks for (pretrained_weights: a file
/// `torch.save(model.state_dict())` wrote, or torchvision's in torch.hub's cache). Weights for another
/// number of classes warm-start all but `fc`.
inline models::ResNet build_model(const dettrial::Context& context, std::int64_t classes) {
  const auto arch = context.get_hparam<std::string>("arch");
  auto model = models::resnet(arch, {.num_classes = classes});
  const std::optional<std::filesystem::path> weights_file = pretrained_weights(context, arch);
  if (!weights_file) {
    std::cout << "=> creating model '" << arch << "'\n";
    return model;
  }
  const std::string pretrained = weights_file->string();
  std::cout << "=> using pre-trained model '" << arch << "' from '" << pretrained << "'\n";
  auto weights = dettrial::read_model_state_dict(pretrained);
  const bool same_classes = !weights.contains("fc.weight") || weights.at("fc.weight").toTensor().size(0) == classes;
  if (!same_classes) {
    std::cout << "=> its classifier has " << weights.at("fc.weight").toTensor().size(0) << " classes, this data " << classes
              << ": fc starts fresh\n";
    static_cast<void>(weights.erase("fc.weight"));
    static_cast<void>(weights.erase("fc.bias"));
  }
  dettrial::load_state_dict(*model, weights, /*strict=*/same_classes, "'" + pretrained + "'");
  return model;
}

class ImageNetTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  explicit ImageNetTrial(dettrial::Context& context)
      : context_(context),
        train_folder_(data_path(context, "train_dir")),
        model_(context.wrap_model(build_model(context, static_cast<std::int64_t>(train_folder_.classes().size())))),
        optimizer_(model_->parameters(), torch::optim::SGDOptions(context.get_hparam<double>("lr"))
                                             .momentum(context.get_hparam<double>("momentum"))
                                             .weight_decay(context.get_hparam<double>("weight_decay"))),
        // The guide's StepLR: the learning rate divided by 10 every lr_step_epochs (30 in PyTorch's
        // recipe), stepped once an epoch. Python's StepLR, which dettrial::optim::StepLR is:
        // LibTorch's torch::optim::StepLR decays one epoch later.
        lr_sch_(optimizer_, context.get_hparams().get_or<std::int64_t>("lr_step_epochs", 30), 0.1),
        // The recipe's nn.CrossEntropyLoss(label_smoothing=...): it takes MixUp's soft labels too.
        criterion_(torch::nn::CrossEntropyLossOptions().label_smoothing(context.get_hparams().get_or<double>("label_smoothing", 0.0))) {
    context.wrap_optimizer(optimizer_);
    context.wrap_lr_scheduler(lr_sch_, dettrial::lr_step::every_epoch{});
    const YAML::Node& data = context.get_data_config();
    validation_dir_ = data_path(context, "validation_dir");
    crop_ = data_or<std::int64_t>(data, "crop", 224);
    resize_ = data_or<std::int64_t>(data, "resize", 256);
    // JPEGs decoded at 1/2, 1/4 or 1/8 scale where the crop's window stays at least its output size:
    // faster on large images, not torchvision's pixels, so off unless the config asks.
    reduced_decode_ = data_or(data, "reduced_decode", false);
  }

  /// transforms.RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(mean, std); with
  /// the recipe's hyperparameters, its policy after the flip, RandomErasing last, MixUp or CutMix per batch.
  auto build_training_data_loader() {
    const auto& hparams = context_.get_hparams();
    // The reference recipe samples its policies' geometry bilinearly.
    const auto policy = vision::AnyAutoAugment::from_name(hparams.get_or<std::string>("auto_augment", "none"),
                                                          {.interpolation = vision::Interpolation::bilinear},
                                                          static_cast<int>(hparams.get_or<std::int64_t>("ra_magnitude", 9)));
    const vision::RandomErasing erasing({.p = hparams.get_or<double>("random_erase", 0.0)});
    const vision::MixUpCutMix mixing(static_cast<std::int64_t>(train_folder_.classes().size()), hparams.get_or<double>("mixup_alpha", 0.0),
                                     hparams.get_or<double>("cutmix_alpha", 0.0));
    const vision::RandomResizedCrop crop(crop_, {.reduced_decode = reduced_decode_});
    vision::ImageDataset train(
        train_folder_,
        vision::Compose(crop, vision::RandomHorizontalFlip{}, policy, vision::ToFloat{}, vision::Normalize(mean, std), erasing), mixing);
    return dettrial::DataLoader(std::move(train),
                                {.batch_size = context_.get_per_slot_batch_size(), .shuffle = true, .workers = workers()});
  }

  /// transforms.Resize(256), CenterCrop(224), ToTensor(), Normalize(mean, std).
  auto build_validation_data_loader() {
    vision::ImageDataset validation(
        vision::ImageFolder(validation_dir_),
        vision::Compose(vision::Resize(resize_), vision::CenterCrop(crop_), vision::ToFloat{}, vision::Normalize(mean, std)));
    return dettrial::DataLoader(std::move(validation), {.batch_size = context_.get_per_slot_batch_size(), .workers = workers()});
  }

  dettrial::Metrics train_batch(Batch& batch, std::int64_t /*epoch_idx*/, std::int64_t /*batch_idx*/) {
    auto& [images, target] = batch;
    const torch::Tensor output = model_->forward(images);
    const torch::Tensor loss = criterion_(output, target);
    const auto acc = accuracy(output, target, {1, 5});
    context_.backward(loss);
    context_.step_optimizer(optimizer_);
    return {{"loss", loss}, {"acc1", acc[0]}, {"acc5", acc[1]}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch) {
    auto& [images, target] = batch;
    const torch::Tensor output = model_->forward(images);
    const auto acc = accuracy(output, target, {1, 5});
    return {{"val_loss", criterion_(output, target)}, {"acc1", acc[0]}, {"acc5", acc[1]}};
  }

 private:
  inline static const std::vector<double> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};

  /// The guide's `workers` hyperparameter: the loader's decoding threads (the default when absent).
  std::optional<int> workers() const {
    if (!context_.get_hparams().contains("workers")) return std::nullopt;
    return static_cast<int>(context_.get_hparam<std::int64_t>("workers"));
  }

  dettrial::Context& context_;
  vision::ImageFolder train_folder_;  // listed once: the model's classes and the training data
  models::ResNet model_;
  torch::optim::SGD optimizer_;
  dettrial::optim::StepLR lr_sch_;
  torch::nn::CrossEntropyLoss criterion_;  // the guide's nn.CrossEntropyLoss(), with the recipe's label smoothing
  std::filesystem::path validation_dir_;
  std::int64_t crop_ = 224, resize_ = 256;
  bool reduced_decode_ = false;  // data.reduced_decode
};

}  // namespace imagenet
