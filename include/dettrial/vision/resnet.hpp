// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief torchvision's ResNets in LibTorch: ResNet-18, 34, 50, 101 and 152, ResNeXt-50 32x4d and
/// Wide ResNet-50-2, built as torchvision builds them, so `state_dict()` names and shapes are
/// torchvision's and a file Python saved from one loads with `dettrial::load_weights` (strict).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "../distributed/sync_batch_norm.hpp"
#include "../error.hpp"
#include "../nn/rebuilt_clone.hpp"

namespace dettrial::vision::models {

/// torchvision's `ResNet(...)` arguments beyond the block and the layer counts.
struct ResNetOptions {
  /// The classifier's outputs (`fc`).
  std::int64_t num_classes = 1000;
  /// Each residual branch's last BatchNorm starts at zero, so each block starts as the identity
  /// (torchvision's `zero_init_residual`, from "Bag of Tricks", +0.2-0.3% top-1 in its recipe).
  bool zero_init_residual = false;
  /// Grouped 3x3 convolutions (ResNeXt's cardinality; BasicBlock takes only 1).
  std::int64_t groups = 1;
  /// The bottleneck width for 64 planes (ResNeXt's 4, Wide ResNet's 128; BasicBlock takes only 64).
  std::int64_t width_per_group = 64;
  /// Dilation in place of the stride in layer2, layer3, layer4 (torchvision's
  /// `replace_stride_with_dilation`, for dense prediction; Bottleneck networks only).
  std::array<bool, 3> replace_stride_with_dilation{false, false, false};
};

/// ResNet-18's and 34's block: two 3x3 convolutions (`conv1`, `bn1`, `conv2`, `bn2`, `downsample`).
class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr std::int64_t expansion = 1;
  /// torchvision's `BasicBlock(inplanes, planes, stride, downsample, groups, base_width, dilation)`;
  /// `downsample` may be empty.
  BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride, torch::nn::Sequential downsample, std::int64_t groups,
                 std::int64_t base_width, std::int64_t dilation);
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes included (nn::rebuilt_clone: built again from its arguments).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  /// BatchNorm2d's state and arithmetic (see ResNetImpl's norm layers).
  nn::SyncBatchNorm bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};

 private:
  std::int64_t inplanes_, planes_, stride_, groups_, base_width_, dilation_;
};
TORCH_MODULE(BasicBlock);

/// ResNet-50's and deeper networks' block: 1x1, 3x3 (strided, grouped), 1x1 with 4x the planes
/// (`conv1`..`conv3`, `bn1`..`bn3`, `downsample`), the stride on the 3x3 as torchvision's V1.5.
class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr std::int64_t expansion = 4;
  /// torchvision's `Bottleneck(inplanes, planes, stride, downsample, groups, base_width, dilation)`.
  BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride, torch::nn::Sequential downsample, std::int64_t groups,
                 std::int64_t base_width, std::int64_t dilation);
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes included (nn::rebuilt_clone: built again from its arguments).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::SyncBatchNorm bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};

 private:
  std::int64_t inplanes_, planes_, stride_, groups_, base_width_, dilation_;
};
TORCH_MODULE(Bottleneck);

/// Which block a ResNet stacks.
enum class ResNetBlock { basic, bottleneck };

/**
 * @brief torchvision's `ResNet`: `conv1`, `bn1`, `maxpool`, `layer1`..`layer4` (Sequentials of
 * blocks), `avgpool`, `fc`; the same module tree, parameter and buffer names, shapes and
 * initialisation (Kaiming normal, fan out, for every convolution; BatchNorm at 1 and 0; the Linear
 * layer's default), module by module in torchvision's order, so a network built after
 * `torch::manual_seed(s)` holds the weights torchvision's does after `torch.manual_seed(s)` on the
 * same LibTorch release. Takes N x 3 x H x W images (any H, W of at least 32); returns N x num_classes logits.
 * Its norm layers are dettrial::nn::SyncBatchNorm: BatchNorm2d's names, state and arithmetic in one
 * process, and the job's statistics once `nn::convert_sync_batchnorm(model, context.communicator())`
 * gives them the communicator (a BatchNorm2d member could not be swapped from outside).
 * @code{.cpp}
 * auto model = dettrial::vision::models::resnet50({.num_classes = 1000});
 * dettrial::load_weights(model, "resnet50.pt");  // torch.save(torchvision.models.resnet50().state_dict(), ...)
 * @endcode
 */
