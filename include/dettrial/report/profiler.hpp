// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The `profiling` section at work: LibTorch's profiler over a range of training batches,
/// written as a Chrome trace (`trace.json`, for Perfetto or chrome://tracing).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "../config/experiment_config.hpp"
#include "../detail/atomic_file.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief Profiles the global batches `begin_on_batch` to `end_after_batch` (inclusive; unset: to
 * the end of training) with LibTorch's profiler: operators on the CPU, and kernels on the GPU where
 * LibTorch has Kineto and the trial runs on CUDA.
 *
 * Outside the range it costs two integer comparisons a batch. The trace is written when the range
 * ends, or when training ends or stops inside it.
 */
class TraceProfiler {
 public:
  TraceProfiler() = default;
  TraceProfiler(const ExperimentConfig::Profiling& options, std::filesystem::path trace_path, bool cuda)
      : options_(options), trace_path_(std::move(trace_path)), cuda_(cuda) {}
  // Moved only before it starts (the trainer's set-up); a moved-from profiler never stops LibTorch's.
  TraceProfiler(TraceProfiler&& o) noexcept { *this = std::move(o); }
  TraceProfiler& operator=(TraceProfiler&& o) noexcept {
    options_ = o.options_;
    trace_path_ = std::move(o.trace_path_);
    cuda_ = o.cuda_;
    running_ = std::exchange(o.running_, false);
    done_ = o.done_;
    first_batch_ = o.first_batch_;
    written_ = std::move(o.written_);
    summary_ = std::move(o.summary_);
    return *this;
  }
  ~TraceProfiler();

  /// Before batch `batch_idx` trains: starts at `begin_on_batch` (or at a resume inside the range).
  void before_batch(std::int64_t batch_idx) {
    if (starts_at(batch_idx)) start(batch_idx);
  }
  /// Whether before_batch(batch_idx) would start profiling.
  bool starts_at(std::int64_t batch_idx) const {
    return options_.enabled && !running_ && !done_ && batch_idx >= options_.begin_on_batch &&
           (!options_.end_after_batch || batch_idx <= *options_.end_after_batch);
  }
  /// After batch `batch_idx` trained: stops and writes the trace after `end_after_batch`. True
  /// when it wrote the trace (summary() says where).
  bool after_batch(std::int64_t batch_idx) {
    if (!running_ || !options_.end_after_batch || batch_idx < *options_.end_after_batch) return false;
    stop(batch_idx);
    return true;
  }
  /// Training ended or stopped after batch `last_batch`: writes the trace if the range is still
  /// open. True when it wrote it.
  bool finish(std::int64_t last_batch) {
    if (!running_) return false;
    stop(last_batch);
    return true;
  }
  bool running() const { return running_; }
  /// The trace written, once written.
  const std::optional<std::filesystem::path>& written() const { return written_; }
  /// What happened, for the run's log ("profiled batches 5-9: trace.json (Kineto)").
  const std::string& summary() const { return summary_; }

 private:
  void start(std::int64_t batch_idx);
  void stop(std::int64_t batch_idx);

  ExperimentConfig::Profiling options_{};
  std::filesystem::path trace_path_{};
  bool cuda_ = false;
  bool running_ = false;
  bool done_ = false;
  std::int64_t first_batch_ = 0;
  std::optional<std::filesystem::path> written_{};
  std::string summary_{};
};

/// Writes a Chrome trace of `result`'s events ourselves: for LibTorch builds without Kineto, whose
/// `ProfilerResult::save` refuses (Debian's 1.13). Complete events ("ph":"X") in microseconds.
DETTRIAL_INLINE void write_chrome_trace(const torch::autograd::profiler::ProfilerResult& result, const std::filesystem::path& path);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

namespace dettrial::detail {

DETTRIAL_INLINE TraceProfiler::~TraceProfiler() {
  // A fit that throws inside the range leaves the profiler on this thread: turn it off, no trace.
  if (running_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }
}

DETTRIAL_INLINE void TraceProfiler::start(std::int64_t batch_idx) {
  namespace impl = torch::profiler::impl;
  impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/false,
                              /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda_) activities.insert(impl::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  running_ = true;
  first_batch_ = batch_idx;
}

DETTRIAL_INLINE void TraceProfiler::stop(std::int64_t batch_idx) {
  if (cuda_) torch::cuda::synchronize();  // the last kernels belong in the trace
  // Off first, whatever follows: a profiler left on would refuse the next fit on this thread.
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  done_ = true;
  // A trace that cannot be written is said, not thrown: the training it profiled goes on.
  try {
    std::error_code ec;
    std::filesystem::create_directories(trace_path_.parent_path(), ec);
    std::string how = "Kineto";
    try {
      result->save(trace_path_.string());
    } catch (const c10::Error&) {
      // Without Kineto, save() refuses; the events are there all the same.
      write_chrome_trace(*result, trace_path_);
      how = "LibTorch's profiler without Kineto: CPU operators";
    }
    written_ = trace_path_;
    summary_ = "profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) + ": " + trace_path_.string() +
               " (" + std::to_string(result->events().size()) + " events; " + how + ")";
  } catch (const std::exception& e) {
    summary_ = "warning: profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) +
               ", but the trace could not be written to " + trace_path_.string() + ": " + e.what();
  }
}

/// An event's start and duration in microseconds: LibTorch 2.x counts nanoseconds, 1.13 microseconds.
template <class Event>
std::pair<double, double> event_span_us(const Event& e) {
  if constexpr (requires { e.startNs(); })
    return {static_cast<double>(e.startNs()) / 1000.0, static_cast<double>(e.durationNs()) / 1000.0};
  else
    return {static_cast<double>(e.startUs()), static_cast<double>(e.durationUs())};
}

DETTRIAL_INLINE void write_chrome_trace(const torch::autograd::profiler::ProfilerResult& result, const std::filesystem::path& path) {
  nlohmann::json events = nlohmann::json::array();
  const auto pid = static_cast<std::int64_t>(::getpid());
  for (const auto& e : result.events()) {
    const auto [start_us, duration_us] = event_span_us(e);
    const bool on_gpu = e.deviceType() == c10::DeviceType::CUDA;
    events.push_back({{"ph", "X"},
                      {"name", e.name()},
                      {"cat", on_gpu ? "kernel" : "cpu_op"},
                      {"ts", start_us},
                      {"dur", duration_us},
                      {"pid", pid},
                      {"tid", static_cast<std::int64_t>(e.startThreadId())}});
  }
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"},
                                {"otherData", {{"writer", "dettrial"}}}};
  detail::write_atomically(path, trace.dump());
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
