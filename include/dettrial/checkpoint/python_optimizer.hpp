// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An optimizer's state from Python's layout (`optimizer.state_dict()`, as Determined's and
/// dettrial's `state_dict.pth` hold it) into any optimizer whose type declares that layout
/// (optim::python_layout): the groups' options and every parameter's state, checked before anything
/// is changed.
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
/// load_optimizer_state_dict restores it exactly: its type declares a layout (optim::python_layout)
/// and every parameter's state is of the layout's state type.
DETTRIAL_INLINE bool python_layout_holds(torch::optim::Optimizer& optimizer);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../optim/fused.hpp"
#include "../optim/handles.hpp"
#include "../optim/python_layout.hpp"
#include "state_dict.hpp"

namespace dettrial::detail::python_optimizer {

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

/// Checks one group's options against the optimizer's layout before any is set.
inline void check_group_options(const StateDict& group, const optim::OptimizerLayout& layout, const std::string& what) {
  for (const auto& entry : group) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(not a name)");
    if (const auto fixed = layout.fixed_flags.find(key); fixed != layout.fixed_flags.end()) {
      const bool value = optim::python::number(entry.value(), what + ": '" + key + "'") != 0;
      if (value != fixed->second)
        throw CheckpointError(what + " has " + key + ": " + (value ? "True" : "False") + ", which the trial's " + layout.name +
                              " does not do" + fixed_flag_reason(key, value));
      continue;
    }
    if (!layout.options.count(key) && !ignored_options().count(key))
      throw CheckpointError(what + " has option '" + key + "', which " + layout.name +
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
  std::vector<const optim::OptimizerLayout*> layouts;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group_what = what + ", group " + std::to_string(g);
    if (!groups.get(g).isGenericDict()) throw CheckpointError(group_what + " is not a dict");
    const StateDict group = groups.get(g).toGenericDict();
    const optim::OptimizerLayout* layout = optim::python_layout_of(param_groups[g].options());
    if (!layout)
      throw CheckpointError(what + ": the trial's optimizer (" + c10::demangle(typeid(optimizer).name()) +
                            ") has no Python layout: dettrial reads Python's state of an optimizer whose type declares one "
                            "(dettrial::optim::python_layout: SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, NAdam, RAdam, Adamax, "
                            "Muon, the fused ones and any of a trial's own)");
    pd::check_group_options(group, *layout, group_what);
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
                          layout->read_state(entry->value().toGenericDict(), params[i], group_what + ", parameter " + std::to_string(i)));
    }
    layouts.push_back(layout);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const StateDict group = groups.get(g).toGenericDict();
    for (const auto& entry : group)
      layouts[g]->read_option(param_groups[g].options(), entry.key().toStringRef(), entry.value(),
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
  const optim::OptimizerLayout* layout = optim::python_layout_of(optimizer);
  if (!layout) return false;
  for (const auto& [key, state] : optimizer.state()) {
    c10::impl::GenericDict scratch(c10::StringType::get(), c10::AnyType::get());
    if (!layout->write_state(*state, scratch)) return false;
  }
  return true;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
