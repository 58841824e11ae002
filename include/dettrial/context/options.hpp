// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a Context is made with: ContextOptions, and DistributedInfo (where a process sits in
/// a data-parallel job).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/torch.h>

#include "../config/precision.hpp"
#include "../distributed/communicator.hpp"

namespace dettrial {

/// Where a process sits in a data-parallel job. One process: rank 0 of 1.
struct DistributedInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  bool is_chief() const { return rank == 0; }

  // Determined's `context.distributed` getters. Nodes are numbered as launchers place ranks: a
  // node's ranks are consecutive, `local_size` of them (torchrun, srun, mpirun by slot).
  int get_rank() const { return rank; }
  int get_size() const { return size; }
  int get_local_rank() const { return local_rank; }
  int get_local_size() const { return local_size; }
  /// This process's node: `rank / local_size`.
  int get_cross_rank() const { return rank / (local_size > 0 ? local_size : 1); }
  /// The number of nodes: `size / local_size`, rounded up.
  int get_cross_size() const {
    const int per_node = local_size > 0 ? local_size : 1;
    return (size + per_node - 1) / per_node;
  }
};

/// Options that set up a Context (usually taken from the experiment config).
struct ContextOptions {
  /// The seed of every RNG; unset means: derived from `reproducibility.experiment_seed`, else from the clock.
  std::optional<std::uint64_t> trial_seed{};
  /// The device; unset means CUDA device 0 when LibTorch has CUDA and a GPU is present, else the CPU.
  std::optional<torch::Device> device{};
  /// Unset: the experiment config's (`optimizations.aggregation_frequency`), else 1.
  std::optional<std::int64_t> aggregation_frequency{};
  /// Unset: the experiment config's (`optimizations.average_aggregated_gradients`), else true.
  std::optional<bool> average_aggregated_gradients{};
  /// Unset: the experiment config's (`resources.slots_per_trial`), else 1. With a communicator, the
  /// world size (a config asking for another number of slots is an error).
  std::optional<std::int64_t> slots_per_trial{};
  /// The process group of a data-parallel job (see Communicator::create); none for one process.
  std::shared_ptr<Communicator> communicator;
  /// Deterministic algorithms (see ExperimentConfig::deterministic); unset: the config's.
  std::optional<bool> deterministic{};
  /// Results that do not depend on the rank count (see ExperimentConfig::rank_invariant); unset: the config's.
  std::optional<bool> rank_invariant{};
  /// Threads for this process's intra-op and BLAS pools (`--threads`). Unset: OMP_NUM_THREADS when
  /// set, else in a data-parallel job this rank's share of the node's cores, else the CPUs this
  /// process may run on (see dettrial::choose_threads and dettrial::apply_threads).
  std::optional<int> threads;
  /// Autocast around forward passes (and for fp16 a gradient scaler); unset: the config's
  /// `optimizations.mixed_precision`.
  std::optional<Precision> mixed_precision{};
  /// The trial's id in its experiment (Determined's `get_trial_id`). Unset: `DET_TRIAL_ID` from the
  /// environment, which dettrial's search runner sets for each trial (as Determined's agents do),
  /// else 0: a trial run on its own belongs to no experiment.
  std::optional<std::int64_t> trial_id{};
  /// The experiment's id (Determined's `get_experiment_id`). Unset: `DET_EXPERIMENT_ID`, else 0.
  std::optional<std::int64_t> experiment_id{};
};

}  // namespace dettrial
