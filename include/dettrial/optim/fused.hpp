// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Optimizers whose step a CUDA graph can capture: SGD, Adam and AdamW with their learning
/// rates (and Adam's step counts) in device tensors, stepped by ATen's fused kernels.
///
/// LibTorch's own optimizers read the learning rate and compute Adam's bias corrections on the host,
/// so a replayed graph would train at the learning rate of the captured batch forever. These keep
/// LibTorch's options, state and serialization (a checkpoint of FusedSGD loads into torch::optim::SGD
/// and back), and write a group's learning rate into its device tensor only between steps, when a
/// scheduler changed it.
///
/// On LibTorch 2.4 and later the step is ATen's `_fused_sgd_` / `_fused_adam_` / `_fused_adamw_`
/// with a tensor learning rate (CPU and CUDA). Older LibTorch (Debian's 1.13) has no such kernels on
/// the CPU and none taking a tensor learning rate; there the same arithmetic runs as tensor operations,
/// which a graph captures as well.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "handles.hpp"
#include "../detail/linkage.hpp"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DETTRIAL_FUSED_KERNELS 1
#else
#define DETTRIAL_FUSED_KERNELS 0
#endif

namespace dettrial::optim {

/**
 * @brief What a trainer needs of an optimizer whose step a CUDA graph captures: the learning rates
 * live in device tensors, which `sync_learning_rates` updates from the param groups' options between
 * steps (a graph's replay runs no host code), and any device-side state can be brought to the host
 * for a checkpoint and back after one is loaded.
 */
class CapturableOptimizer {
 public:
  CapturableOptimizer() = default;
  CapturableOptimizer(CapturableOptimizer&&) = default;
  CapturableOptimizer& operator=(CapturableOptimizer&&) = default;
  virtual ~CapturableOptimizer() = default;

  /// Writes each group's learning rate into its device tensor where the host value changed since the
  /// last write (one small fill on the device, no synchronization). The optimizer's own step does it
  /// when it is not being captured; a trainer replaying a graph does it before each replay.
  void sync_learning_rates(std::vector<torch::optim::OptimizerParamGroup>& groups) {
    for (std::size_t g = 0; g < groups.size() && g < rates_.size(); ++g)
      if (rates_[g].tensor.defined()) rates_[g].write(groups[g].options().get_lr());
  }
  /// While true, a step writes nothing from the host (the trainer sets it around a capture).
  void set_capturing(bool capturing) { capturing_ = capturing; }
  /// Copies device-side state (Adam's step counts) into LibTorch's parameter state, for a checkpoint.
  virtual void pull_host_state() {}
  /// After a checkpoint was loaded into LibTorch's parameter state: rebuilds the device-side state.
  virtual void push_device_state() {}
  /**
   * @brief For a gradient scaler: steps unless `found_inf` (a float32 scalar on the parameters' device)
   * is nonzero, decided on the device, and returns true; returns false, without stepping, where this
   * optimizer cannot decide there (then the caller reads the flag and calls step() or not).
   */
  virtual bool step_unless_found_inf(const torch::Tensor& found_inf) {
    (void)found_inf;
    return false;
  }
  /// Whether its state is whole, so a capture makes none (state first made inside a graph would be
  /// made again on every replay). A trainer warms up until it is.
  virtual bool ready_for_capture() const { return true; }

