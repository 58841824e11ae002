// EXPECT: dettrial::vision::ImageDataset<Source, Transform, Mixing>: Mixing must be a batch transform
#include <dettrial/vision.hpp>
namespace vision = dettrial::vision;
int main() { vision::ImageDataset data(vision::ImageFolder("images"), vision::Compose(vision::ToFloat{}), 0.2); }
