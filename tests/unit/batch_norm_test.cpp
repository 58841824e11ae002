// Data-parallel buffers as DistributedDataParallel has them (rank 0's wherever they are read), and
// SyncBatchNorm (statistics over the global batch), on 2 and 3 ranks with uneven shards.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <sys/wait.h>

#include "ranks.hpp"
#include "test_trials.hpp"
#include "applied_context.hpp"

#include <dettrial/vision.hpp>

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

// 98 training records in global batches of 12: 6 a slot on 2 ranks (17 batches), 4 a slot on 3 (25);
// both end in a partial batch (of 2: BatchNorm needs two records to train on) and neither count
// divides by the ranks. 53 validation records.
constexpr std::int64_t train_records = 98, validation_records = 53;

test::Batch regression_data(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor x = torch::randn({n, 3}, gen) * 2 + 0.5;
  torch::Tensor y = x.matmul(torch::tensor({1.5f, -2.0f, 0.5f})).unsqueeze(1);
  return {x, y};
}

torch::nn::Sequential batch_norm_model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
}

/// Largest minus smallest of the values every rank gave: 0 when the ranks agree.
struct Spread {
  double operator()(const std::vector<double>& v) const {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return v.empty() ? 0.0 : *hi - *lo;
  }
};

/// A trial with a BatchNorm layer; under DETTRIAL_SYNC_BATCH_NORM its BatchNorm is a SyncBatchNorm.
struct BatchNormTrial {
  Context& context;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  test::SquaredError val_mse;
  FunctionReducer<double, Spread>* mean_spread = nullptr;
  FunctionReducer<double, Spread>* var_spread = nullptr;

  static torch::nn::Sequential built(Context& c) {
    torch::nn::Sequential m = batch_norm_model();
    if (std::getenv("DETTRIAL_SYNC_BATCH_NORM")) m = dettrial::nn::convert_sync_batchnorm(m, c.communicator());
    return m;
  }
  explicit BatchNormTrial(Context& c)
      : context(c), model(c.wrap_model(built(c))), opt(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.5)) {
    c.wrap_optimizer(opt);
    c.wrap_reducer(val_mse, "val_mse", /*for_training=*/false);
    mean_spread = &c.wrap_reducer(Spread{}, "running_mean_spread", /*for_training=*/false);
    var_spread = &c.wrap_reducer(Spread{}, "running_var_spread", /*for_training=*/false);
  }
  auto build_training_data_loader() {
    auto [x, y] = regression_data(train_records, 21);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = regression_data(validation_records, 22);
    return DataLoader(TensorDataset(x, y), {.batch_size = 4});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    const torch::Tensor err = (model->forward(x) - y).pow(2);
    val_mse.update(err);
    // The buffers this rank validates with: every rank must hold the same.
    const auto buffers = model->named_buffers();
    mean_spread->update(buffers["1.running_mean"].sum().item<double>());
    var_spread->update(buffers["1.running_var"].sum().item<double>());
    return {{"validation_loss", err.mean()}};
  }
};

