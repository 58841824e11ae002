// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief report.html: one self-contained page of a run's metrics.jsonl or of a search's trials
/// (inline SVG charts, a sortable table, a few lines of inline script; nothing fetched from a
/// network, no fonts or libraries from elsewhere), written next to the data it shows.
#pragma once

#include <filesystem>
#include <system_error>

#include "../layout.hpp"
#include "../error.hpp"
#include "html/detail/chart.hpp"
#include "html/detail/page.hpp"
#include "html/run_page.hpp"
#include "html/experiment_page.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// write_experiment_report for a folder with summary.json or trials/, else write_run_report for one
/// with metrics.jsonl; an Error naming the folder and what it lacks when it has neither.
DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial {

DETTRIAL_INLINE std::filesystem::path write_report(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw Error("'" + dir.string() + "' is not a folder: nothing to report");
  if (std::filesystem::is_regular_file(ExperimentFolder{dir}.summary(), ec) ||
      std::filesystem::is_directory(ExperimentFolder{dir}.trials(), ec))
    return write_experiment_report(dir);
  if (std::filesystem::is_regular_file(RunFolder{dir}.metrics_log(), ec)) return write_run_report(dir);
  throw Error("'" + dir.string() +
              "' holds no metrics.jsonl (a run's folder) and no summary.json or trials/ (a search's folder): nothing to report");
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
