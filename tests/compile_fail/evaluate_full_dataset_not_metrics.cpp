// EXPECT: T::evaluate_full_dataset must return dettrial::Metrics
#include <dettrial/dettrial.hpp>
struct Bad {
  dettrial::Context& c;
  torch::nn::Linear model;
  torch::optim::SGD opt;
  explicit Bad(dettrial::Context& ctx) : c(ctx), model(ctx.wrap_model(torch::nn::Linear(1, 1))), opt(model->parameters(), 0.1) {}
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t) { return {}; }
  // A number, not named metrics.
  template <class L>
  double evaluate_full_dataset(L&) {
    return 0.5;
  }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Bad> t(c);
}
