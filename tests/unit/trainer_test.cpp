// The training loop: Determined's boundaries and callback order, metric averaging and reduction,
// gradient aggregation, LR step modes, clipping, seeding, and the errors fit reports.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_trials.hpp"
#include "applied_context.hpp"
#include "shared_run.hpp"

using namespace dettrial;

namespace {

/// A trial whose data and metrics are counters, so averages and orders can be checked exactly.
/// Its training loader has `epoch_len` batches; train_batch returns the batch index as a metric.
struct CountingTrial {
  Context& context;
  torch::nn::Linear model{nullptr};
  torch::optim::SGD opt;
  std::int64_t epoch_len;
  std::vector<std::int64_t> seen_batches;
  CountingTrial(Context& c, std::int64_t epoch_len_ = 4)
      : context(c), model(c.wrap_model(torch::nn::Linear(1, 1))), opt(model->parameters(), 0.0), epoch_len(epoch_len_) {
    context.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    return DataLoader(TensorDataset(torch::arange(epoch_len * 2, torch::kFloat).unsqueeze(1)), {.batch_size = 2});
  }
  auto build_validation_data_loader() { return DataLoader(TensorDataset(torch::arange(6, torch::kFloat).unsqueeze(1)), {.batch_size = 2}); }
  Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t epoch_idx, std::int64_t batch_idx) {
    seen_batches.push_back(batch_idx);
    torch::Tensor loss = model->forward(std::get<0>(b)).sum();
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", torch::tensor(static_cast<double>(batch_idx))}, {"epoch", static_cast<double>(epoch_idx)}};
  }
  Metrics evaluate_batch(std::tuple<torch::Tensor>& b) {
    // batch values 0,1 | 2,3 | 4,5: first elements 0, 2, 4
    return {{"first", std::get<0>(b)[0][0]}, {"count", 1.0}};
  }
};

/// Records every hook in order.
struct Recorder {
  std::vector<std::string> events;
  std::vector<std::int64_t> workload_sizes;
  std::int64_t last_batches = 0;
  void on_trial_startup(std::int64_t first, const std::string&) { events.push_back("startup@" + std::to_string(first)); }
  void on_trial_shutdown() { events.push_back("shutdown"); }
  void on_training_start() { events.push_back("training_start"); }
  void on_training_epoch_start(std::int64_t e) { events.push_back("epoch_start" + std::to_string(e)); }
  void on_training_epoch_end(std::int64_t e) { events.push_back("epoch_end" + std::to_string(e)); }
  void on_training_workload_end(const MetricValues& avg) {
    const auto b = static_cast<std::int64_t>(avg.at("batches"));
    events.push_back("train@" + std::to_string(b) + "(n=" + std::to_string(b - last_batches) + ")");
    last_batches = b;
  }
  void on_validation_end(const MetricValues& m) {
    events.push_back("VAL@" + std::to_string(static_cast<std::int64_t>(m.at("batches_seen"))));
  }
  void on_checkpoint_write_end(const std::filesystem::path&) { events.push_back("CKPT@" + std::to_string(last_batches)); }
};

/// Adds the batch count a validation ran at (what Determined's log shows as VAL@N).
struct BatchesSeen {
  Context* context;
  void reset() {}
  MetricValues reduce() {
    MetricValues m;
    m.set("batches_seen", static_cast<double>(seen));
    return m;
  }
  std::int64_t seen = 0;
};

std::vector<std::string> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

}  // namespace

TEST_CASE("the loop follows Determined's verified boundary and callback sequence") {
  // Reference: a 4-batch epoch, max_length Epoch(3), validation Batch(5), checkpoint Epoch(2),
  // reporting Batch(3), step_zero_validation, checkpoint_policy none.
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<CountingTrial> trainer(context);
  Recorder rec;
  struct Seen {
    Recorder* rec;
    BatchesSeen* seen;
    Context* ctx;
    void on_validation_start() { seen->seen = rec->last_batches; }
  };
  BatchesSeen seen{&context};
  context.wrap_reducer(seen, "", /*for_training=*/false, /*for_validation=*/true);
  Seen hook{&rec, &seen, &context};
  FitOptions options = test::quiet({.max_length = Epoch(3),
                                    .validation_period = Batch(5),
                                    .checkpoint_period = Epoch(2),
                                    .reporting_period = Batch(3),
                                    .checkpoint_policy = CheckpointPolicy::none,
                                    .step_zero_validation = true});
  // Determined writes a checkpoint in the step loop: so does this run, for its hooks' order (in the
  // background, on_checkpoint_write_end comes once the checkpoint is durable; hooks_test.cpp).
  options.async_checkpoints = false;
  const FitResult r = trainer.fit(options, hook, rec);
  const std::vector<std::string> expected = {
      "startup@0", "training_start", "VAL@0",         "epoch_start0", "train@3(n=3)", "epoch_end0",   "epoch_start1", "train@5(n=2)",
      "VAL@5",     "train@6(n=1)",   "epoch_end1",    "train@8(n=2)", "CKPT@8",       "epoch_start2", "train@9(n=1)", "train@10(n=1)",
      "VAL@10",    "epoch_end2",     "train@12(n=2)", "VAL@12",       "CKPT@12",      "shutdown"};
  CHECK(rec.events == expected);
  CHECK(r.batches_trained == 12);
  CHECK(r.epochs_trained == 3);
  CHECK(r.validations == 4);
  REQUIRE(r.checkpoints.size() == 2);
  CHECK(r.checkpoints[0].batches_trained == 8);
  CHECK(r.checkpoints[1].batches_trained == 12);
  CHECK(trainer.trial().seen_batches == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("training metrics are unweighted means over each workload, metrics.jsonl has every report") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<CountingTrial> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(7), .reporting_period = Batch(3)}));
  // Workloads: batches 0-2 (mean 1), 3-5 (mean 4), 6 (mean 6).
  CHECK(r.last_training_metrics.at("loss") == doctest::Approx(6.0));
  CHECK(r.last_training_metrics.at("batches") == 7);
  CHECK(r.last_training_metrics.at("epochs") == 1);
  const auto lines = read_lines(r.output_dir / "metrics.jsonl");
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].find("\"type\":\"training\",\"batches\":3,\"epochs\":0") != std::string::npos);
  const auto metric = [&](std::size_t line, const char* name) { return nlohmann::json::parse(lines[line])["metrics"][name].get<double>(); };
  CHECK(metric(0, "loss") == 1);
  CHECK(metric(1, "loss") == 4);
  CHECK(metric(1, "epoch") == 2.0 / 3.0);  // epochs 0, 1, 1: exactly, as written
  CHECK(metric(2, "loss") == 6);
  CHECK(lines[3].find("\"type\":\"validation\",\"batches\":7,\"epochs\":1") != std::string::npos);
  // Validation: first elements 0, 2, 4 averaged over three batches.
  CHECK(metric(3, "first") == 2);
  // The final checkpoint, with its time; the training reports say where their time went.
  const auto checkpoint = nlohmann::json::parse(lines[4]);
  CHECK(checkpoint["type"] == "checkpoint");
  CHECK(checkpoint["batches"] == 7);
  CHECK(checkpoint["seconds"].get<double>() >= 0);
  CHECK(checkpoint["uuid"].get<std::string>().size() == 36);
  const auto training = nlohmann::json::parse(lines[0]);
  for (const char* phase : {"data", "train_batch", "backward", "optimizer_step", "total"}) {
    INFO("phase " << phase);
    CHECK(training["seconds"][phase].get<double>() >= 0);
  }
  CHECK(training["seconds"]["train_batch"].get<double>() <= training["seconds"]["total"].get<double>());
  CHECK(training["learning_rates"]["lr"].get<double>() == 0.0);  // the trial's SGD(lr 0)
}

