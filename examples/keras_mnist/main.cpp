// SPDX-License-Identifier: Apache-2.0
// Trains the Keras-style MNIST trial from the tutorial's own experiment config:
//   keras_mnist --config examples/keras_mnist/const.yaml
#include <dettrial/main.hpp>

#include "mnist_keras_trial.hpp"

int main(int argc, char** argv) { return dettrial::main<keras_mnist::MnistKerasTrial>(argc, argv); }
