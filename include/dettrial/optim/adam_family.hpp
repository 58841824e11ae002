// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief NAdam, RAdam and Adamax, which LibTorch lacks: `torch::optim::Optimizer`s with Python's
/// `torch.optim` arithmetic (its single-tensor path, the one Python takes on the CPU), LibTorch's
/// serialization, and Python's state-dict layout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "python_layout.hpp"
#include "single_tensor_optimizer.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::optim {

/// NAdam's options, with Python's defaults (`torch.optim.NAdam(params, lr=2e-3, betas=(0.9, 0.999),
/// eps=1e-8, weight_decay=0, momentum_decay=4e-3, decoupled_weight_decay=False)`).
struct NAdamOptions : torch::optim::OptimizerCloneableOptions<NAdamOptions> {
  using betas_t = std::tuple<double, double>;
  NAdamOptions(double lr = 2e-3) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 2e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(double, momentum_decay) = 4e-3;
  TORCH_ARG(bool, decoupled_weight_decay) = false;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// RAdam's options, with Python's defaults (`torch.optim.RAdam(params, lr=1e-3, betas=(0.9, 0.999),
/// eps=1e-8, weight_decay=0, decoupled_weight_decay=False)`).
struct RAdamOptions : torch::optim::OptimizerCloneableOptions<RAdamOptions> {
  using betas_t = std::tuple<double, double>;
  RAdamOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, decoupled_weight_decay) = false;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Adamax's options, with Python's defaults (`torch.optim.Adamax(params, lr=2e-3, betas=(0.9, 0.999),
/// eps=1e-8, weight_decay=0)`).
struct AdamaxOptions : torch::optim::OptimizerCloneableOptions<AdamaxOptions> {
  using betas_t = std::tuple<double, double>;
  AdamaxOptions(double lr = 2e-3) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 2e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// One parameter's state in Adam's family: the step count, the first moment (`exp_avg`), and the
/// second (`exp_avg_sq`: NAdam, RAdam) or the infinity norm (`exp_inf`: Adamax, in `second`), with
/// NAdam's `mu_product` (a float32 0-dim tensor, as Python keeps it).
struct AdamFamilyParamState : torch::optim::OptimizerCloneableParamState<AdamFamilyParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, second);
  TORCH_ARG(torch::Tensor, mu_product);
  /// Adamax's: `second` is the infinity norm, Python's `exp_inf`.
  TORCH_ARG(bool, infinity_norm) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Python's `_single_tensor_nadam`.
struct NAdamUpdate {
  using Options = NAdamOptions;
  using State = AdamFamilyParamState;
  static constexpr const char* name = "NAdam";
  static void check(const NAdamOptions& o, const std::string& where);
  static std::unique_ptr<AdamFamilyParamState> fresh(const torch::Tensor& p);
  static void update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const NAdamOptions& o);
};
/// Python's `_single_tensor_radam`.
struct RAdamUpdate {
  using Options = RAdamOptions;
  using State = AdamFamilyParamState;
  static constexpr const char* name = "RAdam";
  static void check(const RAdamOptions& o, const std::string& where);
  static std::unique_ptr<AdamFamilyParamState> fresh(const torch::Tensor& p);
  static void update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const RAdamOptions& o);
};
/// Python's `_single_tensor_adamax`.
struct AdamaxUpdate {
  using Options = AdamaxOptions;
  using State = AdamFamilyParamState;
  static constexpr const char* name = "Adamax";
  static void check(const AdamaxOptions& o, const std::string& where);
  static std::unique_ptr<AdamFamilyParamState> fresh(const torch::Tensor& p);
  static void update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const AdamaxOptions& o);
};

/**
 * @brief NAdam (Dozat 2016), with Python's momentum decay and, with `decoupled_weight_decay`, NAdamW.
 * @code{.cpp}
 * dettrial::optim::NAdam opt(model->parameters(), dettrial::optim::NAdamOptions(2e-3).weight_decay(0.01));
 * @endcode
 */
using NAdam = SingleTensorOptimizer<NAdamUpdate>;
/// RAdam (Liu et al. 2019): Adam with its variance rectified, plain momentum while it cannot be.
using RAdam = SingleTensorOptimizer<RAdamUpdate>;
/// Adamax (Kingma and Ba 2014): Adam with the infinity norm.
using Adamax = SingleTensorOptimizer<AdamaxUpdate>;

}  // namespace dettrial::optim