namespace {
template <Reducer R>
struct ReducingTrial : CountingTrial {
  using CountingTrial::CountingTrial;
  Reducer evaluation_reducer() const { return R; }
};
struct PerMetricReducers : CountingTrial {
  using CountingTrial::CountingTrial;
  std::map<std::string, Reducer> evaluation_reducer() const { return {{"first", Reducer::max}, {"count", Reducer::sum}}; }
};
struct WrongReducerNames : CountingTrial {
  using CountingTrial::CountingTrial;
  std::map<std::string, Reducer> evaluation_reducer() const { return {{"first", Reducer::max}, {"typo", Reducer::sum}}; }
};
template <class T>
MetricValues validate_once() {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<T> trainer(context);
  return trainer.fit(test::quiet({.max_length = Batch(1)})).last_validation_metrics;
}
}  // namespace

TEST_CASE("validation reducers: avg, sum, max, min, per metric, and names that must match") {
  CHECK(validate_once<ReducingTrial<Reducer::avg>>().at("first") == doctest::Approx(2.0));
  CHECK(validate_once<ReducingTrial<Reducer::sum>>().at("first") == doctest::Approx(6.0));
  CHECK(validate_once<ReducingTrial<Reducer::max>>().at("first") == doctest::Approx(4.0));
  CHECK(validate_once<ReducingTrial<Reducer::min>>().at("first") == doctest::Approx(0.0));
  const MetricValues per = validate_once<PerMetricReducers>();
  CHECK(per.at("first") == doctest::Approx(4.0));
  CHECK(per.at("count") == doctest::Approx(3.0));
  CHECK_THROWS_WITH_AS(validate_once<WrongReducerNames>(), doctest::Contains("it has no reducer for: count"), TrialError);
  CHECK_THROWS_WITH_AS(validate_once<WrongReducerNames>(), doctest::Contains("not returned: typo"), TrialError);
}

namespace {
/// A user reducer: the trial feeds it; dettrial resets and reduces it.
struct Accuracy {
  double correct = 0, total = 0;
  int resets = 0;
  void update(double c, double t) { correct += c, total += t; }
  void reset() { correct = total = 0, ++resets; }
  double reduce() const { return total > 0 ? correct / total : 0; }
};
struct ReducerTrial : CountingTrial {
  Accuracy accuracy;
  ReducerTrial(Context& c) : CountingTrial(c) { c.wrap_reducer(accuracy, "accuracy", /*for_training=*/false); }
  Metrics evaluate_batch(std::tuple<torch::Tensor>& b, std::int64_t batch_idx) {
    accuracy.update(batch_idx == 0 ? 0 : 2, 2);  // batches 0,1,2: 0/2, 2/2, 2/2
    return CountingTrial::evaluate_batch(b);
  }
};
}  // namespace

TEST_CASE("a user reducer is reset before each validation and merged under its name") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<ReducerTrial> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(4), .validation_period = Batch(2)}));
  CHECK(r.validations == 2);
  CHECK(r.last_validation_metrics.at("accuracy") == doctest::Approx(4.0 / 6.0));
  CHECK(trainer.trial().accuracy.resets == 2);
}