 protected:
  /// Group `g`'s learning rate as a float scalar tensor on `like`'s device (made on first use).
  const torch::Tensor& device_lr(std::size_t g, double lr, const torch::Tensor& like) {
    if (rates_.size() <= g) rates_.resize(g + 1);
    Rate& r = rates_[g];
    if (!r.tensor.defined() || r.tensor.device() != like.device()) {
      if (capturing_) throw_new_state("parameter group " + std::to_string(g) + "'s learning rate");
      r.tensor = device_scalar(lr, like);
      r.written = lr;
    } else if (!capturing_) {
      r.write(lr);
    }
    return r.tensor;
  }
  bool capturing() const { return capturing_; }
  /// State made while capturing would be made again (zeroed, or set to the captured learning rate)
  /// on every replay: a parameter that had no gradient in the warm-up batches must not step first
  /// inside the graph.
  [[noreturn]] static void throw_new_state(const std::string& what) {
    throw TrialError(what +
                     " would be first made inside the CUDA graph (so reset on every replay): a parameter had no "
                     "gradient in any warm-up batch; raise capture_warmup_batches, or keep such parameters out of the optimizer");
  }
  /// The closure's loss (with gradients on), or an undefined tensor without one.
  template <class Closure>
  static torch::Tensor evaluate(Closure& closure) {
    if (!closure) return {};
    at::AutoGradMode enable_grad(true);
    return closure();
  }
  /// The parameters that have a gradient, in order.
  static std::vector<torch::Tensor> with_grad(const std::vector<torch::Tensor>& params) {
    std::vector<torch::Tensor> out;
    out.reserve(params.size());
    for (const auto& p : params)
      if (p.grad().defined()) out.push_back(p);
    return out;
  }
  /// A learning rate or step count as the fused kernels read it: a float scalar on `like`'s device.
  static torch::Tensor device_scalar(double value, const torch::Tensor& like) {
    return torch::full({}, value, torch::TensorOptions().dtype(torch::kFloat).device(like.device()));
  }

 private:
  struct Rate {
    torch::Tensor tensor{};
    double written = 0;
    /// Writes `lr` on the device when it differs from what was written last.
    void write(double lr) {
      if (written == lr) return;
      tensor.fill_(lr);
      written = lr;
    }
  };
  std::vector<Rate> rates_;
  bool capturing_ = false;
};

}  // namespace dettrial::optim

namespace dettrial::detail {

/// What a captured step keeps of a param group besides its learning rate: its parameters and the
/// options the kernels take as host values (momentum, dampening, weight decay, Nesterov, betas, eps,
/// amsgrad), to see when they change after a capture.
inline std::vector<double> captured_group_state(const torch::optim::OptimizerParamGroup& group) {
  std::vector<double> out;
  for (const auto& p : group.params()) out.push_back(static_cast<double>(reinterpret_cast<std::uintptr_t>(p.unsafeGetTensorImpl())));
  const auto& o = group.options();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o))
    out.insert(out.end(), {sgd->momentum(), sgd->dampening(), sgd->weight_decay(), double(sgd->nesterov())});
  else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&o))
    out.insert(out.end(),
               {std::get<0>(adam->betas()), std::get<1>(adam->betas()), adam->eps(), adam->weight_decay(), double(adam->amsgrad())});
  else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&o))
    out.insert(out.end(),
               {std::get<0>(adamw->betas()), std::get<1>(adamw->betas()), adamw->eps(), adamw->weight_decay(), double(adamw->amsgrad())});
  return out;
}

/// The parameters of one group that have gradients, split by (device, dtype) as fused kernels need.
struct FusedBucket {
  std::vector<torch::Tensor> params, grads, first, second, third, steps;
};

template <class Fn>
void for_each_bucket(const std::vector<torch::Tensor>& params, Fn&& fn) {
  // Usually one bucket: a model on one device in one dtype. Mixed groups are split, in order.
  std::vector<std::pair<std::pair<torch::Device, torch::ScalarType>, std::vector<std::size_t>>> buckets;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto key = std::pair(params[i].device(), params[i].scalar_type());
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const auto& b) { return b.first == key; });
    if (it == buckets.end()) buckets.push_back({key, {i}});
    else it->second.push_back(i);
  }
  for (const auto& b : buckets) fn(b.second);
}

}  // namespace dettrial::detail

namespace dettrial::optim {

/**
 * @brief SGD (LibTorch's options and state: momentum, dampening, weight decay, Nesterov) whose step
 * reads the learning rate from a device tensor, so that a CUDA graph can capture it.
 * @code{.cpp}
 * dettrial::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.03).momentum(0.9));
 * @endcode
 */
class FusedSGD : public torch::optim::SGD, public CapturableOptimizer {
 public:
  using torch::optim::SGD::SGD;
  // Movable as before: the declared destructor below would remove the implicit moves.
  FusedSGD(FusedSGD&&) = default;
  FusedSGD& operator=(FusedSGD&&) = default;
  // Out of line (compiled once in separate compilation), as a trial that holds one ends it.
  DETTRIAL_INLINE ~FusedSGD() override;

