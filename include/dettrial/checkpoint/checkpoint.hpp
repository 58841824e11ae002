// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a checkpoint holds and how a Context's models, optimizers, schedulers, gradients and
/// RNGs go in and out of it; loading a checkpoint's models for evaluation or inference.
///
/// A checkpoint directory (Determined's layout):
/// - `state_dict.pth`: `torch.load`-able dict with `models_state_dict`, `optimizers_state_dict` (Python
///   layout), `lr_schedulers_state_dict`, `callbacks`, `rng_state`;
/// - `dettrial_state.pt`: LibTorch's own archives of the optimizers and schedulers (every optimizer
///   restored exactly, whatever its type) and, mid gradient aggregation, the pending gradients;
/// - `trial_state.json`: where the trial stands (batches, epochs, last validation and checkpoint);
/// - `load_data.json`: the experiment config and hyperparameters;
/// - `metadata.json`, written last: steps completed, framework, format, each file's size and CRC-32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>
#include <utility>

#include <torch/torch.h>

#include "../layout.hpp"
#include "../context/context.hpp"
#include "../error.hpp"
#include "../optim/fused.hpp"
#include "../detail/text.hpp"
#include "../detail/json_fwd.hpp"
#include "state_dict.hpp"
#include "storage.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// Where a trial stands (Determined's `_TrialState`); saved in every checkpoint as `trial_state.json`.
struct TrialProgress {
  std::int64_t trial_id = 0;
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// `batches_trained` at the last validation and checkpoint; -1 when there was none.
  std::int64_t last_validation = -1;
  std::int64_t last_checkpoint = -1;
  /// The best searcher metric validated so far (what `checkpoint_policy: best` compares against).
  std::optional<double> best_validation{};
  /// The shuffle seeds of the data loaders (those that have one), so a resumed trial reads the same order.
  std::optional<std::uint64_t> training_data_seed{};
  std::optional<std::uint64_t> validation_data_seed{};

  std::string to_json() const;
  static TrialProgress from_json(const std::filesystem::path& file);
};

namespace detail {

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what);

/// A checkpoint's `state_dict.pth`, its size and CRC-32 checked, as a dict.
DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir);

/// Moves a Context's state into and out of checkpoint files, through the Context's public accessors.
struct ContextCheckpoint {
  /// The Python-readable part (without callbacks, which the trainer adds).
  static StateDict python_state(Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank = {},
                                const std::vector<torch::Tensor>& gpu_rng_per_rank = {});

  /// LibTorch's archives of the optimizers and schedulers, and pending gradients when `with_grads`.
  static std::string native_state(Context& c, bool with_grads);

  /// Checks and loads every model of `top` (state_dict.pth's dict) into the context's models.
  static void load_models(Context& c, const StateDict& top, const std::filesystem::path& file);

  static void load_rng(Context& c, const StateDict& top, const std::filesystem::path& file);

  static void set_generator_state(at::Generator generator, const torch::Tensor& state);  // a handle: copies share the generator

  static void load_native(Context& c, const std::string& bytes, const std::filesystem::path& file);
};

}  // namespace detail

/**
 * @brief Loads a checkpoint's models into a trial's wrapped models, for evaluation or inference
 * without training: build the trial (`Trainer<T> trainer(context)`), then
 * `dettrial::load_models(path, context)`. `path` is a checkpoint directory, or a directory holding
 * checkpoints (the latest is taken). Names and shapes are checked before anything is copied.
 */
DETTRIAL_INLINE CheckpointInfo load_models(const std::filesystem::path& path, Context& context);

/// Loads model `index` of a checkpoint into a bare module (no trial needed), checking names and shapes.
DETTRIAL_INLINE void load_model(const std::filesystem::path& path, torch::nn::Module& module, std::size_t index = 0);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
namespace dettrial {
/// Brings device-side optimizer state (FusedAdam's step counts) into LibTorch's state before it is
/// saved: one read of the device per checkpoint.
inline void pull_device_optimizer_state(Context& c) {
  for (std::size_t i = 0; i < c.num_optimizers(); ++i)
    if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&c.optimizer(i))) capturable->pull_host_state();
}
}  // namespace dettrial

