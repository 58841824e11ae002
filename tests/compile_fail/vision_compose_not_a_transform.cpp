// EXPECT: dettrial::vision::Compose: every step must be an image transform
#include <dettrial/vision.hpp>
struct Rotate {  // takes no RecordRandom: not a transform
  dettrial::vision::Image operator()(dettrial::vision::Image image) const { return image; }
};
int main() { dettrial::vision::Compose pipeline(Rotate{}, dettrial::vision::ToFloat{}); }
