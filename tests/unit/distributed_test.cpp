// Data parallel on c10d: launcher environments, 2 ranks with Gloo on loopback against one process
// over the same data, resume of a 2-rank run, a dead rank that the others report in bounded time,
// and a job whose backend takes tensors on one device only, as NCCL does.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <sys/wait.h>
#include <thread>

#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include "test_trials.hpp"
#include "applied_context.hpp"
#include "ranks.hpp"

using namespace dettrial;
namespace fs = std::filesystem;

namespace {

LaunchEnvironment detect(std::map<std::string, std::string> vars) {
  return LaunchEnvironment::detect([vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

/// A linear layer whose parameters are made on `device` from a CPU one's. LibTorch's Module::to
/// cannot move parameters to the lazy device (it keeps each variable and swaps its data, which needs
/// the same tensor type), so the stand-in device's models are made there.
struct OnDeviceLinearImpl : torch::nn::Module {
  OnDeviceLinearImpl(const torch::nn::Linear& cpu, torch::Device device)
      : weight(register_parameter("weight", cpu->weight.detach().to(device))),
        bias(register_parameter("bias", cpu->bias.detach().to(device))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(OnDeviceLinear);

/// The same regression over 640 records, without dropout (its masks would differ between one
/// batch of 64 and two of 32), SGD with momentum, shuffled.
struct DataParallelTrial : test::DeclarativeRegression {
  explicit DataParallelTrial(Context& c) : DeclarativeRegression(c) { records = 640; }
  torch::nn::Sequential build_model() {
    torch::nn::Linear first(4, 16);
    torch::nn::Linear second(16, 1);
    if (context.device().type() == torch::kLazy)
      return torch::nn::Sequential(OnDeviceLinear(first, context.device()), torch::nn::Tanh(), OnDeviceLinear(second, context.device()));
    return torch::nn::Sequential(first, torch::nn::Tanh(), second);
  }
  torch::optim::SGD optimizer(torch::nn::Sequential& model) {
    return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.02).momentum(context.get_hparam<double>("momentum")));
  }
  Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
    if (const char* die = std::getenv("DETTRIAL_DIE_AT"); die && context.distributed().rank == 1 && i == std::atoll(die))
      std::_Exit(3);  // a rank that dies mid-run
    return DeclarativeRegression::train_batch(b, model, e, i);
  }
};

/// Momentum 0 for the stand-in device: LibTorch's optimizer archive cannot write lazy tensors.
Hyperparameters data_parallel_hparams(double momentum = 0.9) {
  return Hyperparameters::parse("global_batch_size: 64\nlr: 0.02\nmomentum: " + std::to_string(momentum) + "\n");
}

FitOptions data_parallel_options(const fs::path& out, std::int64_t length) {
  FitOptions o{.max_length = Batch(length), .validation_period = Batch(25), .reporting_period = Batch(10)};
  o.output_dir = out;
  o.report.quiet = true;
  return o;
}

/**
 * A c10d backend standing in for NCCL on machines without GPUs: its collectives take tensors on one
 * device only and refuse any other, as ProcessGroupNCCL refuses CPU tensors. Its device is
 * LibTorch's lazy (TorchScript) device, which is not the CPU but keeps its data on the host, so a
 * whole job can run on it; the collectives run on host copies through a real Gloo group.
 */
class OneDeviceBackend final : public dettrial::detail::C10dBackend {
 public:
  OneDeviceBackend(c10::intrusive_ptr<dettrial::detail::C10dBackend> inner, torch::Device device)
      : dettrial::detail::C10dBackend(inner->getRank(), inner->getSize()), inner_(std::move(inner)), device_(device) {}
  const std::string getBackendName() const override { return "one-device"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& options) override {
    std::vector<at::Tensor> host = to_host("broadcast", tensors);
    auto work = inner_->broadcast(host, options);
    return finish(work, host, tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& options) override {
    std::vector<at::Tensor> host = to_host("all-reduce", tensors);
    auto work = inner_->allreduce(host, options);
    return finish(work, host, tensors);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& options) override {
    std::vector<at::Tensor> host_in = to_host("all-gather", inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    for (auto& out : outputs) host_out.push_back(to_host("all-gather output", out));
    auto work = inner_->allgather(host_out, host_in, options);
    work->wait();
    for (std::size_t i = 0; i < outputs.size(); ++i)
      for (std::size_t j = 0; j < outputs[i].size(); ++j) outputs[i][j].copy_(host_out[i][j]);
    return work;
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& options) override { return inner_->barrier(options); }

  /// How many collectives of each kind took tensors on the device.
  std::map<std::string, int> seen;

 private:
  std::vector<at::Tensor> to_host(const std::string& what, const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> host;
    for (const at::Tensor& t : tensors) {
      if (t.device() != device_)
        throw std::runtime_error(what + " was given a tensor on " + t.device().str() + "; this backend takes tensors on " + device_.str() +
                                 " only");
      host.push_back(t.cpu());
    }
    ++seen[what];
    return host;
  }
  static c10::intrusive_ptr<c10d::Work> finish(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor>& host,
                                               std::vector<at::Tensor>& tensors) {
    work->wait();
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(host[i]);
    return work;
  }

  c10::intrusive_ptr<dettrial::detail::C10dBackend> inner_;
  torch::Device device_;
};

/// The stand-in device: the lazy TorchScript backend's (data on the host, but not the CPU device).
torch::Device one_device() { return test::lazy_device(); }

void check_matches_one_process(const fs::path& dir, std::int64_t length, double momentum = 0.9);

bool all_succeeded(const std::vector<int>& statuses) {
  for (const int s : statuses)
    if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) return false;
  return true;
}

/// Every rank of a run in `dir` ended by itself, in time, with status 0 (its log shown when not).
void require_ranks_succeeded(const fs::path& dir, const std::vector<int>& statuses, const std::vector<bool>& in_time) {
  for (std::size_t rank = 0; rank < statuses.size(); ++rank) {
    CAPTURE(test::read_text(dir / ("rank" + std::to_string(rank) + ".log")));
    REQUIRE(in_time[rank]);
    REQUIRE(WIFEXITED(statuses[rank]));
    REQUIRE(WEXITSTATUS(statuses[rank]) == 0);
  }
}

/// Runs the data-parallel child test case as 2 ranks; returns their exit statuses.
std::vector<int> run_two_ranks(const fs::path& dir, const std::vector<std::string>& extra_env, std::chrono::seconds limit,
                               std::vector<bool>& in_time) {
  // A port the kernel says is free now (the last run's may still be in TIME_WAIT, and a fixed range
  // would meet the ephemeral ports other tests' connections hold).
  const std::string port = std::to_string(dettrial::detail::free_local_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env = {"RANK=" + std::to_string(rank), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                    "DETTRIAL_CHILD_DIR=" + dir.string()};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    pids.push_back(test::spawn_self("child process: a data-parallel rank", env, (dir / ("rank" + std::to_string(rank) + ".log")).string()));
  }
  std::vector<int> statuses;
  in_time.assign(2, false);
  for (int rank = 0; rank < 2; ++rank) {
    bool ok = false;
    statuses.push_back(test::wait_for(pids[rank], limit, ok));
    in_time[rank] = ok;
  }
  return statuses;
}

}  // namespace

TEST_CASE("the launcher's environment gives rank, world size and rendezvous") {
  CHECK(detect({}).launcher == Launcher::single);
  CHECK(!detect({}).distributed());

  const LaunchEnvironment torchrun = detect({{"RANK", "3"},
                                             {"GROUP_RANK", "1"},
                                             {"LOCAL_RANK", "1"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"WORLD_SIZE", "4"},
                                             {"MASTER_ADDR", "node7"},
                                             {"MASTER_PORT", "29400"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "2"}});
  CHECK(torchrun.launcher == Launcher::torchrun);
  CHECK(torchrun.rank == 3);
  CHECK(torchrun.size == 4);
  CHECK(torchrun.local_rank == 1);
  CHECK(torchrun.master_addr == "node7");
  CHECK(torchrun.master_port == 29400);
  CHECK(torchrun.agent_store);
  CHECK(torchrun.store_prefix == "/worker/attempt_2");

  const LaunchEnvironment slurm = detect({{"SLURM_PROCID", "5"},
                                          {"SLURM_NTASKS", "8"},
                                          {"SLURM_LOCALID", "1"},
                                          {"SLURM_JOB_NODELIST", "gpu[03-06,9],cpu1"},
                                          {"SLURM_JOB_ID", "123456"}});
  CHECK(slurm.launcher == Launcher::slurm);
  CHECK(slurm.rank == 5);
  CHECK(slurm.size == 8);
  CHECK(slurm.master_addr == "gpu03");
  CHECK(slurm.master_port == 10000 + 123456 % 20000);

  const LaunchEnvironment ompi =
      detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"MASTER_PORT", "30000"}});
  CHECK(ompi.launcher == Launcher::mpi);
  CHECK(ompi.rank == 1);
  CHECK(ompi.size == 2);
  CHECK(ompi.master_port == 30000);
  CHECK(detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}}).size == 3);

  const LaunchEnvironment plain = detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(plain.launcher == Launcher::env);
  CHECK(plain.master_addr == "127.0.0.1");
  CHECK(plain.master_port == 29500);

  CHECK_THROWS_WITH_AS(detect({{"RANK", "two"}, {"WORLD_SIZE", "2"}}), doctest::Contains("RANK='two' is not a non-negative integer"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(detect({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), doctest::Contains("gives rank 2 in a world of 2"), ConfigError);
}

TEST_CASE("child process: a data-parallel rank" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  REQUIRE(env.distributed());
  const fs::path dir = std::getenv("DETTRIAL_CHILD_DIR");
  const auto timeout = std::chrono::seconds(std::atoi(std::getenv("DETTRIAL_TIMEOUT") ? std::getenv("DETTRIAL_TIMEOUT") : "60"));
  auto comm = Communicator::create(env, timeout, backend::gloo{});
  ContextOptions options{.trial_seed = 17, .communicator = comm};
  // The stand-in for NCCL: every tensor of the job, and of every collective, on one device.
  OneDeviceBackend* one_device_backend = nullptr;
  if (std::getenv("DETTRIAL_ONE_DEVICE")) {
    auto backend = c10::make_intrusive<OneDeviceBackend>(comm->backend(), one_device());
    one_device_backend = backend.get();
    options.communicator = Communicator::adopt(backend, env, timeout, one_device(), "one-device");
    options.device = one_device();
    // A CPU tensor is refused with the device named (both ranks: nothing reaches the group).
    std::vector<torch::Tensor> cpu{torch::zeros({2})};
    CHECK_THROWS_WITH_AS(options.communicator->allreduce(cpu), doctest::Contains("this backend takes tensors on lazy:0 only"),
                         DistributedError);
    one_device_backend->seen.clear();
  }
  options.rank_invariant = std::getenv("DETTRIAL_RANK_INVARIANT") != nullptr;
  test::Context context(data_parallel_hparams(one_device_backend ? 0.0 : 0.9), std::move(options));
  Trainer<DataParallelTrial> trainer(context);
  const std::int64_t length = std::atoll(std::getenv("DETTRIAL_LENGTH") ? std::getenv("DETTRIAL_LENGTH") : "50");
  FitOptions o = data_parallel_options(dir / "run", length);
  if (const char* resume = std::getenv("DETTRIAL_RESUME")) o.latest_checkpoint = resume;
  if (std::getenv("DETTRIAL_ZERO")) o.zero_stage = ZeroStage::optimizer_state;
  // Every rank hears of each checkpoint (the chief alone writes it).
  struct Uploads {
    std::vector<std::string> uuids;
    void on_checkpoint_upload_end(const std::string& uuid) { uuids.push_back(uuid); }
  } uploads;
  const FitResult r = trainer.fit(o, uploads);
  REQUIRE(!uploads.uuids.empty());
  CHECK(uploads.uuids.back().size() == 36);
  if (env.rank == 0) CHECK(uploads.uuids.back() == r.checkpoints.back().uuid);
  CHECK(fs::exists(dir / "run" / "checkpoints" / uploads.uuids.back() / "metadata.json"));  // the final one, kept
  if (one_device_backend) {
    std::ofstream seen(dir / ("rank" + std::to_string(env.rank) + ".collectives"));
    for (const auto& [what, count] : one_device_backend->seen) seen << what << ": " << count << "\n";
  }
}

TEST_CASE("2 ranks with Gloo train as one process does with the whole batch" * doctest::timeout(120)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<bool> in_time;
  const std::vector<int> statuses = run_two_ranks(dir, {}, std::chrono::seconds(90), in_time);
  require_ranks_succeeded(dir, statuses, in_time);

  check_matches_one_process(dir, 50);
}

TEST_CASE("a backend that takes tensors on one device only (as NCCL does) gets every collective's tensors there" * doctest::timeout(150)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<bool> in_time;
  const std::vector<int> statuses = run_two_ranks(dir, {"DETTRIAL_ONE_DEVICE=1"}, std::chrono::seconds(120), in_time);
  require_ranks_succeeded(dir, statuses, in_time);
  for (int rank = 0; rank < 2; ++rank) {
    // Gradients, metrics, validation, checkpoints and the start-up agreement all went through it.
    const std::string seen = test::read_text(dir / ("rank" + std::to_string(rank) + ".collectives"));
    CAPTURE(seen);
    CHECK(seen.find("all-reduce: ") != std::string::npos);
    CHECK(seen.find("broadcast: ") != std::string::npos);
    CHECK(seen.find("all-gather: ") != std::string::npos);
  }
  check_matches_one_process(dir, 50, /*momentum=*/0.0);
}

TEST_CASE("rank_invariant on a backend that takes tensors on one device only gathers every gradient there" * doctest::timeout(150)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<bool> in_time;
  const std::vector<int> statuses =
      run_two_ranks(dir, {"DETTRIAL_ONE_DEVICE=1", "DETTRIAL_RANK_INVARIANT=1"}, std::chrono::seconds(120), in_time);
  require_ranks_succeeded(dir, statuses, in_time);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string seen = test::read_text(dir / ("rank" + std::to_string(rank) + ".collectives"));
    CAPTURE(seen);
    CHECK(seen.find("all-gather: ") != std::string::npos);
  }
  // Equal batches without dropout: the ordered, record-weighted sum is the all-reduce's average.
  check_matches_one_process(dir, 50, /*momentum=*/0.0);
}

TEST_CASE("ZeRO-1 on a backend that takes tensors on one device only (as NCCL does) gathers its shards there" * doctest::timeout(150)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<bool> in_time;
  // 10 batches: the lazy device's graph of the pieces' views grows with every update until the run ends.
  const std::vector<int> statuses =
      run_two_ranks(dir, {"DETTRIAL_ONE_DEVICE=1", "DETTRIAL_ZERO=1", "DETTRIAL_LENGTH=10"}, std::chrono::seconds(120), in_time);
  require_ranks_succeeded(dir, statuses, in_time);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string seen = test::read_text(dir / ("rank" + std::to_string(rank) + ".collectives"));
    CAPTURE(seen);
    // The parameters' after each of the 10 updates (one bucket), besides the metrics' and the checkpoint's.
    const std::size_t at = seen.find("all-gather: ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoi(seen.substr(at + 12)) >= 10);
  }
  check_matches_one_process(dir, 10, /*momentum=*/0.0);
}

TEST_CASE("a backend on a device other than the context's is refused with both devices named") {
  if (test::skip_without_gloo()) return;
  // One rank of a 1-rank group is enough to build the communicator; the check needs a size-2 world,
  // so a second (idle) rank is faked by the environment's size and a backend that never runs.
  LaunchEnvironment env;
  env.rank = 0;
  env.size = 2;
  struct Idle final : dettrial::detail::C10dBackend {
    Idle() : dettrial::detail::C10dBackend(0, 2) {}
    const std::string getBackendName() const override { return "idle"; }
  };
  auto comm = Communicator::adopt(c10::make_intrusive<Idle>(), env, std::chrono::seconds(5), one_device(), "one-device");
  CHECK_THROWS_WITH_AS(Context(data_parallel_hparams(), ContextOptions{.device = torch::Device(torch::kCPU), .communicator = comm}),
                       doctest::Contains("the one-device backend of rank 0 takes tensors on lazy:0, but this process's device is cpu"),
                       ConfigError);
}

TEST_CASE("NCCL with more ranks on a node than GPUs is refused before the rendezvous, with both counts named") {
  if (!backend::has_nccl) return test::skip("the NCCL backend is not in this build (LibTorch without CUDA, or DETTRIAL_NCCL off)");
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  LaunchEnvironment env;  // rank 0 of 3 on this node; nothing listens: the refusal must come first
  env.rank = 0;
  env.size = 3;
  env.local_size = gpus + 1;
  env.master_port = 1;
  const std::string expected = "the NCCL backend takes one GPU per rank, and this node runs " + std::to_string(gpus + 1) +
                               " rank(s) but sees " + (gpus == 0 ? std::string("no GPU") : std::to_string(gpus) + " GPU(s)") +
                               "; start at most one rank per GPU, or use the Gloo backend";
  CHECK_THROWS_WITH_AS(Communicator::create(env, std::chrono::seconds(5), backend::nccl{}), doctest::Contains(expected.c_str()),
                       DistributedError);
}

TEST_CASE("NCCL takes a job only where every rank has a GPU of its own, compared by the GPUs' UUIDs") {
  using dettrial::detail::why_not_one_gpu_per_rank;
  CHECK(why_not_one_gpu_per_rank({"GPU-a", "GPU-b", "GPU-c"}).empty());
  CHECK(why_not_one_gpu_per_rank({"GPU-a", "GPU-b", "GPU-a"}) == "ranks 0 and 2 would both use GPU GPU-a");
  CHECK(why_not_one_gpu_per_rank({"GPU-a", "", "GPU-a"}) == "rank 1 has no GPU of its own");
  CHECK(why_not_one_gpu_per_rank({"GPU-a"}).empty());
}

TEST_CASE("child process: a rank that joins with the default backend or NCCL and writes which it got" * doctest::skip()) {
  const LaunchEnvironment env = LaunchEnvironment::detect();
  std::ofstream out(fs::path(std::getenv("DETTRIAL_CHILD_DIR")) / ("backend" + std::to_string(env.rank) + ".txt"));
  try {
    const auto comm = std::string(std::getenv("BACKEND")) == "nccl"
                          ? Communicator::create(env, std::chrono::seconds(60), backend::nccl{})
                          : Communicator::create(env, std::chrono::seconds(60), backend::gpu_or_gloo{});
    out << comm->backend_name();
  } catch (const DistributedError& e) {
    out << "error: " << e.what();
  }
}

TEST_CASE("two launchers' nodes on one machine (one local rank each) get Gloo by default, and NCCL there is refused naming both ranks") {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  // Each rank is its node's only one (LOCAL_RANK 0 of 1), as under torchrun --nnodes 2 on one host.
  const std::vector<std::string> two_nodes = {"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"};
  auto backends = [&](const char* requested) {
    std::vector<std::string> extra = two_nodes;
    extra.push_back(std::string("BACKEND=") + requested);
    test::run_ranks("child process: a rank that joins with the default backend or NCCL and writes which it got", 2, dir, extra);
    return std::pair{test::read_text(dir / "backend0.txt"), test::read_text(dir / "backend1.txt")};
  };
  // Every rank would use GPU 0 here (with a GPU) or has none (without): Gloo, on both.
  CHECK(backends("default") == std::pair<std::string, std::string>{"gloo", "gloo"});
  if (!backend::has_nccl || torch::cuda::device_count() == 0) return;  // the refusal needs a GPU to share
  const auto [first, second] = backends("nccl");
  for (const std::string& got : {first, second}) {
    CHECK_MESSAGE(got.find("the NCCL backend takes one GPU per rank, but ranks 0 and 1 would both use GPU GPU-") != std::string::npos, got);
    CHECK_MESSAGE(got.find("or use the Gloo backend (--backend gloo)") != std::string::npos, got);
  }
}

namespace {
/// The 2-rank run in `dir` (its chief's checkpoint and reports) against one process with the same
/// seed and global batch 64 over the same data order: the same parameters and losses to float rounding.
void check_matches_one_process(const fs::path& dir, std::int64_t length, double momentum) {
  test::Context context(data_parallel_hparams(momentum), ContextOptions{.trial_seed = 17});
  Trainer<DataParallelTrial> single(context);
  const FitResult r = single.fit(data_parallel_options(dir / "single", length));

  torch::nn::Sequential ranked = DataParallelTrial(context).build_model();
  load_model(dir / "run", *ranked);
  const auto a = single.model()->parameters();
  const auto b = ranked->parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const torch::Tensor single_param = a[i].cpu();  // on the GPU where there is one; `ranked` is on the CPU
    const double rel = ((single_param - b[i]).norm() / single_param.norm()).item<double>();
    CAPTURE(i);
    CHECK(rel < 1e-5);
  }
  // The chief's reports: the same training and validation losses (to float rounding).
  std::optional<double> training_loss, validation_loss;
  for (const nlohmann::json& report : test::read_reports(dir / "run" / "metrics.jsonl")) {
    if (report["batches"].get<int>() != length) continue;
    if (report["type"].get<std::string>() == "training") training_loss = report["metrics"]["loss"].get<double>();
    else if (report["type"].get<std::string>() == "validation") validation_loss = report["metrics"]["validation_loss"].get<double>();
  }
  REQUIRE(training_loss);
  REQUIRE(validation_loss);
  CHECK(*training_loss == doctest::Approx(r.last_training_metrics.at("loss")).epsilon(1e-5));
  CHECK(*validation_loss == doctest::Approx(r.last_validation_metrics.at("validation_loss")).epsilon(1e-5));
}
}  // namespace

