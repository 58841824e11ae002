// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The built-in launcher (`--nproc N`): the ranks of a data-parallel job on this machine, each
/// bound to its own share of the CPUs, with signals forwarded and a failed rank named.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../detail/exit_status.hpp"
#include "../../detail/process.hpp"
#include "../../detail/signals.hpp"
#include "../../process/threads.hpp"
#include "../../error.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// A free TCP port on the loopback interface (the kernel picks it).
DETTRIAL_INLINE int free_local_port();

/**
 * @brief The built-in launcher: runs this program `nproc` times with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (one machine), forwards SIGINT/SIGTERM to them,
 * and waits. With `bind_cpus` and at least one CPU per rank, each rank is bound to its own share of
 * the CPUs this process may use (as mpirun binds ranks to cores: unbound, the ranks' threads
 * migrate between cores and the 2-rank MNIST job trained about 15% slower) and told which in
 * DETTRIAL_RANK_CPUS. When one rank fails, the others get `grace` to fail on their own (their
 * collectives time out) and are then killed. Returns 0 when all succeed, exit_status_interrupted
 * when all stopped on a signal, else 1 after naming the rank that failed first.
 */
DETTRIAL_INLINE int launch_local(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus = true);

/// How a job of the built-in launcher ended: launch_local's status, and the rank that failed first (-1: none).
struct LaunchOutcome {
  int status = 0;
  int first_failure = -1;
};

/// launch_local, with `extra_env` ("NAME=value") in every rank's environment, saying which rank failed first.
DETTRIAL_INLINE LaunchOutcome run_local_ranks(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus,
                                              const std::vector<std::string>& extra_env);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace dettrial::detail {

DETTRIAL_INLINE int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok =
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("cannot find a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

DETTRIAL_INLINE int launch_local(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus) {
  return run_local_ranks(args, nproc, grace, bind_cpus, {}).status;
}

DETTRIAL_INLINE LaunchOutcome run_local_ranks(const std::vector<std::string>& args, int nproc, std::chrono::seconds grace, bool bind_cpus,
                                              const std::vector<std::string>& extra_env) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int port = free_local_port();
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  std::vector<int> statuses(static_cast<std::size_t>(nproc), -1);
  supervisor_signal.store(0);
  supervisor_signal_count.store(0);
  const SignalHandlers handlers(&dettrial_on_supervisor_signal);
  const std::vector<int> all_cpus = allowed_cpus();
  for (int rank = 0; rank < nproc; ++rank) {
    // Each rank in a process group of its own: a Ctrl-C reaches it once, forwarded from here.
    SpawnOptions options{.extra_env = {"MASTER_ADDR=127.0.0.1", std::string(supervisor_pid_variable) + "=" + std::to_string(::getpid())},
                         .own_process_group = true};
    options.extra_env.insert(options.extra_env.end(), extra_env.begin(), extra_env.end());
    for (const auto& [key, value] : {std::pair{"RANK", rank}, std::pair{"WORLD_SIZE", nproc}, std::pair{"LOCAL_RANK", rank},
                                     std::pair{"LOCAL_WORLD_SIZE", nproc}, std::pair{"MASTER_PORT", port}})
      options.extra_env.push_back(std::string(key) + "=" + std::to_string(value));
    // The child inherits the affinity of the thread that starts it: bind this thread, start, restore.
    const std::vector<int> cpus = bind_cpus ? share_of_cpus(all_cpus, nproc, rank) : std::vector<int>{};
    const bool bound = !cpus.empty() && set_thread_cpus(cpus);
    if (bound) options.extra_env.push_back(std::string(rank_cpus_variable) + "=" + cpu_list_text(cpus));
    try {
      pids[static_cast<std::size_t>(rank)] = spawn_process(self, args, options);
    } catch (...) {
      if (bound) set_thread_cpus(all_cpus);
      throw;
    }
    if (bound) set_thread_cpus(all_cpus);
  }
  int running = nproc, first_failure = -1, forwarded = 0;
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (const int signals = supervisor_signal_count.load(); signals > forwarded) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (statuses[r] < 0) ::kill(pids[r], supervisor_signal.load());
      forwarded = signals;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (pids[r] == pid) {
          statuses[r] = status;
          --running;
          const auto end = ProcessEnd::from_wait_status(status);
          if (!end.succeeded() && !end.interrupted() && first_failure < 0) {
            first_failure = static_cast<int>(r);
            kill_at = std::chrono::steady_clock::now() + grace;
          }
        }
      continue;
    }
    if (std::chrono::steady_clock::now() >= kill_at) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (statuses[r] < 0) ::kill(pids[r], SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failure >= 0) {
    const auto end = ProcessEnd::from_wait_status(statuses[static_cast<std::size_t>(first_failure)]);
    std::fprintf(stderr, "error: rank %d of %d %s\n", first_failure, nproc,
                 end.signal ? ("was killed by signal " + std::to_string(*end.signal)).c_str()
                            : ("exited with status " + std::to_string(end.exit_code.value_or(-1))).c_str());
    // A configuration error stays one: whoever started this job must not retry it.
    return {end.config_error() ? exit_status_config_value : 1, first_failure};
  }
  bool all_interrupted = true;
  for (const int status : statuses) all_interrupted = all_interrupted && ProcessEnd::from_wait_status(status).interrupted();
  return {all_interrupted ? exit_status_interrupted_value : 0, -1};
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
