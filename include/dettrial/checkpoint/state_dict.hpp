// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief State dicts Python can load: models as name-to-tensor maps with Python's names, optimizers
/// in Python's layout, written as a `torch.save` zip archive; and loading a model's state dict back
/// with every name and shape checked before anything is copied.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../vocabulary/checkpoint.hpp"
#include "../error.hpp"
#include "../optim/fused.hpp"
#include "../optim/handles.hpp"
#include "../optim/libtorch_layouts.hpp"
#include "../optim/python_layout.hpp"
#include "../detail/text.hpp"
#include "detail/python_pickle.hpp"
#include "detail/torch_archive.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief `value` as a `torch.save` archive (a zip with `data.pkl` and `data/<n>`). The pickler is
 * told not to tag containers with TorchScript types, so the file uses only the globals Python's
 * weights-only loader allows (`_rebuild_tensor_v2`, the storage types, `OrderedDict`).
 */
DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value);
/// The same archive, passed to `sink` piece by piece as it is made (tensors' bytes as they are).
DETTRIAL_INLINE void pickle_archive_to(const c10::IValue& value, const std::function<void(const void*, std::size_t)>& sink);

/// `value` as a plain pickle (no tensors): what Python's `pickle.load` reads.
DETTRIAL_INLINE std::string pickle_bytes(const c10::IValue& value);

/// Reads an archive written by pickle_archive or by Python's `torch.save` (state dicts, checkpoints:
/// dicts, lists, tensors, numbers, strings); `file` names it in errors.
DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file,
                                             UnreadObjects unread = UnreadObjects::refuse);

/// Every parameter and buffer of a module with Python's state-dict names, in Python's order.
template <class F>
void for_each_state_entry(const torch::nn::Module& module, F&& f) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? std::string() : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      if (p.value().defined()) f(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      if (b.value().defined()) f(prefix + b.key(), b.value());
  }
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes);

/// Python's DistributedDataParallel saves `module.<name>`: the model's own names without it.
DETTRIAL_INLINE StateDict unwrapped(const StateDict& d);

/// One parameter's optimizer state in Python's names through `optimizer`'s layout (see
/// optim::python_layout); false when it has none, or the state is not of its type.
DETTRIAL_INLINE bool python_param_state(const torch::optim::Optimizer& optimizer, const torch::optim::OptimizerParamState& state,
                                        c10::impl::GenericDict& out);

}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief A module's state dict as Python's `module.state_dict()` has it: parameters and buffers under
 * their dotted names (`0.weight`, `fc1.bias`, `bn.running_mean`), detached.
 */
DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module);

/**
 * @brief An optimizer's state dict in Python's layout: `state` keyed by parameter index (counted
 * across groups), `param_groups` with their options and `params` as those indices, as the
 * optimizer's layout (optim::python_layout) writes them; for an optimizer without one, groups carry
 * their learning rate and the state is left empty.
 */
DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);

/**
 * @brief Copies a state dict into a module after checking it fits: every parameter and buffer of the
 * module present with the same shape, and no entry the module lacks. On any mismatch nothing is
 * copied and CheckpointError names `what` (the file and model) and the entry.
 */
DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace dettrial::detail {

DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value) {
  std::string out;
  pickle_archive_to(value, [&](const void* bytes, std::size_t n) { out.append(static_cast<const char*>(bytes), n); });
  return out;
}

