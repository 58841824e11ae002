// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ProcessSettings: what a training process sets for the whole process (thread pools,
/// determinism, the allocator, the global seed, the variables LibTorch's libraries read), applied
/// once by the process's main and by nothing else.
#pragma once

#include <cstdint>
#include <optional>

#include "../detail/linkage.hpp"
#include "threads.hpp"

namespace dettrial {

/// What ProcessSettings::apply() left the process with: the run's first line says it.
struct AppliedProcess {
  /// The thread count and where it came from; nullopt where the pools were left as they were.
  std::optional<ThreadChoice> threads;
  ThreadPools pools;
  bool deterministic = false;
  /// Whether glibc keeps freed memory (see detail::keep_freed_memory).
  bool keeps_freed_memory = false;
};

/**
 * @brief The settings a training process applies to itself, once, before it builds its trial:
 * library objects (Context, Trainer, Experiment) change nothing process-wide. `dettrial::main`
 * applies the ones its Context derives; a main of one's own makes its Context and then calls
 * `context.process_settings().apply()`:
 * @code{.cpp}
 * dettrial::Context context(config);
 * context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
 * dettrial::Trainer<MyTrial> trainer(context);
 * @endcode
 * Without the call a fit still trains, with LibTorch's thread pools and generators as the process
 * has them (Determined's local mode, which seeds nothing).
 */
struct ProcessSettings {
  /// Every pool that computes gets this many threads (see apply_threads); nullopt leaves them.
  std::optional<ThreadChoice> threads;
  /// LibTorch's switches for bit-identical runs (the config's reproducibility): deterministic
  /// algorithms (an op without a deterministic implementation throws, naming itself), cuDNN's
  /// deterministic kernels and no autotuning, and cuBLAS's fixed workspace
  /// (`CUBLAS_WORKSPACE_CONFIG`, unless set already), which cuBLAS reads before its first use;
  /// nullopt leaves them as they are.
  std::optional<bool> deterministic;
  /// Makes glibc keep the memory a training loop frees (see detail::keep_freed_memory).
  bool keep_freed_memory = true;
  /// Seeds LibTorch's global generators (the CPU's and every CUDA device's); nullopt leaves them.
  std::optional<std::uint64_t> seed;

  /// Applies the settings and records what they left (applied()).
  const AppliedProcess& apply() const;
  /// What the last apply() in this process set; nullopt where none ran.
  static const std::optional<AppliedProcess>& applied() { return record(); }

 private:
  static std::optional<AppliedProcess>& record() {
    static std::optional<AppliedProcess> last;
    return last;
  }
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/utils.h>

#include "../detail/malloc.hpp"

namespace dettrial {

DETTRIAL_INLINE const AppliedProcess& ProcessSettings::apply() const {
  AppliedProcess done;
  if (threads) {
    done.threads = threads;
    done.pools = apply_threads(*threads);
  } else {
    done.pools.intra_op = at::get_num_threads();
    done.pools.inter_op = static_cast<int>(at::get_num_interop_threads());
  }
  if (deterministic) {
    const bool on = *deterministic;
    at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(on);
    at::globalContext().setBenchmarkCuDNN(!on && at::globalContext().benchmarkCuDNN());
    if (on) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
  done.deterministic = at::globalContext().deterministicAlgorithms();
  done.keeps_freed_memory = keep_freed_memory && detail::keep_freed_memory();
  if (seed) torch::manual_seed(*seed);  // CPU and, when present, every CUDA device
  record() = std::move(done);
  return *record();
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
