// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What every optimizer dettrial adds to LibTorch's shares: a `torch::optim::Optimizer` that
/// checks its groups' options as Python checks them, makes a parameter's state on its first step with
/// a gradient, steps each parameter as Python's `_single_tensor_*` function does, and saves and loads
/// with LibTorch's serialization (the groups' options too, on every LibTorch version).
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../error.hpp"
#include "handles.hpp"
#include "../detail/text.hpp"

namespace dettrial::optim {

/**
 * @brief What an optimizer's arithmetic gives `SingleTensorOptimizer`: its `Options` and per-parameter
 * `State` types, its Python name, Python's checks of the options, a fresh state, and one parameter's
 * step. It may also check each parameter (`check_param`: Muon takes matrices only).
 */
template <class U>
concept SingleTensorUpdate = requires(const typename U::Options& o, const torch::Tensor& p, torch::Tensor& param, typename U::State& state,
                                      const std::string& where) {
  { U::name } -> std::convertible_to<const char*>;
  U::check(o, where);
  { U::fresh(p) } -> std::same_as<std::unique_ptr<typename U::State>>;
  U::update(param, p, state, o);
};

/// Throws Python's refusal of an option as one sentence: "dettrial::optim::NAdam: lr must be at least
/// 0, not -1" (`where` names the parameter group, or is empty for the defaults).
[[noreturn]] inline void invalid_option(const char* optimizer, const std::string& where, const char* name, double value, const char* rule) {
  detail::throw_invalid_argument(std::string("dettrial::optim::") + optimizer, where + name, rule, detail::number_text(value));
}

/**
 * @brief A LibTorch optimizer with Python's arithmetic, one parameter at a time (the path Python's
 * `torch.optim` takes on the CPU; its multi-tensor path does the same operations in the same order).
 * `Update` supplies the arithmetic (see SingleTensorUpdate); a group's own options stand, as in Python.
 */
template <SingleTensorUpdate Update>
class SingleTensorOptimizer : public torch::optim::Optimizer {
 public:
  using Options = typename Update::Options;
  using State = typename Update::State;

  explicit SingleTensorOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults = {})
      : torch::optim::Optimizer(param_groups, std::make_unique<Options>(defaults)) {
    Update::check(defaults, "");
    for (std::size_t i = 0; i < param_groups_.size(); ++i) {
      // LibTorch 2.x merges a group's options with the defaults only for its own optimizers' option
      // types: a group's own options stand, as in Python.
      if (i < param_groups.size() && param_groups[i].has_options()) param_groups_[i].set_options(param_groups[i].options().clone());
      const auto* options = dynamic_cast<const Options*>(&param_groups_[i].options());
      if (!options)
        throw ConfigError(std::string("dettrial::optim::") + Update::name + ": parameter group " + std::to_string(i) +
                          " has another optimizer's options; give it " + Update::name + "Options or none");
      const std::string where = "parameter group " + std::to_string(i) + "'s ";
      Update::check(*options, where);
      if constexpr (requires { Update::check_param(torch::Tensor(), where); }) {
        const auto& params = param_groups_[i].params();
        for (std::size_t j = 0; j < params.size(); ++j) Update::check_param(params[j], where + "parameter " + std::to_string(j));
      }
    }
  }
  explicit SingleTensorOptimizer(std::vector<torch::Tensor> params, Options defaults = {})
      : SingleTensorOptimizer(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
                              std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    using StateMap = std::remove_cvref_t<decltype(state_)>;
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const Options&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        if (p.grad().is_sparse()) throw TrialError(std::string("dettrial::optim::") + Update::name + " does not support sparse gradients");
        auto& slot = state_[detail::optimizer_state_key<StateMap>(p)];
        if (!slot) slot = Update::fresh(p);
        auto& state = static_cast<State&>(*slot);
        if constexpr (requires { state.step(state.step() + 1); }) state.step(state.step() + 1);
        if constexpr (requires { options.maximize(); }) Update::update(p, options.maximize() ? -p.grad() : p.grad(), state, options);
        else Update::update(p, p.grad(), state, options);
      }
    }
    return loss;
  }
  void save(torch::serialize::OutputArchive& archive) const override { torch::optim::serialize<State, Options>(archive, *this); }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<State, Options>(archive, *this);
    // LibTorch 1.x restores the per-parameter state only: the groups' options (learning rates a
    // scheduler changed) are read back here, on every version.
    torch::serialize::InputArchive groups;
    archive.read("param_groups", groups);
    for (std::size_t i = 0; i < param_groups_.size(); ++i) {
      torch::serialize::InputArchive group, options;
      groups.read("param_groups/" + std::to_string(i), group);
      group.read("options", options);
      static_cast<Options&>(param_groups_[i].options()).serialize(options);
    }
  }
};

}  // namespace dettrial::optim
