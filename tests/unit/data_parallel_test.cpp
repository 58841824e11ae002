// Data parallel on uneven data: 2 and 3 ranks (Gloo, CPU) whose batches per epoch do not divide by
// the rank count, with no seed, epoch periods, an epoch LR step mode, gradient aggregation, class
// and function reducers, and `best` checkpoints driven by a reducer's metric. Also the thread count
// each rank chooses under each launcher.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <dlfcn.h>
#include <sys/wait.h>
#include <thread>

#include "ranks.hpp"
#include "test_trials.hpp"
#include "applied_context.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

// 97 training records: per-slot batch 3 (2 ranks) gives 33 batches, per-slot 2 (3 ranks) 49; both
// end in a partial batch, and neither count divides by its rank count. 53 validation records.
constexpr std::int64_t train_records = 97, validation_records = 53;
constexpr std::int64_t epochs = 3;

/// Features whose first column is the record's index (the model reads the other three).
test::Batch indexed_data(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor x = torch::randn({n, 4}, gen);
  x.select(1, 0).copy_(torch::arange(n, torch::kFloat));
  torch::Tensor y = x.narrow(1, 1, 3).matmul(torch::tensor({1.5f, -2.0f, 0.5f})).unsqueeze(1);
  return {x, y};
}

/// Records trained in a workload on all ranks, and on how many ranks (MetricValues under their own names).
struct TrainedRecords {
  std::int64_t records = 0;
  void reset() { records = 0; }
  std::int64_t per_slot_reduce() const { return records; }
  MetricValues cross_slot_reduce(const std::vector<std::int64_t>& parts) const {
    MetricValues m;
    m.set("trained_records", static_cast<double>(std::accumulate(parts.begin(), parts.end(), std::int64_t{0})));
    m.set("trained_ranks", static_cast<double>(parts.size()));
    return m;
  }
};

/// 1 when the values ascend and there is one per validation batch (27 of 2 records), else 0.
struct AscendingCount {
  double operator()(const std::vector<double>& firsts) const {
    return std::is_sorted(firsts.begin(), firsts.end()) && firsts.size() == (validation_records + 1) / 2 ? 1.0 : 0.0;
  }
};
struct Sum {
  double operator()(const std::vector<double>& v) const { return std::accumulate(v.begin(), v.end(), 0.0); }
};

/// A reducer with reduce() alone: it sees one rank, so a job must refuse it.
struct LocalOnly {
  void reset() {}
  double reduce() const { return 0; }
};

struct UnevenTrial {
  Context& context;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  torch::optim::StepLR scheduler;
  test::SquaredError val_mse;
  TrainedRecords trained;
  // Function reducers: dettrial owns them; the trial keeps what wrap_reducer returned.
  FunctionReducer<double, AscendingCount>* in_order = nullptr;
  FunctionReducer<double, Sum>* index_sum = nullptr;
  std::vector<std::pair<std::int64_t, std::vector<std::int64_t>>> seen;  // (batch_idx, record indices)

  explicit UnevenTrial(Context& c)
      : context(c),
        model(c.wrap_model(
            torch::nn::Sequential(torch::nn::Linear(3, 8), torch::nn::Tanh(), torch::nn::Dropout(0.2), torch::nn::Linear(8, 1)))),
        opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5)),
        scheduler(opt, /*step_size=*/1, /*gamma=*/0.5) {
    c.wrap_optimizer(opt);
    c.wrap_lr_scheduler(scheduler, lr_step::every_epoch{});
    c.wrap_reducer(val_mse, "val_mse", /*for_training=*/false);
    c.wrap_reducer(trained, "", /*for_training=*/true, /*for_validation=*/false);
    // The first record of every validation batch, from all ranks: back in batch order, they ascend.
    in_order = &c.wrap_reducer(AscendingCount{}, "val_in_order", /*for_training=*/false);
    index_sum = &c.wrap_reducer(Sum{}, "val_index_sum", /*for_training=*/false);
  }
  auto build_training_data_loader() {
    auto [x, y] = indexed_data(train_records, 11);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = indexed_data(validation_records, 12);
    return DataLoader(TensorDataset(x, y), {.batch_size = 2});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t batch_idx) {
    auto& [x, y] = b;
    const torch::Tensor ids = x.select(1, 0).to(torch::kLong).cpu();  // the batch is on the trial's device
    seen.emplace_back(batch_idx, std::vector<std::int64_t>(ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + ids.numel()));
    trained.records += x.size(0);
    torch::Tensor loss = torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    const torch::Tensor err = (model->forward(x.narrow(1, 1, 3)) - y).pow(2);
    val_mse.update(err);
    in_order->update(x[0][0].item<double>());
    index_sum->update(x.select(1, 0).sum().item<double>());
    return {{"validation_loss", err.mean()}};
  }
};

