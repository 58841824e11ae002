// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How an optimizer's state is written in Python's layout (`optimizer.state_dict()`) and read
/// back: one trait, `dettrial::optim::python_layout<Optimizer>`, specialized beside each optimizer
/// type, and the readers of Python's values a layout is written with. Checkpoints (`state_dict.pth`,
/// Determined's and dettrial's) and ZeRO's shards find an optimizer's layout here, by the type of its
/// groups' options; they keep no list of optimizers.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <typeindex>
#include <vector>

#include <torch/torch.h>

#include "../vocabulary/checkpoint.hpp"
#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "../detail/text.hpp"

namespace dettrial::optim {

/**
 * @brief Python's layout of optimizer type `Optimizer`: specialize it beside the type, as nlohmann's
 * `adl_serializer` is specialized beside a type it writes, then register it with
 * `register_python_layout<Optimizer>()` (an inline variable beside the specialization) so that an
 * optimizer held as a `torch::optim::Optimizer` finds it too. A specialization has:
 * - `using options_type` and `using state_type`: the optimizer's group options and parameter state;
 * - `static constexpr std::string_view name`: Python's class name (`"SGD"`), for errors;
 * - `static std::set<std::string> options()`: the group options it reads (beyond `params`);
 * - `static void write_options(const options_type&, StateDict& group)` and
 *   `static void read_option(options_type&, const std::string& key, const c10::IValue&, const std::string& what)`;
 * - `static void write_state(const state_type&, StateDict& entries)` and
 *   `static std::unique_ptr<state_type> read_state(const StateDict& entries, const torch::Tensor& param, const std::string& what)`,
 *   which throws CheckpointError naming `what` when the entries do not make a state;
 * and, optionally:
 * - `static std::map<std::string, bool> fixed_flags()`: flags Python's optimizer carries that change
 *   the update, with the one value this type computes (another value in a file is refused);
 * - `static constexpr bool elementwise = true`: each element is updated from its own gradient and
 *   state alone, so ZeRO may cut the parameters apart (false when absent).
 *
 * The helpers in dettrial::optim::python read Python's values with errors that name them.
 */
template <class Optimizer>
struct python_layout;

/// A python_layout specialization with everything the layout needs (see python_layout).
template <class L>
concept PythonOptimizerLayout =
    requires(const typename L::options_type& const_options, typename L::options_type& options, const typename L::state_type& state,
             StateDict& out, const StateDict& entries, const std::string& key, const c10::IValue& value, const torch::Tensor& param) {
      requires std::derived_from<typename L::options_type, torch::optim::OptimizerOptions>;
      requires std::derived_from<typename L::state_type, torch::optim::OptimizerParamState>;
      { L::name } -> std::convertible_to<std::string_view>;
      { L::options() } -> std::convertible_to<std::set<std::string>>;
      L::write_options(const_options, out);
      L::read_option(options, key, value, key);
      L::write_state(state, out);
      { L::read_state(entries, param, key) } -> std::convertible_to<std::unique_ptr<torch::optim::OptimizerParamState>>;
    };

/// One optimizer type's layout with its types erased: what checkpoints and ZeRO's shards call.
struct OptimizerLayout {
  std::string name;
  std::set<std::string> options;
  std::map<std::string, bool> fixed_flags;
  bool elementwise = false;
  void (*write_options)(const torch::optim::OptimizerOptions&, StateDict&) = nullptr;
  void (*read_option)(torch::optim::OptimizerOptions&, const std::string&, const c10::IValue&, const std::string&) = nullptr;
  /// False when the state is not the layout's state type (nothing written).
  bool (*write_state)(const torch::optim::OptimizerParamState&, StateDict&) = nullptr;
  std::unique_ptr<torch::optim::OptimizerParamState> (*read_state)(const StateDict&, const torch::Tensor&, const std::string&) = nullptr;
};

/// `Optimizer`'s layout, erased (made once).
template <class Optimizer>
const OptimizerLayout& erased_python_layout() {
  using L = python_layout<Optimizer>;
  static_assert(PythonOptimizerLayout<L>,
                "dettrial::optim::python_layout<Optimizer> must have options_type, state_type, name, options(), write_options, "
                "read_option, write_state and read_state (see dettrial::optim::python_layout)");
  using Options = typename L::options_type;
  using State = typename L::state_type;
  static const OptimizerLayout layout = [] {
    OptimizerLayout l;
    l.name = std::string(L::name);
    l.options = L::options();
    if constexpr (requires { L::fixed_flags(); }) l.fixed_flags = L::fixed_flags();
    if constexpr (requires { L::elementwise; }) l.elementwise = L::elementwise;
    l.write_options = [](const torch::optim::OptimizerOptions& o, StateDict& out) {
      L::write_options(static_cast<const Options&>(o), out);
    };
    l.read_option = [](torch::optim::OptimizerOptions& o, const std::string& key, const c10::IValue& v, const std::string& what) {
      L::read_option(static_cast<Options&>(o), key, v, what);
    };
    l.write_state = [](const torch::optim::OptimizerParamState& s, StateDict& out) {
      const auto* state = dynamic_cast<const State*>(&s);
      if (state) L::write_state(*state, out);
      return state != nullptr;
    };
    l.read_state = [](const StateDict& entries, const torch::Tensor& param, const std::string& what) {
      return std::unique_ptr<torch::optim::OptimizerParamState>(L::read_state(entries, param, what));
    };
    return l;
  }();
  return layout;
}

/// Adds `layout` for the optimizers whose groups' options are of type `options`; a second layout
/// for the same options type replaces none (the first registered stays).
DETTRIAL_INLINE void add_python_layout(std::type_index options, const OptimizerLayout& layout);

/// Registers python_layout<Optimizer> (see python_layout); returns true, for an inline variable's initializer.
template <class Optimizer>
bool register_python_layout() {
  add_python_layout(typeid(typename python_layout<Optimizer>::options_type), erased_python_layout<Optimizer>());
  return true;
}

/// The layout of the optimizer a group with `options` belongs to, or null for an optimizer without one.
DETTRIAL_INLINE const OptimizerLayout* python_layout_of(const torch::optim::OptimizerOptions& options);

/// The layout of `optimizer` when every group has the same one, else null.
DETTRIAL_INLINE const OptimizerLayout* python_layout_of(const torch::optim::Optimizer& optimizer);

}  // namespace dettrial::optim

