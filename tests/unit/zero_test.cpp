// ZeRO stage 1 (sharded optimizer state) on Gloo: the same training as unsharded data parallel, bit
// for bit, for LibTorch's optimizers and the fused ones, with aggregation, clipping by the global
// norm and a gradient scaler; checkpoints whole, resumed on the same and on another rank count;
// and the refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "applied_context.hpp"
#include "ranks.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

/// Five models, each with its own optimizer: SGD with Nesterov momentum and weight decay in two
/// groups of other learning rates, Adam with amsgrad, AdamW, and the fused SGD and AdamW; layer
/// sizes that divide by no rank count, so shards cut parameters apart at odd places (but AdamW's).
struct ZeroTrial {
  Context& context;
  torch::nn::Sequential a, b, c, d, e;
  torch::optim::SGD sgd;
  torch::optim::Adam adam;
  torch::optim::AdamW adamw;
  optim::FusedSGD fused;
  optim::FusedAdamW fused_adamw;
  GradScaler scaler{GradScaler::Options{.init_scale = 256, .growth_interval = 4}};

  static torch::nn::Sequential model(std::int64_t hidden) {
    return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 1));
  }
  /// AdamW's with DETTRIAL_WIDE: a 2604 x 2604 layer (27 MB) is a gradient bucket of its own whose
  /// elements divide by 2 and 3 ranks, which ZeRO all-gathers straight into the parameter.
  static torch::nn::Sequential wide_model() {
    return torch::nn::Sequential(torch::nn::Linear(4, 2604), torch::nn::Tanh(), torch::nn::Linear(2604, 2604), torch::nn::Tanh(),
                                 torch::nn::Linear(2604, 1));
  }
  static std::vector<torch::optim::OptimizerParamGroup> two_groups(torch::nn::Sequential& m) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(m[0]->parameters(), std::make_unique<torch::optim::SGDOptions>(
                                                torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3)));
    groups.emplace_back(m[2]->parameters(), std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.02).momentum(0.5)));
    return groups;
  }

  explicit ZeroTrial(Context& ctx)
      : context(ctx),
        a(ctx.wrap_model(model(13))),
        b(ctx.wrap_model(model(7))),
        c(ctx.wrap_model(std::getenv("DETTRIAL_WIDE") ? wide_model() : model(11))),
        d(ctx.wrap_model(model(5))),
        e(ctx.wrap_model(model(9))),
        sgd(two_groups(a), torch::optim::SGDOptions(0.05)),
        adam(b->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true).weight_decay(1e-4)),
        adamw(c->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05)),
        fused(d->parameters(), torch::optim::SGDOptions(0.03).momentum(0.9)),
        fused_adamw(e->parameters(), torch::optim::AdamWOptions(0.02).weight_decay(0.01)) {
    for (torch::optim::Optimizer* o : std::vector<torch::optim::Optimizer*>{&sgd, &adam, &adamw, &fused, &fused_adamw})
      context.wrap_optimizer(*o);
    context.wrap_scaler(scaler);
  }
  auto build_training_data_loader() {
    auto [x, y] = test::regression_data(203);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = test::regression_data(50);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size()});
  }
  Metrics train_batch(test::Batch& batch, std::int64_t, std::int64_t batch_idx) {
    auto& [x, y] = batch;
    torch::Tensor loss = torch::mse_loss(a->forward(x), y) + torch::mse_loss(b->forward(x), y) + torch::mse_loss(c->forward(x), y) +
                         torch::mse_loss(d->forward(x), y) + torch::mse_loss(e->forward(x), y);
    // An inf on one rank only: the scaler must skip the step on every rank, sharded or not.
    if (const char* inf_at = std::getenv("DETTRIAL_INF_AT"); inf_at && batch_idx == std::atoll(inf_at) && context.distributed().rank == 1)
      loss = loss * std::numeric_limits<float>::infinity();
    context.backward(loss);
    context.step_optimizer(sgd, clip::by_norm{0.5});  // the global norm: every rank clips alike
    context.step_optimizer(adam);
    context.step_optimizer(adamw, clip::by_value{0.2});
    context.step_optimizer(fused);
    context.step_optimizer(fused_adamw);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& batch) {
    auto& [x, y] = batch;
    return {{"validation_loss", torch::mse_loss(a->forward(x), y) + torch::mse_loss(b->forward(x), y)}};
  }
};

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// A job of `ranks` ranks training ZeroTrial into `dir`/run: `zero` 0 or 1, to `length` batches,
/// resumed from `resume` when given, `wide` with AdamW's wide layer. Requires every rank to succeed.
void run_job(const fs::path& dir, int ranks, int zero, std::int64_t length, const fs::path& resume = {}, bool wide = false) {
  fs::create_directories(dir);
  std::vector<std::string> env = {"DETTRIAL_ZERO=" + std::to_string(zero), "DETTRIAL_LENGTH=" + std::to_string(length),
                                  "DETTRIAL_INF_AT=7"};
  if (wide) env.emplace_back("DETTRIAL_WIDE=1");
  if (!resume.empty()) env.push_back("DETTRIAL_RESUME=" + resume.string());
  test::run_ranks("child process: a ZeRO rank", ranks, dir, env);
}

