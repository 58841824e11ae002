// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a checkpoint holds and how a Context's models, optimizers, schedulers, gradients and
/// RNGs go in and out of it; loading a checkpoint's models for evaluation or inference.
///
/// A checkpoint directory (Determined's layout):
/// - `state_dict.pth`: `torch.load`-able dict with `models_state_dict`, `optimizers_state_dict` (Python
///   layout), `lr_schedulers_state_dict`, `callbacks`, `rng_state`;
/// - `dettrial_state.pt`, only when needed: LibTorch's archive of what Python's layout cannot express
///   (an optimizer of a type it does not hold, a scheduler without a Python-state reader) and, mid
///   gradient aggregation, the pending gradients. Each tensor is stored once (format 2); a format-1
///   checkpoint holds every optimizer and scheduler here again, and still loads;
/// - `trial_state.json`: where the trial stands (batches, epochs, last validation and checkpoint);
/// - `load_data.json`: the experiment config and hyperparameters;
/// - `metadata.json`, written last: steps completed, framework, format, each file's size and CRC-32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>
#include <utility>

#include <torch/torch.h>

#include "../layout.hpp"
#include "../context/detail/access.hpp"
#include "../context/context.hpp"
#include "../error.hpp"
#include "../optim/fused.hpp"
#include "../detail/crc32.hpp"
#include "../detail/random.hpp"
#include "../detail/text.hpp"
#include "../detail/json_fwd.hpp"
#include "python_optimizer.hpp"
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
  /// The ranks of the job that wrote the checkpoint, and the rank count whose global batches the
  /// training data follows (the count the run began on: a run resumed on another count keeps them).
  /// 0: not recorded (a checkpoint written before dettrial recorded them, or by Determined).
  std::int64_t ranks = 0;
  std::int64_t data_ranks = 0;

  std::string to_json() const;
  static TrialProgress from_json(const std::filesystem::path& file);
  /// Determined's `trial_state.pkl` (its `_TrialState`), which Determined reads to continue.
  std::string to_determined_pickle() const;
  /// Where the trial of a checkpoint Determined wrote stands: its `trial_state.pkl`, or, without
  /// one, its metadata's steps_completed.
  static TrialProgress from_determined(const std::filesystem::path& dir, const CheckpointInfo& info);
};

}  // namespace dettrial

namespace dettrial::detail {

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what);

/// A checkpoint's `state_dict.pth`, its size and CRC-32 checked, as a dict.
DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir);

/// Maps a tensor of the live state to the one a checkpoint stores (the snapshot's host copy).
using TensorKeeper = std::function<torch::Tensor(const torch::Tensor&)>;

/// `dettrial_state.pt` before it is serialized.
struct NativeState {
  torch::serialize::OutputArchive archive;
  /// It holds an optimizer's own save() of its live state, which training changes in place: it is
  /// serialized before training goes on (the rest of a checkpoint is written in the background).
  bool holds_live_state = false;
  std::string bytes();
};

/// Where state_dict.pth holds the averaged model: torchvision's reference recipe's key.
inline constexpr const char* averaged_model_key = "model_ema";

/// Moves a Context's state into and out of checkpoint files, through the Context's public accessors.
struct ContextCheckpoint {
  /// The Python-readable part (without callbacks, which the trainer adds).
  static StateDict python_state(TrainerKey key, Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank = {},
                                const std::vector<torch::Tensor>& gpu_rng_per_rank = {});

  /// LibTorch's archive of what Python's layout cannot express: the optimizers it cannot hold
  /// (python_layout_holds), the schedulers without a Python-state reader and, `with_grads`, the
  /// pending gradients, each taken through `keep` (the snapshot's copy). nullopt: nothing to write.
  static std::optional<NativeState> native_state(TrainerKey key, Context& c, bool with_grads, const TensorKeeper& keep);

  /// Checks and loads every model of `top` (state_dict.pth's dict) into the context's models.
  static void load_models(Context& c, const StateDict& top, const std::filesystem::path& file);

  static void load_rng(TrainerKey key, Context& c, const StateDict& top, const std::filesystem::path& file);

  static void set_generator_state(at::Generator generator, const torch::Tensor& state);  // a handle: copies share the generator
  /// The seed of rank `rank`'s generator when the checkpoint has no state of its own for it: the
  /// CRC-32 of the chief's saved state mixed with the rank.
  static std::uint64_t new_rank_seed(const torch::Tensor& chiefs_state, std::int64_t rank);

