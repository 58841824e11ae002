// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Weight averaging as Python's `torch.optim.swa_utils` computes it: `AveragedModel` with equal
/// weights (SWA) or an exponential moving average (EMA, Python's `get_ema_multi_avg_fn`), over the
/// parameters and optionally the buffers, in Python's `state_dict()` layout (`n_averaged`, then the
/// averaged copy's entries under `module.`); `SWALR`, the schedule SWA trains with; and `update_bn`,
/// which recomputes BatchNorm's statistics for the averaged weights.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../detail/generators.hpp"
#include "../detail/linkage.hpp"
#include "../error.hpp"
#include "running_statistics.hpp"
#include "scheduler_base.hpp"

namespace dettrial::optim {

/// How an AveragedModel averages: Python's default equal weights (SWA) or an exponential moving
/// average with `decay` (Python's `get_ema_multi_avg_fn(decay)`); `use_buffers` averages the buffers
/// too (BatchNorm's running statistics), else they are copied from the model at each update.
struct Averaging {
  enum class Kind { equal, exponential };
  Kind kind = Kind::equal;
  double decay = 0.999;
  bool use_buffers = false;
};
/// Python's `AveragedModel(model, use_buffers=...)`: the mean of every update so far.
inline Averaging swa(bool use_buffers = false) { return {Averaging::Kind::equal, 0.0, use_buffers}; }
/// Python's `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=...)`.
inline Averaging ema(double decay = 0.999, bool use_buffers = false) { return {Averaging::Kind::exponential, decay, use_buffers}; }

/**
 * @brief The averaged copy of a model and its count, as a module whose state dict is Python's
 * AveragedModel's: `n_averaged` (a CPU long tensor, as Python's default device leaves it) and the
 * copy's entries under `module.`. AveragedModel<M> is its typed face.
 */
class AveragedWeights : public torch::nn::Module {
 public:
  AveragedWeights(std::shared_ptr<torch::nn::Module> copy, Averaging how);
  /// Python's `update_parameters(model)`: the first update copies the model, each later one averages
  /// it in (on the copy's device); the buffers are averaged (use_buffers) or copied.
  void update_parameters(const torch::nn::Module& model);
  /// Updates averaged so far (Python's `n_averaged`).
  std::int64_t n_averaged() const { return n_averaged_.item<std::int64_t>(); }
  /// Starts the average over: the next update copies the model (torchvision's recipe does it during
  /// its warmup: `n_averaged.fill_(0)`).
  void restart() { n_averaged_.fill_(0); }
  const Averaging& averaging() const { return how_; }
  /// The averaged copy.
  torch::nn::Module& averaged() { return *copy_; }
  const std::shared_ptr<torch::nn::Module>& averaged_ptr() const { return copy_; }

 private:
  /// One group of same-device, same-dtype tensors, averaged as Python's multi_avg_fn or avg_fn does.
  void average_group(std::vector<torch::Tensor>& averaged, const std::vector<torch::Tensor>& current) const;
  std::shared_ptr<torch::nn::Module> copy_;
  torch::Tensor n_averaged_;
  Averaging how_;
};

/**
 * @brief Python's `torch.optim.swa_utils.AveragedModel` for a LibTorch module holder `M`
 * (torch::nn::Sequential, a TORCH_MODULE type): `module()` is the averaged copy, as `M`, for
 * validating on it.
 * @code{.cpp}
 * dettrial::optim::AveragedModel<torch::nn::Sequential> ema(model, dettrial::optim::ema(0.9998));
 * ema.update_parameters(model);   // or context.wrap_averaged_model(ema, model, {.every_n_steps = 32})
 * auto logits = ema.module()->forward(x);
 * @endcode
 */
template <class M>
class AveragedModel {
 public:
  /// The copy is `model->clone()` (LibTorch's deep copy, for modules derived from torch::nn::Cloneable),
  /// with the random generators put back after it: Cloneable rebuilds a copy's layers with reset(),
  /// whose initialisation draws from them, and Python's deepcopy draws nothing, so the training's
  /// random stream (dropout, shuffles on the global generator) is the one Python's recipe has.
  AveragedModel(const M& model, Averaging how) : AveragedModel(drawing_nothing_clone(model), model, how) {}
  /// The copy is `fresh` (another instance of the same architecture, for a module that is not
  /// Cloneable), given the model's values now.
  AveragedModel(M fresh, const M& model, Averaging how) : module_(std::move(fresh)) {
    if (!module_.ptr()) throw ConfigError("dettrial::optim::AveragedModel: the model's copy is empty (is its type Cloneable?)");
    {
      torch::NoGradGuard no_grad;
      auto to = module_->named_parameters();
      for (const auto& p : model->named_parameters()) {
        if (!to.contains(p.key())) throw ConfigError("dettrial::optim::AveragedModel: the copy has no parameter '" + p.key() + "'");
        to[p.key()].copy_(p.value());
      }
    }
    weights_ = std::make_shared<AveragedWeights>(module_.ptr(), how);
  }
  /// Python's `update_parameters(model)`.
  void update_parameters(const M& model) { weights_->update_parameters(*model); }
  /// The averaged copy.
  M& module() { return module_; }
  std::int64_t n_averaged() const { return weights_->n_averaged(); }
  /// The module whose state dict is Python's AveragedModel's (n_averaged and `module.` entries).
  const std::shared_ptr<AveragedWeights>& weights() const { return weights_; }

