// End to end: the MNIST example trial on real data (the 10,000 MNIST digits, and Fashion-MNIST).
#include <doctest/doctest.h>

#include <fstream>

#include "../../examples/mnist/mnist_trial.hpp"
#include "../../examples/mnist_trainer/mnist_trial.hpp"
#include "muon_problem.hpp"
#include "rprop.hpp"
#include "skip.hpp"
#include "source_dir.hpp"
#include "applied_context.hpp"

using namespace dettrial;

namespace {
FitResult train_mnist(const std::string& config_yaml, FitOptions options) {
  const ExperimentConfig config = ExperimentConfig::parse(config_yaml, "mnist test config");
  test::Context context(config);
  Trainer<mnist::MnistTrial> trainer(context);
  options.report.quiet = true;
  options.output_dir = std::filesystem::temp_directory_path() / ("dettrial-mnist-" + std::to_string(::getpid()));
  return trainer.fit(std::move(options));
}
}  // namespace

#ifdef DETTRIAL_MNIST10K_DIR
TEST_CASE("the MNIST trial learns the 10,000 real digits") {
  if (!std::filesystem::exists(DETTRIAL_MNIST10K_DIR)) return test::skip(DETTRIAL_MNIST10K_DIR " is absent (the 10,000 MNIST digits)");
  // Train on the first 8,000 digits, validate on the last 2,000.
  const FitResult r = train_mnist(R"(
hyperparameters: {learning_rate: 0.05, dropout: 0.2, global_batch_size: 64, n_filters1: 10, n_filters2: 20}
reproducibility: {experiment_seed: 7}
data: {dir: )" DETTRIAL_MNIST10K_DIR R"(, train_split: t10k, validation_split: t10k, holdout: 2000}
)",
                                  {.max_length = Epoch(3), .validation_period = Epoch(1)});
  CHECK(r.validations == 3);
  CHECK(r.batches_trained == 3 * 125);
  MESSAGE("MNIST-10k holdout accuracy: " << r.last_validation_metrics.at("accuracy"));
  CHECK(r.last_validation_metrics.at("accuracy") > 0.93);
}
#endif

#ifdef DETTRIAL_MNIST10K_DIR
TEST_CASE("seed 004's example in the Trainer style (init, Trainer, fit) reaches its README's ~97% validation accuracy on held-out digits") {
  if (!std::filesystem::exists(DETTRIAL_MNIST10K_DIR)) return test::skip(DETTRIAL_MNIST10K_DIR " is absent (the 10,000 MNIST digits)");
  // train.py as a trial: const.yaml's hyperparameters, the searcher's length (fit's max_length unset).
  // The first 8,000 digits train (125 batches of 64 an epoch), the last 2,000 validate.
  const auto context = dettrial::init({.exp_conf = ExperimentConfig::parse(R"(
hyperparameters: {learning_rate: 1.0, n_filters1: 32, n_filters2: 64, dropout1: 0.25, dropout2: 0.5}
searcher: {name: single, metric: validation_loss, max_length: {batches: 500}}
reproducibility: {experiment_seed: 5}
)",
                                                                           "seed 004 const.yaml")});
  CHECK(dettrial::ProcessSettings::applied().has_value());  // init applied the process's settings
  Trainer<mnist_trainer::MNistTrial> trainer(
      *context, context->get_hparams(),
      mnist_trainer::DataSource{.dir = DETTRIAL_MNIST10K_DIR, .train_split = "t10k", .validation_split = "t10k", .holdout = 2000});
  FitOptions options{.validation_period = Batch(250),
                     .output_dir = std::filesystem::temp_directory_path() / ("dettrial-seed004-" + std::to_string(::getpid()))};
  options.report.quiet = true;
  const FitResult r = trainer.fit(options);
  CHECK(r.batches_trained == 500);  // the searcher's length
  CHECK(r.validations == 2);
  MESSAGE("seed 004's MNIST trial, held-out accuracy after 4 epochs of 8,000 digits: " << r.last_validation_metrics.at("accuracy"));
  CHECK(r.last_validation_metrics.at("accuracy") > 0.965);
}
#endif