#if DETTRIAL_HEADER_DEFINITIONS
#include "../detail/json.hpp"
namespace dettrial {

DETTRIAL_INLINE std::string TrialProgress::to_json() const {
  const auto optional = [](const auto& v) { return v ? detail::Json(*v) : detail::Json(nullptr); };
  // As strings: 64-bit seeds do not survive JSON readers that use doubles.
  const auto seed_text = [](const std::optional<std::uint64_t>& seed) {
    return seed ? detail::Json(std::to_string(*seed)) : detail::Json(nullptr);
  };
  const detail::Json j = {{"trial_id", trial_id},
                          {"batches_trained", batches_trained},
                          {"epochs_trained", epochs_trained},
                          {"last_val", last_validation},
                          {"last_ckpt", last_checkpoint},
                          {"best_validation", optional(best_validation)},
                          {"training_data_seed", seed_text(training_data_seed)},
                          {"validation_data_seed", seed_text(validation_data_seed)}};
  return detail::json_text(j);
}

DETTRIAL_INLINE TrialProgress TrialProgress::from_json(const std::filesystem::path& file) {
  const detail::Json n = detail::read_json_file<CheckpointError>(file);
  TrialProgress p;
  try {
    const auto integer = [&](const char* key) { return detail::json_as<std::int64_t>(detail::json_field(n, key), key); };
    // A seed is a string of digits (as written) or, from another writer, a non-negative integer.
    const auto seed = [&](const char* key) -> std::optional<std::uint64_t> {
      const detail::Json* v = detail::json_find(n, key);
      if (!v || v->is_null()) return std::nullopt;
      if (!v->is_string()) return detail::json_as<std::uint64_t>(*v, key);
      const std::string& text = v->get_ref<const std::string&>();
      std::uint64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty())
        throw detail::JsonFieldError(std::string("'") + key + "' is " + v->dump() + ", not a 64-bit seed");
      return value;
    };
    p.trial_id = integer("trial_id");
    p.batches_trained = integer("batches_trained");
    p.epochs_trained = integer("epochs_trained");
    p.last_validation = integer("last_val");
    p.last_checkpoint = integer("last_ckpt");
    if (const detail::Json* v = detail::json_find(n, "best_validation"); v && !v->is_null())
      p.best_validation = detail::json_as<double>(*v, "best_validation");
    p.training_data_seed = seed("training_data_seed");
    p.validation_data_seed = seed("validation_data_seed");
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + file.string() + "' lacks a field or has one of the wrong type: " + e.what());
  }
  return p;
}

namespace detail {

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what) {
  const auto it = dict.find(key);
  if (it == dict.end()) throw CheckpointError(what + " has no '" + key + "'");
  return it->value();
}

DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir) {
  const std::filesystem::path file = CheckpointFolder{dir}.state_dict();
  const c10::IValue top = unpickle_archive(read_checked_file(dir, layout::state_dict), file);
  if (!top.isGenericDict()) throw CheckpointError("checkpoint file '" + file.string() + "' does not hold a dict");
  return top.toGenericDict();
}

DETTRIAL_INLINE StateDict ContextCheckpoint::python_state(Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank,
                                                          const std::vector<torch::Tensor>& gpu_rng_per_rank) {
  pull_device_optimizer_state(c);
  c10::impl::GenericList models(c10::AnyType::get());
  for (const auto& m : c.models()) models.push_back(module_state_dict(*m));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) optimizers.push_back(optimizer_state_dict(c.optimizer(i)));
  c10::impl::GenericList schedulers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    const WrappedScheduler& s = c.lr_scheduler(i);
    StateDict d(c10::StringType::get(), c10::AnyType::get());
    if (s.python_state) {  // dettrial::optim's schedulers write Python's own state dict
      s.python_state(s.scheduler, d);
    } else if (const std::int64_t steps = s.steps_taken(s.scheduler); steps >= 0) {
      // Python schedulers step once when built: LibTorch's k steps are Python's last_epoch k.
      d.insert("last_epoch", steps);
      d.insert("_step_count", steps + 1);
    }
    schedulers.push_back(d);
  }
  StateDict rng(c10::StringType::get(), c10::AnyType::get());
  rng.insert("cpu_rng_state", at::detail::getDefaultCPUGenerator().get_state());
  if (!cpu_rng_per_rank.empty()) {  // a data-parallel job: each rank's own state, in rank order
    c10::impl::GenericList states(c10::AnyType::get());
    for (const auto& t : cpu_rng_per_rank) states.push_back(t);
    rng.insert("cpu_rng_states", states);
  }
  if (c.device().is_cuda()) rng.insert("gpu_rng_state", at::globalContext().defaultGenerator(c.device()).get_state());
  if (!gpu_rng_per_rank.empty()) {  // each rank's GPU generator, in rank order (dettrial's field)
    c10::impl::GenericList states(c10::AnyType::get());
    for (const auto& t : gpu_rng_per_rank) states.push_back(t);
    rng.insert("gpu_rng_states", states);
  }
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("models_state_dict", models);
  out.insert("optimizers_state_dict", optimizers);
  out.insert("lr_schedulers_state_dict", schedulers);
  out.insert("rng_state", rng);
  if (c.scaler()) out.insert("scaler_state_dict", c.scaler()->state_dict());  // Determined's key
  return out;
}