 private:
  static M drawing_nothing_clone(const M& model) {
    return M(
        std::dynamic_pointer_cast<typename M::ContainedType>(detail::GeneratorStates::drawing_nothing([&] { return model->clone(); })));
  }

  M module_;
  std::shared_ptr<AveragedWeights> weights_;
};

/**
 * @brief Python's `swa_utils.SWALR(optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos")`: the
 * rates annealed from their values towards `swa_lr` over `anneal_epochs` steps, then held there.
 * Python keeps `swa_lr` in the optimizer's parameter groups: a checkpoint writes it there and reads
 * it back from there.
 */
class SWALR : public EpochLRScheduler {
 public:
  SWALR(torch::optim::Optimizer& optimizer, const PerGroup& swa_lr, std::int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::cos);
  void step();
  void restart_at_milestone();
  const std::vector<double>& swa_lrs() const { return swa_lrs_; }
  std::int64_t anneal_epochs() const { return anneal_epochs_; }
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  /// Python's `state_dict()`: _anneal_strategy, anneal_epochs and the LRScheduler entries.
  void python_state(c10::impl::GenericDict& out) const;
  void load_python_state(const c10::impl::GenericDict& in, const std::string& what);
  /// Python's group["swa_lr"], written into and read from parameter group `group`.
  void python_param_group(std::size_t group, c10::impl::GenericDict& out) const;
  void load_python_param_group(std::size_t group, const c10::impl::GenericDict& in, const std::string& what);

 private:
  static constexpr std::array<SchedulerField<SWALR>, 2> fields() {
    return std::array{field("anneal_epochs", &SWALR::anneal_epochs_, 0), field("swa_lrs", &SWALR::swa_lrs_)};
  }
  /// Python's get_lr, from the step count.
  /// The rates of this step (in next_rates_).
  const std::vector<double>& rates();
  std::vector<double> swa_lrs_;
  std::int64_t anneal_epochs_;
  AnnealStrategy anneal_;
};

}  // namespace dettrial::optim

namespace dettrial {
/// When the trainer updates the averaged model a trial wraps (Context::wrap_averaged_model).
struct AveragingSchedule {
  /// After every n-th optimizer step, counted from the first step of training: steps n, 2n, ...
  std::int64_t every_n_steps = 1;
  /// Up to this optimizer step each update copies the model, so the average begins after it (as
  /// torchvision's recipe restarts its EMA during the learning-rate warmup).
  std::int64_t warmup_steps = 0;
};
}  // namespace dettrial

namespace dettrial::detail {
/// A trial's wrapped average (Context::wrap_averaged_model): the weights, the model they average
/// and when; the loop calls after_optimizer_step at the end of every update batch.
struct ScheduledAverage {
  std::shared_ptr<optim::AveragedWeights> weights;
  std::shared_ptr<torch::nn::Module> source;
  AveragingSchedule schedule;

  /// After optimizer step `step` (1, 2, ...): the average takes the model when the step is due,
  /// and during the warmup it restarts from it.
  void after_optimizer_step(std::int64_t step) {
    if (step % schedule.every_n_steps != 0) return;
    weights->update_parameters(*source);
    if (step <= schedule.warmup_steps) weights->restart();
  }
};
}  // namespace dettrial::detail

