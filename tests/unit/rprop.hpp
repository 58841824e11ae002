// A trial's own optimizer, one dettrial does not know: Python's Rprop (`torch.optim.Rprop`) written
// on LibTorch's Optimizer as a user would write it, with its Python layout declared beside it. The
// tests checkpoint it, resume it and load it into Python's torch.optim.Rprop, with no line about it
// in dettrial's checkpoint code.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace test {

/// Python's defaults: `Rprop(params, lr=0.01, etas=(0.5, 1.2), step_sizes=(1e-6, 50))`.
struct RpropOptions : torch::optim::OptimizerCloneableOptions<RpropOptions> {
  using pair_t = std::tuple<double, double>;   // (a comma would split TORCH_ARG's arguments)
  RpropOptions(double lr = 0.01) : lr_(lr) {}  // NOLINT(google-explicit-constructor): LibTorch's style
  TORCH_ARG(double, lr) = 0.01;
  TORCH_ARG(pair_t, etas) = std::make_tuple(0.5, 1.2);
  TORCH_ARG(pair_t, step_sizes) = std::make_tuple(1e-6, 50.0);

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct RpropParamState : torch::optim::OptimizerCloneableParamState<RpropParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, prev);
  TORCH_ARG(torch::Tensor, step_size);
};

/// Python's `_single_tensor_rprop`, operation for operation.
class Rprop : public torch::optim::Optimizer {
 public:
  explicit Rprop(const std::vector<torch::Tensor>& params, RpropOptions defaults = {})
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(params)}, std::make_unique<RpropOptions>(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode enable_grad(true);
      loss = closure();
    }
    using StateMap = std::remove_cvref_t<decltype(state())>;
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const RpropOptions&>(group.options());
      const auto [etaminus, etaplus] = o.etas();
      const auto [smallest, largest] = o.step_sizes();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        torch::Tensor grad = p.grad();
        auto& slot = state()[dettrial::detail::optimizer_state_key<StateMap>(p)];
        if (!slot) {
          auto fresh = std::make_unique<RpropParamState>();
          fresh->prev(torch::zeros_like(p));
          fresh->step_size(torch::full_like(grad, o.lr()));
          slot = std::move(fresh);
        }
        auto& s = static_cast<RpropParamState&>(*slot);
        s.step(s.step() + 1);
        torch::Tensor sign = grad.mul(s.prev()).sign();
        sign.masked_fill_(sign.gt(0), etaplus);
        sign.masked_fill_(sign.lt(0), etaminus);
        sign.masked_fill_(sign.eq(0), 1);
        s.step_size().mul_(sign).clamp_(smallest, largest);
        grad = grad.clone();
        grad.masked_fill_(sign.eq(etaminus), 0);
        p.addcmul_(grad.sign(), s.step_size(), -1);
        s.prev().copy_(grad);
      }
    }
    return loss;
  }
};

}  // namespace test

/// Rprop's layout, beside it: Python's `Rprop.state_dict()` keeps each parameter's `step` (a float32
/// 0-dim tensor), `prev` and `step_size`, and each group's lr, etas, step_sizes, foreach, maximize,
/// differentiable and capturable.
template <>
struct dettrial::optim::python_layout<test::Rprop> {
  using options_type = test::RpropOptions;
  using state_type = test::RpropParamState;
  static constexpr std::string_view name = "Rprop";
  static constexpr bool elementwise = true;
  static std::set<std::string> options() { return {"lr", "etas", "step_sizes"}; }
  static std::map<std::string, bool> fixed_flags() { return {{"maximize", false}}; }
  static void write_options(const options_type& o, StateDict& out) {
    out.insert("lr", o.lr());
    out.insert("etas", c10::ivalue::Tuple::create({std::get<0>(o.etas()), std::get<1>(o.etas())}));
    out.insert("step_sizes", c10::ivalue::Tuple::create({std::get<0>(o.step_sizes()), std::get<1>(o.step_sizes())}));
    out.insert("foreach", c10::IValue());
    out.insert("maximize", false);
    out.insert("differentiable", false);
    out.insert("capturable", false);
  }
  static void read_option(options_type& o, const std::string& key, const c10::IValue& v, const std::string& what) {
    if (key == "lr") o.lr(python::number(v, what));
    else if (key == "etas") o.etas(python::pair(v, what));
    else if (key == "step_sizes") o.step_sizes(python::pair(v, what));
  }
  static void write_state(const state_type& s, StateDict& out) {
    out.insert("step", torch::scalar_tensor(static_cast<double>(s.step()), torch::kFloat));
    python::put(out, "prev", s.prev());
    python::put(out, "step_size", s.step_size());
  }
  static std::unique_ptr<state_type> read_state(const StateDict& e, const torch::Tensor& p, const std::string& what) {
    auto s = std::make_unique<state_type>();
    s->step(python::step(e, what));
    s->prev(python::tensor(e, "prev", p, what));
    s->step_size(python::tensor(e, "step_size", p, what));
    if (!s->prev().defined() || !s->step_size().defined()) throw dettrial::CheckpointError(what + " lacks prev or step_size (Rprop's)");
    return s;
  }
};

namespace test {
inline const bool rprop_layout_registered = dettrial::optim::register_python_layout<Rprop>();
}  // namespace test
