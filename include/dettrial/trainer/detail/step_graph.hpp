// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The training step captured once in a CUDA graph and replayed (capture::cuda_graph): the
/// checks made before training starts, and the graph with its input buffers.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <concepts>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/torch.h>

#include "../../config/step_capture.hpp"
#include "../../context/detail/access.hpp"
#include "../../context/context.hpp"
#include "../../data/to_device.hpp"
#include "../../error.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../../optim/fused.hpp"
#include "../../detail/linkage.hpp"
#include "../../detail/scope_exit.hpp"
#include "../../detail/text.hpp"

namespace dettrial::detail {

/// Whether this build of dettrial can capture CUDA graphs.
inline constexpr bool step_capture_built =
#if defined(DETTRIAL_HAS_CUDA)
    true;
#else
    false;
#endif

/// Calls `f(a_tensor, b_tensor)` on the tensors of two batches of the same type, pairwise; returns
/// false (and stops) where their structure differs (vector lengths, map keys).
template <class A, class B, class F>
  requires std::same_as<std::remove_cvref_t<A>, std::remove_cvref_t<B>>
bool for_each_tensor_pair(A& a, B& b, F&& f) {
  using U = std::remove_cvref_t<A>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    return f(a, b);
  } else if constexpr (is_tuple_like<U>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (for_each_tensor_pair(std::get<I>(a), std::get<I>(b), f) && ...);
    }(std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (is_vector<U>::value) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!for_each_tensor_pair(a[i], b[i], f)) return false;
    return true;
  } else if constexpr (is_string_map<U>::value) {
    if (a.size() != b.size()) return false;
    for (auto& [key, value] : a) {
      const auto it = b.find(key);
      if (it == b.end() || !for_each_tensor_pair(value, it->second, f)) return false;
    }
    return true;
  } else {
    return true;
  }
}

/**
 * @brief Refuses, before the first batch, a step capture that could not be right: one sentence
 * naming what stands in the way. The trial-side reasons come first, so that they are seen (and
 * tested) on any machine; the device last. `tensors_only`: whether the training batch type
 * (`batch_type`, for the message) is made of tensors only.
 */
DETTRIAL_INLINE void check_step_capture(TrainerKey key, const StepCapture& capture, Context& context, bool tensors_only,
                                        const std::string& batch_type);

/**
 * @brief What a captured step holds that does not depend on the batch type: the optimizers it syncs,
 * the warm-up count, the CUDA graph and its side stream. Compiled once (dettrial::compiled in
 * separate-compilation mode), so that a trial's translation unit reads no CUDA header.
 */
class StepGraphCore {
 public:
  DETTRIAL_INLINE StepGraphCore();
  DETTRIAL_INLINE ~StepGraphCore();
  StepGraphCore(const StepGraphCore&) = delete;
  StepGraphCore& operator=(const StepGraphCore&) = delete;

  /// Arms the capture for this fit: the optimizers it syncs, and the eager batches before it.
  DETTRIAL_INLINE void start(const capture::cuda_graph& options, Context& context);
  bool armed() const { return armed_; }
  bool warming_up() const { return warmup_left_ > 0; }
  /// One warm-up batch less to go.
  void count_warm_up() { --warmup_left_; }
  /// Whether every optimizer's state is whole (an fp16 scaler may have skipped every warm-up step).
  DETTRIAL_INLINE bool optimizers_ready() const;
  /// See StepGraph::check_unchanged.
  DETTRIAL_INLINE void check_unchanged() const;

  /// Makes the side stream current, ordered after the work queued so far on the current stream.
  DETTRIAL_INLINE void enter_side_stream();
  /// Makes the stream current before enter_side_stream() current again.
  DETTRIAL_INLINE void leave_side_stream() noexcept;
  /// The stream current before enter_side_stream() waits for the work queued on the side stream.
  DETTRIAL_INLINE void join_side_stream();