/// A job of `n` ranks trains the BatchNorm trial; every rank must end with rank 0's buffers, validate
/// with them, and report the validation one process computes from the checkpoint.
void check_buffers_agree(int n, bool sync) {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<std::string> extra;
  if (sync) extra.emplace_back("DETTRIAL_SYNC_BATCH_NORM=1");
  test::run_ranks("child process: a rank trains a BatchNorm model", n, dir, extra);

  std::vector<std::vector<torch::Tensor>> buffers(static_cast<std::size_t>(n));
  for (int rank = 0; rank < n; ++rank)
    torch::load(buffers[static_cast<std::size_t>(rank)], (dir / ("buffers" + std::to_string(rank) + ".pt")).string());
  for (int rank = 1; rank < n; ++rank) {
    CAPTURE(rank);
    CHECK(test::bit_identical(buffers[static_cast<std::size_t>(rank)], buffers[0]));
  }
  const auto metrics = test::read_reports(dir / "run" / "metrics.jsonl");
  int validations = 0;
  for (const auto& m : metrics) {
    if (m["type"] != "validation") continue;
    ++validations;
    CHECK(m["metrics"]["running_mean_spread"].get<double>() == 0.0);
    CHECK(m["metrics"]["running_var_spread"].get<double>() == 0.0);
  }
  CHECK(validations >= 2);

  // One process evaluates the last checkpoint over the whole validation set: the job's val_mse.
  double job_mse = std::nan("");
  for (const auto& m : metrics)
    if (m["type"] == "validation") job_mse = m["metrics"]["val_mse"].get<double>();
  torch::nn::Sequential model = batch_norm_model();
  const YAML::Node result = YAML::LoadFile((dir / "rank0.yaml").string());
  load_model(result["checkpoint"].as<std::string>(), *model);
  model->eval();
  torch::NoGradGuard no_grad;
  auto [x, y] = regression_data(validation_records, 22);
  const double one_process = (model->forward(x) - y).pow(2).mean().item<double>();
  CHECK(job_mse == doctest::Approx(one_process).epsilon(1e-6));
}

}  // namespace

TEST_CASE("child process: a rank trains a BatchNorm model" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  test::Context context(Hyperparameters::parse("global_batch_size: 12\n"), ContextOptions{.trial_seed = 3, .communicator = comm});
  Trainer<BatchNormTrial> trainer(context);
  FitOptions o{.max_length = Epoch(2), .validation_period = Epoch(1), .reporting_period = Batch(10)};
  o.output_dir = dir / "run";
  o.report.quiet = true;
  const FitResult r = trainer.fit(o);
  std::vector<torch::Tensor> buffers;
  for (const auto& b : trainer.trial().model->buffers()) buffers.push_back(b.clone());
  torch::save(buffers, (dir / ("buffers" + std::to_string(env.rank) + ".pt")).string());
  if (env.rank == 0) {
    REQUIRE(!r.checkpoints.empty());
    std::ofstream(dir / "rank0.yaml") << "checkpoint: " << r.checkpoints.back().path.string() << "\n";
  }
}

TEST_CASE("data parallel: 2 ranks on uneven data end and validate with rank 0's BatchNorm statistics, as DDP's broadcast_buffers" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  check_buffers_agree(2, false);
}

TEST_CASE("data parallel: 3 ranks on uneven data end and validate with rank 0's BatchNorm statistics, as DDP's broadcast_buffers" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  check_buffers_agree(3, false);
}

TEST_CASE("data parallel: a SyncBatchNorm model on 3 ranks keeps its statistics equal on every rank" * doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  check_buffers_agree(3, true);
}

// ---- SyncBatchNorm against one process that sees the global batch ----------------------------

