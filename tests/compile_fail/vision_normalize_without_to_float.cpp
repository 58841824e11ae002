// EXPECT: dettrial::vision::Compose: Normalize works on float images: put ToFloat before it
#include <dettrial/vision.hpp>
int main() { dettrial::vision::Compose pipeline(dettrial::vision::CenterCrop(24), dettrial::vision::Normalize({0.5}, {0.5})); }
