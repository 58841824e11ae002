// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A trial's checkpoint as the trainer writes and restores it: the Context's state, the
/// callbacks' states, where the trial stands, and the files of Determined's layout (see
/// checkpoint.hpp). The trainer decides when; these functions decide what and how.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../../layout.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../detail/json_fwd.hpp"
#include "../../version.hpp"
#include "../checkpoint.hpp"
#include "load_data.hpp"
#include "snapshot.hpp"
#include "../state_dict.hpp"
#include "../storage.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// Every rank's CPU (and, on GPUs, CUDA) generator state, in rank order; empty for one process.
struct RankRngStates {
  std::vector<torch::Tensor> cpu;
  std::vector<torch::Tensor> gpu;
};

/// Gathers every rank's generator states (a collective: all ranks checkpoint at the same batches).
DETTRIAL_INLINE RankRngStates gather_rng_states(Context& c);

/// Sends the chief's checkpoint uuid to every rank (36 characters); one process keeps its own.
DETTRIAL_INLINE std::string share_uuid(Communicator* comm, const std::string& uuid);

/// state_dict.pth's dict: the Context's Python-readable state and the callbacks' states.
DETTRIAL_INLINE StateDict trial_state_dict(TrainerKey key, Context& c, const RankRngStates& rng, StateDict callback_states);

/// The callbacks' states in a checkpoint's state dict (empty when it has none).
DETTRIAL_INLINE StateDict callback_states_of(const StateDict& top);

/// `load_data.json`: what Determined records to rebuild the trial (config, hyperparameters, type).
DETTRIAL_INLINE Json load_data(const Context& c, std::string_view trial_type);

/// What a trial's checkpoint records besides the Context's state.
struct TrialCheckpointRecord {
  TrialProgress progress;
  /// The checkpoint's place among the trial's checkpoints (1 for the first).
  std::int64_t sequence = 0;
  /// Written between optimizer steps: the pending (aggregated) gradients are saved too.
  bool mid_aggregation = false;
  std::string searcher_metric;
  /// The searcher metric of a validation at this very batch, if there was one.
  std::optional<double> validation_metric;
  std::string trial_type;
};

/**
 * @brief A checkpoint taken at a boundary: its files' contents, every tensor a copy in `snapshot`'s
 * host memory, so that write_checkpoint_files may run on another thread while training changes the
 * live state.
 */
struct TakenCheckpoint {
  std::filesystem::path storage{};
  /// What list_checkpoints will say about it, but its path (known once it is written).
  CheckpointInfo info{};
  c10::IValue state_dict{};
  std::optional<NativeState> native{};
  /// `native` serialized already, when it held live state.
  std::string native_bytes{};
  std::string trial_state{}, determined_trial_state{}, load_data{}, searcher_metric{};
};

/// Takes a checkpoint of the Context (`top` is state_dict.pth's dict) into `snapshot`: on the
/// training thread, at a boundary. Without a snapshot the tensors are the live state's own, and the
/// checkpoint must be written before training goes on.
DETTRIAL_INLINE TakenCheckpoint take_checkpoint(TrainerKey key, Context& c, const std::filesystem::path& storage, const StateDict& top,
                                                const TrialCheckpointRecord& record, HostSnapshot* snapshot);

/// Writes a taken checkpoint into its storage (crash-safe: a temporary directory renamed when
/// complete) and returns what list_checkpoints will say about it. Any thread; at `pace`'s rate if given.
DETTRIAL_INLINE CheckpointInfo write_checkpoint_files(TakenCheckpoint& taken, WritePace* pace = nullptr);

/// Restores the Context's models (names and shapes checked first), optimizers, schedulers, pending
/// gradients and RNGs from checkpoint `dir`, whose state_dict.pth holds `top`. A checkpoint without
/// LibTorch's archive (one Determined wrote) restores its optimizers and schedulers from Python's
/// layout; `fresh_parts` lets a part that cannot be carried over start fresh, with a warning.
DETTRIAL_INLINE void restore_context(TrainerKey key, Context& c, const std::filesystem::path& dir, const StateDict& top,
                                     bool fresh_parts = false);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../detail/json.hpp"
namespace dettrial::detail {

DETTRIAL_INLINE RankRngStates gather_rng_states(Context& c) {
  RankRngStates out;
  Communicator* comm = c.communicator();
  if (!comm) return out;
  for (const torch::Tensor& state : comm->allgather(at::detail::getDefaultCPUGenerator().get_state().to(comm->device())))
    out.cpu.push_back(state.cpu());
  if (c.device().is_cuda())
    for (const torch::Tensor& state : comm->allgather(at::globalContext().defaultGenerator(c.device()).get_state().to(comm->device())))
      out.gpu.push_back(state.cpu());
  return out;
}

DETTRIAL_INLINE std::string share_uuid(Communicator* comm, const std::string& uuid) {
  if (!comm) return uuid;
  std::vector<torch::Tensor> t{torch::zeros({36}, torch::kUInt8)};
  if (comm->rank() == 0) std::memcpy(t[0].data_ptr<std::uint8_t>(), uuid.data(), std::min<std::size_t>(uuid.size(), 36));
  t[0] = t[0].to(comm->device());
  comm->broadcast(t);
  const torch::Tensor host = t[0].cpu();
  return std::string(reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>()), 36);
}

