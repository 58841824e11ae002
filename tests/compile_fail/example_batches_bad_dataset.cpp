// EXPECT: dettrial::ExampleBatches<D>: D must have size\(\) and get\(index\)
#include <dettrial/dettrial.hpp>
// One record at a time, but read with operator[] instead of get(index).
struct Squares {
  std::int64_t size() const { return 8; }
  torch::Tensor operator[](std::int64_t i) const { return torch::tensor(static_cast<double>(i * i)); }
};
int main() { dettrial::ExampleBatches<Squares> batches(Squares{}); }