TEST_CASE("gradient aggregation: accumulate, average, then step on every second batch") {
  // The Determined rule, by hand: grads of batches 2k and 2k+1 summed, divided by 2, one SGD step,
  // on the device the context picks (the same kernels: bit-identical there too).
  const torch::Device device = test::default_device();
  auto [cpu_x, cpu_y] = test::regression_data();
  const torch::Tensor x = cpu_x.to(device), y = cpu_y.to(device);
  torch::manual_seed(5);
  auto reference = torch::nn::Linear(4, 1);
  reference->to(device);
  auto start = reference->parameters();
  std::vector<torch::Tensor> initial;
  for (auto& p : start) initial.push_back(p.detach().clone());
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int b = 0; b < 8; ++b) {
    auto loss = torch::mse_loss(reference->forward(x.narrow(0, b * 8, 8)), y.narrow(0, b * 8, 8));
    loss.backward();
    if (b % 2 == 1) {
      for (auto& p : reference->parameters()) p.grad().div_(2);
      ref_opt.step();
      ref_opt.zero_grad();
    }
  }

  struct Unshuffled {
    Context& context;
    torch::nn::Linear model;
    torch::optim::SGD opt;
    std::vector<torch::Tensor> init;
    Unshuffled(Context& c, std::vector<torch::Tensor> init_)
        : context(c), model(c.wrap_model(torch::nn::Linear(4, 1))), opt(model->parameters(), 0.1) {
      torch::NoGradGuard g;
      auto ps = model->parameters();
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].copy_(init_[i]);
      c.wrap_optimizer(opt);
    }
    auto build_training_data_loader() {
      auto [x, y] = test::regression_data();
      return DataLoader(TensorDataset(x, y), {.batch_size = 8});
    }
    auto build_validation_data_loader() { return build_training_data_loader(); }
    Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t) {
      auto loss = torch::mse_loss(model->forward(std::get<0>(b)), std::get<1>(b));
      context.backward(loss);
      context.step_optimizer(opt);
      return {{"loss", loss}};
    }
    Metrics evaluate_batch(test::Batch& b) { return {{"mse", torch::mse_loss(model->forward(std::get<0>(b)), std::get<1>(b))}}; }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1, .aggregation_frequency = 2});
  Trainer<Unshuffled> trainer(context, initial);
  trainer.fit(test::quiet({.max_length = Batch(8)}));
  CHECK(test::bit_identical(test::parameters_of(context), [&] {
    std::vector<torch::Tensor> v;
    for (auto& p : reference->parameters()) v.push_back(p.detach());
    return v;
  }()));
}

namespace {
/// A scheduler that counts its steps at each batch.
struct CountingScheduler {
  int steps = 0;
  void step() { ++steps; }
  // Checkpoints restore user schedulers through save/load.
  void save(torch::serialize::OutputArchive& out) const { out.write("steps", c10::IValue(std::int64_t{steps})); }
  void load(torch::serialize::InputArchive& in) {
    c10::IValue v;
    in.read("steps", v);
    steps = static_cast<int>(v.toInt());
  }
};
template <class Mode>
struct SchedulerTrial : CountingTrial {
  CountingScheduler scheduler;
  std::vector<int> steps_after_batch;
  SchedulerTrial(Context& c, std::int64_t frequency) : CountingTrial(c) { c.wrap_lr_scheduler(scheduler, Mode{}, frequency); }
  Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t e, std::int64_t i) {
    steps_after_batch.push_back(scheduler.steps);  // steps before this batch's own
    return CountingTrial::train_batch(b, e, i);
  }
};
template <class Mode>
std::vector<int> schedule(std::int64_t agg, std::int64_t frequency) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1, .aggregation_frequency = agg});
  Trainer<SchedulerTrial<Mode>> trainer(context, frequency);
  trainer.fit(test::quiet({.max_length = Batch(8)}));
  auto v = trainer.trial().steps_after_batch;
  v.push_back(trainer.trial().scheduler.steps);
  return v;
}
}  // namespace

TEST_CASE("LR step modes step on update batches only, with Determined's counting") {
  // 4-batch epochs, 8 batches; entry i = steps taken before batch i (last entry: the total).
  CHECK(schedule<lr_step::every_batch>(1, 1) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(schedule<lr_step::every_batch>(1, 3) == std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2, 2});
  CHECK(schedule<lr_step::every_batch>(2, 1) == std::vector<int>{0, 0, 2, 2, 4, 4, 6, 6, 8});  // catches up
  CHECK(schedule<lr_step::every_epoch>(1, 1) == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 2});
  CHECK(schedule<lr_step::every_epoch>(1, 2) == std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1});
  CHECK(schedule<lr_step::every_optimizer_step>(2, 2) == std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3, 4});
  CHECK(schedule<lr_step::every_optimizer_step>(2, 4) == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 2});
  CHECK(schedule<lr_step::manual>(1, 1) == std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("a declarative trial's lr_scheduler is stepped in its chosen mode") {
  struct WithScheduler : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    auto lr_scheduler(torch::optim::SGD& opt) { return scheduled(torch::optim::StepLR(opt, 1, 0.5), lr_step::every_epoch{}); }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<WithScheduler> trainer(context);
  trainer.fit(test::quiet({.max_length = Epoch(3)}));
  // 8 batches per epoch, three epochs: three step() calls, whatever LibTorch's StepLR makes of them
  // (LibTorch's first step() does not decay, unlike Python's).
  auto lr_of = [](torch::optim::Optimizer& o) { return static_cast<torch::optim::SGDOptions&>(o.param_groups()[0].options()).lr(); };
  torch::optim::SGD reference(test::make_model()->parameters(), 0.05);
  torch::optim::StepLR reference_scheduler(reference, 1, 0.5);
  for (int i = 0; i < 3; ++i) reference_scheduler.step();
  CHECK(lr_of(trainer.optimizer()) == lr_of(reference));
  CHECK(lr_of(trainer.optimizer()) < 0.05);
}

TEST_CASE("step_optimizer clips by norm and by value before stepping") {
  auto run = [](auto clip) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
    auto model = context.wrap_model(torch::nn::Linear(torch::nn::LinearOptions(2, 1).bias(false)));
    model->weight.data().fill_(0);
    torch::optim::SGD opt(model->parameters(), 1.0);
    context.wrap_optimizer(opt);
    model->forward(torch::tensor({{3.0f, 4.0f}}).to(context.device())).sum().backward();  // gradient (3, 4), norm 5
    context.step_optimizer(opt, clip);
    return model->weight.detach().cpu();
  };
  CHECK(torch::allclose(run(clip::none{}), torch::tensor({{-3.0f, -4.0f}})));
  CHECK(torch::allclose(run(clip::by_norm{1.0}), torch::tensor({{-0.6f, -0.8f}}), 1e-4, 1e-5));
  CHECK(torch::allclose(run(clip::by_value{3.5}), torch::tensor({{-3.0f, -3.5f}})));
}

