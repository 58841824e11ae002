// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Adadelta, which LibTorch lacks: a `torch::optim::Optimizer` with Python's
/// `torch.optim.Adadelta` arithmetic, LibTorch's serialization, and Python's state-dict layout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "python_layout.hpp"
#include "single_tensor_optimizer.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::optim {

/// Adadelta's options, with Python's defaults (`torch.optim.Adadelta(params, lr=1.0, rho=0.9,
/// eps=1e-6, weight_decay=0, maximize=False)`), written the way LibTorch writes its optimizers' options.
struct AdadeltaOptions : torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  AdadeltaOptions(double lr = 1.0) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 1.0;
  TORCH_ARG(double, rho) = 0.9;
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AdadeltaOptions& lhs, const AdadeltaOptions& rhs);
  ~AdadeltaOptions() override = default;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// One parameter's Adadelta state: the step count and the running averages of squared gradients
/// (`square_avg`) and of squared updates (`acc_delta`), as Python's `optimizer.state[p]` holds them.
struct AdadeltaParamState : torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, square_avg);
  TORCH_ARG(torch::Tensor, acc_delta);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AdadeltaParamState& lhs, const AdadeltaParamState& rhs);
  ~AdadeltaParamState() override = default;
};

/// Python's `_single_tensor_adadelta`.
struct AdadeltaUpdate {
  using Options = AdadeltaOptions;
  using State = AdadeltaParamState;
  static constexpr const char* name = "Adadelta";
  static void check(const AdadeltaOptions& o, const std::string& where);
  static std::unique_ptr<AdadeltaParamState> fresh(const torch::Tensor& p);
  static void update(torch::Tensor& param, torch::Tensor grad, AdadeltaParamState& state, const AdadeltaOptions& o);
};

/**
 * @brief Adadelta (Zeiler 2012) as PyTorch's `torch.optim.Adadelta` computes it, operation for
 * operation, so the parameters follow Python's bit for bit on the same device; saved and loaded as
 * LibTorch's optimizers are (`torch::save(optimizer, ...)`, dettrial's native checkpoints).
 * @code{.cpp}
 * dettrial::optim::Adadelta opt(model->parameters(), dettrial::optim::AdadeltaOptions(1.0).rho(0.95));
 * @endcode
 * An invalid option (lr, eps or weight_decay negative, rho outside [0, 1]) is a ConfigError.
 */
using Adadelta = SingleTensorOptimizer<AdadeltaUpdate>;

/// Python's `Adadelta.state_dict()`: each parameter's `step` (a float32 0-dim tensor), `square_avg`,
/// `acc_delta`; each group's lr, rho, eps, weight_decay, maximize, capturable, foreach (None),
/// differentiable.
template <>
struct python_layout<Adadelta> {
  using options_type = AdadeltaOptions;
  using state_type = AdadeltaParamState;
  static constexpr std::string_view name = "Adadelta";
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "rho", "eps", "weight_decay"}; }
  static std::map<std::string, bool> fixed_flags() { return {{"maximize", false}}; }
  DETTRIAL_INLINE static void write_options(const options_type& o, StateDict& out);
  DETTRIAL_INLINE static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
  DETTRIAL_INLINE static void write_state(const state_type& s, StateDict& out);
  DETTRIAL_INLINE static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param,
                                                                const std::string& what);
};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::optim {

DETTRIAL_INLINE void AdadeltaOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rho);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

DETTRIAL_INLINE void AdadeltaOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, rho);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

DETTRIAL_INLINE bool operator==(const AdadeltaOptions& lhs, const AdadeltaOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.rho() == rhs.rho() && lhs.eps() == rhs.eps() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.maximize() == rhs.maximize();
}

DETTRIAL_INLINE void AdadeltaParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(square_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(acc_delta);
}

DETTRIAL_INLINE void AdadeltaParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, square_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, acc_delta);
}