/// The last checkpoint a job's chief wrote.
fs::path last_checkpoint(const fs::path& dir) { return test::read_text(dir / "last_checkpoint"); }

/// Every tensor (and number) of two state dicts, compared bit for bit, or within `tolerance` (the
/// largest difference kept in `largest`), with where they differ.
void check_same_state(const c10::IValue& x, const c10::IValue& y, const std::string& where, double tolerance, double& largest) {
  CAPTURE(where);
  if (x.isTensor()) {
    REQUIRE(y.isTensor());
    REQUIRE(x.toTensor().sizes() == y.toTensor().sizes());
    if (tolerance == 0) CHECK(torch::equal(x.toTensor(), y.toTensor()));
    else if (x.toTensor().is_floating_point()) {
      const double difference = (x.toTensor() - y.toTensor()).abs().max().item<double>();
      largest = std::max(largest, difference);
      CHECK(difference <= tolerance);
    } else CHECK(torch::equal(x.toTensor(), y.toTensor()));
  } else if (x.isGenericDict()) {
    REQUIRE(y.isGenericDict());
    CHECK(x.toGenericDict().size() == y.toGenericDict().size());
    for (const auto& e : x.toGenericDict()) {
      const auto other = y.toGenericDict().find(e.key());
      REQUIRE(other != y.toGenericDict().end());
      check_same_state(e.value(), other->value(),
                       where + "/" + (e.key().isString() ? e.key().toStringRef() : std::to_string(e.key().toInt())), tolerance, largest);
    }
  } else if (x.isList()) {
    REQUIRE(y.isList());
    REQUIRE(x.toList().size() == y.toList().size());
    for (std::size_t i = 0; i < x.toList().size(); ++i)
      check_same_state(x.toList().get(i), y.toList().get(i), where + "[" + std::to_string(i) + "]", tolerance, largest);
  } else {
    CHECK(x == y);
  }
}

/// Two runs' last checkpoints: the same models, optimizer states (whole, in Python's layout) and
/// scaler, bit for bit; but for FusedAdamW's model and state (the last) on the CPU, within 1e-6:
/// LibTorch's CPU kernel computes the elements short of a vector at a tensor's end by another
/// rounding than the rest, and ZeRO's pieces end where the parameters do not.
void check_same_training(const fs::path& x, const fs::path& y) {
  const StateDict a = dettrial::detail::read_state_dict_file(last_checkpoint(x)),
                  b = dettrial::detail::read_state_dict_file(last_checkpoint(y));
  double largest = 0;
  check_same_state(a.at("scaler_state_dict"), b.at("scaler_state_dict"), "scaler_state_dict", 0, largest);
  for (const char* part : {"models_state_dict", "optimizers_state_dict"}) {
    const auto xs = a.at(part).toList(), ys = b.at(part).toList();
    REQUIRE(xs.size() == 5);
    REQUIRE(ys.size() == 5);
    for (std::size_t i = 0; i < 5; ++i)
      check_same_state(xs.get(i), ys.get(i), std::string(part) + "[" + std::to_string(i) + "]", i == 4 ? 1e-6 : 0.0, largest);
  }
  MESSAGE("FusedAdamW's largest difference: " << largest);
}

}  // namespace

