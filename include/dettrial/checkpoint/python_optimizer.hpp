// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An optimizer's state from Python's layout (`optimizer.state_dict()`, as Determined's and
/// dettrial's `state_dict.pth` hold it) into LibTorch's optimizers and dettrial's fused ones: the
/// groups' options and every parameter's state, checked before anything is changed.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <torch/torch.h>

#include "../vocabulary/checkpoint.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief Loads Python's `optimizer.state_dict()` into `optimizer`, as Python's `load_state_dict`
 * does: the groups' options (learning rate, momentum, betas, ...) are the file's, and each
 * parameter's state (SGD's momentum buffer; Adam's and AdamW's `step`, `exp_avg`, `exp_avg_sq` and,
 * with amsgrad, `max_exp_avg_sq`; RMSprop's, Adagrad's and Adadelta's) is set from it.
 *
 * Checked first, nothing changed on a mismatch: the number of groups and of parameters in each,
 * every state tensor's shape against its parameter's, that each group's options are the optimizer's
 * own (an Adam state dict does not load into SGD: the error names the group and the option), and
 * that the file asks for nothing LibTorch's optimizers lack (`maximize: True`). CheckpointError
 * names `what` (the file and optimizer).
 */
DETTRIAL_INLINE void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state, const std::string& what);

/// Whether Python's layout (optimizer_state_dict) holds all of `optimizer`'s state, so that
/// load_optimizer_state_dict restores it exactly: every group's options and every parameter's state
/// of a type it reads (SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, and the fused ones).
DETTRIAL_INLINE bool python_layout_holds(torch::optim::Optimizer& optimizer);

}  // namespace dettrial

namespace dettrial::detail::python_optimizer {

/// One optimizer type: the options it has (beyond those every optimizer carries), how to set them
/// and how to make a parameter's state from the file's entries.
struct Kind {
  const char* name;
  std::set<std::string> options;
  /// Flags Python's optimizers carry that change the update, with the one value LibTorch's type
  /// computes: another value in the file is refused, never trained on as something else (an AdamW
  /// checkpoint resumed into Adam would otherwise step as Adam with L2 weight decay).
  std::map<std::string, bool> fixed_flags;
  std::function<void(torch::optim::OptimizerOptions&, const std::string& key, const c10::IValue& value, const std::string& what)> set;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const StateDict& entries, const torch::Tensor& param,
                                                                   const std::string& what)>
      make_state;
};

/// The kind of `options`' optimizer; `name` is null for one whose state dettrial does not write in
/// Python's layout.
DETTRIAL_INLINE Kind kind_of(torch::optim::OptimizerOptions& options);

}  // namespace dettrial::detail::python_optimizer

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../optim/adadelta.hpp"
#include "../optim/adam_family.hpp"
#include "../optim/fused.hpp"
#include "../optim/handles.hpp"
#include "../optim/muon.hpp"
#include "../optim/schedulers.hpp"
#include "state_dict.hpp"

