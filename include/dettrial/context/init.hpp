// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial::init: Determined's `det.pytorch.init()` for a main of one's own (the PyTorch
/// Trainer API's style): a Context made as a training process's main makes it, in one call.
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "../config/experiment_config.hpp"
#include "../config/hyperparameters.hpp"
#include "../detail/linkage.hpp"
#include "../distributed/communicator.hpp"
#include "context.hpp"

namespace dettrial {

/// What dettrial::init makes a Context from: Determined's `pytorch.init(hparams=, exp_conf=,
/// distributed=)`, and the rest of the Context's options.
struct InitOptions {
  /// The trial's hyperparameters (Python's `hparams=`); unset: the experiment config's.
  std::optional<Hyperparameters> hparams{};
  /// The experiment config (Python's `exp_conf=`); unset: an empty one, as local training without a
  /// config has.
  std::optional<ExperimentConfig> exp_conf{};
  /// The job's process group (Python's `distributed=`); unset: joined from the launcher's
  /// environment when torchrun, srun, mpirun or dettrial's launcher started this process as one rank
  /// of several (Gloo on the CPU, NCCL on a GPU), none in one process.
  std::shared_ptr<Communicator> distributed{};
  /// How long the ranks wait for each other, at the rendezvous and in each collective (dettrial::main's
  /// `--timeout` default).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// The rest of the Context's options (a communicator there counts as `distributed`).
  ContextOptions context{};
};

/**
 * @brief Determined's `det.pytorch.init()`: a Context for a main of one's own, made as
 * dettrial::main makes it: the job's ranks joined (InitOptions::distributed) and the process's
 * settings applied (threads, determinism, the allocator, the trial's seed: ProcessSettings) before
 * the trial is built, so its weights and data order are what `dettrial::main` would give it. A
 * Context is not movable (its wrapped objects point into it): it comes back owned.
 * @code{.cpp}
 * auto context = dettrial::init({.exp_conf = dettrial::ExperimentConfig::load_file("const.yaml")});
 * dettrial::Trainer<MnistTrial> trainer(*context);
 * trainer.fit({.max_length = dettrial::Batch(100)});  // unset: the config's searcher.max_length
 * @endcode
 */
DETTRIAL_INLINE std::unique_ptr<Context> init(InitOptions options = {});

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <utility>

#include "../process/launch_environment.hpp"

namespace dettrial {

DETTRIAL_INLINE std::unique_ptr<Context> init(InitOptions o) {
  ContextOptions options = std::move(o.context);
  if (o.distributed) options.communicator = std::move(o.distributed);
  if (!options.communicator) {
    const LaunchEnvironment env = LaunchEnvironment::detect();
    if (env.distributed()) options.communicator = Communicator::create(env, o.timeout, backend::gpu_or_gloo{});
  }
  ExperimentConfig config = o.exp_conf ? std::move(*o.exp_conf) : ExperimentConfig{};
  auto context = o.hparams ? std::make_unique<Context>(std::move(*o.hparams), std::move(config), std::move(options))
                           : std::make_unique<Context>(config, std::move(options));
  context->process_settings().apply();
  return context;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
