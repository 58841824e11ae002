// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Muon, which LibTorch lacks: torch 2.9's `torch.optim.Muon` (momentum orthogonalized by a
/// Newton-Schulz iteration in bfloat16) as a `torch::optim::Optimizer`, with Python's arithmetic,
/// LibTorch's serialization and Python's state-dict layout.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>

#include <torch/torch.h>

#include "python_layout.hpp"
#include "single_tensor_optimizer.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::optim {

/// How Muon scales the learning rate by a matrix's shape (rows A, columns B): Python's `adjust_lr_fn`.
enum class MuonLrAdjustment {
  original,            ///< sqrt(max(1, A / B)), Keller Jordan's (Python's None means this one)
  match_rms_adamw,     ///< 0.2 sqrt(max(A, B)), Moonshot's: AdamW's learning rate and weight decay carry over
  spectral_unclamped,  ///< sqrt(A / B), Bernstein's
};

/// Muon's options, with Python's defaults (`torch.optim.Muon(params, lr=1e-3, weight_decay=0.1,
/// momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
/// adjust_lr_fn=None)`). An unset `adjust_lr_fn` is Python's None (scaled as `original`), kept apart
/// from `original` so that a state dict is written back as it was read.
struct MuonOptions : torch::optim::OptimizerCloneableOptions<MuonOptions> {
  using coefficients_t = std::tuple<double, double, double>;
  MuonOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, weight_decay) = 0.1;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(coefficients_t, ns_coefficients) = std::make_tuple(3.4445, -4.7750, 2.0315);
  TORCH_ARG(double, eps) = 1e-7;
  TORCH_ARG(std::int64_t, ns_steps) = 5;
  TORCH_ARG(std::optional<MuonLrAdjustment>, adjust_lr_fn);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// One parameter's Muon state: the momentum buffer, as Python's `optimizer.state[p]` holds it.
struct MuonParamState : torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Python's `_single_tensor_muon`.
struct MuonUpdate {
  using Options = MuonOptions;
  using State = MuonParamState;
  static constexpr const char* name = "Muon";
  static void check(const MuonOptions& o, const std::string& where);
  /// Muon steps matrices only, as Python's constructor insists.
  static void check_param(const torch::Tensor& p, const std::string& where);
  static std::unique_ptr<MuonParamState> fresh(const torch::Tensor& p);
  static void update(torch::Tensor& param, torch::Tensor grad, MuonParamState& state, const MuonOptions& o);
};

/**
 * @brief Muon (Jordan et al. 2024) as torch 2.9's `torch.optim.Muon` computes it: Nesterov momentum,
 * orthogonalized by `ns_steps` quintic Newton-Schulz iterations in bfloat16, a decoupled weight decay
 * and a learning rate scaled by the matrix's shape. For the 2-D weights of hidden layers; give biases,
 * norms and embeddings to another optimizer (AdamW), as Python's documentation does:
 * @code{.cpp}
 * std::vector<torch::Tensor> matrices, others;
 * for (auto& p : model->parameters()) (p.dim() == 2 ? matrices : others).push_back(p);
 * dettrial::optim::Muon muon(matrices, dettrial::optim::MuonOptions(0.02));
 * torch::optim::AdamW adamw(others, torch::optim::AdamWOptions(3e-4));
 * @endcode
 * A parameter that is not a matrix, or an invalid option, is a ConfigError naming it.
 */
using Muon = SingleTensorOptimizer<MuonUpdate>;

/// Python's `_zeropower_via_newtonschulz`: `grad` (a matrix) orthogonalized approximately, in bfloat16.
DETTRIAL_INLINE torch::Tensor muon_orthogonalize(const torch::Tensor& grad, const MuonOptions::coefficients_t& coefficients,
                                                 std::int64_t steps, double eps);
/// Python's `_adjust_lr`: the learning rate for a matrix of `rows` x `cols`.
DETTRIAL_INLINE double muon_adjusted_lr(double lr, const std::optional<MuonLrAdjustment>& adjustment, std::int64_t rows, std::int64_t cols);

/// Python's `Muon.state_dict()`: each parameter's momentum_buffer; each group's lr, weight_decay,
/// momentum, nesterov, ns_coefficients (a triple), eps, ns_steps and adjust_lr_fn (None or Python's
/// name). Not elementwise: Muon orthogonalizes each matrix whole, so ZeRO's shards cannot cut it.
template <>
struct python_layout<Muon> {
  using options_type = MuonOptions;
  using state_type = MuonParamState;
  static constexpr std::string_view name = "Muon";
  static std::set<std::string> options() {
    return {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"};
  }
  DETTRIAL_INLINE static void write_options(const options_type& o, StateDict& out);
  DETTRIAL_INLINE static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what);
  DETTRIAL_INLINE static void write_state(const state_type& s, StateDict& out);
  DETTRIAL_INLINE static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param,
                                                                const std::string& what);
};

