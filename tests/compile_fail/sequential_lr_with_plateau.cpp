// EXPECT: SequentialLR's schedulers must be dettrial::optim's epoch schedulers \(StepLR, LinearLR, CosineAnnealingLR, OneCycleLR, \.\.\.\):
// not ReduceLROnPlateau
#include <dettrial/dettrial.hpp>
int main() {
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  using namespace dettrial::optim;
  // A plateau scheduler steps with a metric: Python's SequentialLR refuses it too.
  SequentialLR sched(opt, std::tuple{LinearLR(opt), ReduceLROnPlateau(opt)}, {5});
}
