// dettrial's concepts, checked at compile time: building this file is the test.
#include <dettrial/dettrial.hpp>

#include "../unit/test_trials.hpp"

namespace {
struct NoEvaluate {
  dettrial::Context& c;
  auto build_training_data_loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4})), {.batch_size = 2}); }
  auto build_validation_data_loader() { return build_training_data_loader(); }
  dettrial::Metrics train_batch(std::tuple<torch::Tensor>&, std::int64_t, std::int64_t) { return {}; }
};
struct NotALoader {
  int size() { return 0; }
};
struct HookLess {
  void on_epoch_end() {}  // not a dettrial hook name
};
struct Hooked {
  void on_validation_end(const dettrial::MetricValues&) {}
};
}  // namespace

static_assert(dettrial::Trial<test::DeclarativeRegression>);
static_assert(dettrial::DeclarativeTrial<test::DeclarativeRegression>);
static_assert(!dettrial::ImperativeTrial<test::DeclarativeRegression>);
static_assert(dettrial::ImperativeTrial<test::ImperativeRegression>);
static_assert(!dettrial::Trial<NoEvaluate>);
static_assert(dettrial::detail::first_trial_problem<NoEvaluate>() == dettrial::detail::TrialProblem::no_evaluate_hook);
static_assert(!dettrial::Trial<int>);
static_assert(dettrial::BatchLoader<dettrial::DataLoader<dettrial::TensorDataset<2>>>);
static_assert(!dettrial::BatchLoader<NotALoader>);
static_assert(dettrial::BatchDataset<dettrial::TensorDataset<3>>);
static_assert(dettrial::ModelHandle<torch::nn::Sequential>);
static_assert(dettrial::ModelHandle<std::shared_ptr<torch::nn::LinearImpl>>);
static_assert(!dettrial::ModelHandle<torch::Tensor>);
static_assert(dettrial::TorchOptimizer<torch::optim::Adam>);
static_assert(!dettrial::TorchOptimizer<torch::nn::Sequential>);
static_assert(dettrial::MetricsResult<dettrial::Metrics> && dettrial::MetricsResult<torch::Tensor>);
static_assert(!dettrial::MetricsResult<double>);
static_assert(dettrial::LRStepMode<dettrial::lr_step::every_epoch>);
static_assert(dettrial::GradientClipper<dettrial::clip::by_norm>);
static_assert(dettrial::Callback<Hooked>);
static_assert(!dettrial::Callback<HookLess>);
static_assert(std::is_same_v<dettrial::training_batch_t<test::ImperativeRegression>, std::tuple<torch::Tensor, torch::Tensor>>);
