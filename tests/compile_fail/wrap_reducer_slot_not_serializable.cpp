// EXPECT: or per_slot_reduce\(\) returning a number, tensor, string or std::vector/std::tuple of them
#include <dettrial/dettrial.hpp>
#include <memory>
// per_slot_reduce returns something that cannot cross processes (not a number, tensor, string or list of them).
struct Handles {
  void reset() {}
  std::shared_ptr<int> per_slot_reduce() const { return nullptr; }
  double cross_slot_reduce(const std::vector<std::shared_ptr<int>>&) const { return 0; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  Handles h;
  c.wrap_reducer(h, "handles");
}