void check_uneven_job(int n) {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  test::run_ranks("child process: a rank on uneven data", n, dir);

  const std::int64_t per_slot = 6 / n;
  const std::int64_t batches_per_epoch = (train_records + per_slot - 1) / per_slot;
  const std::int64_t epoch_len = batches_per_epoch / n + (batches_per_epoch % n > 0 ? 1 : 0);  // the chief's shard
  REQUIRE(batches_per_epoch % n != 0);

  // Every rank: the chief's epoch length, the whole length trained, the LR stepped once per epoch,
  // the same parameters, the same checkpoints heard of, its share of the cores.
  std::map<std::int64_t, std::vector<std::int64_t>> global;  // global batch -> record indices
  std::string first_params;
  std::string first_uploads;
  for (int rank = 0; rank < n; ++rank) {
    CAPTURE(rank);
    const YAML::Node result = YAML::LoadFile((dir / ("rank" + std::to_string(rank) + ".yaml")).string());
    CHECK(result["batches_trained"].as<std::int64_t>() == epochs * epoch_len);
    CHECK(result["epochs_trained"].as<std::int64_t>() == epochs);
    // Stepped once per epoch, 3 times; LibTorch's StepLR does not decay on its first step().
    CHECK(result["lr"].as<double>() == doctest::Approx(0.05 * 0.25));
    if (std::getenv("OMP_NUM_THREADS") == nullptr) {  // else the user's setting wins
      CHECK(result["threads"].as<int>() == std::max(1, result["cores"].as<int>() / n));
      CHECK(result["threads_source"].as<std::string>().find("ranks on this node") != std::string::npos);
    }
    if (rank == 0) {
      first_params = result["params"].as<std::string>();
      first_uploads = result["uploads"].as<std::string>();
    }
    CHECK(result["params"].as<std::string>() == first_params);
    CHECK(result["uploads"].as<std::string>() == first_uploads);
    for (const auto& b : result["seen"]) {
      const auto k = b[0].as<std::int64_t>();
      global[k * n + rank] = b[1].as<std::vector<std::int64_t>>();
    }
  }
  // The ranks together read the endless stream's batches 0, 1, 2, ... with none missing, and each
  // complete epoch of that stream trains every record exactly once (one shuffle, the chief's seed).
  REQUIRE(static_cast<std::int64_t>(global.size()) == n * epochs * epoch_len);
  REQUIRE(global.rbegin()->first == n * epochs * epoch_len - 1);
  const std::int64_t complete = static_cast<std::int64_t>(global.size()) / batches_per_epoch;
  REQUIRE(complete >= 2);
  std::vector<std::vector<std::int64_t>> orders;
  for (std::int64_t e = 0; e < complete; ++e) {
    std::vector<std::int64_t> records;
    for (std::int64_t g = e * batches_per_epoch; g < (e + 1) * batches_per_epoch; ++g)
      records.insert(records.end(), global[g].begin(), global[g].end());
    orders.push_back(records);
    std::sort(records.begin(), records.end());
    std::vector<std::int64_t> all(train_records);
    std::iota(all.begin(), all.end(), 0);
    CAPTURE(e);
    CHECK(records == all);
  }
  CHECK(orders[0] != orders[1]);  // shuffled anew each epoch

  // The chief's reports: one validation per epoch over the whole validation set, the reducers'
  // values equal to what one process computes over the same records.
  std::vector<nlohmann::json> validations;
  std::int64_t reported_records = 0;
  for (const nlohmann::json& r : test::read_reports(dir / "run" / "metrics.jsonl")) {
    if (r["type"].get<std::string>() == "validation") validations.push_back(r);
    else if (r["type"].get<std::string>() == "training") {
      CHECK(r["metrics"]["trained_ranks"].get<double>() == n);
      reported_records += static_cast<std::int64_t>(r["metrics"]["trained_records"].get<double>());
    }
  }
  std::int64_t records_seen = 0;
  for (const auto& [g, ids] : global) records_seen += static_cast<std::int64_t>(ids.size());
  CHECK(reported_records == records_seen);
  REQUIRE(validations.size() == epochs);
  for (std::size_t v = 0; v < validations.size(); ++v) {
    const nlohmann::json& m = validations[v]["metrics"];
    CHECK(validations[v]["batches"].get<std::int64_t>() == static_cast<std::int64_t>(v + 1) * epoch_len);
    CHECK(m["val_index_sum"].get<double>() == validation_records * (validation_records - 1) / 2);
    CHECK(m["val_in_order"].get<double>() == 1.0);
  }
  // val_mse of the final weights, as one process computes it over all 53 records.
  const YAML::Node chief = YAML::LoadFile((dir / "rank0.yaml").string());
  torch::nn::Sequential model(torch::nn::Linear(3, 8), torch::nn::Tanh(), torch::nn::Dropout(0.2), torch::nn::Linear(8, 1));
  load_model(dir / "run", *model);
  model->eval();
  auto [x, y] = indexed_data(validation_records, 12);
  const double one_process = (model->forward(x.narrow(1, 1, 3)) - y).pow(2).mean().item<double>();
  CHECK(validations.back()["metrics"]["val_mse"].get<double>() == doctest::Approx(one_process).epsilon(1e-6));

  // `best` by the reducer's metric: every checkpoint after a validation improved on the one before
  // (the last is written at the end whatever its value).
  const auto metrics = chief["checkpoint_metrics"].as<std::vector<double>>();
  REQUIRE(metrics.size() >= 2);
  for (std::size_t i = 1; i + 1 < metrics.size(); ++i) CHECK(metrics[i] < metrics[i - 1]);
}

