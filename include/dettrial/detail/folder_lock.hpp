// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief One process per run folder: an advisory `flock` on a file in the folder, which the kernel
/// releases when the holding process ends, however it ends (a SIGKILLed run leaves no stale lock).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "linkage.hpp"

namespace dettrial::detail {

/**
 * @brief The lock of a folder that this process writes into (a run's or an experiment's). A second
 * process asking for it is refused with a FolderInUseError naming the holder's pid and host. Within
 * one process the lock is shared: the command line locks a run folder before it touches it, and the
 * trainer it starts asks again and shares that lock. The lock goes when the last FolderLock of the
 * folder does, or with the process; it is not passed to child processes.
 */
class FolderLock {
 public:
  FolderLock() = default;

  /// Locks `lock_file` (created with its folder if needed), naming `what` (e.g. "run folder") in
  /// the refusal; throws FolderInUseError when another process holds it, after waiting up to
  /// `patience` for it to end (saying so once): a search's trial started anew waits for the
  /// process of a runner that died, which is checkpointing before it ends.
  static FolderLock acquire(const std::filesystem::path& lock_file, const std::string& what,
                            std::chrono::seconds patience = std::chrono::seconds(0));

  bool held() const { return static_cast<bool>(held_); }

 private:
  struct Held;
  std::shared_ptr<Held> held_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "../error.hpp"

namespace dettrial::detail {

struct FolderLock::Held {
  int fd = -1;
  ~Held() {
    if (fd >= 0) ::close(fd);  // releases the flock
  }
};

}  // namespace dettrial::detail

namespace dettrial::detail::folder_lock {
/// The locks this process holds, by lock file: a second acquire shares the first.
inline std::map<std::filesystem::path, std::weak_ptr<void>>& held_here() {
  static std::map<std::filesystem::path, std::weak_ptr<void>> locks;
  return locks;
}
inline std::mutex& held_here_mutex() {
  static std::mutex m;
  return m;
}

inline std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("an unknown host");
}

/// The holder's "pid N on host H", as it wrote it into the lock file.
inline std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<std::size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? std::string("another process (it has not written its pid yet)") : holder;
}
}  // namespace dettrial::detail::folder_lock

namespace dettrial::detail {
DETTRIAL_INLINE FolderLock FolderLock::acquire(const std::filesystem::path& lock_file, const std::string& what,
                                               std::chrono::seconds patience) {
  namespace fl = detail::folder_lock;
  std::error_code ec;
  std::filesystem::create_directories(lock_file.parent_path(), ec);
  const std::filesystem::path key = std::filesystem::weakly_canonical(lock_file, ec);
  std::lock_guard guard(fl::held_here_mutex());
  FolderLock out;
  if (const auto found = fl::held_here().find(key); found != fl::held_here().end())
    if (auto shared = std::static_pointer_cast<Held>(found->second.lock())) {
      out.held_ = std::move(shared);
      return out;
    }
  auto held = std::make_shared<Held>();
  held->fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (held->fd < 0) throw Error("cannot open the lock file '" + lock_file.string() + "': " + std::strerror(errno));
  const auto give_up = std::chrono::steady_clock::now() + patience;
  for (bool said = false; ::flock(held->fd, LOCK_EX | LOCK_NB) != 0;) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw Error("cannot lock '" + lock_file.string() + "': " + std::strerror(errno));
    const std::string in_use = "the " + what + " '" + lock_file.parent_path().string() + "' is in use by " + fl::holder_of(held->fd);
    if (std::chrono::steady_clock::now() >= give_up)
      throw FolderInUseError(in_use + ", which holds its lock " + lock_file.filename().string() +
                             ": wait for it to end, or give this run another folder (--output DIR)");
    if (!said)
      std::fprintf(stderr, "dettrial: %s; waiting up to %llds for it to end\n", in_use.c_str(), static_cast<long long>(patience.count()));
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + fl::host_name() + "\n";
  if (::ftruncate(held->fd, 0) != 0 || ::pwrite(held->fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size()))
    throw Error("cannot write the lock file '" + lock_file.string() + "': " + std::strerror(errno));
  fl::held_here()[key] = held;
  out.held_ = std::move(held);
  return out;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
