// Checkpoints and step time: an MLP of wide layers (25.2 M parameters, 101 MB, and Adam's two
// moments: 302 MB of state) trained with a checkpoint every 50 batches, written in the background
// (the default) and in the step loop, against the same run without checkpoints; each batch's time
// from its start to the next batch's (so a checkpoint's stall counts in the batch before it). Rows: p50
// and p99 of each, the ratios to the run without checkpoints, the host memory the process holds
// after its first and last checkpoint (the snapshot is reused, not grown), and the checkpoint's
// bytes against Python's torch.save of the same state dicts (with --python PY: PyPI's torch).
// Prints JSON lines for bench/table.py.
//   checkpoint_bench [--quick] [--python PY]   (--quick: a narrower network, few batches)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace {

using Clock = std::chrono::steady_clock;

struct Sizes {
  std::int64_t width = 4096, io = 1024, batch = 512, batches = 200, period = 50;
};

struct WideMlpTrial {
  dettrial::Context& context;
  Sizes sizes;
  /// When each batch's train_batch began: the time between two is a whole step, boundaries included.
  std::vector<Clock::time_point> starts;
  WideMlpTrial(dettrial::Context& c, Sizes s) : context(c), sizes(s) {}
  torch::nn::Sequential build_model() {
    return torch::nn::Sequential(torch::nn::Linear(sizes.io, sizes.width), torch::nn::ReLU(), torch::nn::Linear(sizes.width, sizes.width),
                                 torch::nn::ReLU(), torch::nn::Linear(sizes.width, sizes.io));
  }
  torch::optim::Adam optimizer(torch::nn::Sequential& model) {
    return torch::optim::Adam(model->parameters(), torch::optim::AdamOptions(1e-4));
  }
  auto build_training_data_loader() {
    const torch::Tensor x = torch::randn({sizes.batch * 4, sizes.io});
    return dettrial::DataLoader(dettrial::TensorDataset(x, x.flip(1)), {.batch_size = sizes.batch, .shuffle = true});
  }
  auto build_validation_data_loader() {
    const torch::Tensor x = torch::randn({sizes.batch, sizes.io});
    return dettrial::DataLoader(dettrial::TensorDataset(x, x.flip(1)), {.batch_size = sizes.batch});
  }
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;
  dettrial::Metrics train_batch(Batch& b, torch::nn::Sequential& model, std::int64_t, std::int64_t) {
    starts.push_back(Clock::now());
    auto& [x, y] = b;
    return {{"loss", torch::mse_loss(model->forward(x), y)}};
  }
  dettrial::Metrics evaluate_batch(Batch& b, torch::nn::Sequential& model) {
    auto& [x, y] = b;
    return {{"validation_loss", torch::mse_loss(model->forward(x), y)}};
  }
};

/// The process's resident memory, in bytes (VmRSS).
double resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  return 0;
}

/// The resident memory after each checkpoint.
struct Timeline {
  std::vector<double> resident_after_checkpoint;
  void on_checkpoint_write_end(const std::filesystem::path&) { resident_after_checkpoint.push_back(resident_bytes()); }
};

enum class Mode { none, background, in_loop };

struct RunResult {
  std::vector<double> step_seconds;
  std::vector<double> resident_after_checkpoint;
  std::filesystem::path checkpoint;
};