LaunchEnvironment env_of(std::map<std::string, std::string> vars) {
  return LaunchEnvironment::detect([vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("child process: a rank on uneven data" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  // No seed anywhere: the ranks must still shuffle alike.
  test::Context context(Hyperparameters::parse("global_batch_size: 6\n"), ContextOptions{.aggregation_frequency = 2, .communicator = comm});
  LocalOnly local;
  CHECK_THROWS_WITH_AS(context.wrap_reducer(local, "local"), doctest::Contains("has only reduce(), which sees one rank's data"),
                       TrialError);

  Trainer<UnevenTrial> trainer(context);
  FitOptions o{.max_length = Epoch(epochs), .validation_period = Epoch(1), .reporting_period = Batch(5)};
  o.searcher_metric = "val_mse";
  o.checkpoint_policy = CheckpointPolicy::best;
  o.output_dir = dir / "run";
  o.report.quiet = true;
  struct Uploads {
    std::string uuids;
    void on_checkpoint_upload_end(const std::string& uuid) { uuids += uuid + " "; }
  } uploads;
  const FitResult r = trainer.fit(o, uploads);

  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "batches_trained" << YAML::Value << r.batches_trained;
  out << YAML::Key << "epochs_trained" << YAML::Value << r.epochs_trained;
  out << YAML::Key << "lr" << YAML::Value << static_cast<torch::optim::SGDOptions&>(trainer.trial().opt.param_groups()[0].options()).lr();
  out << YAML::Key << "threads" << YAML::Value << at::get_num_threads();
  out << YAML::Key << "cores" << YAML::Value << CoreCount::of_this_process().available;
  out << YAML::Key << "threads_source" << YAML::Value << context.threads().source;
  std::ostringstream params;
  for (const auto& p : trainer.trial().model->parameters()) params << p.sum().item<double>() << "," << p.pow(2).sum().item<double>() << ";";
  out << YAML::Key << "params" << YAML::Value << params.str();
  out << YAML::Key << "uploads" << YAML::Value << uploads.uuids;
  out << YAML::Key << "checkpoint_metrics" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const auto& c : r.checkpoints) out << c.validation_metric.value_or(-1.0);
  out << YAML::EndSeq;
  out << YAML::Key << "seen" << YAML::Value << YAML::BeginSeq;
  std::int64_t k = 0;
  for (const auto& [batch_idx, ids] : trainer.trial().seen) {
    CHECK(batch_idx == k);  // each rank's batches are numbered 0, 1, 2, ... (its k-th is global k*n + rank)
    out << YAML::Flow << YAML::BeginSeq << k++ << YAML::Flow << ids << YAML::EndSeq;
  }
  out << YAML::EndSeq << YAML::EndMap;
  std::ofstream(dir / ("rank" + std::to_string(env.rank) + ".yaml")) << out.c_str();
}

TEST_CASE("2 ranks on uneven data agree on every boundary, shuffle alike without a seed and reduce as one process" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  check_uneven_job(2);
}

TEST_CASE("3 ranks on uneven data agree on every boundary, shuffle alike without a seed and reduce as one process" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  check_uneven_job(3);
}

namespace {

/// The trial of the rank-invariance cases: dropout, SGD with momentum and weight decay, per-slot
/// batches of 5 of 97 shuffled records (each epoch ends in a batch of 2).
struct RankInvariantTrial {
  Context& context;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  explicit RankInvariantTrial(Context& c)
      : context(c),
        model(c.wrap_model(
            torch::nn::Sequential(torch::nn::Linear(3, 16), torch::nn::Tanh(), torch::nn::Dropout(0.3), torch::nn::Linear(16, 1)))),
        opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3)) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    auto [x, y] = indexed_data(train_records, 11);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = indexed_data(validation_records, 12);
    return DataLoader(TensorDataset(x, y), {.batch_size = 8});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y)}};
  }
};

/// The FNV-1a hash of every parameter's bytes: equal only for bit-identical parameters.
std::string parameter_hash(torch::nn::Module& model) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (const auto& p : model.parameters()) {
    const torch::Tensor t = p.detach().to(torch::kCPU).contiguous();  // the bytes on the host, wherever it trained
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel() * static_cast<std::int64_t>(t.element_size()); ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  return std::to_string(hash);
}

/// 12 updates of 4 micro-batches of 5 records (48 stream batches: two epoch ends) on `ranks` ranks
/// aggregating 4 / ranks batches each; the chief's parameter hash.
std::string rank_invariant_run(int ranks, bool on) {
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  test::run_ranks("child process: a rank of a rank-invariant job", ranks, dir, {std::string("RANK_INVARIANT=") + (on ? "1" : "0")});
  return test::read_text(dir / "hash0.txt");
}

}  // namespace

