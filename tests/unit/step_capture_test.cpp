// The training step captured in a CUDA graph (capture::cuda_graph): what can be proven without a GPU.
// The optimizers a graph can replay (FusedSGD, FusedAdam, FusedAdamW) against LibTorch's own, their
// learning rate following a scheduler, their checkpoints; gradient clipping without a host read; the
// config keys; and every refusal at the start, each one sentence. The capture and replay themselves
// need a GPU: bench/gpu/ runs them.
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <ranges>
#include <string>
#include <tuple>
#include <vector>

#include "test_trials.hpp"

#include <doctest/doctest.h>
#include "applied_context.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

/// Trains `steps` steps of Linear(5, 3) on a fixed problem with `make(params)`, the learning rate set
/// to lr2 from step 10 (as a scheduler would); returns the weight.
template <class Make>
torch::Tensor train_linear(Make make, double lr2, int steps = 20) {
  torch::manual_seed(1);
  torch::nn::Linear model(5, 3);
  auto optimizer = make(model->parameters());
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({64, 5}), y = torch::randn({64, 3});
  for (int i = 0; i < steps; ++i) {
    if (i == 10) optimizer.param_groups()[0].options().set_lr(lr2);
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
  return model->weight.detach().clone();
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

/// The regression trial with a capturable optimizer.
struct FusedTrial : test::DeclarativeRegression {
  using DeclarativeRegression::DeclarativeRegression;
  optim::FusedAdam optimizer(torch::nn::Sequential& model) {
    return optim::FusedAdam(model->parameters(), torch::optim::AdamOptions(context.get_hparam<double>("lr")));
  }
  auto lr_scheduler(optim::FusedAdam& opt) { return torch::optim::StepLR(opt, /*step_size=*/3, /*gamma=*/0.7); }
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
    if (i + 1 == stop_at) context.set_stop_requested(true);
    return DeclarativeRegression::train_batch(b, model, e, i);
  }
  std::int64_t stop_at = -1;
};

/// The regression trial as it comes (LibTorch's SGD).
struct HostLrTrial : test::DeclarativeRegression {
  using DeclarativeRegression::DeclarativeRegression;
};

struct FusedSgdTrial : test::DeclarativeRegression {
  using DeclarativeRegression::DeclarativeRegression;
  optim::FusedSGD optimizer(torch::nn::Sequential& model) {
    return optim::FusedSGD(model->parameters(), torch::optim::SGDOptions(context.get_hparam<double>("lr")).momentum(0.9));
  }
};

/// A trial that feeds a reducer from train_batch (which a replay would not run).
struct ReducingTrial : FusedSgdTrial {
  explicit ReducingTrial(Context& c) : FusedSgdTrial(c) {
    c.wrap_reducer([](const std::vector<double>& v) { return static_cast<double>(v.size()); }, "batches_seen");
  }
};

FitOptions captured(std::int64_t length, fs::path* out = nullptr) {
  FitOptions o = test::quiet({.max_length = Batch(length), .step_capture = capture::cuda_graph{}});
  if (out) *out = o.output_dir;
  return o;
}

template <class Trial>
std::string refusal(ContextOptions options = {}) {
  test::Context context(test::hparams(), options);
  Trainer<Trial> trainer(context);
  fs::path out;
  try {
    trainer.fit(captured(4, &out));
  } catch (const std::exception& e) {
    CHECK_MESSAGE(!fs::exists(out), "a refused fit wrote " << out);
    return e.what();
  }
  return "fit did not refuse";
}

}  // namespace

