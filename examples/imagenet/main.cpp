// SPDX-License-Identifier: Apache-2.0
// The porting guide's ImageNet trial:  imagenet --config examples/imagenet/const.yaml
#include <dettrial/main.hpp>

#include "imagenet_trial.hpp"

int main(int argc, char** argv) { return dettrial::main<imagenet::ImageNetTrial>(argc, argv); }
