// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LibTorch's profiler over training batches on a `torch.profiler.schedule`: set by
/// `Context::set_profiler` (each cycle's trace where TensorBoard's profile plugin reads it), or by
/// the config's `profiling` section (one bounded range of batches, `trace.json`, for Perfetto or chrome://tracing).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "../../config/experiment_config.hpp"
#include "../../config/profiler_options.hpp"
#include "../../detail/atomic_file.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// Where a profiler's traces go: one file (the `profiling` section's `trace.json`), or one file a
/// cycle in a folder, named as TensorBoard's profile plugin lists them
/// (`<folder>/<host>_<pid>.<milliseconds>.pt.trace.json`, as `tensorboard_trace_handler` names them).
struct TraceFiles {
  std::filesystem::path path;
  bool one_a_cycle = false;
};

/**
 * @brief LibTorch's profiler on a `torch.profiler.schedule` (see ProfilerOptions): operators on the
 * CPU, and kernels on the GPU where LibTorch has Kineto and the trial runs on CUDA.
 *
 * Step k is training batch `first_step_batch + k`. Before each batch the schedule's action decides:
 * warm up (the profiler prepared, nothing kept), record (on, with the batch inside a
 * `ProfilerStep#k` range, as Python's `profiler.step()` marks it), or nothing; after the last active
 * batch of a cycle the trace is written. Outside the recorded steps it costs an integer division a
 * batch. A cycle still open when training ends or stops is written then.
 */
class TraceProfiler {
 public:
  TraceProfiler() = default;
  TraceProfiler(ProfilerOptions options, std::int64_t first_step_batch, TraceFiles files, bool cuda)
      : options_(std::move(options)), first_step_batch_(first_step_batch), files_(std::move(files)), cuda_(cuda), enabled_(true) {}
  /// The config's `profiling` section as a schedule: the global batches `begin_on_batch` to
  /// `last_traced_batch()` recorded in one cycle, into `trace`. A resumed run inside the range
  /// records the rest of it. (LibTorch's profiler holds every event of a cycle in memory until the
  /// cycle ends: an unbounded range would grow with the run.)
  static TraceProfiler for_section(const ExperimentConfig::Profiling& section, std::filesystem::path trace, bool cuda) {
    ProfilerOptions o;
    o.record_shapes = true;
    o.schedule = {.wait = 0,
                  .warmup = 0,
                  .active = std::max<std::int64_t>(section.last_traced_batch() - section.begin_on_batch + 1, 1),
                  .repeat = 1,
                  .skip_first = section.begin_on_batch};
    return TraceProfiler(std::move(o), 0, TraceFiles{std::move(trace), false}, cuda);
  }
  // Moved only before it starts (the trainer's set-up); a moved-from profiler never stops LibTorch's.
  TraceProfiler(TraceProfiler&& o) noexcept { *this = std::move(o); }
  TraceProfiler& operator=(TraceProfiler&& o) noexcept {
    options_ = std::move(o.options_);
    first_step_batch_ = o.first_step_batch_;
    files_ = std::move(o.files_);
    cuda_ = o.cuda_;
    enabled_ = o.enabled_;
    prepared_ = std::exchange(o.prepared_, false);
    running_ = std::exchange(o.running_, false);
    first_batch_ = o.first_batch_;
    step_range_ = std::move(o.step_range_);
    written_ = std::move(o.written_);
    summary_ = std::move(o.summary_);
    return *this;
  }
  ~TraceProfiler();

  /// Before batch `batch_idx` trains: warms up, starts recording, or marks the next recorded step.
  void before_batch(std::int64_t batch_idx) {
    if (!enabled_) return;
    const ProfilerAction action = action_at(batch_idx);
    if (action == ProfilerAction::none) return;
    if (!prepared_ && !running_) prepare();
    if (action == ProfilerAction::warmup) return;
    if (!running_) start(batch_idx);
    open_step(batch_idx - first_step_batch_);
  }
  /// Whether before_batch(batch_idx) would start recording.
  bool starts_at(std::int64_t batch_idx) const {
    if (!enabled_ || running_) return false;
    const ProfilerAction action = action_at(batch_idx);
    return action == ProfilerAction::record || action == ProfilerAction::record_and_save;
  }
  /// After batch `batch_idx` trained: writes the cycle's trace after its last active step. True when
  /// it wrote one (summary() says where).
  bool after_batch(std::int64_t batch_idx) {
    if (!running_) return false;
    step_range_.reset();
    if (action_at(batch_idx) != ProfilerAction::record_and_save) return false;
    stop(batch_idx);
    return true;
  }
  /// Training ended or stopped after batch `last_batch`: writes the open cycle's trace. True when it wrote one.
  bool finish(std::int64_t last_batch) {
    step_range_.reset();
    if (!running_) {
      if (prepared_) discard();
      return false;
    }
    stop(last_batch);
    return true;
  }
  bool running() const { return running_; }
  /// The last trace written.
  const std::optional<std::filesystem::path>& written() const { return written_; }
  /// What happened, for the run's log ("profiled batches 5-9: trace.json (Kineto)").
  const std::string& summary() const { return summary_; }

 private:
  ProfilerAction action_at(std::int64_t batch_idx) const {
    const std::int64_t step = batch_idx - first_step_batch_;
    return step < 0 ? ProfilerAction::none : profiler_action(options_.schedule, step);
  }
  void prepare();
  void start(std::int64_t batch_idx);
  void open_step(std::int64_t step);
  void stop(std::int64_t batch_idx);
  void discard();
  std::filesystem::path next_trace_path() const;

