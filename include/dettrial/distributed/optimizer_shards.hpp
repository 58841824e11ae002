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

#include "communicator.hpp"
#include "gradient_buckets.hpp"
#include "../detail/linkage.hpp"

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
  std::vector<std::vector<torch::Tensor>> group_pieces_{};  // per group: its pieces' tensors (the parameters while stepping)
  // The all-gather's arguments per bucket, made once: this rank's range, and every rank's.
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
  std::vector<std::size_t> group_of;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    group_of.insert(group_of.end(), optimizer.param_groups()[g].params().size(), g);
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
      Piece piece{.param = k, .group = group_of.at(k), .start = lo - offset, .bucket = b, .bucket_offset = lo, .tensor = {}};
      piece.tensor = p.detach().view({-1}).narrow(0, piece.start, hi - lo);
      group_pieces_[piece.group].push_back(piece.tensor);
      pieces_.push_back(std::move(piece));
    }
    gather_in_.push_back({all[b].flat.narrow(0, first, shard)});
    std::vector<torch::Tensor> ranges;
    for (std::int64_t r = 0; r < communicator.size(); ++r) ranges.push_back(all[b].flat.narrow(0, r * shard, shard));
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
  // The gradients in the buckets were consumed by the step: their buffers carry the parameters now.
  for (const Piece& piece : pieces_) all[piece.bucket].flat.narrow(0, piece.bucket_offset, piece.tensor.numel()).copy_(piece.tensor);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(all.size());
  for (std::size_t b = 0; b < all.size(); ++b) works.push_back(communicator_.allgather_async(gather_out_[b], gather_in_[b]));
  for (std::size_t b = 0; b < all.size(); ++b) {
    communicator_.wait(works[b], "ZeRO parameter all-gather");
    for (const auto& [k, offset] : all[b].members) {
      const torch::Tensor& p = params()[k];
      p.detach().view({-1}).copy_(all[b].flat.narrow(0, offset, p.numel()));
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
