// EXPECT: checkpoints must restore S, so S must derive from torch::optim::LRScheduler or have save
#include <dettrial/dettrial.hpp>
// A scheduler with step() but no state a checkpoint could save.
struct Warmup {
  void step() {}
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  Warmup w;
  c.wrap_lr_scheduler(w, dettrial::lr_step::every_batch{});
}
