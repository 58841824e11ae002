// EXPECT: T defines both evaluate_batch and evaluate_full_dataset. define exactly one of them
#include <dettrial/dettrial.hpp>
struct Bad {
  explicit Bad(dettrial::Context&) {}
  torch::nn::Linear build_model() { return torch::nn::Linear(1, 1); }
  torch::optim::SGD optimizer(torch::nn::Linear& m) { return torch::optim::SGD(m->parameters(), 0.1); }
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, torch::nn::Linear&, std::int64_t, std::int64_t) { return {}; }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor>&, torch::nn::Linear&) { return {}; }
  template <class L>
  dettrial::Metrics evaluate_full_dataset(L&, torch::nn::Linear&) {
    return {};
  }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Bad> t(c);
}