namespace dettrial::detail::averaging {
/// A BatchNorm layer's momentum (c10::optional before LibTorch 2.x, std::optional after).
using Momentum = std::decay_t<decltype(std::declval<torch::nn::BatchNormOptions&>().momentum())>;
/// Every BatchNorm layer of `model`: with no `momenta`, running statistics reset and momentum none
/// (a cumulative average); else the momenta given back. Returns their momenta before.
DETTRIAL_INLINE std::vector<Momentum> set_batch_norm_momenta(torch::nn::Module& model, const std::vector<Momentum>* momenta);
}  // namespace dettrial::detail::averaging

namespace dettrial::optim {
/**
 * @brief Python's `swa_utils.update_bn(loader, model, device)`: every BatchNorm layer's running
 * statistics recomputed over one pass of `loader` (each batch's first element when it is a tuple,
 * moved to `device` when given) in training mode, as a cumulative average; the layers' momenta and
 * the model's mode are restored after. Call it on `averaged.module()` before validating an SWA
 * average whose buffers were not averaged.
 */
template <class Loader, class M>
void update_bn(Loader&& loader, M& model, std::optional<torch::Device> device = std::nullopt) {
  torch::NoGradGuard no_grad;
  const auto momenta = detail::averaging::set_batch_norm_momenta(*model, nullptr);
  if (momenta.empty()) return;
  const bool was_training = model->is_training();
  model->train();
  for (auto&& batch : loader) {
    torch::Tensor input;
    if constexpr (requires { std::get<0>(batch); }) input = std::get<0>(batch);
    else input = batch;
    if (device) input = input.to(*device);
    model->forward(input);
  }
  detail::averaging::set_batch_norm_momenta(*model, &momenta);
  model->train(was_training);
}

}  // namespace dettrial::optim

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

namespace dettrial::optim {

DETTRIAL_INLINE AveragedWeights::AveragedWeights(std::shared_ptr<torch::nn::Module> copy, Averaging how)
    : copy_(std::move(copy)), how_(how) {
  if (!copy_) throw ConfigError("dettrial::optim::AveragedModel: no module to average into");
  if (how_.kind == Averaging::Kind::exponential && !(how_.decay >= 0 && how_.decay <= 1))
    throw ConfigError("dettrial::optim::AveragedModel: decay must be in [0, 1], not " + std::to_string(how_.decay));
  // Python's registration order: the count (a buffer of its own), then the copy.
  n_averaged_ = register_buffer("n_averaged", torch::zeros({}, torch::kLong));
  register_module("module", copy_);
}

DETTRIAL_INLINE void AveragedWeights::average_group(std::vector<torch::Tensor>& averaged, const std::vector<torch::Tensor>& current) const {
  const bool floating = averaged.front().is_floating_point() || averaged.front().is_complex();
  if (how_.kind == Averaging::Kind::exponential) {  // Python's get_ema_multi_avg_fn
    if (floating) {
      for (std::size_t i = 0; i < averaged.size(); ++i) averaged[i].lerp_(current[i], 1 - how_.decay);  // _foreach_lerp_'s arithmetic
    } else {
      for (std::size_t i = 0; i < averaged.size(); ++i) averaged[i].copy_(averaged[i] * how_.decay + current[i] * (1 - how_.decay));
    }
    return;
  }
  const torch::Device device = averaged.front().device();
  const torch::Tensor n = n_averaged_.to(device);
  // Python's default: get_swa_multi_avg_fn on devices with foreach kernels (CUDA), whose weight is
  // 1 / (n_averaged + 1) computed as a float32 tensor; get_swa_avg_fn elsewhere (the CPU).
  if (device.is_cuda() && floating) {
    const double weight = (n + 1).reciprocal().item<double>();  // Python's 1 / (n + 1): the reciprocal, a float32 tensor
    for (std::size_t i = 0; i < averaged.size(); ++i) averaged[i].lerp_(current[i], weight);
  } else {
    for (std::size_t i = 0; i < averaged.size(); ++i) averaged[i].copy_(averaged[i] + (current[i] - averaged[i]) / (n + 1));
  }
}

DETTRIAL_INLINE void AveragedWeights::update_parameters(const torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> mine = copy_->parameters(), theirs = model.parameters();
  if (how_.use_buffers) {
    for (const auto& b : copy_->buffers()) mine.push_back(b);
    for (const auto& b : model.buffers()) theirs.push_back(b);
  }
  if (mine.size() != theirs.size())
    throw TrialError("dettrial::optim::AveragedModel: the model has " + std::to_string(theirs.size()) +
                     " parameters (and buffers, with use_buffers) but the average " + std::to_string(mine.size()) +
                     ": is it another architecture?");
  std::vector<torch::Tensor> current;
  for (std::size_t i = 0; i < mine.size(); ++i) current.push_back(theirs[i].detach().to(mine[i].device()));
  if (n_averaged() == 0) {
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i].detach().copy_(current[i]);
  } else {
    // Grouped by device and dtype, as Python's _group_tensors_by_device_and_dtype groups them.
    std::map<std::tuple<std::string, int>, std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>> groups;
    std::vector<std::tuple<std::string, int>> order;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto key = std::make_tuple(mine[i].device().str(), static_cast<int>(mine[i].scalar_type()));
      if (!groups.count(key)) order.push_back(key);
      groups[key].first.push_back(mine[i].detach());
      groups[key].second.push_back(current[i]);
    }
    for (const auto& key : order) average_group(groups[key].first, groups[key].second);
  }
  if (!how_.use_buffers) {  // Python keeps the copy's buffers in sync with the model's
    const auto mine_buffers = copy_->buffers(), their_buffers = model.buffers();
    if (mine_buffers.size() != their_buffers.size())
      throw TrialError("dettrial::optim::AveragedModel: the model has " + std::to_string(their_buffers.size()) +
                       " buffers but the average " + std::to_string(mine_buffers.size()));
    for (std::size_t i = 0; i < mine_buffers.size(); ++i)
      mine_buffers[i].detach().copy_(their_buffers[i].detach().to(mine_buffers[i].device()));
  }
  n_averaged_.add_(1);
}

