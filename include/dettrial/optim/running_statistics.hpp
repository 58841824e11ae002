// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief optim::RunningStatistics: what update_bn needs of a normalization layer that is not one of
/// LibTorch's BatchNorm classes but keeps their running statistics (nn::SyncBatchNorm, and with it
/// dettrial's ResNets), so that update_bn recomputes its statistics as it does a BatchNorm's.
#pragma once

#include <torch/torch.h>

namespace dettrial::optim {

/// A module with BatchNorm's options and running statistics (Python's `_BatchNorm` family).
class RunningStatistics {
 public:
  virtual ~RunningStatistics() = default;
  /// The options whose momentum update_bn sets to none (a cumulative average) and back.
  virtual torch::nn::BatchNormOptions& batch_norm_options() = 0;
  /// Running mean 0, variance 1, no batches tracked (BatchNorm's reset_running_stats).
  virtual void reset_running_stats() = 0;
};

}  // namespace dettrial::optim
