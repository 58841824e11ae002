// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's system metrics (`profiling.enabled`, its `core.profiler.on()`): what the
/// machine did while a run trained, sampled on a thread of its own: CPU utilization, free memory,
/// disk and network throughput, and each GPU's utilization and free memory through NVML where a
/// driver is installed.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// How the sampler samples: every `interval`, a report averaging `samples_per_report` samples
/// (Determined's `profiler.on(sampling_interval=1, samples_per_report=10)`).
struct SystemMetricsOptions {
  std::chrono::duration<double> interval{1.0};
  std::int64_t samples_per_report = 10;
  /// The file system whose use `disk_util` reports (the run's checkpoints fill it).
  std::filesystem::path disk;
};

/// One report: each metric averaged over the report's samples, as Determined's collector averages them.
struct SystemReport {
  std::chrono::system_clock::time_point time{};
  std::int64_t samples = 0;
  /// `cpu_util_simple` (percent of all cores), `memory_free` (GB, 10^9 bytes, available to new
  /// processes), `disk_iops`, `disk_throughput_read`, `disk_throughput_write` (bytes a second, every
  /// disk), `disk_util` (percent of the run folder's file system used), `net_throughput_sent`,
  /// `net_throughput_recv` (bytes a second, every interface): Determined's names and units.
  std::vector<std::pair<std::string, double>> values;
  /// A GPU's figures, by its UUID: `gpu_util` (percent of the interval a kernel ran) and
  /// `gpu_free_memory` (bytes).
  struct Gpu {
    std::string uuid;
    double gpu_util = 0;
    double gpu_free_memory = 0;
  };
  std::vector<Gpu> gpus;
};

/// The monotonic counters of /proc and the figures of one moment that a sample is the difference of.
struct SystemCounters {
  std::chrono::steady_clock::time_point at{};
  /// /proc/stat's first line in clock ticks: all time (guest time is inside user time, as psutil
  /// counts it) and busy time (all but idle and iowait).
  std::optional<std::uint64_t> cpu_total, cpu_busy;
  std::optional<std::uint64_t> memory_available_bytes;
  /// /proc/diskstats summed over whole disks (those in /sys/block, as psutil's disk_io_counters sums them).
  std::optional<std::uint64_t> disk_read_bytes, disk_write_bytes, disk_reads, disk_writes;
  /// /proc/net/dev summed over every interface (loopback included, as psutil's net_io_counters).
  std::optional<std::uint64_t> net_sent_bytes, net_recv_bytes;
  std::optional<double> disk_used_percent;
};

}  // namespace dettrial::detail

namespace dettrial::detail::system_metrics {
/// /proc/stat's aggregate `cpu` line: {total, busy} ticks, or nullopt for text without one.
DETTRIAL_INLINE std::optional<std::pair<std::uint64_t, std::uint64_t>> cpu_ticks(std::string_view proc_stat);
/// /proc/meminfo's MemAvailable in bytes.
DETTRIAL_INLINE std::optional<std::uint64_t> memory_available(std::string_view proc_meminfo);
/// /proc/diskstats summed over the devices `is_disk` accepts: {read bytes, written bytes, reads, writes}
/// (sectors are 512 bytes there, whatever the disk's own sector size).
struct DiskTotals {
  std::uint64_t read_bytes = 0, write_bytes = 0, reads = 0, writes = 0;
};
template <class IsDisk>
std::optional<DiskTotals> disk_totals(std::string_view proc_diskstats, IsDisk is_disk);
/// /proc/net/dev summed over its interfaces: {bytes sent, bytes received}.
DETTRIAL_INLINE std::optional<std::pair<std::uint64_t, std::uint64_t>> net_totals(std::string_view proc_net_dev);
/// The percent of `path`'s file system in use, as `df` and psutil's disk_usage count it (blocks
/// reserved for root are not free to the user).
DETTRIAL_INLINE std::optional<double> used_percent(const std::filesystem::path& path);
/// This machine's counters now (each absent where its file cannot be read).
DETTRIAL_INLINE SystemCounters read_counters(const std::filesystem::path& disk);
/// One sample: the rates between two readings and the figures of the second.
DETTRIAL_INLINE std::vector<std::pair<std::string, double>> sample_between(const SystemCounters& before, const SystemCounters& after);
}  // namespace dettrial::detail::system_metrics

