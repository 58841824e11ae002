// EXPECT: dettrial::Context::wrap_model<M>: M must be a LibTorch module holder
#include <dettrial/dettrial.hpp>
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  torch::Tensor weights = torch::zeros({4, 1});
  c.wrap_model(weights);  // a tensor, not a module
}
