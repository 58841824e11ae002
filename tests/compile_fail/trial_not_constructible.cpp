// EXPECT: T must be constructible from \(dettrial::Context&, args\.\.\.\) or from \(args\.\.\.\)
#include <dettrial/dettrial.hpp>
struct Bad {
  dettrial::Context& c;
  torch::nn::Linear model;
  torch::optim::SGD opt;
  Bad(dettrial::Context& ctx, std::int64_t width)
      : c(ctx), model(ctx.wrap_model(torch::nn::Linear(width, 1))), opt(model->parameters(), 0.1) {}
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t) { return {}; }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {}; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Bad> t(c);  // the constructor's width is not passed
}