TEST_CASE("the MNIST trial learns Fashion-MNIST (a short run)") {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    return test::skip("Debian's dataset-fashion-mnist is not installed (scripts/test installs it)");
  const FitResult r = train_mnist(R"(
hyperparameters: {learning_rate: 0.05, dropout: 0.2, global_batch_size: 64, n_filters1: 10, n_filters2: 20}
reproducibility: {experiment_seed: 7}
)",
                                  {.max_length = Batch(400)});
  MESSAGE("Fashion-MNIST test accuracy after 400 batches: " << r.last_validation_metrics.at("accuracy"));
  CHECK(r.last_validation_metrics.at("accuracy") > 0.75);
}

#ifdef DETTRIAL_MNIST10K_DIR
// With DETTRIAL_INTEROP_DIR set (a CTest fixture), the checkpoint and the network's outputs on a
// fixed input are left there for tests/python/load_checkpoint.py, which loads them with Python's
// torch.load into the same network written in Python.
TEST_CASE("a checkpoint of the MNIST trial reloads into a fresh trial and gives the same outputs") {
  const char* interop = std::getenv("DETTRIAL_INTEROP_DIR");
  const std::filesystem::path dir = interop ? std::filesystem::path(interop)
                                            : std::filesystem::temp_directory_path() / ("dettrial-interop-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  if (!std::filesystem::exists(DETTRIAL_MNIST10K_DIR)) {
    // The Python reader reports the same reason instead of failing on a missing file.
    const std::string reason = DETTRIAL_MNIST10K_DIR " is absent (the 10,000 MNIST digits)";
    std::filesystem::create_directories(dir);
    dettrial::detail::write_file_synced(dir / "skipped.txt", reason + "\n");
    return test::skip(reason);
  }
  const ExperimentConfig config = ExperimentConfig::parse(R"(
hyperparameters: {learning_rate: 0.05, lr_decay: 0.5, dropout: 0.2, global_batch_size: 64, n_filters1: 10, n_filters2: 20}
reproducibility: {experiment_seed: 3}
data: {dir: )" DETTRIAL_MNIST10K_DIR R"(, train_split: t10k, validation_split: t10k, holdout: 9000}
)",
                                                          "interop config");
  test::Context context(config);
  // A gradient scaler too (powers of two: the training is the same), so that Python loads its state.
  GradScaler scaler(GradScaler::Options{.init_scale = 1024, .growth_interval = 8});
  context.wrap_scaler(scaler);
  Trainer<mnist::MnistTrial> trainer(context);
  FitOptions options{.max_length = Batch(20), .output_dir = dir / "run"};
  options.report.quiet = true;
  const FitResult r = trainer.fit(options);  // 16 batches per epoch: the StepLR decayed once
  REQUIRE(r.checkpoints.size() == 1);
  // Decayed after the first epoch, as Python's StepLR decays (LibTorch's own would still be at 0.05).
  CHECK(trainer.optimizer().param_groups()[0].options().get_lr() == doctest::Approx(0.025));

  torch::NoGradGuard no_grad;
  trainer.model()->eval();
  // On the context's device (a GPU when there is one); Python compares on the CPU.
  const torch::Tensor input = torch::randn({16, 1, 28, 28}, at::detail::createCPUGenerator(42)).to(context.device());
  const torch::Tensor output = trainer.model()->forward(input);

  test::Context fresh_context(config);
  Trainer<mnist::MnistTrial> fresh(fresh_context);
  load_models(r.checkpoints.back().path, fresh_context);
  fresh.model()->eval();
  CHECK(torch::equal(fresh.model()->forward(input), output));

  // Determined's load_trial_from_checkpoint_path: the trial rebuilt from the checkpoint's
  // load_data.json (a changed hyperparameter merged in), its weights loaded.
  auto loaded = load_trial_from_checkpoint_path<mnist::MnistTrial>(r.checkpoints.back().path.parent_path(),
                                                                   {.hparams = YAML::Load("{dropout: 0.0, n_filters1: 10}")});
  CHECK(loaded.context().get_hparam<double>("dropout") == 0.0);
  CHECK(loaded.context().get_hparam<double>("learning_rate") == 0.05);
  CHECK(loaded.context().get_hparam<std::int64_t>("n_filters2") == 20);
  loaded.model().eval();
  CHECK(torch::equal(loaded.trainer().model()->forward(input), output));
  CHECK_THROWS_WITH_AS(
      load_trial_from_checkpoint_path<mnist::MnistTrial>(r.checkpoints.back().path, {.hparams = YAML::Load("{n_filters1: 12}")}),
      doctest::Contains("has shape"), CheckpointError);

  StateDict io(c10::StringType::get(), c10::AnyType::get());
  io.insert("input", input.cpu());
  io.insert("output", output.cpu());
  io.insert("lr", trainer.optimizer().param_groups()[0].options().get_lr());
  io.insert("checkpoint", r.checkpoints.back().path.string());
  io.insert("device", context.device().str());
  io.insert("n_filters1", std::int64_t{10});
  io.insert("n_filters2", std::int64_t{20});
  dettrial::detail::write_file_synced(dir / "io.pt", dettrial::detail::pickle_archive(io));
}
#endif

