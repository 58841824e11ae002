// EXPECT: dettrial::Context::wrap_lr_scheduler<S>: S must have step\(\)
#include <dettrial/dettrial.hpp>
// Checkpointable, but advanced with advance() instead of step().
struct Warmup {
  std::int64_t steps = 0;
  void advance() { ++steps; }
  void save(torch::serialize::OutputArchive& archive) const { archive.write("steps", c10::IValue(steps)); }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue v;
    archive.read("steps", v);
    steps = v.toInt();
  }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  Warmup w;
  c.wrap_lr_scheduler(w, dettrial::lr_step::every_batch{});
}
