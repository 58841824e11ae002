// Mixed precision: the gradient scaler's PyTorch semantics (scale, unscale, skipped steps, growth and
// backoff, state dict), bf16 autocast around the trial's hooks, and exact resume with a scaler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "test_trials.hpp"
#include "applied_context.hpp"

using namespace dettrial;

namespace {

/// The imperative regression trial with a scaler of its own (fp32 forward: the scaler alone is under
/// test, the same on every LibTorch), a loss made inf on batch `inf_at`, and a record of the dtypes
/// its forward passes produced.
struct ScaledRegression : test::ImperativeRegression {
  GradScaler scaler{GradScaler::Options{.growth_interval = 3}};
  std::int64_t inf_at = -1;
  torch::ScalarType forward_dtype = torch::kFloat, validation_dtype = torch::kFloat;
  explicit ScaledRegression(Context& c) : test::ImperativeRegression(c) {
    if (c.get_hparams().get_or<bool>("wrap_scaler", true)) c.wrap_scaler(scaler);
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t batch_idx) {
    auto& [x, y] = b;
    const torch::Tensor out = model->forward(x);
    forward_dtype = out.scalar_type();
    torch::Tensor loss = torch::mse_loss(out.to(torch::kFloat), y);
    if (batch_idx == inf_at) loss = loss * std::numeric_limits<float>::infinity();
    context.backward(loss);
    context.step_optimizer(opt, clip::by_norm{10.0});
    return {{"loss", loss.detach()}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    const torch::Tensor out = model->forward(x);
    validation_dtype = out.scalar_type();
    return {{"validation_loss", torch::mse_loss(out.to(torch::kFloat), y)}};
  }
};

/// `state` with another scale.
c10::impl::GenericDict rescaled_state(const c10::impl::GenericDict& state, double scale) {
  c10::impl::GenericDict out = state.copy();
  out.insert_or_assign("scale", scale);
  return out;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("GradScaler: PyTorch's scale, unscale, skipped step, backoff and growth, and state dict") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  GradScaler scaler(GradScaler::Options{.init_scale = 1024, .growth_interval = 2});
  const torch::Tensor x = torch::ones({2, 3});
  const auto params = model->parameters();

  // A clean step: the unscaled gradient is the true one, the step is taken.
  torch::Tensor loss = model->forward(x).sum();
  CHECK(scaler.scale(loss).item<double>() == doctest::Approx(loss.item<double>() * 1024));
  scaler.scale(loss).backward();
  scaler.unscale(params);
  CHECK(torch::allclose(params[0].grad(), torch::full({1, 3}, 2.0f)));  // d(sum)/dw = 2 per weight
  const torch::Tensor before = params[0].detach().clone();
  CHECK(scaler.step(sgd, params));
  CHECK_FALSE(torch::equal(before, params[0]));
  scaler.update();
  CHECK(scaler.get_scale() == 1024);
  CHECK(scaler.growth_tracker() == 1);

  // An inf gradient: the step is skipped, the scale backs off, the count restarts.
  sgd.zero_grad();
  scaler.scale(model->forward(x).sum() * std::numeric_limits<float>::infinity()).backward();
  const torch::Tensor kept = params[0].detach().clone();
  CHECK_FALSE(scaler.step(sgd, params));
  CHECK(torch::equal(kept, params[0]));
  scaler.update();
  CHECK(scaler.get_scale() == 512);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 1);

  // Two clean steps (growth_interval) double it.
  for (int i = 0; i < 2; ++i) {
    sgd.zero_grad();
    scaler.scale(model->forward(x).sum()).backward();
    scaler.step(sgd, params);
    scaler.update();
  }
  CHECK(scaler.get_scale() == 1024);
  CHECK(scaler.growth_tracker() == 0);
  scaler.update();  // no step since the last update: nothing happens
  CHECK(scaler.growth_tracker() == 0);