namespace dettrial::detail {

/// The few NVML entry points used, with NVML's C types: `nvmlDevice_t` is an opaque pointer,
/// `nvmlUtilization_t` two unsigned ints, `nvmlMemory_t` three unsigned long longs (nvml.h).
struct NvmlApi {
  using Device = void*;
  struct Utilization {
    unsigned int gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle_by_index)(unsigned int, Device*) = nullptr;
  int (*uuid)(Device, char*, unsigned int) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  std::vector<std::pair<std::string, Device>> devices;
};

/// The NVIDIA driver's management library, opened at run time (no link dependency: a machine
/// without a driver has no GPU group). Each call returns nothing once a call failed.
class Nvml {
 public:
  /// `libnvidia-ml.so.1` from the loader's path, initialized; empty (why() says why) without one.
  DETTRIAL_INLINE static Nvml open(const char* library = "libnvidia-ml.so.1");
  Nvml() = default;
  Nvml(Nvml&& other) noexcept { *this = std::move(other); }
  DETTRIAL_INLINE Nvml& operator=(Nvml&& other) noexcept;
  DETTRIAL_INLINE ~Nvml();
  bool available() const { return handle_ != nullptr; }
  const std::string& why() const { return why_; }
  /// Every GPU's utilization and free memory now.
  DETTRIAL_INLINE std::vector<SystemReport::Gpu> read() const;

 private:
  using Api = NvmlApi;
  /// Shuts NVML down and unloads it (the destructor's work, also before a move assignment).
  DETTRIAL_INLINE void close() noexcept;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string why_;
};

/**
 * @brief Samples the machine on its own thread every `interval` and, every `samples_per_report`
 * samples, queues a report of their averages, as Determined's profiler does (one sampler a node:
 * the figures are the machine's, not the process's). The training thread asks `ready()` after each
 * batch (an atomic load) and takes the queued reports; nothing else of the sampler runs on it.
 * At most `max_queued` reports wait (older ones are dropped and counted), so a run that never
 * takes them holds a bounded amount.
 */
class SystemMetricsSampler {
 public:
  static constexpr std::size_t max_queued = 1024;

  SystemMetricsSampler() = default;
  /// Starts sampling (an interval under 0.1 s is refused, as Determined refuses it).
  DETTRIAL_INLINE explicit SystemMetricsSampler(SystemMetricsOptions options);
  SystemMetricsSampler(SystemMetricsSampler&&) noexcept = default;
  DETTRIAL_INLINE SystemMetricsSampler& operator=(SystemMetricsSampler&& other) noexcept;
  ~SystemMetricsSampler() { stop(); }

  bool running() const { return state_ != nullptr; }
  double interval_seconds() const { return options_.interval.count(); }
  std::int64_t samples_per_report() const { return options_.samples_per_report; }
  /// Whether a report waits: one relaxed atomic load.
  bool ready() const noexcept { return state_ && state_->ready.load(std::memory_order_relaxed); }
  /// The reports queued so far, oldest first.
  DETTRIAL_INLINE std::vector<SystemReport> take();
  /// Stops the thread; the samples of an unfinished report (and one more, when at least half an
  /// interval passed since the last) become a last report (take() gets it).
  DETTRIAL_INLINE void stop() noexcept;
  /// What cannot be sampled here (said once, at the start): no NVML, an unreadable /proc file.
  const std::vector<std::string>& notes() const { return notes_; }
  /// Reports dropped because nobody took them.
  std::size_t dropped() const { return state_ ? state_->dropped.load() : dropped_after_stop_; }

 private:
  struct State {
    SystemMetricsOptions options;
    Nvml nvml;
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;
    std::deque<SystemReport> queue;
    std::atomic<bool> ready{false};
    std::atomic<std::size_t> dropped{0};
    std::thread thread;
  };
  DETTRIAL_INLINE static void run(State& state);