namespace {

/// The global batch: 7 records of 4 channels and length 5, split unevenly over the ranks.
torch::Tensor global_input() {
  auto gen = at::detail::createCPUGenerator(31);
  return torch::randn({7, 4, 5}, gen) * 3 + 1;
}
torch::Tensor global_loss_weights() {
  auto gen = at::detail::createCPUGenerator(32);
  return torch::randn({7, 4, 5}, gen);
}
/// Rank `rank`'s records of the global batch: the first ranks take the extra ones (2 ranks: 4 and 3; 3 ranks: 3, 2, 2).
std::pair<std::int64_t, std::int64_t> share(int rank, int ranks) {
  const std::int64_t base = 7 / ranks, extra = 7 % ranks;
  return {rank * base + std::min<std::int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}
constexpr int sync_steps = 3;

torch::nn::BatchNormOptions sync_options() { return torch::nn::BatchNormOptions(4).momentum(0.3); }

void set_affine(torch::Tensor weight, torch::Tensor bias) {
  torch::NoGradGuard no_grad;
  weight.copy_(torch::tensor({0.5f, 1.5f, -1.0f, 2.0f}));
  bias.copy_(torch::tensor({0.1f, -0.2f, 0.3f, 0.0f}));
}

}  // namespace

TEST_CASE("child process: a SyncBatchNorm rank" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  dettrial::nn::SyncBatchNorm bn(sync_options(), comm.get());
  set_affine(bn->weight, bn->bias);
  const auto [first, count] = share(env.rank, env.size);
  std::vector<torch::Tensor> out;
  for (int step = 0; step < sync_steps; ++step) {
    torch::Tensor x = (global_input() + step).narrow(0, first, count).clone().requires_grad_(true);
    bn->zero_grad();
    (bn->forward(x) * global_loss_weights().narrow(0, first, count)).sum().backward();
    out.push_back(x.grad().clone());
  }
  out.insert(out.end(), {bn->weight.grad().clone(), bn->bias.grad().clone(), bn->running_mean.clone(), bn->running_var.clone(),
                         bn->num_batches_tracked.clone()});
  torch::save(out, (dir / ("sync" + std::to_string(env.rank) + ".pt")).string());
}

TEST_CASE("SyncBatchNorm on 2 and 3 ranks with uneven shards: statistics and gradients of one process seeing the global batch" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  // One process, PyTorch's BatchNorm over the whole batch (the loss is a sum, so the ranks' losses add up to it).
  torch::nn::BatchNorm1d bn(sync_options());
  set_affine(bn->weight, bn->bias);
  std::vector<torch::Tensor> input_grads;
  for (int step = 0; step < sync_steps; ++step) {
    torch::Tensor x = (global_input() + step).requires_grad_(true);
    bn->zero_grad();
    (bn->forward(x) * global_loss_weights()).sum().backward();
    input_grads.push_back(x.grad().clone());
  }
  for (const int n : {2, 3}) {
    CAPTURE(n);
    const fs::path dir = test::quiet({}).output_dir;
    fs::create_directories(dir);
    test::run_ranks("child process: a SyncBatchNorm rank", n, dir);
    torch::Tensor weight_grad = torch::zeros_like(bn->weight), bias_grad = torch::zeros_like(bn->bias);
    for (int rank = 0; rank < n; ++rank) {
      CAPTURE(rank);
      std::vector<torch::Tensor> got;
      torch::load(got, (dir / ("sync" + std::to_string(rank) + ".pt")).string());
      REQUIRE(got.size() == sync_steps + 5);
      const auto [first, count] = share(rank, n);
      for (int step = 0; step < sync_steps; ++step) {
        CAPTURE(step);
        CHECK(torch::allclose(got[step], input_grads[static_cast<std::size_t>(step)].narrow(0, first, count), 1e-4, 1e-5));
      }
      weight_grad += got[sync_steps];
      bias_grad += got[sync_steps + 1];
      CHECK(torch::allclose(got[sync_steps + 2], bn->running_mean, 1e-5, 1e-6));
      CHECK(torch::allclose(got[sync_steps + 3], bn->running_var, 1e-5, 1e-6));
      CHECK(got[sync_steps + 4].item<std::int64_t>() == sync_steps);
    }
    // Each rank's parameter gradient is its share; the trainer's averaging sums them as one process's.
    CHECK(torch::allclose(weight_grad, bn->weight.grad(), 1e-4, 1e-5));
    CHECK(torch::allclose(bias_grad, bn->bias.grad(), 1e-4, 1e-5));
  }
}

TEST_CASE("convert_sync_batchnorm swaps each BatchNorm for a SyncBatchNorm with the same state, names and eval mode") {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4), torch::nn::ReLU(), torch::nn::BatchNorm2d(3));
  {
    torch::NoGradGuard no_grad;
    model[1]->as<torch::nn::BatchNorm1d>()->running_mean.fill_(0.25);
    model[1]->as<torch::nn::BatchNorm1d>()->weight.fill_(3);
  }
  torch::nn::Sequential converted = dettrial::nn::convert_sync_batchnorm(model, nullptr);
  CHECK(converted[0].get() == model[0].get());  // other layers shared
  REQUIRE(converted[1]->as<dettrial::nn::SyncBatchNorm>() != nullptr);
  CHECK(converted[3]->as<dettrial::nn::SyncBatchNorm>() != nullptr);
  CHECK(converted[3]->as<dettrial::nn::SyncBatchNorm>()->options.num_features() == 3);
  const auto before = model->named_parameters(), after = converted->named_parameters();
  REQUIRE(before.size() == after.size());
  for (const auto& item : before) {
    CAPTURE(item.key());
    REQUIRE(after.contains(item.key()));
    CHECK(torch::equal(after[item.key()], item.value()));
  }
  std::vector<std::string> buffer_names, converted_names;
  for (const auto& b : model->named_buffers()) buffer_names.push_back(b.key());
  for (const auto& b : converted->named_buffers()) converted_names.push_back(b.key());
  CHECK(buffer_names == converted_names);
  CHECK(converted->named_buffers()["1.running_mean"].eq(0.25).all().item<bool>());
  // One process (no communicator): it normalizes exactly as BatchNorm, in training and in evaluation.
  const torch::Tensor x = torch::randn({6, 4});
  CHECK(torch::equal(converted[1]->as<dettrial::nn::SyncBatchNorm>()->forward(x), model[1]->as<torch::nn::BatchNorm1d>()->forward(x)));
  model->eval();
  CHECK(!dettrial::nn::convert_sync_batchnorm(model, nullptr)->is_training());
}