// Weights written by Python (tests/python/write_weights.py, run here with the build's Python) load
// into the same network built in C++: a plain state dict, a Determined checkpoint directory, a
// DistributedDataParallel-wrapped dict, and a backbone for fine-tuning (non-strict).
TEST_CASE("weights written by Python load into the same network in C++") {
  const std::string python = DETTRIAL_TEST_PYTHON;
  if (python.empty()) return test::skip("no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-python-weights-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string command =
      "'" + python + "' '" + std::string(test::tests_source_dir()) + "/python/write_weights.py' '" + dir.string() + "'";
  const int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return test::skip(python + " has no torch");
  REQUIRE_MESSAGE(status == 0, command);
  auto network = [] {
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)), torch::nn::MaxPool2d(2), torch::nn::ReLU(),
                                 torch::nn::Flatten(), torch::nn::Linear(16 * 20, 50), torch::nn::ReLU(), torch::nn::Dropout(0.2),
                                 torch::nn::Linear(50, 10), torch::nn::LogSoftmax(1));
  };
  const StateDict io = dettrial::detail::unpickle_archive(dettrial::detail::read_file_bytes(dir / "io.pt"), dir / "io.pt").toGenericDict();
  const torch::Tensor input = io.at("input").toTensor(), output = io.at("output").toTensor();
  torch::NoGradGuard no_grad;
  for (const char* file : {"plain.pt", "determined", "wrapped.pt"}) {
    CAPTURE(file);
    auto net = network();
    const IncompatibleKeys keys = load_weights(net, dir / file);
    CHECK(keys.empty());
    net->eval();
    CHECK(torch::allclose(net->forward(input), output, /*rtol=*/0, /*atol=*/1e-6));
  }

  // Fine-tuning: the backbone loads, the new head keeps its own values and both lists are given.
  auto net = network();
  const torch::Tensor head_before = net[10]->as<torch::nn::Linear>()->weight.clone();
  CHECK_THROWS_WITH_AS(load_weights(net, dir / "backbone.pt"), doctest::Contains("missing from the file: '10.weight'"), CheckpointError);
  const IncompatibleKeys keys = load_weights(net, dir / "backbone.pt", {.strict = false});
  CHECK(keys.missing_keys == std::vector<std::string>{"10.weight", "10.bias"});
  CHECK(keys.unexpected_keys == std::vector<std::string>{"projection.weight"});
  CHECK(torch::equal(net[10]->as<torch::nn::Linear>()->weight, head_before));
  auto reference = network();
  load_weights(reference, dir / "plain.pt");
  CHECK(torch::equal(net[0]->as<torch::nn::Conv2d>()->weight, reference[0]->as<torch::nn::Conv2d>()->weight));
  CHECK(torch::equal(net[7]->as<torch::nn::Linear>()->bias, reference[7]->as<torch::nn::Linear>()->bias));

  // A shape mismatch is refused, strict or not, and nothing is loaded.
  auto fresh = network();
  const torch::Tensor conv_before = fresh[0]->as<torch::nn::Conv2d>()->weight.clone();
  CHECK_THROWS_WITH_AS(load_weights(fresh, dir / "wrong_shape.pt", {.strict = false}),
                       doctest::Contains("size mismatch: '10.weight' is [5, 50] in the file but [10, 50] in the model"), CheckpointError);
  CHECK(torch::equal(fresh[0]->as<torch::nn::Conv2d>()->weight, conv_before));
  CHECK_THROWS_WITH_AS(load_weights(fresh, dir / "determined", {.model_index = 1}),
                       doctest::Contains("holds 1 model(s); model 1 was asked for"), CheckpointError);
  CHECK_THROWS_WITH_AS(load_weights(fresh, dir / "optimizer.pt"),
                       doctest::Contains("is neither a model's state dict nor a checkpoint holding one: it has 'state', 'param_groups'"),
                       CheckpointError);
  CHECK_THROWS_WITH_AS(load_weights(fresh, dir / "io.pt"), doctest::Contains("not in the model: 'input'"), CheckpointError);
  CHECK_THROWS_WITH_AS(load_weights(fresh, dir / "absent.pt"), doctest::Contains("does not exist"), CheckpointError);
  std::filesystem::remove_all(dir);
}

