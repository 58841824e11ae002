// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The precision part of a training step: the loss scaled for the backward pass, the
/// gradients unscaled before they are clipped, the step taken or skipped on an inf or NaN, and the
/// scale updated once per update batch (PyTorch's GradScaler, which mixed_precision fp16 needs);
/// autocast's dtype for the forward passes.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "../../config/precision.hpp"
#include "../../detail/linkage.hpp"
#include "../../optim/mixed_precision.hpp"

namespace dettrial::detail {

/**
 * @brief What the training step does for its precision. With fp16 it has a GradScaler of its own
 * (fp16's narrow range needs loss scaling; bf16's does not) unless the trial wraps one; without a
 * scaler every call is a plain backward pass and step.
 */
class PrecisionStep {
 public:
  PrecisionStep() = default;
  /// For `precision` on `device`: a ConfigError where this LibTorch cannot autocast so.
  PrecisionStep(Precision precision, const torch::Device& device);

  Precision precision() const { return precision_; }
  /// Autocast's dtype for this precision; none for fp32.
  std::optional<at::ScalarType> autocast_dtype() const;
  /// The scaler in use, or nullptr.
  GradScaler* scaler() const { return scaler_; }
  /// Takes the trial's scaler in place of its own (at most one: a TrialError the second time).
  GradScaler& wrap_scaler(GradScaler& scaler);

  /// Back-propagates `output` (with `gradient` when defined, else a loss) outside autocast, scaled
  /// by the scaler's scale when one is in use.
  void backward(const torch::Tensor& output, const torch::Tensor& gradient, const torch::Device& device, bool retain_graph,
                bool create_graph);
  /// Before clipping: the gradients of `params` divided by the scale (the clip sees the true ones).
  void unscale(const std::vector<torch::Tensor>& params) {
    if (scaler_) scaler_->unscale(params);
  }
  /// Steps `optimizer`, or skips the step when a gradient of `params` is inf or NaN; returns false
  /// when it knows it skipped (see GradScaler::step).
  bool step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
    if (scaler_) return scaler_->step(optimizer, params);
    optimizer.step();
    return true;
  }
  /// After a step: autocast caches low-precision copies of the weights until its region ends, and a
  /// forward pass later in the same train_batch must see the stepped weights.
  void after_step() {
    if (precision_ != Precision::fp32) at::autocast::clear_cache();
  }
  /// When an update batch ends: the scale's update, once however many optimizers stepped.
  void update() {
    if (scaler_) scaler_->update();
  }
  /// Forgets a trial's scaler (its trainer went away); the own one, if any, is in use again.
  void release() { scaler_ = own_scaler_.get(); }

 private:
  Precision precision_ = Precision::fp32;
  std::unique_ptr<GradScaler> own_scaler_;  // fp16 without a scaler of the trial's
  GradScaler* scaler_ = nullptr;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../error.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE PrecisionStep::PrecisionStep(Precision precision, const torch::Device& device) : precision_(precision) {
#if TORCH_VERSION_MAJOR < 2
  if (precision_ == Precision::fp16 && device.is_cpu())
    throw ConfigError("mixed_precision fp16 autocasts on the CPU from LibTorch 2 on; this LibTorch " TORCH_VERSION
                      " autocasts the CPU to bf16 only (use bf16)");
#else
  (void)device;
#endif
  if (precision_ == Precision::fp16) {
    own_scaler_ = std::make_unique<GradScaler>();
    own_scaler_->mark_wrapped();
    scaler_ = own_scaler_.get();
  }
}

DETTRIAL_INLINE std::optional<at::ScalarType> PrecisionStep::autocast_dtype() const {
  switch (precision_) {
    case Precision::fp32: return std::nullopt;
    case Precision::bf16: return at::kBFloat16;
    case Precision::fp16: return at::kHalf;
  }
  return std::nullopt;
}

DETTRIAL_INLINE GradScaler& PrecisionStep::wrap_scaler(GradScaler& scaler) {
  if (scaler_ && scaler_ != own_scaler_.get()) throw TrialError("wrap_scaler was called twice: a context takes one GradScaler");
  scaler.mark_wrapped();
  scaler_ = &scaler;
  return scaler;
}

DETTRIAL_INLINE void PrecisionStep::backward(const torch::Tensor& output, const torch::Tensor& gradient, const torch::Device& device,
                                             bool retain_graph, bool create_graph) {
  // Outside autocast (PyTorch's advice: backward ops run in the dtypes forward chose).
  std::optional<AutocastGuard> autocast_off;
  if (precision_ != Precision::fp32) autocast_off.emplace(device.type(), std::nullopt);
  const bool scaled = scaler_ && scaler_->enabled();
  if (!gradient.defined())  // a loss: scaled in float32, as PyTorch's GradScaler does (fp16 times 65536 overflows)
    (scaled ? scaler_->scaled(output.to(torch::kFloat)) : output).backward({}, retain_graph, create_graph);
  else output.backward(scaled ? scaler_->scaled(gradient) : gradient, retain_graph, create_graph);
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