  SystemMetricsOptions options_{};
  std::unique_ptr<State> state_;
  std::vector<SystemReport> left_after_stop_;
  std::size_t dropped_after_stop_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace dettrial::detail

// ---- template definitions -------------------------------------------------------------------------

namespace dettrial::detail::system_metrics {
/// The next whitespace-separated field of `text` from `pos`, or empty at its end.
inline std::string_view next_field(std::string_view text, std::size_t& pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
  const std::size_t start = pos;
  while (pos < text.size() && text[pos] != ' ' && text[pos] != '\t' && text[pos] != '\n') ++pos;
  return text.substr(start, pos - start);
}
/// Calls `f(line)` for each line of `text` (a last line without its newline too).
template <class F>
void for_each_line(std::string_view text, F f) {
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    f(text.substr(start, end - start));
    start = end + 1;
  }
}
/// A decimal field as an unsigned number (nullopt for anything else).
DETTRIAL_INLINE std::optional<std::uint64_t> unsigned_of(std::string_view field);

template <class IsDisk>
std::optional<DiskTotals> disk_totals(std::string_view text, IsDisk is_disk) {
  // Each line: major minor name reads reads_merged sectors_read ms_reading writes writes_merged
  // sectors_written ... (the kernel's Documentation/admin-guide/iostats.rst).
  DiskTotals totals;
  bool any = false;
  for_each_line(text, [&](std::string_view line) {
    std::size_t pos = 0;
    std::string_view fields[10];
    std::size_t n = 0;
    for (; n < 10; ++n) {
      fields[n] = next_field(line, pos);
      if (fields[n].empty()) break;
    }
    if (n < 10 || !is_disk(fields[2])) return;
    const auto reads = unsigned_of(fields[3]), sectors_read = unsigned_of(fields[5]);
    const auto writes = unsigned_of(fields[7]), sectors_written = unsigned_of(fields[9]);
    if (!reads || !sectors_read || !writes || !sectors_written) return;
    totals.reads += *reads;
    totals.writes += *writes;
    totals.read_bytes += *sectors_read * 512;
    totals.write_bytes += *sectors_written * 512;
    any = true;
  });
  if (!any) return std::nullopt;
  return totals;
}
}  // namespace dettrial::detail::system_metrics

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <dlfcn.h>
#include <sys/statvfs.h>

#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "../../detail/text.hpp"

namespace dettrial::detail::system_metrics {

DETTRIAL_INLINE std::optional<std::uint64_t> unsigned_of(std::string_view field) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return value;
}

/// A /proc file's text (those report a size of 0: read to the end), or empty where it cannot be read.
inline std::string proc_text(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

DETTRIAL_INLINE std::optional<std::pair<std::uint64_t, std::uint64_t>> cpu_ticks(std::string_view text) {
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
  if (text.substr(0, 4) != "cpu ") return std::nullopt;
  std::size_t pos = 3;
  std::uint64_t ticks[10] = {};
  std::size_t n = 0;
  for (; n < 10; ++n) {
    const std::string_view field = next_field(text, pos);
    if (field.empty()) break;
    const auto value = unsigned_of(field);
    if (!value) return std::nullopt;
    ticks[n] = *value;
  }
  if (n < 4) return std::nullopt;
  // guest and guest_nice are already counted in user and nice: summed once, as psutil sums them.
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i) total += ticks[i];
  const std::uint64_t idle = ticks[3] + (n > 4 ? ticks[4] : 0);
  return std::pair{total, total - idle};
}

DETTRIAL_INLINE std::optional<std::uint64_t> memory_available(std::string_view text) {
  const std::size_t at = text.find("MemAvailable:");
  if (at == std::string_view::npos) return std::nullopt;
  std::size_t pos = at + 13;
  const auto kilobytes = unsigned_of(next_field(text, pos));
  if (!kilobytes) return std::nullopt;
  return *kilobytes * 1024;
}

DETTRIAL_INLINE std::optional<std::pair<std::uint64_t, std::uint64_t>> net_totals(std::string_view text) {
  // Two header lines, then "  name: rx_bytes rx_packets ... (8 receive fields) tx_bytes ...".
  std::uint64_t sent = 0, received = 0;
  bool any = false;
  for_each_line(text, [&](std::string_view line) {
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    const std::string_view counters = line.substr(colon + 1);
    std::size_t pos = 0;
    std::optional<std::uint64_t> fields[9];
    std::size_t n = 0;
    for (; n < 9; ++n) {
      const std::string_view field = next_field(counters, pos);
      if (field.empty()) break;
      fields[n] = unsigned_of(field);
    }
    if (n < 9 || !fields[0] || !fields[8]) return;
    received += *fields[0];
    sent += *fields[8];
    any = true;
  });
  if (!any) return std::nullopt;
  return std::pair{sent, received};
}

DETTRIAL_INLINE std::optional<double> used_percent(const std::filesystem::path& path) {
  struct statvfs fs{};
  if (path.empty() || ::statvfs(path.c_str(), &fs) != 0) return std::nullopt;
  const double used = static_cast<double>(fs.f_blocks - fs.f_bfree), free_to_user = static_cast<double>(fs.f_bavail);
  if (used + free_to_user <= 0) return std::nullopt;
  return 100.0 * used / (used + free_to_user);
}

DETTRIAL_INLINE SystemCounters read_counters(const std::filesystem::path& disk) {
  SystemCounters c;
  c.at = std::chrono::steady_clock::now();
  if (const auto cpu = cpu_ticks(proc_text("/proc/stat"))) {
    c.cpu_total = cpu->first;
    c.cpu_busy = cpu->second;
  }
  c.memory_available_bytes = memory_available(proc_text("/proc/meminfo"));
  const auto whole_disk = [](std::string_view name) {
    std::error_code ec;
    return std::filesystem::exists(std::filesystem::path("/sys/block") / std::string(name), ec);
  };
  if (const auto d = disk_totals(proc_text("/proc/diskstats"), whole_disk)) {
    c.disk_read_bytes = d->read_bytes;
    c.disk_write_bytes = d->write_bytes;
    c.disk_reads = d->reads;
    c.disk_writes = d->writes;
  }
  if (const auto net = net_totals(proc_text("/proc/net/dev"))) {
    c.net_sent_bytes = net->first;
    c.net_recv_bytes = net->second;
  }
  c.disk_used_percent = used_percent(disk);
  return c;
}

DETTRIAL_INLINE std::vector<std::pair<std::string, double>> sample_between(const SystemCounters& before, const SystemCounters& after) {
  std::vector<std::pair<std::string, double>> out;
  const double seconds = std::chrono::duration<double>(after.at - before.at).count();
  // A counter that went backwards (a device removed) gives no rate rather than a huge one.
  const auto rate = [&](const char* name, const std::optional<std::uint64_t>& from, const std::optional<std::uint64_t>& to) {
    if (from && to && *to >= *from && seconds > 0) out.emplace_back(name, static_cast<double>(*to - *from) / seconds);
  };
  if (before.cpu_total && after.cpu_total && *after.cpu_total > *before.cpu_total && *after.cpu_busy >= *before.cpu_busy)
    out.emplace_back("cpu_util_simple", 100.0 * static_cast<double>(*after.cpu_busy - *before.cpu_busy) /
                                            static_cast<double>(*after.cpu_total - *before.cpu_total));
  if (after.memory_available_bytes) out.emplace_back("memory_free", static_cast<double>(*after.memory_available_bytes) / 1e9);
  // Operations a second (Determined's formula divides only the earlier count by the interval, an
  // operator-precedence slip; this is the rate its name promises).
  if (before.disk_reads && after.disk_reads && before.disk_writes && after.disk_writes) {
    const std::optional<std::uint64_t> from = *before.disk_reads + *before.disk_writes, to = *after.disk_reads + *after.disk_writes;
    rate("disk_iops", from, to);
  }
  rate("disk_throughput_read", before.disk_read_bytes, after.disk_read_bytes);
  rate("disk_throughput_write", before.disk_write_bytes, after.disk_write_bytes);
  if (after.disk_used_percent) out.emplace_back("disk_util", *after.disk_used_percent);
  rate("net_throughput_sent", before.net_sent_bytes, after.net_sent_bytes);
  rate("net_throughput_recv", before.net_recv_bytes, after.net_recv_bytes);
  return out;
}

}  // namespace dettrial::detail::system_metrics

