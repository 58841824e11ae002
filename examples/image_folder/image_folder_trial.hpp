// SPDX-License-Identifier: Apache-2.0
// An image classifier trained from image files: a CIFAR-style ResNet (ResNet-20 with 3 blocks a
// stage, ResNet-8 with 1) over an ImageFolder of JPEG or PNG files, augmented with RandomCrop
// (padding 4) and horizontal flips as torchvision's CIFAR recipes do, in dettrial's declarative style.
//   scripts/image-folder    # writes Fashion-MNIST as PNG and JPEG folders
//   image_folder --config examples/image_folder/png.yaml
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <dettrial/vision.hpp>

namespace image_folder {

namespace vision = dettrial::vision;

/// ResNet's basic block: two 3x3 convolutions with batch norm, and the shortcut (a 1x1 convolution
/// where the shape changes).
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      shortcut = register_module("shortcut",
                                 torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                                       torch::nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

/// The CIFAR ResNet of He et al.: a 3x3 stem of `width` channels, three stages of `blocks` blocks
/// (width, 2 width stride 2, 4 width stride 2), global average pooling and a linear classifier.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl(std::int64_t channels, std::int64_t classes, std::int64_t blocks, std::int64_t width)
      : stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, width, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(width))),
        stages(register_module("stages", torch::nn::Sequential())),
        fc(register_module("fc", torch::nn::Linear(4 * width, classes))) {
    std::int64_t in = width;
    for (const std::int64_t stage : {0, 1, 2}) {
      const std::int64_t out = width << stage;
      for (std::int64_t b = 0; b < blocks; ++b) {
        stages->push_back(BasicBlock(in, out, stage > 0 && b == 0 ? 2 : 1));
        in = out;
      }
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor features = stages->forward(torch::relu(bn(stem(x))));
    return fc(torch::adaptive_avg_pool2d(features, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential stages;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet);

/// The folder a relative data path is under: $DETTRIAL_IMAGE_FOLDER, else where scripts/image-folder
/// writes by default (the user's cache).
inline std::filesystem::path data_root() {
  if (const char* root = std::getenv("DETTRIAL_IMAGE_FOLDER"); root && *root) return root;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache) return std::filesystem::path(cache) / "dettrial" / "image-folder";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : ".") / ".cache" / "dettrial" / "image-folder";
}

class ImageFolderTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  explicit ImageFolderTrial(dettrial::Context& context) : context_(context) {
    const YAML::Node& data = context.get_data_config();
    const auto path = [&](const char* key) {
      if (!data[key]) throw dettrial::ConfigError(std::string("the image_folder example needs data.") + key + " (an ImageFolder tree)");
      const std::filesystem::path p = data[key].as<std::string>();
      return p.is_absolute() ? p : data_root() / p;
    };
    train_folder_.emplace(path("train_dir"));  // listed once: the model's classes and the training data
    validation_dir_ = path("validation_dir");
    image_size_ = data["image_size"] ? data["image_size"].as<std::int64_t>() : 32;
    mode_ = data["mode"] && data["mode"].as<std::string>() == "L" ? vision::ImageMode::gray : vision::ImageMode::rgb;
    mean_ = data["mean"] ? data["mean"].as<std::vector<double>>() : std::vector<double>{0.5};
    std_ = data["std"] ? data["std"].as<std::vector<double>>() : std::vector<double>{0.5};
    skip_unreadable_ = data["skip_unreadable"] && data["skip_unreadable"].as<bool>();
    validation_records_ = data["validation_records"] ? data["validation_records"].as<std::int64_t>() : 0;
    if (data["workers"]) workers_ = data["workers"].as<int>();
  }

  ResNet build_model() {
    return ResNet(vision::channels_of(mode_), static_cast<std::int64_t>(train_folder_->classes().size()),
                  context_.get_hparam<std::int64_t>("blocks"), context_.get_hparam<std::int64_t>("width"));
  }

  dettrial::optim::FusedSGD optimizer(ResNet& model) {
    return dettrial::optim::FusedSGD(model->parameters(), torch::optim::SGDOptions(context_.get_hparam<double>("learning_rate"))
                                                              .momentum(0.9)
                                                              .weight_decay(context_.get_hparam<double>("weight_decay"))
                                                              .nesterov(true));
  }

  /// The learning rate times `lr_decay` after every epoch (default 1: constant).
  auto lr_scheduler(dettrial::optim::FusedSGD& optimizer) {
    return dettrial::scheduled(dettrial::optim::StepLR(optimizer, 1, context_.get_hparams().get_or<double>("lr_decay", 1.0)),
                               dettrial::lr_step::every_epoch{});
  }

  /// torchvision's CIFAR training recipe: RandomCrop(size, padding=4), RandomHorizontalFlip(),
  /// ToTensor(), Normalize(mean, std), decoded and augmented on the loader's worker threads.
  auto build_training_data_loader() {
    vision::ImageDataset train(*train_folder_,
                               vision::Compose(vision::Resize(image_size_, image_size_), vision::RandomCrop(image_size_, {.padding = {4}}),
                                               vision::RandomHorizontalFlip{}, vision::ToFloat{}, vision::Normalize(mean_, std_)),
                               options());
    return dettrial::DataLoader(std::move(train), {.batch_size = context_.get_per_slot_batch_size(), .shuffle = true, .workers = workers_});
  }

  auto build_validation_data_loader() {
    vision::ImageFolder folder(validation_dir_);
    if (validation_records_ > 0 && validation_records_ < folder.size()) {
      // An evenly spread subset, for quick validations: every k-th file.
      std::vector<vision::ImageFolder::Sample> some;
      const std::int64_t step = folder.size() / validation_records_;
      for (std::int64_t i = 0; i < validation_records_; ++i) some.push_back(folder.samples()[static_cast<std::size_t>(i * step)]);
      folder = vision::ImageFolder::from_samples(std::move(some), folder.classes());
    }
    vision::ImageDataset validation(
        std::move(folder), vision::Compose(vision::Resize(image_size_, image_size_), vision::ToFloat{}, vision::Normalize(mean_, std_)),
        options());
    return dettrial::DataLoader(std::move(validation), {.batch_size = 500, .workers = workers_});
  }

  dettrial::Metrics train_batch(Batch& batch, ResNet& model, std::int64_t /*epoch_idx*/, std::int64_t /*batch_idx*/) {
    auto& [images, labels] = batch;
    const torch::Tensor output = model->forward(images);
    return {{"loss", torch::cross_entropy_loss(output, labels)}, {"train_accuracy", accuracy(output, labels)}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch, ResNet& model) {
    auto& [images, labels] = batch;
    const torch::Tensor output = model->forward(images);
    const torch::Tensor acc = accuracy(output, labels);
    return {{"validation_loss", torch::cross_entropy_loss(output, labels)}, {"accuracy", acc}, {"validation_error", 1.0 - acc}};
  }

 private:
  static torch::Tensor accuracy(const torch::Tensor& output, const torch::Tensor& labels) {
    return output.argmax(1).eq(labels).to(torch::kFloat).mean();
  }
  vision::ImageDatasetOptions options() const { return {.mode = mode_, .skip_unreadable = skip_unreadable_}; }

  dettrial::Context& context_;
  std::optional<vision::ImageFolder> train_folder_;
  std::filesystem::path validation_dir_;
  std::int64_t image_size_ = 32;
  vision::ImageMode mode_ = vision::ImageMode::rgb;
  std::vector<double> mean_, std_;
  bool skip_unreadable_ = false;
  std::int64_t validation_records_ = 0;
  std::optional<int> workers_;
};

}  // namespace image_folder
