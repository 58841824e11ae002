// Every hook of the callback table (vocabulary/callbacks.hpp) declared with a parameter the trainer
// never passes, one callback type per hook, all in one translation unit: each must give its own
// sentence naming the hook (one compile checks all fourteen; see tests/CMakeLists.txt).
#include "../../unit/test_trials.hpp"

// A callback declaring HOOK wrongly, plus one hook declared right (so that it is a callback at all).
#define DETTRIAL_MISTYPED(HOOK, RIGHT_HOOK) \
  struct Mistyped_##HOOK {                  \
    RIGHT_HOOK                              \
    void HOOK(std::vector<double>*) {}      \
  };
#define DETTRIAL_RIGHT_VALIDATION_END \
  void on_validation_end(const dettrial::MetricValues&) {}
DETTRIAL_MISTYPED(on_trial_startup, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_trial_shutdown, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_training_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_training_epoch_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_training_epoch_end, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_validation_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_validation_epoch_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_validation_epoch_end, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_validation_end, void on_training_start(){})
DETTRIAL_MISTYPED(on_checkpoint_save_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_checkpoint_write_end, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_checkpoint_upload_end, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(on_checkpoint_load_start, DETTRIAL_RIGHT_VALIDATION_END)
DETTRIAL_MISTYPED(load_state_dict, DETTRIAL_RIGHT_VALIDATION_END)

template <class Callback>
void fit_with() {
  dettrial::Context c(test::hparams());
  dettrial::Trainer<test::ImperativeRegression> t(c);
  Callback cb;
  t.fit({.max_length = dettrial::Batch(1)}, cb);
}
template <class... Callbacks>
void fit_with_each() {
  (fit_with<Callbacks>(), ...);
}

int main() {
  fit_with_each<Mistyped_on_trial_startup, Mistyped_on_trial_shutdown, Mistyped_on_training_start, Mistyped_on_training_epoch_start,
                Mistyped_on_training_epoch_end, Mistyped_on_validation_start, Mistyped_on_validation_epoch_start,
                Mistyped_on_validation_epoch_end, Mistyped_on_validation_end, Mistyped_on_checkpoint_save_start,
                Mistyped_on_checkpoint_write_end, Mistyped_on_checkpoint_upload_end, Mistyped_on_checkpoint_load_start,
                Mistyped_load_state_dict>();
}