TEST_CASE(
    "FusedSGD, FusedAdam and FusedAdamW train as LibTorch's SGD (to the bit on the CPU), Adam and AdamW, and follow a changed learning "
    "rate") {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  using Params = std::vector<torch::Tensor>;
  const auto sgd = SGDOptions(0.03).momentum(0.9).weight_decay(1e-4).dampening(0.1);
  const auto nesterov = SGDOptions(0.03).momentum(0.9).nesterov(true);
  const auto adam = AdamOptions(0.01).weight_decay(1e-3);
  const auto adamw = AdamWOptions(0.01).amsgrad(true);
  struct Case {
    const char* name;
    torch::Tensor libtorch, fused, fused_same_lr;
  };
  // On the CPU FusedSGD runs LibTorch's own operations: its SGD to the bit. Adam's fused kernel
  // (LibTorch 2.4+) and its tensor arithmetic (1.13) round a few operations in another order than
  // LibTorch's loop: float32 agreement, not bits.
  const Case cases[] = {
      {"SGD", train_linear([&](Params p) { return torch::optim::SGD(p, sgd); }, 0.001),
       train_linear([&](Params p) { return optim::FusedSGD(p, sgd); }, 0.001),
       train_linear([&](Params p) { return optim::FusedSGD(p, sgd); }, 0.03)},
      {"SGD nesterov, no decay", train_linear([&](Params p) { return torch::optim::SGD(p, nesterov); }, 0.001),
       train_linear([&](Params p) { return optim::FusedSGD(p, nesterov); }, 0.001),
       train_linear([&](Params p) { return optim::FusedSGD(p, nesterov); }, 0.03)},
      {"Adam", train_linear([&](Params p) { return torch::optim::Adam(p, adam); }, 0.001),
       train_linear([&](Params p) { return optim::FusedAdam(p, adam); }, 0.001),
       train_linear([&](Params p) { return optim::FusedAdam(p, adam); }, 0.01)},
      {"AdamW amsgrad", train_linear([&](Params p) { return torch::optim::AdamW(p, adamw); }, 0.001),
       train_linear([&](Params p) { return optim::FusedAdamW(p, adamw); }, 0.001),
       train_linear([&](Params p) { return optim::FusedAdamW(p, adamw); }, 0.01)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    if (std::string(c.name).starts_with("SGD")) CHECK(torch::equal(c.libtorch, c.fused));
    CHECK(max_difference(c.libtorch, c.fused) < 2e-6);
    // The learning rate set on the host after 10 steps reached the device tensor the step reads.
    CHECK(max_difference(c.fused, c.fused_same_lr) > 1e-4);
  }
}

TEST_CASE("FusedAdam: stopped after a checkpoint and resumed, training is bit-identical to training straight through") {
  auto options = [](std::int64_t length) {
    return test::quiet({.max_length = Batch(length), .checkpoint_period = Batch(3), .checkpoint_policy = CheckpointPolicy::none});
  };
  test::Context straight_context(test::hparams(), ContextOptions{.trial_seed = 5});
  Trainer<FusedTrial> straight(straight_context);
  REQUIRE(straight.fit(options(13)).batches_trained == 13);

  test::Context first_context(test::hparams(), ContextOptions{.trial_seed = 5});
  Trainer<FusedTrial> first(first_context);
  first.trial().stop_at = 6;
  const FitResult stopped = first.fit(options(13));
  REQUIRE(stopped.batches_trained == 6);
  // The step count kept on the device reached LibTorch's state, which the checkpoint holds.
  const auto& state = first.optimizer().state();
  REQUIRE(!state.empty());
  for (const auto& [key, s] : state) CHECK(static_cast<torch::optim::AdamParamState&>(*s).step() == 6);

  test::Context second_context(test::hparams(), ContextOptions{.trial_seed = 42});
  Trainer<FusedTrial> second(second_context);
  FitOptions resume = options(13);
  resume.latest_checkpoint = stopped.output_dir;
  REQUIRE(second.fit(resume).batches_trained == 13);
  CHECK(test::bit_identical(test::parameters_of(straight_context), test::parameters_of(second_context)));
  CHECK(straight.optimizer().param_groups()[0].options().get_lr() == second.optimizer().param_groups()[0].options().get_lr());
}

TEST_CASE("clip::by_norm scales gradients as Python's clip_grad_norm_, to the bit, without reading the norm") {
  for (const double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(norm_type);
    torch::manual_seed(3);
    std::vector<torch::Tensor> a{torch::randn({4, 3}), torch::randn({7})}, b, c;
    for (auto& p : a) {
      p.mutable_grad() = torch::randn_like(p) * 5;
      for (auto* copy : {&b, &c}) {
        copy->push_back(p.detach().clone());
        copy->back().mutable_grad() = p.grad().clone();
      }
    }
    // Python's torch.nn.utils.clip_grad_norm_, operation by operation: each gradient's
    // torch.linalg.vector_norm (the largest magnitude for inf), their norm, then
    // `max_norm / (total + 1e-6)`, which Python computes as a reciprocal times max_norm.
    std::vector<torch::Tensor> norms;
    for (const auto& p : a) norms.push_back(std::isinf(norm_type) ? p.grad().abs().max() : at::linalg_vector_norm(p.grad(), norm_type));
    const torch::Tensor total =
        std::isinf(norm_type) ? torch::max(torch::stack(norms)) : at::linalg_vector_norm(torch::stack(norms), norm_type);
    const torch::Tensor coef = torch::clamp_max((total + 1e-6).reciprocal() * 1.5, 1.0);
    for (auto& p : a) p.grad().mul_(coef);
    clip::by_norm{.max_norm = 1.5, .norm_type = norm_type}(b);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].grad(), b[i].grad()));
    // LibTorch's C++ clip_grad_norm_ divides instead: within a rounding of it.
    torch::nn::utils::clip_grad_norm_(c, 1.5, norm_type);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(c[i].grad(), b[i].grad(), 1e-6, 0));
  }
}

