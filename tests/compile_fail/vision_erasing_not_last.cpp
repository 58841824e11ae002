// EXPECT: dettrial::vision::Compose: RandomErasing comes last: it erases the batch's image after ToFloat and Normalize
#include <dettrial/vision.hpp>
namespace vision = dettrial::vision;
int main() { vision::Compose pipeline(vision::ToFloat{}, vision::RandomErasing{}, vision::Normalize({0.5}, {0.5})); }