namespace dettrial::detail {
/// Python's layout of NAdam, RAdam and Adamax: each parameter's `step` (a float32 0-dim tensor),
/// `exp_avg`, `exp_avg_sq` (Adamax's `exp_inf`) and NAdam's `mu_product`; each group's lr, betas (a
/// tuple), eps, weight_decay, maximize and its own options (less `params`).
template <class Update>
struct AdamFamilyLayout {
  using options_type = typename Update::Options;
  using state_type = optim::AdamFamilyParamState;
  static constexpr std::string_view name = Update::name;
  static constexpr bool elementwise = true;
  static std::set<std::string> options();
  static void write_options(const options_type& o, StateDict& out);
  static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
  static void write_state(const state_type& s, StateDict& out);
  static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param, const std::string& what);
  /// The state's reader for this member: its second moment's name, and whether it has mu_product.
  static std::unique_ptr<state_type> read_family_state(const StateDict& e, const torch::Tensor& p, const char* second, bool mu_product,
                                                       const std::string& what);
  /// The options every member reads; false when `key` is none of them.
  static bool read_shared_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
};
}  // namespace dettrial::detail

namespace dettrial::optim {

template <>
struct python_layout<NAdam> : detail::AdamFamilyLayout<NAdamUpdate> {};
template <>
struct python_layout<RAdam> : detail::AdamFamilyLayout<RAdamUpdate> {};
template <>
struct python_layout<Adamax> : detail::AdamFamilyLayout<AdamaxUpdate> {};

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>

namespace dettrial::detail::adam_family {

/// Python's checks shared by the three (their __init__s), one sentence naming the option and value.
template <class Options>
void check_common(const char* optimizer, const Options& o, const std::string& where) {
  const auto invalid = [&](const char* name, double value, const char* rule) {
    optim::invalid_option(optimizer, where, name, value, rule);
  };
  if (!(o.lr() >= 0)) invalid("lr", o.lr(), "at least 0");
  if (!(o.eps() >= 0)) invalid("eps", o.eps(), "at least 0");
  if (!(std::get<0>(o.betas()) >= 0 && std::get<0>(o.betas()) < 1)) invalid("betas[0]", std::get<0>(o.betas()), "in [0, 1)");
  if (!(std::get<1>(o.betas()) >= 0 && std::get<1>(o.betas()) < 1)) invalid("betas[1]", std::get<1>(o.betas()), "in [0, 1)");
  if (!(o.weight_decay() >= 0)) invalid("weight_decay", o.weight_decay(), "at least 0");
}

/// A first and second moment shaped like `p` (and NAdam's mu_product, a float32 one).
DETTRIAL_INLINE std::unique_ptr<optim::AdamFamilyParamState> fresh_state(const torch::Tensor& p, bool mu_product,
                                                                         bool infinity_norm = false) {
  auto s = std::make_unique<optim::AdamFamilyParamState>();
  s->infinity_norm(infinity_norm);
  s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  s->second(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  if (mu_product) s->mu_product(torch::ones({}, torch::kFloat));
  return s;
}

}  // namespace dettrial::detail::adam_family

namespace dettrial::optim {
// Options' and state's LibTorch serialization (dettrial's native checkpoints, torch::save).

DETTRIAL_INLINE void NAdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(decoupled_weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

DETTRIAL_INLINE void NAdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, decoupled_weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

DETTRIAL_INLINE void RAdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(decoupled_weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

DETTRIAL_INLINE void RAdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, decoupled_weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

DETTRIAL_INLINE void AdamaxOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
}

DETTRIAL_INLINE void AdamaxOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
}

DETTRIAL_INLINE void AdamFamilyParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(second);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(mu_product);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(infinity_norm);
}

DETTRIAL_INLINE void AdamFamilyParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, second);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, mu_product);
  c10::IValue infinity;
  if (archive.try_read("infinity_norm", infinity)) infinity_norm(infinity.toBool());
}

// ------------------------------------------------------------------------------------------------
// The updates: Python's _single_tensor_* functions, operation for operation. `step` is Python's
// `_get_value(step_t)`, the float of a float32 count.

DETTRIAL_INLINE void NAdamUpdate::check(const NAdamOptions& o, const std::string& where) {
  detail::adam_family::check_common(name, o, where);
  if (!(o.momentum_decay() >= 0)) invalid_option(name, where, "momentum_decay", o.momentum_decay(), "at least 0");
}

DETTRIAL_INLINE std::unique_ptr<AdamFamilyParamState> NAdamUpdate::fresh(const torch::Tensor& p) {
  return detail::adam_family::fresh_state(p, true);
}