// ------------------------------------------------------------------------------------------------
// SWALR

DETTRIAL_INLINE SWALR::SWALR(torch::optim::Optimizer& optimizer, const PerGroup& swa_lr, std::int64_t anneal_epochs,
                             AnnealStrategy anneal_strategy)
    : EpochLRScheduler(optimizer, "SWALR"), anneal_epochs_(anneal_epochs), anneal_(anneal_strategy) {
  if (anneal_epochs < 0) invalid("anneal_epochs", "at least 0", std::to_string(anneal_epochs));
  swa_lrs_ = detail::scheduler_base::per_group("SWALR", "swa_lr", swa_lr, optimizer);
  step();  // Python's constructor steps once
}

DETTRIAL_INLINE const std::vector<double>& SWALR::rates() {
  // Python's get_lr, term for term: the rates undo the last step's annealing, then take this one's.
  std::int64_t step = step_count_ - 1;
  if (anneal_epochs_ == 0) step = std::max<std::int64_t>(1, step);
  const double span = static_cast<double>(std::max<std::int64_t>(1, anneal_epochs_));
  const auto alpha_at = [&](double t) {
    t = std::max(0.0, std::min(1.0, t));
    return anneal_ == AnnealStrategy::linear ? t : (1 - std::cos(std::numbers::pi * t)) / 2;
  };
  const double prev_alpha = alpha_at(static_cast<double>(step - 1) / span);
  const double alpha = alpha_at(static_cast<double>(step) / span);
  std::vector<double>& out = next_rates_;
  out.clear();
  const auto& groups = optimizer_->param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double lr = groups[i].options().get_lr();
    const double prev = prev_alpha == 1 ? swa_lrs_[i] : (lr - prev_alpha * swa_lrs_[i]) / (1 - prev_alpha);
    out.push_back(swa_lrs_[i] * alpha + prev * (1 - alpha));
  }
  return out;
}

DETTRIAL_INLINE void SWALR::step() {
  ++step_count_;
  ++last_epoch_;
  const std::vector<double>& r = rates();
  set_rates([&r](std::size_t i, double) { return r[i]; });
}

DETTRIAL_INLINE void SWALR::restart_at_milestone() {
  last_epoch_ = 0;
  const std::vector<double>& r = rates();
  set_rates([&r](std::size_t i, double) { return r[i]; });
}