TEST_CASE("child process: a rank of a rank-invariant job" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  const bool on = std::string(std::getenv("RANK_INVARIANT")) == "1";
  const std::int64_t agg = 4 / env.size;
  std::shared_ptr<Communicator> comm;
  if (env.distributed()) comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  test::Context context(Hyperparameters::parse("global_batch_size: " + std::to_string(5 * env.size) + "\n"),
                        ContextOptions{.trial_seed = 42, .aggregation_frequency = agg, .communicator = comm, .rank_invariant = on});
  context.process_settings().apply();  // as a rank's main does: one thread per rank, deterministic kernels on a GPU
  Trainer<RankInvariantTrial> trainer(context);
  FitOptions o{.max_length = Batch(12 * agg), .reporting_period = Batch(4 * agg)};
  o.output_dir = dir / "run";
  o.report.quiet = true;
  trainer.fit(o);
  std::ofstream(dir / ("hash" + std::to_string(env.rank) + ".txt")) << parameter_hash(*trainer.trial().model);
}

TEST_CASE("rank_invariant: 1 rank aggregating 4 batches, 2 aggregating 2 and 4 aggregating none end bit-identical" *
          doctest::timeout(300)) {
  if (test::skip_without_gloo()) return;
  const std::string one = rank_invariant_run(1, true);
  CHECK(rank_invariant_run(2, true) == one);
  CHECK(rank_invariant_run(4, true) == one);
  // The default all-reduce (and each rank's own dropout stream) does not give the same bits: what
  // the mode is for, and what shows this test can fail.
  CHECK(rank_invariant_run(2, false) != rank_invariant_run(1, false));
}

TEST_CASE("rank_invariant: a boundary between an update's batches, and a sum of aggregated gradients, are refused") {
  test::Context context(Hyperparameters::parse("global_batch_size: 5\n"),
                        ContextOptions{.aggregation_frequency = 4, .rank_invariant = true});
  Trainer<RankInvariantTrial> trainer(context);
  CHECK_THROWS_WITH_AS(trainer.fit(test::quiet({.max_length = Batch(10)})),
                       "reproducibility.rank_invariant keeps an update's batches apart until its last one, so max_length (10 batches) "
                       "must end on a multiple of aggregation_frequency 4 batches",
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      Context(Hyperparameters{}, ContextOptions{.aggregation_frequency = 2, .average_aggregated_gradients = false, .rank_invariant = true}),
      doctest::Contains("rank_invariant needs optimizations.average_aggregated_gradients"), ConfigError);
}

double plain_sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

TEST_CASE("a function reducer interleaves the ranks' values back into batch order") {
  // A plain function, a lambda and tensors all make function reducers.
  test::Context context(Hyperparameters{});
  auto& sum = context.wrap_reducer(plain_sum, "sum");
  sum.update(2);
  sum.update(3);
  CHECK(sum.cross_slot_reduce({sum.per_slot_reduce(), {10}}) == 15);
  auto& rows =
      context.wrap_reducer<torch::Tensor>([](const std::vector<torch::Tensor>& t) { return torch::cat(t).sum().item<double>(); }, "rows");
  rows.update(torch::ones({2}));
  CHECK(rows.cross_slot_reduce({rows.per_slot_reduce(), {torch::ones({3})}}) == 5);

  FunctionReducer<double, std::function<double(const std::vector<double>&)>> r(
      [](const std::vector<double>& v) { return v.size() == 5 && std::is_sorted(v.begin(), v.end()) ? v.back() : -1.0; });
  // Global batches 0..4 dealt to 2 ranks by stride: rank 0 has 0, 2, 4; rank 1 has 1, 3.
  CHECK(r.cross_slot_reduce({{0, 2, 4}, {1, 3}}) == 4.0);
  r.update(7);
  CHECK(r.per_slot_reduce() == std::vector<double>{7});
  r.reset();
  CHECK(r.per_slot_reduce().empty());
}

TEST_CASE("the built-in launcher's CPU shares: contiguous, one rank's at most one CPU larger than another's") {
  CHECK(share_of_cpus({0, 1}, 2, 0) == std::vector<int>{0});
  CHECK(share_of_cpus({0, 1}, 2, 1) == std::vector<int>{1});
  // 7 CPUs (a mask with a hole) for 3 ranks: 3, 2 and 2.
  const std::vector<int> cpus{0, 1, 2, 4, 5, 6, 7};
  CHECK(share_of_cpus(cpus, 3, 0) == std::vector<int>{0, 1, 2});
  CHECK(share_of_cpus(cpus, 3, 1) == std::vector<int>{4, 5});
  CHECK(share_of_cpus(cpus, 3, 2) == std::vector<int>{6, 7});
  CHECK(share_of_cpus({0, 1}, 3, 0).empty());  // fewer CPUs than ranks: nobody is bound
  CHECK(cpu_list_text({0, 1, 2, 4, 6, 7}) == "0-2,4,6-7");
  CHECK(cpu_list_text({3}) == "3");
  // A bound rank computes with the CPUs it was given.
  const auto builtin = env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  auto bound = [](const char* name) -> const char* { return std::string_view(name) == "DETTRIAL_RANK_CPUS" ? "8-15" : nullptr; };
  const auto choice = choose_threads(builtin, std::nullopt, CoreCount{.available = 8, .online = 16}, bound);
  CHECK(choice.threads == 8);
  CHECK(choice.source == "CPUs 8-15 bound to this rank by the launcher");
}

