// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief TensorBoard's event files as an outlet of the fit's reports: the same numbers as scalars.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "../../detail/linkage.hpp"
#include "../../tensorboard/event_file.hpp"
#include "outlet.hpp"

namespace dettrial::detail {

/// The trial's TensorBoardWriter (the Context's, which outlives the fit): `train/<metric>`,
/// `validation/<metric>`, `train/lr`, `train/samples_per_second`, `timing/<phase>_seconds`,
/// `timing/validation_seconds`, `timing/checkpoint_seconds` and `system/<metric>`, each flushed
/// with its report.
class TensorBoardOutlet final : public ReportOutlet {
 public:
  /// Says on stderr how many events a run resumed at batch `resumed_at` dropped (the writer dropped them).
  DETTRIAL_INLINE TensorBoardOutlet(TensorBoardWriter& writer, std::optional<std::int64_t> resumed_at);

  DETTRIAL_INLINE void training(const TrainingReport& r) override;
  DETTRIAL_INLINE void validation(const ValidationReport& r) override;
  DETTRIAL_INLINE void checkpoint(const CheckpointReport& r) override;
  DETTRIAL_INLINE void system(const SystemMetricsReport& r) override;

 private:
  DETTRIAL_INLINE void add_metrics(std::string_view prefix, const MetricValues& metrics, std::int64_t step);

  TensorBoardWriter* writer_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>

namespace dettrial::detail {

DETTRIAL_INLINE TensorBoardOutlet::TensorBoardOutlet(TensorBoardWriter& writer, std::optional<std::int64_t> resumed_at) : writer_(&writer) {
  if (writer.dropped() > 0)
    std::fprintf(stderr, "dettrial: resuming at batch %lld: dropped %zu event(s) of %s written after that checkpoint\n",
                 static_cast<long long>(resumed_at.value_or(0)), writer.dropped(), writer.dir().c_str());
}

DETTRIAL_INLINE void TensorBoardOutlet::add_metrics(std::string_view prefix, const MetricValues& metrics, std::int64_t step) {
  for (const auto& [tag, value] : prefixed_metrics(prefix, metrics)) writer_->add_scalar(tag, value, step);
}

DETTRIAL_INLINE void TensorBoardOutlet::training(const TrainingReport& r) {
  add_metrics("train/", r.metrics, r.batches);
  writer_->add_scalar("train/samples_per_second", r.samples_per_second, r.batches);
  for (const auto& [name, lr] : r.learning_rates) writer_->add_scalar("train/" + name, lr, r.batches);
  for (const auto& [phase, value] : r.phase_seconds()) writer_->add_scalar(std::string("timing/") + phase + "_seconds", value, r.batches);
  writer_->flush();
}

DETTRIAL_INLINE void TensorBoardOutlet::validation(const ValidationReport& r) {
  add_metrics("validation/", r.metrics, r.batches);
  writer_->add_scalar("timing/validation_seconds", r.seconds, r.batches);
  writer_->flush();
}

DETTRIAL_INLINE void TensorBoardOutlet::checkpoint(const CheckpointReport& r) {
  writer_->add_scalar("timing/checkpoint_seconds", r.seconds, r.batches);
  writer_->add_scalar("timing/checkpoint_write_seconds", r.write_seconds, r.batches);
  writer_->flush();
}

DETTRIAL_INLINE void TensorBoardOutlet::system(const SystemMetricsReport& r) {
  for (const auto& [tag, value] : system_scalars(r.report)) writer_->add_scalar(tag, value, r.batches);
  writer_->flush();
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
