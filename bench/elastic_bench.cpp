// Elastic resume: the time a run takes to resume at batch 10 and at batch 1,000,000 of one long
// epoch (2,000,000 shuffled records in batches of 1), from checkpoints the same run wrote at both
// batches: a resumed run skips to its position in O(1) (a batch is computed from seed, epoch and
// position), so both take the same time; a loader that replays the batches it skips would take
// about a million batches' reads longer. Each resume trains one batch, validates one batch and
// checkpoints; alternated, 15 rounds, medians. Also, with the same records, the time rank 0 of a
// 3-rank job takes to its first batch of a 2-rank run's global batch 10 and 500,000 (the regrouping
// a resume on another rank count reads through). Prints JSON lines for bench/table.py.
//   elastic_bench [--quick]   (--quick: batch 10 and batch 10,000)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t records = 2'000'000;

/// The 2,000,000 training records (x in [0, 1), y = 2x), read in one long epoch by every measurement.
dettrial::TensorDataset<2> long_epoch_records() {
  const torch::Tensor x = torch::arange(records, torch::kFloat).unsqueeze(1).div_(records);
  return dettrial::TensorDataset(x, x.mul(2));
}

struct LongEpochTrial {
  dettrial::Context& context;
  explicit LongEpochTrial(dettrial::Context& c) : context(c) {}
  torch::nn::Linear build_model() { return torch::nn::Linear(1, 1); }
  torch::optim::SGD optimizer(torch::nn::Linear& model) { return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(1e-3)); }
  auto build_training_data_loader() { return dettrial::DataLoader(long_epoch_records(), {.batch_size = 1, .shuffle = true}); }
  auto build_validation_data_loader() {
    const torch::Tensor x = torch::rand({4, 1});
    return dettrial::DataLoader(dettrial::TensorDataset(x, x.mul(2)), {.batch_size = 4});
  }
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& b, torch::nn::Linear& model, std::int64_t, std::int64_t) {
    auto& [x, y] = b;
    return {{"loss", torch::mse_loss(model->forward(x), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& b, torch::nn::Linear& model) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

dettrial::FitOptions options(std::int64_t batches, const std::filesystem::path& output) {
  dettrial::FitOptions o{.max_length = dettrial::Batch(batches), .reporting_period = dettrial::Batch(100'000)};
  o.checkpoint_policy = dettrial::CheckpointPolicy::none;
  o.output_dir = output;
  o.report.quiet = true;
  o.handle_signals = false;
  return o;
}

/// Seconds a fit resumed from `checkpoint` (at batch `at`) takes to train one batch and end.
double resume_seconds(const std::filesystem::path& checkpoint, std::int64_t at, const std::filesystem::path& output) {
  std::filesystem::remove_all(output);
  dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 3, .threads = 1});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<LongEpochTrial> trainer(context);
  dettrial::FitOptions o = options(at + 1, output);
  o.latest_checkpoint = checkpoint;
  const auto t0 = Clock::now();
  const dettrial::FitResult r = trainer.fit(o);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (r.resumed_from_batch != at || r.batches_trained != at + 1)
    throw std::runtime_error("the resume did not train one batch from its checkpoint");
  return seconds;
}

/// Seconds rank 0 of a 3-rank job takes, from asking a loader of the 2,000,000 records for the
/// global batches of a 2-rank layout (a 2-rank run resumed on 3) at global batch `at`, to its first
/// batch in hand: what a resume on another rank count adds to skipping.
double regrouped_first_batch_seconds(std::int64_t at) {
  const dettrial::DataLoader loader(long_epoch_records(), {.batch_size = 2, .shuffle = true, .seed = 3});
  const auto t0 = Clock::now();
  auto stream = loader.batches({.repeat = true, .skip = at, .num_replicas = 3, .rank = 0, .layout_replicas = 2});
  auto it = stream.begin();
  const torch::Tensor first = std::get<0>(*it);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (first.size(0) != 2) throw std::runtime_error("a 3-rank share of a global batch of 6 is not 2 records");
  return seconds;
}

/// Seconds a loader takes to read `count` batches of the 2,000,000 records from the start: what a
/// resume that replays the batches it skips would spend on reading alone.
double replay_seconds(std::int64_t count) {
  const dettrial::DataLoader loader(long_epoch_records(), {.batch_size = 1, .shuffle = true, .seed = 3});
  const auto t0 = Clock::now();
  std::int64_t n = 0;
  for (auto&& batch : loader.batches({.repeat = true})) {
    (void)batch;
    if (++n == count) break;
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const std::int64_t near = 10, far = quick ? 10'000 : 1'000'000;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-elastic-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // One run writes both checkpoints: at batch `near` and at batch `far` of its first epoch.
  std::filesystem::path at_near, at_far;
  {
    dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 3, .threads = 1});
    context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
    dettrial::Trainer<LongEpochTrial> trainer(context);
    dettrial::FitOptions o = options(far, dir / "run");
    o.checkpoint_period = dettrial::Batch::at({near, far});
    o.retention = {.save_trial_best = 0, .save_trial_latest = 2};
    const auto t0 = Clock::now();
    const dettrial::FitResult r = trainer.fit(o);
    std::fprintf(stderr, "elastic_bench: trained %lld batches in %.1f s\n", static_cast<long long>(r.batches_trained),
                 std::chrono::duration<double>(Clock::now() - t0).count());
    for (const auto& c : r.checkpoints) (c.batches_trained == near ? at_near : at_far) = c.path;
  }
  std::vector<double> near_s, far_s, regrouped_near_s, regrouped_far_s;
  for (int round = 0; round < 15; ++round) {  // alternated
    near_s.push_back(resume_seconds(at_near, near, dir / "resumed"));
    far_s.push_back(resume_seconds(at_far, far, dir / "resumed"));
    regrouped_near_s.push_back(regrouped_first_batch_seconds(near));
    regrouped_far_s.push_back(regrouped_first_batch_seconds(far / 2));  // a global batch of a 2-rank run holds 2 of one rank's
  }
  std::filesystem::remove_all(dir);
  const double replay = replay_seconds(far);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const auto spread = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end());
  };
  const auto print = [](const std::string& name, double value, const char* unit, double spread) {
    std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g}\n", name.c_str(), value, unit, spread);
  };
  const std::string epoch = " of a 2,000,000-batch epoch";
  print("elastic resume at batch " + std::to_string(near) + epoch + " (restore, skip, 1 batch, end)", median(near_s), "s", spread(near_s));
  print("elastic resume at batch " + std::to_string(far) + epoch + " (restore, skip, 1 batch, end)", median(far_s), "s", spread(far_s));
  print("elastic resume time, batch " + std::to_string(far) + " / batch " + std::to_string(near), median(far_s) / median(near_s), "x", 1.0);
  print("for scale: reading the " + std::to_string(far) + " batches a replaying resume would pass over", replay, "s", 1.0);
  const std::string regrouped = "a 2-rank run's global batches read by rank 0 of 3: first batch at global batch ";
  print(regrouped + std::to_string(near), median(regrouped_near_s), "s", spread(regrouped_near_s));
  print(regrouped + std::to_string(far / 2), median(regrouped_far_s), "s", spread(regrouped_far_s));
  print("regrouped first batch, global batch " + std::to_string(far / 2) + " / " + std::to_string(near),
        median(regrouped_far_s) / median(regrouped_near_s), "x", 1.0);
  return 0;
}
