// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How many threads each process computes with: in a data-parallel job its share of the
/// cores, so that the ranks on a node do not each run an OpenMP team as large as the node; and the
/// same count for every pool that computes, LibTorch's intra-op pool and the BLAS library's own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "launch_environment.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// The intra-op thread count a process trains with, and why (printed once at start).
struct ThreadChoice {
  int threads = 1;
  /// Where the number came from: "OMP_NUM_THREADS", "--threads", "SLURM_CPUS_PER_TASK", "CPUs ... bound
  /// to this rank by the launcher", "cores bound to this process", or "cores / ranks on this node".
  std::string source;
  /// Whether dettrial sets it (false: the user's OMP_NUM_THREADS, which LibTorch applies itself).
  bool set_by_dettrial = true;
};

/// What a process computes with when neither `--threads` nor OMP_NUM_THREADS says.
enum class ThreadDefault {
  /// Its share of the cores (all of them for one process): the fastest, and the thread count then
  /// follows the rank count.
  share_of_cores,
  /// One thread per rank, however many ranks: reproducibility.rank_invariant's, whose results must
  /// not depend on the rank count, and a matrix product's rounding depends on its thread count.
  one_per_rank,
};

/// The CPUs this process may run on (its affinity mask), in increasing order.
DETTRIAL_INLINE std::vector<int> allowed_cpus();

/// Sets the calling thread's CPU affinity (inherited by the processes it starts); whether it could.
DETTRIAL_INLINE bool set_thread_cpus(const std::vector<int>& cpus);

/// The cores this process may run on (its affinity mask) and the cores the machine has online.
struct CoreCount {
  int available = 1;
  int online = 1;

  static CoreCount of_this_process();
};

/// The environment variable in which the built-in launcher tells a rank the CPUs it bound it to.
inline constexpr const char* rank_cpus_variable = "DETTRIAL_RANK_CPUS";

/// Rank `rank`'s share when `ranks` processes split `cpus`: contiguous runs whose sizes differ by at
/// most one (the first ranks take the extra CPUs). Empty when there are fewer CPUs than ranks.
DETTRIAL_INLINE std::vector<int> share_of_cpus(const std::vector<int>& cpus, int ranks, int rank);

/// A CPU list as Linux writes one ("0-3,8,10-11").
DETTRIAL_INLINE std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace dettrial

namespace dettrial::detail {
/// The thread count OpenMP takes from OMP_NUM_THREADS: its leading integer ("4", " 8", "4,2" for
/// nested teams); nullopt when unset or unreadable (OpenMP then warns and ignores it itself).
DETTRIAL_INLINE std::optional<int> omp_num_threads(const LaunchEnvironment::Getenv& getenv);
}  // namespace dettrial::detail

namespace dettrial {
/// What each thread pool of this process was left with, for the run's first line.
struct ThreadPools {
  /// LibTorch's intra-op pool (OpenMP or its native pool), which its own kernels split work over.
  int intra_op = 1;
  /// The BLAS library's own pool and where its size came from: "OpenBLAS 2", "OpenBLAS 4 from
  /// OPENBLAS_NUM_THREADS", "MKL 2 following the intra-op pool" (LibTorch sizes an MKL it built in), "BLIS 2"; empty
  /// when the BLAS has no pool dettrial can see (the reference BLAS is single-threaded).
  std::string blas;
  /// LibTorch's inter-op pool (torch::jit::fork and friends; dettrial's loop does not use it).
  int inter_op = 1;

