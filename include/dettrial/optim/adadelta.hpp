// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Adadelta, which LibTorch lacks: a `torch::optim::Optimizer` with Python's
/// `torch.optim.Adadelta` arithmetic, LibTorch's serialization, and Python's state-dict layout.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "handles.hpp"
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

/**
 * @brief Adadelta (Zeiler 2012) as PyTorch's `torch.optim.Adadelta` computes it, operation for
 * operation (its single-tensor path; the multi-tensor one does the same operations in the same
 * order), so the parameters follow Python's bit for bit on the same device.
 *
 * The state of a parameter is made on its first step with a gradient (as Python's), `save` and `load`
 * work like LibTorch's optimizers (`torch::save(optimizer, ...)`, dettrial's native checkpoints), and
 * `load` restores the groups' options (learning rates) as well, on every LibTorch version.
 * @code{.cpp}
 * dettrial::optim::Adadelta opt(model->parameters(), dettrial::optim::AdadeltaOptions(1.0).rho(0.95));
 * @endcode
 * An invalid option (lr, eps or weight_decay negative, rho outside [0, 1]) is a ConfigError.
 */
class Adadelta : public torch::optim::Optimizer {
 public:
  explicit Adadelta(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdadeltaOptions defaults = {});
  explicit Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Adadelta);
  }
};

/// Writes one parameter's state as Python's `Adadelta.state_dict()["state"][i]` holds it: `step` (a
/// float32 0-dim tensor), `square_avg`, `acc_delta`.
DETTRIAL_INLINE void python_param_state(const AdadeltaParamState& state, c10::impl::GenericDict& out);
/// Writes a group's options as Python's `Adadelta.state_dict()["param_groups"][i]` holds them (less
/// `params`): lr, rho, eps, weight_decay, maximize, capturable, foreach (None), differentiable.
DETTRIAL_INLINE void python_group_options(const AdadeltaOptions& options, c10::impl::GenericDict& out);

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <charconv>

namespace dettrial::detail {

DETTRIAL_INLINE std::string adadelta_number(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

// Python's checks (torch.optim.Adadelta.__init__), as one sentence naming the option and its value.
DETTRIAL_INLINE void check_adadelta_options(const dettrial::optim::AdadeltaOptions& o, const std::string& where) {
  const auto invalid = [&](const char* name, double value, const char* rule) {
    throw ConfigError("dettrial::optim::Adadelta: " + where + name + " must be " + rule + ", not " + adadelta_number(value));
  };
  if (!(o.lr() >= 0)) invalid("lr", o.lr(), "at least 0");
  if (!(o.rho() >= 0 && o.rho() <= 1)) invalid("rho", o.rho(), "in [0, 1]");
  if (!(o.eps() >= 0)) invalid("eps", o.eps(), "at least 0");
  if (!(o.weight_decay() >= 0)) invalid("weight_decay", o.weight_decay(), "at least 0");
}

}  // namespace dettrial::detail

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

DETTRIAL_INLINE Adadelta::Adadelta(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdadeltaOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<AdadeltaOptions>(defaults)) {
  detail::check_adadelta_options(defaults, "");
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    // LibTorch 2.x merges a group's options with the defaults only for its own optimizers' option
    // types; for others it keeps the defaults alone. A group's own options stand, as in Python.
    if (i < param_groups.size() && param_groups[i].has_options()) param_groups_[i].set_options(param_groups[i].options().clone());
    const auto* options = dynamic_cast<const AdadeltaOptions*>(&param_groups_[i].options());
    if (!options)
      throw ConfigError("dettrial::optim::Adadelta: parameter group " + std::to_string(i) +
                        " has another optimizer's options; give it AdadeltaOptions or none");
    detail::check_adadelta_options(*options, "parameter group " + std::to_string(i) + "'s ");
  }
}

DETTRIAL_INLINE Adadelta::Adadelta(std::vector<torch::Tensor> params, AdadeltaOptions defaults)
    : Adadelta(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

DETTRIAL_INLINE torch::Tensor Adadelta::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  using StateMap = std::remove_cvref_t<decltype(state_)>;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdadeltaOptions&>(group.options());
    const double lr = options.lr(), rho = options.rho(), eps = options.eps(), weight_decay = options.weight_decay();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw TrialError("dettrial::optim::Adadelta does not support sparse gradients");
      auto& slot = state_[dettrial::detail::optimizer_state_key<StateMap>(p)];
      if (!slot) {
        auto fresh = std::make_unique<AdadeltaParamState>();
        fresh->step(0);
        fresh->square_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->acc_delta(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdadeltaParamState&>(*slot);
      state.step(state.step() + 1);

      // Python's _single_tensor_adadelta, operation for operation.
      torch::Tensor grad = options.maximize() ? -p.grad() : p.grad();
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
  }
  return loss;
}

DETTRIAL_INLINE void Adadelta::save(torch::serialize::OutputArchive& archive) const { serialize(*this, archive); }

DETTRIAL_INLINE void Adadelta::load(torch::serialize::InputArchive& archive) {
  serialize(*this, archive);
  // LibTorch 1.x restores the per-parameter state only: the groups' options (learning rates a
  // scheduler changed) are read back here, on every version.
  torch::serialize::InputArchive groups;
  archive.read("param_groups", groups);
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    torch::serialize::InputArchive group, options;
    groups.read("param_groups/" + std::to_string(i), group);
    group.read("options", options);
    static_cast<AdadeltaOptions&>(param_groups_[i].options()).serialize(options);
  }
}

DETTRIAL_INLINE void python_param_state(const AdadeltaParamState& state, c10::impl::GenericDict& out) {
  // Python keeps the step as a float32 0-dim tensor on the CPU (not capturable).
  out.insert("step", torch::scalar_tensor(static_cast<double>(state.step()), torch::kFloat));
  if (state.square_avg().defined()) out.insert("square_avg", state.square_avg().detach());
  if (state.acc_delta().defined()) out.insert("acc_delta", state.acc_delta().detach());
}

DETTRIAL_INLINE void python_group_options(const AdadeltaOptions& options, c10::impl::GenericDict& out) {
  out.insert("lr", options.lr());
  out.insert("rho", options.rho());
  out.insert("eps", options.eps());
  out.insert("weight_decay", options.weight_decay());
  out.insert("maximize", options.maximize());
  out.insert("capturable", false);
  out.insert("foreach", c10::IValue());  // None: Python's default (it picks the implementation)
  out.insert("differentiable", false);
}

}  // namespace dettrial::optim
#endif  // DETTRIAL_HEADER_DEFINITIONS
