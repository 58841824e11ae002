// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LR step modes as policy types: when dettrial steps a wrapped learning-rate scheduler.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "../vocabulary/optim.hpp"
#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/**
 * @brief The step modes, as Determined defines them. dettrial steps schedulers after `train_batch`,
 * only on update batches (every `aggregation_frequency`-th batch); each mode says how many `step()`
 * calls that update batch makes.
 */
}  // namespace dettrial

namespace dettrial::lr_step {

/// After every batch (batches skipped by gradient aggregation are caught up on the update batch).
struct every_batch {
  static constexpr std::string_view name = "every_batch";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t /*epoch_len*/, std::int64_t freq);
};
/// After the last batch of every epoch (more precisely: when the next update lands in a new epoch).
struct every_epoch {
  static constexpr std::string_view name = "every_epoch";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t epoch_len, std::int64_t freq);
};
/// On update batches whose batch count is a multiple of the frequency. Like Determined, the frequency
/// counts batches, not optimizer steps.
struct every_optimizer_step {
  static constexpr std::string_view name = "every_optimizer_step";
  static std::int64_t steps_after(std::int64_t batch_idx, std::int64_t, std::int64_t, std::int64_t freq) {
    return (batch_idx + 1) % freq == 0 ? 1 : 0;
  }
};
/// Never stepped by dettrial: the trial calls `step()` itself (its state is still checkpointed).
struct manual {
  static constexpr std::string_view name = "manual";
  static std::int64_t steps_after(std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0; }
};

/**
 * @brief After every validation, with that validation's value of `metric` (after the trial's
 * callbacks' on_validation_end): for schedulers stepped with a metric, `step(double)`, such as
 * dettrial::optim::ReduceLROnPlateau. Never stepped by batches.
 * @code{.cpp}
 * context.wrap_lr_scheduler(plateau, dettrial::lr_step::on_validation{"validation_loss"});
 * @endcode
 */
struct on_validation {
  static constexpr std::string_view name = "on_validation";
  static std::int64_t steps_after(std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0; }
  /// The validation metric passed to the scheduler's step.
  std::string metric;
};

}  // namespace dettrial::lr_step

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial::lr_step {

DETTRIAL_INLINE std::int64_t every_batch::steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t /*epoch_len*/,
                                                      std::int64_t freq) {
  std::int64_t n = 0;
  for (std::int64_t i = batch_idx - agg + 1; i <= batch_idx; ++i) n += ((i + 1) % freq == 0);
  return n;
}

DETTRIAL_INLINE std::int64_t every_epoch::steps_after(std::int64_t batch_idx, std::int64_t agg, std::int64_t epoch_len, std::int64_t freq) {
  std::int64_t n = 0;
  for (std::int64_t e = batch_idx / epoch_len; e < (batch_idx + agg) / epoch_len; ++e) n += ((e + 1) % freq == 0);
  return n;
}

}  // namespace dettrial::lr_step

#endif  // DETTRIAL_HEADER_DEFINITIONS