namespace {
/// The declarative regression trial with gradient clipping by value through the optional hook.
struct ClippedDeclarative : test::DeclarativeRegression {
  using test::DeclarativeRegression::DeclarativeRegression;
  clip::by_value gradient_clipping() const { return clip::by_value{1e-3}; }
};
}  // namespace

TEST_CASE("a declarative trial's gradient_clipping() hook clips before each step") {
  const auto first_step = [](auto tag) {
    using T = typename decltype(tag)::type;
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 2});
    Trainer<T> trainer(context);
    const auto before = test::parameters_of(context)[0].detach().clone();
    trainer.fit(test::quiet({.max_length = Batch(1)}));
    return (test::parameters_of(context)[0] - before).abs().max().item<double>();
  };
  const double clipped = first_step(std::type_identity<ClippedDeclarative>{});
  // SGD at lr 0.05 with every gradient component clipped to 1e-3 moves no weight by more than 5e-5
  // (give or take float32 rounding of the weights).
  CHECK(clipped <= 0.05 * 1e-3 * 1.01);
  CHECK(first_step(std::type_identity<test::DeclarativeRegression>{}) > 10 * clipped);
}

TEST_CASE("context.distributed getters, and backward(output, gradient)") {
  const DistributedInfo two_nodes{.rank = 5, .size = 8, .local_rank = 1, .local_size = 4};
  CHECK(two_nodes.get_rank() == 5);
  CHECK(two_nodes.get_size() == 8);
  CHECK(two_nodes.get_local_rank() == 1);
  CHECK(two_nodes.get_local_size() == 4);
  CHECK(two_nodes.get_cross_rank() == 1);
  CHECK(two_nodes.get_cross_size() == 2);
  CHECK(DistributedInfo{}.get_cross_size() == 1);

  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  auto model = context.wrap_model(torch::nn::Linear(torch::nn::LinearOptions(2, 2).bias(false)));
  const torch::Device device = context.device();  // the model's: a GPU where there is one
  const torch::Tensor out = model->forward(torch::tensor({{1.0f, 2.0f}}).to(device));
  context.backward(out, torch::tensor({{1.0f, 0.0f}}).to(device));  // d(out[0][0])/dW: row 0 is the input
  CHECK(torch::allclose(model->weight.grad().cpu(), torch::tensor({{1.0f, 2.0f}, {0.0f, 0.0f}})));
  CHECK_THROWS_WITH_AS(context.backward(model->forward(torch::ones({1, 2}, device)), torch::ones({3}, device)),
                       doctest::Contains("the gradient's shape [3] differs from the output's [1, 2]"), TrialError);
}

namespace {
template <class T>
std::pair<std::vector<torch::Tensor>, double> train_regression(std::uint64_t seed) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = seed});
  Trainer<T> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(3), .validation_period = Epoch(1)}));
  return {test::parameters_of(context), r.last_validation_metrics.at("validation_loss")};
}
}  // namespace

TEST_CASE("the same seed gives the same run, in both trial styles, another seed does not") {
  const auto [declarative, loss_d] = train_regression<test::DeclarativeRegression>(11);
  const auto [again, loss_again] = train_regression<test::DeclarativeRegression>(11);
  const auto [imperative, loss_i] = train_regression<test::ImperativeRegression>(11);
  const auto [other, loss_other] = train_regression<test::DeclarativeRegression>(12);
  CHECK(test::bit_identical(declarative, again));
  CHECK(loss_d == loss_again);
  CHECK(test::bit_identical(declarative, imperative));  // dropout, shuffling and init all follow the seed
  CHECK(loss_d == loss_i);
  CHECK_FALSE(test::bit_identical(declarative, other));
  CHECK(loss_d < 1.0);  // and it learns: the targets' variance is about 15
}

TEST_CASE("max_length in records and epochs, test_mode, step-zero validation, stop requests") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  {
    Trainer<CountingTrial> trainer(context);
    // 60 records of a global batch of 8 are 7 batches (Determined rounds down, at least one).
    CHECK(trainer.fit(test::quiet({.max_length = Record(60)})).batches_trained == 7);
  }
  {
    test::Context c2(test::hparams(), ContextOptions{.trial_seed = 1});
    Trainer<CountingTrial> trainer(c2, 5);
    const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(2)}));
    CHECK(r.batches_trained == 10);
    CHECK(r.epochs_trained == 2);
  }
  {
    test::Context c3(test::hparams(), ContextOptions{.trial_seed = 1});
    Trainer<CountingTrial> trainer(c3);
    const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(100), .test_mode = true}));
    CHECK(r.batches_trained == 1);
    CHECK(r.validations == 1);
    // One validation batch (first values 0 | 2 | 4: the whole set would average 2), and a checkpoint.
    CHECK(r.last_validation_metrics.at("first") == 0.0);
    REQUIRE(r.checkpoints.size() == 1);
    CHECK(r.checkpoints[0].batches_trained == 1);
    CHECK(std::filesystem::exists(r.checkpoints[0].path / "state_dict.pth"));
  }
  {
    struct StopsAtThree : CountingTrial {
      using CountingTrial::CountingTrial;
      Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t e, std::int64_t i) {
        if (i == 2) context.set_stop_requested(true);
        return CountingTrial::train_batch(b, e, i);
      }
    };
    test::Context c4(test::hparams(), ContextOptions{.trial_seed = 1});
    Trainer<StopsAtThree> trainer(c4);
    const FitResult r = trainer.fit(test::quiet({.max_length = Batch(100), .reporting_period = Batch(1)}));
    CHECK(r.stopped_early);
    CHECK(r.stop_requested);
    CHECK(r.batches_trained == 3);
    CHECK(r.validations == 0);  // a stop checkpoints and exits, as Determined does
  }
}