TEST_CASE("config: optimizations.step_capture and capture_warmup_batches, and their errors") {
  const std::string base = "hyperparameters: {global_batch_size: 8}\nsearcher: {name: single, metric: loss, max_length: {batches: 4}}\n";
  const auto config = ExperimentConfig::parse(base + "optimizations: {step_capture: cuda_graph, capture_warmup_batches: 2}\n");
  const FitOptions options = FitOptions::from_config(config);
  REQUIRE(std::holds_alternative<capture::cuda_graph>(options.step_capture));
  CHECK(std::get<capture::cuda_graph>(options.step_capture).warmup_batches == 2);
  CHECK(std::holds_alternative<capture::none>(FitOptions::from_config(ExperimentConfig::parse(base)).step_capture));
  CHECK(std::holds_alternative<capture::none>(ExperimentConfig::parse(base + "optimizations: {step_capture: none}\n").step_capture));

  auto error = [&](const std::string& optimizations) {
    try {
      ExperimentConfig::parse(base + "optimizations: " + optimizations + "\n");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error("{step_capture: cudagraph}").find("step_capture is 'cudagraph'; expected none or cuda_graph") != std::string::npos);
  CHECK(error("{step_capture: cuda_graph, capture_warmup_batches: 0}").find("capture_warmup_batches is 0; a capture needs at least 1") !=
        std::string::npos);
  CHECK(error("{capture_warmup_batches: 2}").find("capture_warmup_batches is set but step_capture is not") != std::string::npos);
  CHECK(error("{step_capture: cuda_graph, capture_warmup_batches: two}").find("'capture_warmup_batches' is") != std::string::npos);
}

TEST_CASE("step_capture: cuda_graph refuses at the start, in one sentence, what it could not replay right") {
  SUBCASE("an optimizer that reads its learning rate on the host") {
    const std::string e = refusal<HostLrTrial>();
    CHECK(e.find("optimizer 0 (torch::optim::SGD) reads it on the host") != std::string::npos);
    CHECK(e.find("use dettrial::optim::FusedSGD, FusedAdam or FusedAdamW") != std::string::npos);
  }
  SUBCASE("a reducer fed in train_batch") {
    CHECK(refusal<ReducingTrial>().find("a reducer fed in train_batch ('batches_seen') would see only the captured batch") !=
          std::string::npos);
  }
  SUBCASE("gradient aggregation") {
    CHECK(refusal<FusedSgdTrial>({.aggregation_frequency = 3}).find("needs aggregation_frequency 1: with 3") != std::string::npos);
  }
  SUBCASE("everything else in order: the device (or a CPU-only LibTorch) is what stands in the way here") {
    const std::string e = refusal<FusedSgdTrial>({.device = torch::Device(torch::kCPU)});
    if (dettrial::detail::step_capture_built)
      CHECK(e == "step_capture: cuda_graph needs a CUDA device, and this trial runs on cpu; set step_capture: none");
    else CHECK(e == "step_capture: cuda_graph needs LibTorch built with CUDA, and this one is CPU-only; set step_capture: none");
  }
  SUBCASE("no warm-up batch") {
    test::Context context(test::hparams());
    Trainer<FusedSgdTrial> trainer(context);
    FitOptions o = captured(4);
    o.step_capture = capture::cuda_graph{.warmup_batches = 0};
    CHECK_THROWS_WITH_AS(trainer.fit(o), doctest::Contains("needs at least 1 warm-up batch (capture_warmup_batches is 0)"), ConfigError);
  }
}

TEST_CASE("step_capture: cuda_graph takes an fp16 gradient scaler where the optimizer kernels skip steps on the device") {
  std::optional<Context> context;
  try {
    context.emplace(test::hparams(), ContextOptions{.mixed_precision = Precision::fp16});
  } catch (const std::exception& e) {
    test::skip(std::string("fp16 needs a GPU or LibTorch 2 on the CPU: ") + e.what());
    return;
  }
  REQUIRE(context->scaler() != nullptr);
  Trainer<FusedSgdTrial> trainer(*context);
  if (DETTRIAL_FUSED_KERNELS && context->device().is_cuda())  // on a GPU the scaler is taken and the run trains
    CHECK(trainer.fit(captured(4)).batches_trained == 4);
  else if (DETTRIAL_FUSED_KERNELS)  // past the scaler, to the device: the CPU is refused as ever
    CHECK_THROWS_WITH_AS(trainer.fit(captured(4)),
                         doctest::Contains(dettrial::detail::step_capture_built ? "needs a CUDA device" : "needs LibTorch built with CUDA"),
                         ConfigError);
  else
    CHECK_THROWS_WITH_AS(trainer.fit(captured(4)), doctest::Contains("cannot replay an fp16 gradient scaler with LibTorch before 2.4"),
                         ConfigError);
}

TEST_CASE("a graph's input batch is tensors in containers, nothing it would freeze") {
  using torch::Tensor;
  static_assert(dettrial::detail::tensors_only_batch<std::tuple<Tensor, Tensor>>());
  static_assert(dettrial::detail::tensors_only_batch<std::pair<Tensor, std::vector<Tensor>>>());
  static_assert(dettrial::detail::tensors_only_batch<std::map<std::string, Tensor>>());
  static_assert(!dettrial::detail::tensors_only_batch<std::tuple<Tensor, int>>());
  static_assert(!dettrial::detail::tensors_only_batch<std::map<std::string, double>>());
  // Same structure and shapes, or not (the last, partial batch of an epoch runs eagerly).
  std::tuple<Tensor, Tensor> a{torch::zeros({8, 4}), torch::zeros({8, 1})}, b{torch::ones({8, 4}), torch::ones({8, 1})},
      partial{torch::ones({3, 4}), torch::ones({3, 1})};
  auto same_shapes = [](const Tensor& x, const Tensor& y) { return x.sizes() == y.sizes(); };
  CHECK(dettrial::detail::for_each_tensor_pair(a, b, same_shapes));
  CHECK(!dettrial::detail::for_each_tensor_pair(a, partial, same_shapes));
  std::vector<Tensor> two{torch::zeros({2})}, three{torch::zeros({2}), torch::zeros({2})};
  CHECK(!dettrial::detail::for_each_tensor_pair(two, three, same_shapes));
}

// ---- On a GPU: the capture and replay themselves (skipped, with the reason, without one) ------------

namespace {

bool cuda_or_skip() {
  if (!dettrial::detail::step_capture_built) {
    test::skip("LibTorch is CPU-only: no CUDA graph to capture");
    return false;
  }
  if (!torch::cuda::is_available()) {
    test::skip("no CUDA device");
    return false;
  }
  return true;
}

/// 60 records in batches of 8: 7 full batches and a partial one of 4 each epoch (it runs eagerly
/// beside the graph); dropout (the graph's RNG); FusedAdam and a StepLR every 3 batches (learning
/// rates changed between replays).
struct GraphTrial : FusedTrial {
  explicit GraphTrial(Context& c) : FusedTrial(c) { records = 60; }
};

/// train_batch reads a value back to the host, which a capture cannot do.
struct SyncingTrial : FusedTrial {
  using FusedTrial::FusedTrial;
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
    Metrics m = FusedTrial::train_batch(b, model, e, i);
    if (m.at("loss").tensor().item<double>() < 0) std::abort();
    return m;
  }
};

/// GraphTrial with a record of infinities: in fp16 the batches holding it have inf gradients, and
/// the scaler skips their steps (inside the graph, on the device) and backs off.
struct InfRecordTrial : GraphTrial {
  using GraphTrial::GraphTrial;
  auto build_training_data_loader() {
    auto [x, y] = test::regression_data(records);
    x[17].fill_(std::numeric_limits<float>::infinity());
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = shuffle});
  }
};