DETTRIAL_INLINE StateDict trial_state_dict(TrainerKey key, Context& c, const RankRngStates& rng, StateDict callback_states) {
  StateDict top = ContextCheckpoint::python_state(key, c, rng.cpu, rng.gpu);
  top.insert("callbacks", std::move(callback_states));
  return top;
}

DETTRIAL_INLINE StateDict callback_states_of(const StateDict& top) {
  if (const auto it = top.find("callbacks"); it != top.end() && it->value().isGenericDict()) return it->value().toGenericDict();
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}

DETTRIAL_INLINE Json load_data(const Context& c, std::string_view trial_type) {
  return LoadData{
      .experiment_config = c.get_experiment_config().yaml, .hparams = c.get_hparams().yaml(), .trial_type = std::string(trial_type)}
      .to_json();
}

DETTRIAL_INLINE TakenCheckpoint take_checkpoint(TrainerKey key, Context& c, const std::filesystem::path& storage, const StateDict& top,
                                                const TrialCheckpointRecord& record, HostSnapshot* snapshot) {
  TakenCheckpoint taken{.storage = storage,
                        .info = {.uuid = new_uuid(),
                                 .batches_trained = record.progress.batches_trained,
                                 .epochs_trained = record.progress.epochs_trained,
                                 .sequence = record.sequence,
                                 .format = checkpoint_format_version,
                                 .validation_metric = record.validation_metric},
                        .trial_state = record.progress.to_json(),
                        .determined_trial_state = record.progress.to_determined_pickle(),
                        .load_data = json_text(load_data(c, record.trial_type)),
                        .searcher_metric = record.searcher_metric};
  if (!snapshot) {
    taken.state_dict = top;
    taken.native = ContextCheckpoint::native_state(key, c, record.mid_aggregation, [](const torch::Tensor& t) { return t; });
    return taken;
  }
  snapshot->begin();
  taken.state_dict = snapshot->take(top);
  taken.native = ContextCheckpoint::native_state(key, c, record.mid_aggregation, [&](const torch::Tensor& t) { return snapshot->keep(t); });
  snapshot->finish();
  if (taken.native && taken.native->holds_live_state) {
    taken.native_bytes = taken.native->bytes();
    taken.native.reset();
  }
  return taken;
}

DETTRIAL_INLINE CheckpointInfo write_checkpoint_files(TakenCheckpoint& taken, WritePace* pace) {
  CheckpointInfo info = taken.info;
  CheckpointWriter writer(taken.storage, info.uuid, pace);
  writer.add_file(layout::state_dict, [&](const CheckpointWriter::ByteSink& sink) { pickle_archive_to(taken.state_dict, sink); });
  if (taken.native)
    writer.add_file(layout::libtorch_state, [&](const CheckpointWriter::ByteSink& sink) {
      taken.native->archive.save_to([&](const void* data, std::size_t n) {
        sink(data, n);
        return n;
      });
    });
  else if (!taken.native_bytes.empty()) writer.add_file(layout::libtorch_state, taken.native_bytes);
  writer.add_file(layout::trial_state, taken.trial_state);
  writer.add_file(layout::determined_trial_state, taken.determined_trial_state);
  writer.add_file(layout::load_data, taken.load_data);
  const std::string framework = "torch-" + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                                std::to_string(TORCH_VERSION_PATCH);
  Json metadata{{"uuid", info.uuid},
                {"steps_completed", info.batches_trained},
                {"epochs_trained", info.epochs_trained},
                {"sequence", info.sequence},
                {"framework", framework},
                {"format", "pickle"},
                {"dettrial_version", DETTRIAL_VERSION_STRING},
                {"dettrial_format", info.format},
                {"searcher_metric", taken.searcher_metric},
                {"validation_metric", nullptr}};
  if (info.validation_metric) metadata["validation_metric"] = *info.validation_metric;
  info.path = writer.commit(std::move(metadata));
  return info;
}

DETTRIAL_INLINE void restore_context(TrainerKey key, Context& c, const std::filesystem::path& dir, const StateDict& top, bool fresh_parts) {
  const std::filesystem::path file = CheckpointFolder{dir}.state_dict();
  ContextCheckpoint::load_models(c, top, file);
  std::error_code ec;
  if (!std::filesystem::exists(CheckpointFolder{dir}.libtorch_state(), ec)) {
    ContextCheckpoint::load_python_layout(key, c, top, file, fresh_parts);  // format 2 without an archive, or Determined's
  } else {
    auto archive = ContextCheckpoint::read_native(read_checked_file(dir, layout::libtorch_state), CheckpointFolder{dir}.libtorch_state());
    ContextCheckpoint::load_python_layout(key, c, top, file, fresh_parts, &archive);
  }
  ContextCheckpoint::load_rng(key, c, top, file);
  // A checkpoint written without a scaler (fp32, or bf16) leaves a new one at its initial scale.
  if (const auto it = top.find("scaler_state_dict"); c.scaler() && it != top.end()) {
    if (!it->value().isGenericDict()) throw CheckpointError("'" + file.string() + "': scaler_state_dict is not a dict");
    c.scaler()->load_state_dict(it->value().toGenericDict());
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