TEST_CASE("fit reports bad lengths and broken trials with one clear message") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<CountingTrial> trainer(context);
  CHECK_THROWS_WITH_AS(trainer.fit(test::quiet({})), doctest::Contains("fit() needs a training length"), ConfigError);
  CHECK_THROWS_WITH_AS(trainer.fit(test::quiet({.max_length = Batch(0)})), doctest::Contains("max_length is 0 batches"), ConfigError);
  CHECK_THROWS_WITH_AS(trainer.fit(test::quiet({.max_length = Batch(5), .latest_checkpoint = "no-such-checkpoint"})),
                       doctest::Contains("checkpoint 'no-such-checkpoint' does not exist"), CheckpointError);

  struct NoLoss : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    Metrics train_batch(test::Batch& b, torch::nn::Sequential& m, std::int64_t, std::int64_t) {
      return {{"mse", torch::mse_loss(m->forward(std::get<0>(b)), std::get<1>(b))}};
    }
  };
  test::Context c2(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<NoLoss> no_loss(c2);
  CHECK_THROWS_WITH_AS(no_loss.fit(test::quiet({.max_length = Batch(1)})), "metric 'loss' is missing; the metrics are: mse", TrialError);

  struct ChangingKeys : CountingTrial {
    using CountingTrial::CountingTrial;
    Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t e, std::int64_t i) {
      CountingTrial::train_batch(b, e, i);
      if (i == 1) return {{"loss", 1.0}, {"extra", 2.0}};
      return {{"loss", 1.0}};
    }
  };
  test::Context c3(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<ChangingKeys> changing(c3);
  CHECK_THROWS_WITH_AS(changing.fit(test::quiet({.max_length = Batch(4)})),
                       doctest::Contains("returned the metrics {loss, extra} at batch 1 but {loss} earlier"), TrialError);

  struct Unwrapped {
    Context& context;
    torch::nn::Linear model;
    torch::optim::SGD opt;
    Unwrapped(Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(1, 1))), opt(model->parameters(), 0.1) {}
    auto build_training_data_loader() { return DataLoader(TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
    auto build_validation_data_loader() { return build_training_data_loader(); }
    Metrics train_batch(std::tuple<torch::Tensor>& b, std::int64_t, std::int64_t) { return {{"loss", 0.0}}; }
    Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {{"x", 0.0}}; }
  };
  test::Context c4(test::hparams(), ContextOptions{.trial_seed = 1});
  CHECK_THROWS_WITH_AS(Trainer<Unwrapped>{c4}, doctest::Contains("the trial wrapped no optimizer"), TrialError);

  struct EmptyValidation : CountingTrial {
    using CountingTrial::CountingTrial;
    auto build_validation_data_loader() { return DataLoader(TensorDataset(torch::zeros({0, 1})), {.batch_size = 2}); }
  };
  test::Context c5(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<EmptyValidation> empty(c5);
  CHECK_THROWS_WITH_AS(empty.fit(test::quiet({.max_length = Batch(1)})), "DataLoader: the dataset is empty", DataError);
}

TEST_CASE("evaluate_full_dataset gets the whole validation loader and no reducer") {
  struct FullDataset : CountingTrial {
    using CountingTrial::CountingTrial;
    Metrics evaluate_batch(std::tuple<torch::Tensor>&) = delete;
    Metrics evaluate_full_dataset(DataLoader<TensorDataset<1>>& loader) {
      double total = 0;
      for (auto&& [x] : loader) total += x.sum().item<double>();
      return {{"total", total}, {"batches_in_loader", static_cast<double>(loader.size())}};
    }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<FullDataset> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(2)}));
  CHECK(r.last_validation_metrics.at("total") == 15.0);
  CHECK(r.last_validation_metrics.at("batches_in_loader") == 3.0);
}

