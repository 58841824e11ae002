// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ZeRO's optimizer state and the checkpoints: the state a checkpoint loaded (whole, in
/// Python's layout) cut into this rank's pieces when the fit starts, on any rank count; and the
/// pieces gathered whole for a checkpoint, so that it is written as an unsharded run writes it.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../config/experiment_config.hpp"
#include "../context/context.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Whether ZeRO `stage` applies to this context's trial (always for ZeroStage::off): a
 * ConfigError naming why not: an optimizer ZeRO cannot shard, rank_invariant, a single rank.
 */
DETTRIAL_INLINE void check_shardable(const Context& context, ZeroStage stage);

/**
 * @brief Starts ZeRO `stage` for a fit (nothing for ZeroStage::off): checked (check_shardable),
 * every wrapped optimizer is cut into shards over the ranks, and the whole state it holds (a
 * checkpoint's, loaded before) is cut into this rank's pieces, the rest dropped; a parameter that is
 * not dense and contiguous is refused. Every rank calls it (a collective only in what it refuses:
 * every rank refuses alike).
 */
DETTRIAL_INLINE void shard_optimizer_states(TrainerKey key, Context& context, ZeroStage stage);

/**
 * @brief For the checkpoint being taken: each sharded optimizer's state gathered whole into the
 * chief's optimizer, keyed by its parameters as an unsharded run keeps it, so the checkpoint's
 * writers (Python's layout) read it unchanged; dropped again when this object ends. A collective:
 * every rank makes one, at the same place. The chief holds the whole state for that time.
 */
class WholeOptimizerStates {
 public:
  explicit WholeOptimizerStates(TrainerKey key, Context& context);
  WholeOptimizerStates(const WholeOptimizerStates&) = delete;
  WholeOptimizerStates& operator=(const WholeOptimizerStates&) = delete;
  ~WholeOptimizerStates();

 private:
  /// The chief's entries made for the checkpoint, per optimizer: (optimizer, its parameters with state).
  std::vector<std::pair<torch::optim::Optimizer*, std::vector<torch::Tensor>>> made_{};
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <map>
#include <optional>
#include <set>

#include "../distributed/optimizer_shards.hpp"
#include "../error.hpp"
#include "../optim/fused.hpp"
#include "../optim/handles.hpp"
#include "../optim/python_layout.hpp"
#include "state_dict.hpp"

namespace dettrial::detail::sharded_state {

using StateMap = std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

/// Whether a state entry holds one value per element of its parameter (`numel` of them), so that
/// ZeRO cuts it; the rest (`step`, ...) are per parameter and every piece has them whole.
inline bool per_element(const std::string& key, const c10::IValue& value, const torch::Tensor& like) {
  return key != "step" && value.isTensor() && value.toTensor().sizes() == like.sizes();
}

/// Why ZeRO cannot shard `optimizer`, or empty when it can.
inline std::string unshardable(torch::optim::Optimizer& optimizer) {
  const optim::OptimizerLayout* layout = optim::python_layout_of(optimizer);
  if (!layout) return "it has no Python layout (dettrial::optim::python_layout), which ZeRO's checkpoints need to write and cut its state";
  if (!layout->elementwise)
    return layout->name +
           " updates each parameter whole, not element by element (its python_layout is not elementwise: Muon "
           "orthogonalizes each weight matrix whole), and ZeRO's shards cut parameters apart";
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.is_sparse() || !p.is_contiguous()) return "a parameter of it is not a dense, contiguous tensor";
  return {};
}

/// The whole state the optimizer holds for its parameters (loaded from a checkpoint) cut into this
/// rank's pieces: each piece's state made from its parameter's, sliced; the parameters' dropped.
inline void cut_whole_state(OptimizerShards& shards) {
  torch::optim::Optimizer& optimizer = shards.optimizer();
  auto& map = optimizer.state();
  std::vector<StateMap::key_type> whole;
  for (const auto& p : shards.params())
    if (map.find(optimizer_state_key<StateMap>(p)) != map.end()) whole.push_back(optimizer_state_key<StateMap>(p));
  if (whole.empty()) return;
  const optim::OptimizerLayout& layout = *optim::python_layout_of(optimizer);  // shardable: it has one
  for (const auto& piece : shards.pieces()) {
    const torch::Tensor& p = shards.params()[piece.param];
    const auto it = map.find(optimizer_state_key<StateMap>(p));
    if (it == map.end()) continue;
    c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
    layout.write_state(*it->second, entries);
    c10::impl::GenericDict cut(c10::StringType::get(), c10::AnyType::get());
    for (const auto& entry : entries) {
      const std::string& key = entry.key().toStringRef();
      cut.insert(key, per_element(key, entry.value(), p)
                          ? c10::IValue(entry.value().toTensor().reshape({-1}).narrow(0, piece.start, piece.tensor.numel()).clone())
                          : entry.value());
    }
    map[optimizer_state_key<StateMap>(piece.tensor)] =
        layout.read_state(cut, piece.tensor, "ZeRO: the loaded state of parameter " + std::to_string(piece.param));
  }
  for (const auto& key : whole) map.erase(key);
  // A fused optimizer's device-side state follows its (piece) state.
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) {
    const auto stepping = shards.stepping();
    capturable->push_device_state();
  }
}

}  // namespace dettrial::detail::sharded_state