class ResNetImpl : public torch::nn::Module {
 public:
  /// `layers`: the blocks in layer1..layer4 (ResNet-50: {3, 4, 6, 3}).
  ResNetImpl(ResNetBlock block, std::array<std::int64_t, 4> layers, ResNetOptions options = {});
  torch::Tensor forward(torch::Tensor x);
  /// A deep copy, modes and a replaced classifier included (an EMA's copy: optim::AveragedModel).
  /// Built again from its arguments (nn::rebuilt_clone), drawing nothing from the random stream.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;

  torch::nn::Conv2d conv1{nullptr};
  nn::SyncBatchNorm bn1{nullptr};
  torch::nn::MaxPool2d maxpool{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};
  /// The classifier; replace it to fine-tune on other classes (`replace_module("fc", ...)`).
  torch::nn::Linear fc{nullptr};

 private:
  torch::nn::Sequential make_layer(std::int64_t planes, std::int64_t blocks, std::int64_t stride, bool dilate);
  void initialise(bool zero_init_residual);
  /// The block's output channels over its `planes`: 1 for BasicBlock, 4 for Bottleneck.
  std::int64_t expansion() const { return block_ == ResNetBlock::basic ? BasicBlockImpl::expansion : BottleneckImpl::expansion; }

  ResNetBlock block_;
  std::array<std::int64_t, 4> layers_;
  ResNetOptions options_;
  std::int64_t inplanes_ = 64;
  std::int64_t dilation_ = 1;
  std::int64_t groups_;
  std::int64_t base_width_;
};
TORCH_MODULE(ResNet);

/// torchvision's builders, by its names (each takes the options but the block and layer counts).
DETTRIAL_INLINE ResNet resnet18(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet34(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet50(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet101(ResNetOptions options = {});
DETTRIAL_INLINE ResNet resnet152(ResNetOptions options = {});
/// ResNet-50 with 32 groups of width 4 (its `groups` and `width_per_group` are set).
DETTRIAL_INLINE ResNet resnext50_32x4d(ResNetOptions options = {});
/// ResNet-50 with bottlenecks twice as wide (its `width_per_group` is set to 128).
DETTRIAL_INLINE ResNet wide_resnet50_2(ResNetOptions options = {});

/// The architectures `resnet(name)` builds, in torchvision's names.
DETTRIAL_INLINE const std::vector<std::string>& resnet_architectures();
/// The network torchvision's `models.__dict__[name](...)` builds (the porting guide's `arch`
/// hyperparameter); throws ConfigError naming the architectures it knows for any other name.
DETTRIAL_INLINE ResNet resnet(const std::string& name, ResNetOptions options = {});

}  // namespace dettrial::vision::models

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

/// torchvision's `conv3x3`: padding as the dilation, no bias.
inline torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t groups, std::int64_t dilation) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(dilation).groups(groups).bias(false).dilation(dilation));
}

/// torchvision's `conv1x1`: no bias.
inline torch::nn::Conv2d conv1x1(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

/// torchvision's default `norm_layer`, nn.BatchNorm2d(planes): as a SyncBatchNorm without a
/// communicator, which normalizes as BatchNorm2d until convert_sync_batchnorm gives it one.
inline nn::SyncBatchNorm norm2d(std::int64_t planes) { return nn::SyncBatchNorm(torch::nn::BatchNormOptions(planes)); }

/// The block's downsample, deeply copied (or none).
inline torch::nn::Sequential cloned_downsample(const torch::nn::Sequential& downsample) {
  if (!downsample) return torch::nn::Sequential(nullptr);
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(downsample->clone()));
}

}  // namespace dettrial::detail

namespace dettrial::vision::models {

DETTRIAL_INLINE BasicBlockImpl::BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                               torch::nn::Sequential downsample, std::int64_t groups, std::int64_t base_width,
                                               std::int64_t dilation)
    : inplanes_(inplanes), planes_(planes), stride_(stride), groups_(groups), base_width_(base_width), dilation_(dilation) {
  if (groups != 1 || base_width != 64)
    throw ConfigError("vision::models: BasicBlock only supports groups 1 and width_per_group 64 (got " + std::to_string(groups) + " and " +
                      std::to_string(base_width) + "), as torchvision's; use a Bottleneck network (resnet50 and deeper)");
  if (dilation > 1)
    throw ConfigError("vision::models: BasicBlock does not support dilation (replace_stride_with_dilation), as torchvision's does not");
  // Registered in torchvision's attribute order: the order of the module tree and of the initialisation.
  conv1 = register_module("conv1", detail::conv3x3(inplanes, planes, stride, 1, 1));
  bn1 = register_module("bn1", detail::norm2d(planes));
  conv2 = register_module("conv2", detail::conv3x3(planes, planes, 1, 1, 1));
  bn2 = register_module("bn2", detail::norm2d(planes));
  if (downsample) this->downsample = register_module("downsample", std::move(downsample));
}