  /// With the fused kernel (LibTorch 2.4+, CUDA), once every momentum buffer exists: a new buffer is
  /// a copy of the first gradient, which a skipped first step must not leave behind.
  bool step_unless_found_inf(const torch::Tensor& found_inf) override;
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// False while a gradient scaler has skipped every step since a parameter needed its first
  /// momentum buffer (with an fp16 scaler the first steps often overflow).
  bool ready_for_capture() const override { return !buffers_pending_; }

 private:
  /// The step; with `found_inf`, the kernel skips it on the device when the flag is set.
  torch::Tensor step_with(LossClosure closure, const std::optional<torch::Tensor>& found_inf);
  void run_buckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& bufs, const torch::optim::SGDOptions& o,
                   const torch::Tensor& lr, bool first, const std::optional<torch::Tensor>& found_inf);
  bool has_buffer(const torch::Tensor& p);
  torch::Tensor buffer(const torch::Tensor& p, bool fresh);
  /// LibTorch's SGD arithmetic with the learning rate read from `lr`; `first`: the buffers are new.
  /// On a GPU, ATen's fused kernel (one launch for all); elsewhere LibTorch's own operations, one
  /// parameter at a time, which give LibTorch's SGD's results to the bit.
  static void run(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& bufs,
                  const torch::optim::SGDOptions& o, const torch::Tensor& lr, bool first, const std::optional<torch::Tensor>& found_inf);

  bool buffers_pending_ = false;
};

}  // namespace dettrial::optim

namespace dettrial::detail {

/// Adam and AdamW: LibTorch's options and state, with each parameter's step count also kept as a
/// float tensor on its device (what the fused kernels read and increment), mirrored into LibTorch's
/// `step` for checkpoints by pull_host_state.
template <class Base, class Options, class State, bool Decoupled>
class FusedAdamBase : public Base, public optim::CapturableOptimizer {
 public:
  using Base::Base;

  /// With the fused kernels (LibTorch 2.4+, CPU and CUDA): a skipped step leaves the moments as they
  /// were and takes back its increment of the step counts.
  bool step_unless_found_inf(const torch::Tensor& found_inf) override {
#if DETTRIAL_FUSED_KERNELS
    for (auto& group : this->param_groups())
      for (const auto& p : group.params())
        if (p.grad().defined() && p.device() != found_inf.device()) return false;
    step_with(nullptr, found_inf);
    return true;
#else
    return CapturableOptimizer::step_unless_found_inf(found_inf);
#endif
  }

  torch::Tensor step(typename Base::LossClosure closure = nullptr) override { return step_with(closure, std::nullopt); }

  void pull_host_state() override {
    if (steps_.empty()) return;
    // One read of the device for all step counts (a checkpoint's only synchronization here).
    std::vector<torch::Tensor> counts;
    counts.reserve(steps_.size());
    const torch::Device device = steps_.begin()->second.device();
    for (const auto& entry : steps_) counts.push_back(entry.second.to(device));
    const torch::Tensor host = torch::stack(counts).to(torch::kCPU, torch::kDouble).contiguous();
    const double* value = host.data_ptr<double>();
    for (const auto& entry : steps_) {
      auto it = this->state().find(entry.first);
      if (it != this->state().end()) static_cast<State&>(*it->second).step(static_cast<std::int64_t>(*value));
      ++value;
    }
  }
  void push_device_state() override {
    steps_.clear();
    for (auto& group : this->param_groups())
      for (const auto& p : group.params()) {
        auto it = this->state().find(key(p));
        if (it != this->state().end()) steps_[key(p)] = device_scalar(static_cast<double>(static_cast<State&>(*it->second).step()), p);
      }
  }

 private:
  /// The step; with `found_inf`, the kernels skip it on the device when the flag is set.
  torch::Tensor step_with(typename Base::LossClosure closure, const std::optional<torch::Tensor>& found_inf) {
    torch::NoGradGuard no_grad;
    torch::Tensor loss = evaluate(closure);
    for (std::size_t g = 0; g < this->param_groups().size(); ++g) {
      auto& group = this->param_groups()[g];
      const auto& o = static_cast<const Options&>(group.options());
      const std::vector<torch::Tensor> params = with_grad(group.params());
      if (params.empty()) continue;
      const torch::Tensor& lr = device_lr(g, o.lr(), params.front());
      for_each_bucket(params, [&](const std::vector<std::size_t>& idx) {
        FusedBucket b;
        for (auto i : idx) {
          const torch::Tensor& p = params[i];
          State& s = state_of(p, o);
          b.params.push_back(p);
          b.grads.push_back(p.grad());
          b.first.push_back(s.exp_avg());
          b.second.push_back(s.exp_avg_sq());
          if (o.amsgrad()) b.third.push_back(s.max_exp_avg_sq());
          b.steps.push_back(steps_.at(key(p)));
        }
        run(b, o, lr, found_inf);
      });
    }
    return loss;
  }

