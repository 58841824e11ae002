// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What lets a checkpoint be written while training goes on: a snapshot of the state in host
/// memory the snapshot owns (reused from one checkpoint to the next), and the background thread that
/// writes it, one checkpoint at a time.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "../../vocabulary/checkpoint.hpp"
#include "../storage.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Copies of a checkpoint's tensors in host memory owned here. The buffers of one snapshot
 * are reused by the next (same place in the state, same shape and type), so a run's checkpoints
 * cost one host copy of the state in all, allocated at the first. A CUDA tensor goes to pinned
 * memory asynchronously; finish() waits for those copies once.
 */
class HostSnapshot {
 public:
  /// Starts a snapshot: the copies that follow reuse the last one's buffers, in order.
  void begin();
  /// `state` with every tensor replaced by its copy; dicts, lists and tuples are copied, other
  /// values shared (they are immutable). Tensors that share storage (tied weights) share one copy,
  /// so each is stored once, as torch.save stores it.
  c10::IValue take(const c10::IValue& state);
  /// One tensor's copy.
  torch::Tensor keep(const torch::Tensor& t);
  /// Ends the snapshot: waits for the copies from a device, once, before any other thread reads them.
  void finish();

  /// The host memory the snapshot holds, in bytes.
  std::size_t bytes() const;

 private:
  c10::IValue copy(const c10::IValue& v);
  torch::Tensor buffer_like(const torch::Tensor& t);

  std::vector<torch::Tensor> buffers_;
  std::size_t next_ = 0;
  bool copied_from_device_ = false;
  std::map<std::tuple<const void*, std::vector<std::int64_t>, std::vector<std::int64_t>, int>, torch::Tensor> taken_;
};

/// The bytes of the tensors in `state` (dicts, lists and tuples searched), tensors sharing storage counted once.
DETTRIAL_INLINE std::size_t tensor_bytes(const c10::IValue& state);

/// The memory the system has available for new allocations (MemAvailable), in bytes; 0 when unknown.
DETTRIAL_INLINE std::size_t available_memory();

/**
 * @brief One checkpoint write at a time on a background thread, whose failure is rethrown where it is
 * collected. Destroying it waits for a write in flight: a checkpoint begun is completed (or its
 * temporary directory removed), even when training fails.
 */
class BackgroundWrite {
 public:
  BackgroundWrite() = default;
  BackgroundWrite(BackgroundWrite&&) noexcept = default;
  BackgroundWrite& operator=(BackgroundWrite&& other) noexcept;
  ~BackgroundWrite();

  /// Runs `write` on a new thread, at a lower priority than training's (see the definition), at
  /// `pace`'s rate if it writes through it: waiting for the write (collect(), destruction) hurries it.
  void start(std::function<CheckpointInfo()> write, std::shared_ptr<WritePace> pace = nullptr);
  /// Runs `write` on this thread (a synchronous checkpoint); collect() returns what it wrote.
  void run_here(const std::function<CheckpointInfo()>& write);
  /// Whether a write was started and not yet collected.
  bool in_flight() const { return future_.valid(); }
  /// Whether that write has ended (collect() then returns at once).
  bool ended() const;
  /// Waits for the write and returns what it wrote, or rethrows its error.
  CheckpointInfo collect();