TEST_CASE("callbacks from build_callbacks and from fit, with per-batch metrics on request") {
  struct WantsBatches {
    std::vector<std::size_t> sizes;
    void on_training_workload_end(const MetricValues&, std::span<const Metrics> batches) { sizes.push_back(batches.size()); }
  };
  struct EpochCounter {
    int* ends;
    Context* context;
    void on_training_epoch_start(std::int64_t epoch) {
      // The context's counters already describe the batch that starts the epoch.
      CHECK(context->current_train_epoch() == epoch);
      CHECK(context->is_epoch_start());
    }
    void on_training_epoch_end(std::int64_t) { ++*ends; }
  };
  struct WithCallbacks : CountingTrial {
    int ends = 0;
    using CountingTrial::CountingTrial;
    std::tuple<EpochCounter> build_callbacks() { return {EpochCounter{&ends, &context}}; }
  };
  // Where a callback's own files go: the fit's output folder, known from the first hook on.
  struct SeesOutputDir {
    Context* context;
    std::filesystem::path seen;
    void on_trial_startup(std::int64_t, const std::string&) { seen = context->output_dir(); }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  Trainer<WithCallbacks> trainer(context);
  WantsBatches wants;
  SeesOutputDir sees{&context, {}};
  const FitOptions options = test::quiet({.max_length = Batch(8), .reporting_period = Batch(3)});
  trainer.fit(options, wants, sees);
  CHECK(wants.sizes == std::vector<std::size_t>{3, 3, 2});
  CHECK(trainer.trial().ends == 2);
  CHECK(!sees.seen.empty());
  CHECK(sees.seen == options.output_dir);
  // A context serves one trainer at a time.
  CHECK_THROWS_WITH_AS(Trainer<WithCallbacks>{context}, doctest::Contains("already serves a trainer"), TrialError);
}

TEST_CASE("a fit with slots_per_trial above 1 and no communicator is refused in one sentence, before it writes anything") {
  // A main of one's own that reads `resources.slots_per_trial: 8` and launches no ranks.
  test::Context context(test::hparams(), ExperimentConfig::parse("resources: {slots_per_trial: 8}\n"), ContextOptions{.trial_seed = 9});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitOptions o = test::quiet({.max_length = Batch(2)});
  CHECK_THROWS_WITH_AS(
      trainer.fit(o),
      doctest::Contains("resources.slots_per_trial is 8, but this process trains alone (its Context has no communicator of "
                        "8 ranks), so it would train on 1/8 of each global batch"),
      ConfigError);
  CHECK_FALSE(std::filesystem::exists(o.output_dir / "checkpoints"));
  CHECK_FALSE(std::filesystem::exists(o.output_dir / "metrics.jsonl"));
}

TEST_CASE("context: batch sizes, counters, to_device over nested batches") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 9, .slots_per_trial = 3});
  CHECK(context.get_per_slot_batch_size() == 2);  // 8 // 3
  CHECK(context.get_global_batch_size() == 6);
  CHECK(context.get_trial_seed() == 9);
  CHECK(context.device() == test::default_device());
  test::Context no_batch(Hyperparameters::parse("lr: 1"), ContextOptions{.trial_seed = 1});
  CHECK_THROWS_WITH_AS(no_batch.get_per_slot_batch_size(), doctest::Contains("need the hyperparameter 'global_batch_size'"),
                       HyperparameterError);
  CHECK_THROWS_WITH_AS(no_batch.current_train_epoch(), doctest::Contains("once training has started"), TrialError);

  using Nested = std::tuple<torch::Tensor, std::vector<torch::Tensor>, std::map<std::string, torch::Tensor>, std::string>;
  Nested batch{torch::ones({5, 2}), {torch::zeros({5}), torch::ones({5})}, {{"mask", torch::ones({5})}}, "ids"};
  Nested moved = context.to_device(batch);
  CHECK(std::get<0>(moved).device() == context.device());
  CHECK(std::get<1>(moved)[1].device() == context.device());
  CHECK(std::get<2>(moved).at("mask").device() == context.device());
  CHECK(std::get<3>(moved) == "ids");
  CHECK(std::get<2>(moved).at("mask").size(0) == 5);
  CHECK(batch_length(moved) == 5);
  CHECK(batch_length(std::vector<torch::Tensor>{torch::zeros({7, 1})}) == 7);
  CHECK(batch_length(std::map<std::string, torch::Tensor>{{"a", torch::zeros({3})}}) == 3);
}

namespace {
long minor_page_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// Minor page faults counted for touching 256 fresh pages: about 256 where the kernel counts them,
/// 0 where it does not (some sandboxed kernels), and then nothing can be measured.
long faults_of_fresh_pages() {
  constexpr std::size_t pages = 256;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* block = ::mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(block != MAP_FAILED);
  const long before = minor_page_faults();
  for (std::size_t i = 0; i < pages; ++i) static_cast<volatile char*>(block)[i * page] = 1;
  const long counted = minor_page_faults() - before;
  ::munmap(block, pages * page);
  return counted;
}

/// Page faults of the median batch of a small convolutional network's training steps (batch 64 of 28x28
/// images, as the MNIST example's): activations and gradients of a few MiB made and freed every batch.
double page_faults_per_batch() {
  torch::nn::Sequential net(torch::nn::Conv2d(1, 40, 5), torch::nn::MaxPool2d(2), torch::nn::ReLU(), torch::nn::Conv2d(40, 40, 5),
                            torch::nn::MaxPool2d(2), torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(640, 10));
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  const torch::Tensor images = torch::randn({64, 1, 28, 28}), labels = torch::randint(10, {64});
  auto step = [&] {
    optimizer.zero_grad();
    torch::cross_entropy_loss(net->forward(images), labels).backward();
    optimizer.step();
  };
  for (int i = 0; i < 5; ++i) step();  // warm-up: the first batches map what the run will need
  // The median batch: a one-time growth (the heap reaching a new peak, a thread's first stack pages)
  // is not what a batch costs.
  std::vector<long> per_batch;
  for (int i = 0; i < 11; ++i) {
    const long before = minor_page_faults();
    step();
    per_batch.push_back(minor_page_faults() - before);
  }
  std::nth_element(per_batch.begin(), per_batch.begin() + 5, per_batch.end());
  return static_cast<double>(per_batch[5]);
}
}  // namespace

TEST_CASE("child process: page faults of re-allocated activations" * doctest::skip()) {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 1});
  std::ofstream(std::getenv("DETTRIAL_CHILD_OUT")) << faults_of_fresh_pages() << ' ' << page_faults_per_batch();
}

TEST_CASE("rank_invariant on a GPU asks for deterministic kernels unless the config chose, and leaves them on the CPU") {
  // The device is only named: a Context touches none until it is given a model.
  const torch::Device gpu(torch::kCUDA, 0), cpu(torch::kCPU);
  auto deterministic = [](torch::Device device, std::optional<bool> chosen, bool rank_invariant) {
    return dettrial::Context(test::hparams(), ContextOptions{.device = device, .deterministic = chosen, .rank_invariant = rank_invariant})
        .process_settings()
        .deterministic;
  };
  CHECK(deterministic(gpu, std::nullopt, true) == std::optional<bool>(true));
  CHECK(deterministic(gpu, false, true) == std::optional<bool>(false));  // the config's choice stays
  CHECK(deterministic(gpu, std::nullopt, false) == std::nullopt);
  CHECK(deterministic(cpu, std::nullopt, true) == std::nullopt);  // on the CPU the ordered sums suffice
}

