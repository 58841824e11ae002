// dettrial's concepts, checked at compile time: building this file is the test.
#include <array>
#include <memory>
#include <string>
#include <vector>

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

// ---- dettrial::Trial, piece by piece -------------------------------------------------------------
// Trials assembled from parts: each is a good trial with exactly one hook missing or wrong, and that
// piece of dettrial::Trial (and only it) is false. train_batch and evaluate_batch take the batch
// types of the loaders, so a trial without a training (validation) loader cannot have a
// TrainBatchHook (EvaluationHook) either; those two cases say so.
namespace parts {
using Batch = std::tuple<torch::Tensor>;
using dettrial::Metrics;
inline auto loader() { return dettrial::DataLoader(dettrial::TensorDataset(torch::zeros({4, 1})), {.batch_size = 2}); }

template <class... Parts>
struct TrialOf : Parts... {};

struct TrainLoader {
  auto build_training_data_loader() { return loader(); }
};
struct TrainLoaderNotALoader {
  std::vector<Batch> build_training_data_loader() { return {}; }
};
struct ValidationLoader {
  auto build_validation_data_loader() { return loader(); }
};
struct ValidationLoaderNotALoader {
  int build_validation_data_loader() { return 0; }
};

// Imperative hooks (the model is the trial's own).
struct TrainBatch {
  Metrics train_batch(Batch&, std::int64_t, std::int64_t) { return {}; }
};
struct TrainBatchTensor {
  torch::Tensor train_batch(Batch&, std::int64_t, std::int64_t) { return {}; }
};
struct TrainBatchWrongBatch {
  Metrics train_batch(std::string&, std::int64_t, std::int64_t) { return {}; }
};
struct TrainBatchNotMetrics {
  double train_batch(Batch&, std::int64_t, std::int64_t) { return 0; }
};
struct EvaluateBatch {
  Metrics evaluate_batch(Batch&) { return {}; }
};
struct EvaluateBatchIdx {
  Metrics evaluate_batch(Batch&, std::int64_t) { return {}; }
};
struct EvaluateBatchWrongBatch {
  Metrics evaluate_batch(std::string&) { return {}; }
};
struct EvaluateBatchNotMetrics {
  double evaluate_batch(Batch&) { return 0; }
};
struct EvaluateFullDataset {
  template <class L>
  Metrics evaluate_full_dataset(L&) {
    return {};
  }
};
struct EvaluateFullDatasetWrongArgs {
  Metrics evaluate_full_dataset(int) { return {}; }
};
struct EvaluateFullDatasetNotMetrics {
  template <class L>
  double evaluate_full_dataset(L&) {
    return 0;
  }
};

// Declarative hooks. train_batch and evaluate_batch take any model, so a wrong model hook does not
// make them uncallable too.
struct Model {
  torch::nn::Linear build_model() { return torch::nn::Linear(1, 1); }
};
struct ModelNotAModule {
  torch::Tensor build_model() { return torch::zeros({1}); }
};
struct Optimizer {
  torch::optim::SGD optimizer(torch::nn::Linear& m) { return torch::optim::SGD(m->parameters(), 0.1); }
};
struct OptimizerForAnyModel {
  torch::optim::SGD optimizer(auto&) { return torch::optim::SGD(std::vector<torch::Tensor>{}, 0.1); }
};
struct OptimizerPointer {
  std::unique_ptr<torch::optim::Adam> optimizer(torch::nn::Linear& m) { return std::make_unique<torch::optim::Adam>(m->parameters()); }
};
struct OptimizerNotAnOptimizer {
  torch::nn::Linear optimizer(torch::nn::Linear& m) { return m; }
};
struct Scheduler {
  torch::optim::StepLR lr_scheduler(torch::optim::SGD& o) { return torch::optim::StepLR(o, 1); }
};
struct ScheduledScheduler {
  auto lr_scheduler(torch::optim::SGD& o) { return dettrial::scheduled(torch::optim::StepLR(o, 1), dettrial::lr_step::every_epoch{}); }
};
struct SchedulerNotAScheduler {
  double lr_scheduler(torch::optim::SGD&) { return 0.1; }
};
struct ModelTrainBatch {
  Metrics train_batch(Batch&, auto&, std::int64_t, std::int64_t) { return {}; }
};
struct ModelEvaluateBatch {
  Metrics evaluate_batch(Batch&, auto&) { return {}; }
};
struct ModelEvaluateFullDataset {
  template <class L, class M>
  Metrics evaluate_full_dataset(L&, M&) {
    return {};
  }
};

using Imperative = TrialOf<TrainLoader, ValidationLoader, TrainBatch, EvaluateBatch>;
using Declarative = TrialOf<TrainLoader, ValidationLoader, Model, Optimizer, ModelTrainBatch, ModelEvaluateBatch>;

/// The five pieces of dettrial::Trial, in the order Trial lists them.
template <class T>
constexpr std::array<bool, 5> pieces{dettrial::TrainingDataLoaderHook<T>, dettrial::ValidationDataLoaderHook<T>, dettrial::ModelHooks<T>,
                                     dettrial::TrainBatchHook<T>, dettrial::EvaluationHook<T>};
constexpr std::array<bool, 5> all{true, true, true, true, true};
constexpr std::array<bool, 5> no_training_loader{false, true, true, false, true};    // no batch type for train_batch
constexpr std::array<bool, 5> no_validation_loader{true, false, true, true, false};  // no batch type for evaluate_batch
constexpr std::array<bool, 5> no_model_hooks{true, true, false, true, true};
constexpr std::array<bool, 5> no_train_batch{true, true, true, false, true};
constexpr std::array<bool, 5> no_evaluation{true, true, true, true, false};

/// Trial<T> says the same as the trainer's diagnostics, and names the problem expected.
template <class T>
constexpr bool diagnosed_as(dettrial::detail::TrialProblem p) {
  return dettrial::detail::first_trial_problem<T>() == p && dettrial::Trial<T> == (p == dettrial::detail::TrialProblem::none);
}
using P = dettrial::detail::TrialProblem;
}  // namespace parts

