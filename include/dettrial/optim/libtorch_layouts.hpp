// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Python's layout of LibTorch's own optimizers (SGD, Adam, AdamW, RMSprop, Adagrad): their
/// python_layout specializations, beside dettrial's optimizers' own (see optim/python_layout.hpp).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "python_layout.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::optim {

/// LibTorch's SGD: momentum_buffer; lr, momentum, dampening, weight_decay, nesterov.
template <>
struct python_layout<torch::optim::SGD> {
  using options_type = torch::optim::SGDOptions;
  using state_type = torch::optim::SGDParamState;
  static constexpr std::string_view name = "SGD";
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "momentum", "dampening", "weight_decay", "nesterov"}; }
  static std::map<std::string, bool> fixed_flags() { return {{"maximize", false}}; }
  DETTRIAL_INLINE static void write_options(const options_type& o, StateDict& out);
  DETTRIAL_INLINE static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
  DETTRIAL_INLINE static void write_state(const state_type& s, StateDict& out);
  DETTRIAL_INLINE static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param,
                                                                const std::string& what);
};

}  // namespace dettrial::optim

namespace dettrial::detail {
/// Adam and AdamW: the same state (step, exp_avg, exp_avg_sq, max_exp_avg_sq) and options under
/// the same names; `decoupled` is the flag Python's Adam carries since 2.6 to say which it is.
template <class Options, class State, bool Decoupled>
struct AdamLayout {
  using options_type = Options;
  using state_type = State;
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "betas", "eps", "weight_decay", "amsgrad"}; }
  // Another value of decoupled_weight_decay is the other optimizer: an AdamW checkpoint resumed
  // into Adam would otherwise step as Adam with L2 weight decay.
  static std::map<std::string, bool> fixed_flags() { return {{"maximize", false}, {"decoupled_weight_decay", Decoupled}}; }
  static void write_options(const options_type& o, StateDict& out) {
    optim::python::put_betas_options(o, out);
    out.insert("amsgrad", o.amsgrad());
    out.insert("maximize", false);
  }
  static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what) {
    if (key == "lr") o.lr(optim::python::number(v, what));
    else if (key == "eps") o.eps(optim::python::number(v, what));
    else if (key == "weight_decay") o.weight_decay(optim::python::number(v, what));
    else if (key == "amsgrad") o.amsgrad(optim::python::number(v, what) != 0);
    else if (key == "betas") o.betas(optim::python::pair(v, what));
  }
  static void write_state(const state_type& s, StateDict& out) {
    out.insert("step", optim::python::step_tensor(static_cast<double>(s.step())));
    optim::python::put(out, "exp_avg", s.exp_avg());
    optim::python::put(out, "exp_avg_sq", s.exp_avg_sq());
    optim::python::put(out, "max_exp_avg_sq", s.max_exp_avg_sq());
  }
  static std::unique_ptr<state_type> read_state(const StateDict& e, const torch::Tensor& p, const std::string& what) {
    auto s = std::make_unique<state_type>();
    s->step(optim::python::step(e, what));
    s->exp_avg(optim::python::tensor(e, "exp_avg", p, what));
    s->exp_avg_sq(optim::python::tensor(e, "exp_avg_sq", p, what));
    s->max_exp_avg_sq(optim::python::tensor(e, "max_exp_avg_sq", p, what));
    if (!s->exp_avg().defined() || !s->exp_avg_sq().defined()) throw CheckpointError(what + " lacks exp_avg or exp_avg_sq");
    return s;
  }
};
}  // namespace dettrial::detail

namespace dettrial::optim {

template <>
struct python_layout<torch::optim::Adam> : detail::AdamLayout<torch::optim::AdamOptions, torch::optim::AdamParamState, false> {
  static constexpr std::string_view name = "Adam";
};

template <>
struct python_layout<torch::optim::AdamW> : detail::AdamLayout<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {
  static constexpr std::string_view name = "AdamW";
};

/// LibTorch's RMSprop: step, square_avg, momentum_buffer, grad_avg; lr, alpha, eps, weight_decay,
/// momentum, centered.
template <>
struct python_layout<torch::optim::RMSprop> {
  using options_type = torch::optim::RMSpropOptions;
  using state_type = torch::optim::RMSpropParamState;
  static constexpr std::string_view name = "RMSprop";
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"}; }
  static std::map<std::string, bool> fixed_flags() { return {{"maximize", false}}; }
  DETTRIAL_INLINE static void write_options(const options_type& o, StateDict& out);
  DETTRIAL_INLINE static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
  DETTRIAL_INLINE static void write_state(const state_type& s, StateDict& out);
  DETTRIAL_INLINE static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param,
                                                                const std::string& what);
};

