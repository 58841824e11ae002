// Hooks and options no other test exercised: the validation-epoch and checkpoint save/load
// callbacks, get_batch_length, Context::is_epoch_end, a train_batch that returns the bare loss, and
// average_aggregated_gradients: false.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "test_trials.hpp"
#include "applied_context.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

/// 23 records of 2 features: batches of 5 are an epoch of 5 batches, the last one of 3 records.
test::Batch line_data(std::int64_t n = 23) {
  torch::Tensor x = torch::linspace(-1, 1, n * 2).reshape({n, 2});
  torch::Tensor y = x.matmul(torch::tensor({0.5f, -1.5f})).unsqueeze(1) + 0.25;
  return {x, y};
}

/// Every hook it hears, in order, and a note it saves into the checkpoint and reads back on resume.
struct Recorder {
  std::vector<std::string> heard;
  std::string note_read;
  void on_validation_start() { heard.emplace_back("validation_start"); }
  void on_validation_epoch_start() { heard.emplace_back("validation_epoch_start"); }
  void on_validation_epoch_end(std::span<const Metrics> outputs) {
    heard.push_back("validation_epoch_end " + std::to_string(outputs.size()));
  }
  void on_validation_end(const MetricValues&) { heard.emplace_back("validation_end"); }
  void on_checkpoint_save_start(StateDict& checkpoint) {
    heard.emplace_back("checkpoint_save_start");
    checkpoint.insert_or_assign("recorder_note", std::string("written by on_checkpoint_save_start"));
  }
  void on_checkpoint_write_end(const fs::path&) { heard.emplace_back("checkpoint_write_end"); }
  void on_checkpoint_load_start(const StateDict& checkpoint) {
    heard.emplace_back("checkpoint_load_start");
    if (const auto found = checkpoint.find("recorder_note"); found != checkpoint.end()) note_read = found->value().toStringRef();
  }
};

/// A trial whose train_batch returns the bare loss, and which records Context::is_epoch_end per batch.
struct BareLossTrial {
  Context& context;
  torch::nn::Linear model{nullptr};
  torch::optim::SGD opt;
  std::vector<std::int64_t> epoch_ends;  // batch_idx of every batch where is_epoch_end() held
  explicit BareLossTrial(Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(2, 1))), opt(model->parameters(), 0.1) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    auto [x, y] = line_data();
    return DataLoader(TensorDataset(x, y), {.batch_size = 5});
  }
  auto build_validation_data_loader() {
    auto [x, y] = line_data(11);
    return DataLoader(TensorDataset(x, y), {.batch_size = 4});
  }
  torch::Tensor train_batch(test::Batch& b, std::int64_t, std::int64_t batch_idx) {
    if (context.is_epoch_end()) epoch_ends.push_back(batch_idx);
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return loss;
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
  /// Each record counts twice (as a pair would): the reports count what this says.
  std::int64_t get_batch_length(const test::Batch& b) const { return 2 * std::get<0>(b).size(0); }
};

/// Sends this process's stdout to a file while it lives.
struct StdoutToFile {
  int saved;
  explicit StdoutToFile(const fs::path& file) {
    std::fflush(stdout);
    saved = ::dup(1);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::close(fd);
  }
  ~StdoutToFile() {
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
  }
};

}  // namespace

TEST_CASE("callbacks hear the validation epoch around evaluate_batch, and a checkpoint's save and load") {
  test::Context context(Hyperparameters::parse("global_batch_size: 5\n"), ContextOptions{.trial_seed = 3});
  Trainer<BareLossTrial> trainer(context);
  Recorder recorder;
  FitOptions o = test::quiet({.max_length = Batch(8), .validation_period = Batch(4), .checkpoint_period = Batch(4)});
  // Written in the step loop, a checkpoint's hooks come in Determined's order; written in the
  // background (below), on_checkpoint_write_end comes once it is durable.
  o.async_checkpoints = false;
  const FitResult r = trainer.fit(o, recorder);
  // Three batches of 4 validation records and one of 3... as 11 records in batches of 4: 4, 4, 3.
  const std::vector<std::string> one_validation = {"validation_start", "validation_epoch_start", "validation_epoch_end 3",
                                                   "validation_end"};
  std::vector<std::string> expected;
  for (int i = 0; i < 2; ++i) {
    expected.insert(expected.end(), one_validation.begin(), one_validation.end());
    expected.insert(expected.end(), {"checkpoint_save_start", "checkpoint_write_end"});
  }
  CHECK(recorder.heard == expected);
  REQUIRE(r.checkpoints.size() == 2);
  {
    test::Context background_context(Hyperparameters::parse("global_batch_size: 5\n"), ContextOptions{.trial_seed = 3});
    Trainer<BareLossTrial> background(background_context);
    Recorder heard;
    FitOptions b = test::quiet({.max_length = Batch(8), .validation_period = Batch(4), .checkpoint_period = Batch(4)});
    REQUIRE(background.fit(b, heard).checkpoints.size() == 2);
    // Each save's write_end after it and before the next save (one checkpoint in flight at most).
    std::vector<std::string> checkpoint_hooks;
    for (const auto& h : heard.heard)
      if (h.rfind("checkpoint_", 0) == 0) checkpoint_hooks.push_back(h);
    CHECK(checkpoint_hooks ==
          std::vector<std::string>{"checkpoint_save_start", "checkpoint_write_end", "checkpoint_save_start", "checkpoint_write_end"});
  }

  // Resumed from the last checkpoint (retention deleted the first) and trained on: the load hook
  // sees what the save hook wrote.
  test::Context again(Hyperparameters::parse("global_batch_size: 5\n"), ContextOptions{.trial_seed = 3});
  Trainer<BareLossTrial> resumed(again);
  Recorder second;
  FitOptions from = o;
  from.latest_checkpoint = r.checkpoints.back().path;
  from.max_length = Batch(12);
  from.output_dir = o.output_dir.string() + "-resumed";
  resumed.fit(from, second);
  REQUIRE(!second.heard.empty());
  CHECK(second.heard.front() == "checkpoint_load_start");
  CHECK(second.note_read == "written by on_checkpoint_save_start");
}

