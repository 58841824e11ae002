// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Gradient averaging across the ranks of a job, as PyTorch's DDP does it: flat buckets whose
/// all-reduces start during the backward pass.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../communicator.hpp"
#include "../../error.hpp"
#include "../../detail/linkage.hpp"

// LibTorch 2.1 on calls a hook after a gradient is accumulated into .grad: with gradients as views
// of the buckets, a bucket's all-reduce can then start during the backward pass.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#include <torch/csrc/autograd/function_hook.h>
#define DETTRIAL_POST_ACCUMULATE_HOOKS 1
#else
#define DETTRIAL_POST_ACCUMULATE_HOOKS 0
#endif

namespace dettrial::detail {

/**
 * @brief The gradient buckets of one optimizer's parameters in a data-parallel job.
 *
 * Flat buckets (of one dtype and device, up to 25 MiB, PyTorch DDP's default, filled from the last
 * parameters back, the order the backward pass produces them) whose all-reduces start during the
 * backward pass as each bucket fills, in bucket order on every rank; `all_reduce` then waits for them
 * and divides by the world size. The buckets are allocated on the first step and reused: a step
 * allocates nothing. A backward pass not armed (not run through `context.backward`, or two backward
 * passes in one step), and parameters without a gradient (zeros), are handled in `all_reduce` after
 * the fact. The object must not move once it has hooks (the Context holds it by pointer).
 *
 * With GradientLayout::bucket_views (ZeRO's), the parameters' gradients *are* views of the buckets:
 * the backward pass accumulates into them in place, so a rank holds the gradients once, not twice
 * (the buckets and .grad). Each bucket's all-reduce starts during the backward pass once all its
 * gradients are accumulated (LibTorch 2.1 on, which calls a hook then; before, after the backward
 * pass); an update batch then takes one backward pass through `context.backward`.
 */
class GradientBuckets {
 public:
  static constexpr std::int64_t bucket_bytes = 25 << 20;

  /// A flat buffer that carries the gradients of several parameters in one all-reduce.
  struct Bucket {
    /// Padded to a multiple of `pad_to` elements (ZeRO's equal shards); the all-reduce takes `reduced`.
    torch::Tensor flat;
    std::vector<std::pair<std::size_t, std::int64_t>> members;  // (parameter index, offset)
    /// The gradients: the first elements of `flat` (the same tensor as `flat` when unpadded).
    torch::Tensor reduced{};
  };

  /// Where the parameters' gradients live between the backward pass and the step.
  enum class GradientLayout {
    /// In `.grad`, copied into the buckets by hooks as the backward pass makes them (DDP's default).
    copied,
    /// In the buckets: every `.grad` is a view of its bucket (DDP's gradient_as_bucket_view).
    bucket_views,
  };

  /// `pad_to`: each bucket's flat buffer is padded to a multiple of it (the world size, for ZeRO's
  /// shards); the all-reduce still takes only the gradients, so padding changes no sum.
  GradientBuckets(Communicator& communicator, std::vector<torch::Tensor> params, std::int64_t pad_to = 1,
                  GradientLayout layout = GradientLayout::copied)
      : communicator_(communicator), params_(std::move(params)), pad_to_(pad_to), layout_(layout) {}
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets();

  /// Before a batch's backward pass: on update batches every bucket waits for all its parameters.
  void arm(bool update_batch);

  /// Replaces every parameter's gradient by its average over the ranks.
  void all_reduce();

  /// The buckets, made now if they were not yet (and the backward pass's hooks with them).
  const std::vector<Bucket>& buckets() {
    if (buckets_.empty()) build();
    return buckets_;
  }
  const std::vector<torch::Tensor>& params() const { return params_; }

 private:
  void build();

  /// bucket_views: every parameter's .grad made the view of its slice (its value copied in when it
  /// was another tensor, zeros when it had none).
  void bind_views();
  /// bucket_views: whether parameter k's .grad is the view of its slice.
  bool bound(std::size_t k) const;
  /// bucket_views: parameter k's gradient is accumulated (in its slice, when bound).
  void accumulated(std::size_t k);

  /// Puts parameter k's gradient for this step (its accumulated .grad plus `incoming`) into its slice.
  void fill_slice(std::size_t k, const torch::Tensor& incoming);