namespace dettrial::detail {

DETTRIAL_INLINE void check_shardable(const Context& context, ZeroStage stage) {
  if (stage == ZeroStage::off) return;
  for (std::size_t i = 0; i < context.num_optimizers(); ++i)
    if (const std::string why = sharded_state::unshardable(context.optimizer(i)); !why.empty())
      throw ConfigError("ZeRO (optimizations.zero_stage 1) cannot shard optimizer " + std::to_string(i) + " (" +
                        c10::demangle(typeid(context.optimizer(i)).name()) + "): " + why);
  if (context.rank_invariant())
    throw ConfigError(
        "ZeRO (optimizations.zero_stage 1) and reproducibility.rank_invariant do not go together: rank_invariant sums every "
        "gradient in the data stream's order on every rank, and steps whole parameters; set one of them off");
  if (!context.communicator())
    throw ConfigError(
        "ZeRO (optimizations.zero_stage 1) shards the optimizer state over the ranks of a data-parallel job, and this run has one "
        "rank: start 2 or more (--nprocs, torchrun), or set zero_stage 0");
}

DETTRIAL_INLINE void shard_optimizer_states(TrainerKey key, Context& context, ZeroStage stage) {
  check_shardable(context, stage);
  if (stage == ZeroStage::off) return;
  for (std::size_t i = 0; i < context.num_optimizers(); ++i)
    sharded_state::cut_whole_state(ContextAccess::shard_optimizer(key, context, i));
}

DETTRIAL_INLINE WholeOptimizerStates::WholeOptimizerStates(TrainerKey key, Context& context) {
  const bool chief = context.distributed().is_chief();
  for (std::size_t i = 0; i < context.num_optimizers(); ++i) {
    OptimizerShards* shards = ContextAccess::optimizer_shards(key, context, i);
    if (!shards) continue;
    torch::optim::Optimizer& optimizer = shards->optimizer();
    if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) capturable->pull_host_state();
    auto& map = optimizer.state();
    const auto& params = shards->params();
    const optim::OptimizerLayout& layout = *optim::python_layout_of(optimizer);  // sharded: it has one
    // Each piece's state in Python's entries, read once (none where the piece has no state).
    const auto& pieces = shards->pieces();
    std::vector<std::optional<c10::impl::GenericDict>> piece_entries(pieces.size());
    for (std::size_t i = 0; i < pieces.size(); ++i)
      if (const auto it = map.find(optimizer_state_key<sharded_state::StateMap>(pieces[i].tensor)); it != map.end()) {
        piece_entries[i].emplace(c10::StringType::get(), c10::AnyType::get());
        layout.write_state(*it->second, *piece_entries[i]);
      }
    // Each rank's per-parameter entries ({parameter: {key: value}}, the per-element ones as names
    // only), gathered: every rank then knows which parameters have state and what it holds.
    c10::impl::GenericDict mine(c10::IntType::get(), c10::AnyType::get());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const auto& piece = pieces[i];
      if (!piece_entries[i] || mine.contains(static_cast<std::int64_t>(piece.param))) continue;
      const c10::impl::GenericDict& entries = *piece_entries[i];
      c10::impl::GenericDict described(c10::StringType::get(), c10::AnyType::get());
      for (const auto& entry : entries) {
        const std::string& key = entry.key().toStringRef();
        described.insert(key, sharded_state::per_element(key, entry.value(), piece.tensor) ? c10::IValue("per element") : entry.value());
      }
      mine.insert(static_cast<std::int64_t>(piece.param), described);
    }
    std::map<std::size_t, c10::impl::GenericDict> whole;  // parameter -> its entries, whole
    std::set<std::string> per_element_keys;
    for (const c10::IValue& rank : shards->communicator().allgather_object(mine))
      for (const auto& entry : rank.toGenericDict()) {
        const auto k = static_cast<std::size_t>(entry.key().toInt());
        const auto slot = whole.try_emplace(k, c10::StringType::get(), c10::AnyType::get()).first;
        for (const auto& e : entry.value().toGenericDict()) {
          const bool cut = e.value().isString() && e.value().toStringRef() == "per element";
          if (cut) per_element_keys.insert(e.key().toStringRef());
          if (!cut) slot->second.insert_or_assign(e.key(), e.value());
        }
      }
    for (const std::string& key : per_element_keys) {
      shards->all_gather(
          [&](const OptimizerShards::Piece& piece, torch::Tensor region) {
            const auto& entries = piece_entries[static_cast<std::size_t>(&piece - pieces.data())];
            if (!entries) return;
            if (const auto e = entries->find(key); e != entries->end() && e->value().isTensor()) region.copy_(e->value().toTensor());
          },
          [&](std::size_t b, const torch::Tensor& flat) {
            if (!chief) return;
            for (const auto& [k, offset] : shards->buckets()[b].members)
              if (const auto w = whole.find(k); w != whole.end())
                w->second.insert_or_assign(key, flat.narrow(0, offset, params[k].numel()).view(params[k].sizes()).clone());
          });
    }
    if (!chief) continue;
    std::vector<torch::Tensor> made;
    for (const auto& [k, entries] : whole) {
      map[optimizer_state_key<sharded_state::StateMap>(params[k])] =
          layout.read_state(entries, params[k], "ZeRO: the gathered state of parameter " + std::to_string(k));
      made.push_back(params[k]);
    }
    made_.emplace_back(&optimizer, std::move(made));
  }
}

DETTRIAL_INLINE WholeOptimizerStates::~WholeOptimizerStates() {
  for (auto& [optimizer, params] : made_)
    for (const auto& p : params) optimizer->state().erase(optimizer_state_key<sharded_state::StateMap>(p));
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
