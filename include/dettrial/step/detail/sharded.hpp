// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step of ZeRO stage 1 (`optimizations.zero_stage: 1`): the gradients
/// all-reduced as data parallel does, each rank stepping the optimizer state of its 1/N of the
/// parameters (distributed/optimizer_shards.hpp), then every rank's updated range all-gathered. A
/// checkpoint's whole state is cut into this rank's pieces when the fit starts (on any rank
/// count), and the pieces are gathered whole for each checkpoint, so that it is written as an
/// unsharded run writes it.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "../../distributed/communicator.hpp"
#include "../../distributed/detail/gradient_buckets.hpp"
#include "../../distributed/detail/optimizer_shards.hpp"
#include "../../detail/linkage.hpp"
#include "step_mode.hpp"

namespace dettrial::detail {

/// ZeRO-1: optimizer state sharded over the ranks, gradients and parameters whole on each.
class ShardedStep {
 public:
  static constexpr std::string_view name = "sharded";
  explicit ShardedStep(const StepSettings& settings)
      : communicator_(settings.communicator), aggregation_frequency_(settings.aggregation_frequency) {}

  /// Why ZeRO cannot shard `optimizer`, or empty when it can.
  static std::string refusal(torch::optim::Optimizer& optimizer);

  void begin_batch(std::int64_t, std::int64_t) {}
  void before_backward(std::span<WrappedOptimizer>, bool update_batch) {
    for (auto& s : shards_) s.buckets->arm(update_batch);
  }
  void reduce(WrappedOptimizer& w, std::span<WrappedOptimizer>, std::int64_t) {
    shards_[w.index].buckets->all_reduce();
    average_over_aggregation(w, aggregation_frequency_);
  }
  /// The optimizer steps this rank's pieces (the scaler's skip decided on the whole gradients, the
  /// same on every rank), then every rank gets every rank's parameters.
  void step(WrappedOptimizer& w, PrecisionStep& precision);
  void finish_batch(std::span<WrappedOptimizer>, bool) {}
  /// Every optimizer cut into shards over the ranks, and the whole state it holds (a checkpoint's,
  /// loaded before) cut into this rank's pieces, the rest dropped.
  void start_fit(std::span<WrappedOptimizer> all);
  /// Each optimizer's state gathered whole into the chief's (a collective: every rank calls it, at
  /// the same place). The chief holds the whole state while the result lives.
  WholeStates whole_states(std::span<WrappedOptimizer> all);
  /// A TrialError: the shards are cut once, when the fit starts.
  [[noreturn]] void params_changed(WrappedOptimizer& w, std::size_t count);