  using Key = typename std::decay_t<decltype(std::declval<Base&>().state())>::key_type;
  static Key key(const torch::Tensor& p) { return detail::optimizer_state_key<std::decay_t<decltype(std::declval<Base&>().state())>>(p); }

  State& state_of(const torch::Tensor& p, const Options& o) {
    const Key k = key(p);
    auto it = this->state().find(k);
    if ((it == this->state().end() || !steps_.count(k)) && capturing()) throw_new_state("Adam's state for a parameter");
    if (it == this->state().end()) {
      auto s = std::make_unique<State>();
      s->step(0);
      s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      it = this->state().insert_or_assign(k, std::move(s)).first;
    } else if (!steps_.count(k)) {
      // State loaded from a checkpoint (or made by LibTorch's Adam): its step count goes to the device.
      steps_[k] = device_scalar(static_cast<double>(static_cast<State&>(*it->second).step()), p);
    }
    if (!steps_.count(k)) steps_[k] = device_scalar(0, p);
    return static_cast<State&>(*it->second);
  }

  static void run(FusedBucket& b, const Options& o, const torch::Tensor& lr, const std::optional<torch::Tensor>& found_inf) {
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
#if DETTRIAL_FUSED_KERNELS
    torch::_foreach_add_(b.steps, 1);
    if constexpr (Decoupled)
      at::_fused_adamw_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    else
      at::_fused_adam_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                       /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    // A skipped step did not count (as PyTorch's fused Adam takes its increment back).
    if (found_inf) torch::_foreach_sub_(b.steps, std::vector<torch::Tensor>(b.steps.size(), *found_inf));
#else
    (void)found_inf;  // only the kernels take it (step_unless_found_inf says where)
    // Python's capturable Adam, one parameter at a time, every scalar that varies kept as a tensor.
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      torch::Tensor p = b.params[i], grad = b.grads[i], step = b.steps[i];
      step.add_(1);
      if (o.weight_decay() != 0) {
        if constexpr (Decoupled) p.mul_(lr.mul(-o.weight_decay()).add_(1));
        else grad = grad.add(p, o.weight_decay());
      }
      b.first[i].mul_(beta1).add_(grad, 1 - beta1);
      b.second[i].mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const torch::Tensor bias_correction1 = 1 - torch::pow(beta1, step);
      const torch::Tensor bias_correction2_sqrt = (1 - torch::pow(beta2, step)).sqrt();
      torch::Tensor second = b.second[i];
      if (o.amsgrad()) {
        torch::maximum_out(b.third[i], b.third[i], b.second[i]);
        second = b.third[i];
      }
      const torch::Tensor step_size_neg = (lr / bias_correction1).neg();
      const torch::Tensor denom = (second.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(o.eps() / step_size_neg);
      p.addcdiv_(b.first[i], denom);
    }
#endif
  }

  std::map<Key, torch::Tensor> steps_;
};

}  // namespace dettrial::detail

namespace dettrial::optim {

/// Adam (LibTorch's options and state) stepped with a device-resident learning rate and step count.
using FusedAdam = detail::FusedAdamBase<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
/// AdamW (decoupled weight decay) stepped with a device-resident learning rate and step count.
using FusedAdamW = detail::FusedAdamBase<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode
// (FusedSGD's virtual functions, and with them its vtable, then live in dettrial::compiled).
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::optim {

DETTRIAL_INLINE bool FusedSGD::step_unless_found_inf(const torch::Tensor& found_inf) {
#if DETTRIAL_FUSED_KERNELS
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda() || p.device() != found_inf.device()) return false;
      if (o.momentum() != 0 && !has_buffer(p)) {
        if (capturing()) throw_new_state("a momentum buffer");
        buffers_pending_ = true;  // until a step the host lets through makes them
        return false;
      }
    }
  }
  step_with(nullptr, found_inf);
  return true;