  ProfilerOptions options_{};
  std::int64_t first_step_batch_ = 0;
  TraceFiles files_{};
  bool cuda_ = false;
  bool enabled_ = false;
  bool prepared_ = false;
  bool running_ = false;
  std::int64_t first_batch_ = 0;
  std::unique_ptr<at::RecordFunction> step_range_;
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

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

namespace dettrial::detail {

DETTRIAL_INLINE TraceProfiler::~TraceProfiler() {
  // A fit that throws inside a cycle leaves the profiler on this thread: turn it off, no trace.
  step_range_.reset();
  if (running_ || prepared_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }
}

}  // namespace dettrial::detail

namespace dettrial::detail::profiler {
inline torch::profiler::impl::ProfilerConfig config_of(const ProfilerOptions& o) {
  namespace impl = torch::profiler::impl;
  return impl::ProfilerConfig(impl::ProfilerState::KINETO, o.record_shapes, o.profile_memory, o.with_stack, o.with_flops, o.with_modules);
}
inline std::set<torch::profiler::impl::ActivityType> activities_of(const ProfilerOptions& o, bool cuda) {
  namespace impl = torch::profiler::impl;
  std::set<impl::ActivityType> out;
  for (const ProfilerActivity a : o.activities) {
    if (a == ProfilerActivity::cpu) out.insert(impl::ActivityType::CPU);
    if (a == ProfilerActivity::cuda && cuda) out.insert(impl::ActivityType::CUDA);
  }
  if (out.empty()) out.insert(impl::ActivityType::CPU);  // CUDA asked for on a CPU run: the CPU's operators
  return out;
}
}  // namespace dettrial::detail::profiler

namespace dettrial::detail {
DETTRIAL_INLINE void TraceProfiler::prepare() {
  torch::autograd::profiler::prepareProfiler(detail::profiler::config_of(options_), detail::profiler::activities_of(options_, cuda_));
  prepared_ = true;
}

DETTRIAL_INLINE void TraceProfiler::start(std::int64_t batch_idx) {
  if (!prepared_) prepare();
  torch::autograd::profiler::enableProfiler(detail::profiler::config_of(options_), detail::profiler::activities_of(options_, cuda_));
  running_ = true;
  first_batch_ = batch_idx;
}

DETTRIAL_INLINE void TraceProfiler::open_step(std::int64_t step) {
  // Python's profiler.step() marks each step with a ProfilerStep#<n> range; TensorBoard's profile
  // plugin splits a trace into steps by them.
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) {
    const std::string name = "ProfilerStep#" + std::to_string(step);
    step_range_->before(name.c_str(), c10::ArrayRef<const c10::IValue>{});
  }
}

DETTRIAL_INLINE void TraceProfiler::discard() {
  // Warmed up for a cycle that training ended before: off, nothing kept.
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {
  }
  prepared_ = false;
}

DETTRIAL_INLINE std::filesystem::path TraceProfiler::next_trace_path() const {
  if (!files_.one_a_cycle) return files_.path;
  // tensorboard_trace_handler's names: <host>_<pid>.<milliseconds since the epoch>.pt.trace.json.
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const std::string worker = std::string(host) + "_" + std::to_string(::getpid());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::filesystem::path path;
  std::error_code ec;
  do {
    path = files_.path / (worker + "." + std::to_string(ms++) + ".pt.trace.json");
  } while (std::filesystem::exists(path, ec));
  return path;
}

DETTRIAL_INLINE void TraceProfiler::stop(std::int64_t batch_idx) {
  if (cuda_) torch::cuda::synchronize();  // the last kernels belong in the trace
  // Off first, whatever follows: a profiler left on would refuse the next fit on this thread.
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  prepared_ = false;
  const std::filesystem::path trace_path = next_trace_path();
  // A trace that cannot be written is said, not thrown: the training it profiled goes on.
  try {
    std::error_code ec;
    std::filesystem::create_directories(trace_path.parent_path(), ec);
    std::string how = "Kineto";
    try {
      result->save(trace_path.string());
    } catch (const c10::Error&) {
      // Without Kineto, save() refuses; the events are there all the same.
      write_chrome_trace(*result, trace_path);
      how = "LibTorch's profiler without Kineto: CPU operators";
    }
    written_ = trace_path;
    summary_ = "profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) + ": " + trace_path.string() + " (" +
               std::to_string(result->events().size()) + " events; " + how + ")";
  } catch (const std::exception& e) {
    summary_ = "warning: profiled batches " + std::to_string(first_batch_) + "-" + std::to_string(batch_idx) +
               ", but the trace could not be written to " + trace_path.string() + ": " + e.what();
  }
}

/// An event's start and duration in microseconds: LibTorch 2.x counts nanoseconds, 1.13 microseconds.
template <class Event>
std::pair<double, double> event_span_us(const Event& e) {
  if constexpr (requires { e.startNs(); }) return {static_cast<double>(e.startNs()) / 1000.0, static_cast<double>(e.durationNs()) / 1000.0};
  else return {static_cast<double>(e.startUs()), static_cast<double>(e.durationUs())};
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
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", {{"writer", "dettrial"}}}};
  detail::write_atomically(path, trace.dump());
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
