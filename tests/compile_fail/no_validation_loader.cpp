// EXPECT: T has no build_validation_data_loader\(\) hook
#include <dettrial/dettrial.hpp>
struct Bad {
  explicit Bad(dettrial::Context&) {}
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t) { return {}; }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {}; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Bad> t(c);
}
