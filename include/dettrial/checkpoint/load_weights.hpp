// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Weights from elsewhere: a state dict Python wrote (`torch.save(model.state_dict())`), a
/// safetensors file or a Hugging Face model directory, a Determined or dettrial checkpoint
/// directory (`state_dict.pth`), loaded into a model for a warm start or fine-tuning, strictly or
/// listing what does not match (Python's `strict=False`).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../layout.hpp"
#include "../optim/handles.hpp"
#include "safetensors.hpp"
#include "state_dict.hpp"
#include "storage.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// How to load weights into a model.
struct LoadWeightsOptions {
  /// Every entry of the model present in the file and none the model lacks (Python's `strict=True`);
  /// false loads what matches and lists the rest in the returned IncompatibleKeys.
  bool strict = true;
  /// Which model of a checkpoint holding several (`models_state_dict[i]`).
  std::size_t model_index = 0;
};

/// What a non-strict load left out: Python's `_IncompatibleKeys`.
struct IncompatibleKeys {
  /// Entries of the model the file has no value for (they keep their current values).
  std::vector<std::string> missing_keys;
  /// Entries of the file the model does not have (ignored).
  std::vector<std::string> unexpected_keys;
  bool empty() const { return missing_keys.empty() && unexpected_keys.empty(); }
};

/**
 * @brief One model's state dict from `path`, whatever wrote it:
 * - a checkpoint directory (Determined's or dettrial's): its `state_dict.pth`, `models_state_dict[model_index]`;
 * - a safetensors file (`safetensors.torch.save_file`, timm's and transformers' downloads);
 * - a Hugging Face model directory (`save_pretrained`): its `model.safetensors`, its shards listed
 *   in `model.safetensors.index.json`, or its `pytorch_model.bin`, in that order;
 * - a `torch.save` file of a model's `state_dict()` (tensors by name);
 * - a `torch.save` file of a dict holding one: under `models_state_dict` (Determined's layout),
 *   `model_state_dict`, `state_dict` or `model` (common Python conventions).
 * Names of a model saved wrapped in Python's DistributedDataParallel (`module.` before every name)
 * are unwrapped. Throws CheckpointError naming the file and what it holds when none of these fits.
 */
DETTRIAL_INLINE StateDict read_model_state_dict(const std::filesystem::path& path, std::size_t model_index = 0);

/**
 * @brief Copies `state` into `module`. Shapes must match for every entry both have (Python refuses
 * those too, strict or not); strictly, the names must match one for one. Nothing is copied when
 * something is refused: CheckpointError names `what` and every offending entry.
 */
DETTRIAL_INLINE IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true,
                                                 const std::string& what = "the state dict");

/**
 * @brief Loads weights written by Python, Determined or dettrial into a model, for a warm start or
 * fine-tuning (call it where the trial builds its model). Returns what a non-strict load left out.
 * @code{.cpp}
 * auto keys = dettrial::load_weights(model, "pretrained/resnet.pt", {.strict = false});
 * for (const auto& k : keys.missing_keys) std::printf("new, not loaded: %s\n", k.c_str());
 * @endcode
 */