// ---- any module tree converted: torchvision's ResNet on 2 ranks ---------------------------------

namespace {

/// The global batch of images: 5 of 3 x 32 x 32, split 3 and 2 over 2 ranks.
torch::Tensor global_images() {
  auto gen = at::detail::createCPUGenerator(41);
  return torch::randn({5, 3, 32, 32}, gen);
}

/// ResNet-18 for 5 classes as every process builds it (the same seed, the same weights).
dettrial::vision::models::ResNet seeded_resnet18() {
  torch::manual_seed(12);
  return dettrial::vision::models::resnet18({.num_classes = 5});
}

/// The output of one training forward, then every buffer (the running statistics, in order).
std::vector<torch::Tensor> forward_and_buffers(dettrial::vision::models::ResNet& model, const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  model->train();
  std::vector<torch::Tensor> out{model->forward(images)};
  for (const auto& b : model->named_buffers()) out.push_back(b.value().clone());
  return out;
}

}  // namespace

namespace {
/// A module of one's own whose forward calls its BatchNorm member.
struct OwnNormImpl : torch::nn::Module {
  torch::nn::BatchNorm2d norm{nullptr};
  OwnNormImpl() { norm = register_module("norm", torch::nn::BatchNorm2d(4)); }
  torch::Tensor forward(torch::Tensor x) { return norm(x); }
};
/// A module of one's own that holds a Sequential with a BatchNorm.
struct SequentialHolderImpl : torch::nn::Module {
  torch::nn::Sequential body{nullptr};
  SequentialHolderImpl() { body = register_module("body", torch::nn::Sequential(torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4))); }
  torch::Tensor forward(torch::Tensor x) { return body->forward(x); }
};
TORCH_MODULE(SequentialHolder);
}  // namespace

TEST_CASE("child process: a converted ResNet rank" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  auto model = dettrial::nn::convert_sync_batchnorm(seeded_resnet18(), comm.get());
  // In place: the members the ResNet's forward calls are the converted layers.
  REQUIRE(model->bn1->communicator == comm.get());
  REQUIRE(model->layer2[0]->as<dettrial::vision::models::BasicBlock>()->downsample[1]->as<dettrial::nn::SyncBatchNorm>()->communicator ==
          comm.get());
  const std::int64_t first = env.rank == 0 ? 0 : 3, count = env.rank == 0 ? 3 : 2;
  torch::save(forward_and_buffers(model, global_images().narrow(0, first, count)),
              (fs::path(std::getenv("DETTRIAL_CHILD_DIR")) / ("resnet" + std::to_string(env.rank) + ".pt")).string());
}