/// The readers of Python's values a layout (and a scheduler's Python state) is written with: each
/// throws CheckpointError naming `what`.
namespace dettrial::optim::python {
/// A number: Python writes counts as numbers or as 0-dim tensors, flags as bools.
DETTRIAL_INLINE double number(const c10::IValue& v, const std::string& what);
/// A count (an int, or a float with no fraction), at least `minimum`.
DETTRIAL_INLINE std::int64_t count(const c10::IValue& v, const std::string& what, std::int64_t minimum);
/// A list (or tuple) of numbers.
DETTRIAL_INLINE std::vector<double> numbers(const c10::IValue& v, const std::string& what);
/// A Python list of numbers: typed Any, as Python's weights-only loader wants lists.
DETTRIAL_INLINE c10::impl::GenericList list(const std::vector<double>& values);
/// A pair of numbers (Adam's `betas`).
DETTRIAL_INLINE std::tuple<double, double> pair(const c10::IValue& v, const std::string& what);
/// State entry `key` as a tensor shaped like `param` (on its device and of its dtype), or undefined
/// when absent or None.
DETTRIAL_INLINE torch::Tensor tensor(const StateDict& entries, const char* key, const torch::Tensor& param, const std::string& what);
/// The entry `step` as a count (0 when absent).
DETTRIAL_INLINE std::int64_t step(const StateDict& entries, const std::string& what);
/// A step count as Python's SGD-era optimizers (Adam, AdamW, Adagrad) keep it: a float32 scalar
/// tensor, or float64 past 2**24, where float32 would round it (Python's load_state_dict takes either).
DETTRIAL_INLINE c10::IValue step_tensor(double steps);
/// `tensor` detached into `out[key]` when defined.
DETTRIAL_INLINE void put(StateDict& out, const char* key, const torch::Tensor& tensor);

/// The options every optimizer of Adam's family has, as Python's `param_groups[i]` holds them: lr,
/// betas (a tuple), eps, weight_decay.
template <class Options>
void put_betas_options(const Options& o, StateDict& out) {
  out.insert("lr", o.lr());
  out.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
  out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay());
}
}  // namespace dettrial::optim::python

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cmath>
#include <mutex>
#include <unordered_map>

