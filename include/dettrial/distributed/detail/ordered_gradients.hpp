// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradients summed in one order whatever the rank count (`reproducibility.rank_invariant`):
/// the same micro-batches give bit-identical parameters on 1 rank aggregating 4 batches, 2 ranks
/// aggregating 2 and 4 ranks aggregating none.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "../communicator.hpp"
#include "../../error.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief The gradients of an update's micro-batches, kept apart and summed in the data stream's order.
 *
 * An all-reduce sums each rank's accumulated gradients in an order that depends on the rank count
 * (and a rank's accumulation in the order of its own micro-batches), so 1 rank aggregating 4
 * batches and 4 ranks aggregating none end with parameters a few ulps apart, which grow over a run.
 * Here each micro-batch's gradient is copied out of `.grad` after its backward pass (`stash`); at the
 * update every rank's are gathered to every rank and summed micro-batch by micro-batch in the order
 * of the data stream (`combine`), each weighted by its records over the update's records: the same
 * floating-point operations on the same values in any layout. Cost: memory for the micro-batches a
 * rank aggregates and, in a job, an all-gather of every micro-batch's gradient instead of an
 * all-reduce of one sum (see docs/distributed.md).
 */
class OrderedGradients {
 public:
  /// `micro_batches` per rank and update (the aggregation frequency); `communicator` null in one process.
  OrderedGradients(Communicator* communicator, std::int64_t micro_batches);

  /// Keeps the gradients of `params` (one micro-batch of `records` records) and zeroes them.
  void stash(const std::vector<torch::Tensor>& params, std::int64_t records);

  /// Writes into the gradients of `params` the update's sum: every rank's micro-batches, in stream
  /// order (micro-batch `j` of rank `r` is the stream's `j * ranks + r`), each weighted by its share
  /// of the records. Every micro-batch of the update must be stashed.
  void combine(const std::vector<torch::Tensor>& params);

 private:
  Communicator* communicator_;
  std::int64_t micro_batches_;
  std::int64_t stashed_ = 0;
  torch::Tensor gradients_;  // [micro_batches, numel], the parameters' dtype and device
  torch::Tensor records_;    // [micro_batches] int64, CPU
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <string>

namespace dettrial::detail {

DETTRIAL_INLINE OrderedGradients::OrderedGradients(Communicator* communicator, std::int64_t micro_batches)
    : communicator_(communicator), micro_batches_(micro_batches), records_(torch::zeros({micro_batches}, torch::kLong)) {}

DETTRIAL_INLINE void OrderedGradients::stash(const std::vector<torch::Tensor>& params, std::int64_t records) {
  std::int64_t numel = 0;
  for (const auto& p : params) {
    if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device())
      throw TrialError("reproducibility.rank_invariant needs every trained parameter in one dtype on one device, not " +
                       std::string(c10::toString(params.front().scalar_type())) + " and " + std::string(c10::toString(p.scalar_type())));
    numel += p.numel();
  }
  if (stashed_ >= micro_batches_)
    throw TrialError("reproducibility.rank_invariant: more micro-batches than the aggregation frequency before an optimizer step");
  if (!gradients_.defined() || gradients_.size(1) != numel) gradients_ = torch::zeros({micro_batches_, numel}, params.front().options());
  torch::Tensor row = gradients_[stashed_];
  std::int64_t offset = 0;
  for (const auto& p : params) {
    torch::Tensor part = row.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      part.copy_(p.grad().reshape(-1));
      p.grad().zero_();
    } else {
      part.zero_();
    }
    offset += p.numel();
  }
  records_[stashed_] = records;
  ++stashed_;
}

DETTRIAL_INLINE void OrderedGradients::combine(const std::vector<torch::Tensor>& params) {
  if (stashed_ != micro_batches_)
    throw TrialError("reproducibility.rank_invariant: an optimizer step after " + std::to_string(stashed_) + " micro-batch(es), not " +
                     std::to_string(micro_batches_));
  stashed_ = 0;
  std::vector<torch::Tensor> gradients{gradients_}, records{records_};
  if (communicator_) {
    gradients = communicator_->allgather(gradients_);
    records = communicator_->allgather(records_.to(communicator_->device()));
    for (auto& r : records) r = r.cpu();
  }
  const auto ranks = static_cast<std::int64_t>(gradients.size());
  std::int64_t total = 0;
  for (const auto& r : records) total += r.sum().item<std::int64_t>();
  if (total == 0) throw TrialError("reproducibility.rank_invariant: an update of micro-batches without records");
  torch::Tensor sum = torch::zeros({gradients_.size(1)}, gradients_.options());
  for (std::int64_t j = 0; j < micro_batches_; ++j)
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::int64_t n = records[static_cast<std::size_t>(r)][j].item<std::int64_t>();
      if (n > 0) sum.add_(gradients[static_cast<std::size_t>(r)][j], static_cast<double>(n) / static_cast<double>(total));
    }
  std::int64_t offset = 0;
  for (const auto& p : params) {
    const torch::Tensor part = sum.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined()) p.grad().copy_(part);
    else p.mutable_grad() = part.clone();
    offset += p.numel();
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