struct GraphRun {
  std::vector<torch::Tensor> parameters;
  FitResult result;
};

GraphRun graph_run(StepCapture capture, std::int64_t length, std::optional<fs::path> resume = std::nullopt) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 11, .deterministic = true});
  Trainer<GraphTrial> trainer(context);
  FitOptions o = test::quiet({.max_length = Batch(length), .checkpoint_period = Batch(10), .checkpoint_policy = CheckpointPolicy::none});
  o.step_capture = capture;
  o.latest_checkpoint = resume;
  GraphRun run;
  run.result = trainer.fit(o);
  for (const auto& p : test::parameters_of(context)) run.parameters.push_back(p.cpu());
  return run;
}

}  // namespace

TEST_CASE("GPU: a graphed run trains as the eager run, is bit-identical from run to run, and resumes exactly") {
  if (!cuda_or_skip()) return;
  const capture::cuda_graph graph{.warmup_batches = 2};
  const GraphRun eager = graph_run(capture::none{}, 30);
  const GraphRun graphed = graph_run(graph, 30);
  const GraphRun again = graph_run(graph, 30);
  REQUIRE(graphed.result.batches_trained == 30);
  // The replay launches the kernels the eager step launched, on the same data and RNG offsets.
  for (std::size_t i = 0; i < eager.parameters.size(); ++i) CHECK(torch::allclose(eager.parameters[i], graphed.parameters[i], 1e-5, 1e-6));
  MESSAGE("graphed and eager parameters bit-identical: " << test::bit_identical(eager.parameters, graphed.parameters));
  CHECK(test::bit_identical(graphed.parameters, again.parameters));
  CHECK(graphed.result.last_training_metrics.at("loss") == again.result.last_training_metrics.at("loss"));

  // Ended at batch 20 with its checkpoint, resumed to 30: warm-up and capture again, then the same
  // replays. (Not a stop asked for in train_batch: a replay runs no host code, so such a request
  // would be made only while warming up or capturing.)
  const GraphRun first = graph_run(graph, 20);
  REQUIRE(first.result.batches_trained == 20);
  const GraphRun resumed = graph_run(graph, 30, first.result.output_dir);
  CHECK(resumed.result.resumed_from_batch == 20);
  CHECK(test::bit_identical(graphed.parameters, resumed.parameters));
}

