// SPDX-License-Identifier: Apache-2.0
// Trains a ResNet on an ImageFolder of image files:  image_folder --config examples/image_folder/png.yaml
#include <dettrial/main.hpp>

#include "image_folder_trial.hpp"

int main(int argc, char** argv) { return dettrial::main<image_folder::ImageFolderTrial>(argc, argv); }