  // Python's layout, and back.
  const auto state = scaler.state_dict();
  CHECK(state.at("scale").toDouble() == 1024);
  CHECK(state.at("growth_factor").toDouble() == 2);
  CHECK(state.at("backoff_factor").toDouble() == 0.5);
  CHECK(state.at("growth_interval").toInt() == 2);
  CHECK(state.at("_growth_tracker").toInt() == 0);
  GradScaler restored;
  restored.load_state_dict(state);
  CHECK(restored.get_scale() == 1024);
  GradScaler copy = restored;  // its own state, not a view of the original's
  restored.load_state_dict(rescaled_state(state, 8.0));
  CHECK(restored.get_scale() == 8);
  CHECK(copy.get_scale() == 1024);
  c10::impl::GenericDict partial(c10::StringType::get(), c10::AnyType::get());
  partial.insert("scale", 8.0);
  CHECK_THROWS_WITH_AS(restored.load_state_dict(partial), doctest::Contains("lacks a number 'growth_factor'"), CheckpointError);
  CHECK_THROWS_WITH_AS(GradScaler(GradScaler::Options{.backoff_factor = 2}), doctest::Contains("backoff_factor must be in (0, 1)"),
                       ConfigError);
}

TEST_CASE("GradScaler: an inf in one optimizer's gradients backs the scale off though another's were clean, fp16 losses scale in fp32") {
  torch::nn::Linear a(2, 1), b(2, 1);
  torch::optim::SGD sa(a->parameters(), 0.1), sb(b->parameters(), 0.1);
  GradScaler scaler(GradScaler::Options{.init_scale = 8, .growth_interval = 1});
  const torch::Tensor x = torch::ones({1, 2});
  (scaler.scale(a->forward(x).sum() * std::numeric_limits<float>::infinity()) + scaler.scale(b->forward(x).sum())).backward();
  CHECK_FALSE(scaler.step(sa, a->parameters()));
  CHECK(scaler.step(sb, b->parameters()));
  scaler.update();
  CHECK(scaler.get_scale() == 4);  // backed off, not grown
  GradScaler big;
  const torch::Tensor half_loss = torch::full({}, 2.0, torch::kHalf);
  CHECK(big.scale(half_loss).item<double>() == 131072.0);  // fp16 would overflow at 65504
}

TEST_CASE("a wrapped scaler: backward scales, step_optimizer unscales and clips, the run equals one without it") {
  // Powers of two scale exactly: with no inf, the scaled run is bit-identical to the plain one.
  test::Context plain_context(test::hparams("wrap_scaler: false\n"), ContextOptions{.trial_seed = 4});
  Trainer<ScaledRegression> plain(plain_context);
  plain.fit(test::quiet({.max_length = Batch(12)}));
  test::Context scaled_context(test::hparams(), ContextOptions{.trial_seed = 4});
  Trainer<ScaledRegression> scaled(scaled_context);
  scaled.fit(test::quiet({.max_length = Batch(12)}));
  const auto a = test::parameters_of(plain_context), b = test::parameters_of(scaled_context);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  CHECK(scaled.trial().scaler.get_scale() == 65536 * 2 * 2 * 2 * 2);  // grown every 3 clean update batches
  CHECK_THROWS_WITH_AS(scaled.trial().scaler.scale(torch::ones({})), doctest::Contains("context.backward scales the loss itself"),
                       TrialError);
  CHECK_THROWS_WITH_AS(scaled_context.wrap_scaler(scaled.trial().scaler), doctest::Contains("wrap_scaler was called twice"), TrialError);
}

TEST_CASE("an inf loss skips that optimizer step and backs the scale off, training goes on") {
  const auto run = [](std::int64_t length, std::vector<torch::Tensor>& params, double& scale, std::int64_t& skipped) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
    Trainer<ScaledRegression> trainer(context);
    trainer.trial().inf_at = 4;
    const FitResult r = trainer.fit(test::quiet({.max_length = Batch(length)}));
    params = copies(test::parameters_of(context));
    scale = trainer.trial().scaler.get_scale();
    skipped = trainer.trial().scaler.skipped_steps();
    return r;
  };
  std::vector<torch::Tensor> before, after, later;
  double scale_before = 0, scale_after = 0, scale_later = 0;
  std::int64_t skipped = 0;
  run(4, before, scale_before, skipped);  // up to the inf batch
  CHECK(skipped == 0);
  run(5, after, scale_after, skipped);                                                       // through it
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));  // batch 4's step was skipped
  CHECK(skipped == 1);
  CHECK(scale_after == scale_before / 2);
  const FitResult r = run(9, later, scale_later, skipped);  // and on
  CHECK(skipped == 1);
  CHECK(std::isfinite(r.last_validation_metrics.at("validation_loss")));
  CHECK_FALSE(torch::equal(after[0], later[0]));
}

