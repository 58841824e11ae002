// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Mixed precision (see config/precision.hpp for the setting): autocast for a device (torch.autocast's C++ side, across LibTorch
/// versions) and a gradient scaler with PyTorch's GradScaler semantics and checkpoint layout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <ATen/autocast_mode.h>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "fused.hpp"

namespace dettrial {

/**
 * @brief Autocast on `device` to `dtype` while alive, the previous state restored after (as
 * `with torch.autocast(...)`); no dtype turns autocast off inside (for a backward pass). Autocast
 * is per thread, like LibTorch's.
 */
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device, std::optional<at::ScalarType> dtype);
  /// The dtype autocast casts to on `device` now, or none when it is off: what a region recomputed
  /// later (activation checkpointing) gives this guard to run as it ran.
  static std::optional<at::ScalarType> current(torch::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
  bool nested_;
};

/**
 * @brief A gradient scaler for fp16 training with PyTorch's `torch.amp.GradScaler` semantics: the
 * loss is multiplied by the scale before the backward pass; before an optimizer step the gradients
 * are unscaled and checked, and a step with an inf or NaN gradient is skipped; after each update
 * batch the scale backs off (on inf/NaN) or grows after `growth_interval` clean steps.
 *
 * As in PyTorch, the scale, the growth count and the inf/NaN flags live in tensors on the gradients'
 * device, updated there without the host waiting. Whether a step is skipped is decided on the device
 * too where the optimizer can (dettrial::optim::FusedSGD, FusedAdam and FusedAdamW with LibTorch's
 * fused kernels, 2.4 and later): then an fp16 step needs no synchronization, and a CUDA graph can
 * capture it. Other optimizers are stepped or not by the host, which reads the flag (one
 * synchronization per step, as PyTorch's GradScaler does for them).
 *
 * Wrap it with `context.wrap_scaler(scaler)` (or let `optimizations.mixed_precision: fp16` make one):
 * then `context.backward` scales the loss, `context.step_optimizer` unscales, clips and steps (or
 * skips), and the trainer updates the scale once per update batch, as Determined's automatic mixed
 * precision does. Its state is saved in checkpoints as `scaler_state_dict`, the layout Python's
 * `GradScaler.load_state_dict` reads.
 */
