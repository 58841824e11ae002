// SPDX-License-Identifier: Apache-2.0
// Trains the MNIST trial from an experiment config:  mnist --config examples/mnist/fashion.yaml
#include <dettrial/main.hpp>

#include "mnist_trial.hpp"

int main(int argc, char** argv) { return dettrial::main<mnist::MnistTrial>(argc, argv); }