namespace dettrial::detail {

DETTRIAL_INLINE Nvml Nvml::open(const char* library) {
  Nvml nvml;
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    nvml.why_ = std::string("no GPU figures: ") + library + " (NVIDIA's driver) is not on this machine";
    return nvml;
  }
  auto api = std::make_unique<Api>();
  const auto find = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    return fn != nullptr;
  };
  const bool found = find(api->init, "nvmlInit_v2") && find(api->shutdown, "nvmlShutdown") && find(api->count, "nvmlDeviceGetCount_v2") &&
                     find(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2") && find(api->uuid, "nvmlDeviceGetUUID") &&
                     find(api->utilization, "nvmlDeviceGetUtilizationRates") && find(api->memory, "nvmlDeviceGetMemoryInfo");
  if (!found || api->init() != 0) {
    nvml.why_ = std::string("no GPU figures: ") + library +
                (found ? " did not initialize (no GPU, or no access to it)" : " lacks NVML's functions");
    ::dlclose(handle);
    return nvml;
  }
  unsigned int count = 0;
  if (api->count(&count) == 0) {
    for (unsigned int i = 0; i < count; ++i) {
      Api::Device device = nullptr;
      char uuid[96] = {};
      Api::Utilization u{};
      Api::Memory m{};
      // A device whose figures cannot be read is left out, as Determined leaves out all of them.
      if (api->handle_by_index(i, &device) == 0 && api->uuid(device, uuid, sizeof uuid - 1) == 0 && api->utilization(device, &u) == 0 &&
          api->memory(device, &m) == 0)
        api->devices.emplace_back(uuid, device);
    }
  }
  if (api->devices.empty()) {
    nvml.why_ = "no GPU figures: NVML lists no GPU whose figures can be read";
    api->shutdown();
    ::dlclose(handle);
    return nvml;
  }
  nvml.handle_ = handle;
  nvml.api_ = std::move(api);
  return nvml;
}