DETTRIAL_INLINE std::string ContextCheckpoint::native_state(Context& c, bool with_grads) {
  pull_device_optimizer_state(c);
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(checkpoint_format_version));
  torch::serialize::OutputArchive optimizers;
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) {
    torch::serialize::OutputArchive one;
    c.optimizer(i).save(one);
    // LibTorch's optimizer load restores the per-parameter state but not the groups' options
    // (learning rate, momentum, ...), which schedulers change: they are saved beside it.
    torch::serialize::OutputArchive groups;
    const auto& param_groups = c.optimizer(i).param_groups();
    for (std::size_t g = 0; g < param_groups.size(); ++g) {
      torch::serialize::OutputArchive options;
      param_groups[g].options().serialize(options);
      groups.write(std::to_string(g), options);
    }
    one.write("dettrial_group_options", groups);
    optimizers.write(std::to_string(i), one);
  }
  archive.write("optimizers", optimizers);
  torch::serialize::OutputArchive schedulers;
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    torch::serialize::OutputArchive one;
    c.lr_scheduler(i).save(c.lr_scheduler(i).scheduler, one);
    schedulers.write(std::to_string(i), one);
  }
  archive.write("schedulers", schedulers);
  if (with_grads) {
    // By position: the models were checked entry by entry before these are read back.
    torch::serialize::OutputArchive grads;
    for (std::size_t i = 0; i < c.models().size(); ++i) {
      torch::serialize::OutputArchive model;
      const auto params = c.models()[i]->parameters();
      for (std::size_t j = 0; j < params.size(); ++j)
        if (params[j].grad().defined()) model.write("p" + std::to_string(j), params[j].grad(), /*is_buffer=*/true);
      grads.write(std::to_string(i), model);
    }
    archive.write("grads", grads);
  }
  std::string out;
  archive.save_to([&](const void* bytes, std::size_t n) {
    out.append(static_cast<const char*>(bytes), n);
    return n;
  });
  return out;
}

DETTRIAL_INLINE void ContextCheckpoint::load_models(Context& c, const StateDict& top, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const c10::IValue& models = require_entry(top, "models_state_dict", what);
  if (!models.isList()) throw CheckpointError(what + ": 'models_state_dict' is not a list");
  const auto list = models.toList();
  if (list.size() != c.models().size())
    throw CheckpointError(what + " holds " + std::to_string(list.size()) + " model(s), but the trial wraps " +
                          std::to_string(c.models().size()));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const c10::IValue entry = list.get(i);
    if (!entry.isGenericDict()) throw CheckpointError(what + ": model " + std::to_string(i) + " is not a state dict");
    load_module_state_dict(*c.models()[i], entry.toGenericDict(), what + ", model " + std::to_string(i) + ",");
  }
}

DETTRIAL_INLINE void ContextCheckpoint::load_rng(Context& c, const StateDict& top, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const c10::IValue& rng = require_entry(top, "rng_state", what);
  if (!rng.isGenericDict()) throw CheckpointError(what + ": 'rng_state' is not a dict");
  const StateDict states = rng.toGenericDict();
  // This rank's own state from a job's per-rank list when there is one, else the chief's.
  const auto this_ranks = [&](const char* per_rank_key, torch::Tensor chiefs) {
    if (const auto per_rank = states.find(per_rank_key); per_rank != states.end() && per_rank->value().isList()) {
      const auto list = per_rank->value().toList();
      if (static_cast<std::size_t>(c.distributed().rank) < list.size()) return list.get(c.distributed().rank).toTensor();
    }
    return chiefs;
  };
  set_generator_state(at::detail::getDefaultCPUGenerator(),
                      this_ranks("cpu_rng_states", require_entry(states, "cpu_rng_state", what + "'s rng_state").toTensor()));
  if (const auto gpu = states.find("gpu_rng_state"); gpu != states.end() && c.device().is_cuda())
    set_generator_state(at::globalContext().defaultGenerator(c.device()), this_ranks("gpu_rng_states", gpu->value().toTensor()));
}

