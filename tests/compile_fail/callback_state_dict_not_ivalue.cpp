// EXPECT: state_dict is declared but state_dict\(\) does not return something convertible to c10::IValue
#include "../unit/test_trials.hpp"
// A callback's state must be something a checkpoint can store: a plain struct is not.
struct Counts {
  std::int64_t validations = 0;
};
struct CountsValidations {
  Counts counts;
  void on_validation_end(const dettrial::MetricValues&) { ++counts.validations; }
  Counts state_dict() const { return counts; }
  void load_state_dict(const c10::IValue&) {}
};
int main() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  CountsValidations cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