DETTRIAL_INLINE void NAdamUpdate::update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const NAdamOptions& o) {
  const auto [beta1, beta2] = o.betas();
  const double lr = o.lr(), step = static_cast<double>(static_cast<float>(state.step()));
  torch::Tensor exp_avg = state.exp_avg(), exp_avg_sq = state.second(), mu_product = state.mu_product(), p = param;
  if (p.is_complex()) {
    p = torch::view_as_real(p);
    grad = torch::view_as_real(grad);
    exp_avg = torch::view_as_real(exp_avg);
    exp_avg_sq = torch::view_as_real(exp_avg_sq);
  }
  const double bias_correction2 = 1 - std::pow(beta2, step);
  if (o.weight_decay() != 0) {
    if (o.decoupled_weight_decay()) p.mul_(1 - lr * o.weight_decay());
    else grad = grad.add(p, o.weight_decay());
  }
  const double mu = beta1 * (1.0 - 0.5 * std::pow(0.96, step * o.momentum_decay()));
  const double mu_next = beta1 * (1.0 - 0.5 * std::pow(0.96, (step + 1) * o.momentum_decay()));
  mu_product.mul_(mu);  // a float32 tensor, as Python's
  exp_avg.lerp_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  torch::Tensor denom = exp_avg_sq.div(bias_correction2).sqrt();
  const double product = mu_product.item<double>();
  const double mu_product_next = product * mu_next;
  denom.add_(o.eps());
  p.addcdiv_(grad, denom, -lr * (1.0 - mu) / (1.0 - product));
  p.addcdiv_(exp_avg, denom, (-lr * mu_next) / (1.0 - mu_product_next));
}

DETTRIAL_INLINE void RAdamUpdate::check(const RAdamOptions& o, const std::string& where) {
  detail::adam_family::check_common(name, o, where);
}

DETTRIAL_INLINE std::unique_ptr<AdamFamilyParamState> RAdamUpdate::fresh(const torch::Tensor& p) {
  return detail::adam_family::fresh_state(p, false);
}

DETTRIAL_INLINE void RAdamUpdate::update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const RAdamOptions& o) {
  const auto [beta1, beta2] = o.betas();
  const double lr = o.lr(), step = static_cast<double>(static_cast<float>(state.step()));
  torch::Tensor exp_avg = state.exp_avg(), exp_avg_sq = state.second(), p = param;
  if (p.is_complex()) {
    p = torch::view_as_real(p);
    grad = torch::view_as_real(grad);
    exp_avg = torch::view_as_real(exp_avg);
    exp_avg_sq = torch::view_as_real(exp_avg_sq);
  }
  if (o.weight_decay() != 0) {
    if (o.decoupled_weight_decay()) p.mul_(1 - lr * o.weight_decay());
    else grad = grad.add(p, o.weight_decay());
  }
  exp_avg.lerp_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const torch::Tensor bias_corrected_exp_avg = exp_avg / bias_correction1;
  const double rho_inf = 2 / (1 - beta2) - 1;
  const double rho_t = rho_inf - 2 * step * std::pow(beta2, step) / bias_correction2;
  if (rho_t > 5.0) {
    const double rect = std::pow((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5);
    // Python's `float / tensor` is the tensor's reciprocal times the float (Tensor.__rtruediv__).
    const torch::Tensor adaptive_lr = exp_avg_sq.sqrt().add_(o.eps()).reciprocal() * std::pow(bias_correction2, 0.5);
    p.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, -1.0);
  } else {
    p.add_(bias_corrected_exp_avg * lr, -1.0);
  }
}

DETTRIAL_INLINE void AdamaxUpdate::check(const AdamaxOptions& o, const std::string& where) {
  detail::adam_family::check_common(name, o, where);
}

DETTRIAL_INLINE std::unique_ptr<AdamFamilyParamState> AdamaxUpdate::fresh(const torch::Tensor& p) {
  return detail::adam_family::fresh_state(p, false, true);
}

DETTRIAL_INLINE void AdamaxUpdate::update(torch::Tensor& param, torch::Tensor grad, AdamFamilyParamState& state, const AdamaxOptions& o) {
  const auto [beta1, beta2] = o.betas();
  const double step = static_cast<double>(static_cast<float>(state.step()));
  if (o.weight_decay() != 0) grad = grad.add(param, o.weight_decay());
  torch::Tensor exp_avg = state.exp_avg(), exp_inf = state.second(), p = param;
  if (p.is_complex()) {
    p = torch::view_as_real(p);
    grad = torch::view_as_real(grad);
    exp_avg = torch::view_as_real(exp_avg);
    exp_inf = torch::view_as_real(exp_inf);
  }
  exp_avg.lerp_(grad, 1 - beta1);
  torch::maximum_out(exp_inf, exp_inf.mul_(beta2), grad.abs().add_(o.eps()));
  const double clr = o.lr() / (1 - std::pow(beta1, step));
  p.addcdiv_(exp_avg, exp_inf, -clr);
}

// ------------------------------------------------------------------------------------------------
// Python's layout

}  // namespace dettrial::optim