/// Python's name of an `adjust_lr_fn` ("original", ...), and back; nullopt for a name Python refuses.
DETTRIAL_INLINE const char* muon_adjustment_name(MuonLrAdjustment adjustment);
DETTRIAL_INLINE std::optional<MuonLrAdjustment> muon_adjustment_named(const std::string& name);

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cmath>

namespace dettrial::optim {

DETTRIAL_INLINE const char* muon_adjustment_name(MuonLrAdjustment adjustment) {
  switch (adjustment) {
    case MuonLrAdjustment::match_rms_adamw: return "match_rms_adamw";
    case MuonLrAdjustment::spectral_unclamped: return "spectral_unclamped";
    case MuonLrAdjustment::original: break;
  }
  return "original";
}

DETTRIAL_INLINE std::optional<MuonLrAdjustment> muon_adjustment_named(const std::string& name) {
  for (const auto a : {MuonLrAdjustment::original, MuonLrAdjustment::match_rms_adamw, MuonLrAdjustment::spectral_unclamped})
    if (name == muon_adjustment_name(a)) return a;
  return std::nullopt;
}

// The archive keeps the adjustment as a count: -1 for None, else the enumerator.
DETTRIAL_INLINE void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_coefficients);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ns_steps);
  archive.write("adjust_lr_fn", c10::IValue(adjust_lr_fn() ? static_cast<std::int64_t>(*adjust_lr_fn()) : std::int64_t{-1}));
}

DETTRIAL_INLINE void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(coefficients_t, ns_coefficients);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, ns_steps);
  c10::IValue adjustment;
  archive.read("adjust_lr_fn", adjustment);
  const std::int64_t value = adjustment.toInt();
  if (value < -1 || value > static_cast<std::int64_t>(MuonLrAdjustment::spectral_unclamped))
    throw CheckpointError("Muon's adjust_lr_fn in the archive is " + std::to_string(value) + ", which no dettrial writes");
  if (value < 0) adjust_lr_fn(std::nullopt);
  else adjust_lr_fn(static_cast<MuonLrAdjustment>(value));
}

DETTRIAL_INLINE void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

DETTRIAL_INLINE void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

// Python's checks (torch.optim.Muon.__init__, and _zeropower_via_newtonschulz's, made at the start).
DETTRIAL_INLINE void MuonUpdate::check(const MuonOptions& o, const std::string& where) {
  const auto invalid = [&](const char* option, double value, const char* rule) { invalid_option(name, where, option, value, rule); };
  if (!(o.lr() >= 0)) invalid("lr", o.lr(), "at least 0");
  if (!(o.momentum() >= 0)) invalid("momentum", o.momentum(), "at least 0");
  if (!(o.weight_decay() >= 0)) invalid("weight_decay", o.weight_decay(), "at least 0");
  if (!(o.ns_steps() >= 0 && o.ns_steps() < 100)) invalid("ns_steps", static_cast<double>(o.ns_steps()), "in [0, 100)");
}

DETTRIAL_INLINE void MuonUpdate::check_param(const torch::Tensor& p, const std::string& where) {
  if (p.dim() != 2)
    throw ConfigError("dettrial::optim::Muon: " + where + " has " + std::to_string(p.dim()) +
                      " dimension(s); Muon steps matrices only: give biases, norms and embeddings to another optimizer (AdamW)");
  if (p.is_complex()) throw ConfigError("dettrial::optim::Muon: " + where + " is complex, which Muon does not step");
}

DETTRIAL_INLINE std::unique_ptr<MuonParamState> MuonUpdate::fresh(const torch::Tensor& p) {
  auto state = std::make_unique<MuonParamState>();
  state->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  return state;
}

DETTRIAL_INLINE torch::Tensor muon_orthogonalize(const torch::Tensor& grad, const MuonOptions::coefficients_t& coefficients,
                                                 std::int64_t steps, double eps) {
  const auto [a, b, c] = coefficients;
  const bool tall = grad.size(0) > grad.size(1);
  torch::Tensor x = grad.to(torch::kBFloat16, /*non_blocking=*/false, /*copy=*/true);
  if (tall) x = x.t();
  x.div_(torch::clamp(x.norm(), eps));
  for (std::int64_t i = 0; i < steps; ++i) {
    const torch::Tensor gram = torch::matmul(x, x.t());
    const torch::Tensor gram_update = torch::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = torch::addmm(x, gram_update, x, /*beta=*/a);
  }
  return tall ? x.t() : x;
}