 private:
  void hurry() const {
    if (pace_) pace_->hurry();
  }
  std::future<CheckpointInfo> future_;
  std::shared_ptr<WritePace> pace_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include <sys/resource.h>
#include <unistd.h>

namespace dettrial::detail {

DETTRIAL_INLINE void HostSnapshot::begin() {
  next_ = 0;
  copied_from_device_ = false;
  taken_.clear();
}

DETTRIAL_INLINE c10::IValue HostSnapshot::take(const c10::IValue& state) { return copy(state); }

DETTRIAL_INLINE void HostSnapshot::finish() {
  if (copied_from_device_) torch::cuda::synchronize();
  copied_from_device_ = false;
  taken_.clear();
}

DETTRIAL_INLINE torch::Tensor HostSnapshot::keep(const torch::Tensor& t) {
  if (!t.defined()) return t;
  const torch::Tensor source = t.detach();
  const auto key = std::make_tuple(static_cast<const void*>(source.data_ptr()), source.sizes().vec(), source.strides().vec(),
                                   static_cast<int>(source.scalar_type()));
  if (const auto found = taken_.find(key); found != taken_.end()) return found->second;
  torch::Tensor copy;
  if (source.layout() != torch::kStrided) {
    copy = source.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);  // sparse: a copy of its own, not reused
  } else {
    copy = buffer_like(source);
    const bool from_device = source.is_cuda();
    copy.copy_(source, /*non_blocking=*/from_device);
    copied_from_device_ = copied_from_device_ || from_device;
  }
  taken_.emplace(key, copy);
  return copy;
}

DETTRIAL_INLINE std::size_t HostSnapshot::bytes() const {
  std::size_t n = 0;
  for (const auto& b : buffers_) n += b.nbytes();
  return n;
}

DETTRIAL_INLINE c10::IValue HostSnapshot::copy(const c10::IValue& v) {
  if (v.isTensor()) return keep(v.toTensor());
  if (v.isGenericDict()) {
    const auto dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    out.reserve(dict.size());
    for (const auto& entry : dict) out.insert(entry.key(), copy(entry.value()));
    return out;
  }
  if (v.isList()) {
    const auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    // By index: a c10::List's iterator yields proxies, and a reference bound through one reads as
    // dangling to GCC 13's -Wdangling-reference (get() returns the element itself, a refcount).
    for (std::size_t i = 0; i < list.size(); ++i) out.push_back(copy(list.get(i)));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : v.toTupleRef().elements()) elements.push_back(copy(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

DETTRIAL_INLINE torch::Tensor HostSnapshot::buffer_like(const torch::Tensor& t) {
  const auto options = torch::TensorOptions().dtype(t.scalar_type()).device(torch::kCPU).pinned_memory(t.is_cuda());
  if (next_ < buffers_.size()) {
    torch::Tensor& reused = buffers_[next_];
    if (reused.sizes() == t.sizes() && reused.scalar_type() == t.scalar_type() && reused.is_pinned() == t.is_cuda()) {
      ++next_;
      return reused;
    }
    reused = torch::empty(t.sizes(), options);  // the state changed shape here (an optimizer's first step): replaced
    return buffers_[next_++];
  }
  buffers_.push_back(torch::empty(t.sizes(), options));
  ++next_;
  return buffers_.back();
}

DETTRIAL_INLINE std::size_t tensor_bytes(const c10::IValue& state) {
  std::set<const void*> storages;
  std::size_t n = 0;
  const std::function<void(const c10::IValue&)> visit = [&](const c10::IValue& v) {
    if (v.isTensor()) {
      const torch::Tensor& t = v.toTensor();
      if (t.defined() && t.layout() == torch::kStrided && storages.insert(t.storage().unsafeGetStorageImpl()).second) n += t.nbytes();
    } else if (v.isGenericDict()) {
      for (const auto& entry : v.toGenericDict()) visit(entry.value());
    } else if (v.isList()) {
      const auto list = v.toList();
      for (std::size_t i = 0; i < list.size(); ++i) visit(list.get(i));  // by index, as in HostSnapshot::copy
    } else if (v.isTuple()) {
      for (const c10::IValue& element : v.toTupleRef().elements()) visit(element);
    }
  };
  visit(state);
  return n;
}

DETTRIAL_INLINE std::size_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return std::strtoull(line.c_str() + 13, nullptr, 10) * 1024;  // in kB
  return 0;
}

DETTRIAL_INLINE BackgroundWrite& BackgroundWrite::operator=(BackgroundWrite&& other) noexcept {
  if (this != &other) {
    hurry();
    if (future_.valid()) future_.wait();
    future_ = std::move(other.future_);
    pace_ = std::move(other.pace_);
  }
  return *this;
}

DETTRIAL_INLINE BackgroundWrite::~BackgroundWrite() {
  hurry();
  if (future_.valid()) future_.wait();
}

DETTRIAL_INLINE void BackgroundWrite::start(std::function<CheckpointInfo()> write, std::shared_ptr<WritePace> pace) {
  pace_ = std::move(pace);
  future_ = std::async(std::launch::async, [write = std::move(write)] {
    // Serializing, checksumming and copying into the page cache take CPU time that the step loop's
    // threads would otherwise get: the writer runs niced, so on a machine whose cores training
    // fills it takes the time training leaves (the write still ends: nice is a share, not a stop).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    return write();
  });
}

DETTRIAL_INLINE void BackgroundWrite::run_here(const std::function<CheckpointInfo()>& write) {
  std::promise<CheckpointInfo> result;
  future_ = result.get_future();
  pace_ = nullptr;
  try {
    result.set_value(write());
  } catch (...) {
    result.set_exception(std::current_exception());
  }
}

DETTRIAL_INLINE bool BackgroundWrite::ended() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

DETTRIAL_INLINE CheckpointInfo BackgroundWrite::collect() {
  hurry();
  return future_.get();
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