  /// LibTorch's archive `bytes` (`file` names it in errors).
  static torch::serialize::InputArchive read_native(const std::string& bytes, const std::filesystem::path& file);

  /// Restores the optimizers and schedulers from state_dict.pth's Python layout (dettrial's formats
  /// 1 and 2, and a checkpoint Determined wrote): each optimizer through load_optimizer_state_dict,
  /// each scheduler through its Python-state reader; a part that layout cannot hold from `native`
  /// (LibTorch's archive, when written), and the pending gradients it holds. A part that cannot be carried over is a
  /// CheckpointError naming it, or, with `fresh_parts`, a one-line warning and that part as the
  /// trial made it.
  static void load_python_layout(TrainerKey key, Context& c, const StateDict& top, const std::filesystem::path& file, bool fresh_parts,
                                 torch::serialize::InputArchive* native = nullptr);

 private:
  static void load_native_optimizer(Context& c, std::size_t i, torch::serialize::InputArchive& one, const std::string& what);
  static void load_native_scheduler(TrainerKey key, Context& c, std::size_t i, torch::serialize::InputArchive& one,
                                    const std::string& what);
  /// The pending gradients `archive` holds (none: nothing was pending at the checkpoint).
  static void load_native_grads(Context& c, torch::serialize::InputArchive& archive);
  /// What schedulers keep in Python's parameter groups (OneCycleLR's max_lr, ...), written into the
  /// groups of `optimizers` (Python's optimizer states, in the trial's order) and read back from them.
  static void add_scheduler_group_entries(TrainerKey key, Context& c, c10::impl::GenericList& optimizers);
  /// The averaged model (Context::wrap_averaged_model) from `top`'s averaged_model_key.
  static void load_average(Context& c, const StateDict& top, const std::string& what);
  static void read_scheduler_group_entries(Context& c, const WrappedScheduler& s, const c10::impl::GenericList& optimizers,
                                           const std::string& what);
};

/// NumPy's and Python's generator states as Determined seeds them (`np.random.seed(seed)`,
/// `random.seed(seed)`), in the layouts `np.random.get_state()` and `random.getstate()` return,
/// written with primitives only (a list, not an ndarray) so that `torch.load(weights_only=True)` reads them.
DETTRIAL_INLINE c10::IValue numpy_seeded_state(std::uint64_t seed);
DETTRIAL_INLINE c10::IValue python_random_seeded_state(std::uint64_t seed);

}  // namespace dettrial::detail

namespace dettrial {
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
#include <cstdio>
#include <functional>

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
                          {"validation_data_seed", seed_text(validation_data_seed)},
                          {"ranks", ranks},
                          {"data_ranks", data_ranks}};
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
    for (const auto& [key, field] : {std::pair{"ranks", &p.ranks}, std::pair{"data_ranks", &p.data_ranks}})
      if (const detail::Json* v = detail::json_find(n, key); v && !v->is_null()) {
        *field = detail::json_as<std::int64_t>(*v, key);
        if (*field < 1) throw detail::JsonFieldError(std::string("'") + key + "' is " + v->dump() + ", not a rank count");
      }
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + file.string() + "' lacks a field or has one of the wrong type: " + e.what());
  }
  return p;
}

DETTRIAL_INLINE std::string TrialProgress::to_determined_pickle() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("trial_id", trial_id);
  d.insert("last_ckpt", std::max<std::int64_t>(last_checkpoint, 0));
  d.insert("step_id", std::int64_t{0});
  d.insert("last_val", std::max<std::int64_t>(last_validation, 0));
  d.insert("batches_trained", batches_trained);
  d.insert("epochs_trained", epochs_trained);
  return detail::pickle_bytes(d);
}