  /// Before a capture: gradients unset (the captured backward pass makes them in the graph's
  /// memory), learning rates synced, and the optimizers writing nothing from the host.
  DETTRIAL_INLINE void prepare_capture();
  /// A new graph, and the capture begun on the side stream (made current).
  DETTRIAL_INLINE void begin_capture();
  DETTRIAL_INLINE void end_capture();
  /// Ends a capture that failed; its own error is the one reported.
  DETTRIAL_INLINE void abandon_capture() noexcept;
  /// The optimizers write from the host again.
  DETTRIAL_INLINE void stop_capturing();
  /// Keeps what check_unchanged() compares against.
  void note_captured() { captured_groups_ = group_states(); }
  /// Replays the graph as it is.
  DETTRIAL_INLINE void replay_graph();
  /// Syncs the learning rates into the graph's memory, replays, and tells the scaler.
  DETTRIAL_INLINE void replay_step();
  /// Unsets the gradients (before an eager batch after the capture, so that its backward pass does
  /// not add to the graph's).
  DETTRIAL_INLINE void clear_gradients();
  /// Forgets the graph (and its memory).
  DETTRIAL_INLINE void reset();

  /// A captured step's metrics must be tensors (a number would keep the captured batch's value).
  DETTRIAL_INLINE static void check_metrics(const Metrics& metrics);
  /// The TrialError for a step that could not be captured (`e` is why).
  [[noreturn]] DETTRIAL_INLINE static void capture_failed(const std::exception& e);

 private:
  DETTRIAL_INLINE std::vector<std::vector<double>> group_states() const;

  struct Capturable {
    optim::CapturableOptimizer* capturable;
    torch::optim::Optimizer* optimizer;
  };
  /// The graph, the side stream and the stream guard (CUDA types, complete where compiled).
  struct Device;
  std::unique_ptr<Device> device_;
  std::vector<Capturable> optimizers_;
  Context* context_ = nullptr;
  std::int64_t warmup_left_ = 0;
  bool armed_ = false;
  std::vector<std::vector<double>> captured_groups_;
};

/**
 * @brief One fit's captured step: the graph (StepGraphCore), its input batch and output metrics, and
 * where the run stands (warming up, captured). The trainer drives it; see Trainer::train_batch.
 */