// Good trials of both styles, and the variants each hook allows.
static_assert(parts::pieces<parts::Imperative> == parts::all && parts::diagnosed_as<parts::Imperative>(parts::P::none));
static_assert(dettrial::ImperativeTrial<parts::Imperative> && !dettrial::DeclarativeTrial<parts::Imperative>);
static_assert(parts::pieces<parts::Declarative> == parts::all && parts::diagnosed_as<parts::Declarative>(parts::P::none));
static_assert(dettrial::DeclarativeTrial<parts::Declarative> && !dettrial::ImperativeTrial<parts::Declarative>);
static_assert(
    dettrial::Trial<parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatchTensor, parts::EvaluateBatchIdx>>);
static_assert(dettrial::Trial<parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateFullDataset>>);
static_assert(dettrial::DeclarativeTrial<parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::OptimizerPointer,
                                                        parts::ModelTrainBatch, parts::ModelEvaluateFullDataset>>);
static_assert(dettrial::DeclarativeTrial<parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::Optimizer,
                                                        parts::Scheduler, parts::ModelTrainBatch, parts::ModelEvaluateBatch>>);
static_assert(dettrial::DeclarativeTrial<parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::Optimizer,
                                                        parts::ScheduledScheduler, parts::ModelTrainBatch, parts::ModelEvaluateBatch>>);
static_assert(dettrial::ModelHooks<test::ImperativeRegression> && !dettrial::DeclaresOptimizer<test::ImperativeRegression>);
static_assert(dettrial::OptimizerHook<test::DeclarativeRegression> && !dettrial::DeclaresLRScheduler<test::DeclarativeRegression>);

