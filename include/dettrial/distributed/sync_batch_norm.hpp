// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Batch normalization whose statistics are the job's: in training, the mean and variance
/// of each channel over the global batch (every rank's share), as PyTorch's SyncBatchNorm computes
/// them, with the backward pass reducing its two sums across the ranks too.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "communicator.hpp"
#include "../detail/linkage.hpp"
#include "../error.hpp"
#include "../optim/running_statistics.hpp"

namespace dettrial::nn {

/**
 * @brief BatchNorm over the global batch of a data-parallel job (PyTorch's `nn.SyncBatchNorm`).
 *
 * In training, each channel's mean and (biased) variance come from every rank's batch: one
 * all-reduce of (sum, sum of squares, count) per forward, one of (sum of the gradient, sum of the
 * gradient times the centred input) per backward. So a per-slot batch of 8 on 4 ranks normalizes
 * as a batch of 32 does in one process, and the running statistics (updated with the unbiased
 * variance, as BatchNorm does) stay the same on every rank. In evaluation, or without a
 * communicator (one process), it is BatchNorm. Its parameters and buffers have BatchNorm's names,
 * so checkpoints move between the two and to Python's BatchNorm and SyncBatchNorm. Takes inputs of
 * shape (N, C, *): it serves BatchNorm1d, 2d and 3d.
 */
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl>, public optim::RunningStatistics {
 public:
  explicit SyncBatchNormImpl(torch::nn::BatchNormOptions options, Communicator* communicator = nullptr);

  void reset() override;
  void reset_parameters();
  torch::nn::BatchNormOptions& batch_norm_options() override { return options; }
  void reset_running_stats() override;
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  torch::nn::BatchNormOptions options;
  /// The job's process group; null in one process (it then normalizes as BatchNorm).
  Communicator* communicator = nullptr;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace dettrial::nn

namespace dettrial::detail {
/// Converts the tree below `module` in place (`path`: its name, for errors): see convert_sync_batchnorm.
DETTRIAL_INLINE void convert_sync_batchnorm_below(torch::nn::Module& module, const std::string& path, Communicator* communicator);
/// Whether `module` is a BatchNorm1d, 2d or 3d.
DETTRIAL_INLINE bool is_batch_norm(const torch::nn::Module& module);
}  // namespace dettrial::detail

namespace dettrial::nn {

/**
 * @brief `model` with each BatchNorm1d, 2d and 3d replaced by a
 * SyncBatchNorm over `communicator` that holds the same options, parameters and running statistics
 * (PyTorch's `SyncBatchNorm.convert_sync_batchnorm`). The other layers are shared, not copied, and
 * converted as the overload for any module converts them.
 */
DETTRIAL_INLINE torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& model, Communicator* communicator);

/**
 * @brief Any module tree converted in place, as PyTorch's `convert_sync_batchnorm` converts any
 * module (returns `model`): every SyncBatchNorm in it takes `communicator`, and each BatchNorm1d,
 * 2d and 3d that a Sequential holds (at any depth) is replaced there by a SyncBatchNorm with its
 * options, state and mode. A module that holds a BatchNorm as a member calls that member itself,
 * which no one can swap from outside: a BatchNorm anywhere else is refused (ConfigError), naming
 * its path. Declare such a member a SyncBatchNorm instead, as dettrial's ResNets do (without a
 * communicator it normalizes as BatchNorm, so nothing else changes).
 */
template <class M>
  requires(!std::same_as<M, torch::nn::Sequential>) && requires(const M& m) {
    { m.ptr() } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
  }
M convert_sync_batchnorm(M model, Communicator* communicator) {
  if (detail::is_batch_norm(*model.ptr()))
    throw ConfigError(
        "convert_sync_batchnorm: the model is a BatchNorm itself, which cannot be converted in place: make it a "
        "dettrial::nn::SyncBatchNorm");
  detail::convert_sync_batchnorm_below(*model.ptr(), "", communicator);
  return model;
}

}  // namespace dettrial::nn

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {

/// Every dimension but the channels' (1): the ones a channel's statistics are taken over.
inline std::vector<std::int64_t> non_channel_dims(const torch::Tensor& input) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

/// A per-channel vector shaped to broadcast over an (N, C, *) input.
inline torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& input) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return v.view(shape);
}