template <class Batch>
class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { reset(); }

  /// Arms the capture for this fit: the optimizers it syncs, and the eager batches before it.
  void start(const capture::cuda_graph& options, Context& context) { core_.start(options, context); }
  bool armed() const { return core_.armed(); }
  bool captured() const { return static_batch_.has_value(); }
  bool warming_up() const { return core_.warming_up(); }

  /// Whether `batch` has the captured batch's structure and shapes (else it runs eagerly).
  bool fits(const Batch& batch) const { return same_layout(*static_batch_, batch); }

  /// Whether `batch` may be captured: it has the shapes of the last warm-up batch (so an epoch's
  /// short last batch is never the one captured, and nothing is tuned for a new shape inside the
  /// capture), and every optimizer's state is whole (an fp16 scaler may have skipped every warm-up
  /// step). Else it warms up too.
  bool ready_to_capture(const Batch& batch) const {
    return core_.optimizers_ready() && last_warm_up_ && same_layout(*last_warm_up_, batch);
  }
  /// Keeps handles to a warm-up batch's tensors (before the trial may reassign them), for their shapes.
  void note_warm_up_shapes(const Batch& batch) { last_warm_up_.emplace(batch); }

  /// At each workload after the capture: the parameters and the options the graph holds as host
  /// values must be those it was captured with (a replay would silently keep the old ones).
  void check_unchanged() const {
    if (captured()) core_.check_unchanged();
  }

  /// A warm-up batch: `step` runs eagerly on the capture's side stream, ordered after the work
  /// before it and before the work after it, so that the libraries make their per-stream state
  /// (cuBLAS workspaces) where the capture will run.
  template <class Step>
  Metrics warm_up(Step&& step) {
    core_.count_warm_up();
    core_.enter_side_stream();
    Metrics metrics;
    {
      const auto back = on_scope_exit([&] { core_.leave_side_stream(); });
      metrics = step();
    }
    core_.join_side_stream();
    StepGraphCore::check_metrics(metrics);
    return metrics;
  }

  /// Captures `step(static_batch)` in the graph (nothing runs), then replays it once to train `batch`.
  template <class Step>
  Metrics capture(Batch batch, Step&& step) {
    static_batch_.emplace(std::move(batch));
    core_.prepare_capture();
    try {
      const auto back = on_scope_exit([&] { core_.leave_side_stream(); });
      core_.begin_capture();
      try {
        // The trial gets its own handles to the inputs: reassigning one (x = x.float()) must not
        // replace the buffer each batch is copied into.
        Batch working = *static_batch_;
        static_metrics_ = step(working);
      } catch (...) {
        core_.abandon_capture();
        throw;
      }
      core_.end_capture();
    } catch (const std::exception& e) {
      core_.stop_capturing();
      StepGraphCore::capture_failed(e);
    }
    core_.stop_capturing();
    core_.join_side_stream();
    StepGraphCore::check_metrics(static_metrics_);
    core_.note_captured();
    last_warm_up_.reset();
    core_.replay_graph();
    return static_metrics_;
  }

  /// Copies `batch` into the graph's inputs (on the device, without waiting) and replays the step.
  Metrics replay(const Batch& batch) {
    for_each_tensor_pair(*static_batch_, batch, [](torch::Tensor& s, const torch::Tensor& b) {
      if (s.defined()) s.copy_(b, /*non_blocking=*/true);
      return true;
    });
    core_.replay_step();
    return static_metrics_;
  }

  /// Before an eager batch after the capture: gradients unset, so the eager backward pass does not
  /// add to the graph's.
  void before_eager_batch() { core_.clear_gradients(); }

  /// Forgets the graph (and its memory) at the end of a fit.
  void reset() {
    core_.reset();
    static_metrics_ = Metrics{};
    static_batch_.reset();
    last_warm_up_.reset();
  }

 private:
  /// The same structure, and tensors of the same shapes and types.
  static bool same_layout(const Batch& a, const Batch& b) {
    return for_each_tensor_pair(a, b, [](const torch::Tensor& x, const torch::Tensor& y) {
      return x.defined() == y.defined() && (!x.defined() || (x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type()));
    });
  }
  StepGraphCore core_;
  std::optional<Batch> static_batch_;
  Metrics static_metrics_;
  std::optional<Batch> last_warm_up_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
// DETTRIAL_HAS_CUDA: LibTorch is CUDA-built (dettrial's CMake defines it, as it does the NCCL backend).
#if defined(DETTRIAL_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dettrial::detail {

#if defined(DETTRIAL_HAS_CUDA)
struct StepGraphCore::Device {
  std::optional<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> side;
  /// The stream current before the side stream was made current.
  std::optional<c10::cuda::CUDAStream> main;
  std::optional<c10::cuda::CUDAStreamGuard> on_side;

  /// `after` waits for the work queued on `before` so far.
  static void join(const c10::cuda::CUDAStream& before, const c10::cuda::CUDAStream& after) {
    at::cuda::CUDAEvent event;
    event.record(before);
    event.block(after);
  }
};
#else
struct StepGraphCore::Device {};
[[noreturn]] inline void step_capture_unavailable() { throw ConfigError("step_capture: cuda_graph needs LibTorch built with CUDA"); }
#endif

