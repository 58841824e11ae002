// EXPECT: on_training_workload_end is declared but cannot be called as on_training_workload_end\(const MetricValues&\) or
#include "../unit/test_trials.hpp"
// The workload hook with a parameter type the trainer never passes.
struct CountsWorkloads {
  void on_training_workload_end(const std::vector<double>&) {}
};
int main() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  CountsWorkloads cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