DETTRIAL_INLINE torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1(conv1(x)));
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

DETTRIAL_INLINE BottleneckImpl::BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                               torch::nn::Sequential downsample, std::int64_t groups, std::int64_t base_width,
                                               std::int64_t dilation)
    : inplanes_(inplanes), planes_(planes), stride_(stride), groups_(groups), base_width_(base_width), dilation_(dilation) {
  // torchvision's int(planes * (base_width / 64.0)) * groups.
  const auto width = static_cast<std::int64_t>(static_cast<double>(planes) * (static_cast<double>(base_width) / 64.0)) * groups;
  conv1 = register_module("conv1", detail::conv1x1(inplanes, width, 1));
  bn1 = register_module("bn1", detail::norm2d(width));
  conv2 = register_module("conv2", detail::conv3x3(width, width, stride, groups, dilation));
  bn2 = register_module("bn2", detail::norm2d(width));
  conv3 = register_module("conv3", detail::conv1x1(width, planes * expansion, 1));
  bn3 = register_module("bn3", detail::norm2d(planes * expansion));
  if (downsample) this->downsample = register_module("downsample", std::move(downsample));
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> BasicBlockImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        return std::make_shared<BasicBlockImpl>(inplanes_, planes_, stride_, detail::cloned_downsample(downsample), groups_, base_width_,
                                                dilation_);
      },
      device);
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> BottleneckImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        return std::make_shared<BottleneckImpl>(inplanes_, planes_, stride_, detail::cloned_downsample(downsample), groups_, base_width_,
                                                dilation_);
      },
      device);
}

DETTRIAL_INLINE torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1(conv1(x)));
  out = torch::relu(bn2(conv2(out)));
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

DETTRIAL_INLINE ResNetImpl::ResNetImpl(ResNetBlock block, std::array<std::int64_t, 4> layers, ResNetOptions options)
    : block_(block), layers_(layers), options_(options), groups_(options.groups), base_width_(options.width_per_group) {
  for (const std::int64_t blocks : layers)
    if (blocks < 1)
      throw ConfigError("vision::models: every layer of a ResNet needs at least one block (got " + std::to_string(blocks) + ")");
  if (options.num_classes < 1)
    throw ConfigError("vision::models: num_classes must be at least 1 (got " + std::to_string(options.num_classes) + ")");
  if (groups_ < 1 || base_width_ < 1)
    throw ConfigError("vision::models: groups and width_per_group must be at least 1 (got " + std::to_string(groups_) + " and " +
                      std::to_string(base_width_) + ")");
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, inplanes_, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", detail::norm2d(inplanes_));
  maxpool = register_module("maxpool", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  layer1 = register_module("layer1", make_layer(64, layers[0], 1, false));
  layer2 = register_module("layer2", make_layer(128, layers[1], 2, options.replace_stride_with_dilation[0]));
  layer3 = register_module("layer3", make_layer(256, layers[2], 2, options.replace_stride_with_dilation[1]));
  layer4 = register_module("layer4", make_layer(512, layers[3], 2, options.replace_stride_with_dilation[2]));
  avgpool = register_module("avgpool", torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({1, 1})));
  fc = register_module("fc", torch::nn::Linear(512 * expansion(), options.num_classes));
  initialise(options.zero_init_residual);
}