DETTRIAL_INLINE void ContextCheckpoint::set_generator_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

DETTRIAL_INLINE void ContextCheckpoint::load_native(Context& c, const std::string& bytes, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read " + what + ": " + first_line(e.what()));
  }
  auto sub = [&](const char* key) {
    torch::serialize::InputArchive a;
    if (!archive.try_read(key, a)) throw CheckpointError(what + " has no '" + key + "' section");
    return a;
  };
  auto count = [](torch::serialize::InputArchive& a) { return a.keys().size(); };
  torch::serialize::InputArchive optimizers = sub("optimizers");
  if (count(optimizers) != c.num_optimizers())
    throw CheckpointError(what + " holds " + std::to_string(count(optimizers)) + " optimizer(s), but the trial wraps " +
                          std::to_string(c.num_optimizers()));
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) {
    torch::serialize::InputArchive one;
    optimizers.read(std::to_string(i), one);
    try {
      auto& optimizer = c.optimizer(i);
      optimizer.load(one);
      torch::serialize::InputArchive groups;
      one.read("dettrial_group_options", groups);
      for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
        torch::serialize::InputArchive options;
        groups.read(std::to_string(g), options);
        optimizer.param_groups()[g].options().serialize(options);
      }
      // Device-side state (FusedAdam's step counts) follows the loaded state, and learning rates the loaded options.
      if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) {
        capturable->push_device_state();
        capturable->sync_learning_rates(optimizer.param_groups());
      }
    } catch (const std::exception& e) {
      throw CheckpointError(what + ": optimizer " + std::to_string(i) + " does not match the trial's: " + first_line(e.what()));
    }
  }
  torch::serialize::InputArchive schedulers = sub("schedulers");
  if (count(schedulers) != c.num_lr_schedulers())
    throw CheckpointError(what + " holds " + std::to_string(count(schedulers)) + " LR scheduler(s), but the trial wraps " +
                          std::to_string(c.num_lr_schedulers()));
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    torch::serialize::InputArchive one;
    schedulers.read(std::to_string(i), one);
    try {
      c.lr_scheduler(i).load(c.lr_scheduler(i).scheduler, one);
    } catch (const std::exception& e) {
      throw CheckpointError(what + ": LR scheduler " + std::to_string(i) + " cannot be restored: " + first_line(e.what()));
    }
  }
  torch::serialize::InputArchive grads;
  const bool has_grads = archive.try_read("grads", grads);
  for (std::size_t i = 0; i < c.models().size(); ++i) {
    torch::serialize::InputArchive model;
    const bool has_model = has_grads && grads.try_read(std::to_string(i), model);
    auto params = c.models()[i]->parameters();
    for (std::size_t j = 0; j < params.size(); ++j) {
      torch::Tensor g;
      if (has_model && model.try_read("p" + std::to_string(j), g, /*is_buffer=*/true)) params[j].mutable_grad() = g.to(params[j].device());
      else if (params[j].grad().defined()) params[j].mutable_grad() = torch::Tensor();  // nothing was pending at the checkpoint
    }
  }
}

}  // namespace detail

DETTRIAL_INLINE CheckpointInfo load_models(const std::filesystem::path& path, Context& context) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  const CheckpointInfo info = read_checkpoint_info(dir);
  detail::ContextCheckpoint::load_models(context, detail::read_state_dict_file(dir), CheckpointFolder{dir}.state_dict());
  return info;
}

DETTRIAL_INLINE void load_model(const std::filesystem::path& path, torch::nn::Module& module, std::size_t index) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  const std::string what = "checkpoint file '" + CheckpointFolder{dir}.state_dict().string() + "'";
  const auto models = detail::require_entry(detail::read_state_dict_file(dir), "models_state_dict", what).toList();
  if (index >= models.size())
    throw CheckpointError(what + " holds " + std::to_string(models.size()) + " model(s); there is no model " + std::to_string(index));
  load_module_state_dict(module, models.get(index).toGenericDict(), what + ", model " + std::to_string(index) + ",");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
