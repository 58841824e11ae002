// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Where this process sits in a data-parallel job, read from the launcher's environment:
/// torchrun, Slurm (`srun`), Open MPI / PMI (`mpirun`), plain RANK/WORLD_SIZE, else one process.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// The launcher a LaunchEnvironment was read from.
enum class Launcher { single, torchrun, slurm, mpi, env };

DETTRIAL_INLINE const char* launcher_name(Launcher l);

/**
 * @brief Rank, world size and rendezvous address of this process, as its launcher set them.
 *
 * Checked in this order (Lightning's and Determined's): torchrun (RANK, GROUP_RANK, LOCAL_RANK and
 * LOCAL_WORLD_SIZE all set; with TORCHELASTIC_USE_AGENT_STORE=True the agent hosts the store and
 * every rank is a client under the prefix `/worker/attempt_<restart>`), Slurm (SLURM_PROCID,
 * SLURM_NTASKS; the first node of the job's node list hosts the store, on MASTER_PORT or a port
 * derived from the job id), Open MPI (OMPI_COMM_WORLD_RANK/SIZE) or PMI (PMI_RANK/SIZE), plain
 * RANK and WORLD_SIZE, else one process. MASTER_ADDR and MASTER_PORT override the address.
 */
struct LaunchEnvironment {
  Launcher launcher = Launcher::single;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// torchrun's agent already hosts the TCPStore: every rank connects as a client.
  bool agent_store = false;
  /// The key prefix every store access takes (torchrun's per-restart prefix), or empty.
  std::string store_prefix;
  /// How many times a launcher restarted this job (0: its first start): torchrun's
  /// TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT (a requeued job), the built-in
  /// launcher's DETTRIAL_RESTART. A restarted job continues from its run folder's latest checkpoint.
  int restart = 0;
  /// The restarts the launcher allows (torchrun's TORCHELASTIC_MAX_RESTARTS), when it says.
  std::optional<int> max_restarts;

  bool distributed() const { return size > 1; }

  using Getenv = std::function<const char*(const char*)>;

  /// The integer in environment variable `name` (at least `least`), or nullopt when it is unset or
  /// empty; throws ConfigError naming the variable when it is not such an integer.
  static std::optional<int> env_integer(const Getenv& getenv, const char* name, int least);

  static LaunchEnvironment detect(const Getenv& getenv = [](const char* name) { return std::getenv(name); });

  /// The tasks on node `node` of a Slurm task layout: "2(x3),1" gives 2 for nodes 0-2 and 1 for node 3
  /// (1 when the layout is unreadable or shorter).
  static int slurm_tasks_on_node(std::string_view layout, int node);

  /// The first host of a Slurm node list: "node[03-05,9],gpu1" gives "node03".
  static std::string first_slurm_host(std::string_view list);
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::torchrun: return "torchrun";
    case Launcher::slurm: return "Slurm";
    case Launcher::mpi: return "MPI";
    case Launcher::env: return "RANK/WORLD_SIZE";
    case Launcher::single: break;
  }
  return "single process";
}

DETTRIAL_INLINE std::optional<int> LaunchEnvironment::env_integer(const Getenv& getenv, const char* name, int least) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  int value = 0;
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < least)
    throw ConfigError(std::string("environment variable ") + name + "='" + text + "' is not " +
                      (least > 0 ? "a positive integer" : "a non-negative integer"));
  return value;
}