DETTRIAL_INLINE torch::nn::Sequential ResNetImpl::make_layer(std::int64_t planes, std::int64_t blocks, std::int64_t stride, bool dilate) {
  const std::int64_t expansion = this->expansion();
  const std::int64_t previous_dilation = dilation_;
  if (dilate) {
    dilation_ *= stride;
    stride = 1;
  }
  // As torchvision: the shortcut's layers are made before the block's (the order the random
  // initialisation of the modules draws in).
  torch::nn::Sequential downsample{nullptr};
  if (stride != 1 || inplanes_ != planes * expansion)
    downsample = torch::nn::Sequential(detail::conv1x1(inplanes_, planes * expansion, stride), detail::norm2d(planes * expansion));
  torch::nn::Sequential layer;
  auto add = [&](std::int64_t block_stride, torch::nn::Sequential block_downsample, std::int64_t dilation) {
    if (block_ == ResNetBlock::basic)
      layer->push_back(BasicBlock(inplanes_, planes, block_stride, std::move(block_downsample), groups_, base_width_, dilation));
    else layer->push_back(Bottleneck(inplanes_, planes, block_stride, std::move(block_downsample), groups_, base_width_, dilation));
  };
  add(stride, std::move(downsample), previous_dilation);
  inplanes_ = planes * expansion;
  for (std::int64_t i = 1; i < blocks; ++i) add(1, torch::nn::Sequential(nullptr), dilation_);
  return layer;
}

DETTRIAL_INLINE void ResNetImpl::initialise(bool zero_init_residual) {
  torch::NoGradGuard no_grad;
  // torchvision's loop over self.modules(): the same modules in the same order (pre-order, as registered).
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* norm = module->as<nn::SyncBatchNorm>()) {
      torch::nn::init::constant_(norm->weight, 1);
      torch::nn::init::constant_(norm->bias, 0);
    }
  }
  if (!zero_init_residual) return;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* bottleneck = module->as<BottleneckImpl>()) torch::nn::init::constant_(bottleneck->bn3->weight, 0);
    if (auto* basic = module->as<BasicBlockImpl>()) torch::nn::init::constant_(basic->bn2->weight, 0);
  }
}

DETTRIAL_INLINE std::shared_ptr<torch::nn::Module> ResNetImpl::clone(const c10::optional<torch::Device>& device) const {
  return nn::rebuilt_clone(
      *this,
      [&] {
        auto copy = std::make_shared<ResNetImpl>(block_, layers_, options_);
        // The classifier as it is now: fine-tuning replaces it (`replace_module("fc", ...)`).
        copy->fc = copy->replace_module("fc", std::dynamic_pointer_cast<torch::nn::LinearImpl>(fc->clone()));
        return copy;
      },
      device);
}

DETTRIAL_INLINE torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = maxpool(torch::relu(bn1(conv1(x))));
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  return fc(torch::flatten(avgpool(x), 1));
}

DETTRIAL_INLINE ResNet resnet18(ResNetOptions options) {
  return ResNet(ResNetBlock::basic, std::array<std::int64_t, 4>{2, 2, 2, 2}, options);
}
DETTRIAL_INLINE ResNet resnet34(ResNetOptions options) {
  return ResNet(ResNetBlock::basic, std::array<std::int64_t, 4>{3, 4, 6, 3}, options);
}
DETTRIAL_INLINE ResNet resnet50(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 4, 6, 3}, options);
}
DETTRIAL_INLINE ResNet resnet101(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 4, 23, 3}, options);
}
DETTRIAL_INLINE ResNet resnet152(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, std::array<std::int64_t, 4>{3, 8, 36, 3}, options);
}
DETTRIAL_INLINE ResNet resnext50_32x4d(ResNetOptions options) {
  options.groups = 32;
  options.width_per_group = 4;
  return resnet50(options);
}
DETTRIAL_INLINE ResNet wide_resnet50_2(ResNetOptions options) {
  options.width_per_group = 64 * 2;
  return resnet50(options);
}

DETTRIAL_INLINE const std::vector<std::string>& resnet_architectures() {
  static const std::vector<std::string> names{"resnet18",  "resnet34",        "resnet50",       "resnet101",
                                              "resnet152", "resnext50_32x4d", "wide_resnet50_2"};
  return names;
}

DETTRIAL_INLINE ResNet resnet(const std::string& name, ResNetOptions options) {
  if (name == "resnet18") return resnet18(options);
  if (name == "resnet34") return resnet34(options);
  if (name == "resnet50") return resnet50(options);
  if (name == "resnet101") return resnet101(options);
  if (name == "resnet152") return resnet152(options);
  if (name == "resnext50_32x4d") return resnext50_32x4d(options);
  if (name == "wide_resnet50_2") return wide_resnet50_2(options);
  std::string known;
  for (const auto& n : resnet_architectures()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("vision::models: no architecture named '" + name + "' (dettrial builds " + known + ")");
}

}  // namespace dettrial::vision::models

#endif  // DETTRIAL_HEADER_DEFINITIONS
