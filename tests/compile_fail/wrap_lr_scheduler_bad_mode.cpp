// EXPECT: wrap_lr_scheduler: the mode must be a dettrial::lr_step policy
#include <dettrial/dettrial.hpp>
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  torch::nn::Linear model(1, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::optim::StepLR scheduler(opt, 1);
  c.wrap_lr_scheduler(scheduler, "every_epoch");  // a name, not dettrial::lr_step::every_epoch{}
}
