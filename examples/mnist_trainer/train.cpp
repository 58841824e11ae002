// SPDX-License-Identifier: Apache-2.0
// Seed 004's train.py in C++ (the PyTorch Trainer API's style: a main of one's own, no
// dettrial::main): one program that trains locally or as a trial of an experiment.
//   mnist_trainer [--data DIR]                     local: const.yaml's hyperparameters, 100 batches
//   mnist_trainer --config const.yaml [--resume DIR] [--data DIR]
//                                                  as a trial: the config's hyperparameters, its
//                                                  searcher's length, from the latest checkpoint
// The digits: a folder in MNIST's layout (default Debian's Fashion-MNIST); --holdout N validates on
// the last N records of the training split instead of the t10k split.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include <dettrial/dettrial.hpp>

#include "mnist_trial.hpp"

namespace {

struct Arguments {
  std::optional<std::filesystem::path> config, resume;
  mnist_trainer::DataSource data;
  std::filesystem::path output = "runs/mnist-trainer";
};

Arguments parse(int argc, char** argv) {
  Arguments a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw dettrial::ConfigError("'" + flag + "' needs a value (--config, --resume, --data, --holdout, --output)");
    const std::string value = argv[++i];
    if (flag == "--config") a.config = value;
    else if (flag == "--resume") a.resume = value;
    else if (flag == "--data") a.data.dir = value;
    else if (flag == "--holdout") {
      a.data.train_split = a.data.validation_split;
      a.data.holdout = std::stoll(value);
    } else if (flag == "--output") a.output = value;
    else throw dettrial::ConfigError("unknown flag '" + flag + "' (--config, --resume, --data, --holdout, --output)");
  }
  return a;
}

/// train.py's run(local): the same trial either way; what differs is where the hyperparameters,
/// the length and the checkpoint to start from come from.
int run(const Arguments& args) {
  const bool local = !args.config;
  // For convenience, local mode uses const.yaml's hyperparameters (compiled in: the example has no
  // working directory to read it from).
  const dettrial::ExperimentConfig config = local ? dettrial::ExperimentConfig::parse(R"(
hyperparameters: {learning_rate: 1.0, n_filters1: 32, n_filters2: 64, dropout1: 0.25, dropout2: 0.5}
)",
                                                                                      "train.cpp")
                                                  : dettrial::ExperimentConfig::load_file(*args.config);
  const auto context = dettrial::init({.exp_conf = config});
  dettrial::Trainer<mnist_trainer::MNistTrial> trainer(*context, context->get_hparams(), args.data);
  // Local: 100 batches and no checkpoint to start from. As a trial: the searcher's length (max_length
  // unset) and the latest checkpoint, for pause and resume.
  const dettrial::FitResult result = trainer.fit({.max_length = local ? std::optional(dettrial::Batch(100)) : std::nullopt,
                                                  .validation_period = dettrial::Batch(100),
                                                  .latest_checkpoint = args.resume,
                                                  .output_dir = args.output});
  std::printf("validation accuracy %.4f after %lld batches\n", result.last_validation_metrics.at("accuracy"),
              static_cast<long long>(result.batches_trained));
  return result.signal != 0 ? 75 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const dettrial::ConfigError& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 78;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
}
