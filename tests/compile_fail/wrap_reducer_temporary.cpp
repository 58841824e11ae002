// EXPECT: a reducer object must outlive the trainer, so pass a member of the trial \(an lvalue\), not a temporary
#include <dettrial/dettrial.hpp>
struct Count {
  double n = 0;
  void reset() { n = 0; }
  double reduce() const { return n; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  c.wrap_reducer(Count{}, "count");  // dies at the end of this statement
}