DETTRIAL_INLINE Nvml& Nvml::operator=(Nvml&& other) noexcept {
  if (this != &other) {
    close();
    handle_ = std::exchange(other.handle_, nullptr);
    api_ = std::move(other.api_);
    why_ = std::move(other.why_);
  }
  return *this;
}

DETTRIAL_INLINE Nvml::~Nvml() { close(); }

DETTRIAL_INLINE void Nvml::close() noexcept {
  if (handle_) {
    api_->shutdown();
    ::dlclose(handle_);
    handle_ = nullptr;
  }
  api_.reset();
}

DETTRIAL_INLINE std::vector<SystemReport::Gpu> Nvml::read() const {
  std::vector<SystemReport::Gpu> out;
  if (!handle_) return out;
  for (const auto& [uuid, device] : api_->devices) {
    Api::Utilization u{};
    Api::Memory m{};
    if (api_->utilization(device, &u) != 0 || api_->memory(device, &m) != 0) continue;
    out.push_back({uuid, static_cast<double>(u.gpu), static_cast<double>(m.free)});
  }
  return out;
}

/// The average of a report's samples: each metric over the samples that have it.
inline SystemReport averaged(const std::vector<std::vector<std::pair<std::string, double>>>& samples,
                             const std::vector<std::vector<SystemReport::Gpu>>& gpu_samples) {
  SystemReport report;
  report.time = std::chrono::system_clock::now();
  report.samples = static_cast<std::int64_t>(samples.size());
  std::vector<std::pair<std::string, std::pair<double, int>>> sums;
  for (const auto& sample : samples)
    for (const auto& [name, value] : sample) {
      auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& s) { return s.first == name; });
      if (it == sums.end()) it = sums.insert(sums.end(), {name, {0.0, 0}});
      it->second.first += value;
      ++it->second.second;
    }
  for (const auto& [name, sum] : sums) report.values.emplace_back(name, sum.first / sum.second);
  std::vector<std::pair<SystemReport::Gpu, int>> gpu_sums;
  for (const auto& sample : gpu_samples)
    for (const auto& gpu : sample) {
      auto it = std::find_if(gpu_sums.begin(), gpu_sums.end(), [&](const auto& s) { return s.first.uuid == gpu.uuid; });
      if (it == gpu_sums.end()) it = gpu_sums.insert(gpu_sums.end(), {SystemReport::Gpu{gpu.uuid, 0, 0}, 0});
      it->first.gpu_util += gpu.gpu_util;
      it->first.gpu_free_memory += gpu.gpu_free_memory;
      ++it->second;
    }
  for (auto& [gpu, n] : gpu_sums) report.gpus.push_back({gpu.uuid, gpu.gpu_util / n, gpu.gpu_free_memory / n});
  return report;
}

