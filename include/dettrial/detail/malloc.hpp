// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Keeping freed memory in the process: glibc's malloc settings for a training loop.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdlib>
#include <initializer_list>

#if defined(__GLIBC__) && __has_include(<malloc.h>)
#include <malloc.h>
#define DETTRIAL_HAS_MALLOPT 1
#endif

#include "linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Makes glibc keep the memory a training loop frees, once per process; returns whether it did.
 *
 * By default glibc serves each block above its mmap threshold with a fresh mapping and unmaps it on
 * free, and trims the heap's free top: a loop that frees and re-allocates the same megabytes of
 * activations and gradients every batch then takes thousands of page faults a batch, each zeroing a
 * page (the MNIST example: 1.9 million faults in 300 batches, about a quarter of its time). With the
 * mmap threshold at its maximum (32 MiB) and trimming only beyond 1 GiB, freed blocks are reused;
 * the process keeps what it used at its peak. Left alone when the user tuned malloc (a `MALLOC_*_`
 * variable or `GLIBC_TUNABLES`) or set `DETTRIAL_MALLOC=system`.
 */
DETTRIAL_INLINE bool keep_freed_memory();

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE bool keep_freed_memory() {
#if defined(DETTRIAL_HAS_MALLOPT)
  static const bool applied = [] {
    for (const char* name : {"DETTRIAL_MALLOC", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                             "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX"})
      if (const char* value = std::getenv(name); value && *value) return false;
    return ::mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1 && ::mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1 &&
           ::mallopt(M_TOP_PAD, 64 * 1024 * 1024) == 1;
  }();
  return applied;
#else
  return false;
#endif
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
