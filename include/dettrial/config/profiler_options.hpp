// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What `Context::set_profiler` takes: `torch.profiler.profile`'s activities, schedule and
/// recording options, and the schedule's action at each step, as `torch.profiler.schedule` decides it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"

namespace dettrial {

/// What the profiler records: operators on the CPU, kernels on a GPU (`torch.profiler.ProfilerActivity`).
enum class ProfilerActivity { cpu, cuda };

/**
 * @brief `torch.profiler.schedule(wait, warmup, active, repeat, skip_first)`. Steps are training
 * batches, counted from 0 at the first batch a fit trains (a resumed fit counts afresh, as a new
 * Python process does). After `skip_first` steps the schedule repeats cycles of `wait` steps off,
 * `warmup` steps on but discarded, and `active` steps recorded, whose trace is written when the
 * cycle's last active step ends; `repeat` cycles in all (0: until training ends).
 */
struct ProfilerSchedule {
  std::int64_t wait = 0;
  std::int64_t warmup = 0;
  std::int64_t active = 1;
  std::int64_t repeat = 0;
  std::int64_t skip_first = 0;
};

/**
 * @brief The arguments of `Context::set_profiler` (Determined's `set_profiler`, which takes
 * `torch.profiler.profile`'s). dettrial writes each cycle's trace where TensorBoard's profile plugin
 * reads it (`<output>/tensorboard/<host>_<pid>.<ms>.pt.trace.json`: Determined's `on_trace_ready`)
 * and steps the profiler after every training batch.
 */
struct ProfilerOptions {
  /// CUDA is recorded only when the trial runs on a GPU.
  std::vector<ProfilerActivity> activities{ProfilerActivity::cpu, ProfilerActivity::cuda};
  ProfilerSchedule schedule{};
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  bool with_modules = false;
};

}  // namespace dettrial

namespace dettrial::detail {

/// `torch.profiler.ProfilerAction`.
enum class ProfilerAction { none, warmup, record, record_and_save };

/// The action at `step`, exactly as `torch.profiler.schedule` returns it.
inline ProfilerAction profiler_action(const ProfilerSchedule& s, std::int64_t step) {
  if (step < s.skip_first) return ProfilerAction::none;
  step -= s.skip_first;
  const std::int64_t cycle = s.wait + s.warmup + s.active;
  if (s.repeat > 0 && step / cycle >= s.repeat) return ProfilerAction::none;
  const std::int64_t in_cycle = step % cycle;
  if (in_cycle < s.wait) return ProfilerAction::none;
  if (in_cycle < s.wait + s.warmup) return ProfilerAction::warmup;
  return in_cycle < cycle - 1 ? ProfilerAction::record : ProfilerAction::record_and_save;
}

/// Refuses what `torch.profiler.schedule` refuses, naming the argument.
inline void check_profiler_options(const ProfilerOptions& o) {
  const ProfilerSchedule& s = o.schedule;
  auto at_least = [](const char* name, std::int64_t value, std::int64_t least) {
    if (value < least)
      throw ConfigError(std::string("set_profiler: schedule ") + name + " is " + std::to_string(value) + "; it must be at least " +
                        std::to_string(least));
  };
  at_least("wait", s.wait, 0);
  at_least("warmup", s.warmup, 0);
  at_least("active", s.active, 1);
  at_least("repeat", s.repeat, 0);
  at_least("skip_first", s.skip_first, 0);
  if (o.activities.empty()) throw ConfigError("set_profiler: no activities to record (give ProfilerActivity::cpu, cuda or both)");
}

}  // namespace dettrial::detail