namespace dettrial::detail {

template <class Update>
void AdamFamilyLayout<Update>::write_state(const state_type& s, StateDict& out) {
  // Python keeps the step as a float32 0-dim tensor on the CPU (not capturable).
  out.insert("step", torch::scalar_tensor(static_cast<double>(s.step()), torch::kFloat));
  optim::python::put(out, "mu_product", s.mu_product());
  optim::python::put(out, "exp_avg", s.exp_avg());
  optim::python::put(out, s.infinity_norm() ? "exp_inf" : "exp_avg_sq", s.second());
}

template <class Update>
auto AdamFamilyLayout<Update>::read_family_state(const StateDict& e, const torch::Tensor& p, const char* second, bool mu_product,
                                                 const std::string& what) -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->step(optim::python::step(e, what));
  s->exp_avg(optim::python::tensor(e, "exp_avg", p, what));
  s->second(optim::python::tensor(e, second, p, what));
  s->infinity_norm(std::string(second) == "exp_inf");
  if (!s->exp_avg().defined() || !s->second().defined()) throw CheckpointError(what + " lacks exp_avg or " + second);
  if (mu_product) {
    const auto it = e.find("mu_product");
    if (it == e.end()) throw CheckpointError(what + " lacks mu_product (NAdam's)");
    s->mu_product(torch::scalar_tensor(optim::python::number(it->value(), what + ": 'mu_product'"), torch::kFloat));
  }
  return s;
}

template <class Update>
bool AdamFamilyLayout<Update>::read_shared_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what) {
  if (key == "lr") o.lr(optim::python::number(v, what));
  else if (key == "eps") o.eps(optim::python::number(v, what));
  else if (key == "weight_decay") o.weight_decay(optim::python::number(v, what));
  else if (key == "maximize") o.maximize(optim::python::number(v, what) != 0);
  else if (key == "betas") o.betas(optim::python::pair(v, what));
  else return false;
  return true;
}

// NAdam
template <>
inline std::set<std::string> AdamFamilyLayout<optim::NAdamUpdate>::options() {
  return {"lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "maximize"};
}
template <>
inline void AdamFamilyLayout<optim::NAdamUpdate>::write_options(const options_type& o, StateDict& out) {
  optim::python::put_betas_options(o, out);
  out.insert("momentum_decay", o.momentum_decay());
  out.insert("decoupled_weight_decay", o.decoupled_weight_decay());
  out.insert("maximize", o.maximize());
  out.insert("foreach", c10::IValue());  // None: Python's default (it picks the implementation)
  out.insert("capturable", false);
  out.insert("differentiable", false);
}
template <>
inline void AdamFamilyLayout<optim::NAdamUpdate>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                              const std::string& what) {
  if (read_shared_option(o, key, v, what)) return;
  if (key == "momentum_decay") o.momentum_decay(optim::python::number(v, what));
  else if (key == "decoupled_weight_decay") o.decoupled_weight_decay(optim::python::number(v, what) != 0);
}
template <>
inline auto AdamFamilyLayout<optim::NAdamUpdate>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  return read_family_state(e, p, "exp_avg_sq", true, what);
}

// RAdam
template <>
inline std::set<std::string> AdamFamilyLayout<optim::RAdamUpdate>::options() {
  return {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize"};
}
template <>
inline void AdamFamilyLayout<optim::RAdamUpdate>::write_options(const options_type& o, StateDict& out) {
  optim::python::put_betas_options(o, out);
  out.insert("maximize", o.maximize());
  out.insert("foreach", c10::IValue());
  out.insert("capturable", false);
  out.insert("decoupled_weight_decay", o.decoupled_weight_decay());
  out.insert("differentiable", false);
}
template <>
inline void AdamFamilyLayout<optim::RAdamUpdate>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                              const std::string& what) {
  if (read_shared_option(o, key, v, what)) return;
  if (key == "decoupled_weight_decay") o.decoupled_weight_decay(optim::python::number(v, what) != 0);
}
template <>
inline auto AdamFamilyLayout<optim::RAdamUpdate>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  return read_family_state(e, p, "exp_avg_sq", false, what);
}

// Adamax
template <>
inline std::set<std::string> AdamFamilyLayout<optim::AdamaxUpdate>::options() {
  return {"lr", "betas", "eps", "weight_decay", "maximize"};
}
template <>
inline void AdamFamilyLayout<optim::AdamaxUpdate>::write_options(const options_type& o, StateDict& out) {
  optim::python::put_betas_options(o, out);
  out.insert("foreach", c10::IValue());
  out.insert("maximize", o.maximize());
  out.insert("differentiable", false);
  out.insert("capturable", false);
}
template <>
inline void AdamFamilyLayout<optim::AdamaxUpdate>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                               const std::string& what) {
  read_shared_option(o, key, v, what);
}
template <>
inline auto AdamFamilyLayout<optim::AdamaxUpdate>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  return read_family_state(e, p, "exp_inf", false, what);
}

inline const bool adam_family_layouts_registered = optim::register_python_layout<optim::NAdam>() &&
                                                   optim::register_python_layout<optim::RAdam>() &&
                                                   optim::register_python_layout<optim::Adamax>();

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
