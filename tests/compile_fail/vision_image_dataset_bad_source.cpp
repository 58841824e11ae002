// EXPECT: dettrial::vision::ImageDataset<Source, Transform>: Source must have size\(\), label\(index\)
#include <dettrial/vision.hpp>
struct Files {  // no labels
  std::int64_t size() const { return 1; }
};
int main() { dettrial::vision::ImageDataset data(Files{}, dettrial::vision::Compose(dettrial::vision::ToFloat{})); }
