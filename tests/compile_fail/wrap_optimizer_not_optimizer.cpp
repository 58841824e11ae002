// EXPECT: dettrial::Context::wrap_optimizer<O>: O must derive from torch::optim::Optimizer
#include <dettrial/dettrial.hpp>
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  torch::nn::Linear model(1, 1);
  c.wrap_optimizer(model);
}
