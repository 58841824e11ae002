// EXPECT: step_optimizer: the clip argument must be callable with std::vector<torch::Tensor>&
#include <dettrial/dettrial.hpp>
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  torch::nn::Linear model(1, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  c.wrap_optimizer(opt);
  c.step_optimizer(opt, 1.0);  // a max norm, not dettrial::clip::by_norm{1.0}
}
