// EXPECT: this type has none of dettrial's callback hooks
#include "../unit/test_trials.hpp"
struct Misspelt {
  void on_epoch_end(std::int64_t) {}
};
int main() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  Misspelt cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
