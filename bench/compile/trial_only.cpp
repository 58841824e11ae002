// SPDX-License-Identifier: Apache-2.0
// A dettrial trial TU without the command line: the MNIST example's trial, a Context from its
// experiment config and Trainer<MnistTrial>::fit (what a project that writes its own main compiles).
#include "mnist/mnist_trial.hpp"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  dettrial::Context context(dettrial::ExperimentConfig::load_file(argv[1]));
  dettrial::Trainer<mnist::MnistTrial> trainer(context);
  trainer.fit(dettrial::FitOptions::from_config(context.get_experiment_config()));
}