DETTRIAL_INLINE LaunchEnvironment LaunchEnvironment::detect(const Getenv& getenv) {
  auto has = [&](const char* name) { return getenv(name) != nullptr && *getenv(name) != '\0'; };
  auto integer = [&](const char* name, int fallback) { return env_integer(getenv, name, 0).value_or(fallback); };
  LaunchEnvironment e;
  e.restart = std::max({integer("TORCHELASTIC_RESTART_COUNT", 0), integer("SLURM_RESTART_COUNT", 0), integer("DETTRIAL_RESTART", 0)});
  e.max_restarts = env_integer(getenv, "TORCHELASTIC_MAX_RESTARTS", 0);
  if (has("RANK") && has("GROUP_RANK") && has("LOCAL_RANK") && has("LOCAL_WORLD_SIZE")) {
    e.launcher = Launcher::torchrun;
    e.rank = integer("RANK", 0);
    e.size = integer("WORLD_SIZE", 1);
    e.local_rank = integer("LOCAL_RANK", 0);
    e.local_size = integer("LOCAL_WORLD_SIZE", 1);
    if (const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE"); agent && std::string_view(agent) == "True") {
      e.agent_store = true;
      e.store_prefix = "/worker/attempt_" + std::to_string(integer("TORCHELASTIC_RESTART_COUNT", 0));
    }
  } else if (has("SLURM_PROCID") && (has("SLURM_NTASKS") || has("SLURM_NPROCS"))) {
    e.launcher = Launcher::slurm;
    e.rank = integer("SLURM_PROCID", 0);
    e.size = has("SLURM_NTASKS") ? integer("SLURM_NTASKS", 1) : integer("SLURM_NPROCS", 1);
    e.local_rank = integer("SLURM_LOCALID", 0);
    // Tasks on this node: SLURM_NTASKS_PER_NODE when given, else this node's entry of the step's
    // (or job's) task layout, such as "2(x3),1".
    const char* layout = has("SLURM_STEP_TASKS_PER_NODE") ? getenv("SLURM_STEP_TASKS_PER_NODE") : getenv("SLURM_TASKS_PER_NODE");
    e.local_size = has("SLURM_NTASKS_PER_NODE") ? integer("SLURM_NTASKS_PER_NODE", 1)
                   : layout                     ? slurm_tasks_on_node(layout, integer("SLURM_NODEID", 0))
                                                : 1;
    const char* nodes = has("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST") : getenv("SLURM_JOB_NODELIST");
    if (nodes) e.master_addr = first_slurm_host(nodes);
    // Slurm sets no port: one derived from the job id keeps concurrent jobs on a node apart.
    e.master_port = 10000 + integer("SLURM_JOB_ID", 0) % 20000;
  } else if (has("OMPI_COMM_WORLD_RANK") && has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::mpi;
    e.rank = integer("OMPI_COMM_WORLD_RANK", 0);
    e.size = integer("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_size = integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (has("PMI_RANK") && has("PMI_SIZE")) {
    e.launcher = Launcher::mpi;
    e.rank = integer("PMI_RANK", 0);
    e.size = integer("PMI_SIZE", 1);
    e.local_rank = integer("MPI_LOCALRANKID", 0);
    e.local_size = integer("MPI_LOCALNRANKS", 1);
  } else if (has("RANK") && has("WORLD_SIZE")) {
    e.launcher = Launcher::env;
    e.rank = integer("RANK", 0);
    e.size = integer("WORLD_SIZE", 1);
    e.local_rank = integer("LOCAL_RANK", e.rank);
    e.local_size = integer("LOCAL_WORLD_SIZE", e.size);
  } else {
    return e;
  }
  if (has("MASTER_ADDR")) e.master_addr = getenv("MASTER_ADDR");
  e.master_port = integer("MASTER_PORT", e.master_port);
  if (e.size < 1) throw ConfigError(std::string(launcher_name(e.launcher)) + " gives a world size of 0");
  if (e.rank >= e.size)
    throw ConfigError(std::string(launcher_name(e.launcher)) + " gives rank " + std::to_string(e.rank) + " in a world of " +
                      std::to_string(e.size));
  if (e.master_port < 1 || e.master_port > 65535) throw ConfigError("MASTER_PORT " + std::to_string(e.master_port) + " is not a TCP port");
  return e;
}

DETTRIAL_INLINE int LaunchEnvironment::slurm_tasks_on_node(std::string_view layout, int node) {
  int seen = 0;
  while (!layout.empty()) {
    const std::size_t comma = layout.find(',');
    const std::string_view entry = layout.substr(0, comma);
    int tasks = 0, repeat = 1;
    const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), tasks);
    if (ec != std::errc()) return 1;
    if (const std::string_view rest(end, static_cast<std::size_t>(entry.data() + entry.size() - end)); rest.starts_with("(x"))
      std::from_chars(rest.data() + 2, rest.data() + rest.size(), repeat);
    if (node < seen + repeat) return std::max(tasks, 1);
    seen += repeat;
    if (comma == std::string_view::npos) break;
    layout.remove_prefix(comma + 1);
  }
  return 1;
}

DETTRIAL_INLINE std::string LaunchEnvironment::first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      std::size_t j = i + 1;
      while (j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']') host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