namespace dettrial::detail::python_optimizer {

using optim::detail::python_state::python_number;  // schedulers' reader of Python's numbers

/// Options Python's optimizers carry that change nothing in LibTorch's arithmetic (how the update
/// is computed, not what it is), and the entries Python's schedulers keep in the groups (initial_lr;
/// OneCycleLR's max_lr and min_lr; its and CyclicLR's max_momentum and base_momentum; SWALR's
/// swa_lr), which the schedulers read themselves.
inline const std::set<std::string>& ignored_options() {
  static const std::set<std::string> keys = {"params", "foreach", "differentiable", "fused",         "capturable", "initial_lr",
                                             "max_lr", "min_lr",  "max_momentum",   "base_momentum", "swa_lr"};
  return keys;
}

/// Why a fixed flag's other value is another update, for the refusal's sentence.
inline std::string fixed_flag_reason(const std::string& key, bool value) {
  if (key == "decoupled_weight_decay")
    return value ? " (that is AdamW's decoupled weight decay: the trial's optimizer must be torch::optim::AdamW)"
                 : " (that is Adam's L2 weight decay: the trial's optimizer must be torch::optim::Adam)";
  return "";
}

/// A state entry as a tensor shaped like `param` (on its device), or undefined when absent.
inline torch::Tensor tensor_entry(const StateDict& entries, const char* key, const torch::Tensor& param, const std::string& what) {
  const auto it = entries.find(key);
  if (it == entries.end() || it->value().isNone()) return {};
  if (!it->value().isTensor()) throw CheckpointError(what + ": '" + key + "' is not a tensor");
  const torch::Tensor t = it->value().toTensor();
  if (t.sizes() != param.sizes())
    throw CheckpointError(what + ": '" + key + "' has shape " + detail::shape_text(t.sizes()) + " but the parameter " +
                          detail::shape_text(param.sizes()));
  return t.to(param.device(), param.scalar_type()).clone();
}

inline std::int64_t step_entry(const StateDict& entries, const std::string& what) {
  const auto it = entries.find("step");
  return it == entries.end() ? 0 : static_cast<std::int64_t>(python_number(it->value(), what + ": 'step'"));
}

template <class Options>
void set_adam(Options& o, const std::string& key, const c10::IValue& v, const std::string& what) {
  if (key == "lr") o.lr(python_number(v, what));
  else if (key == "eps") o.eps(python_number(v, what));
  else if (key == "weight_decay") o.weight_decay(python_number(v, what));
  else if (key == "amsgrad") o.amsgrad(python_number(v, what) != 0);
  else if (key == "betas") {
    if (!v.isTuple() && !v.isList()) throw CheckpointError(what + " is not a pair");
    const auto b = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    if (b.size() != 2) throw CheckpointError(what + " is not a pair");
    o.betas({python_number(b[0], what), python_number(b[1], what)});
  }
}

template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(const StateDict& e, const torch::Tensor& p, const std::string& what) {
  auto s = std::make_unique<State>();
  s->step(step_entry(e, what));
  s->exp_avg(tensor_entry(e, "exp_avg", p, what));
  s->exp_avg_sq(tensor_entry(e, "exp_avg_sq", p, what));
  s->max_exp_avg_sq(tensor_entry(e, "max_exp_avg_sq", p, what));
  if (!s->exp_avg().defined() || !s->exp_avg_sq().defined()) throw CheckpointError(what + " lacks exp_avg or exp_avg_sq");
  return s;
}

inline Kind sgd_kind() {
  using namespace torch::optim;
  return {"SGD",
          {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<SGDOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "momentum") o.momentum(python_number(v, what));
            else if (k == "dampening") o.dampening(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "nesterov") o.nesterov(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<SGDParamState>();
            s->momentum_buffer(tensor_entry(e, "momentum_buffer", p, what));
            return s;
          }};
}

inline Kind adam_kind() {
  using namespace torch::optim;
  return {"Adam",
          {"lr", "betas", "eps", "weight_decay", "amsgrad"},
          {{"maximize", false}, {"decoupled_weight_decay", false}},
          [](OptimizerOptions& o, const std::string& k, const c10::IValue& v, const std::string& what) {
            set_adam(static_cast<AdamOptions&>(o), k, v, what);
          },
          adam_state<AdamParamState>};
}

inline Kind adamw_kind() {
  using namespace torch::optim;
  return {"AdamW",
          {"lr", "betas", "eps", "weight_decay", "amsgrad"},
          {{"maximize", false}, {"decoupled_weight_decay", true}},
          [](OptimizerOptions& o, const std::string& k, const c10::IValue& v, const std::string& what) {
            set_adam(static_cast<AdamWOptions&>(o), k, v, what);
          },
          adam_state<AdamWParamState>};
}

inline Kind rmsprop_kind() {
  using namespace torch::optim;
  return {"RMSprop",
          {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<RMSpropOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "alpha") o.alpha(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "momentum") o.momentum(python_number(v, what));
            else if (k == "centered") o.centered(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<RMSpropParamState>();
            s->step(step_entry(e, what));
            s->square_avg(tensor_entry(e, "square_avg", p, what));
            s->momentum_buffer(tensor_entry(e, "momentum_buffer", p, what));
            s->grad_avg(tensor_entry(e, "grad_avg", p, what));
            return s;
          }};
}

inline Kind adagrad_kind() {
  using namespace torch::optim;
  return {"Adagrad",
          {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<AdagradOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "lr_decay") o.lr_decay(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
            else if (k == "initial_accumulator_value") o.initial_accumulator_value(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<AdagradParamState>();
            s->step(step_entry(e, what));
            s->sum(tensor_entry(e, "sum", p, what));
            return s;
          }};
}

inline Kind adadelta_kind() {
  using namespace torch::optim;
  return {"Adadelta",
          {"lr", "rho", "eps", "weight_decay"},
          {{"maximize", false}},
          [](OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<optim::AdadeltaOptions&>(base);
            if (k == "lr") o.lr(python_number(v, what));
            else if (k == "rho") o.rho(python_number(v, what));
            else if (k == "eps") o.eps(python_number(v, what));
            else if (k == "weight_decay") o.weight_decay(python_number(v, what));
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<OptimizerParamState> {
            auto s = std::make_unique<optim::AdadeltaParamState>();
            s->step(step_entry(e, what));
            s->square_avg(tensor_entry(e, "square_avg", p, what));
            s->acc_delta(tensor_entry(e, "acc_delta", p, what));
            return s;
          }};
}

/// The options every member of Adam's family dettrial adds reads, and its own ones.
template <class Options>
bool set_adam_family(Options& o, const std::string& k, const c10::IValue& v, const std::string& what) {
  if (k == "lr") o.lr(python_number(v, what));
  else if (k == "eps") o.eps(python_number(v, what));
  else if (k == "weight_decay") o.weight_decay(python_number(v, what));
  else if (k == "maximize") o.maximize(python_number(v, what) != 0);
  else if (k == "betas") {
    if (!v.isTuple() && !v.isList()) throw CheckpointError(what + " is not a pair");
    const auto b = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    if (b.size() != 2) throw CheckpointError(what + " is not a pair");
    o.betas({python_number(b[0], what), python_number(b[1], what)});
  } else {
    return false;
  }
  return true;
}

/// The state of a parameter of NAdam, RAdam or Adamax from Python's entries.
inline std::unique_ptr<torch::optim::OptimizerParamState> adam_family_state(const StateDict& e, const torch::Tensor& p, const char* second,
                                                                            bool mu_product, const std::string& what) {
  auto s = std::make_unique<optim::AdamFamilyParamState>();
  s->step(step_entry(e, what));
  s->exp_avg(tensor_entry(e, "exp_avg", p, what));
  s->second(tensor_entry(e, second, p, what));
  s->infinity_norm(std::string(second) == "exp_inf");
  if (!s->exp_avg().defined() || !s->second().defined()) throw CheckpointError(what + " lacks exp_avg or " + second);
  if (mu_product) {
    const auto it = e.find("mu_product");
    if (it == e.end()) throw CheckpointError(what + " lacks mu_product (NAdam's)");
    s->mu_product(torch::scalar_tensor(python_number(it->value(), what + ": 'mu_product'"), torch::kFloat));
  }
  return s;
}

inline Kind nadam_kind() {
  return {"NAdam",
          {"lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "maximize"},
          {},
          [](torch::optim::OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<optim::NAdamOptions&>(base);
            if (set_adam_family(o, k, v, what)) return;
            if (k == "momentum_decay") o.momentum_decay(python_number(v, what));
            else if (k == "decoupled_weight_decay") o.decoupled_weight_decay(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) {
            return adam_family_state(e, p, "exp_avg_sq", true, what);
          }};
}

inline Kind radam_kind() {
  return {"RAdam",
          {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize"},
          {},
          [](torch::optim::OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            auto& o = static_cast<optim::RAdamOptions&>(base);
            if (set_adam_family(o, k, v, what)) return;
            if (k == "decoupled_weight_decay") o.decoupled_weight_decay(python_number(v, what) != 0);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) {
            return adam_family_state(e, p, "exp_avg_sq", false, what);
          }};
}

inline Kind adamax_kind() {
  return {
      "Adamax",
      {"lr", "betas", "eps", "weight_decay", "maximize"},
      {},
      [](torch::optim::OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
        set_adam_family(static_cast<optim::AdamaxOptions&>(base), k, v, what);
      },
      [](const StateDict& e, const torch::Tensor& p, const std::string& what) { return adam_family_state(e, p, "exp_inf", false, what); }};
}

/// Muon's options: ns_coefficients a triple, adjust_lr_fn None or one of Python's names.
inline void set_muon(optim::MuonOptions& o, const std::string& k, const c10::IValue& v, const std::string& what) {
  if (k == "lr") o.lr(python_number(v, what));
  else if (k == "weight_decay") o.weight_decay(python_number(v, what));
  else if (k == "momentum") o.momentum(python_number(v, what));
  else if (k == "nesterov") o.nesterov(python_number(v, what) != 0);
  else if (k == "eps") o.eps(python_number(v, what));
  else if (k == "ns_steps") o.ns_steps(optim::detail::python_state::python_count(v, what, 0));
  else if (k == "ns_coefficients") {
    const auto c = optim::detail::python_state::python_numbers(v, what);
    if (c.size() != 3) throw CheckpointError(what + " holds " + std::to_string(c.size()) + " numbers, not Muon's 3");
    o.ns_coefficients({c[0], c[1], c[2]});
  } else if (k == "adjust_lr_fn") {
    if (v.isNone()) return o.adjust_lr_fn(std::nullopt), void();
    const auto adjustment = v.isString() ? optim::muon_adjustment_named(v.toStringRef()) : std::nullopt;
    if (!adjustment)
      throw CheckpointError(what + " is " + (v.isString() ? "'" + v.toStringRef() + "'" : std::string("not a name")) +
                            ", not one of None, 'original', 'match_rms_adamw', 'spectral_unclamped'");
    o.adjust_lr_fn(adjustment);
  }
}

inline Kind muon_kind() {
  return {"Muon",
          {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"},
          {},
          [](torch::optim::OptimizerOptions& base, const std::string& k, const c10::IValue& v, const std::string& what) {
            set_muon(static_cast<optim::MuonOptions&>(base), k, v, what);
          },
          [](const StateDict& e, const torch::Tensor& p, const std::string& what) -> std::unique_ptr<torch::optim::OptimizerParamState> {
            auto s = std::make_unique<optim::MuonParamState>();
            s->momentum_buffer(tensor_entry(e, "momentum_buffer", p, what));
            if (!s->momentum_buffer().defined()) throw CheckpointError(what + " lacks momentum_buffer (Muon's)");
            return s;
          }};
}

DETTRIAL_INLINE Kind kind_of(torch::optim::OptimizerOptions& options) {
  using namespace torch::optim;
  if (dynamic_cast<SGDOptions*>(&options)) return sgd_kind();
  if (dynamic_cast<AdamOptions*>(&options)) return adam_kind();
  if (dynamic_cast<AdamWOptions*>(&options)) return adamw_kind();
  if (dynamic_cast<RMSpropOptions*>(&options)) return rmsprop_kind();
  if (dynamic_cast<AdagradOptions*>(&options)) return adagrad_kind();
  if (dynamic_cast<optim::AdadeltaOptions*>(&options)) return adadelta_kind();
  if (dynamic_cast<optim::NAdamOptions*>(&options)) return nadam_kind();
  if (dynamic_cast<optim::RAdamOptions*>(&options)) return radam_kind();
  if (dynamic_cast<optim::AdamaxOptions*>(&options)) return adamax_kind();
  if (dynamic_cast<optim::MuonOptions*>(&options)) return muon_kind();
  return {nullptr, {}, {}, {}, {}};
}

/// Checks one group's options against the optimizer's kind before any is set.
inline void check_group_options(const StateDict& group, const Kind& kind, const std::string& what) {
  for (const auto& entry : group) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (const auto fixed = kind.fixed_flags.find(key); fixed != kind.fixed_flags.end()) {
      const bool value = detail::python_optimizer::python_number(entry.value(), what + ": '" + key + "'") != 0;
      if (value != fixed->second)
        throw CheckpointError(what + " has " + key + ": " + (value ? "True" : "False") + ", which LibTorch's " + kind.name +
                              " does not do" + fixed_flag_reason(key, value));
      continue;
    }
    if (!kind.options.count(key) && !ignored_options().count(key))
      throw CheckpointError(what + " has option '" + key + "', which " + kind.name +
                            " does not have: the checkpoint's optimizer is another type than the trial's");
  }
}

}  // namespace dettrial::detail::python_optimizer

namespace dettrial {
DETTRIAL_INLINE void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state, const std::string& what) {
  namespace pd = detail::python_optimizer;
  const auto groups_it = state.find("param_groups");
  const auto state_it = state.find("state");
  if (groups_it == state.end() || !groups_it->value().isList() || state_it == state.end() || !state_it->value().isGenericDict())
    throw CheckpointError(what + " is not an optimizer's state dict (it needs 'state' and 'param_groups')");
  const auto groups = groups_it->value().toList();
  const StateDict per_param = state_it->value().toGenericDict();
  auto& param_groups = optimizer.param_groups();
  if (groups.size() != param_groups.size())
    throw CheckpointError(what + " has " + std::to_string(groups.size()) + " parameter group(s), but the trial's optimizer " +
                          std::to_string(param_groups.size()));
  // Check everything, and build every parameter's state, before changing the optimizer.
  using StateMap = std::remove_cvref_t<decltype(optimizer.state())>;
  std::vector<std::pair<typename StateMap::key_type, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  std::vector<pd::Kind> kinds;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group_what = what + ", group " + std::to_string(g);
    if (!groups.get(g).isGenericDict()) throw CheckpointError(group_what + " is not a dict");
    const StateDict group = groups.get(g).toGenericDict();
    pd::Kind kind = pd::kind_of(param_groups[g].options());
    if (!kind.name)
      throw CheckpointError(what +
                            ": the trial's optimizer is not one whose Python state dettrial reads (SGD, Adam, AdamW, RMSprop, "
                            "Adagrad, Adadelta, NAdam, RAdam, Adamax, Muon)");
    pd::check_group_options(group, kind, group_what);
    const auto params_it = group.find("params");
    if (params_it == group.end() || !params_it->value().isList()) throw CheckpointError(group_what + " lists no params");
    const auto ids = params_it->value().toList();
    const auto& params = param_groups[g].params();
    if (ids.size() != params.size())
      throw CheckpointError(group_what + " has " + std::to_string(ids.size()) + " parameters, but the trial's optimizer " +
                            std::to_string(params.size()) + ": is it from another network?");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto entry = per_param.find(ids.get(i));
      if (entry == per_param.end()) continue;  // no step taken for it yet
      if (!entry->value().isGenericDict()) throw CheckpointError(group_what + ", parameter " + std::to_string(i) + ": state is not a dict");
      states.emplace_back(detail::optimizer_state_key<StateMap>(params[i]),
                          kind.make_state(entry->value().toGenericDict(), params[i], group_what + ", parameter " + std::to_string(i)));
    }
    kinds.push_back(std::move(kind));
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const StateDict group = groups.get(g).toGenericDict();
    for (const auto& entry : group)
      kinds[g].set(param_groups[g].options(), entry.key().toStringRef(), entry.value(),
                   what + ", group " + std::to_string(g) + ", option '" + entry.key().toStringRef() + "'");
  }
  auto& map = optimizer.state();
  map.clear();
  for (auto& [key, s] : states) map[key] = std::move(s);
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) {
    capturable->push_device_state();
    capturable->sync_learning_rates(optimizer.param_groups());
  }
}

DETTRIAL_INLINE bool python_layout_holds(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups())
    if (!detail::python_optimizer::kind_of(group.options()).name) return false;
  for (const auto& [key, state] : optimizer.state()) {
    c10::impl::GenericDict scratch(c10::StringType::get(), c10::AnyType::get());
    if (!detail::python_param_state(*state, scratch)) return false;
  }
  return true;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