RunResult run(Mode mode, const Sizes& sizes, const std::filesystem::path& output) {
  std::filesystem::remove_all(output);
  dettrial::Context context(dettrial::Hyperparameters{}, dettrial::ContextOptions{.trial_seed = 3});
  context.process_settings().apply();  // threads, determinism, allocator, the trial's seed
  dettrial::Trainer<WideMlpTrial> trainer(context, sizes);
  dettrial::FitOptions o{.max_length = dettrial::Batch(sizes.batches), .reporting_period = dettrial::Batch(1'000'000)};
  o.checkpoint_period = mode == Mode::none ? dettrial::Batch(1'000'000) : dettrial::Batch(sizes.period);
  o.checkpoint_policy = dettrial::CheckpointPolicy::none;
  o.retention = {.save_trial_best = 0, .save_trial_latest = 1};
  o.async_checkpoints = mode != Mode::in_loop;
  o.output_dir = output;
  o.report.quiet = true;
  o.handle_signals = false;
  Timeline timeline;
  const dettrial::FitResult r = trainer.fit(o, timeline);
  RunResult out{.resident_after_checkpoint = timeline.resident_after_checkpoint,
                .checkpoint = r.checkpoints.empty() ? std::filesystem::path() : r.checkpoints.back().path};
  // The first batch warms up (allocations): left out, as the first of each run.
  const auto& starts = trainer.trial().starts;
  for (std::size_t i = 2; i < starts.size(); ++i)
    out.step_seconds.push_back(std::chrono::duration<double>(starts[i] - starts[i - 1]).count());
  return out;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

/// Python's torch.save of the checkpoint's model, optimizer and scheduler state dicts, in bytes (0: no Python).
double python_save_bytes(const std::string& python, const std::filesystem::path& checkpoint) {
  if (python.empty()) return 0;
  const std::string command = python +
                              " -c 'import io, sys, torch; s = torch.load(sys.argv[1], map_location=\"cpu\"); b = io.BytesIO(); "
                              "torch.save({\"model\": s[\"models_state_dict\"][0], \"optimizer\": s[\"optimizers_state_dict\"][0], "
                              "\"lr_scheduler\": s[\"lr_schedulers_state_dict\"]}, b); print(b.getbuffer().nbytes)' '" +
                              (checkpoint / "state_dict.pth").string() + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return 0;
  double bytes = 0;
  if (std::fscanf(pipe, "%lf", &bytes) != 1) bytes = 0;
  ::pclose(pipe);
  return bytes;
}

void print(const std::string& name, double value, const char* unit, double spread = 1.0) {
  std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"spread\": %.4g}\n", name.c_str(), value, unit, spread);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Sizes sizes;
  std::string python;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") sizes = Sizes{.width = 512, .io = 256, .batch = 64, .batches = 60, .period = 20};
    else if (arg == "--python" && i + 1 < argc) python = argv[++i];
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-checkpoint-bench-" + std::to_string(::getpid()));
  // Alternated, so that the machine's drift falls on all three alike.
  const RunResult none = run(Mode::none, sizes, dir / "none");
  const RunResult background = run(Mode::background, sizes, dir / "background");
  const RunResult in_loop = run(Mode::in_loop, sizes, dir / "in-loop");
  const double parameters = static_cast<double>(sizes.io * sizes.width * 2 + sizes.width * sizes.width + sizes.width * 2 + sizes.io);
  char what[160];
  std::snprintf(what, sizeof what, "MLP %lld-%lld-%lld-%lld (%.0f MB + Adam), batch %lld, checkpoint every %lld batches",
                static_cast<long long>(sizes.io), static_cast<long long>(sizes.width), static_cast<long long>(sizes.width),
                static_cast<long long>(sizes.io), parameters * 4 / 1e6, static_cast<long long>(sizes.batch),
                static_cast<long long>(sizes.period));
  const std::string name = what;
  for (const double p : {0.5, 0.99}) {
    const std::string label = p == 0.5 ? "p50" : "p99";
    const double base = percentile(none.step_seconds, p);
    print(name + ": step time " + label + ", no checkpoints", base, "s");
    print(name + ": step time " + label + ", checkpoints in the background", percentile(background.step_seconds, p), "s");
    print(name + ": step time " + label + ", checkpoints in the step loop", percentile(in_loop.step_seconds, p), "s");
    print(name + ": step time " + label + " with background checkpoints / without" + (p == 0.5 ? "" : " (target <= 1.10)"),
          percentile(background.step_seconds, p) / base, "x");
    print(name + ": step time " + label + " with step-loop checkpoints / without", percentile(in_loop.step_seconds, p) / base, "x");
  }
  // The slowest step: the one that takes the snapshot, or one the writer slowed most.
  const double slowest_none = percentile(none.step_seconds, 1.0), slowest_background = percentile(background.step_seconds, 1.0);
  print(name + ": slowest step, no checkpoints", slowest_none, "s");
  print(name + ": slowest step, background checkpoints", slowest_background, "s");
  print(name + ": slowest step with background checkpoints / without", slowest_background / slowest_none, "x");
  if (background.resident_after_checkpoint.size() >= 2)
    print(name + ": resident memory growth from the first background checkpoint to the last",
          (background.resident_after_checkpoint.back() - background.resident_after_checkpoint.front()) / 1e6, "MB");
  if (!background.checkpoint.empty()) {
    double files = 0;
    for (const auto& e : std::filesystem::directory_iterator(background.checkpoint)) files += static_cast<double>(e.file_size());
    print(name + ": checkpoint size", files / 1e6, "MB");
    if (const double python_bytes = python_save_bytes(python, background.checkpoint); python_bytes > 0)
      print(name + ": checkpoint size / Python's torch.save of the same state dicts", files / python_bytes, "x");
    else std::fprintf(stderr, "checkpoint_bench: no --python with torch given: the size is not compared with torch.save's\n");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