// In a process of its own (test::shared_run): it checks that nothing applied ProcessSettings before it.
TEST_CASE("a Context changes nothing process-wide, and its ProcessSettings, applied once, set the threads, determinism and seed" *
          doctest::test_suite(test::shared_run::own_process_suite)) {
  const int threads_before = at::get_num_threads();
  const bool deterministic_before = at::globalContext().deterministicAlgorithms();
  const int other_threads = threads_before == 1 ? 2 : 1;
  torch::manual_seed(11);
  const torch::Tensor unseeded = torch::rand({4});
  torch::manual_seed(11);
  // At its defaults (the threads from the CPUs, a clock seed) and with every setting chosen.
  const dettrial::Context defaults(test::hparams());
  const dettrial::Context context(test::hparams(),
                                  ContextOptions{.trial_seed = 7, .deterministic = !deterministic_before, .threads = other_threads});
  CHECK(at::get_num_threads() == threads_before);
  CHECK(at::globalContext().deterministicAlgorithms() == deterministic_before);
  CHECK(torch::equal(torch::rand({4}), unseeded));  // the global generator was left where it was
  CHECK_FALSE(ProcessSettings::applied());
  CHECK(dettrial::detail::runtime_summary().find("(LibTorch's default)") != std::string::npos);
  CHECK(defaults.process_settings().seed == defaults.get_trial_seed());
  REQUIRE(defaults.process_settings().threads);
  CHECK(defaults.process_settings().threads->threads >= 1);
  CHECK_FALSE(defaults.process_settings().deterministic);

  const ProcessSettings settings = context.process_settings();
  CHECK(settings.seed == 7u);
  REQUIRE(settings.threads);
  CHECK(settings.threads->threads == other_threads);
  CHECK(settings.deterministic == !deterministic_before);
  const std::string source = settings.apply().threads->source;
  CHECK(source == "--threads");
  CHECK(at::get_num_threads() == other_threads);
  CHECK(at::globalContext().deterministicAlgorithms() == !deterministic_before);
  if (!deterministic_before) CHECK(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
  CHECK(dettrial::detail::runtime_summary().find("(--threads: intra-op " + std::to_string(other_threads)) != std::string::npos);
  // The first line says when the deterministic kernels are on.
  CHECK((dettrial::detail::runtime_summary().find(", deterministic algorithms") != std::string::npos) == !deterministic_before);
  torch::manual_seed(7);
  const torch::Tensor seeded = torch::rand({4});
  settings.apply();
  CHECK(torch::equal(torch::rand({4}), seeded));  // seeded with the trial's seed

  ProcessSettings restore;
  restore.threads = ThreadChoice{.threads = threads_before, .source = "restored", .set_by_dettrial = true};
  restore.deterministic = deterministic_before;
  restore.apply();
  CHECK(at::get_num_threads() == threads_before);
}

TEST_CASE("a Context keeps freed memory in the process: training steps take no fresh pages") {
  // Each side in a fresh process (malloc's settings are process-wide): dettrial's, and glibc's own
  // (DETTRIAL_MALLOC=system). Malloc settings inherited from the caller's environment are emptied on
  // both sides, so each side measures what it names.
  const std::filesystem::path dir = test::quiet({}).output_dir;
  std::filesystem::create_directories(dir);
  struct Measured {
    long fresh_pages_counted;
    double per_batch;
  };
  auto measure = [&](const std::string& name, std::string dettrial_malloc) {
    std::vector<std::string> env{"DETTRIAL_CHILD_OUT=" + (dir / name).string(), "DETTRIAL_MALLOC=" + dettrial_malloc};
    for (const char* variable :
         {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX"})
      env.push_back(std::string(variable) + "=");
    bool in_time = false;
    const int status =
        test::wait_for(test::spawn_self("child process: page faults of re-allocated activations", env), std::chrono::seconds(60), in_time);
    REQUIRE(in_time);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    Measured measured{};
    std::istringstream(test::read_text(dir / name)) >> measured.fresh_pages_counted >> measured.per_batch;
    return measured;
  };
  const Measured kept = measure("kept", ""), system = measure("system", "system");
  if (kept.fresh_pages_counted < 128 || system.fresh_pages_counted < 128) {
    test::skip("this kernel does not count minor page faults (getrusage counted " + std::to_string(system.fresh_pages_counted) +
               " for 256 freshly touched pages), so fresh pages per batch cannot be measured");
    return;
  }
  MESSAGE("page faults per batch: " << kept.per_batch << " kept, " << system.per_batch << " with glibc's defaults");
  // Under glibc's defaults each batch maps fresh pages for its activations (thousands a batch where
  // this was written; how many depends on glibc's dynamic mmap threshold, so it is reported, not
  // checked). With freed memory kept, hardly any: the calibration above shows they would be counted.
  CHECK(kept.per_batch < 50);
}

TEST_CASE("child processes get the variables they are given, over inherited ones of the same name") {
  // Ranks started inside another launcher's job inherit its RANK, WORLD_SIZE, ...: the values the
  // built-in launcher gives must be the ones the child reads.
  ::setenv("DETTRIAL_PROBE_GIVEN", "inherited", 1);
  ::setenv("DETTRIAL_PROBE_KEPT", "kept", 1);
  const std::filesystem::path out = test::quiet({}).output_dir / "probe.txt";
  std::filesystem::create_directories(out.parent_path());
  const pid_t pid =
      dettrial::detail::spawn_process("/bin/sh", {"sh", "-c", "printf '%s %s' \"$DETTRIAL_PROBE_GIVEN\" \"$DETTRIAL_PROBE_KEPT\""},
                                      {.extra_env = {"DETTRIAL_PROBE_GIVEN=given"}, .output = out.string()});
  bool in_time = false;
  const int status = test::wait_for(pid, std::chrono::seconds(30), in_time);
  ::unsetenv("DETTRIAL_PROBE_GIVEN");
  ::unsetenv("DETTRIAL_PROBE_KEPT");
  REQUIRE(in_time);
  REQUIRE(WIFEXITED(status));
  CHECK(test::read_text(out) == "given kept");
}

TEST_CASE("dettrial::optim::StepLR stepped every epoch changes the learning rate after the same epochs as Python's") {
  // Python: StepLR(opt, step_size=2, gamma=0.5) stepped after each epoch gives lr 0.05, 0.05 in
  // epochs 1-2, 0.025, 0.025 in epochs 3-4, 0.0125 in epoch 5 (LibTorch's StepLR is one epoch late).
  struct WithStepLR : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    auto lr_scheduler(torch::optim::SGD& opt) { return scheduled(optim::StepLR(opt, 2, 0.5), lr_step::every_epoch{}); }
  };
  struct RecordLR {
    std::vector<double> at_epoch_start;
    void on_training_epoch_start(std::int64_t) { at_epoch_start.push_back(lr_of_group0()); }
    std::function<double()> lr_of_group0;
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<WithStepLR> trainer(context);
  RecordLR record{.lr_of_group0 = [&] { return trainer.optimizer().param_groups()[0].options().get_lr(); }};
  trainer.fit(test::quiet({.max_length = Epoch(5)}), record);
  CHECK(record.at_epoch_start == std::vector<double>{0.05, 0.05, 0.025, 0.025, 0.0125});
}

namespace {
/// Validation loss reported as a fixed sequence (by epoch), so the plateau scheduler's decisions are known.
struct PlateauTrial : test::ImperativeRegression {
  optim::ReduceLROnPlateau plateau;
  explicit PlateauTrial(Context& c) : ImperativeRegression(c), plateau(opt, {.factor = 0.5, .patience = 1, .threshold = 0.0}) {
    c.wrap_lr_scheduler(plateau, lr_step::on_validation{"validation_loss"});
  }
  Metrics evaluate_batch(test::Batch&) {
    static const std::vector<double> losses = {1.0, 0.9, 0.95, 0.97, 0.99, 0.96, 0.98};
    // During validation the current batch is the last one trained: 7 after the first epoch.
    return {{"validation_loss", torch::tensor(losses.at(static_cast<std::size_t>(context.current_train_batch() / 8)))}};
  }
};
}  // namespace

TEST_CASE("ReduceLROnPlateau steps with the validation metric, and resumes with its patience") {
  // One validation per epoch (8 batches); patience 1: the second bad validation in a row halves the
  // lr (as Python's): losses 1.0 0.9 0.95 0.97(halve) 0.99 0.96(halve) 0.98.
  const auto dir = std::filesystem::temp_directory_path() / ("dettrial-plateau-" + std::to_string(::getpid()));
  auto run = [&](std::int64_t epochs, bool resume) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
    Trainer<PlateauTrial> trainer(context);
    FitOptions o =
        test::quiet({.max_length = Epoch(epochs), .validation_period = Epoch(1), .checkpoint_period = Epoch(1), .output_dir = dir});
    if (resume) o.latest_checkpoint = dir;
    trainer.fit(o);
    return std::pair{trainer.trial().opt.param_groups()[0].options().get_lr(), trainer.trial().plateau.num_bad_epochs()};
  };
  std::filesystem::remove_all(dir);
  CHECK(run(6, false) == std::pair{0.0125, std::int64_t{0}});
  std::filesystem::remove_all(dir);
  CHECK(run(5, false) == std::pair{0.025, std::int64_t{1}});
  // Resumed at epoch 5: the sixth validation is the second bad one only if the best and the count came back.
  CHECK(run(6, true) == std::pair{0.0125, std::int64_t{0}});
  std::filesystem::remove_all(dir);

  struct WrongMetric : test::ImperativeRegression {
    optim::ReduceLROnPlateau plateau;
    explicit WrongMetric(Context& c) : ImperativeRegression(c), plateau(opt) {
      c.wrap_lr_scheduler(plateau, lr_step::on_validation{"accuracy"});
    }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
  Trainer<WrongMetric> trainer(context);
  CHECK_THROWS_WITH_AS(
      trainer.fit(test::quiet({.max_length = Batch(8)})),
      doctest::Contains("needs the validation metric 'accuracy', which the validation did not report (it reported: validation_loss)"),
      ConfigError);
}

TEST_CASE("records_per_epoch is not used by a PyTorch-style trial, as Determined's PyTorchTrial ignores it: its epoch is its loader's") {
  // 64 records in batches of 8 are 8 batches; records_per_epoch 40 (5 batches) changes nothing.
  const ExperimentConfig config =
      ExperimentConfig::parse("hyperparameters: {global_batch_size: 8, lr: 0.05}\nrecords_per_epoch: 40\n", "test");
  test::Context context(config, ContextOptions{.trial_seed = 1});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Epoch(3), .validation_period = Epoch(2)}));
  CHECK(r.batches_trained == 24);
  CHECK(r.epochs_trained == 3);
  CHECK(r.validations == 2);  // after epoch 2 (batch 16) and at the end
  CHECK(context.get_experiment_config().records_per_epoch == 40);
}

TEST_CASE("the context's trial and experiment ids: given, from Determined's variables, or 0") {
  CHECK(Context(test::hparams()).get_trial_id() == 0);
  CHECK(Context(test::hparams()).get_experiment_id() == 0);
  const test::Context given(test::hparams(), ContextOptions{.trial_id = 7, .experiment_id = 12});
  CHECK(given.get_trial_id() == 7);
  CHECK(given.get_experiment_id() == 12);
  ::setenv("DET_TRIAL_ID", "3", 1);
  ::setenv("DET_EXPERIMENT_ID", "41", 1);
  const test::Context from_env(test::hparams());
  CHECK(from_env.get_trial_id() == 3);
  CHECK(from_env.get_experiment_id() == 41);
  CHECK(from_env.get_experiment_config().records_per_epoch == 0);
  ::setenv("DET_TRIAL_ID", "three", 1);
  CHECK_THROWS_WITH_AS(Context(test::hparams()), doctest::Contains("DET_TRIAL_ID is 'three'; it must be a trial or experiment id"),
                       ConfigError);
  ::unsetenv("DET_TRIAL_ID");
  ::unsetenv("DET_EXPERIMENT_ID");
}
