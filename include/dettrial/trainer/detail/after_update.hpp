// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the loop steps when an update batch ends (the batch whose train_batch stepped the
/// optimizers): the weight average, every `every_n_steps`-th optimizer step, and the LR schedulers,
/// as often as their mode says. The loop owns both, as Determined's controller steps a trial's
/// schedulers; the trial's context ended the batch before (the gradient scaler's update).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>

#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "schedule.hpp"

namespace dettrial::detail {

/// After update batch `batch_idx` of `schedule`'s run: the average, then the schedulers.
inline void step_after_update(TrainerKey key, Context& context, const Schedule& schedule, std::int64_t batch_idx) {
  const std::int64_t aggregation = context.aggregation_frequency();
  if (detail::ScheduledAverage* average = ContextAccess::average(key, context))
    average->after_optimizer_step((batch_idx + 1) / aggregation);  // optimizer steps so far, this one included
  for (WrappedScheduler& scheduler : ContextAccess::lr_schedulers(key, context))
    scheduler.step_after_update(batch_idx, aggregation, schedule.epoch_len());
}

}  // namespace dettrial::detail