DETTRIAL_INLINE TrialProgress TrialProgress::from_determined(const std::filesystem::path& dir, const CheckpointInfo& info) {
  TrialProgress p;
  p.batches_trained = info.batches_trained;
  const std::filesystem::path file = CheckpointFolder{dir}.determined_trial_state();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return p;
  c10::IValue state;
  try {
    state = detail::unpickle(detail::read_file_bytes(file));
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read '" + file.string() + "' (Determined's trial state): " + detail::first_line(e.what()));
  }
  if (!state.isGenericDict()) throw CheckpointError("'" + file.string() + "' does not hold a dict (Determined's trial state)");
  const auto d = state.toGenericDict();
  const auto integer = [&](const char* key, std::int64_t fallback) {
    const auto it = d.find(key);
    if (it == d.end() || it->value().isNone()) return fallback;
    if (!it->value().isInt()) throw CheckpointError("'" + file.string() + "': " + key + " is not an integer");
    return it->value().toInt();
  };
  p.batches_trained = integer("batches_trained", info.batches_trained);
  p.epochs_trained = integer("epochs_trained", 0);
  p.last_validation = integer("last_val", -1);
  p.last_checkpoint = integer("last_ckpt", -1);
  p.trial_id = integer("trial_id", 0);
  if (p.batches_trained != info.batches_trained)
    throw CheckpointError("'" + file.string() + "' says " + std::to_string(p.batches_trained) +
                          " batches were trained, its metadata.json " + std::to_string(info.batches_trained) +
                          ": the checkpoint is inconsistent");
  return p;
}

}  // namespace dettrial

