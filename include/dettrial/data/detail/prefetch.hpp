// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Background batch reading: worker threads fill a bounded ring of batches that the consumer
/// takes strictly in order, so the order never depends on the number of workers.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace dettrial::detail {

/**
 * @brief Reads items `first, first+1, ..., end-1` with `workers` threads, at most `depth` ahead of the
 * consumer. Workers claim positions in turn and write them to slot `position % depth`; `take()` returns
 * them in position order. An exception in a worker is rethrown by the `take()` of its position.
 */
template <class T>
class Prefetcher {
 public:
  using Read = std::function<T(std::int64_t)>;

  Prefetcher(Read read, std::int64_t first, std::int64_t end, int workers, int depth)
      : read_(std::move(read)),
        next_claim_(first),
        next_take_(first),
        end_(end),
        slots_(static_cast<std::size_t>(std::max(depth, workers))) {
    threads_.reserve(static_cast<std::size_t>(workers));
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  ~Prefetcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// The next item, in order; waits for it if a worker is still reading it.
  T take() {
    std::unique_lock lock(mutex_);
    Slot& slot = slots_[index(next_take_)];
    changed_.wait(lock, [&] { return slot.position == next_take_ && (slot.value || slot.error); });
    std::exception_ptr error = slot.error;
    std::optional<T> value = std::move(slot.value);
    slot.value.reset();
    slot.error = nullptr;
    slot.position = -1;
    ++next_take_;
    lock.unlock();
    changed_.notify_all();
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }

 private:
  struct Slot {
    std::int64_t position = -1;
    std::optional<T> value;
    std::exception_ptr error;
  };

  std::size_t index(std::int64_t position) const { return static_cast<std::size_t>(position % static_cast<std::int64_t>(slots_.size())); }

  void work() {
    yield_to_compute();
    for (;;) {
      std::int64_t position;
      {
        std::unique_lock lock(mutex_);
        // Claim the next position once its slot is free: at most slots_.size() ahead of the consumer.
        changed_.wait(
            lock, [&] { return stopping_ || next_claim_ >= end_ || next_claim_ < next_take_ + static_cast<std::int64_t>(slots_.size()); });
        if (stopping_ || next_claim_ >= end_) return;
        position = next_claim_++;
      }
      std::optional<T> value;
      std::exception_ptr error;
      try {
        value.emplace(read_(position));
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        Slot& slot = slots_[index(position)];
        slot.position = position;
        slot.value = std::move(value);
        slot.error = error;
      }
      changed_.notify_all();
    }
  }

  /// Lowers this worker thread's scheduling priority (nice + 5): where the training step's threads
  /// already use every core, a worker waking to read ahead then yields to them instead of
  /// preempting one of an intra-op team, which stalls the whole team at its next barrier. A worker
  /// that has the cores to itself runs as fast as before.
  static void yield_to_compute() {
    const auto thread = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, thread);
    if (errno == 0) ::setpriority(PRIO_PROCESS, thread, std::min(nice + 5, 19));
  }

  Read read_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::int64_t next_claim_;
  std::int64_t next_take_;
  std::int64_t end_;
  bool stopping_ = false;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
};

}  // namespace dettrial::detail