namespace dettrial::detail {
/// The registered layouts, by options type. Written while programs start (the registrations'
/// initializers) and read when checkpoints are written and read: a lock keeps a late registration
/// from racing a reader.
struct PythonLayouts {
  std::mutex mutex;
  std::unordered_map<std::type_index, const optim::OptimizerLayout*> by_options;
};
DETTRIAL_INLINE PythonLayouts& python_layouts() {
  static PythonLayouts layouts;
  return layouts;
}
}  // namespace dettrial::detail

namespace dettrial::optim {

DETTRIAL_INLINE void add_python_layout(std::type_index options, const OptimizerLayout& layout) {
  auto& layouts = detail::python_layouts();
  const std::lock_guard lock(layouts.mutex);
  layouts.by_options.try_emplace(options, &layout);
}

DETTRIAL_INLINE const OptimizerLayout* python_layout_of(const torch::optim::OptimizerOptions& options) {
  auto& layouts = detail::python_layouts();
  const std::lock_guard lock(layouts.mutex);
  const auto it = layouts.by_options.find(typeid(options));
  return it == layouts.by_options.end() ? nullptr : it->second;
}

DETTRIAL_INLINE const OptimizerLayout* python_layout_of(const torch::optim::Optimizer& optimizer) {
  const OptimizerLayout* layout = nullptr;
  for (const auto& group : optimizer.param_groups()) {
    const OptimizerLayout* own = python_layout_of(group.options());
    if (!own || (layout && own != layout)) return nullptr;
    layout = own;
  }
  return layout;
}

}  // namespace dettrial::optim

namespace dettrial::optim::python {

DETTRIAL_INLINE double number(const c10::IValue& v, const std::string& what) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  throw CheckpointError(what + " is not a number");
}

DETTRIAL_INLINE std::int64_t count(const c10::IValue& v, const std::string& what, std::int64_t minimum) {
  const double value = number(v, what);
  if (!(value >= static_cast<double>(minimum)) || value != std::floor(value) || value > 9.0e18)
    throw CheckpointError(what + " is " + detail::number_text(value) + ", not a whole number of at least " + std::to_string(minimum));
  return static_cast<std::int64_t>(value);
}

DETTRIAL_INLINE std::vector<double> numbers(const c10::IValue& v, const std::string& what) {
  if (v.isDoubleList()) return v.toDoubleVector();
  if (!v.isList() && !v.isTuple()) throw CheckpointError(what + " is not a list");
  const std::vector<c10::IValue> items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  std::vector<double> out;
  for (const auto& i : items) out.push_back(number(i, what));
  return out;
}

DETTRIAL_INLINE c10::impl::GenericList list(const std::vector<double>& values) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (const double v : values) out.push_back(v);
  return out;
}

DETTRIAL_INLINE std::tuple<double, double> pair(const c10::IValue& v, const std::string& what) {
  if (!v.isTuple() && !v.isList()) throw CheckpointError(what + " is not a pair");
  const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  if (items.size() != 2) throw CheckpointError(what + " is not a pair");
  return {number(items[0], what), number(items[1], what)};
}

DETTRIAL_INLINE torch::Tensor tensor(const StateDict& entries, const char* key, const torch::Tensor& param, const std::string& what) {
  const auto it = entries.find(key);
  if (it == entries.end() || it->value().isNone()) return {};
  if (!it->value().isTensor()) throw CheckpointError(what + ": '" + key + "' is not a tensor");
  const torch::Tensor t = it->value().toTensor();
  if (t.sizes() != param.sizes())
    throw CheckpointError(what + ": '" + key + "' has shape " + c10::str(t.sizes()) + " but the parameter " + c10::str(param.sizes()));
  return t.to(param.device(), param.scalar_type()).clone();
}

DETTRIAL_INLINE std::int64_t step(const StateDict& entries, const std::string& what) {
  const auto it = entries.find("step");
  return it == entries.end() ? 0 : static_cast<std::int64_t>(number(it->value(), what + ": 'step'"));
}

DETTRIAL_INLINE c10::IValue step_tensor(double steps) {
  return torch::tensor(steps, static_cast<double>(static_cast<float>(steps)) == steps ? torch::kFloat32 : torch::kFloat64);
}

DETTRIAL_INLINE void put(StateDict& out, const char* key, const torch::Tensor& tensor) {
  if (tensor.defined()) out.insert(key, tensor.detach());
}

}  // namespace dettrial::optim::python

#endif  // DETTRIAL_HEADER_DEFINITIONS