TEST_CASE("GPU: fp16 with a captured step skips the eager run's steps and keeps its scale") {
  if (!cuda_or_skip()) return;
  if (!DETTRIAL_FUSED_KERNELS) {
    test::skip("an fp16 scaler under capture needs LibTorch 2.4 or later");
    return;
  }
  struct Fp16Run {
    std::vector<torch::Tensor> parameters;
    double scale = 0;
    std::int64_t skipped = 0;
  };
  const auto run = [](StepCapture capture) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 11, .deterministic = true, .mixed_precision = Precision::fp16});
    Trainer<InfRecordTrial> trainer(context);
    FitOptions o = test::quiet({.max_length = Batch(30)});
    o.step_capture = capture;
    trainer.fit(o);
    Fp16Run r{.scale = context.scaler()->get_scale(), .skipped = context.scaler()->skipped_steps()};
    for (const auto& p : test::parameters_of(context)) r.parameters.push_back(p.cpu());
    return r;
  };
  const Fp16Run eager = run(capture::none{});
  const Fp16Run graphed = run(capture::cuda_graph{.warmup_batches = 2});
  CHECK(eager.skipped >= 3);  // the inf record's batch in each of the 3 whole epochs of 8 batches (and maybe the 4th's)
  CHECK(graphed.skipped == eager.skipped);
  CHECK(graphed.scale == eager.scale);
  for (std::size_t i = 0; i < eager.parameters.size(); ++i) {
    CHECK(torch::isfinite(graphed.parameters[i]).all().item<bool>());
    CHECK(torch::allclose(eager.parameters[i], graphed.parameters[i], 1e-3, 1e-4));
  }
}