 private:
  /// One optimizer's shards over its (padded) buckets, which they point into: neither moves.
  struct Shards {
    std::unique_ptr<GradientBuckets> buckets;
    std::unique_ptr<OptimizerShards> shards;
  };
  Communicator* communicator_;  // never null
  std::int64_t aggregation_frequency_;
  std::vector<Shards> shards_;  // per optimizer, by wrap order
};
static_assert(TrainingStepMode<ShardedStep>);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "../../error.hpp"
#include "../../optim/fused.hpp"
#include "../../optim/handles.hpp"
#include "../../optim/python_layout.hpp"

namespace dettrial::detail::sharded_step {

using StateMap = std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

/// Whether a state entry holds one value per element of its parameter (`numel` of them), so that
/// ZeRO cuts it; the rest (`step`, ...) are per parameter and every piece has them whole.
inline bool per_element(const std::string& key, const c10::IValue& value, const torch::Tensor& like) {
  return key != "step" && value.isTensor() && value.toTensor().sizes() == like.sizes();
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

/// Each piece's state in Python's entries, read once (none where the piece has no state).
inline std::vector<std::optional<c10::impl::GenericDict>> piece_entries(OptimizerShards& shards, const optim::OptimizerLayout& layout) {
  auto& map = shards.optimizer().state();
  const auto& pieces = shards.pieces();
  std::vector<std::optional<c10::impl::GenericDict>> entries(pieces.size());
  for (std::size_t i = 0; i < pieces.size(); ++i)
    if (const auto it = map.find(optimizer_state_key<StateMap>(pieces[i].tensor)); it != map.end()) {
      entries[i].emplace(c10::StringType::get(), c10::AnyType::get());
      layout.write_state(*it->second, *entries[i]);
    }
  return entries;
}

/// Every rank's per-parameter entries gathered ({parameter: {key: value}}, the per-element ones as
/// names only): every rank then knows which parameters have state and what it holds. Returns the
/// entries that are not per element, whole, and (in `per_element_keys`) the names of the others.
inline std::map<std::size_t, c10::impl::GenericDict> gather_entry_names(OptimizerShards& shards,
                                                                        const std::vector<std::optional<c10::impl::GenericDict>>& entries,
                                                                        std::set<std::string>& per_element_keys) {
  const auto& pieces = shards.pieces();
  c10::impl::GenericDict mine(c10::IntType::get(), c10::AnyType::get());
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const auto& piece = pieces[i];
    if (!entries[i] || mine.contains(static_cast<std::int64_t>(piece.param))) continue;
    c10::impl::GenericDict described(c10::StringType::get(), c10::AnyType::get());
    for (const auto& entry : *entries[i]) {
      const std::string& key = entry.key().toStringRef();
      described.insert(key, per_element(key, entry.value(), piece.tensor) ? c10::IValue("per element") : entry.value());
    }
    mine.insert(static_cast<std::int64_t>(piece.param), described);
  }
  std::map<std::size_t, c10::impl::GenericDict> whole;  // parameter -> its entries, whole
  for (const c10::IValue& rank : shards.communicator().allgather_object(mine))
    for (const auto& entry : rank.toGenericDict()) {
      const auto k = static_cast<std::size_t>(entry.key().toInt());
      const auto slot = whole.try_emplace(k, c10::StringType::get(), c10::AnyType::get()).first;
      for (const auto& e : entry.value().toGenericDict()) {
        const bool cut = e.value().isString() && e.value().toStringRef() == "per element";
        if (cut) per_element_keys.insert(e.key().toStringRef());
        if (!cut) slot->second.insert_or_assign(e.key(), e.value());
      }
    }
  return whole;
}

}  // namespace dettrial::detail::sharded_step

namespace dettrial::detail {

DETTRIAL_INLINE std::string ShardedStep::refusal(torch::optim::Optimizer& optimizer) {
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

DETTRIAL_INLINE void ShardedStep::step(WrappedOptimizer& w, PrecisionStep& precision) {
  OptimizerShards& shards = *shards_[w.index].shards;
  bool stepped = true;
  {
    const auto stepping = shards.stepping();
    stepped = precision.step(*w.optimizer, w.params);
  }
  if (stepped) shards.all_gather_parameters();
}

DETTRIAL_INLINE void ShardedStep::start_fit(std::span<WrappedOptimizer> all) {
  shards_.clear();
  shards_.reserve(all.size());
  for (WrappedOptimizer& w : all) {
    refresh_params(w);
    // Gradients as views of the buckets where a view shares memory with its base (the CPU and CUDA;
    // not, for one, LibTorch's lazy device, whose views are replayed): a rank then holds them once.
    using Layout = GradientBuckets::GradientLayout;
    const bool aliasing = std::all_of(w.params.begin(), w.params.end(), [](const torch::Tensor& p) { return p.is_cpu() || p.is_cuda(); });
    Shards s;
    s.buckets = std::make_unique<GradientBuckets>(*communicator_, w.params, communicator_->size(),
                                                  aliasing ? Layout::bucket_views : Layout::copied);
    s.shards = std::make_unique<OptimizerShards>(*communicator_, *s.buckets, *w.optimizer);
    sharded_step::cut_whole_state(*s.shards);
    shards_.push_back(std::move(s));
  }
}

DETTRIAL_INLINE WholeStates ShardedStep::whole_states(std::span<WrappedOptimizer>) {
  WholeStates made;
  const bool chief = communicator_->rank() == 0;
  for (Shards& s : shards_) {
    OptimizerShards& shards = *s.shards;
    torch::optim::Optimizer& optimizer = shards.optimizer();
    if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) capturable->pull_host_state();
    const auto& params = shards.params();
    const optim::OptimizerLayout& layout = *optim::python_layout_of(optimizer);  // sharded: it has one
    const auto entries = sharded_step::piece_entries(shards, layout);
    std::set<std::string> per_element_keys;
    std::map<std::size_t, c10::impl::GenericDict> whole = sharded_step::gather_entry_names(shards, entries, per_element_keys);
    const auto& pieces = shards.pieces();
    for (const std::string& key : per_element_keys) {
      shards.all_gather(
          [&](const OptimizerShards::Piece& piece, torch::Tensor region) {
            const auto& piece_state = entries[static_cast<std::size_t>(&piece - pieces.data())];
            if (!piece_state) return;
            if (const auto e = piece_state->find(key); e != piece_state->end() && e->value().isTensor())
              region.copy_(e->value().toTensor());
          },
          [&](std::size_t b, const torch::Tensor& flat) {
            if (!chief) return;
            for (const auto& [k, offset] : shards.buckets()[b].members)
              if (const auto w = whole.find(k); w != whole.end())
                w->second.insert_or_assign(key, flat.narrow(0, offset, params[k].numel()).view(params[k].sizes()).clone());
          });
    }
    if (!chief) continue;
    std::vector<torch::Tensor> with_state;
    for (const auto& [k, state] : whole) {
      optimizer.state()[optimizer_state_key<sharded_step::StateMap>(params[k])] =
          layout.read_state(state, params[k], "ZeRO: the gathered state of parameter " + std::to_string(k));
      with_state.push_back(params[k]);
    }
    made.add(optimizer, std::move(with_state));
  }
  return made;
}

DETTRIAL_INLINE void ShardedStep::params_changed(WrappedOptimizer& w, std::size_t count) {
  throw TrialError("an optimizer's parameter groups changed from " + std::to_string(w.params.size()) + " to " + std::to_string(count) +
                   " parameters during training; with ZeRO (optimizations.zero_stage 1) its shards are cut once, when the fit "
                   "starts: add the parameters before it (frozen ones stay still with requires_grad off)");
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
