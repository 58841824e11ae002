// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a Context's constructor decides once, from its options and the experiment config:
/// where the process sits (ranks, device, the slots), the trial's seed and ids, its threads and
/// determinism, and the settings of its training step.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/torch.h>

#include "../../config/experiment_config.hpp"
#include "../../config/precision.hpp"
#include "../../detail/linkage.hpp"
#include "../../distributed/communicator.hpp"
#include "../../process/process_settings.hpp"
#include "../../process/threads.hpp"
#include "../../step/detail/step_mode.hpp"
#include "../options.hpp"

namespace dettrial::detail {

/// A non-negative integer id from environment variable `name`; 0 when unset; ConfigError when not a number.
DETTRIAL_INLINE std::int64_t id_from_environment(const char* name);

/// What a Context is set up with (see setup_context).
struct ContextSetup {
  /// The job's ranks: the communicator's size, else `resources.slots_per_trial`.
  std::int64_t slots_per_trial = 1;
  std::uint64_t trial_seed = 0;
  std::int64_t trial_id = 0;
  std::int64_t experiment_id = 0;
  torch::Device device{torch::kCPU};
  DistributedInfo distributed{};
  /// The job's process group (null in one process).
  std::shared_ptr<Communicator> communicator{};
  ThreadChoice threads{};
  std::optional<bool> deterministic{};
  Precision precision = Precision::fp32;
  /// The training step's settings (its communicator is `communicator`).
  StepSettings step{};
};

/**
 * @brief The setup `options` and `config` give (ContextOptions says what each unset option
 * becomes): the communicator's ranks checked against `resources.slots_per_trial`; the device the
 * local rank picks, checked against the communicator's backend; the chief's seed broadcast to every
 * rank; the threads and determinism rank_invariant asks for. A ConfigError names what cannot be.
 */
DETTRIAL_INLINE ContextSetup setup_context(const ExperimentConfig& config, ContextOptions options);

/// In a job, after the trial and its data loaders were built from the same seed on every rank:
/// ranks other than the chief continue on a stream of their own, derived from the trial seed and
/// the rank, so that their dropout masks and other draws differ.
DETTRIAL_INLINE void seed_rank_stream(const ContextSetup& setup);

/// A trial's seed: a value in [0, 2^31) drawn from the experiment seed, as Determined's master draws
/// trial seeds; without an experiment seed, from the clock (Determined's default).
DETTRIAL_INLINE std::uint64_t derive_trial_seed(std::optional<std::uint64_t> experiment_seed);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

#include "../../detail/random.hpp"
#include "../../error.hpp"
#include "../../process/launch_environment.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE std::int64_t id_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  char* end = nullptr;
  errno = 0;
  const long long id = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || id < 0)
    throw ConfigError(std::string(name) + " is '" + text + "'; it must be a trial or experiment id (a non-negative integer)");
  return id;
}

DETTRIAL_INLINE void seed_rank_stream(const ContextSetup& setup) {
  if (setup.distributed.rank > 0)
    torch::manual_seed(mix64(setup.trial_seed ^ (static_cast<std::uint64_t>(setup.distributed.rank) * golden_gamma)) >> 1);
}

DETTRIAL_INLINE std::uint64_t derive_trial_seed(std::optional<std::uint64_t> experiment_seed) {
  std::uint64_t x =
      experiment_seed ? *experiment_seed : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return mix64(x + golden_gamma) % (1ULL << 31);
}

}  // namespace dettrial::detail