DETTRIAL_INLINE void SWALR::save(torch::serialize::OutputArchive& archive) const {
  save_fields(*this, archive, fields());
  archive.write("anneal_strategy", c10::IValue(std::string(anneal_ == AnnealStrategy::cos ? "cos" : "linear")));
}

DETTRIAL_INLINE void SWALR::load(torch::serialize::InputArchive& archive) {
  const std::string anneal = detail::scheduler_base::text_of(archived(archive, "anneal_strategy"), archive_owner() + ": 'anneal_strategy'");
  if (anneal != "cos" && anneal != "linear")
    throw CheckpointError(archive_owner() + ": anneal_strategy '" + anneal + "' is not cos or linear");
  load_fields(*this, archive, fields());
  anneal_ = anneal == "cos" ? AnnealStrategy::cos : AnnealStrategy::linear;
}

DETTRIAL_INLINE void SWALR::python_state(c10::impl::GenericDict& out) const {
  out.insert("_anneal_strategy", std::string(anneal_ == AnnealStrategy::cos ? "cos" : "linear"));
  out.insert("anneal_epochs", anneal_epochs_);
  python_common(out);
}

DETTRIAL_INLINE void SWALR::load_python_state(const c10::impl::GenericDict& in, const std::string& what) {
  const auto strategy = in.find("_anneal_strategy");
  const auto epochs = in.find("anneal_epochs");
  if (strategy == in.end() || epochs == in.end())
    throw CheckpointError(what + " has no '_anneal_strategy' or 'anneal_epochs': it is not Python's SWALR state");
  const std::string anneal = detail::scheduler_base::text_of(strategy->value(), what + ": _anneal_strategy");
  if (anneal != "cos" && anneal != "linear") throw CheckpointError(what + ": _anneal_strategy '" + anneal + "' is not cos or linear");
  const std::int64_t anneal_epochs = python::count(epochs->value(), what + ": anneal_epochs", 0);
  load_python_common(in, {"_anneal_strategy", "anneal_epochs"}, what);
  anneal_ = anneal == "cos" ? AnnealStrategy::cos : AnnealStrategy::linear;
  anneal_epochs_ = anneal_epochs;
}

DETTRIAL_INLINE void SWALR::python_param_group(std::size_t group, c10::impl::GenericDict& out) const {
  out.insert_or_assign("swa_lr", swa_lrs_.at(group));
}

DETTRIAL_INLINE void SWALR::load_python_param_group(std::size_t group, const c10::impl::GenericDict& in, const std::string& what) {
  const auto it = in.find("swa_lr");
  if (it == in.end())
    throw CheckpointError(what + " has no 'swa_lr', which Python's SWALR keeps there: was the checkpoint's scheduler another?");
  swa_lrs_.at(group) = python::number(it->value(), what + ": swa_lr");
}

// ------------------------------------------------------------------------------------------------
// update_bn

}  // namespace dettrial::optim

namespace dettrial::detail::averaging {

/// Calls f with every BatchNorm layer's options and its reset, whatever its dimension (and those of
/// dettrial's layers with BatchNorm's statistics: RunningStatistics).
template <class F>
void for_each_batch_norm(torch::nn::Module& model, F&& f) {
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(m.get())) f(bn->options, [bn] { bn->reset_running_stats(); });
    else if (auto* bn2 = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get())) f(bn2->options, [bn2] { bn2->reset_running_stats(); });
    else if (auto* bn3 = dynamic_cast<torch::nn::BatchNorm3dImpl*>(m.get())) f(bn3->options, [bn3] { bn3->reset_running_stats(); });
    else if (auto* other = dynamic_cast<optim::RunningStatistics*>(m.get()))
      f(other->batch_norm_options(), [other] { other->reset_running_stats(); });
  }
}

DETTRIAL_INLINE std::vector<Momentum> set_batch_norm_momenta(torch::nn::Module& model, const std::vector<Momentum>* momenta) {
  std::vector<Momentum> before;
  std::size_t i = 0;
  for_each_batch_norm(model, [&](torch::nn::BatchNormOptions& options, auto reset) {
    before.push_back(options.momentum());
    if (momenta) {
      options.momentum() = momenta->at(i++);
    } else {
      reset();
      options.momentum() = Momentum{};  // none: a cumulative average over the pass
    }
  });
  return before;
}

}  // namespace dettrial::detail::averaging

#endif  // DETTRIAL_HEADER_DEFINITIONS