TEST_CASE("GPU: a train_batch that waits for the device cannot be captured, and the error says why") {
  if (!cuda_or_skip()) return;
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 11});
  Trainer<SyncingTrial> trainer(context);
  CHECK_THROWS_WITH_AS(trainer.fit(captured(8)), doctest::Contains("could not capture the training step"), TrialError);
}

TEST_CASE("TensorDataset::to: batches are gathered where the data is, the same records in the same order as on the CPU") {
  // LibTorch's lazy (TorchScript) device stands in for a GPU: not the CPU, but its data can be read.
  const torch::Device elsewhere = test::lazy_device();
  const torch::Tensor x = torch::arange(0, 20 * 3, torch::kFloat).reshape({20, 3}), y = torch::arange(0, 20, torch::kLong);
  const TensorDataset<2> on_cpu(x, y);
  const TensorDataset<2> moved = on_cpu.to(elsewhere);
  CHECK(moved.device() == elsewhere);
  const DataLoaderOptions options{.batch_size = 6, .shuffle = true, .seed = 3};
  DataLoader cpu_loader(on_cpu, options), device_loader(moved, options);
  auto a = cpu_loader.batches(LoaderChain{});
  auto b = device_loader.batches(LoaderChain{});
  std::vector<std::int64_t> sizes;
  auto ib = b.begin();
  for (auto ia = a.begin(); ia != a.end(); ++ia, ++ib) {
    REQUIRE(ib != b.end());
    const auto& [cx, cy] = *ia;
    const auto& [dx, dy] = *ib;
    CHECK(dx.device() == elsewhere);
    CHECK(torch::equal(dx.cpu(), cx));
    CHECK(torch::equal(dy.cpu(), cy));
    sizes.push_back(cx.size(0));
  }
  CHECK(ib == b.end());
  CHECK(sizes == std::vector<std::int64_t>{6, 6, 6, 2});
}

TEST_CASE("CopyAhead: batches reach the device in the stream's order, read at most one ahead") {
  // LibTorch's lazy device stands in for a GPU again; on a CUDA device the copy runs on a side stream.
  const torch::Device elsewhere = test::lazy_device();
  std::vector<std::tuple<torch::Tensor, torch::Tensor>> stream;
  for (int i = 0; i < 5; ++i) stream.emplace_back(torch::full({3, 2}, i, torch::kFloat), torch::full({3}, 10 + i, torch::kLong));
  std::ptrdiff_t reads = 0;
  dettrial::detail::CopyAhead batches(stream | std::views::transform([&](auto& b) {
                                        ++reads;
                                        return std::move(b);
                                      }),
                                      elsewhere);
  const auto read = [&] { return reads; };

  CHECK(read() == 0);  // nothing is read before it is asked for
  auto first = batches.take();
  CHECK(read() == 1);
  CHECK(std::get<0>(first).device() == elsewhere);
  CHECK(torch::equal(std::get<0>(first).cpu(), torch::full({3, 2}, 0, torch::kFloat)));
  CHECK(torch::equal(std::get<1>(first).cpu(), torch::full({3}, 10, torch::kLong)));
  CHECK_FALSE(std::get<0>(stream[0]).defined());  // taken from the stream, not copied

  batches.stage();
  batches.stage();  // one batch at most is staged
  CHECK(read() == 2);
  std::vector<float> seen{std::get<0>(first)[0][0].cpu().item<float>()};
  while (batches.has_next()) {
    auto b = batches.take();
    CHECK(std::get<1>(b).device() == elsewhere);
    seen.push_back(std::get<0>(b)[0][0].cpu().item<float>());
    batches.stage();
    CHECK(read() <= static_cast<std::ptrdiff_t>(seen.size()) + 1);
  }
  CHECK(seen == std::vector<float>{0, 1, 2, 3, 4});
  batches.stage();  // nothing left: no read past the end
  CHECK(read() == 5);
  CHECK_THROWS_AS(batches.take(), std::logic_error);
}
