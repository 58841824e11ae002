// EXPECT: on_checkpoint_save_start is declared but cannot be called as on_checkpoint_save_start\(StateDict&\)
#include "../unit/test_trials.hpp"
// A real hook, mistyped: the trainer hands a state dict, not a path. Never silently not called.
struct SavesExtra {
  void on_validation_end(const dettrial::MetricValues&) {}
  void on_checkpoint_save_start(const std::string& path) { (void)path; }
};
int main() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  SavesExtra cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