TEST_CASE(
    "convert_sync_batchnorm converts torchvision's ResNet-18 in place: on 2 ranks with a 3 and 2 split its outputs and running "
    "statistics are one process's over the global batch, and a BatchNorm member it cannot swap is refused by path" *
    doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  auto reference_model = seeded_resnet18();
  const std::vector<torch::Tensor> reference = forward_and_buffers(reference_model, global_images());
  // The test can fail: a rank normalizing with its own share's statistics ends elsewhere.
  auto alone = seeded_resnet18();
  const std::vector<torch::Tensor> own_share = forward_and_buffers(alone, global_images().narrow(0, 0, 3));
  CHECK_FALSE(torch::allclose(own_share[1], reference[1], 1e-4, 1e-5));

  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  test::run_ranks("child process: a converted ResNet rank", 2, dir);
  std::vector<torch::Tensor> outputs;
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    std::vector<torch::Tensor> got;
    torch::load(got, (dir / ("resnet" + std::to_string(rank) + ".pt")).string());
    REQUIRE(got.size() == reference.size());
    outputs.push_back(got[0]);
    for (std::size_t i = 1; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::allclose(got[i], reference[i], 1e-4, 1e-5));
    }
  }
  CHECK(torch::allclose(torch::cat(outputs), reference[0], 1e-4, 1e-4));

  // A module of one's own that holds a BatchNorm as a member calls it itself: refused, by path.
  torch::nn::Sequential tree(torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4));
  tree->push_back("own", std::make_shared<OwnNormImpl>());
  CHECK_THROWS_WITH_AS(dettrial::nn::convert_sync_batchnorm(tree, nullptr),
                       doctest::Contains("convert_sync_batchnorm: 'own.norm' is a torch::nn::BatchNorm2dImpl that its module calls "
                                         "itself, so it cannot be swapped from outside: declare that member a dettrial::nn::SyncBatchNorm"),
                       ConfigError);
  // A Sequential inside a module of one's own is converted where it is: the member sees it.
  SequentialHolder holder;
  CHECK(dettrial::nn::convert_sync_batchnorm(holder, nullptr).get() == holder.get());
  CHECK(holder->body[1]->as<dettrial::nn::SyncBatchNorm>() != nullptr);
}

// ---- clone() of every module dettrial ships ------------------------------------------------------

namespace {

/// `copy` holds `original`'s values in storage of its own, with its names and modes.
void check_deep_copy(torch::nn::Module& original, torch::nn::Module& copy) {
  const auto from = original.named_parameters(), to = copy.named_parameters();
  REQUIRE(from.size() == to.size());
  for (const auto& p : from) {
    CAPTURE(p.key());
    REQUIRE(to.contains(p.key()));
    CHECK(torch::equal(to[p.key()], p.value()));
    CHECK(to[p.key()].data_ptr() != p.value().data_ptr());
  }
  const auto from_buffers = original.named_buffers(), to_buffers = copy.named_buffers();
  REQUIRE(from_buffers.size() == to_buffers.size());
  for (const auto& b : from_buffers) {
    CAPTURE(b.key());
    REQUIRE(to_buffers.contains(b.key()));
    CHECK(torch::equal(to_buffers[b.key()], b.value()));
  }
  const auto from_modules = original.modules(), to_modules = copy.modules();
  REQUIRE(from_modules.size() == to_modules.size());
  for (std::size_t i = 0; i < from_modules.size(); ++i) CHECK(to_modules[i]->is_training() == from_modules[i]->is_training());
}

}  // namespace