DETTRIAL_INLINE bool operator==(const AdadeltaParamState& lhs, const AdadeltaParamState& rhs) {
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || torch::equal(a, b));
  };
  return lhs.step() == rhs.step() && same(lhs.square_avg(), rhs.square_avg()) && same(lhs.acc_delta(), rhs.acc_delta());
}

// Python's checks (torch.optim.Adadelta.__init__), as one sentence naming the option and its value.
DETTRIAL_INLINE void AdadeltaUpdate::check(const AdadeltaOptions& o, const std::string& where) {
  const auto invalid = [&](const char* option, double value, const char* rule) { invalid_option(name, where, option, value, rule); };
  if (!(o.lr() >= 0)) invalid("lr", o.lr(), "at least 0");
  if (!(o.rho() >= 0 && o.rho() <= 1)) invalid("rho", o.rho(), "in [0, 1]");
  if (!(o.eps() >= 0)) invalid("eps", o.eps(), "at least 0");
  if (!(o.weight_decay() >= 0)) invalid("weight_decay", o.weight_decay(), "at least 0");
}

DETTRIAL_INLINE std::unique_ptr<AdadeltaParamState> AdadeltaUpdate::fresh(const torch::Tensor& p) {
  auto fresh = std::make_unique<AdadeltaParamState>();
  fresh->square_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  fresh->acc_delta(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  return fresh;
}

// Python's _single_tensor_adadelta, operation for operation.
DETTRIAL_INLINE void AdadeltaUpdate::update(torch::Tensor& p, torch::Tensor grad, AdadeltaParamState& state, const AdadeltaOptions& o) {
  const double lr = o.lr(), rho = o.rho(), eps = o.eps(), weight_decay = o.weight_decay();
  if (weight_decay != 0) grad = grad.add(p, weight_decay);
  torch::Tensor square_avg = state.square_avg(), acc_delta = state.acc_delta();
  if (p.is_complex()) {
    square_avg = torch::view_as_real(square_avg);
    acc_delta = torch::view_as_real(acc_delta);
    grad = torch::view_as_real(grad);
  }
  square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho);
  const torch::Tensor stddev = square_avg.add(eps).sqrt_();
  torch::Tensor delta = acc_delta.add(eps).sqrt_();
  delta.div_(stddev).mul_(grad);
  acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
  if (p.is_complex()) delta = torch::view_as_complex(delta);
  p.add_(delta, -lr);
}

DETTRIAL_INLINE void python_layout<Adadelta>::write_state(const state_type& s, StateDict& out) {
  // Python keeps the step as a float32 0-dim tensor on the CPU (not capturable).
  out.insert("step", torch::scalar_tensor(static_cast<double>(s.step()), torch::kFloat));
  python::put(out, "square_avg", s.square_avg());
  python::put(out, "acc_delta", s.acc_delta());
}

DETTRIAL_INLINE auto python_layout<Adadelta>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->step(python::step(e, what));
  s->square_avg(python::tensor(e, "square_avg", p, what));
  s->acc_delta(python::tensor(e, "acc_delta", p, what));
  return s;
}

DETTRIAL_INLINE void python_layout<Adadelta>::write_options(const options_type& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("rho", o.rho());
  out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay());
  out.insert("maximize", o.maximize());
  out.insert("capturable", false);
  out.insert("foreach", c10::IValue());  // None: Python's default (it picks the implementation)
  out.insert("differentiable", false);
}

DETTRIAL_INLINE void python_layout<Adadelta>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                          const std::string& what) {
  if (key == "lr") o.lr(python::number(v, what));
  else if (key == "rho") o.rho(python::number(v, what));
  else if (key == "eps") o.eps(python::number(v, what));
  else if (key == "weight_decay") o.weight_decay(python::number(v, what));
}

}  // namespace dettrial::optim

namespace dettrial::detail {
inline const bool adadelta_layout_registered = optim::register_python_layout<optim::Adadelta>();
}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
