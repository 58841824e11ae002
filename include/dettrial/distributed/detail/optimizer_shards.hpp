// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ZeRO stage 1 in a data-parallel job: each rank keeps, and steps, the optimizer state of
/// its 1/N of the parameters, cut from the gradient buckets; the parameters are then all-gathered.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "../communicator.hpp"
#include "gradient_buckets.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/**
 * @brief One wrapped optimizer's parameters cut into equal shards over the ranks (ZeRO stage 1).
 *
 * Each gradient bucket (its flat buffer padded to a multiple of the world size) is cut into N equal
 * ranges, and rank r owns range r of every bucket. A *piece* is the part of one parameter inside
 * this rank's range: a 1-D view of the parameter's data. While `stepping()` is held, the optimizer's
 * groups hold this rank's pieces instead of the parameters, each piece's gradient a view of its
 * parameter's (averaged, unscaled, clipped) gradient: the optimizer's step updates only this rank's
 * 1/N and makes state for it alone. LibTorch's optimizers and dettrial's update every element from
 * that element's own gradient and state, so a piece steps as the same elements of the whole
 * parameter would. `all_gather_parameters()` then gives every rank every rank's updated range.
 *
 * The object must not move (the Context holds it by pointer), and the optimizer's groups must not
 * change while it lives: the pieces are cut once.
 */
class OptimizerShards {
 public:
  /// The part of one parameter in this rank's range of one bucket.
  struct Piece {
    std::size_t param = 0;           // index in the optimizer's parameters, group by group
    std::size_t group = 0;           // the optimizer's group it belongs to
    std::int64_t start = 0;          // its first element in the parameter
    std::size_t bucket = 0;          // the gradient bucket it lies in
    std::int64_t bucket_offset = 0;  // its first element in that bucket's flat buffer
    torch::Tensor tensor{};          // the parameter's elements [start, start + numel) (a 1-D view)
  };

  OptimizerShards(Communicator& communicator, GradientBuckets& buckets, torch::optim::Optimizer& optimizer);
  OptimizerShards(const OptimizerShards&) = delete;
  OptimizerShards& operator=(const OptimizerShards&) = delete;

  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<torch::Tensor>& params() const { return buckets_.params(); }
  /// The optimizer's group parameter `param` belongs to.
  std::size_t group(std::size_t param) const { return group_of_.at(param); }
  const std::vector<GradientBuckets::Bucket>& buckets() const { return buckets_.buckets(); }
  /// How many elements of `bucket` each rank owns (its padded size over the world size).
  std::int64_t shard_numel(std::size_t bucket) const;
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  Communicator& communicator() const { return communicator_; }

  /// While it lives, the optimizer's groups hold this rank's pieces, their gradients bound to the
  /// parameters'; when it ends, the parameters again, and the pieces hold no gradient.
  class Stepping {
   public:
    explicit Stepping(OptimizerShards& shards);
    Stepping(const Stepping&) = delete;
    Stepping& operator=(const Stepping&) = delete;
    ~Stepping();

   private:
    OptimizerShards& shards_;
  };
  [[nodiscard]] Stepping stepping() { return Stepping(*this); }

  /// Every rank's updated range of every bucket, into every rank's parameters.
  void all_gather_parameters();

  /**
   * @brief A per-element value of the pieces, gathered whole bucket by bucket (a collective), in
   * each bucket's dtype: `fill(piece, region)` writes this rank's pieces' values into
   * `region` (the piece's elements of a bucket-sized buffer, zeros elsewhere), then `take(bucket,
   * flat)` sees the buffer with every rank's ranges.
   */
  void all_gather(const std::function<void(const Piece&, torch::Tensor region)>& fill,
                  const std::function<void(std::size_t bucket, const torch::Tensor& flat)>& take);

 private:
  /// Swaps the optimizer's groups' parameter lists with the pieces' (one vector swap per group).
  void swap_groups();