  /// "intra-op 2, OpenBLAS 2, inter-op 2".
  std::string text() const;
};

/**
 * @brief Gives every pool that computes `choice.threads` threads: LibTorch's intra-op pool (unless
 * the count is the user's OMP_NUM_THREADS, which LibTorch applied itself at start), and the BLAS
 * library's own pool, which LibTorch does not size for a BLAS it did not build in: OpenBLAS (whose
 * pthread build otherwise starts one thread per CPU it sees, whatever the launcher decided) and
 * BLIS through their APIs, found at run time; an MKL built into LibTorch follows the intra-op pool
 * by itself. A user's own OPENBLAS_NUM_THREADS or BLIS_NUM_THREADS is left as it is, and named.
 */
DETTRIAL_INLINE ThreadPools
apply_threads(const ThreadChoice& choice, const LaunchEnvironment::Getenv& getenv = [](const char* name) { return std::getenv(name); });

/**
 * @brief The threads per rank: the user's choice wins (`requested`, from `--threads` or
 * ContextOptions, then OMP_NUM_THREADS, which torchrun sets to 1 by itself), then Slurm's
 * SLURM_CPUS_PER_TASK, then, under launchers that bind each rank to its own cores (dettrial's
 * built-in launcher, mpirun, srun), the cores this process is bound to, else the cores available
 * divided by the ranks on this node (torchrun without OMP_NUM_THREADS, the built-in launcher on fewer
 * cores than ranks; also a mask shared by all ranks, such as taskset's or a container's). One
 * process with no choice made takes the CPUs it may run on (LibTorch's own default counts physical
 * cores on some builds, and Debian's 1.13 then trains on one of two hyperthreads). With
 * `ThreadDefault::one_per_rank` (rank_invariant) every process without a choice of the user's takes one.
 */
DETTRIAL_INLINE ThreadChoice choose_threads(
    const LaunchEnvironment& env, std::optional<int> requested, CoreCount cores,
    const LaunchEnvironment::Getenv& getenv = [](const char* name) { return std::getenv(name); },
    ThreadDefault fallback = ThreadDefault::share_of_cores);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <dlfcn.h>
#include <sched.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace dettrial {

DETTRIAL_INLINE std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

DETTRIAL_INLINE bool set_thread_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) CPU_SET(cpu, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

DETTRIAL_INLINE CoreCount CoreCount::of_this_process() {
  CoreCount c;
  c.online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto allowed = allowed_cpus();
  c.available = allowed.empty() ? c.online : static_cast<int>(allowed.size());
  return c;
}

DETTRIAL_INLINE std::vector<int> share_of_cpus(const std::vector<int>& cpus, int ranks, int rank) {
  const auto n = static_cast<std::ptrdiff_t>(cpus.size());
  if (ranks < 1 || rank < 0 || rank >= ranks || n < ranks) return {};
  const std::ptrdiff_t base = n / ranks, extra = n % ranks;
  const std::ptrdiff_t first = rank * base + std::min<std::ptrdiff_t>(rank, extra);
  return {cpus.begin() + first, cpus.begin() + first + base + (rank < extra ? 1 : 0)};
}

DETTRIAL_INLINE std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return text;
}

}  // namespace dettrial