// TrainingDataLoaderHook
using NoTrainingLoader = parts::TrialOf<parts::ValidationLoader, parts::TrainBatch, parts::EvaluateBatch>;
static_assert(parts::pieces<NoTrainingLoader> == parts::no_training_loader && !dettrial::DeclaresTrainingDataLoader<NoTrainingLoader>);
static_assert(parts::diagnosed_as<NoTrainingLoader>(parts::P::no_training_loader));
using TrainingLoaderNotALoader =
    parts::TrialOf<parts::TrainLoaderNotALoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateBatch>;
static_assert(parts::pieces<TrainingLoaderNotALoader> == parts::no_training_loader &&
              dettrial::DeclaresTrainingDataLoader<TrainingLoaderNotALoader>);
static_assert(parts::diagnosed_as<TrainingLoaderNotALoader>(parts::P::training_loader_not_a_loader));

// ValidationDataLoaderHook
using NoValidationLoader = parts::TrialOf<parts::TrainLoader, parts::TrainBatch, parts::EvaluateBatch>;
static_assert(parts::pieces<NoValidationLoader> == parts::no_validation_loader &&
              !dettrial::DeclaresValidationDataLoader<NoValidationLoader>);
static_assert(parts::diagnosed_as<NoValidationLoader>(parts::P::no_validation_loader));
using ValidationLoaderNotALoader =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoaderNotALoader, parts::TrainBatch, parts::EvaluateBatch>;
static_assert(parts::pieces<ValidationLoaderNotALoader> == parts::no_validation_loader);
static_assert(parts::diagnosed_as<ValidationLoaderNotALoader>(parts::P::validation_loader_not_a_loader));

// ModelHooks
using ModelNotAModule = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::ModelNotAModule, parts::OptimizerForAnyModel,
                                       parts::ModelTrainBatch, parts::ModelEvaluateBatch>;
static_assert(parts::pieces<ModelNotAModule> == parts::no_model_hooks && !dettrial::BuildModelHook<ModelNotAModule>);
static_assert(dettrial::OptimizerHook<ModelNotAModule> && parts::diagnosed_as<ModelNotAModule>(parts::P::model_not_a_module));
using NoOptimizer =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::ModelTrainBatch, parts::ModelEvaluateBatch>;
static_assert(parts::pieces<NoOptimizer> == parts::no_model_hooks && !dettrial::DeclaresOptimizer<NoOptimizer>);
static_assert(dettrial::BuildModelHook<NoOptimizer> && parts::diagnosed_as<NoOptimizer>(parts::P::no_optimizer));
using OptimizerNotAnOptimizer = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::OptimizerNotAnOptimizer,
                                               parts::ModelTrainBatch, parts::ModelEvaluateBatch>;
static_assert(parts::pieces<OptimizerNotAnOptimizer> == parts::no_model_hooks && dettrial::DeclaresOptimizer<OptimizerNotAnOptimizer>);
static_assert(!dettrial::OptimizerHook<OptimizerNotAnOptimizer> &&
              parts::diagnosed_as<OptimizerNotAnOptimizer>(parts::P::optimizer_not_an_optimizer));
using SchedulerNotAScheduler = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::Optimizer,
                                              parts::SchedulerNotAScheduler, parts::ModelTrainBatch, parts::ModelEvaluateBatch>;
static_assert(parts::pieces<SchedulerNotAScheduler> == parts::no_model_hooks && dettrial::DeclaresLRScheduler<SchedulerNotAScheduler>);
static_assert(!dettrial::LRSchedulerHook<SchedulerNotAScheduler> &&
              parts::diagnosed_as<SchedulerNotAScheduler>(parts::P::scheduler_not_a_scheduler));

