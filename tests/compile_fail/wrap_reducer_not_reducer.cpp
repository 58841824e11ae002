// EXPECT: the reducer must have reset\(\) and either reduce\(\) returning a number or dettrial::MetricValues
#include <dettrial/dettrial.hpp>
// A reducer without reset(): neither a reducer object nor a function of the values.
struct Accuracy {
  double correct = 0, total = 0;
  double reduce() const { return correct / total; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  Accuracy a;
  c.wrap_reducer(a, "accuracy");
}