TEST_CASE(
    "every module dettrial ships clones deeply, modes included, drawing nothing, and an EMA of a model with activation "
    "checkpointing or of a ResNet is made by cloning") {
  namespace models = dettrial::vision::models;
  const auto generator_state = [] { return at::detail::getDefaultCPUGenerator().get_state(); };
  torch::manual_seed(4);
  {
    dettrial::nn::CheckpointEach model(torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::Dropout(0.5), torch::nn::Linear(4, 2)));
    model->blocks()[1]->eval();  // a mode of its own in one block
    const torch::Tensor before = generator_state();
    auto copy = std::dynamic_pointer_cast<dettrial::nn::CheckpointEachImpl>(model->clone());
    CHECK(torch::equal(generator_state(), before));
    REQUIRE(copy);
    check_deep_copy(*model, *copy);
    model->eval();
    check_deep_copy(*model, *model->clone());
    // LibTorch's message before: "The cloned module does not have the same number of child modules".
    const torch::Tensor before_ema = generator_state();
    dettrial::optim::AveragedModel<dettrial::nn::CheckpointEach> ema(model, dettrial::optim::ema(0.9));
    CHECK(torch::equal(generator_state(), before_ema));  // as Python's deepcopy: no draws
    check_deep_copy(*model, *ema.module());
    // An EMA of a plain Sequential draws nothing either (LibTorch's clone re-initialises its layers).
    torch::nn::Sequential plain(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
    const torch::Tensor before_plain = generator_state();
    dettrial::optim::AveragedModel<torch::nn::Sequential> plain_ema(plain, dettrial::optim::ema(0.9));
    CHECK(torch::equal(generator_state(), before_plain));
    check_deep_copy(*plain, *plain_ema.module());
  }
  {
    dettrial::nn::SyncBatchNorm norm(torch::nn::BatchNormOptions(3));
    norm->running_mean.fill_(0.5);
    norm->eval();
    check_deep_copy(*norm, *norm->clone());
  }
  {
    // update_bn recomputes a SyncBatchNorm's statistics (the ResNets' norm layers) as a BatchNorm's.
    torch::nn::Sequential plain(torch::nn::BatchNorm1d(3)), sync(dettrial::nn::SyncBatchNorm(torch::nn::BatchNormOptions(3)));
    const std::vector<torch::Tensor> batches{torch::randn({4, 3}) + 2, torch::randn({6, 3}) * 3};
    dettrial::optim::update_bn(batches, plain);
    dettrial::optim::update_bn(batches, sync);
    const auto* by_sync = sync[0]->as<dettrial::nn::SyncBatchNorm>();
    const auto* by_plain = plain[0]->as<torch::nn::BatchNorm1d>();
    CHECK(torch::allclose(by_sync->running_mean, by_plain->running_mean));
    CHECK(torch::allclose(by_sync->running_var, by_plain->running_var));
    CHECK(by_sync->running_mean.abs().sum().item<double>() > 0.1);  // recomputed, not left at zero
  }
  {
    models::ResNet resnet = models::resnet18({.num_classes = 4});
    resnet->layer3->eval();
    resnet->fc = resnet->replace_module("fc", torch::nn::Linear(512, 3));  // fine-tuned on 3 classes
    {
      torch::NoGradGuard no_grad;
      resnet->bn1->running_var.fill_(2);
    }
    const torch::Tensor before = generator_state();
    const auto copy = std::dynamic_pointer_cast<models::ResNetImpl>(resnet->clone());
    CHECK(torch::equal(generator_state(), before));
    REQUIRE(copy);
    check_deep_copy(*resnet, *copy);
    resnet->eval();
    const torch::Tensor images = torch::randn({2, 3, 32, 32});
    copy->eval();
    CHECK(torch::equal(copy->forward(images), resnet->forward(images)));
    // Training the copy leaves the original alone.
    {
      torch::NoGradGuard no_grad;
      copy->fc->weight.add_(1);
    }
    CHECK_FALSE(torch::equal(copy->fc->weight, resnet->fc->weight));
    dettrial::optim::AveragedModel<models::ResNet> ema(resnet, dettrial::optim::ema(0.9));
    check_deep_copy(*resnet, *ema.module());
  }
  {
    models::Bottleneck block(64, 16, 1, torch::nn::Sequential(nullptr), 1, 64, 1);
    check_deep_copy(*block, *block->clone());
    models::BasicBlock basic(16, 32, 2,
                             torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 1).stride(2).bias(false)),
                                                   dettrial::nn::SyncBatchNorm(torch::nn::BatchNormOptions(32))),
                             1, 64, 1);
    check_deep_copy(*basic, *basic->clone());
  }
}