  /// Starts the all-reduces of the buckets that are full, strictly in bucket order (ranks must issue
  /// collectives in the same order).
  void start_ready_buckets();

  Communicator& communicator_;
  std::vector<torch::Tensor> params_;
  std::vector<Bucket> buckets_{};
  std::vector<std::size_t> bucket_of_{};                 // per parameter
  std::vector<std::int64_t> offset_of_{};                // per parameter, in its bucket
  std::vector<unsigned> hooks_{};                        // per parameter
  std::vector<char> filled_{};                           // per parameter: its slice holds this step's gradient
  std::vector<std::size_t> pending_{};                   // per bucket: parameters still to come
  std::vector<c10::intrusive_ptr<c10d::Work>> works_{};  // the all-reduces started, in bucket order
  std::vector<torch::Tensor> collective_arg_{1};         // c10d takes a vector: one, reused
  std::int64_t pad_to_ = 1;
  GradientLayout layout_ = GradientLayout::copied;
  bool armed_ = false;  // this backward pass feeds the buckets
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE GradientBuckets::~GradientBuckets() {
  for (std::size_t k = 0; k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
#if DETTRIAL_POST_ACCUMULATE_HOOKS
  if (layout_ == GradientLayout::bucket_views && !buckets_.empty())
    for (const auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
#endif
}

DETTRIAL_INLINE void GradientBuckets::arm(bool update_batch) {
  if (layout_ == GradientLayout::bucket_views) {  // every backward pass accumulates into the buckets
    if (buckets_.empty()) build();
    if (armed_ && std::find(filled_.begin(), filled_.end(), 1) != filled_.end())
      throw TrialError(
          "context.backward ran a second time in one update batch; with ZeRO (optimizations.zero_stage 1) the gradients are "
          "all-reduced as the first backward pass accumulates them: add the losses and call context.backward once per batch");
    bind_views();
    armed_ = DETTRIAL_POST_ACCUMULATE_HOOKS && update_batch;
    if (!armed_) return;
    std::fill(filled_.begin(), filled_.end(), 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].members.size();
    works_.clear();
    return;
  }
  armed_ = !buckets_.empty() && update_batch;
  if (!armed_) return;
  std::fill(filled_.begin(), filled_.end(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].members.size();
  works_.clear();
}

DETTRIAL_INLINE void GradientBuckets::all_reduce() {
  if (buckets_.empty()) build();
  torch::NoGradGuard no_grad;
  if (layout_ == GradientLayout::bucket_views) {
    // The buckets started during the backward pass hold their gradients; a gradient of the rest
    // that is not the view of its slice (a backward pass not run through context.backward) is
    // copied in before its bucket starts.
    if (!armed_) works_.clear();
    bind_views();
    std::fill(pending_.begin(), pending_.end(), 0);
    start_ready_buckets();
    const double scale = 1.0 / static_cast<double>(communicator_.size());
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      communicator_.wait(works_[k], "gradient all-reduce");
      buckets_[k].reduced.mul_(scale);
    }
    armed_ = false;
    return;
  }
  if (!armed_) {  // the hooks did not feed this step (or saw two backward passes): start over
    for (const auto& work : works_) communicator_.wait(work, "gradient all-reduce");
    std::fill(filled_.begin(), filled_.end(), 0);
    works_.clear();
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!filled_[i]) fill_slice(i, torch::Tensor());
  std::fill(pending_.begin(), pending_.end(), 0);
  start_ready_buckets();
  const double scale = 1.0 / static_cast<double>(communicator_.size());
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    communicator_.wait(works_[k], "gradient all-reduce");
    Bucket& b = buckets_[k];
    b.reduced.mul_(scale);
    for (const auto& [i, offset] : b.members) {
      torch::Tensor& p = params_[i];
      const torch::Tensor slice = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(slice);
      else p.mutable_grad() = slice.clone();
    }
  }
  armed_ = false;
}

DETTRIAL_INLINE void GradientBuckets::build() {
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (std::size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (buckets_.empty() || buckets_.back().flat.scalar_type() != p.scalar_type() || buckets_.back().flat.device() != p.device() ||
        (buckets_.back().flat.numel() + p.numel()) * p.element_size() > bucket_bytes)
      buckets_.push_back(Bucket{.flat = torch::empty({0}, p.options()), .members = {}});
    Bucket& b = buckets_.back();
    b.members.emplace_back(k, b.flat.numel());
    offset_of_[k] = b.flat.numel();
    b.flat = torch::empty({b.flat.numel() + p.numel()}, p.options());
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (Bucket& b : buckets_) {
    const std::int64_t numel = b.flat.numel(), padded = (numel + pad_to_ - 1) / pad_to_ * pad_to_;
    if (padded != numel) b.flat = torch::zeros({padded}, b.flat.options());
    b.reduced = padded == numel ? b.flat : b.flat.narrow(0, 0, numel);
  }
  filled_.assign(params_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  works_.reserve(buckets_.size());
  if (layout_ == GradientLayout::bucket_views) {
#if DETTRIAL_POST_ACCUMULATE_HOOKS
    struct Accumulated final : torch::autograd::PostAccumulateGradHook {
      Accumulated(GradientBuckets& buckets, std::size_t k) : buckets_(buckets), k_(k) {}
      void operator()(const torch::autograd::Variable&) override { buckets_.accumulated(k_); }
      GradientBuckets& buckets_;
      std::size_t k_;
    };
    for (std::size_t k = 0; k < params_.size(); ++k)
      torch::autograd::impl::set_post_acc_grad_hooks(params_[k], std::make_unique<Accumulated>(*this, k));
#endif
    return;
  }
  for (std::size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(params_[k].register_hook([this, k](const torch::Tensor& grad) {
      if (!armed_) return;
      if (filled_[k]) {  // a second backward pass in this step: redone in all_reduce
        armed_ = false;
        return;
      }
      torch::NoGradGuard no_grad;
      fill_slice(k, grad);
      --pending_[bucket_of_[k]];
      start_ready_buckets();
    }));
}

DETTRIAL_INLINE bool GradientBuckets::bound(std::size_t k) const {
  const torch::Tensor& grad = params_[k].grad();
  const auto* slice_data = static_cast<const char*>(buckets_[bucket_of_[k]].flat.data_ptr()) + offset_of_[k] * params_[k].element_size();
  return grad.defined() && grad.data_ptr() == slice_data && grad.is_contiguous();
}

DETTRIAL_INLINE void GradientBuckets::accumulated(std::size_t k) {
  // A gradient accumulated elsewhere (a backward pass that made .grad anew) leaves its bucket to
  // all_reduce, which copies it in first; the buckets start in order, so none after it starts.
  if (!armed_ || filled_[k] || !bound(k)) return;
  filled_[k] = 1;
  --pending_[bucket_of_[k]];
  start_ready_buckets();
}

DETTRIAL_INLINE void GradientBuckets::bind_views() {
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    torch::Tensor& p = params_[k];
    const torch::Tensor& grad = p.grad();
    if (bound(k)) continue;
    torch::Tensor slice = buckets_[bucket_of_[k]].flat.narrow(0, offset_of_[k], p.numel());
    if (grad.defined()) slice.copy_(grad.reshape({-1}));
    else slice.zero_();
    // Detached: the same memory, but not a view in autograd's sense, which LibTorch's zero_grad
    // (it detaches gradients in place) refuses.
    p.mutable_grad() = slice.view(p.sizes()).detach();
  }
}

DETTRIAL_INLINE void GradientBuckets::fill_slice(std::size_t k, const torch::Tensor& incoming) {
  const torch::Tensor& p = params_[k];
  torch::Tensor slice = buckets_[bucket_of_[k]].flat.narrow(0, offset_of_[k], p.numel());
  if (incoming.defined()) {
    slice.copy_(incoming.reshape({-1}));
    if (p.grad().defined()) slice.add_(p.grad().reshape({-1}));
  } else if (p.grad().defined()) {
    slice.copy_(p.grad().reshape({-1}));
  } else {
    slice.zero_();
  }
  filled_[k] = 1;
}

DETTRIAL_INLINE void GradientBuckets::start_ready_buckets() {
  while (works_.size() < buckets_.size() && pending_[works_.size()] == 0) {
    collective_arg_[0] = buckets_[works_.size()].reduced;
    works_.push_back(communicator_.allreduce_async(collective_arg_));
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