template <ModelHandle M>
IncompatibleKeys load_weights(M& model, const std::filesystem::path& path, LoadWeightsOptions options = {}) {
  return load_state_dict(*module_of(model), read_model_state_dict(path, options.model_index), options.strict, "'" + path.string() + "'");
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <optional>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "../detail/json.hpp"

namespace dettrial::detail {

/// Whether every value of `d` is a tensor (a model's state dict, as opposed to a checkpoint's top level).
DETTRIAL_INLINE bool all_tensors(const StateDict& d) {
  for (const auto& entry : d)
    if (!entry.key().isString() || !entry.value().isTensor()) return false;
  return d.size() > 0;
}

DETTRIAL_INLINE std::string keys_text(const StateDict& d) {
  std::string out;
  std::size_t shown = 0;
  for (const auto& entry : d) {
    if (shown++ == 8) return out + ", ...";
    out += (out.empty() ? "" : ", ") + (entry.key().isString() ? "'" + entry.key().toStringRef() + "'" : std::string("(not a name)"));
  }
  return out.empty() ? "nothing" : out;
}

/// A Hugging Face model directory's weights: `model.safetensors`, the shards its index lists, or
/// `pytorch_model.bin`; nullopt when it has none of them.
DETTRIAL_INLINE std::optional<StateDict> read_pretrained_directory(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors", ec)) return unwrapped(read_safetensors(dir / "model.safetensors").tensors);
  if (const fs::path index = dir / "model.safetensors.index.json"; fs::exists(index, ec)) {
    const Json map = read_json_file<CheckpointError>(index);
    const Json* weights = json_find(map, "weight_map");
    if (weights == nullptr || !weights->is_object())
      throw CheckpointError("'" + index.string() + "' has no weight_map (an object of tensor names to shard files)");
    StateDict all = empty_state_dict();
    std::map<std::string, bool> shards;
    for (const auto& [name, file] : weights->items()) {
      if (!file.is_string() || fs::path(file.get<std::string>()).filename() != fs::path(file.get<std::string>()))
        throw CheckpointError("'" + index.string() + "': weight_map['" + name + "'] is not the name of a file in " + dir.string());
      shards[file.get<std::string>()] = true;
    }
    for (const auto& [file, _] : shards)
      for (const auto& entry : read_safetensors(dir / file).tensors) {
        const auto listed = weights->find(entry.key().toStringRef());
        if (listed == weights->end() || listed->get<std::string>() != file)
          throw CheckpointError("'" + (dir / file).string() + "' holds '" + entry.key().toStringRef() + "', which " + index.string() +
                                " does not list in it");
        all.insert(entry.key(), entry.value());
      }
    for (const auto& [name, file] : weights->items())
      if (all.find(name) == all.end())
        throw CheckpointError("'" + index.string() + "' lists '" + name + "' in " + file.get<std::string>() + ", which does not hold it");
    return unwrapped(all);
  }
  return std::nullopt;
}

}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE StateDict read_model_state_dict(const std::filesystem::path& path, std::size_t model_index) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError("cannot load weights: '" + path.string() + "' does not exist");
  const bool directory = fs::is_directory(path, ec);
  if (!directory && looks_like_safetensors(path)) return detail::unwrapped(read_safetensors(path).tensors);
  if (directory && !fs::exists(CheckpointFolder{path}.state_dict(), ec))
    if (auto pretrained = detail::read_pretrained_directory(path)) return *std::move(pretrained);
  const fs::path pytorch_model = path / "pytorch_model.bin";
  const fs::path file = !directory                                            ? path
                        : fs::exists(CheckpointFolder{path}.state_dict(), ec) ? CheckpointFolder{path}.state_dict()
                                                                              : pytorch_model;
  if (directory && !fs::exists(file, ec))
    throw CheckpointError("cannot load weights: '" + path.string() +
                          "' is a directory without state_dict.pth (a checkpoint's), model.safetensors, model.safetensors.index.json "
                          "or pytorch_model.bin (a Hugging Face model's)");
  // A dettrial checkpoint lists its files' sizes and checksums: use them when they are there.
  const bool listed =
      directory && fs::exists(CheckpointFolder{path}.metadata(), ec) && fs::exists(CheckpointFolder{path}.libtorch_state(), ec);
  const std::string bytes = listed ? read_checked_file(path, layout::state_dict) : detail::read_file_bytes(file);
  const c10::IValue top = detail::unpickle_archive(bytes, file);
  if (!top.isGenericDict())
    throw CheckpointError("'" + file.string() + "' holds a " + top.tagKind() + ", not a state dict (a dict of tensors by name)");
  const StateDict dict = top.toGenericDict();
  if (detail::all_tensors(dict)) return detail::unwrapped(dict);
  if (const auto it = dict.find("models_state_dict"); it != dict.end()) {
    if (!it->value().isList()) throw CheckpointError("'" + file.string() + "': models_state_dict is not a list");
    const auto models = it->value().toList();
    if (model_index >= models.size())
      throw CheckpointError("'" + file.string() + "' holds " + std::to_string(models.size()) + " model(s); model " +
                            std::to_string(model_index) + " was asked for");
    const c10::IValue model = models.get(model_index);
    if (!model.isGenericDict() || !(detail::all_tensors(model.toGenericDict()) || model.toGenericDict().size() == 0))
      throw CheckpointError("'" + file.string() + "': models_state_dict[" + std::to_string(model_index) + "] is not a state dict");
    return detail::unwrapped(model.toGenericDict());
  }
  for (const char* key : {"model_state_dict", "state_dict", "model"})
    if (const auto it = dict.find(key); it != dict.end() && it->value().isGenericDict() && detail::all_tensors(it->value().toGenericDict()))
      return detail::unwrapped(it->value().toGenericDict());
  throw CheckpointError("'" + file.string() + "' is neither a model's state dict nor a checkpoint holding one: it has " +
                        detail::keys_text(dict) + " (expected tensors by name, or models_state_dict, model_state_dict or state_dict)");
}

DETTRIAL_INLINE IncompatibleKeys load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict, const std::string& what) {
  IncompatibleKeys keys;
  std::vector<std::string> wrong_shapes;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::map<std::string, bool> used;
  for (const auto& entry : state) used[entry.key().toStringRef()] = false;
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& target) {
    const auto it = state.find(name);
    if (it == state.end() || !it->value().isTensor()) {
      keys.missing_keys.push_back(name);
      return;
    }
    used[name] = true;
    const torch::Tensor source = it->value().toTensor();
    if (source.sizes() != target.sizes()) {
      wrong_shapes.push_back("'" + name + "' is " + detail::shape_text(source.sizes()) + " in the file but " +
                             detail::shape_text(target.sizes()) + " in the model");
      return;
    }
    copies.emplace_back(target, source);
  });
  for (const auto& [name, seen] : used)
    if (!seen) keys.unexpected_keys.push_back(name);
  std::string problems;
  for (const auto& w : wrong_shapes) problems += "\n  size mismatch: " + w;
  if (strict) {
    for (const auto& k : keys.missing_keys) problems += "\n  missing from the file: '" + k + "'";
    for (const auto& k : keys.unexpected_keys) problems += "\n  not in the model: '" + k + "'";
  }
  if (!problems.empty())
    throw CheckpointError("cannot load " + what + " into the model (nothing was loaded):" + problems +
                          (strict && wrong_shapes.empty() ? "\n(load with strict = false to load the entries that match)" : ""));
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
  return keys;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
