// The fuzz targets of dettrial's readers of outside input: one libFuzzer program, the reader
// chosen by DETTRIAL_FUZZ_TARGET (one build for all: each translation unit with LibTorch costs a
// minute under clang's sanitizers). Every input must end in a value or an exception; a crash, a
// sanitizer's report, a leak or an allocation over libFuzzer's -malloc_limit_mb is a finding.
// docs/testing.md lists the targets, their corpora and how to run them.
#include <dettrial/dettrial.hpp>
#include <dettrial/search/experiment.hpp>
#include <dettrial/vision.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>

namespace {
namespace fs = std::filesystem;

/// A folder of this process for the readers that take a path (the IDX and CIFAR files, a
/// checkpoint's metadata.json, an experiment's events.jsonl): in /dev/shm where there is one, so
/// that a write is a copy in memory. Removed when the run ends (a crash leaves it, with the input).
const fs::path& scratch() {
  static const fs::path dir = [] {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("dettrial-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  static const bool removed_at_exit = std::atexit([] {
                                        std::error_code ignored;
                                        fs::remove_all(dir, ignored);
                                      }) == 0;
  (void)removed_at_exit;
  return dir;
}

void write(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The pickle machine alone, over a plain pickle (Determined's trial_state.pkl) or a torch.save
/// archive's data.pkl: storages come back as zeros of the element count asked, up to a bound (the
/// archive reader checks the count against its record before allocating).
void pickle(std::string_view bytes) {
  const dettrial::detail::PickleStorageLoader storages = [](const std::string&, c10::ScalarType dtype, std::int64_t numel) {
    if (numel < 0 || numel > (1 << 16)) throw std::runtime_error("storage too large for the fuzz target");
    return torch::zeros({numel}, torch::TensorOptions().dtype(dtype));
  };
  const c10::IValue value = dettrial::detail::unpickle(bytes, storages, dettrial::detail::UnreadObjects::mark);
  (void)dettrial::detail::python_object_type(value);
}

/// A whole torch.save archive (the zip container, its records, the pickle).
void archive(std::string_view bytes) {
  (void)dettrial::detail::unpickle_archive(std::string(bytes), "fuzz.pt", dettrial::detail::UnreadObjects::mark);
}

/// An experiment config (and its hyperparameters, as a search space and as values).
void config(std::string_view bytes) {
  const std::string text(bytes);
  try {
    const dettrial::ExperimentConfig c = dettrial::ExperimentConfig::parse(text, "fuzz.yaml");
    (void)dettrial::FitOptions::from_config(c);
  } catch (const dettrial::Error&) {
  }
  (void)dettrial::Hyperparameters::parse(text);
}

/// A checkpoint folder's metadata.json (dettrial's or Determined's).
void checkpoint_metadata(std::string_view bytes) {
  const fs::path dir = scratch() / "checkpoint";
  fs::create_directories(dir);
  write(dir / "metadata.json", bytes);
  (void)dettrial::read_checkpoint_info(dir, /*verify_files=*/true);
}

/// An IDX file (MNIST's), read as a tensor.
void idx(std::string_view bytes) {
  const fs::path file = scratch() / "images-idx3-ubyte";
  write(file, bytes);
  (void)dettrial::read_idx(file);
}

/// CIFAR-10's and CIFAR-100's binary batches.
void cifar(std::string_view bytes) {
  const fs::path dir = scratch() / "cifar";
  fs::create_directories(dir);
  write(dir / "test_batch.bin", bytes);
  write(dir / "test.bin", bytes);
  try {
    const auto ten = dettrial::vision::Cifar::ten(dir, dettrial::vision::CifarSplit::test);
    if (ten.size() > 0) (void)ten.load(ten.size() - 1, dettrial::vision::ImageMode::rgb);
  } catch (const dettrial::Error&) {
  }
  const auto hundred = dettrial::vision::Cifar::hundred(dir, dettrial::vision::CifarSplit::test);
  if (hundred.size() > 0) (void)hundred.load(0, dettrial::vision::ImageMode::gray);
}

std::span<const std::uint8_t> as_bytes(std::string_view bytes) {
  return {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()};
}

/// A JPEG, PNG or WebP file decoded whole, in both modes.
void image(std::string_view bytes) {
  try {
    (void)dettrial::vision::decode_image(as_bytes(bytes), dettrial::vision::ImageMode::rgb, "fuzz image");
  } catch (const dettrial::Error&) {
  }
  (void)dettrial::vision::decode_image(as_bytes(bytes), dettrial::vision::ImageMode::gray, "fuzz image");
}

/// The same files decoded through a window (a JPEG's scanlines only down to it), the window
/// chosen from the input's last bytes so that it moves with the mutations.
void image_window(std::string_view bytes) {
  const std::uint8_t a = bytes.empty() ? 0 : static_cast<std::uint8_t>(bytes.back());
  const std::uint8_t b = bytes.size() < 2 ? 0 : static_cast<std::uint8_t>(bytes[bytes.size() - 2]);
  const auto choose = [&](std::int64_t height, std::int64_t width) {
    dettrial::vision::PixelWindow w;
    w.top = height * (a % 16) / 32;
    w.left = width * (b % 16) / 32;
    w.height = std::max<std::int64_t>(1, (height - w.top) * (1 + a / 16) / 16);
    w.width = std::max<std::int64_t>(1, (width - w.left) * (1 + b / 16) / 16);
    if (a & 1) {
      w.at_least_height = std::max<std::int64_t>(1, w.height / 4);
      w.at_least_width = std::max<std::int64_t>(1, w.width / 4);
    }
    return w;
  };
  (void)dettrial::vision::decode_image_window(as_bytes(bytes), dettrial::vision::ImageMode::rgb, "fuzz image", choose);
}

/// An experiment folder's events.jsonl, replayed into an ASHA search as a runner continuing it
/// does, and read as the search's report reads it (the search of tests/experiment/asha.yaml, whose
/// runs wrote the seeds).
void events(std::string_view bytes) {
  static const dettrial::ExperimentConfig config = dettrial::ExperimentConfig::parse(R"(name: fuzz-asha
hyperparameters:
  global_batch_size: 16
  lr: {type: log, base: 10, minval: -4, maxval: -1}
searcher:
  {name: adaptive_asha, metric: validation_loss, max_trials: 12, max_time: 64, time_metric: batches, divisor: 2, mode: aggressive, max_concurrent_trials: 2}
min_validation_period: {batches: 4}
reproducibility: {experiment_seed: 5}
)",
                                                                                     "fuzz-asha.yaml");
  const fs::path dir = scratch() / "experiment";
  fs::create_directories(dir);
  write(dir / "events.jsonl", bytes);
  dettrial::Experiment experiment(config, {.output_dir = dir, .quiet = true});
  experiment.replay();
  (void)experiment.trials();
  (void)dettrial::detail::html::read_search_events(dir / "events.jsonl");
}

/// An MLflow server's answers: the input as the body of a success to each request whose answer
/// dettrial reads (ids of experiments and runs), and of a refusal; and as a run folder's
/// mlflow.json and mlflow-pending.jsonl.
void mlflow(std::string_view bytes) {
  namespace m = dettrial::detail::mlflow;
  const std::string uri = "http://mlflow.invalid", body(bytes);
  const auto refusable = [](auto&& read) {
    try {
      read();
    } catch (const dettrial::MlflowError&) {
    }
  };
  refusable([&] {
    const dettrial::detail::Json answer = m::answer_of({200, body}, uri, "runs/create");
    dettrial::detail::MlflowState state;
    refusable([&] { m::read_created_run(answer, uri, state); });
    refusable([&] { (void)m::answer_text(answer, {"experiment", "experiment_id"}, uri, "experiments/get-by-name"); });
    refusable([&] { (void)m::answer_text(answer, {"experiment_id"}, uri, "experiments/create"); });
  });
  // A refusal is an MlflowError with its status, whatever the body.
  const long status = bytes.empty() ? 500 : 400 + static_cast<unsigned char>(bytes[0]) % 200;
  try {
    (void)m::answer_of({status, body}, uri, "runs/log-batch");
    std::abort();
  } catch (const dettrial::MlflowError& e) {
    if (e.status != status) std::abort();
  }
  // A run folder's state reads back as it was written.
  const auto state = dettrial::detail::MlflowState::from_json(bytes);
  if (dettrial::detail::MlflowState::from_json(state.to_json()).to_json() != state.to_json()) std::abort();
  // A pending file's damaged line is an Error naming it; a torn last line is left out.
  std::istringstream pending(body);
  try {
    (void)dettrial::detail::read_mlflow_pending(pending, "fuzz.jsonl");
  } catch (const dettrial::Error& e) {
    if (std::string_view(e.what()).find("is not a JSON record") == std::string_view::npos) std::abort();
  }
}

/// A safetensors file (Hugging Face's weights), read whole: every tensor's range is checked before
/// it is allocated, so the file's size bounds what an input can make the reader hold.
void safetensors(std::string_view bytes) {
  std::istringstream in{std::string(bytes)};
  (void)dettrial::detail::read_safetensors_stream(in, bytes.size(), "'fuzz.safetensors'");
}

using Target = void (*)(std::string_view);
/// A target, and whether any exception may refuse its input or only dettrial's Error (whose
/// message names the problem; a library's own exception reaching a user is a finding).
struct Reader {
  Target read;
  bool only_dettrial_errors = false;
};
const std::map<std::string, Reader>& targets() {
  static const std::map<std::string, Reader> all = {{"pickle", {pickle}},
                                                    {"archive", {archive}},
                                                    {"config", {config}},
                                                    {"checkpoint_metadata", {checkpoint_metadata}},
                                                    {"idx", {idx}},
                                                    {"cifar", {cifar}},
                                                    {"image", {image}},
                                                    {"image_window", {image_window}},
                                                    {"events", {events, true}},
                                                    {"mlflow", {mlflow, true}},
                                                    {"safetensors", {safetensors, true}}};
  return all;
}

const Reader* chosen = nullptr;
bool verbose = false;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("DETTRIAL_FUZZ_TARGET");
  const auto it = name ? targets().find(name) : targets().end();
  if (it == targets().end()) {
    std::fprintf(stderr, "dettrial_fuzz: DETTRIAL_FUZZ_TARGET must name a target:");
    for (const auto& [n, t] : targets()) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  chosen = &it->second;
  verbose = std::getenv("DETTRIAL_FUZZ_VERBOSE") != nullptr;
  // LibTorch's refusals without a stack trace each (c10::Error collects one): twice the executions.
  ::setenv("TORCH_SHOW_CPP_STACKTRACES", "0", 0);
  // One thread: the readers are sequential, and LibTorch's pool would only add noise.
  torch::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    chosen->read(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const dettrial::Error& e) {
    // A refusal with a reason: what a bad file must get (DETTRIAL_FUZZ_VERBOSE prints it, to read
    // what a finding's input was refused with).
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
  } catch (const std::exception& e) {
    if (chosen->only_dettrial_errors) {
      std::fprintf(stderr, "dettrial_fuzz: refused with another library's exception, not dettrial's Error: %s\n", e.what());
      std::abort();
    }
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
  }
  return 0;
}