TEST_CASE("a 2-rank run resumed from its checkpoint reproduces the uninterrupted run" * doctest::timeout(150)) {
  if (test::skip_without_gloo()) return;
  const fs::path straight = test::quiet({}).output_dir, split = test::quiet({}).output_dir;
  fs::create_directories(straight);
  fs::create_directories(split);
  std::vector<bool> in_time;
  REQUIRE(all_succeeded(run_two_ranks(straight, {"DETTRIAL_LENGTH=30"}, std::chrono::seconds(90), in_time)));
  REQUIRE(all_succeeded(run_two_ranks(split, {"DETTRIAL_LENGTH=12"}, std::chrono::seconds(90), in_time)));
  REQUIRE(all_succeeded(
      run_two_ranks(split, {"DETTRIAL_LENGTH=30", "DETTRIAL_RESUME=" + (split / "run").string()}, std::chrono::seconds(90), in_time)));
  test::Context context(data_parallel_hparams(), ContextOptions{.trial_seed = 1});
  torch::nn::Sequential x = DataParallelTrial(context).build_model(), y = DataParallelTrial(context).build_model();
  load_model(straight / "run", *x);
  load_model(split / "run", *y);
  CHECK(test::bit_identical(x->parameters(), y->parameters()));
}

TEST_CASE("when a rank dies, the other stops within its timeout with an error naming itself" * doctest::timeout(120)) {
  if (test::skip_without_gloo()) return;
  const fs::path dir = test::quiet({}).output_dir;
  fs::create_directories(dir);
  std::vector<bool> in_time;
  const auto started = std::chrono::steady_clock::now();
  const std::vector<int> statuses = run_two_ranks(dir, {"DETTRIAL_DIE_AT=7", "DETTRIAL_TIMEOUT=5"}, std::chrono::seconds(60), in_time);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  REQUIRE(in_time[0]);
  CHECK(WIFEXITED(statuses[1]));
  CHECK(WEXITSTATUS(statuses[1]) == 3);
  CHECK(WIFEXITED(statuses[0]));
  CHECK(WEXITSTATUS(statuses[0]) != 0);
  const std::string log = test::read_text(dir / "rank0.log");
  CAPTURE(log);
  CHECK(log.find("rank 0 of 2: ") != std::string::npos);
  CHECK(log.find("another rank has died") != std::string::npos);
  CHECK(seconds < 45);
}