TEST_CASE("a bare-loss train_batch reports its loss, is_epoch_end holds on each epoch's last batch, get_batch_length counts records") {
  test::Context context(Hyperparameters::parse("global_batch_size: 5\n"), ContextOptions{.trial_seed = 3});
  Trainer<BareLossTrial> trainer(context);
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  FitOptions o{.max_length = Batch(12), .validation_period = Batch(12), .reporting_period = Batch(12), .output_dir = dir / "run"};
  o.report.live_progress = false;
  FitResult r;
  {
    StdoutToFile capture(dir / "out.txt");
    r = trainer.fit(o);
  }
  // 23 records in batches of 5: an epoch is 5 batches, so batches 4 and 9 end one.
  CHECK(trainer.trial().epoch_ends == std::vector<std::int64_t>{4, 9});
  REQUIRE(r.last_training_metrics.contains("loss"));
  CHECK(std::isfinite(r.last_training_metrics.at("loss")));
  // 11 validation records, each counted twice by get_batch_length.
  const std::string out = test::read_text(dir / "out.txt");
  CAPTURE(out);
  CHECK(out.find("(22 records in") != std::string::npos);
}

TEST_CASE("average_aggregated_gradients false sums the aggregated gradients, true averages them") {
  for (const bool average : {false, true}) {
    CAPTURE(average);
    // On the CPU, where the update is computed by hand below (a GPU machine's default device would
    // move the model away from the test's tensors).
    test::Context context(
        Hyperparameters::parse("global_batch_size: 5\n"),
        ContextOptions{
            .trial_seed = 3, .device = torch::Device(torch::kCPU), .aggregation_frequency = 2, .average_aggregated_gradients = average});
    Trainer<BareLossTrial> trainer(context);
    torch::nn::Linear& model = trainer.trial().model;
    // The update over the first two batches, by hand: both gradients at the starting weights.
    std::vector<torch::Tensor> start;
    for (const auto& p : model->parameters()) start.push_back(p.detach().clone());
    auto [x, y] = line_data();
    std::vector<torch::Tensor> sum(start.size());
    for (const std::int64_t first : {0, 5}) {
      model->zero_grad();
      torch::mse_loss(model->forward(x.narrow(0, first, 5)), y.narrow(0, first, 5)).backward();
      for (std::size_t i = 0; i < start.size(); ++i) {
        const torch::Tensor g = model->parameters()[i].grad().clone();
        sum[i] = sum[i].defined() ? sum[i] + g : g;
      }
    }
    model->zero_grad();
    trainer.fit(test::quiet({.max_length = Batch(2), .validation_period = Batch(2)}));
    for (std::size_t i = 0; i < start.size(); ++i) {
      const torch::Tensor expected = start[i] - 0.1 * (average ? sum[i] / 2 : sum[i]);
      CHECK(torch::allclose(model->parameters()[i].detach(), expected, 1e-6, 1e-7));
    }
  }
}

TEST_CASE("a trial that wraps LibTorch's StepLR is told once, on the start lines, that it decays a step after Python's") {
  struct TwoLibTorchStepLRs : test::ImperativeRegression {
    torch::optim::StepLR first, second;
    explicit TwoLibTorchStepLRs(Context& c) : ImperativeRegression(c), first(opt, 2, 0.5), second(opt, 3, 0.5) {
      c.wrap_lr_scheduler(first, lr_step::every_epoch{});
      c.wrap_lr_scheduler(second, lr_step::every_epoch{});
    }
  };
  struct PythonStepLR : test::ImperativeRegression {
    dettrial::optim::StepLR schedule;
    explicit PythonStepLR(Context& c) : ImperativeRegression(c), schedule(opt, 2, 0.5) {
      c.wrap_lr_scheduler(schedule, lr_step::every_epoch{});
    }
  };
  const auto start_lines = [](auto& trainer) {
    const fs::path dir = test::quiet({}).output_dir;
    fs::create_directories(dir);
    FitOptions o{.max_length = Batch(2), .output_dir = dir / "run"};
    o.report.live_progress = false;
    {
      StdoutToFile capture(dir / "out.txt");
      trainer.fit(o);
    }
    return test::read_text(dir / "out.txt");
  };
  const std::string note = "is LibTorch's torch::optim::StepLR, which decays one step() later than Python's StepLR";
  test::Context libtorch_context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<TwoLibTorchStepLRs> libtorch(libtorch_context);
  const std::string told = start_lines(libtorch);
  CAPTURE(told);
  CHECK(told.find("dettrial: LR scheduler 0 " + note) != std::string::npos);
  CHECK(told.find(note) == told.rfind(note));  // once, however many there are
  test::Context python_context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<PythonStepLR> python(python_context);
  CHECK(start_lines(python).find(note) == std::string::npos);
}
