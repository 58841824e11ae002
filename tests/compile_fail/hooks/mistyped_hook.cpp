// Built once per callback hook (CMake defines DETTRIAL_TEST_HOOK): a callback declaring that hook with
// a parameter the trainer never passes must not compile, and the one sentence names the hook.
#include "../../unit/test_trials.hpp"

struct Mistyped {
  // A hook declared right, so that the type is a callback at all (a different one when the hook
  // under test is this one).
#if DETTRIAL_TEST_HOOK_IS_ON_VALIDATION_END
  void on_training_start() {}
#else
  void on_validation_end(const dettrial::MetricValues&) {}
#endif
  void DETTRIAL_TEST_HOOK(std::vector<double>*) {}
};

int main() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  Mistyped cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