// torch.optim.Muon's own state (torch.save of its state_dict() after 12 steps, by
// tests/python/muon_reference.py) loads into dettrial::optim::Muon, which steps on to Python's hash.
TEST_CASE("Muon continues from the state torch.optim.Muon saved, to Python's numbers") {
  const std::string python = DETTRIAL_TEST_PYTHON;
  if (python.empty()) return test::skip("no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-python-muon-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string command = "'" + python + "' '" + std::string(test::tests_source_dir()) + "/python/muon_reference.py' '" + dir.string() +
                              "' > '" + (dir / "hashes.txt").string() + "'";
  const int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    std::filesystem::remove_all(dir);
    return test::skip(python + "'s torch has no torch.optim.Muon (it came in torch 2.9)");
  }
  REQUIRE_MESSAGE(status == 0, command);
  std::ifstream hashes(dir / "hashes.txt");
  std::string line;
  std::getline(hashes, line);  // the torch release
  int compared = 0;
  for (int n = 0; std::getline(hashes, line); ++n) {
    if (line.starts_with("// skipped: ")) {  // a configuration this torch's Muon does not have
      MESSAGE(line.substr(3));
      continue;
    }
    ++compared;
    // The configuration and Python's hash after 30 steps.
    const auto reference = muon_problem::reference_hash_line(line);
    REQUIRE_MESSAGE(reference, line);
    const auto& [config, python_hash] = *reference;
    INFO(config);
    const std::filesystem::path file = dir / (std::to_string(n) + ".pt");
    const StateDict saved = dettrial::detail::unpickle_archive(dettrial::detail::read_file_bytes(file), file).toGenericDict();
    std::vector<torch::Tensor> params = muon_problem::muon_params();
    {
      torch::NoGradGuard no_grad;
      params[0].copy_(saved.at("w").toTensor());
      params[1].copy_(saved.at("v").toTensor());
    }
    // Python's defaults: every option of the configuration must come from the file.
    auto opt = std::make_unique<dettrial::optim::Muon>(params);
    dettrial::load_optimizer_state_dict(*opt, saved.at("optimizer").toGenericDict(), file.string());
    std::uint64_t h = std::stoull(saved.at("hash").toStringRef(), nullptr, 16);
    muon_problem::muon_steps(*opt, params, 13, 30, h);
#if TORCH_VERSION_MAJOR >= 2
    CHECK(h == python_hash);
#else
    MESSAGE("LibTorch 1.x with a torch that has Muon: not compared with its hash (other bfloat16 kernels)");
#endif
  }
  CHECK_MESSAGE(compared > 0, (std::string("no configuration of Muon was compared: ") + python + "'s torch refused them all"));
  std::filesystem::remove_all(dir);
}

