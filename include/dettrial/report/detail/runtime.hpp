// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a run computes with, for its first line: the LibTorch version and build, the BLAS
/// behind it, and the intra-op threads. A LibTorch linked against the system BLAS (Debian's) runs
/// much slower on the reference BLAS than on OpenBLAS (1.8x on a small MLP, more with wider layers),
/// so the first line names the library loaded.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <string>
#include <string_view>

#include <torch/torch.h>

#include "../../detail/linkage.hpp"
#include "../../process/process_settings.hpp"

namespace dettrial::detail {

/// The BLAS this process loaded: "MKL (built in)" for an MKL-built LibTorch (PyPI's wheel), else the
/// shared BLAS library loaded, named by its real file ("OpenBLAS (.../openblas-pthread/libblas.so.3)",
/// "reference BLAS (.../blas/libblas.so.3)"), or "unknown".
DETTRIAL_INLINE std::string loaded_blas();

/// "LibTorch 2.5.1 (CPU), MKL (built in), 4 threads (the 4 CPUs this process may run on: intra-op 4,
/// MKL 4 (...), inter-op 4)": the source of the thread count and what each pool got, as the
/// process's settings left them (ProcessSettings::applied(); LibTorch's defaults where none were applied).
DETTRIAL_INLINE std::string runtime_summary();

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <link.h>

#include <cstdlib>
#include <filesystem>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace dettrial::detail {

DETTRIAL_INLINE std::string loaded_blas() {
  if (at::globalContext().hasMKL()) return "MKL (built in)";
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        const std::string_view file = name.substr(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1);
        if (file.starts_with("libblas.so") || file.starts_with("libopenblas") || file.starts_with("libblis") ||
            file.starts_with("libflexiblas") || file.starts_with("libmkl_rt")) {
          *static_cast<std::string*>(out) = std::string(name);
          return 1;
        }
        return 0;
      },
      &found);
  if (found.empty()) return "unknown";
  std::error_code ec;
  const std::string real = std::filesystem::canonical(found, ec).string();
  const std::string path = ec ? found : real;
  const char* kind = path.find("openblas") != std::string::npos ? "OpenBLAS"
                     : path.find("blis") != std::string::npos   ? "BLIS"
                     : path.find("mkl") != std::string::npos    ? "MKL"
                     : path.find("/blas/") != std::string::npos ? "reference BLAS (slow: install an optimized BLAS such as OpenBLAS)"
                                                                : "BLAS";
  return std::string(kind) + " (" + path + ")";
}

DETTRIAL_INLINE std::string runtime_summary() {
  const std::optional<AppliedProcess>& applied = ProcessSettings::applied();
  const std::string threads_source = applied && applied->threads ? applied->threads->source : std::string();
  const std::string pools = applied && applied->threads ? applied->pools.text() : std::string();
  std::string s = "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                  std::to_string(TORCH_VERSION_PATCH);
  s += torch::cuda::is_available() ? " (CUDA, " + std::to_string(torch::cuda::device_count()) + " GPUs)" : " (CPU)";
  s += ", " + loaded_blas();
  const int threads = at::get_num_threads();
  s += ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  s += " (" + std::string(threads_source.empty() ? "LibTorch's default" : threads_source) +
       (pools.empty() ? std::string() : ": " + std::string(pools)) + ")";
  if (applied && applied->deterministic) s += ", deterministic algorithms";
  if (applied && applied->keeps_freed_memory) s += ", malloc keeps freed memory";
  return s;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