DETTRIAL_INLINE void check_step_capture(TrainerKey key, const StepCapture& capture, Context& context, bool tensors_only,
                                        const std::string& batch_type) {
  if (std::holds_alternative<capture::none>(capture)) return;
  const auto& graph = std::get<capture::cuda_graph>(capture);
  const std::string what = "step_capture: cuda_graph ";
  if (graph.warmup_batches < 1)
    throw ConfigError(what + "needs at least 1 warm-up batch (capture_warmup_batches is " + std::to_string(graph.warmup_batches) +
                      "): the eager batches before the capture make the optimizer's state");
  if (!tensors_only)
    throw TrialError(what +
                     "copies each batch into the graph's input tensors, so the training batch must be made of tensors "
                     "(in tuples, pairs, vectors or string-keyed maps); " +
                     batch_type + " is not, or holds a value that the graph would freeze");
  if (context.communicator())
    throw ConfigError(what +
                      "does not capture data-parallel training (the gradient all-reduce runs between the backward pass "
                      "and the step); run one process per trial or set step_capture: none");
  if (context.rank_invariant())
    throw ConfigError(what +
                      "replays one step, but reproducibility.rank_invariant seeds each batch's draws and keeps its "
                      "gradients apart on the host's schedule; set one of them off");
  if (context.aggregation_frequency() > 1)
    throw ConfigError(what + "needs aggregation_frequency 1: with " + std::to_string(context.aggregation_frequency()) +
                      " the optimizer steps on some batches only, which one graph cannot replay");
  if (const WrappedReducer* reducer = detail::ContextAccess::reducers(key, context).first(ReducerRole::training))
    throw TrialError(what + "replays train_batch without running its host code, so a reducer fed in train_batch (" +
                     (reducer->name.empty() ? std::string("one returning MetricValues") : "'" + reducer->name + "'") +
                     ") would see only the captured batch; wrap it with for_training = false, or set step_capture: none");
#if !DETTRIAL_FUSED_KERNELS
  if (context.scaler())
    throw ConfigError(what +
                      "cannot replay an fp16 gradient scaler with LibTorch before 2.4, whose optimizer kernels cannot "
                      "skip a step on the device; use mixed_precision: bf16 (no scaler) or fp32, or LibTorch 2.4 or later");
#endif
  for (std::size_t i = 0; i < context.num_optimizers(); ++i) {
    torch::optim::Optimizer& optimizer = context.optimizer(i);
    if (!dynamic_cast<optim::CapturableOptimizer*>(&optimizer))
      throw TrialError(what + "needs optimizers that read their learning rate on the device, and optimizer " + std::to_string(i) + " (" +
                       c10::demangle(typeid(optimizer).name()) +
                       ") reads it on the host, so a replay would keep the captured batch's; use dettrial::optim::FusedSGD, "
                       "FusedAdam or FusedAdamW (same options and checkpoints as LibTorch's SGD, Adam and AdamW)");
  }
  if (!step_capture_built) throw ConfigError(what + "needs LibTorch built with CUDA, and this one is CPU-only; set step_capture: none");
  if (!context.device().is_cuda())
    throw ConfigError(what + "needs a CUDA device, and this trial runs on " + context.device().str() + "; set step_capture: none");
}

DETTRIAL_INLINE StepGraphCore::StepGraphCore() : device_(std::make_unique<Device>()) {}
DETTRIAL_INLINE StepGraphCore::~StepGraphCore() { reset(); }

DETTRIAL_INLINE void StepGraphCore::start(const capture::cuda_graph& options, Context& context) {
  warmup_left_ = options.warmup_batches;
  optimizers_.clear();
  for (std::size_t i = 0; i < context.num_optimizers(); ++i) {
    torch::optim::Optimizer& o = context.optimizer(i);
    optimizers_.push_back({dynamic_cast<optim::CapturableOptimizer*>(&o), &o});
  }
  context_ = &context;
  armed_ = true;
}

DETTRIAL_INLINE bool StepGraphCore::optimizers_ready() const {
  for (const auto& entry : optimizers_)
    if (!entry.capturable->ready_for_capture()) return false;
  return true;
}

DETTRIAL_INLINE void StepGraphCore::check_unchanged() const {
  if (group_states() != captured_groups_)
    throw TrialError(
        "step_capture: cuda_graph replays the optimizer step as captured, and since the capture an optimizer's "
        "parameters or options other than the learning rate (momentum, betas, weight decay, ...) changed; "
        "only learning rates may change under a captured step, or set step_capture: none");
}

DETTRIAL_INLINE void StepGraphCore::prepare_capture() {
  clear_gradients();
  for (auto& [capturable, optimizer] : optimizers_) {
    capturable->sync_learning_rates(optimizer->param_groups());
    capturable->set_capturing(true);
  }
}

DETTRIAL_INLINE void StepGraphCore::stop_capturing() {
  for (auto& [capturable, optimizer] : optimizers_) capturable->set_capturing(false);
}