TEST_CASE("child process: a ZeRO rank" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  ContextOptions options{.trial_seed = 23, .communicator = Communicator::create(env, std::chrono::seconds(60), backend::gloo{})};
  options.aggregation_frequency = 2;
  test::Context context(Hyperparameters::parse("global_batch_size: 24\n"), std::move(options));
  Trainer<ZeroTrial> trainer(context);
  FitOptions o{.max_length = Batch(std::atoll(env_or("DETTRIAL_LENGTH", "30"))),
               .validation_period = Batch(10),
               .checkpoint_period = Batch(12),
               .reporting_period = Batch(10)};
  o.output_dir = dir / "run";
  o.report.quiet = true;
  o.checkpoint_policy = CheckpointPolicy::none;
  o.zero_stage = std::string(env_or("DETTRIAL_ZERO", "0")) == "1" ? ZeroStage::optimizer_state : ZeroStage::off;
  if (const char* resume = std::getenv("DETTRIAL_RESUME")) o.latest_checkpoint = resume;
  const FitResult r = trainer.fit(o);
  if (env.rank == 0) std::ofstream(dir / "last_checkpoint") << r.checkpoints.back().path.string();
  // Each rank keeps the state of its share alone: Adam's exp_avg over at most 1/N of b's elements (rounded up), unsharded all.
  std::int64_t kept = 0, all = 0;
  for (const auto& [key, state] : trainer.trial().adam.state())
    kept += static_cast<torch::optim::AdamParamState&>(*state).exp_avg().numel();
  for (const auto& p : trainer.trial().b->parameters()) all += p.numel();
  if (o.zero_stage == ZeroStage::optimizer_state) CHECK(kept <= (all + env.size - 1) / env.size);
  else CHECK(kept == all);
  // The scaler skipped the update with the inf on every rank, and that one only (each of the five optimizers' steps).
  if (std::getenv("DETTRIAL_RESUME") == nullptr) CHECK(context.scaler()->skipped_steps() == 5);
}

// No semicolon in a test's name: CTest's list would cut it there.
TEST_CASE(
    "ZeRO-1 on 2 and 3 ranks trains bit for bit as unsharded data parallel (SGD, Adam, AdamW, FusedSGD and FusedAdamW "
    "with aggregation, clipping and an inf skipped on every rank), and writes the same whole optimizer state" *
    doctest::timeout(300)) {
  if (test::skip_without_gloo()) return;
  for (const int ranks : {2, 3}) {
    CAPTURE(ranks);
    const fs::path root = test::quiet({}).output_dir;
    run_job(root / "unsharded", ranks, 0, 30, {}, /*wide=*/ranks == 2);
    run_job(root / "zero", ranks, 1, 30, {}, /*wide=*/ranks == 2);
    check_same_training(root / "unsharded", root / "zero");
    // The optimizers' state is whole in the file: the first parameter's exp_avg has its shape.
    const StateDict state = dettrial::detail::read_state_dict_file(last_checkpoint(root / "zero"));
    const auto adam = state.at("optimizers_state_dict").toList().get(1).toGenericDict().at("state").toGenericDict();
    CHECK(adam.at(0).toGenericDict().at("exp_avg").toTensor().sizes() == c10::IntArrayRef{7, 4});
  }
}

TEST_CASE("ZeRO-1: a checkpoint resumed on the same rank count, and on another (elastic), continues exactly" * doctest::timeout(300)) {
  if (test::skip_without_gloo()) return;
  const fs::path root = test::quiet({}).output_dir;
  run_job(root / "straight", 2, 1, 30);
  run_job(root / "split", 2, 1, 12);
  run_job(root / "split", 2, 1, 30, root / "split" / "run");
  check_same_training(root / "straight", root / "split");
  // 2 ranks to 3: the same as an unsharded run resumed from 2 ranks to 3.
  run_job(root / "zero_2", 2, 1, 12);
  run_job(root / "zero_2", 3, 1, 30, root / "zero_2" / "run");
  run_job(root / "plain_2", 2, 0, 12);
  run_job(root / "plain_2", 3, 0, 30, root / "plain_2" / "run");
  check_same_training(root / "plain_2", root / "zero_2");
}

