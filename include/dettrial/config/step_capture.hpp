// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How the training step runs: eagerly, or captured once as a CUDA graph and replayed
/// (`optimizations.step_capture`, FitOptions::step_capture).
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "../error.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::capture {

/// Every batch runs eagerly: the trial's hooks, backward and the optimizer step, kernel by kernel.
struct none {
  static constexpr const char* name = "none";
};

/**
 * @brief The whole training step (train_batch, backward, gradient clipping, the optimizer step) is
 * captured once in a CUDA graph after `warmup_batches` eager batches, and replayed for every later
 * batch of the same shapes; each batch is copied into the graph's input buffers first. Boundaries
 * (validation, checkpoints, reports, callbacks) run outside the graph.
 *
 * Needs a CUDA device, one process, aggregation_frequency 1, no fp16 gradient scaler (bf16 autocast
 * is fine) and optimizers that read their learning rate on the device (dettrial::optim::FusedSGD,
 * FusedAdam, FusedAdamW); the trainer refuses anything else at the start, in one sentence. A batch of
 * other shapes (the last, partial batch of an epoch) runs eagerly.
 */
struct cuda_graph {
  static constexpr const char* name = "cuda_graph";
  /// Eager batches before the capture, on the capture's stream (they make the optimizer's state and
  /// the libraries' workspaces, which a capture cannot). At least 1.
  std::int64_t warmup_batches = 3;
};

}  // namespace dettrial::capture

namespace dettrial {
/// capture::none or capture::cuda_graph.
using StepCapture = std::variant<capture::none, capture::cuda_graph>;

/// `optimizations.step_capture`: none, or cuda_graph (with `capture_warmup_batches` eager batches first).
DETTRIAL_INLINE StepCapture parse_step_capture(const std::string& text, std::int64_t warmup_batches);

/// The name of a step capture, for messages.
inline const char* to_string(const StepCapture& c) {
  return std::visit([](const auto& p) { return p.name; }, c);
}

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS

namespace dettrial {

DETTRIAL_INLINE StepCapture parse_step_capture(const std::string& text, std::int64_t warmup_batches) {
  if (warmup_batches < 1)
    throw ConfigError("capture_warmup_batches is " + std::to_string(warmup_batches) +
                      "; a capture needs at least 1 eager batch before it (it makes the optimizer's state)");
  if (text == "none" || text == "off") return capture::none{};
  if (text == "cuda_graph") return capture::cuda_graph{.warmup_batches = warmup_batches};
  throw ConfigError("step_capture is '" + text + "'; expected none or cuda_graph");
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