namespace dettrial::detail::setup {
/// The communicator's ranks, checked against the config's slots.
inline void join(ContextSetup& s, ContextOptions& options) {
  if (!options.communicator || options.communicator->size() <= 1) return;
  s.communicator = std::move(options.communicator);
  const LaunchEnvironment& env = s.communicator->environment();
  if (s.slots_per_trial > 1 && s.slots_per_trial != env.size)
    throw ConfigError("resources.slots_per_trial is " + std::to_string(s.slots_per_trial) + ", but " + launcher_name(env.launcher) +
                      " started " + std::to_string(env.size) + " processes");
  s.slots_per_trial = env.size;
  s.distributed = DistributedInfo{.rank = env.rank, .size = env.size, .local_rank = env.local_rank, .local_size = env.local_size};
}

/// One GPU per process: the local rank picks it. NCCL takes tensors on one GPU only: models,
/// gradients and every collective must be there (Gloo takes CPU tensors, and CUDA ones too).
inline void pick_device(ContextSetup& s, const ContextOptions& options) {
  const LaunchEnvironment alone{};  // one process: local rank 0
  s.device = options.device ? *options.device
                            : (torch::cuda::is_available()
                                   ? torch::Device(torch::kCUDA, local_gpu_index(s.communicator ? s.communicator->environment() : alone))
                                   : torch::Device(torch::kCPU));
  if (s.communicator && !s.communicator->device().is_cpu() && s.communicator->device() != s.device)
    throw ConfigError(std::string("the ") + s.communicator->backend_name() + " backend of rank " + std::to_string(s.distributed.rank) +
                      " takes tensors on " + s.communicator->device().str() + ", but this process's device is " + s.device.str() +
                      "; give every rank the device its local rank picks (or leave ContextOptions::device unset)");
}
}  // namespace dettrial::detail::setup

namespace dettrial::detail {

DETTRIAL_INLINE ContextSetup setup_context(const ExperimentConfig& config, ContextOptions options) {
  ContextSetup s;
  s.slots_per_trial = options.slots_per_trial.value_or(config.slots_per_trial);
  s.step.aggregation_frequency = options.aggregation_frequency.value_or(config.aggregation_frequency);
  s.step.average_aggregated_gradients = options.average_aggregated_gradients.value_or(config.average_aggregated_gradients);
  if (s.step.aggregation_frequency < 1) throw ConfigError("aggregation_frequency must be at least 1");
  if (s.slots_per_trial < 1) throw ConfigError("slots_per_trial must be at least 1");
  setup::join(s, options);
  setup::pick_device(s, options);
  s.trial_seed = options.trial_seed ? *options.trial_seed : derive_trial_seed(config.experiment_seed);
  s.trial_id = options.trial_id ? *options.trial_id : id_from_environment("DET_TRIAL_ID");
  s.experiment_id = options.experiment_id ? *options.experiment_id : id_from_environment("DET_EXPERIMENT_ID");
  // One trial seed for the job: the chief's (without an experiment seed each rank's clock differs,
  // and the ranks would shard different permutations of the data).
  if (s.communicator)
    s.trial_seed = static_cast<std::uint64_t>(s.communicator->broadcast_values({static_cast<std::int64_t>(s.trial_seed)})[0]);
  const bool rank_invariant = options.rank_invariant.value_or(config.rank_invariant);
  s.threads = choose_threads(
      s.communicator ? s.communicator->environment() : LaunchEnvironment{}, options.threads, CoreCount::of_this_process(),
      [](const char* name) { return std::getenv(name); }, rank_invariant ? ThreadDefault::one_per_rank : ThreadDefault::share_of_cores);
  s.deterministic = options.deterministic ? options.deterministic : config.deterministic;
  // On a GPU the ordered sums alone do not give the same bits: cuDNN's and atomic kernels may round
  // differently from run to run (the MNIST example's 1 and 2 ranks ended 3e-8 apart on an H200).
  // Unless the user chose, rank_invariant asks for the deterministic ones there.
  if (rank_invariant && s.device.is_cuda() && !s.deterministic) s.deterministic = true;
  s.precision = options.mixed_precision.value_or(config.mixed_precision);
  s.step.communicator = s.communicator.get();
  s.step.rank_invariant = rank_invariant;
  s.step.trial_seed = s.trial_seed;
  s.step.rank = s.distributed.rank;
  s.step.ranks = s.distributed.size;
  return s;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