DETTRIAL_INLINE void StepGraphCore::replay_step() {
  for (auto& [capturable, optimizer] : optimizers_) capturable->sync_learning_rates(optimizer->param_groups());
  replay_graph();
  // The replay unscaled, checked and stepped (or skipped) on the device; the scale is updated after it.
  if (GradScaler* scaler = context_->scaler()) scaler->note_replayed_step();
}

DETTRIAL_INLINE void StepGraphCore::clear_gradients() {
  for (const auto& m : context_->models())
    for (auto& p : m->parameters()) p.mutable_grad().reset();
  for (auto& [capturable, optimizer] : optimizers_)
    for (auto& group : optimizer->param_groups())
      for (auto& p : group.params()) p.mutable_grad().reset();
}

DETTRIAL_INLINE std::vector<std::vector<double>> StepGraphCore::group_states() const {
  std::vector<std::vector<double>> out;
  for (const auto& [capturable, optimizer] : optimizers_)
    for (const auto& group : optimizer->param_groups()) out.push_back(captured_group_state(group));
  return out;
}

#if defined(DETTRIAL_HAS_CUDA)
DETTRIAL_INLINE void StepGraphCore::enter_side_stream() {
  Device& d = *device_;
  d.main = c10::cuda::getCurrentCUDAStream(context_->device().index());
  if (!d.side) d.side = c10::cuda::getStreamFromPool(false, context_->device().index());
  Device::join(*d.main, *d.side);
  d.on_side.emplace(*d.side);
}
DETTRIAL_INLINE void StepGraphCore::leave_side_stream() noexcept { device_->on_side.reset(); }
DETTRIAL_INLINE void StepGraphCore::join_side_stream() { Device::join(*device_->side, *device_->main); }

DETTRIAL_INLINE void StepGraphCore::begin_capture() {
  device_->graph.emplace();
  enter_side_stream();
  // Thread-local mode: the loader's threads may pin memory (cudaHostAlloc) during the capture.
  device_->graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
}
DETTRIAL_INLINE void StepGraphCore::end_capture() { device_->graph->capture_end(); }
DETTRIAL_INLINE void StepGraphCore::abandon_capture() noexcept {
  try {
    device_->graph->capture_end();
  } catch (...) {  // the capture is invalid already
  }
}
DETTRIAL_INLINE void StepGraphCore::replay_graph() { device_->graph->replay(); }

DETTRIAL_INLINE void StepGraphCore::reset() {
  if (device_) {
    device_->on_side.reset();
    if (device_->graph) device_->graph->reset();
    device_->graph.reset();
  }
  armed_ = false;
  warmup_left_ = 0;
  captured_groups_.clear();
}
#else
DETTRIAL_INLINE void StepGraphCore::enter_side_stream() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::leave_side_stream() noexcept {}
DETTRIAL_INLINE void StepGraphCore::join_side_stream() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::begin_capture() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::end_capture() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::abandon_capture() noexcept {}
DETTRIAL_INLINE void StepGraphCore::replay_graph() { step_capture_unavailable(); }
DETTRIAL_INLINE void StepGraphCore::reset() {
  armed_ = false;
  warmup_left_ = 0;
  captured_groups_.clear();
}
#endif

DETTRIAL_INLINE void StepGraphCore::check_metrics(const Metrics& metrics) {
  for (const auto& e : metrics)
    if (!e.value.is_tensor())
      throw TrialError(
          "step_capture: cuda_graph replays train_batch, so a metric it returns as a number would keep the "
          "captured batch's value: return '" +
          std::string(e.key.view()) + "' as a tensor");
}

DETTRIAL_INLINE void StepGraphCore::capture_failed(const std::exception& e) {
  throw TrialError(std::string("step_capture: cuda_graph could not capture the training step (train_batch, backward and "
                               "the optimizer step): ") +
                   first_line(e.what()) +
                   ". A captured step must not wait for the device (.item(), .cpu(), printing a tensor, a branch on a "
                   "tensor's value), make tensors on the host, or change shapes with the data (nonzero, masked_select); "
                   "remove that from train_batch or set step_capture: none");
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