/// The autograd function of a synchronized batch norm in training. Statistics and sums are
/// accumulated in double, so the global mean and variance do not depend on how the batch is split.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input, torch::Tensor weight, torch::Tensor bias,
                               torch::Tensor running_mean, torch::Tensor running_var, double eps, double momentum,
                               std::int64_t communicator_address) {
    auto& comm = *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(communicator_address));
    const auto dims = non_channel_dims(input);
    const std::int64_t channels = input.size(1);
    const auto opts = input.options().dtype(torch::kDouble);
    std::vector<torch::Tensor> stats{
        torch::cat({input.sum(dims, false, torch::kDouble), input.square().sum(dims, false, torch::kDouble),
                    torch::full({1}, static_cast<double>(input.numel() / std::max<std::int64_t>(channels, 1)), opts)})};
    comm.allreduce(stats);
    const torch::Tensor count = stats[0].narrow(0, 2 * channels, 1);
    const torch::Tensor mean = stats[0].narrow(0, 0, channels) / count;
    const torch::Tensor var = (stats[0].narrow(0, channels, channels) / count - mean.square()).clamp_min(0);
    const torch::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.scalar_type()), momentum);
    }
    torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kDouble) : invstd;
    torch::Tensor output = (input - per_channel(mean.to(input.scalar_type()), input)) * per_channel(scale.to(input.scalar_type()), input);
    if (bias.defined()) output = output + per_channel(bias, input);
    ctx->save_for_backward({input, weight, mean, invstd, count});
    ctx->saved_data["communicator"] = communicator_address;
    ctx->saved_data["has_bias"] = bias.defined();
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3], &count = saved[4];
    const torch::Tensor& dy = grads[0];
    const auto dims = non_channel_dims(input);
    const std::int64_t channels = input.size(1);
    const torch::Tensor xmu = input - per_channel(mean.to(input.scalar_type()), input);
    const torch::Tensor sum_dy = dy.sum(dims, false, torch::kDouble);
    const torch::Tensor sum_dy_xmu = (dy * xmu).sum(dims, false, torch::kDouble);
    // The parameters' gradients are this rank's share; the trainer averages them as it does all.
    torch::Tensor grad_weight = weight.defined() ? (sum_dy_xmu * invstd).to(weight.scalar_type()) : torch::Tensor();
    torch::Tensor grad_bias = ctx->saved_data["has_bias"].toBool() ? sum_dy.to(dy.scalar_type()) : torch::Tensor();
    torch::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      auto& comm = *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(ctx->saved_data["communicator"].toInt()));
      std::vector<torch::Tensor> sums{torch::cat({sum_dy, sum_dy_xmu})};
      comm.allreduce(sums);
      const torch::Tensor mean_dy = sums[0].narrow(0, 0, channels) / count;
      const torch::Tensor mean_dy_xmu = sums[0].narrow(0, channels, channels) / count;
      const torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kDouble) : invstd;
      const auto t = input.scalar_type();
      grad_input = (dy - per_channel(mean_dy.to(t), input) - xmu * per_channel((invstd.square() * mean_dy_xmu).to(t), input)) *
                   per_channel(scale.to(t), input);
    }
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace dettrial::detail

namespace dettrial::nn {
DETTRIAL_INLINE SyncBatchNormImpl::SyncBatchNormImpl(torch::nn::BatchNormOptions options_, Communicator* communicator_)
    : options(std::move(options_)), communicator(communicator_) {
  SyncBatchNormImpl::reset();
}

DETTRIAL_INLINE void SyncBatchNormImpl::reset() {
  const std::int64_t n = options.num_features();
  weight = options.affine() ? register_parameter("weight", torch::empty({n})) : register_parameter("weight", torch::Tensor(), false);
  bias = options.affine() ? register_parameter("bias", torch::empty({n})) : register_parameter("bias", torch::Tensor(), false);
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({n}));
    running_var = register_buffer("running_var", torch::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

DETTRIAL_INLINE void SyncBatchNormImpl::reset_running_stats() {
  torch::NoGradGuard no_grad;
  if (running_mean.defined()) {
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

DETTRIAL_INLINE void SyncBatchNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  reset_running_stats();
  if (options.affine()) {
    weight.fill_(1);
    bias.zero_();
  }
}

DETTRIAL_INLINE torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm expects an input of shape (N, C, *), got ", input.dim(), " dimensions");
  // BatchNorm's momentum: the given one, or (unset) the cumulative average over the batches tracked.
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();
  }
  const bool synchronized = is_training() && communicator != nullptr && communicator->size() > 1;
  if (!synchronized)
    return torch::batch_norm(input, weight, bias, running_mean, running_var, is_training() || !running_mean.defined(), momentum,
                             options.eps(), at::globalContext().userEnabledCuDNN());
  return detail::SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, options.eps(), momentum,
                                              static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(communicator)));
}