TEST_CASE("child process: a rank reports the CPUs it may run on" * doctest::skip()) {
  std::ofstream(fs::path(std::getenv("DETTRIAL_CHILD_OUT")) / ("rank" + std::string(std::getenv("RANK"))))
      << cpu_list_text(allowed_cpus()) << ' ' << (std::getenv("DETTRIAL_RANK_CPUS") ? std::getenv("DETTRIAL_RANK_CPUS") : "unbound");
}

TEST_CASE("the built-in launcher binds each rank to its own CPUs, and leaves them unbound when asked") {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) {
    test::skip("this process may run on " + std::to_string(cpus.size()) + " CPU; binding 2 ranks needs 2");
    return;
  }
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  ::setenv("DETTRIAL_CHILD_OUT", dir.c_str(), 1);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> args{self, "--test-case=child process: a rank reports the CPUs it may run on", "--no-skip",
                                      "--no-version"};
  auto ranks = [&](bool bind) {
    for (int r = 0; r < 2; ++r) fs::remove(dir / ("rank" + std::to_string(r)));
    REQUIRE(dettrial::detail::launch_local(args, 2, std::chrono::seconds(30), bind) == 0);
    return std::pair{test::read_text(dir / "rank0"), test::read_text(dir / "rank1")};
  };
  const auto [rank0, rank1] = ranks(true);
  const std::string first = cpu_list_text(share_of_cpus(cpus, 2, 0)), second = cpu_list_text(share_of_cpus(cpus, 2, 1));
  CHECK(rank0 == first + " " + first);
  CHECK(rank1 == second + " " + second);
  CHECK(allowed_cpus() == cpus);  // the launcher's own thread is unbound again
  const auto [free0, free1] = ranks(false);
  CHECK(free0 == cpu_list_text(cpus) + " unbound");
  CHECK(free1 == cpu_list_text(cpus) + " unbound");
  ::unsetenv("DETTRIAL_CHILD_OUT");
}

TEST_CASE("threads per rank under rank_invariant: one whatever the rank count, unless the user chose") {
  const CoreCount machine{.available = 16, .online = 16};
  auto no_env = [](const char*) -> const char* { return nullptr; };
  const auto builtin = env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  for (const LaunchEnvironment& env : {LaunchEnvironment{}, builtin}) {
    const ThreadChoice chosen = choose_threads(env, std::nullopt, machine, no_env, ThreadDefault::one_per_rank);
    CHECK(chosen.threads == 1);
    CHECK(chosen.source == "reproducibility.rank_invariant: one per rank, whatever the rank count");
    // The user's count still wins (then the same count on every side is theirs to keep).
    CHECK(choose_threads(env, 3, machine, no_env, ThreadDefault::one_per_rank).threads == 3);
    auto omp = [](const char* name) -> const char* { return std::string_view(name) == "OMP_NUM_THREADS" ? "2" : nullptr; };
    CHECK(choose_threads(env, std::nullopt, machine, omp, ThreadDefault::one_per_rank).threads == 2);
  }
}

