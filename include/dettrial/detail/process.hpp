// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Starting child processes (ranks of the built-in launcher, trials of an experiment) with
/// extra environment variables and their output sent to a file.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <unistd.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "linkage.hpp"

extern "C" char** environ;

namespace dettrial::detail {

struct SpawnOptions {
  /// `NAME=value` entries added to this process's environment; each replaces an inherited variable
  /// of the same name (getenv would otherwise find the inherited one first).
  std::vector<std::string> extra_env{};
  /// Inherited variables left out of the child's environment: those whose names start with one of these.
  std::vector<std::string> drop_env_prefixes{};
  /// Where stdout goes (and stderr, with merge_stderr); empty: inherited.
  std::string output{};
  bool append = false;
  bool merge_stderr = true;
  /// Starts the child in a process group of its own: a terminal's Ctrl-C (sent to the foreground
  /// group) then reaches it only through the supervisor that forwards it, once.
  bool own_process_group = false;
};

/// Starts `program` with `args` as its argv (the program name first); returns its pid.
DETTRIAL_INLINE pid_t spawn_process(const std::string& program, std::vector<std::string> args, const SpawnOptions& options = {});

/// Runs `program` to its end and returns its waitpid status. Waited for here, by pid: a
/// supervisor's own waitpid(-1) loop never takes it.
DETTRIAL_INLINE int run_and_wait(const std::string& program, std::vector<std::string> args, const SpawnOptions& options = {});

/// The path of executable `name` on PATH, or "" when there is none.
DETTRIAL_INLINE std::string find_on_path(const std::string& name);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>

namespace dettrial::detail {

DETTRIAL_INLINE int run_and_wait(const std::string& program, std::vector<std::string> args, const SpawnOptions& options) {
  int status = 0;
  const pid_t pid = spawn_process(program, std::move(args), options);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

DETTRIAL_INLINE std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

DETTRIAL_INLINE pid_t spawn_process(const std::string& program, std::vector<std::string> args, const SpawnOptions& options) {
  std::vector<std::string> env_strings;
  auto name_of = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e; ++e) {
    const std::string_view name = name_of(*e);
    const bool replaced =
        std::any_of(options.extra_env.begin(), options.extra_env.end(), [&](const std::string& extra) { return name_of(extra) == name; });
    const bool dropped = std::any_of(options.drop_env_prefixes.begin(), options.drop_env_prefixes.end(),
                                     [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; });
    if (!replaced && !dropped) env_strings.emplace_back(*e);
  }
  env_strings.insert(env_strings.end(), options.extra_env.begin(), options.extra_env.end());
  std::vector<char*> env, argv;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.output.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.output.c_str(),
                                     O_WRONLY | O_CREAT | (options.append ? O_APPEND : O_TRUNC), 0644);
    if (options.merge_stderr) posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (options.own_process_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), env.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error("cannot start '" + program + "'");
  return pid;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