namespace dettrial::detail {

/// The archive key of parameter `j`'s pending gradient ("p0", "p1", ...). Formatted, not "p" +
/// std::to_string(j): GCC 12 at -O3 warns (-Wstringop-overflow) inside that concatenation's inlined
/// copy, in every program that includes this header.
DETTRIAL_INLINE std::string grad_key(std::size_t j) {
  char key[24];
  std::snprintf(key, sizeof key, "p%zu", j);
  return key;
}

DETTRIAL_INLINE c10::IValue numpy_seeded_state(std::uint64_t seed) {
  c10::impl::GenericList key(c10::AnyType::get());
  std::uint32_t x = static_cast<std::uint32_t>(seed);  // NumPy refuses seeds above 2**32-1; Determined's fit
  for (std::uint32_t i = 0; i < 624; ++i) {
    if (i > 0) x = 1812433253U * (x ^ (x >> 30)) + i;
    key.push_back(static_cast<std::int64_t>(x));
  }
  return c10::ivalue::Tuple::create({c10::IValue(std::string("MT19937")), key, std::int64_t{624}, std::int64_t{0}, 0.0});
}

DETTRIAL_INLINE c10::IValue python_random_seeded_state(std::uint64_t seed) {
  // CPython's random.seed(int): init_by_array over the seed's 32-bit words, least significant first.
  std::vector<std::uint32_t> words;
  for (std::uint64_t s = seed; s != 0 || words.empty(); s >>= 32) words.push_back(static_cast<std::uint32_t>(s));
  constexpr std::size_t n = 624;
  std::vector<std::uint32_t> mt(n);
  mt[0] = 19650218U;
  for (std::uint32_t i = 1; i < n; ++i) mt[i] = 1812433253U * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
  std::size_t i = 1, j = 0;
  for (std::size_t k = std::max(n, words.size()); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + words[j] + static_cast<std::uint32_t>(j);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
    if (++j >= words.size()) j = 0;
  }
  for (std::size_t k = n - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - static_cast<std::uint32_t>(i);
    if (++i >= n) {
      mt[0] = mt[n - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000U;
  std::vector<c10::IValue> state;
  for (const std::uint32_t v : mt) state.emplace_back(static_cast<std::int64_t>(v));
  state.emplace_back(static_cast<std::int64_t>(n));
  return c10::ivalue::Tuple::create({c10::IValue(std::int64_t{3}), c10::ivalue::Tuple::create(std::move(state)), c10::IValue()});
}

DETTRIAL_INLINE const c10::IValue& require_entry(const StateDict& dict, const char* key, const std::string& what) {
  const auto it = dict.find(key);
  if (it == dict.end()) throw CheckpointError(what + " has no '" + key + "'");
  return it->value();
}

DETTRIAL_INLINE StateDict read_state_dict_file(const std::filesystem::path& dir) {
  const std::filesystem::path file = CheckpointFolder{dir}.state_dict();
  // Determined lists no checksums: its state_dict.pth is read as it is.
  const std::string bytes =
      read_checkpoint_info(dir, /*verify_files=*/false).by_determined ? read_file_bytes(file) : read_checked_file(dir, layout::state_dict);
  // Objects of types dettrial does not read are kept marked: an optimizer's or scheduler's state that
  // holds one is refused as that part (load_python_layout), which --resume-fresh-parts can start fresh.
  const c10::IValue top = unpickle_archive(bytes, file, UnreadObjects::mark);
  if (!top.isGenericDict()) throw CheckpointError("checkpoint file '" + file.string() + "' does not hold a dict");
  for (const auto& entry : top.toGenericDict()) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("(a key that is not a name)");
    if (key == "optimizers_state_dict" || key == "lr_schedulers_state_dict") continue;
    if (const auto type = python_object_type(entry.value()))
      throw CheckpointError("checkpoint file '" + file.string() + "': '" + key + "' holds a Python object of type '" + *type +
                            "', which dettrial does not read");
  }
  return top.toGenericDict();
}

}  // namespace dettrial::detail

namespace dettrial::detail::checkpoint {

/// The index of the trial's optimizer `o`, or the number of optimizers when it is none of them.
DETTRIAL_INLINE std::size_t optimizer_index(Context& c, const torch::optim::Optimizer* o) {
  std::size_t i = 0;
  while (i < c.num_optimizers() && &c.optimizer(i) != o) ++i;
  return i;
}

/// Parameter group `g` of Python's optimizer state `optimizer`, or null.
DETTRIAL_INLINE std::optional<StateDict> python_group(const c10::IValue& optimizer, std::size_t g) {
  if (!optimizer.isGenericDict()) return std::nullopt;
  const auto groups = optimizer.toGenericDict().find("param_groups");
  if (groups == optimizer.toGenericDict().end() || !groups->value().isList() || g >= groups->value().toListRef().size())
    return std::nullopt;
  // Named, not a temporary: GCC 13 warns of a reference into a temporary view as dangling.
  const c10::ArrayRef<c10::IValue> all = groups->value().toListRef();
  const c10::IValue& group = all[g];
  if (!group.isGenericDict()) return std::nullopt;
  return group.toGenericDict();
}

}  // namespace dettrial::detail::checkpoint

namespace dettrial::detail {
DETTRIAL_INLINE void ContextCheckpoint::add_scheduler_group_entries(TrainerKey key, Context& c, c10::impl::GenericList& optimizers) {
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    const WrappedScheduler& s = detail::ContextAccess::lr_scheduler(key, c, i);
    if (!s.python_param_group) continue;
    const std::size_t o = detail::checkpoint::optimizer_index(c, s.driven_optimizer(s.scheduler));
    if (o >= optimizers.size()) continue;  // a scheduler of an optimizer the trial did not wrap: Python has no groups for it
    for (std::size_t g = 0; auto group = detail::checkpoint::python_group(optimizers.get(o), g); ++g) {
      StateDict d = *group;  // shares the list's dict
      s.python_param_group(s.scheduler, g, d);
    }
  }
}

DETTRIAL_INLINE void ContextCheckpoint::read_scheduler_group_entries(Context& c, const WrappedScheduler& s,
                                                                     const c10::impl::GenericList& optimizers, const std::string& what) {
  if (!s.load_python_param_group) return;
  const std::size_t o = detail::checkpoint::optimizer_index(c, s.driven_optimizer(s.scheduler));
  if (o >= optimizers.size()) return;
  for (std::size_t g = 0; g < c.optimizer(o).param_groups().size(); ++g) {
    const auto group = detail::checkpoint::python_group(optimizers.get(o), g);
    if (!group) throw CheckpointError(what + ": optimizer " + std::to_string(o) + " has no parameter group " + std::to_string(g));
    s.load_python_param_group(s.scheduler, g, *group, what + ", optimizer " + std::to_string(o) + "'s group " + std::to_string(g));
  }
}

DETTRIAL_INLINE StateDict ContextCheckpoint::python_state(TrainerKey key, Context& c, const std::vector<torch::Tensor>& cpu_rng_per_rank,
                                                          const std::vector<torch::Tensor>& gpu_rng_per_rank) {
  pull_device_optimizer_state(c);
  c10::impl::GenericList models(c10::AnyType::get());
  for (const auto& m : c.models()) models.push_back(module_state_dict(*m));
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) optimizers.push_back(optimizer_state_dict(c.optimizer(i)));
  add_scheduler_group_entries(key, c, optimizers);
  c10::impl::GenericList schedulers(c10::AnyType::get());
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    const WrappedScheduler& s = detail::ContextAccess::lr_scheduler(key, c, i);
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
  // NumPy's and Python's generators, which Determined restores (and requires): carried from the
  // Determined checkpoint this run continues, else as Determined seeds them with the trial seed.
  const c10::IValue& carried = detail::ContextAccess::position(key, c).python_generators;
  const bool carry = carried.isGenericDict();
  rng.insert("np_rng_state", carry ? carried.toGenericDict().at("np_rng_state") : numpy_seeded_state(c.get_trial_seed()));
  rng.insert("random_rng_state", carry ? carried.toGenericDict().at("random_rng_state") : python_random_seeded_state(c.get_trial_seed()));
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("models_state_dict", models);
  out.insert("optimizers_state_dict", optimizers);
  out.insert("lr_schedulers_state_dict", schedulers);
  out.insert("rng_state", rng);
  if (c.scaler()) out.insert("scaler_state_dict", c.scaler()->state_dict());  // Determined's key
  // torchvision's reference recipe's key and layout: AveragedModel.state_dict().
  if (const auto average = c.averaged_weights()) out.insert(averaged_model_key, module_state_dict(*average));
  return out;
}

DETTRIAL_INLINE std::string NativeState::bytes() {
  std::string out;
  archive.save_to([&](const void* data, std::size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  return out;
}

DETTRIAL_INLINE std::optional<NativeState> ContextCheckpoint::native_state(TrainerKey key, Context& c, bool with_grads,
                                                                           const TensorKeeper& keep) {
  pull_device_optimizer_state(c);
  NativeState out;
  bool any = false;
  out.archive.write("format", c10::IValue(checkpoint_format_version));
  torch::serialize::OutputArchive optimizers;
  for (std::size_t i = 0; i < c.num_optimizers(); ++i) {
    if (python_layout_holds(c.optimizer(i))) continue;
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
    any = out.holds_live_state = true;
  }
  out.archive.write("optimizers", optimizers);
  torch::serialize::OutputArchive schedulers;
  for (std::size_t i = 0; i < c.num_lr_schedulers(); ++i) {
    const WrappedScheduler& s = detail::ContextAccess::lr_scheduler(key, c, i);
    if (s.load_python_state) continue;
    torch::serialize::OutputArchive one;
    s.save(s.scheduler, one);
    schedulers.write(std::to_string(i), one);
    any = true;
  }
  out.archive.write("schedulers", schedulers);
  if (with_grads) {
    // By position: the models were checked entry by entry before these are read back.
    torch::serialize::OutputArchive grads;
    for (std::size_t i = 0; i < c.models().size(); ++i) {
      torch::serialize::OutputArchive model;
      const auto params = c.models()[i]->parameters();
      for (std::size_t j = 0; j < params.size(); ++j)
        if (params[j].grad().defined()) model.write(detail::grad_key(j), keep(params[j].grad()), /*is_buffer=*/true);
      grads.write(std::to_string(i), model);
    }
    out.archive.write("grads", grads);
    any = true;
  }
  if (!any) return std::nullopt;
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
    // A model Determined wrapped in DistributedDataParallel saved its names under `module.`.
    load_module_state_dict(*c.models()[i], unwrapped(entry.toGenericDict()), what + ", model " + std::to_string(i) + ",");
  }
}

DETTRIAL_INLINE std::uint64_t ContextCheckpoint::new_rank_seed(const torch::Tensor& chiefs_state, std::int64_t rank) {
  const std::uint32_t crc = tensor_crc32(chiefs_state);  // the checksum checkpoints use
  return mix64(crc ^ (static_cast<std::uint64_t>(rank) * golden_gamma)) >> 1;
}

DETTRIAL_INLINE void ContextCheckpoint::load_rng(TrainerKey key, Context& c, const StateDict& top, const std::filesystem::path& file) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const c10::IValue& rng = require_entry(top, "rng_state", what);
  if (!rng.isGenericDict()) throw CheckpointError(what + ": 'rng_state' is not a dict");
  const StateDict states = rng.toGenericDict();
  // This rank's own state from a job's per-rank list; the chief's on rank 0. A rank the checkpoint's
  // job did not have (a run resumed on more ranks) starts a stream of its own, seeded from the
  // chief's saved state and its rank: different on every rank and at every checkpoint, and the same
  // however often the checkpoint is resumed.
  const auto rank = static_cast<std::size_t>(c.distributed().rank);
  const auto restore = [&](at::Generator generator, const char* per_rank_key, const torch::Tensor& chiefs) {
    const auto per_rank = states.find(per_rank_key);
    const bool listed = per_rank != states.end() && per_rank->value().isList() && rank < per_rank->value().toList().size();
    if (listed) return set_generator_state(generator, per_rank->value().toList().get(rank).toTensor());
    if (rank == 0) return set_generator_state(generator, chiefs);
    std::lock_guard lock(generator.mutex());
    generator.set_current_seed(new_rank_seed(chiefs, c.distributed().rank));
  };
  restore(at::detail::getDefaultCPUGenerator(), "cpu_rng_states", require_entry(states, "cpu_rng_state", what + "'s rng_state").toTensor());
  if (const auto gpu = states.find("gpu_rng_state"); gpu != states.end() && c.device().is_cuda())
    restore(at::globalContext().defaultGenerator(c.device()), "gpu_rng_states", gpu->value().toTensor());
  // NumPy's and Python's states are kept to be written back (dettrial draws from neither), as
  // primitives: an ndarray Determined wrote becomes a list, which NumPy's set_state takes.
  const auto np = states.find("np_rng_state");
  const auto py = states.find("random_rng_state");
  if (np == states.end() || py == states.end()) return;
  auto np_state = np->value().isTuple() ? np->value().toTupleRef().elements().vec() : std::vector<c10::IValue>{};
  if (np_state.size() == 5 && np_state[1].isTensor()) {
    c10::impl::GenericList key(c10::AnyType::get());
    const torch::Tensor k = np_state[1].toTensor().to(torch::kLong).contiguous();
    for (std::int64_t i = 0; i < k.numel(); ++i) key.push_back(k.data_ptr<std::int64_t>()[i]);
    np_state[1] = key;
  }
  c10::impl::GenericDict carried(c10::StringType::get(), c10::AnyType::get());
  carried.insert("np_rng_state", c10::ivalue::Tuple::create(std::move(np_state)));
  carried.insert("random_rng_state", py->value());
  detail::ContextAccess::position(key, c).python_generators = carried;
}

/// Refuses a part of a checkpoint that holds an object of a type dettrial does not read, naming the part.
DETTRIAL_INLINE void refuse_unread_objects(const c10::IValue& part, const std::string& name) {
  if (const auto type = python_object_type(part))
    throw CheckpointError(name + " holds a Python object of type '" + *type + "', which dettrial does not read");
}

DETTRIAL_INLINE void ContextCheckpoint::load_average(Context& c, const StateDict& top, const std::string& what) {
  const auto it = top.find(averaged_model_key);
  if (it == top.end())
    throw CheckpointError(what + " has no '" + averaged_model_key +
                          "' (the trial's averaged model): was it written by a trial without one?");
  const std::string name = what + ", " + averaged_model_key;
  refuse_unread_objects(it->value(), name);
  if (!it->value().isGenericDict()) throw CheckpointError(name + " is not a state dict");
  load_module_state_dict(*c.averaged_weights(), it->value().toGenericDict(), name);
}

DETTRIAL_INLINE void ContextCheckpoint::load_python_layout(TrainerKey key, Context& c, const StateDict& top,
                                                           const std::filesystem::path& file, bool fresh_parts,
                                                           torch::serialize::InputArchive* native) {
  const std::string what = "checkpoint file '" + file.string() + "'";
  const std::string native_what = "checkpoint file '" + (file.parent_path() / layout::libtorch_state).string() + "'";
  const auto part = [&](const std::string& name, const std::function<void()>& load) {
    try {
      load();
    } catch (const CheckpointError& e) {
      if (!fresh_parts)
        throw CheckpointError(std::string(e.what()) + "\n(to continue with " + name +
                              " as the trial makes it, fresh, resume with --resume-fresh-parts)");
      std::fprintf(stderr, "dettrial: warning: %s starts fresh: %s\n", name.c_str(), first_line(e.what()).c_str());
    }
  };
  const auto list_of = [&](const char* key, std::size_t expected, const char* things) {
    const auto it = top.find(key);
    if (it == top.end() || !it->value().isList()) throw CheckpointError(what + " has no list '" + key + "' (Determined's layout)");
    const auto list = it->value().toList();
    if (list.size() != expected)
      throw CheckpointError(what + " holds " + std::to_string(list.size()) + " " + things + ", but the trial wraps " +
                            std::to_string(expected));
    return list;
  };
  // The archive's section for part `index` of `section`. Only a part Python's layout cannot hold
  // is read from it: format 1 archived every part, and LibTorch's archive of one version need not
  // read back in another, where Python's layout does.
  const auto archived = [&](const char* section, std::size_t index, torch::serialize::InputArchive& one) {
    torch::serialize::InputArchive parts;
    return native && native->try_read(section, parts) && parts.try_read(std::to_string(index), one);
  };
  const auto optimizers = list_of("optimizers_state_dict", c.num_optimizers(), "optimizer(s)");
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    part("optimizer " + std::to_string(i), [&] {
      torch::serialize::InputArchive one;
      if (!python_layout_holds(c.optimizer(i)) && archived("optimizers", i, one)) return load_native_optimizer(c, i, one, native_what);
      const std::string name = what + ", optimizer " + std::to_string(i);
      refuse_unread_objects(optimizers.get(i), name);
      if (!optimizers.get(i).isGenericDict()) throw CheckpointError(name + " is not a state dict");
      load_optimizer_state_dict(c.optimizer(i), optimizers.get(i).toGenericDict(), name);
    });
  const auto schedulers = list_of("lr_schedulers_state_dict", c.num_lr_schedulers(), "LR scheduler(s)");
  for (std::size_t i = 0; i < schedulers.size(); ++i)
    part("LR scheduler " + std::to_string(i), [&] {
      const WrappedScheduler& s = detail::ContextAccess::lr_scheduler(key, c, i);
      torch::serialize::InputArchive one;
      if (!s.load_python_state && archived("schedulers", i, one)) return load_native_scheduler(key, c, i, one, native_what);
      const std::string name = what + ", LR scheduler " + std::to_string(i) + (s.type.empty() ? std::string() : " (" + s.type + ")");
      refuse_unread_objects(schedulers.get(i), name);
      if (!s.load_python_state)
        throw CheckpointError(name + ": the trial's scheduler cannot read Python's state (dettrial::optim's schedulers can; " +
                              "LibTorch's own and other types cannot)");
      if (!schedulers.get(i).isGenericDict()) throw CheckpointError(name + " is not a state dict");
      read_scheduler_group_entries(c, s, optimizers, name);
      s.load_python_state(s.scheduler, schedulers.get(i).toGenericDict(), name);
    });
  if (c.averaged_weights()) part("the averaged model", [&] { load_average(c, top, what); });
  if (native) return load_native_grads(c, *native);
  for (const auto& model : c.models())  // nothing pending: Determined checkpoints at optimizer steps
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
}

DETTRIAL_INLINE void ContextCheckpoint::set_generator_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

DETTRIAL_INLINE torch::serialize::InputArchive ContextCheckpoint::read_native(const std::string& bytes, const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read checkpoint file '" + file.string() + "': " + first_line(e.what()));
  }
  return archive;
}