TEST_CASE("threads per rank: the user's setting wins, else Slurm's, the launcher's binding, or a share of the node") {
  const CoreCount machine{.available = 16, .online = 16};
  auto no_env = [](const char*) -> const char* { return nullptr; };
  // One process: the CPUs it may run on, unless the user chose.
  CHECK(choose_threads(LaunchEnvironment{}, std::nullopt, machine, no_env).threads == 16);
  CHECK(choose_threads(LaunchEnvironment{}, std::nullopt, machine, no_env).source == "the 16 CPUs this process may run on");
  CHECK(choose_threads(LaunchEnvironment{}, std::nullopt, CoreCount{.available = 1, .online = 4}, no_env).source ==
        "the CPU this process may run on");
  CHECK(choose_threads(LaunchEnvironment{}, 3, machine, no_env).threads == 3);

  // The built-in launcher (--nproc 4) and torchrun without OMP_NUM_THREADS: a quarter each.
  const auto builtin = env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  CHECK(choose_threads(builtin, std::nullopt, machine, no_env).threads == 4);
  CHECK(choose_threads(builtin, std::nullopt, machine, no_env).source == "16 cores / 4 ranks on this node");
  CHECK(choose_threads(builtin, std::nullopt, CoreCount{.available = 2, .online = 2}, no_env).threads == 1);
  // Two nodes of 2 ranks: the ranks on this node share it.
  const auto two_nodes = env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(choose_threads(two_nodes, std::nullopt, machine, no_env).threads == 8);

  // The user's choice wins: --threads (torchrun sets OMP_NUM_THREADS=1 by itself), then OMP_NUM_THREADS,
  // which LibTorch has applied (dettrial leaves it), read as OpenMP reads it.
  auto omp = [](const char* name) -> const char* { return std::string_view(name) == "OMP_NUM_THREADS" ? "5" : nullptr; };
  CHECK(choose_threads(builtin, 2, machine, omp).threads == 2);
  CHECK(choose_threads(builtin, 2, machine, omp).source == "--threads");
  const auto user = choose_threads(builtin, std::nullopt, machine, omp);
  CHECK(user.threads == 5);
  CHECK(!user.set_by_dettrial);
  CHECK(choose_threads(LaunchEnvironment{}, std::nullopt, machine, omp).threads == 5);
  CHECK_THROWS_WITH_AS(choose_threads(builtin, 0, machine, no_env), doctest::Contains("at least 1"), ConfigError);
  auto nested = [](const char* name) -> const char* { return std::string_view(name) == "OMP_NUM_THREADS" ? " 4,2" : nullptr; };
  CHECK(choose_threads(builtin, std::nullopt, machine, nested).threads == 4);
  auto bad = [](const char* name) -> const char* { return std::string_view(name) == "OMP_NUM_THREADS" ? "many" : nullptr; };
  CHECK(choose_threads(builtin, std::nullopt, machine, bad).source == "16 cores / 4 ranks on this node");

  // mpirun binds each rank to a core: its mask is its share.
  const auto mpi = env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(choose_threads(mpi, std::nullopt, CoreCount{.available = 1, .online = 16}, no_env).threads == 1);
  CHECK(choose_threads(mpi, std::nullopt, CoreCount{.available = 1, .online = 16}, no_env).source == "cores bound to this process");

  // A mask every rank shares (taskset, a container's cpuset) is not a per-rank binding.
  CHECK(choose_threads(builtin, std::nullopt, CoreCount{.available = 8, .online = 16}, no_env).threads == 2);

  // srun: SLURM_CPUS_PER_TASK when given, else the tasks on this node from the task layout.
  std::map<std::string, std::string> slurm_vars = {{"SLURM_PROCID", "2"},
                                                   {"SLURM_NTASKS", "5"},
                                                   {"SLURM_NODEID", "1"},
                                                   {"SLURM_TASKS_PER_NODE", "2(x2),1"},
                                                   {"SLURM_JOB_NODELIST", "n[1-3]"}};
  const auto slurm = env_of(slurm_vars);
  CHECK(slurm.local_size == 2);
  CHECK(choose_threads(slurm, std::nullopt, machine, no_env).threads == 8);
  auto cpus = [](const char* name) -> const char* { return std::string_view(name) == "SLURM_CPUS_PER_TASK" ? "3" : nullptr; };
  CHECK(choose_threads(slurm, std::nullopt, machine, cpus).threads == 3);
  slurm_vars["SLURM_NODEID"] = "2";
  CHECK(env_of(slurm_vars).local_size == 1);
  CHECK(LaunchEnvironment::slurm_tasks_on_node("4", 0) == 4);
  CHECK(LaunchEnvironment::slurm_tasks_on_node("3(x2),1", 1) == 3);
  CHECK(LaunchEnvironment::slurm_tasks_on_node("3(x2),1", 2) == 1);
  CHECK(LaunchEnvironment::slurm_tasks_on_node("garbage", 0) == 1);
}

TEST_CASE("threads per rank: the BLAS library's own pool gets the same count as the intra-op pool") {
  // Debian's LibTorch computes its matrix products in the system BLAS (OpenBLAS's pthread build, which
  // would otherwise start one thread per CPU it sees); PyPI's has MKL built in, sized with the intra-op pool.
  using get_fn = int();
  auto* openblas_threads = reinterpret_cast<get_fn*>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const int before = at::get_num_threads();
  auto no_env = [](const char*) -> const char* { return nullptr; };
  if (at::globalContext().hasMKL()) {
    const ThreadPools pools = apply_threads(ThreadChoice{.threads = 1, .source = "test"}, no_env);
    CHECK(pools.intra_op == 1);
    CHECK(pools.blas.starts_with("MKL 1"));
    CHECK(pools.text().starts_with("intra-op 1, MKL 1"));
  } else if (openblas_threads == nullptr) {
    test::skip("this LibTorch computes with neither MKL nor OpenBLAS (no BLAS pool to size)");
    return;
  } else {
    for (const int n : {1, 2, 1}) {
      CAPTURE(n);
      const ThreadPools pools = apply_threads(ThreadChoice{.threads = n, .source = "test"}, no_env);
      CHECK(pools.intra_op == n);
      CHECK(pools.blas == "OpenBLAS " + std::to_string(n));
      CHECK(openblas_threads() == n);
      CHECK(pools.text() == "intra-op " + std::to_string(n) + ", OpenBLAS " + std::to_string(n) + ", inter-op " +
                                std::to_string(at::get_num_interop_threads()));
    }
    // The user's OPENBLAS_NUM_THREADS is theirs: left as it is, and named.
    auto own = [](const char* name) -> const char* { return std::string_view(name) == "OPENBLAS_NUM_THREADS" ? "1" : nullptr; };
    const ThreadPools pools = apply_threads(ThreadChoice{.threads = 2, .source = "test"}, own);
    CHECK(pools.intra_op == 2);
    CHECK(pools.blas == "OpenBLAS 1 from OPENBLAS_NUM_THREADS");
    CHECK(openblas_threads() == 1);
  }
  // The user's OMP_NUM_THREADS, which LibTorch applied itself, is not set again.
  at::set_num_threads(1);
  CHECK(apply_threads(ThreadChoice{.threads = 2, .source = "OMP_NUM_THREADS", .set_by_dettrial = false}, no_env).intra_op == 1);
  at::set_num_threads(before);
}