TEST_CASE("bf16 autocast runs the trial's forward passes in bf16, backward outside, the loss stays close to fp32") {
  const auto final_loss = [](std::optional<Precision> precision, torch::ScalarType& forward, torch::ScalarType& validation) {
    // On the CPU: the GPU's bf16 is bench/gpu's and the GPU: cases' (on a GPU machine the default
    // device trains there, in another arithmetic, and this tolerance is the CPU's).
    test::Context context(test::hparams("wrap_scaler: false\n"),
                          ContextOptions{.trial_seed = 6, .device = torch::Device(torch::kCPU), .mixed_precision = precision});
    Trainer<ScaledRegression> trainer(context);
    const FitResult r = trainer.fit(test::quiet({.max_length = Batch(40)}));
    forward = trainer.trial().forward_dtype;
    validation = trainer.trial().validation_dtype;
    return r.last_validation_metrics.at("validation_loss");
  };
  torch::ScalarType forward{}, validation{};
  const double fp32 = final_loss(std::nullopt, forward, validation);
  CHECK((forward == torch::kFloat));
  const double bf16 = final_loss(Precision::bf16, forward, validation);
  CHECK((forward == torch::kBFloat16));
  CHECK((validation == torch::kBFloat16));
  CHECK(bf16 == doctest::Approx(fp32).epsilon(0.05));
  CHECK(bf16 != fp32);  // it did run in another precision
  // Autocast is off again outside the trainer.
  CHECK((torch::nn::Linear(2, 2)->forward(torch::ones({1, 2})).scalar_type() == torch::kFloat));
}

TEST_CASE("stopping and resuming with a scaler is exact: parameters, scale and growth count") {
  const auto options = [](std::int64_t length) { return test::quiet({.max_length = Batch(length), .checkpoint_period = Batch(4)}); };
  test::Context straight_context(test::hparams(), ContextOptions{.trial_seed = 8});
  Trainer<ScaledRegression> straight(straight_context);
  straight.trial().inf_at = 2;
  straight.fit(options(11));

  test::Context first_context(test::hparams(), ContextOptions{.trial_seed = 8});
  Trainer<ScaledRegression> first(first_context);
  first.trial().inf_at = 2;
  const FitResult stopped = first.fit(options(5));
  const StateDict saved = dettrial::detail::read_state_dict_file(stopped.checkpoints.back().path);
  REQUIRE(saved.contains("scaler_state_dict"));
  CHECK(saved.at("scaler_state_dict").toGenericDict().at("_growth_tracker").toInt() == first.trial().scaler.growth_tracker());

  test::Context second_context(test::hparams(), ContextOptions{.trial_seed = 77});
  Trainer<ScaledRegression> second(second_context);
  second.trial().inf_at = 2;
  FitOptions resume = options(11);
  resume.latest_checkpoint = stopped.output_dir;
  second.fit(resume);
  CHECK(second.trial().scaler.get_scale() == straight.trial().scaler.get_scale());
  CHECK(second.trial().scaler.growth_tracker() == straight.trial().scaler.growth_tracker());
  const auto a = test::parameters_of(straight_context), b = test::parameters_of(second_context);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
}

TEST_CASE("optimizations.mixed_precision: O0, O1, bf16, fp16 read, Apex's O2 refused with the reason") {
  CHECK(ExperimentConfig::parse("optimizations: {mixed_precision: bf16}\n").mixed_precision == Precision::bf16);
  CHECK(ExperimentConfig::parse("optimizations: {mixed_precision: O1}\n").mixed_precision == Precision::fp16);
  CHECK(ExperimentConfig::parse("optimizations: {mixed_precision: O0}\n").mixed_precision == Precision::fp32);
  CHECK(ExperimentConfig::parse("{}\n").mixed_precision == Precision::fp32);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("optimizations: {mixed_precision: O2}\n", "mp.yaml"),
                       doctest::Contains("mp.yaml:1:34: optimizations.mixed_precision 'O2' is Apex's fp16 master weights"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("optimizations: {mixed_precision: half}\n", "mp.yaml"),
                       doctest::Contains("expected O0 (off), fp16 (or O1) or bf16"), ConfigError);
  test::Context bf16(ExperimentConfig::parse("optimizations: {mixed_precision: bf16}\n"));
  CHECK(bf16.precision() == Precision::bf16);
  CHECK(bf16.scaler() == nullptr);  // bf16 needs no loss scaling
}