DETTRIAL_INLINE SystemMetricsSampler::SystemMetricsSampler(SystemMetricsOptions options) {
  if (!(options.interval.count() >= 0.1))
    throw std::invalid_argument("the system metrics' sampling interval is " + detail::number_text(options.interval.count()) +
                                " s; it must be at least 0.1 s");
  if (options.samples_per_report < 1)
    throw std::invalid_argument("samples_per_report is " + std::to_string(options.samples_per_report) + "; it must be at least 1");
  options_ = options;
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  state->nvml = Nvml::open();
  if (!state->nvml.available()) notes_.push_back(state->nvml.why());
  const SystemCounters now = system_metrics::read_counters(state->options.disk);
  if (!now.cpu_total) notes_.push_back("no CPU utilization: /proc/stat cannot be read");
  if (!now.memory_available_bytes) notes_.push_back("no free memory: /proc/meminfo has no MemAvailable");
  if (!now.disk_reads) notes_.push_back("no disk throughput: /proc/diskstats lists no disk");
  if (!now.net_sent_bytes) notes_.push_back("no network throughput: /proc/net/dev cannot be read");
  State& s = *state;
  s.thread = std::thread([&s] { run(s); });
  state_ = std::move(state);
}

DETTRIAL_INLINE SystemMetricsSampler& SystemMetricsSampler::operator=(SystemMetricsSampler&& other) noexcept {
  if (this != &other) {
    stop();
    options_ = std::move(other.options_);
    state_ = std::move(other.state_);
    left_after_stop_ = std::move(other.left_after_stop_);
    dropped_after_stop_ = other.dropped_after_stop_;
    notes_ = std::move(other.notes_);
  }
  return *this;
}

DETTRIAL_INLINE void SystemMetricsSampler::run(State& s) {
  // The sampler's own failures never reach training: a sample that throws is left out.
  SystemCounters last = system_metrics::read_counters(s.options.disk);
  std::vector<std::vector<std::pair<std::string, double>>> samples;
  std::vector<std::vector<SystemReport::Gpu>> gpu_samples;
  const auto queue = [&] {
    if (samples.empty()) return;
    SystemReport report = averaged(samples, gpu_samples);
    samples.clear();
    gpu_samples.clear();
    const std::lock_guard lock(s.mutex);
    if (s.queue.size() >= max_queued) {
      s.queue.pop_front();
      s.dropped.fetch_add(1);
    }
    s.queue.push_back(std::move(report));
    s.ready.store(true, std::memory_order_relaxed);
  };
  auto next = std::chrono::steady_clock::now();
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(s.options.interval);
  for (;;) {
    next += interval;
    bool stopping = false;
    {
      std::unique_lock lock(s.mutex);
      stopping = s.wake.wait_until(lock, next, [&] { return s.stopping; });
    }
    // Stopped early in an interval: a sample of under half of one would be mostly rounding (the
    // CPU's counters move 100 times a second), so the report has the samples before it.
    const bool too_short = stopping && std::chrono::steady_clock::now() - last.at < interval / 2;
    try {
      if (!too_short) {
        const SystemCounters now = system_metrics::read_counters(s.options.disk);
        samples.push_back(system_metrics::sample_between(last, now));
        gpu_samples.push_back(s.nvml.read());
        last = now;
      }
    } catch (...) {
    }
    // A sampler that fell behind (a suspended process) starts its schedule again from now.
    if (std::chrono::steady_clock::now() > next + interval) next = std::chrono::steady_clock::now();
    if (static_cast<std::int64_t>(samples.size()) >= s.options.samples_per_report || stopping) {
      try {
        queue();
      } catch (...) {
      }
    }
    if (stopping) return;
  }
}

DETTRIAL_INLINE std::vector<SystemReport> SystemMetricsSampler::take() {
  std::vector<SystemReport> out = std::move(left_after_stop_);
  left_after_stop_.clear();
  if (!state_) return out;
  const std::lock_guard lock(state_->mutex);
  for (SystemReport& r : state_->queue) out.push_back(std::move(r));
  state_->queue.clear();
  state_->ready.store(false, std::memory_order_relaxed);
  return out;
}

DETTRIAL_INLINE void SystemMetricsSampler::stop() noexcept {
  if (!state_) return;
  {
    const std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  try {
    for (SystemReport& r : state_->queue) left_after_stop_.push_back(std::move(r));
  } catch (...) {
  }
  dropped_after_stop_ = state_->dropped.load();
  state_.reset();
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