  Communicator& communicator_;
  GradientBuckets& buckets_;
  torch::optim::Optimizer& optimizer_;
  std::vector<Piece> pieces_{};
  std::vector<std::size_t> group_of_{};                     // per parameter
  std::vector<std::vector<torch::Tensor>> group_pieces_{};  // per group: its pieces' tensors (the parameters while stepping)
  // The parameters' all-gather, per bucket, made once: where it gathers (a bucket of one parameter
  // and no padding: straight into the parameter; else a staging buffer, one per dtype and device, the
  // size of the largest such bucket: the bucket holds the gradients, which the step leaves to the
  // trial), this rank's range and every rank's.
  std::vector<torch::Tensor> staged_{};  // per bucket: undefined where it gathers into its parameter
  std::vector<std::vector<torch::Tensor>> gather_in_{};
  std::vector<std::vector<std::vector<torch::Tensor>>> gather_out_{};
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <utility>

namespace dettrial::detail {

DETTRIAL_INLINE OptimizerShards::OptimizerShards(Communicator& communicator, GradientBuckets& buckets, torch::optim::Optimizer& optimizer)
    : communicator_(communicator), buckets_(buckets), optimizer_(optimizer) {
  // The parameters' groups, in the order the buckets index them (the optimizer's, group by group).
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    group_of_.insert(group_of_.end(), optimizer.param_groups()[g].params().size(), g);
  group_pieces_.resize(optimizer.param_groups().size());
  const std::int64_t rank = communicator.rank();
  torch::NoGradGuard no_grad;
  const auto& all = buckets_.buckets();
  for (std::size_t b = 0; b < all.size(); ++b) {
    const std::int64_t shard = shard_numel(b), first = rank * shard, end = first + shard;
    for (const auto& [k, offset] : all[b].members) {
      const torch::Tensor& p = buckets_.params()[k];
      const std::int64_t lo = std::max(offset, first), hi = std::min(offset + p.numel(), end);
      if (lo >= hi) continue;
      Piece piece{.param = k, .group = group_of_.at(k), .start = lo - offset, .bucket = b, .bucket_offset = lo, .tensor = {}};
      piece.tensor = p.detach().view({-1}).narrow(0, piece.start, hi - lo);
      group_pieces_[piece.group].push_back(piece.tensor);
      pieces_.push_back(std::move(piece));
    }
  }
  // One staging buffer per dtype and device, as large as the largest such bucket that needs one.
  std::vector<torch::Tensor> buffers;
  const auto direct = [&](std::size_t b) {
    return all[b].members.size() == 1 && all[b].flat.numel() == buckets_.params()[all[b].members.front().first].numel();
  };
  const auto buffer_for = [&](std::size_t b) -> torch::Tensor& {
    for (auto& buffer : buffers)
      if (buffer.scalar_type() == all[b].flat.scalar_type() && buffer.device() == all[b].flat.device()) return buffer;
    return buffers.emplace_back(torch::empty({0}, all[b].flat.options()));
  };
  for (std::size_t b = 0; b < all.size(); ++b)
    if (!direct(b) && buffer_for(b).numel() < all[b].flat.numel())
      buffer_for(b) = torch::empty({all[b].flat.numel()}, all[b].flat.options());
  for (std::size_t b = 0; b < all.size(); ++b) {
    const std::int64_t shard = shard_numel(b);
    staged_.push_back(direct(b) ? torch::Tensor() : buffer_for(b).narrow(0, 0, all[b].flat.numel()));
    const torch::Tensor target = direct(b) ? buckets_.params()[all[b].members.front().first].detach().view({-1}) : staged_[b];
    gather_in_.push_back({target.narrow(0, rank * shard, shard)});
    std::vector<torch::Tensor> ranges;
    for (std::int64_t r = 0; r < communicator.size(); ++r) ranges.push_back(target.narrow(0, r * shard, shard));
    gather_out_.push_back({std::move(ranges)});
  }
}

DETTRIAL_INLINE std::int64_t OptimizerShards::shard_numel(std::size_t bucket) const {
  return buckets_.buckets()[bucket].flat.numel() / communicator_.size();
}

DETTRIAL_INLINE void OptimizerShards::swap_groups() {
  auto& groups = optimizer_.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) std::swap(groups[g].params(), group_pieces_[g]);
}

DETTRIAL_INLINE OptimizerShards::Stepping::Stepping(OptimizerShards& shards) : shards_(shards) {
  for (auto& piece : shards_.pieces_) {
    const torch::Tensor& grad = shards_.params()[piece.param].grad();
    piece.tensor.mutable_grad() = grad.defined() ? grad.reshape({-1}).narrow(0, piece.start, piece.tensor.numel()) : torch::Tensor();
  }
  shards_.swap_groups();
}

DETTRIAL_INLINE OptimizerShards::Stepping::~Stepping() {
  shards_.swap_groups();
  // The pieces' gradients are views: left in place they would keep a released gradient alive.
  for (auto& piece : shards_.pieces_) piece.tensor.mutable_grad() = torch::Tensor();
}

DETTRIAL_INLINE void OptimizerShards::all_gather_parameters() {
  torch::NoGradGuard no_grad;
  const auto& all = buckets_.buckets();
  // One bucket at a time: the backend's own buffer for it (a bucket's size) is then the only one.
  for (std::size_t b = 0; b < all.size(); ++b) {
    if (staged_[b].defined())
      for (const Piece& piece : pieces_)
        if (piece.bucket == b) staged_[b].narrow(0, piece.bucket_offset, piece.tensor.numel()).copy_(piece.tensor);
    communicator_.wait(communicator_.allgather_async(gather_out_[b], gather_in_[b]), "ZeRO parameter all-gather");
    if (!staged_[b].defined()) continue;  // gathered into its parameter
    for (const auto& [k, offset] : all[b].members) {
      const torch::Tensor& p = params()[k];
      p.detach().view({-1}).copy_(staged_[b].narrow(0, offset, p.numel()));
    }
  }
}

DETTRIAL_INLINE void OptimizerShards::all_gather(const std::function<void(const Piece&, torch::Tensor region)>& fill,
                                                 const std::function<void(std::size_t bucket, const torch::Tensor& flat)>& take) {
  torch::NoGradGuard no_grad;
  const auto& all = buckets_.buckets();
  for (std::size_t b = 0; b < all.size(); ++b) {
    const std::int64_t shard = shard_numel(b);
    torch::Tensor flat = torch::zeros({all[b].flat.numel()}, all[b].flat.options());
    for (const Piece& piece : pieces_)
      if (piece.bucket == b) fill(piece, flat.narrow(0, piece.bucket_offset, piece.tensor.numel()));
    std::vector<torch::Tensor> in{flat.narrow(0, communicator_.rank() * shard, shard)};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (std::int64_t r = 0; r < communicator_.size(); ++r) out[0].push_back(torch::empty({shard}, flat.options()));
    communicator_.wait(communicator_.allgather_async(out, in), "ZeRO state all-gather");
    for (std::int64_t r = 0; r < communicator_.size(); ++r) flat.narrow(0, r * shard, shard).copy_(out[0][static_cast<std::size_t>(r)]);
    take(b, flat);
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
