// EXPECT: wrap_reducer\(fn, name\): fn must return a number or dettrial::MetricValues
#include <dettrial/dettrial.hpp>
#include <string>
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  c.wrap_reducer([](const std::vector<double>&) { return std::string("high"); }, "mood");
}
