// EXPECT: TrainerKey::TrainerKey\(\)[^ ]* is private within this context
// A trial (or any code but dettrial::Trainer) cannot end a batch, move the run's position or step
// the schedulers behind the trainer's back: each of the Context's trainer-only calls takes a key
// only a Trainer can make.
#include <dettrial/dettrial.hpp>
struct Sneaky {
  dettrial::Context& context;
  torch::nn::Linear model;
  torch::optim::SGD opt;
  explicit Sneaky(dettrial::Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(1, 1))), opt(model->parameters(), 0.1) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t batch_idx) {
    dettrial::detail::ContextAccess::finish_batch(dettrial::detail::TrainerKey{}, context);
    (void)batch_idx;
    return {};
  }
  dettrial::Metrics evaluate_batch(std::tuple<torch::Tensor>&) { return {}; }
};
int main() {
  dettrial::Context c(dettrial::Hyperparameters{});
  dettrial::Trainer<Sneaky> t(c);
}