// TrainBatchHook
using NoTrainBatch = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::EvaluateBatch>;
static_assert(parts::pieces<NoTrainBatch> == parts::no_train_batch && parts::diagnosed_as<NoTrainBatch>(parts::P::no_train_batch));
using TrainBatchWrongBatch = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatchWrongBatch, parts::EvaluateBatch>;
static_assert(parts::pieces<TrainBatchWrongBatch> == parts::no_train_batch && dettrial::DeclaresTrainBatch<TrainBatchWrongBatch>);
static_assert(parts::diagnosed_as<TrainBatchWrongBatch>(parts::P::train_batch_not_callable));
using TrainBatchNotMetrics = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatchNotMetrics, parts::EvaluateBatch>;
static_assert(parts::pieces<TrainBatchNotMetrics> == parts::no_train_batch && dettrial::CallableTrainBatch<TrainBatchNotMetrics>);
static_assert(parts::diagnosed_as<TrainBatchNotMetrics>(parts::P::train_batch_not_metrics));
using DeclarativeNoTrainBatch =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::Optimizer, parts::ModelEvaluateBatch>;
static_assert(parts::pieces<DeclarativeNoTrainBatch> == parts::no_train_batch &&
              parts::diagnosed_as<DeclarativeNoTrainBatch>(parts::P::no_train_batch));
using DeclarativeImperativeTrainBatch =  // the imperative signature in a declarative trial
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::Model, parts::Optimizer, parts::TrainBatch,
                   parts::ModelEvaluateBatch>;
static_assert(parts::pieces<DeclarativeImperativeTrainBatch> == parts::no_train_batch);
static_assert(parts::diagnosed_as<DeclarativeImperativeTrainBatch>(parts::P::train_batch_not_callable));

// EvaluationHook
using NoEvaluation = parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch>;
static_assert(parts::pieces<NoEvaluation> == parts::no_evaluation && parts::diagnosed_as<NoEvaluation>(parts::P::no_evaluate_hook));
using BothEvaluations =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateBatch, parts::EvaluateFullDataset>;
static_assert(parts::pieces<BothEvaluations> == parts::no_evaluation &&
              parts::diagnosed_as<BothEvaluations>(parts::P::both_evaluate_hooks));
static_assert(dettrial::EvaluateBatchHook<BothEvaluations> && dettrial::EvaluateFullDatasetHook<BothEvaluations>);
using EvaluateBatchWrongBatch =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateBatchWrongBatch>;
static_assert(parts::pieces<EvaluateBatchWrongBatch> == parts::no_evaluation && !dettrial::EvaluateBatchHook<EvaluateBatchWrongBatch>);
static_assert(parts::diagnosed_as<EvaluateBatchWrongBatch>(parts::P::evaluate_batch_not_callable));
using EvaluateBatchNotMetrics =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateBatchNotMetrics>;
static_assert(parts::pieces<EvaluateBatchNotMetrics> == parts::no_evaluation && dettrial::CallableEvaluateBatch<EvaluateBatchNotMetrics>);
static_assert(parts::diagnosed_as<EvaluateBatchNotMetrics>(parts::P::evaluate_batch_not_metrics));
using EvaluateFullDatasetWrongArgs =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateFullDatasetWrongArgs>;
static_assert(parts::pieces<EvaluateFullDatasetWrongArgs> == parts::no_evaluation &&
              !dettrial::EvaluateFullDatasetHook<EvaluateFullDatasetWrongArgs>);
static_assert(parts::diagnosed_as<EvaluateFullDatasetWrongArgs>(parts::P::evaluate_full_dataset_not_callable));
using EvaluateFullDatasetNotMetrics =
    parts::TrialOf<parts::TrainLoader, parts::ValidationLoader, parts::TrainBatch, parts::EvaluateFullDatasetNotMetrics>;
static_assert(parts::pieces<EvaluateFullDatasetNotMetrics> == parts::no_evaluation);
static_assert(parts::diagnosed_as<EvaluateFullDatasetNotMetrics>(parts::P::evaluate_full_dataset_not_metrics));

// A type with none of the hooks fails every piece except ModelHooks (it builds no model).
static_assert(parts::pieces<int> == std::array{false, false, true, false, false});
