// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The run's metrics.csv as an outlet of the fit's reports: the training and validation
/// reports as a table.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <filesystem>

#include "../csv_log.hpp"
#include "outlet.hpp"

namespace dettrial::detail {

/// `<output_dir>/metrics.csv`: a row per training and validation report (CsvLog's columns).
class CsvOutlet final : public ReportOutlet {
 public:
  explicit CsvOutlet(const std::filesystem::path& output_dir) : csv_(output_dir) {}
  void training(const TrainingReport& r) override { csv_.write("training", r.batches, r.epochs, r.metrics); }
  void validation(const ValidationReport& r) override { csv_.write("validation", r.batches, r.epochs, r.metrics); }

 private:
  CsvLog csv_;
};

}  // namespace dettrial::detail