namespace {
/// Validates with evaluate_full_dataset: the chief evaluates the whole (unsharded) validation set,
/// and every rank reports its metrics.
struct FullDatasetTrial {
  Context& context;
  torch::nn::Linear model{nullptr};
  torch::optim::SGD opt;
  int evaluations = 0;
  explicit FullDatasetTrial(Context& c) : context(c), model(c.wrap_model(torch::nn::Linear(3, 1))), opt(model->parameters(), 0.05) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    auto [x, y] = indexed_data(train_records, 11);
    return DataLoader(TensorDataset(x, y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = indexed_data(validation_records, 12);
    return DataLoader(TensorDataset(x, y), {.batch_size = 4});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    torch::Tensor loss = torch::mse_loss(model->forward(x.narrow(1, 1, 3)), y);
    context.backward(loss);
    context.step_optimizer(opt);
    return {{"loss", loss}};
  }
  Metrics evaluate_full_dataset(DataLoader<TensorDataset<2>>& loader) {
    ++evaluations;
    torch::NoGradGuard no_grad;
    double squared = 0, records = 0, index_sum = 0;
    for (auto&& batch : loader) {
      auto [x, y] = context.to_device(batch);  // the loader's batches stay where it made them, as in Determined
      squared += (model->forward(x.narrow(1, 1, 3)) - y).pow(2).sum().item<double>();
      records += static_cast<double>(x.size(0));
      index_sum += x.select(1, 0).sum().item<double>();
    }
    return {{"val_mse", squared / records}, {"records_seen", records}, {"index_sum", index_sum}};
  }
};
}  // namespace

TEST_CASE("child process: a rank validates with evaluate_full_dataset" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  test::Context context(Hyperparameters::parse("global_batch_size: 6\n"), ContextOptions{.trial_seed = 8, .communicator = comm});
  Trainer<FullDatasetTrial> trainer(context);
  FitOptions o{.max_length = Epoch(2), .validation_period = Epoch(1)};
  o.output_dir = dir / "run";
  o.report.quiet = true;
  const FitResult r = trainer.fit(o);
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "evaluations" << YAML::Value << trainer.trial().evaluations;
  out << YAML::Key << "validations" << YAML::Value << r.validations;
  for (const char* name : {"val_mse", "records_seen", "index_sum"})
    out << YAML::Key << name << YAML::Value << YAML::Precision(17) << r.last_validation_metrics.at(name);
  std::ostringstream params;
  params << std::setprecision(17);
  for (const auto& p : trainer.trial().model->parameters()) params << p.sum().item<double>() << ";";
  out << YAML::Key << "params" << YAML::Value << params.str();
  out << YAML::EndMap;
  std::ofstream(dir / ("rank" + std::to_string(env.rank) + ".yaml")) << out.c_str();
}

TEST_CASE("3 ranks on uneven data: evaluate_full_dataset runs on the chief over the whole set and every rank reports it" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  test::run_ranks("child process: a rank validates with evaluate_full_dataset", 3, dir);
  std::vector<YAML::Node> ranks;
  for (int rank = 0; rank < 3; ++rank) ranks.push_back(YAML::LoadFile((dir / ("rank" + std::to_string(rank) + ".yaml")).string()));
  CHECK(ranks[0]["validations"].as<int>() == 2);
  CHECK(ranks[0]["evaluations"].as<int>() == 2);  // the chief, once a validation
  // The whole validation set, unsharded: 53 records whose indices sum to 0 + 1 + ... + 52.
  CHECK(ranks[0]["records_seen"].as<double>() == static_cast<double>(validation_records));
  CHECK(ranks[0]["index_sum"].as<double>() == static_cast<double>(validation_records * (validation_records - 1) / 2));
  for (int rank = 1; rank < 3; ++rank) {
    CAPTURE(rank);
    const YAML::Node& mine = ranks[static_cast<std::size_t>(rank)];
    CHECK(mine["evaluations"].as<int>() == 0);  // the other ranks do not evaluate
    CHECK(mine["validations"].as<int>() == 2);
    for (const char* name : {"val_mse", "records_seen", "index_sum"})
      CHECK(mine[name].as<std::string>() == ranks[0][name].as<std::string>());
    CHECK(mine["params"].as<std::string>() == ranks[0]["params"].as<std::string>());
  }
}

// ---- replicas that drift apart are caught at the next validation --------------------------------

namespace {

/// A regression whose ranks' weights drift apart as DRIFT says: `own_step`, the trial steps its
/// optimizer itself (the gradients of each rank's own shard, never averaged); `alone`, rank 1
/// changes a weight by itself after batch 2 (as a kernel that is not deterministic would); `none`,
/// as it should be.
struct DriftingTrial {
  Context& context;
  torch::nn::Sequential model;
  torch::optim::SGD opt;
  std::string drift = std::getenv("DRIFT") ? std::getenv("DRIFT") : "none";
  explicit DriftingTrial(Context& c)
      : context(c),
        model(c.wrap_model(torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::Linear(4, 1)))),
        opt(model->parameters(), 0.05) {
    c.wrap_optimizer(opt);
  }
  auto build_training_data_loader() {
    auto [x, y] = indexed_data(train_records, 11);
    return DataLoader(TensorDataset(x.narrow(1, 1, 3), y), {.batch_size = context.get_per_slot_batch_size(), .shuffle = true});
  }
  auto build_validation_data_loader() {
    auto [x, y] = indexed_data(validation_records, 12);
    return DataLoader(TensorDataset(x.narrow(1, 1, 3), y), {.batch_size = 4});
  }
  Metrics train_batch(test::Batch& b, std::int64_t, std::int64_t batch_idx) {
    auto& [x, y] = b;
    const torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    context.backward(loss);
    if (drift == "own_step") {
      opt.step();
      opt.zero_grad();
    } else {
      context.step_optimizer(opt);
    }
    if (drift == "alone" && batch_idx == 2 && context.distributed().rank == 1) {
      torch::NoGradGuard no_grad;
      model[1]->as<torch::nn::Linear>()->bias.add_(1e-3);
    }
    return {{"loss", loss}};
  }
  Metrics evaluate_batch(test::Batch& b) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

}  // namespace

TEST_CASE("child process: a rank whose weights may drift" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  // No seed: the ranks agree on the chief's, as a user's job does by default.
  test::Context context(Hyperparameters::parse("global_batch_size: 6\n"), ContextOptions{.communicator = comm});
  Trainer<DriftingTrial> trainer(context);
  FitOptions o = test::quiet({.max_length = Batch(8), .validation_period = Batch(3)});
  o.output_dir = dir / "run";
  std::string outcome = "trained to batch 8";
  try {
    trainer.fit(o);
  } catch (const DistributedError& e) {
    outcome = e.what();
  }
  std::ofstream(dir / ("rank" + std::to_string(env.rank) + ".txt")) << outcome;
}

TEST_CASE(
    "ranks whose weights drift apart (a trial stepping its optimizer itself, a rank changing a weight alone) stop at the next "
    "validation on every rank, naming the first parameter that differs" *
    doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  const std::pair<const char*, const char*> cases[] = {
      {"none", "trained to batch 8"},
      {"own_step",
       "the ranks' parameters differ after batch 3: model 0's '0.weight' is not the same on every rank (the first that differs)"},
      {"alone", "the ranks' parameters differ after batch 3: model 0's '1.bias' is not the same on every rank (the first that differs)"}};
  for (const auto& [drift, expected] : cases) {
    CAPTURE(drift);
    const fs::path dir = test::quiet({}).output_dir;
    fs::create_directories(dir);
    test::run_ranks("child process: a rank whose weights may drift", 2, dir, {std::string("DRIFT=") + drift});
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      const std::string outcome = test::read_text(dir / ("rank" + std::to_string(rank) + ".txt"));
      CAPTURE(outcome);
      CHECK(outcome.find(expected) != std::string::npos);
      if (std::string(drift) == "own_step")
        CHECK(outcome.find("the trial steps its optimizer itself (optimizer.step() instead of context.step_optimizer") !=
              std::string::npos);
    }
  }
}