TEST_CASE("GradScaler with FusedAdam: the skip is decided on the device, with the host-decided run's scale, steps and weights") {
  // Two scalers side by side: FusedAdam (LibTorch 2.4+: the fused kernel skips on the flag, no read of
  // the device) and LibTorch's Adam (the host reads the flag). Batches 0, 3 and 4 have an inf loss:
  // a skipped first step must leave Adam's state as if it had not run.
  const std::vector<int> inf_batches{0, 3, 4};
  torch::manual_seed(21);
  torch::nn::Linear fused_model(3, 2), host_model(3, 2);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < fused_model->parameters().size(); ++i) host_model->parameters()[i].copy_(fused_model->parameters()[i]);
  }
  optim::FusedAdam fused(fused_model->parameters(), torch::optim::AdamOptions(0.05).weight_decay(1e-3));
  torch::optim::Adam host(host_model->parameters(), torch::optim::AdamOptions(0.05).weight_decay(1e-3));
  const GradScaler::Options options{.init_scale = 1024, .growth_interval = 2};
  GradScaler fused_scaler(options), host_scaler(options);
  for (int b = 0; b < 9; ++b) {
    const torch::Tensor x = torch::randn({4, 3}), y = torch::randn({4, 2});
    const bool inf = std::find(inf_batches.begin(), inf_batches.end(), b) != inf_batches.end();
    const auto train = [&](torch::nn::Linear& model, torch::optim::Optimizer& optimizer, GradScaler& scaler) {
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(model->forward(x), y);
      if (inf) loss = loss * std::numeric_limits<float>::infinity();
      scaler.scale(loss).backward();
      const bool issued = scaler.step(optimizer, model->parameters());
      scaler.update();
      return issued;
    };
    train(fused_model, fused, fused_scaler);
    CHECK(train(host_model, host, host_scaler) == !inf);  // the host knows
    CHECK(fused_scaler.get_scale() == host_scaler.get_scale());
    CHECK(fused_scaler.growth_tracker() == host_scaler.growth_tracker());
  }
  CHECK(fused_scaler.skipped_steps() == 3);
  CHECK(host_scaler.skipped_steps() == 3);
  CHECK(fused_scaler.get_scale() == 1024);  // three back-offs (batches 0, 3, 4), three growths (after 2, 6, 8)
  fused.pull_host_state();
  for (std::size_t i = 0; i < host_model->parameters().size(); ++i) {
    const torch::Tensor p = host_model->parameters()[i], q = fused_model->parameters()[i];
    CHECK(torch::allclose(q, p, 0, 2e-6));
    const auto key = dettrial::detail::optimizer_state_key<std::decay_t<decltype(host.state())>>(p);
    const auto fused_key = dettrial::detail::optimizer_state_key<std::decay_t<decltype(fused.state())>>(q);
    CHECK(static_cast<torch::optim::AdamParamState&>(*fused.state().at(fused_key)).step() ==
          static_cast<torch::optim::AdamParamState&>(*host.state().at(key)).step());
  }
  CHECK(static_cast<torch::optim::AdamParamState&>(*host.state().begin()->second).step() == 6);

  // The optimizer's side of it: with the kernels it steps on a clean flag, holds on a set one, and
  // says it decided; older LibTorch says it cannot, and leaves the decision to the host.
  fused.zero_grad();
  torch::mse_loss(fused_model->forward(torch::ones({1, 3})), torch::zeros({1, 2})).backward();
  const torch::Tensor before = fused_model->weight.detach().clone();
  const bool decided = fused.step_unless_found_inf(torch::ones({}));
  CHECK(decided == bool(DETTRIAL_FUSED_KERNELS));
  CHECK(torch::equal(before, fused_model->weight));
  if (decided) {
    CHECK(fused.step_unless_found_inf(torch::zeros({})));
    CHECK_FALSE(torch::equal(before, fused_model->weight));
  }
}