namespace dettrial::detail {
DETTRIAL_INLINE std::optional<int> omp_num_threads(const LaunchEnvironment::Getenv& getenv) {
  const char* text = getenv("OMP_NUM_THREADS");
  if (text == nullptr) return std::nullopt;
  while (*text == ' ' || *text == '\t') ++text;
  int value = 0;
  const char* end = text;
  while (*end >= '0' && *end <= '9' && value < 1'000'000) value = value * 10 + (*end++ - '0');
  if (end == text || value < 1) return std::nullopt;
  return value;
}
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE ThreadChoice choose_threads(const LaunchEnvironment& env, std::optional<int> requested, CoreCount cores,
                                            const LaunchEnvironment::Getenv& getenv, ThreadDefault fallback) {
  if (requested) {
    if (*requested < 1) throw ConfigError("the thread count must be at least 1, not " + std::to_string(*requested));
    return ThreadChoice{.threads = *requested, .source = "--threads"};
  }
  if (const auto omp = detail::omp_num_threads(getenv))
    return ThreadChoice{.threads = *omp, .source = "OMP_NUM_THREADS", .set_by_dettrial = false};
  if (fallback == ThreadDefault::one_per_rank)
    return ThreadChoice{.threads = 1, .source = "reproducibility.rank_invariant: one per rank, whatever the rank count"};
  if (!env.distributed())
    return ThreadChoice{.threads = cores.available,
                        .source = std::string(cores.available == 1 ? "the CPU" : "the " + std::to_string(cores.available) + " CPUs") +
                                  " this process may run on"};
  if (env.launcher == Launcher::slurm)
    if (const auto per_task = LaunchEnvironment::env_integer(getenv, "SLURM_CPUS_PER_TASK", 1))
      return ThreadChoice{.threads = *per_task, .source = "SLURM_CPUS_PER_TASK"};
  if (const char* bound = getenv(rank_cpus_variable); bound && *bound)
    return ThreadChoice{.threads = cores.available,
                        .source = (cores.available == 1 ? "CPU " : "CPUs ") + std::string(bound) + " bound to this rank by the launcher"};
  const bool binds_ranks = env.launcher == Launcher::mpi || env.launcher == Launcher::slurm;
  if (binds_ranks && cores.available < cores.online)
    return ThreadChoice{.threads = cores.available, .source = "cores bound to this process"};
  const int ranks_here = std::max(1, std::min(env.local_size, env.size));
  return ThreadChoice{.threads = std::max(1, cores.available / ranks_here),
                      .source = std::to_string(cores.available) + " cores / " + std::to_string(ranks_here) + " ranks on this node"};
}

DETTRIAL_INLINE std::string ThreadPools::text() const {
  return "intra-op " + std::to_string(intra_op) + (blas.empty() ? std::string() : ", " + blas) + ", inter-op " + std::to_string(inter_op);
}

}  // namespace dettrial

namespace dettrial::detail {
/// A function of the loaded libraries by its C name, or null (dlsym over the global scope, where the
/// BLAS library that LibTorch links is).
template <class F>
F* loaded_function(const char* name) {
  return reinterpret_cast<F*>(::dlsym(RTLD_DEFAULT, name));
}

/// Sizes a BLAS pool through its library's setter and reads back what it took: "OpenBLAS 2".
template <class Int>
std::string size_blas_pool(const char* library, const char* variable, void (*set)(Int), Int (*get)(), int threads,
                           const LaunchEnvironment::Getenv& getenv) {
  const char* own = getenv(variable);
  const bool users = own != nullptr && *own != '\0';
  if (!users) set(static_cast<Int>(threads));
  const long long took = get ? static_cast<long long>(get()) : threads;
  return std::string(library) + " " + std::to_string(took) + (users ? " from " + std::string(variable) : std::string());
}
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE ThreadPools apply_threads(const ThreadChoice& choice, const LaunchEnvironment::Getenv& getenv) {
  if (choice.set_by_dettrial) at::set_num_threads(choice.threads);
  ThreadPools pools;
  pools.intra_op = at::get_num_threads();
  pools.inter_op = static_cast<int>(at::get_num_interop_threads());
  if (at::globalContext().hasMKL()) {
    pools.blas = "MKL " + std::to_string(pools.intra_op) + " following the intra-op pool";
  } else if (auto* set = detail::loaded_function<void(int)>("openblas_set_num_threads")) {
    pools.blas = detail::size_blas_pool<int>("OpenBLAS", "OPENBLAS_NUM_THREADS", set,
                                             detail::loaded_function<int()>("openblas_get_num_threads"), choice.threads, getenv);
  } else if (auto* set_blis = detail::loaded_function<void(std::int64_t)>("bli_thread_set_num_threads")) {
    pools.blas =
        detail::size_blas_pool<std::int64_t>("BLIS", "BLIS_NUM_THREADS", set_blis,
                                             detail::loaded_function<std::int64_t()>("bli_thread_get_num_threads"), choice.threads, getenv);
  } else if (auto* set_mkl = detail::loaded_function<void(int)>("MKL_Set_Num_Threads")) {
    pools.blas = detail::size_blas_pool<int>("MKL", "MKL_NUM_THREADS", set_mkl, detail::loaded_function<int()>("MKL_Get_Max_Threads"),
                                             choice.threads, getenv);
  }
  return pools;
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