#else
  return CapturableOptimizer::step_unless_found_inf(found_inf);
#endif
}

DETTRIAL_INLINE FusedSGD::~FusedSGD() = default;

DETTRIAL_INLINE torch::Tensor FusedSGD::step(LossClosure closure) { return step_with(closure, std::nullopt); }

DETTRIAL_INLINE torch::Tensor FusedSGD::step_with(LossClosure closure, const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = evaluate(closure);
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const std::vector<torch::Tensor> params = with_grad(group.params());
    if (params.empty()) continue;
    const torch::Tensor& lr = device_lr(g, o.lr(), params.front());
    if (o.momentum() == 0) {
      run_buckets(params, {}, o, lr, false, found_inf);
      continue;
    }
    // A parameter's first step makes its momentum buffer (a copy of its gradient); the kernel
    // takes that as one flag for all it steps, so new and old buffers go in separate calls.
    std::vector<torch::Tensor> fresh, stepped, fresh_bufs, stepped_bufs;
    for (const auto& p : params) {
      const bool is_new = !has_buffer(p);
      (is_new ? fresh : stepped).push_back(p);
      (is_new ? fresh_bufs : stepped_bufs).push_back(buffer(p, is_new));
    }
    if (!fresh.empty()) run_buckets(fresh, fresh_bufs, o, lr, true, found_inf);
    if (!stepped.empty()) run_buckets(stepped, stepped_bufs, o, lr, false, found_inf);
  }
  buffers_pending_ = false;
  return loss;
}

DETTRIAL_INLINE void FusedSGD::run_buckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& bufs,
                                           const torch::optim::SGDOptions& o, const torch::Tensor& lr, bool first,
                                           const std::optional<torch::Tensor>& found_inf) {
  detail::for_each_bucket(params, [&](const std::vector<std::size_t>& idx) {
    std::vector<torch::Tensor> ps, grads, bs;
    ps.reserve(idx.size());
    grads.reserve(idx.size());
    for (auto i : idx) {
      ps.push_back(params[i]);
      grads.push_back(params[i].grad());
      if (!bufs.empty()) bs.push_back(bufs[i]);
    }
    run(ps, grads, bs, o, lr, first, found_inf);
  });
}

DETTRIAL_INLINE bool FusedSGD::has_buffer(const torch::Tensor& p) {
  const auto it = state().find(detail::optimizer_state_key<std::decay_t<decltype(state())>>(p));
  return it != state().end() && static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().defined();
}

DETTRIAL_INLINE torch::Tensor FusedSGD::buffer(const torch::Tensor& p, bool fresh) {
  const auto key = detail::optimizer_state_key<std::decay_t<decltype(state())>>(p);
  if (fresh) {
    if (capturing()) throw_new_state("a momentum buffer");
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
    state()[key] = std::move(s);
  }
  return static_cast<torch::optim::SGDParamState&>(*state()[key]).momentum_buffer();
}

DETTRIAL_INLINE void FusedSGD::run(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                                   const std::vector<torch::Tensor>& bufs, const torch::optim::SGDOptions& o, const torch::Tensor& lr,
                                   bool first, const std::optional<torch::Tensor>& found_inf) {
#if DETTRIAL_FUSED_KERNELS
  if (params.front().is_cuda()) {
    at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), lr, o.dampening(), o.nesterov(),
                    /*maximize=*/false, first, /*grad_scale=*/std::nullopt, found_inf);
    return;
  }
#endif
  (void)found_inf;  // only the kernel takes it (step_unless_found_inf says where)
  const torch::Tensor neg_lr = lr.neg();
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i];
    torch::Tensor d_p = grads[i];
    if (o.weight_decay() != 0) d_p = d_p.add(p, o.weight_decay());
    if (o.momentum() != 0) {
      torch::Tensor buf = bufs[i];
      if (first) buf.copy_(d_p);
      else buf.mul_(o.momentum()).add_(d_p, 1 - o.dampening());
      d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
    }
    p.addcmul_(d_p, neg_lr);
  }
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
