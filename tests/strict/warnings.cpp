// dettrial's headers and the examples in one translation unit, compiled with -Wall -Wextra
// -Wpedantic -Werror (tests/CMakeLists.txt): a user's strict build must not fail on dettrial's code
// or on code written the way the README writes it (designated initializers that leave options out).
#define main mnist_example_main
#include "../../examples/mnist/main.cpp"
#undef main
#define main regression_example_main
#include "../../examples/regression/main.cpp"
#undef main
// dettrial::main itself was renamed with the first example's main (its header was read under the macro).
#include "../../examples/keras_mnist/mnist_keras_trial.hpp"
int keras_example_main(int argc, char** argv) { return dettrial::mnist_example_main<keras_mnist::MnistKerasTrial>(argc, argv); }
// The image example, and with it <dettrial/vision.hpp>'s decoders, datasets and transforms.
#include "../../examples/image_folder/image_folder_trial.hpp"
int image_example_main(int argc, char** argv) { return dettrial::mnist_example_main<image_folder::ImageFolderTrial>(argc, argv); }
// The porting guide's ImageNet trial, with torchvision's ResNets.
#include "../../examples/imagenet/imagenet_trial.hpp"
int imagenet_example_main(int argc, char** argv) { return dettrial::mnist_example_main<imagenet::ImageNetTrial>(argc, argv); }
// The GPT example, with <dettrial/tokens.hpp>.
#include "../../examples/gpt/gpt_trial.hpp"
int gpt_example_main(int argc, char** argv) { return dettrial::mnist_example_main<gpt::GptTrial>(argc, argv); }

int main(int argc, char** argv) {
  return argc > 99 ? mnist_example_main(argc, argv) + regression_example_main() + keras_example_main(argc, argv) +
                         image_example_main(argc, argv) + imagenet_example_main(argc, argv) + gpt_example_main(argc, argv)
                   : 0;
}