namespace {
/// One layer stepped by Muon or SGD: what a fit refuses ZeRO for.
struct RefusedTrial {
  Context& context;
  torch::nn::Linear layer{4, 1};
  optim::Muon muon{{layer->weight}, optim::MuonOptions(0.02)};
  torch::optim::SGD sgd{layer->parameters(), torch::optim::SGDOptions(0.1)};
  bool with_muon;
  explicit RefusedTrial(Context& ctx) : context(ctx), with_muon(ctx.get_hparam<bool>("muon")) {
    context.wrap_model(layer);
    if (with_muon) context.wrap_optimizer(muon);
    else context.wrap_optimizer(sgd);
  }
  auto build_training_data_loader() {
    auto [x, y] = test::regression_data(12);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size()});
  }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  Metrics train_batch(test::Batch& batch, std::int64_t, std::int64_t) {
    auto& [x, y] = batch;
    torch::Tensor loss = torch::mse_loss(layer->forward(x), y);
    context.backward(loss);
    context.step_optimizer(with_muon ? static_cast<torch::optim::Optimizer&>(muon) : sgd);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& batch) {
    auto& [x, y] = batch;
    return {{"validation_loss", torch::mse_loss(layer->forward(x), y)}};
  }
};
}  // namespace

TEST_CASE("ZeRO-1 is refused in one sentence where it cannot apply: one rank, rank_invariant, Muon") {
  // What a fit with zero_stage `stage` says, when it refuses: the refusal comes when the fit starts,
  // before a batch is trained.
  const auto refusal = [&](ContextOptions options, bool muon, ZeroStage stage = ZeroStage::optimizer_state) {
    test::Context context(test::hparams(muon ? "muon: true\n" : "muon: false\n"), std::move(options));
    Trainer<RefusedTrial> trainer(context);
    FitOptions o = test::quiet({.max_length = Batch(2)});
    o.zero_stage = stage;
    try {
      const FitResult r = trainer.fit(o);
      return std::string("(not refused: ") + std::to_string(r.batches_trained) + " batches)";
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
  };
  CHECK(refusal({}, false).find("this run has one rank: start 2 or more") != std::string::npos);
  CHECK(refusal({.rank_invariant = true}, false).find("reproducibility.rank_invariant do not go together") != std::string::npos);
  const std::string muon = refusal({}, true);
  CHECK(muon.find("cannot shard optimizer 0 (") != std::string::npos);
  CHECK(muon.find("): Muon updates each parameter whole, not element by element") != std::string::npos);
  // Off: nothing refused, the fit trains.
  CHECK(refusal({}, false, ZeroStage::off) == "(not refused: 2 batches)");
}

TEST_CASE("ZeRO-1 in the experiment config: optimizations.zero_stage 1, and 2, 3 or another value refused naming it") {
  CHECK(ExperimentConfig::parse("optimizations:\n  zero_stage: 1\n").zero_stage == ZeroStage::optimizer_state);
  CHECK(ExperimentConfig::parse("optimizations:\n  zero_stage: 0\n").zero_stage == ZeroStage::off);
  CHECK(FitOptions::from_config(ExperimentConfig::parse("optimizations:\n  zero_stage: 1\n")).zero_stage == ZeroStage::optimizer_state);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("optimizations:\n  zero_stage: 2\n"),
                       doctest::Contains("optimizations.zero_stage 2 (sharded gradients) is not in dettrial yet"), ConfigError);
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("optimizations:\n  zero_stage: 5\n"),
                       doctest::Contains("zero_stage must be 0 (off) or 1 (sharded optimizer state), not 5"), ConfigError);
  CHECK_THROWS_AS(ExperimentConfig::parse("optimizations:\n  zero_stage: yes\n"), ConfigError);
}