class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::int64_t growth_interval = 2000;
    bool enabled = true;
  };
  GradScaler() : GradScaler(Options{}) {}
  explicit GradScaler(Options options);
  /// A copy has its own state (the tensors are cloned), as a copy of the earlier host-side scaler had.
  GradScaler(const GradScaler& other);
  GradScaler& operator=(const GradScaler& other) { return *this = GradScaler(other); }
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  bool enabled() const { return options_.enabled; }
  /// The current scale (a float32 value, as PyTorch keeps it). Reads the device: not for every batch.
  double get_scale() const { return scale_.item<float>(); }
  /// Clean steps since the scale last changed. Reads the device.
  std::int64_t growth_tracker() const { return growth_tracker_.item<std::int32_t>(); }
  /// Optimizer steps skipped because a gradient was inf or NaN, since construction or restore. Reads the device.
  std::int64_t skipped_steps() const { return static_cast<std::int64_t>(skipped_.item<float>()); }

  /// `loss` times the scale (no synchronisation). A wrapped scaler's loss is scaled by
  /// `context.backward`; scaling it here as well is a TrialError.
  torch::Tensor scale(const torch::Tensor& loss);
  /// `t` times the scale, in `t`'s dtype (for the context: a gradient given to backward).
  torch::Tensor scaled(const torch::Tensor& t);

  /// Unscales the gradients of `params` in place and records whether any is inf or NaN (on their
  /// device: no synchronisation). Once per step; `step` calls it when it was not.
  void unscale(const std::vector<torch::Tensor>& params);
  /// Steps `optimizer` unless the unscaled gradients hold an inf or NaN. An optimizer that can skip on
  /// the device (see the class) is always called and returns true: the host does not wait to know.
  /// Other optimizers: one synchronization; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params);
  /// After a step: backs off on inf/NaN, else counts a clean step and grows the scale every
  /// `growth_interval` of them (on the device). Does nothing when no step was taken since the last update.
  void update();
  /// For a trainer replaying a captured step: the replay stepped without running step() on the host.
  void note_replayed_step() { stepped_ = true; }

  /// PyTorch's `GradScaler.state_dict()`: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  c10::impl::GenericDict state_dict() const;
  /// Restores what state_dict() (or Python's GradScaler) wrote; a missing or mistyped entry is a CheckpointError.
  void load_state_dict(const c10::impl::GenericDict& state);

  /// Set by Context::wrap_scaler: the context scales losses itself.
  void mark_wrapped() { wrapped_ = true; }

 private:
  /// Moves the state to `device` (once: where the gradients are).
  void place(const torch::Device& device);

  Options options_;
  // Float32 and int32 scalars, as PyTorch's; made on the CPU and moved to the gradients' device once.
  torch::Tensor scale_;
  torch::Tensor growth_tracker_;
  torch::Tensor found_inf_;           // this step's flag, set by unscale
  torch::Tensor found_since_update_;  // the sum of every optimizer's flags since the last update (PyTorch combines them)
  torch::Tensor skipped_;             // a count
  bool unscaled_ = false;
  bool stepped_ = false;
  bool wrapped_ = false;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::detail {
// LibTorch 2.4 made autocast's switches take a device type; before, CPU and CUDA had their own.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
DETTRIAL_INLINE bool autocast_enabled(torch::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
DETTRIAL_INLINE void set_autocast_enabled(torch::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
DETTRIAL_INLINE at::ScalarType autocast_dtype(torch::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
DETTRIAL_INLINE void set_autocast_dtype(torch::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
DETTRIAL_INLINE bool autocast_enabled(torch::DeviceType d) {
  return d == torch::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
DETTRIAL_INLINE void set_autocast_enabled(torch::DeviceType d, bool on) {
  if (d == torch::kCPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
DETTRIAL_INLINE at::ScalarType autocast_dtype(torch::DeviceType d) {
  return d == torch::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
DETTRIAL_INLINE void set_autocast_dtype(torch::DeviceType d, at::ScalarType t) {
  if (d == torch::kCPU) at::autocast::set_autocast_cpu_dtype(t);
  else at::autocast::set_autocast_gpu_dtype(t);
}
#endif
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE AutocastGuard::AutocastGuard(torch::DeviceType device, std::optional<at::ScalarType> dtype)
    : device_(device),
      previous_enabled_(detail::autocast_enabled(device)),
      previous_dtype_(detail::autocast_dtype(device)),
      nested_(dtype.has_value()) {
  if (!dtype) {
    detail::set_autocast_enabled(device, false);
    return;
  }
  detail::set_autocast_dtype(device, *dtype);
  detail::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

DETTRIAL_INLINE std::optional<at::ScalarType> AutocastGuard::current(torch::DeviceType device) {
  if (!detail::autocast_enabled(device)) return std::nullopt;
  return detail::autocast_dtype(device);
}

DETTRIAL_INLINE AutocastGuard::~AutocastGuard() {
  // Casts cached for the outermost region are dropped when it ends (torch.autocast's __exit__).
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  detail::set_autocast_enabled(device_, previous_enabled_);
  detail::set_autocast_dtype(device_, previous_dtype_);
}

}  // namespace dettrial

namespace dettrial::detail {
// ATen's fused scaler kernels: on CUDA in every supported LibTorch, on the CPU from 2.4 (other
// devices may lack them, and take the host arithmetic).
DETTRIAL_INLINE bool amp_kernels_on(const torch::Tensor& t) { return t.is_cuda() || (DETTRIAL_FUSED_KERNELS && t.is_cpu()); }
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE GradScaler::GradScaler(Options options) : options_(options) {
  if (!(options_.init_scale > 0)) throw ConfigError("GradScaler: init_scale must be positive");
  if (!(options_.growth_factor > 1)) throw ConfigError("GradScaler: growth_factor must be above 1");
  if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1)) throw ConfigError("GradScaler: backoff_factor must be in (0, 1)");
  if (options_.growth_interval < 1) throw ConfigError("GradScaler: growth_interval must be at least 1");
  const auto f = torch::TensorOptions().dtype(torch::kFloat);
  scale_ = torch::full({}, options_.init_scale, f);  // rounded to float32, as PyTorch keeps it
  growth_tracker_ = torch::zeros({}, f.dtype(torch::kInt));
  found_inf_ = torch::zeros({}, f);
  found_since_update_ = torch::zeros({}, f);
  skipped_ = torch::zeros({}, f);
}

DETTRIAL_INLINE GradScaler::GradScaler(const GradScaler& other)
    : options_(other.options_),
      scale_(other.scale_.clone()),
      growth_tracker_(other.growth_tracker_.clone()),
      found_inf_(other.found_inf_.clone()),
      found_since_update_(other.found_since_update_.clone()),
      skipped_(other.skipped_.clone()),
      unscaled_(other.unscaled_),
      stepped_(other.stepped_),
      wrapped_(other.wrapped_) {}

DETTRIAL_INLINE void GradScaler::place(const torch::Device& device) {
  if (scale_.device() == device) return;
  for (torch::Tensor* t : {&scale_, &growth_tracker_, &found_inf_, &found_since_update_, &skipped_}) *t = t->to(device);
}

DETTRIAL_INLINE torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (wrapped_)
    throw TrialError(
        "this GradScaler is wrapped with context.wrap_scaler: context.backward scales the loss itself; "
        "pass the loss unscaled");
  // In float32 (PyTorch multiplies by a float32 tensor): an fp16 loss times 65536 would overflow.
  return options_.enabled ? scaled(loss.to(torch::kFloat)) : loss;
}

DETTRIAL_INLINE torch::Tensor GradScaler::scaled(const torch::Tensor& t) {
  if (!options_.enabled) return t;
  place(t.device());
  return t * scale_;
}

DETTRIAL_INLINE void GradScaler::unscale(const std::vector<torch::Tensor>& params) {
  if (!options_.enabled || unscaled_) return;
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  unscaled_ = true;
  found_inf_.zero_();
  if (grads.empty()) return;
  place(grads.front().device());
  // The reciprocal in double, then float32, as PyTorch computes inv_scale.
  const torch::Tensor inverse = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  if (detail::amp_kernels_on(found_inf_)) {
    // The kernel takes the gradients of one device (and is fastest per dtype, as PyTorch groups them).
    std::vector<std::pair<torch::ScalarType, std::vector<torch::Tensor>>> by_dtype;
    std::vector<torch::Tensor> elsewhere;
    for (torch::Tensor& g : grads) {
      if (g.device() != found_inf_.device() || g.is_sparse()) {
        elsewhere.push_back(g);
        continue;
      }
      auto it = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const auto& b) { return b.first == g.scalar_type(); });
      if (it == by_dtype.end()) by_dtype.push_back({g.scalar_type(), {g}});
      else it->second.push_back(g);
    }
    for (auto& [dtype, same] : by_dtype) at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf_, inverse);
    grads = std::move(elsewhere);
    if (grads.empty()) return;
  }
  // Without the kernel (older LibTorch on the CPU, other devices), or gradients on another device
  // than the first: tensor operations, the flag gathered where it lives.
  const torch::Tensor inverse_here = inverse.cpu();
  const double inv = inverse_here.item<float>();
  for (torch::Tensor& g : grads) {
    found_inf_.logical_or_(torch::isfinite(g).all().logical_not().to(found_inf_.device()));
    g.mul_(inv);
  }
}

DETTRIAL_INLINE bool GradScaler::step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  unscale(params);
  unscaled_ = false;
  stepped_ = true;
  found_since_update_.add_(found_inf_);
  skipped_.add_(found_inf_);
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer); capturable && capturable->step_unless_found_inf(found_inf_))
    return true;
  if (found_inf_.item<float>() != 0) return false;
  optimizer.step();
  return true;
}

DETTRIAL_INLINE void GradScaler::update() {
  if (!options_.enabled || !stepped_) return;
  stepped_ = false;
  if (detail::amp_kernels_on(scale_)) {
    // PyTorch's update: the scale stays float32, and one that would leave its range stays as it is.
    at::_amp_update_scale_(scale_, growth_tracker_, found_since_update_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  } else {
    // The same arithmetic on the host (older LibTorch on the CPU, where reading a value costs no wait).
    double scale = scale_.item<float>();
    std::int64_t tracker = growth_tracker_.item<std::int32_t>();
    if (found_since_update_.item<float>() != 0) {
      scale = static_cast<float>(scale * options_.backoff_factor);
      tracker = 0;
    } else if (++tracker == options_.growth_interval) {
      const double grown = scale * options_.growth_factor;
      if (grown <= std::numeric_limits<float>::max()) scale = static_cast<float>(grown);
      tracker = 0;
    }
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
  }
  found_since_update_.zero_();
}

DETTRIAL_INLINE c10::impl::GenericDict GradScaler::state_dict() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled) return d;  // PyTorch's disabled scaler saves nothing
  d.insert("scale", get_scale());
  d.insert("growth_factor", options_.growth_factor);
  d.insert("backoff_factor", options_.backoff_factor);
  d.insert("growth_interval", options_.growth_interval);
  d.insert("_growth_tracker", growth_tracker());
  return d;
}

DETTRIAL_INLINE void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  if (!options_.enabled) return;
  if (state.empty()) throw CheckpointError("the checkpoint's scaler_state_dict is empty: it was saved by a disabled GradScaler");
  const auto number = [&](const char* key) {
    const auto it = state.find(key);
    if (it == state.end() || !(it->value().isDouble() || it->value().isInt()))
      throw CheckpointError(std::string("the checkpoint's scaler_state_dict lacks a number '") + key + "'");
    return it->value().isDouble() ? it->value().toDouble() : static_cast<double>(it->value().toInt());
  };
  const double scale = number("scale");
  options_.growth_factor = number("growth_factor");
  options_.backoff_factor = number("backoff_factor");
  options_.growth_interval = static_cast<std::int64_t>(number("growth_interval"));
  const double tracker = number("_growth_tracker");
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  found_since_update_.zero_();
  skipped_.zero_();
  stepped_ = unscaled_ = false;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