DETTRIAL_INLINE void pickle_archive_to(const c10::IValue& value, const std::function<void(const void*, std::size_t)>& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) {
    sink(bytes, n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
}

DETTRIAL_INLINE std::string pickle_bytes(const c10::IValue& value) {
  std::string out;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { out.append(bytes, n); }, /*tensor_table=*/nullptr,
                              /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  return out;
}

DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file, UnreadObjects unread) {
  try {
    // The container is checked before LibTorch's reader trusts its sizes (torch_archive.hpp).
    const std::vector<ArchiveRecord> records = torch_archive_records(bytes);
    const std::string folder = records.empty() ? std::string() : records.front().name.substr(0, records.front().name.find('/') + 1);
    const auto has = [&](const std::string& name) {
      return std::any_of(records.begin(), records.end(), [&](const ArchiveRecord& r) { return r.name == folder + name; });
    };
    if (!has("data.pkl")) throw std::runtime_error("it has no data.pkl record (a zip, but not one torch.save wrote)");
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    auto [pickle_data, pickle_size] = reader.getRecord("data.pkl");
    const auto storages = [&](const std::string& key, c10::ScalarType dtype, std::int64_t numel) {
      auto [data, size] = reader.getRecord("data/" + key);
      // The pickle's element count is checked against the record before anything is allocated for
      // it: a crafted file must not choose the size of an allocation.
      const std::size_t element = c10::elementSize(dtype);
      if (numel < 0 || static_cast<std::uint64_t>(numel) > size / element)
        throw std::runtime_error("tensor storage '" + key + "' holds " + std::to_string(size) + " bytes where " +
                                 (numel < 0
                                      ? std::to_string(numel) + " elements"
                                      : std::to_string(static_cast<std::uint64_t>(numel)) + " of " + std::to_string(element) + " bytes") +
                                 " are needed");
      torch::Tensor out = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      // (An empty storage has no data pointer on either side: memcpy of a null pointer is undefined
      // even for no bytes, which UndefinedBehaviorSanitizer reported for a fuzzed archive.)
      if (numel > 0) std::memcpy(out.data_ptr(), data.get(), static_cast<std::size_t>(numel) * element);
      return out;
    };
    return unpickle(std::string_view(static_cast<const char*>(pickle_data.get()), pickle_size), storages, unread);
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read '" + file.string() + "' as a torch.save archive: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE StateDict unwrapped(const StateDict& d) {
  const std::string prefix = "module.";
  for (const auto& entry : d)
    if (!entry.key().isString() || entry.key().toStringRef().compare(0, prefix.size(), prefix) != 0) return d;
  StateDict out(c10::StringType::get(), c10::TensorType::get());
  for (const auto& entry : d) out.insert(entry.key().toStringRef().substr(prefix.size()), entry.value());
  return out;
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

DETTRIAL_INLINE bool python_param_state(const torch::optim::Optimizer& optimizer, const torch::optim::OptimizerParamState& state,
                                        c10::impl::GenericDict& out) {
  const optim::OptimizerLayout* layout = optim::python_layout_of(optimizer);
  return layout && layout->write_state(state, out);
}

}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out(c10::StringType::get(), c10::TensorType::get());
  // LibTorch's pickler writes CPU and CUDA tensors (a CUDA one is copied out and tagged with its
  // device); others, such as the lazy device's, are saved as CPU copies.
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& t) {
    out.insert(name, t.device().is_cpu() || t.device().is_cuda() ? t.detach() : t.detach().cpu());
  });
  return out;
}

DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  // A fused optimizer keeps its step counts on the device between checkpoints.
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) capturable->pull_host_state();
  StateDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t index = 0;
  auto& states = optimizer.state();
  using StateMap = std::remove_cvref_t<decltype(states)>;
  // An optimizer without a Python layout: its groups carry their learning rates, its state is empty.
  const optim::OptimizerLayout* layout = optim::python_layout_of(optimizer);
  for (auto& group : optimizer.param_groups()) {
    StateDict g(c10::StringType::get(), c10::AnyType::get());
    if (layout) layout->write_options(group.options(), g);
    else g.insert("lr", group.options().get_lr());
    // A list typed Any: an int-typed one would be pickled with TorchScript's build_intlist, which
    // Python's weights-only loader refuses.
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& p : group.params()) {
      params.push_back(index);
      if (const auto it = states.find(detail::optimizer_state_key<StateMap>(p)); it != states.end()) {
        StateDict s(c10::StringType::get(), c10::AnyType::get());
        if (layout && layout->write_state(*it->second, s) && s.size() > 0) state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::map<std::string, bool> used;
  for (const auto& entry : state) used[entry.key().toStringRef()] = false;
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& target) {
    const auto it = state.find(name);
    if (it == state.end())
      throw CheckpointError(what + " has no entry '" + name + "', which the model has (" + std::to_string(state.size()) +
                            " entries in the checkpoint): is it from another network?");
    if (!it->value().isTensor()) throw CheckpointError(what + ": entry '" + name + "' is not a tensor");
    const torch::Tensor source = it->value().toTensor();
    if (source.sizes() != target.sizes())
      throw CheckpointError(what + ": entry '" + name + "' has shape " + detail::shape_text(source.sizes()) + " in the checkpoint but " +
                            detail::shape_text(target.sizes()) + " in the model");
    used[name] = true;
    copies.emplace_back(target, source);
  });
  for (const auto& [name, seen] : used)
    if (!seen) throw CheckpointError(what + " has entry '" + name + "', which the model does not have: is it from another network?");
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