DETTRIAL_INLINE double muon_adjusted_lr(double lr, const std::optional<MuonLrAdjustment>& adjustment, std::int64_t rows,
                                        std::int64_t cols) {
  const auto a = static_cast<double>(rows), b = static_cast<double>(cols);
  switch (adjustment.value_or(MuonLrAdjustment::original)) {
    case MuonLrAdjustment::match_rms_adamw: return lr * (0.2 * std::sqrt(std::max(a, b)));
    case MuonLrAdjustment::spectral_unclamped: return lr * std::sqrt(a / b);
    case MuonLrAdjustment::original: break;
  }
  return lr * std::sqrt(std::max(1.0, a / b));
}

DETTRIAL_INLINE void MuonUpdate::update(torch::Tensor& param, torch::Tensor grad, MuonParamState& state, const MuonOptions& o) {
  torch::Tensor buf = state.momentum_buffer();
  buf.lerp_(grad, 1 - o.momentum());
  torch::Tensor update = o.nesterov() ? grad.lerp(buf, o.momentum()) : buf;
  update = muon_orthogonalize(update, o.ns_coefficients(), o.ns_steps(), o.eps());
  const double adjusted_lr = muon_adjusted_lr(o.lr(), o.adjust_lr_fn(), param.size(0), param.size(1));
  param.mul_(1 - o.lr() * o.weight_decay());
  param.add_(update, -adjusted_lr);
}

DETTRIAL_INLINE void python_layout<Muon>::write_state(const state_type& s, StateDict& out) {
  python::put(out, "momentum_buffer", s.momentum_buffer());
}

DETTRIAL_INLINE auto python_layout<Muon>::read_state(const StateDict& e, const torch::Tensor& p, const std::string& what)
    -> std::unique_ptr<state_type> {
  auto s = std::make_unique<state_type>();
  s->momentum_buffer(python::tensor(e, "momentum_buffer", p, what));
  if (!s->momentum_buffer().defined()) throw CheckpointError(what + " lacks momentum_buffer (Muon's)");
  return s;
}

DETTRIAL_INLINE void python_layout<Muon>::write_options(const options_type& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("weight_decay", o.weight_decay());
  out.insert("momentum", o.momentum());
  out.insert("nesterov", o.nesterov());
  const auto [a, b, c] = o.ns_coefficients();
  out.insert("ns_coefficients", c10::ivalue::Tuple::create({a, b, c}));
  out.insert("eps", o.eps());
  out.insert("ns_steps", o.ns_steps());
  out.insert("adjust_lr_fn", o.adjust_lr_fn() ? c10::IValue(std::string(muon_adjustment_name(*o.adjust_lr_fn()))) : c10::IValue());
}

DETTRIAL_INLINE void python_layout<Muon>::read_option(options_type& o, const std::string& k, const c10::IValue& v,
                                                      const std::string& what) {
  if (k == "lr") o.lr(python::number(v, what));
  else if (k == "weight_decay") o.weight_decay(python::number(v, what));
  else if (k == "momentum") o.momentum(python::number(v, what));
  else if (k == "nesterov") o.nesterov(python::number(v, what) != 0);
  else if (k == "eps") o.eps(python::number(v, what));
  else if (k == "ns_steps") o.ns_steps(python::count(v, what, 0));
  else if (k == "ns_coefficients") {
    const auto c = python::numbers(v, what);
    if (c.size() != 3) throw CheckpointError(what + " holds " + std::to_string(c.size()) + " numbers, not Muon's 3");
    o.ns_coefficients({c[0], c[1], c[2]});
  } else if (k == "adjust_lr_fn") {
    if (v.isNone()) return o.adjust_lr_fn(std::nullopt), void();
    const auto adjustment = v.isString() ? muon_adjustment_named(v.toStringRef()) : std::nullopt;
    if (!adjustment)
      throw CheckpointError(what + " is " + (v.isString() ? "'" + v.toStringRef() + "'" : std::string("not a name")) +
                            ", not one of None, 'original', 'match_rms_adamw', 'spectral_unclamped'");
    o.adjust_lr_fn(adjustment);
  }
}

}  // namespace dettrial::optim

namespace dettrial::detail {
inline const bool muon_layout_registered = optim::register_python_layout<optim::Muon>();
}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
