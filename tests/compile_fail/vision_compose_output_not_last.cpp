// EXPECT: dettrial::vision::Compose: ToFloat and Normalize come last
#include <dettrial/vision.hpp>
int main() { dettrial::vision::Compose pipeline(dettrial::vision::ToFloat{}, dettrial::vision::RandomHorizontalFlip{}); }