// Every optimizer dettrial writes in Python's layout loads into torch.optim's own and steps on from it
// exactly as LibTorch's (tests/python/load_optimizers.py, run here with the build's Python).
TEST_CASE("optimizer states in Python's layout load into torch.optim and step on the same") {
  const std::string python = DETTRIAL_TEST_PYTHON;
  if (python.empty()) return test::skip("no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-python-optimizers-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const torch::Tensor input = torch::linspace(-1, 1, 12).reshape({4, 3});
  // Muon steps matrices only: its network has no bias (the file says so by having none).
  auto write = [&](const std::string& name, auto make_optimizer, bool bias = true) {
    torch::nn::Linear net(torch::nn::LinearOptions(3, 2).bias(bias));
    {
      torch::NoGradGuard no_grad;
      net->weight.copy_(torch::linspace(-0.5, 0.5, 6).reshape({2, 3}));
      if (bias) net->bias.copy_(torch::tensor({0.1f, -0.2f}));
    }
    auto optimizer = make_optimizer(net->parameters());
    auto step = [&] {
      optimizer.zero_grad();
      net->forward(input).pow(2).sum().backward();
      optimizer.step();
    };
    step();
    step();
    StateDict d(c10::StringType::get(), c10::AnyType::get());
    // A deep copy: the state dict shares the optimizer's tensors, which the third step changes.
    d.insert("optimizer", dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(optimizer_state_dict(optimizer)), "copy"));
    d.insert("weight", net->weight.detach().clone());
    if (bias) d.insert("bias", net->bias.detach().clone());
    d.insert("input", input);
    step();
    d.insert("next_weight", net->weight.detach().clone());
    if (bias) d.insert("next_bias", net->bias.detach().clone());
    dettrial::detail::write_file_synced(dir / (name + ".pt"), dettrial::detail::pickle_archive(d));
  };
  using namespace torch::optim;
  write("SGD", [](auto p) { return SGD(p, SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true)); });
  write("Adam", [](auto p) { return Adam(p, AdamOptions(0.01).betas({0.8, 0.99}).weight_decay(0.01)); });
  write("AdamW", [](auto p) { return AdamW(p, AdamWOptions(0.01).amsgrad(true)); });
  write("Adagrad", [](auto p) { return Adagrad(p, AdagradOptions(0.1).lr_decay(0.01).initial_accumulator_value(0.1)); });
  write("RMSprop", [](auto p) { return RMSprop(p, RMSpropOptions(0.01).momentum(0.5).centered(true)); });
  write("Adadelta", [](auto p) { return dettrial::optim::Adadelta(p, dettrial::optim::AdadeltaOptions(0.5).rho(0.8).weight_decay(0.01)); });
  using namespace dettrial::optim;
  write("NAdam", [](auto p) { return NAdam(p, NAdamOptions(0.01).weight_decay(0.01).momentum_decay(0.01)); });
  write("RAdam", [](auto p) { return RAdam(p, RAdamOptions(0.01).weight_decay(0.01)); });
  write("Adamax", [](auto p) { return Adamax(p, AdamaxOptions(0.01).betas({0.8, 0.99})); });
  write("Muon", [](auto p) { return Muon(p, MuonOptions(0.02).adjust_lr_fn(MuonLrAdjustment::match_rms_adamw)); }, false);
  // An optimizer of the test's own, its layout declared beside it (rprop.hpp).
  write("Rprop", [](auto p) { return test::Rprop(p, test::RpropOptions(0.02).etas({0.4, 1.3})); });
  const std::string command =
      "'" + python + "' '" + std::string(test::tests_source_dir()) + "/python/load_optimizers.py' '" + dir.string() + "'";
  const int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return test::skip(python + " has no torch");
  CHECK_MESSAGE(status == 0, command);
  if (status == 0) std::filesystem::remove_all(dir);  // else left for a look
}