/// LibTorch's Adagrad: step, sum; lr, lr_decay, weight_decay, initial_accumulator_value, eps.
template <>
struct python_layout<torch::optim::Adagrad> {
  using options_type = torch::optim::AdagradOptions;
  using state_type = torch::optim::AdagradParamState;
  static constexpr std::string_view name = "Adagrad";
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"}; }
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

DETTRIAL_INLINE void python_layout<torch::optim::SGD>::write_options(const options_type& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("momentum", o.momentum());
  out.insert("dampening", o.dampening());
  out.insert("weight_decay", o.weight_decay());
  out.insert("nesterov", o.nesterov());
  out.insert("maximize", false);
}

DETTRIAL_INLINE void python_layout<torch::optim::SGD>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                                   const std::string& what) {
  if (key == "lr") o.lr(python::number(v, what));
  else if (key == "momentum") o.momentum(python::number(v, what));
  else if (key == "dampening") o.dampening(python::number(v, what));
  else if (key == "weight_decay") o.weight_decay(python::number(v, what));
  else if (key == "nesterov") o.nesterov(python::number(v, what) != 0);
}

DETTRIAL_INLINE void python_layout<torch::optim::SGD>::write_state(const state_type& s, StateDict& out) {
  python::put(out, "momentum_buffer", s.momentum_buffer());
}

DETTRIAL_INLINE auto python_layout<torch::optim::SGD>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->momentum_buffer(python::tensor(e, "momentum_buffer", p, what));
  return s;
}

DETTRIAL_INLINE void python_layout<torch::optim::RMSprop>::write_options(const options_type& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("alpha", o.alpha());
  out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay());
  out.insert("momentum", o.momentum());
  out.insert("centered", o.centered());
  out.insert("maximize", false);
}

DETTRIAL_INLINE void python_layout<torch::optim::RMSprop>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                                       const std::string& what) {
  if (key == "lr") o.lr(python::number(v, what));
  else if (key == "alpha") o.alpha(python::number(v, what));
  else if (key == "eps") o.eps(python::number(v, what));
  else if (key == "weight_decay") o.weight_decay(python::number(v, what));
  else if (key == "momentum") o.momentum(python::number(v, what));
  else if (key == "centered") o.centered(python::number(v, what) != 0);
}

DETTRIAL_INLINE void python_layout<torch::optim::RMSprop>::write_state(const state_type& s, StateDict& out) {
  out.insert("step", static_cast<std::int64_t>(s.step()));
  python::put(out, "square_avg", s.square_avg());
  python::put(out, "momentum_buffer", s.momentum_buffer());
  python::put(out, "grad_avg", s.grad_avg());
}

DETTRIAL_INLINE auto python_layout<torch::optim::RMSprop>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->step(python::step(e, what));
  s->square_avg(python::tensor(e, "square_avg", p, what));
  s->momentum_buffer(python::tensor(e, "momentum_buffer", p, what));
  s->grad_avg(python::tensor(e, "grad_avg", p, what));
  return s;
}

DETTRIAL_INLINE void python_layout<torch::optim::Adagrad>::write_options(const options_type& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("lr_decay", o.lr_decay());
  out.insert("weight_decay", o.weight_decay());
  out.insert("initial_accumulator_value", o.initial_accumulator_value());
  out.insert("eps", o.eps());
  out.insert("maximize", false);
}

DETTRIAL_INLINE void python_layout<torch::optim::Adagrad>::read_option(options_type& o, const std::string& key, const c10::IValue& v,
                                                                       const std::string& what) {
  if (key == "lr") o.lr(python::number(v, what));
  else if (key == "lr_decay") o.lr_decay(python::number(v, what));
  else if (key == "weight_decay") o.weight_decay(python::number(v, what));
  else if (key == "initial_accumulator_value") o.initial_accumulator_value(python::number(v, what));
  else if (key == "eps") o.eps(python::number(v, what));
}

DETTRIAL_INLINE void python_layout<torch::optim::Adagrad>::write_state(const state_type& s, StateDict& out) {
  out.insert("step", python::step_tensor(static_cast<double>(s.step())));
  python::put(out, "sum", s.sum());
}

DETTRIAL_INLINE auto python_layout<torch::optim::Adagrad>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->step(python::step(e, what));
  s->sum(python::tensor(e, "sum", p, what));
  return s;
}

}  // namespace dettrial::optim

/// Registered where the layouts are compiled (every unit header-only; dettrial::compiled's once).

namespace dettrial::detail {
inline const bool libtorch_layouts_registered =
    optim::register_python_layout<torch::optim::SGD>() && optim::register_python_layout<torch::optim::Adam>() &&
    optim::register_python_layout<torch::optim::AdamW>() && optim::register_python_layout<torch::optim::RMSprop>() &&
    optim::register_python_layout<torch::optim::Adagrad>();
}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