DETTRIAL_INLINE void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dettrial::nn::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

}  // namespace dettrial::nn

namespace dettrial::detail {
/// A SyncBatchNorm over `communicator` with the options, parameters, running statistics, mode,
/// device and dtype of `module`, when it is a `BatchNormImpl`; else null.
template <class BatchNormImpl>
nn::SyncBatchNorm sync_copy(const std::shared_ptr<torch::nn::Module>& module, Communicator* communicator) {
  const auto bn = std::dynamic_pointer_cast<BatchNormImpl>(module);
  if (!bn) return nn::SyncBatchNorm(nullptr);
  nn::SyncBatchNorm sync(bn->options, communicator);
  torch::NoGradGuard no_grad;
  if (bn->options.affine()) {
    sync->weight.copy_(bn->weight);
    sync->bias.copy_(bn->bias);
    sync->weight.set_requires_grad(bn->weight.requires_grad());
    sync->bias.set_requires_grad(bn->bias.requires_grad());
  }
  if (bn->options.track_running_stats()) {
    sync->running_mean.copy_(bn->running_mean);
    sync->running_var.copy_(bn->running_var);
    sync->num_batches_tracked.copy_(bn->num_batches_tracked);
  }
  if (!bn->is_training()) sync->eval();
  if (!bn->parameters().empty()) sync->to(bn->parameters().front().device(), bn->parameters().front().scalar_type());
  return sync;
}

/// sync_copy for a BatchNorm of any dimension.
inline nn::SyncBatchNorm sync_copy_of_any(const std::shared_ptr<torch::nn::Module>& module, Communicator* communicator) {
  if (nn::SyncBatchNorm s = sync_copy<torch::nn::BatchNorm1dImpl>(module, communicator)) return s;
  if (nn::SyncBatchNorm s = sync_copy<torch::nn::BatchNorm2dImpl>(module, communicator)) return s;
  return sync_copy<torch::nn::BatchNorm3dImpl>(module, communicator);
}

DETTRIAL_INLINE bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module);
}

DETTRIAL_INLINE void convert_sync_batchnorm_below(torch::nn::Module& module, const std::string& path, Communicator* communicator) {
  // A Sequential calls its elements through its own list: a BatchNorm there is replaced in that
  // list and in its registry, under the same name.
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
    const auto names = sequential->named_children().keys();
    std::size_t i = 0;
    for (torch::nn::AnyModule& element : *sequential) {
      const std::string& name = names.at(i++);
      if (nn::SyncBatchNorm sync = sync_copy_of_any(element.ptr(), communicator)) {
        element = torch::nn::AnyModule(sync);
        sequential->replace_module(name, sync.ptr());
      }
    }
  }
  for (const auto& child : module.named_children()) {
    const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
    if (auto* sync = dynamic_cast<nn::SyncBatchNormImpl*>(child.value().get())) {
      sync->communicator = communicator;
      continue;
    }
    if (is_batch_norm(*child.value()))
      throw ConfigError("convert_sync_batchnorm: '" + child_path + "' is a " + child.value()->name() +
                        " that its module calls itself, so it cannot be swapped from outside: declare that member a "
                        "dettrial::nn::SyncBatchNorm (in one process it normalizes as BatchNorm)");
    convert_sync_batchnorm_below(*child.value(), child_path, communicator);
  }
}
}  // namespace dettrial::detail

namespace dettrial::nn {
DETTRIAL_INLINE torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& model, Communicator* communicator) {
  torch::nn::Sequential out;
  const auto names = model->named_children().keys();
  std::size_t i = 0;
  for (const auto& any : *model) {
    const std::string& name = names.at(i++);
    if (SyncBatchNorm sync = detail::sync_copy_of_any(any.ptr(), communicator)) {
      out->push_back(std::string(name), sync);
      continue;
    }
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(any.ptr().get())) sync->communicator = communicator;
    else detail::convert_sync_batchnorm_below(*any.ptr(), name, communicator);
    out->push_back(std::string(name), any);
  }
  if (!model->is_training()) out->eval();
  return out;
}

}  // namespace dettrial::nn

#endif  // DETTRIAL_HEADER_DEFINITIONS