DETTRIAL_INLINE void ContextCheckpoint::load_native_optimizer(Context& c, std::size_t i, torch::serialize::InputArchive& one,
                                                              const std::string& what) {
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

DETTRIAL_INLINE void ContextCheckpoint::load_native_scheduler(TrainerKey key, Context& c, std::size_t i,
                                                              torch::serialize::InputArchive& one, const std::string& what) {
  try {
    const WrappedScheduler& s = detail::ContextAccess::lr_scheduler(key, c, i);
    s.load(s.scheduler, one);
  } catch (const std::exception& e) {
    throw CheckpointError(what + ": LR scheduler " + std::to_string(i) + " cannot be restored: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE void ContextCheckpoint::load_native_grads(Context& c, torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive grads;
  const bool has_grads = archive.try_read("grads", grads);
  for (std::size_t i = 0; i < c.models().size(); ++i) {
    torch::serialize::InputArchive model;
    const bool has_model = has_grads && grads.try_read(std::to_string(i), model);
    auto params = c.models()[i]->parameters();
    for (std::size_t j = 0; j < params.size(); ++j) {
      torch::Tensor g;
      if (has_model && model.try_read(detail::grad_key(j), g, /*is_buffer=*/true)) params[j].mutable_grad() = g.to(params[j].device());
      else if (params[j].grad().defined()) params[j].mutable_grad() = torch::Tensor();  // nothing was pending at the checkpoint
    }
  }
}

}  // namespace dettrial::detail

namespace dettrial {
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
