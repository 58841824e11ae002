// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the ranks of a job must agree on, and how they come to agree: the chief's weights, the
/// settings that place every boundary, and decisions every rank acts on together.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../../error.hpp"
#include "../communicator.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// The largest of `value` over the ranks (the value itself for one process): what every rank acts on.
DETTRIAL_INLINE int agreed_max(Communicator* comm, int value);

/// Copies rank 0's parameters and buffers of `modules` to every rank.
DETTRIAL_INLINE void broadcast_modules(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

/**
 * @brief Copies rank 0's buffers of `modules` (BatchNorm's running statistics and the like) to every
 * rank: one broadcast per dtype and device, none without buffers. DistributedDataParallel's
 * default (`broadcast_buffers=True`) does this before every training forward; the trainer does it
 * at the boundaries where buffers are read (before a validation, a checkpoint and the end of
 * training), which leaves every rank with exactly rank 0's buffers there at no cost per batch.
 */
DETTRIAL_INLINE void broadcast_buffers(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

/// A module whose parameters every rank must hold bit for bit, with the name its parameters are
/// reported under ("model 0", "the averaged model").
struct ReplicatedModule {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
};

/**
 * @brief Checks that every rank holds the same parameters in `modules`, as the all-reduced gradients
 * and the same step on every rank keep them: one all-reduce of a fingerprint per parameter (its
 * CRC-32 and its negation, under MAX: every rank learns the largest and the smallest). Where one
 * differs, every rank throws a DistributedError naming the first such parameter, the batch, and
 * the likely causes (a trial that steps its optimizer itself, nondeterministic kernels, a rank that
 * changed its weights alone), rather than train replicas that drift apart unnoticed. Buffers are not
 * compared: each rank's BatchNorm statistics are its own until the chief's are broadcast.
 */
DETTRIAL_INLINE void require_same_parameters(Communicator& comm, std::span<const ReplicatedModule> modules, std::int64_t batches_trained);

/// A setting every rank must share, by name, with this rank's value as text.
struct RankSetting {
  const char* name;
  std::string value;
};

/**
 * @brief Checks that every rank holds the chief's `settings`. When one differs, every rank learns it
 * (one more collective), so all stop here together, with a ConfigError naming the setting and, on
 * the rank that differs, its value, rather than crossing collectives later.
 */
DETTRIAL_INLINE void require_same_settings(Communicator& comm, std::span<const RankSetting> settings);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../detail/crc32.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE int agreed_max(Communicator* comm, int value) {
  if (!comm) return value;
  return static_cast<int>(comm->allreduce_values({static_cast<double>(value)}, c10d::ReduceOp::MAX)[0]);
}

DETTRIAL_INLINE void broadcast_modules(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> one(1);
  for (const auto& m : modules) {
    for (auto& p : m->parameters()) {
      one[0] = p.detach();
      comm.broadcast(one);
    }
    for (auto& b : m->buffers()) {
      one[0] = b;
      comm.broadcast(one);
    }
  }
}

DETTRIAL_INLINE void broadcast_buffers(Communicator& comm, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  torch::NoGradGuard no_grad;
  // Grouped by dtype and device, in the same (registration) order on every rank.
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& m : modules)
    for (const auto& b : m->buffers()) {
      if (!b.defined() || b.numel() == 0) continue;
      auto same = std::find_if(groups.begin(), groups.end(), [&](const std::vector<torch::Tensor>& g) {
        return g.front().scalar_type() == b.scalar_type() && g.front().device() == b.device();
      });
      if (same == groups.end()) groups.push_back({b});
      else same->push_back(b);
    }
  std::vector<torch::Tensor> one(1);
  for (auto& group : groups) {
    std::vector<torch::Tensor> flat;
    flat.reserve(group.size());
    for (const auto& b : group) flat.push_back(b.reshape({-1}));
    one[0] = torch::cat(flat);
    comm.broadcast(one);
    std::int64_t offset = 0;
    for (auto& b : group) {
      b.copy_(one[0].narrow(0, offset, b.numel()).view_as(b));
      offset += b.numel();
    }
  }
}

DETTRIAL_INLINE void require_same_parameters(Communicator& comm, std::span<const ReplicatedModule> modules, std::int64_t batches_trained) {
  std::vector<std::string> names;
  std::vector<double> largest_and_smallest;  // each fingerprint, then each negated: under MAX, the largest and minus the smallest
  for (const ReplicatedModule& m : modules)
    for (const auto& p : m.module->named_parameters()) {
      names.push_back(m.name + "'s '" + p.key() + "'");
      // Its CRC-32: the same on two ranks when they hold the same bits (different ones collide one time in 2^32).
      largest_and_smallest.push_back(static_cast<double>(tensor_crc32(p.value())));
    }
  if (names.empty()) return;
  const std::size_t n = names.size();
  for (std::size_t i = 0; i < n; ++i) largest_and_smallest.push_back(-largest_and_smallest[i]);
  const std::vector<double> agreed = comm.allreduce_values(largest_and_smallest, c10d::ReduceOp::MAX);
  for (std::size_t i = 0; i < n; ++i) {
    if (agreed[i] == -agreed[n + i]) continue;
    throw DistributedError("the ranks' parameters differ after batch " + std::to_string(batches_trained) + ": " + names[i] +
                           " is not the same on every rank (the first that differs). Data-parallel ranks must hold the same "
                           "weights; likely causes: the trial steps its optimizer itself (optimizer.step() instead of "
                           "context.step_optimizer(optimizer), which averages the gradients over the ranks first), kernels that "
                           "are not deterministic (reproducibility.deterministic), or a rank that changed its weights alone");
  }
}

DETTRIAL_INLINE void require_same_settings(Communicator& comm, std::span<const RankSetting> settings) {
  std::vector<std::int64_t> mine;
  for (const auto& s : settings) mine.push_back(static_cast<std::int64_t>(std::hash<std::string>{}(s.value)));
  const std::vector<std::int64_t> chief = comm.broadcast_values(mine);
  int differs = -1;
  for (std::size_t i = 0; i < settings.size() && differs < 0; ++i)
    if (mine[i] != chief[i]) differs = static_cast<int>(i);
  const int any = agreed_max(&comm, differs);
  if (any < 0) return;
  const RankSetting& at_fault = settings[static_cast<std::size_t>(differs >= 0 ? differs : any)];
  throw ConfigError("the ranks of this job disagree on " + std::string(at_fault.name) +
                    (differs >= 0 ? " (rank " + std::to_string(comm.rank()) + " has " + at_fault.value + ")" : std::string()) +
                    "; every rank must be given the same config and fit options");
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
