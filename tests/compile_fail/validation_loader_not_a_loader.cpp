// EXPECT: T::build_validation_data_loader\(\) must return a dettrial::BatchLoader
#include <dettrial/dettrial.hpp>
struct Bad {
  explicit Bad(dettrial::Context&) {}
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return dettrial::TensorDataset(torch::zeros({4, 1})); }  // a dataset, not a loader
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t) { return {}; }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {}; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Bad> t(c);
}