namespace {
/// The regression trial at a few milliseconds a batch: long enough for the system metrics' sampler
/// to report while it trains.
struct UnhurriedRegression : test::DeclarativeRegression {
  using DeclarativeRegression::DeclarativeRegression;
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t epoch_idx, std::int64_t batch_idx) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return DeclarativeRegression::train_batch(b, model, epoch_idx, batch_idx);
  }
};

/// The `system` records of a JSON-lines file.
std::size_t system_records_in(const fs::path& file) {
  std::ifstream in(file);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);)
    n += line.find("\"type\":\"system\"") != std::string::npos && line.find("\"cpu_util_simple\"") != std::string::npos;
  return n;
}
}  // namespace

TEST_CASE("child process: a rank of a profiled job" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  auto comm = Communicator::create(env, std::chrono::seconds(60), backend::gloo{});
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 9, .communicator = comm});
  Trainer<UnhurriedRegression> trainer(context);
  FitOptions o = test::quiet({.max_length = Batch(40)});
  o.output_dir = dir / "run";
  o.profiling = {.enabled = true, .end_after_batch = 1, .sampling_interval = 0.1, .samples_per_report = 1};
  trainer.fit(o);
}

// Determined samples a machine once, on its first rank: on one node, the chief alone (into
// metrics.jsonl); on two (each rank its node's first), node 1 too, into system.node1.jsonl.
TEST_CASE("profiling.enabled in a job: each node's first rank samples its machine, the chief's node into metrics.jsonl" *
          doctest::timeout(200)) {
  if (test::skip_without_gloo()) return;
  for (const bool two_nodes : {false, true}) {
    CAPTURE(two_nodes);
    const fs::path dir = test::quiet({}).output_dir;
    fs::create_directories(dir);
    test::run_ranks("child process: a rank of a profiled job", 2, dir,
                    two_nodes ? std::vector<std::string>{"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"} : std::vector<std::string>{});
    CHECK(system_records_in(dir / "run" / "metrics.jsonl") >= 1);
    CHECK(fs::exists(dir / "run" / "system.node1.jsonl") == two_nodes);
    if (two_nodes) CHECK(system_records_in(dir / "run" / "system.node1.jsonl") >= 1);
    // Every rank traces its own process.
    CHECK(fs::exists(dir / "run" / "trace.json"));
    CHECK(fs::exists(dir / "run" / "trace.rank1.json"));
    fs::remove_all(dir);
  }
}
