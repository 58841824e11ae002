// Seeing a run: TensorBoard event files (framing, checksums, resume), the profiler's Chrome trace,
// per-phase timings, and the HTML report. Python's own TensorBoard reader checks the files of a real
// run in tests/cli/observability.sh; here the format's pieces and the trainer's use of them.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <string>
#include <utility>
#include <vector>

// LibTorch before doctest (as the precompiled header has it): Debian's LibTorch brings glog, whose
// CHECK macro must not be the one the test cases use.
#include <dettrial/dettrial.hpp>
#include <dettrial/cli/detail/launcher.hpp>  // free_local_port
#include <dettrial/report/csv_log.hpp>

#include <doctest/doctest.h>

#include "test_trials.hpp"
#include "applied_context.hpp"

using namespace dettrial;
namespace tb = dettrial::detail::tensorboard;

namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dettrial-observability-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Every event of every file in `dir`, oldest file first.
std::vector<std::string> all_events(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& file : tb::event_files(dir)) {
    const tb::Records read = tb::read_records(file);
    CHECK_FALSE(read.torn);
    out.insert(out.end(), read.records.begin(), read.records.end());
  }
  return out;
}

/// How many events carry a value tagged `tag` (the tag's bytes, as a length-delimited field).
std::size_t count_tag(const std::vector<std::string>& events, const std::string& tag) {
  std::size_t n = 0;
  for (const auto& e : events) n += e.find(tag) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("CRC-32C and TFRecord framing are the published ones") {
  // The check value of CRC-32C (iSCSI, RFC 3720 B.4) and of the empty string.
  CHECK(tb::crc32c("123456789") == 0xE3069283u);
  CHECK(tb::crc32c("") == 0u);
  // 32 zero bytes: RFC 3720's first test vector.
  CHECK(tb::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  const std::string framed = tb::frame("abc");
  REQUIRE(framed.size() == 8 + 4 + 3 + 4);
  CHECK(static_cast<unsigned char>(framed[0]) == 3);  // little-endian length
  CHECK(framed.substr(12, 3) == "abc");
  // A varint step, as an Event carries it, reads back (negative steps too: ten-byte varints).
  for (const std::int64_t step : {std::int64_t{0}, std::int64_t{1}, std::int64_t{300}, std::int64_t{1} << 40, std::int64_t{-5}}) {
    tb::Message event;
    event.fixed64(1, 1.5).varint(2, static_cast<std::uint64_t>(step)).bytes(3, "x");
    CHECK(tb::event_step(event.str()) == step);
  }
}

TEST_CASE("a TensorBoard writer's file reads back record by record, and a torn tail is left out") {
  const auto dir = fresh_dir("writer");
  std::filesystem::path file;
  {
    TensorBoardWriter writer(dir);
    REQUIRE(writer.enabled());
    file = writer.file();
    CHECK(file.filename().string().rfind("events.out.tfevents.", 0) == 0);
    for (std::int64_t step = 1; step <= 5; ++step) writer.add_scalar("train/loss", 1.0 / static_cast<double>(step), step);
    writer.add_histogram("weights", torch::arange(100, torch::kFloat), 5, 10);
    writer.add_histogram("empty", torch::full({3}, std::nan("")), 5);  // only non-finite values: an empty histogram
    writer.add_hparams({{"lr", 0.1}, {"optimizer", std::string("sgd")}, {"nesterov", true}});
    writer.end_session(true);
  }
  tb::Records read = tb::read_records(file);
  CHECK_FALSE(read.torn);
  REQUIRE(read.records.size() == 1 + 5 + 2 + 2);
  CHECK(read.records[0].find("brain.Event:2") != std::string::npos);
  for (std::int64_t step = 1; step <= 5; ++step) CHECK(tb::event_step(read.records[static_cast<std::size_t>(step)]) == step);
  // A crash mid-record: the complete records are all still read.
  {
    std::ofstream(file, std::ios::app | std::ios::binary) << std::string("\x20\x00\x00\x00\x00\x00\x00\x00\x01\x02", 10);
  }
  read = tb::read_records(file);
  CHECK(read.torn);
  CHECK(read.records.size() == 10);
  // A flipped byte inside a record fails its checksum: reading stops before it.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::size_t first_record = tb::frame(read.records[0]).size();
  bytes[first_record + 14] ^= 0x40;
  {
    std::ofstream(file, std::ios::trunc | std::ios::binary) << bytes;
  }
  read = tb::read_records(file);
  CHECK(read.torn);
  CHECK(read.records.size() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("resuming at batch N removes the stopped run's events after N from the folder's event files") {
  const auto dir = fresh_dir("resume");
  {
    TensorBoardWriter writer(dir);
    writer.add_hparams({{"lr", 0.1}});
    for (std::int64_t step = 10; step <= 50; step += 10) writer.add_scalar("train/loss", static_cast<double>(step), step);
    writer.end_session(true);
  }
  {
    TensorBoardWriter resumed(dir, std::int64_t{30});
    CHECK(resumed.dropped() == 3);  // steps 40 and 50, and the session's end
    for (std::int64_t step = 40; step <= 60; step += 10) resumed.add_scalar("train/loss", static_cast<double>(step) + 0.5, step);
    resumed.end_session(true);
  }
  REQUIRE(tb::event_files(dir).size() == 2);
  std::vector<std::int64_t> steps;
  const auto events = all_events(dir);
  for (const auto& e : events)
    if (e.find("train/loss") != std::string::npos) steps.push_back(tb::event_step(e));
  CHECK(steps == std::vector<std::int64_t>{10, 20, 30, 40, 50, 60});
  CHECK(count_tag(events, "_hparams_/session_start_info") == 1);
  CHECK(count_tag(events, "_hparams_/session_end_info") == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("hyperparameters flatten for TensorBoard: dotted names, numbers, booleans, text") {
  const auto flat =
      dettrial::detail::flat_hparams(Hyperparameters::parse("global_batch_size: 8\nlr: 1.0e-3\noptimizer: adam\nnesterov: true\n"
                                                            "arch: {depth: 3, act: relu}\nsizes: [1, 2]\nversion: '2'\n"));
  std::map<std::string, HParamValue> by_name(flat.begin(), flat.end());
  CHECK(std::get<double>(by_name.at("global_batch_size")) == 8);
  CHECK(std::get<double>(by_name.at("lr")) == 1.0e-3);
  CHECK(std::get<std::string>(by_name.at("optimizer")) == "adam");
  CHECK(std::get<bool>(by_name.at("nesterov")));
  CHECK(std::get<double>(by_name.at("arch.depth")) == 3);
  CHECK(std::get<std::string>(by_name.at("arch.act")) == "relu");
  CHECK(std::get<std::string>(by_name.at("sizes")) == "[1, 2]");
  CHECK(std::get<std::string>(by_name.at("version")) == "2");  // quoted: text, as written
}

TEST_CASE("a fit writes TensorBoard scalars for its metrics, learning rate and timings, and the trial's own") {
  struct OwnScalars : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    dettrial::Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
      context.get_tensorboard_writer().add_scalar("mine/batch", static_cast<double>(i), i);
      return DeclarativeRegression::train_batch(b, model, e, i);
    }
  };
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<OwnScalars> trainer(context);
  // 64 records in batches of 8: 8 batches an epoch; reports every 3, validation every 4 (every
  // boundary reports the training since the last), one checkpoint at the end.
  const FitResult r = trainer.fit(test::quiet(
      {.max_length = Batch(10), .validation_period = Batch(4), .reporting_period = Batch(3), .checkpoint_policy = CheckpointPolicy::none}));
  CHECK(context.get_tensorboard_path() == r.output_dir / "tensorboard");
  const auto events = all_events(r.output_dir / "tensorboard");
  std::multiset<std::int64_t> loss_steps, validation_steps;
  for (const auto& e : events) {
    if (e.find("train/loss") != std::string::npos) loss_steps.insert(tb::event_step(e));
    if (e.find("validation/validation_loss") != std::string::npos) validation_steps.insert(tb::event_step(e));
  }
  CHECK(loss_steps == std::multiset<std::int64_t>{3, 4, 6, 8, 9, 10});
  CHECK(validation_steps == std::multiset<std::int64_t>{4, 8, 10});
  CHECK(count_tag(events, "train/lr") == 6);
  CHECK(count_tag(events, "train/samples_per_second") == 6);
  CHECK(count_tag(events, "timing/data_seconds") == 6);
  CHECK(count_tag(events, "timing/backward_seconds") == 6);
  CHECK(count_tag(events, "timing/validation_seconds") == 3);
  CHECK(count_tag(events, "timing/checkpoint_seconds") == 1);
  CHECK(count_tag(events, "mine/batch") == 10);
  CHECK(count_tag(events, "_hparams_/session_start_info") == 1);
  CHECK(count_tag(events, "_hparams_/session_end_info") == 1);
  // The counters are TensorBoard's step, not scalars of their own.
  CHECK(count_tag(events, "train/batches") == 0);
  // Logging off: no trainer scalars; the trial's own still go in.
  test::Context quiet_context(test::hparams(), ContextOptions{.trial_seed = 3});
  quiet_context.set_enable_tensorboard_logging(false);
  Trainer<OwnScalars> quiet_trainer(quiet_context);
  const FitResult q = quiet_trainer.fit(test::quiet({.max_length = Batch(4)}));
  const auto quiet_events = all_events(q.output_dir / "tensorboard");
  CHECK(count_tag(quiet_events, "train/loss") == 0);
  CHECK(count_tag(quiet_events, "mine/batch") == 4);
  std::filesystem::remove_all(r.output_dir);
  std::filesystem::remove_all(q.output_dir);
}

TEST_CASE("the reporter hands every report to each outlet in order: metrics.jsonl, metrics.csv, TensorBoard and one added") {
  const auto dir = fresh_dir("outlets");
  // An outlet of the test's own, added to the built-in ones: what it is handed, in order.
  struct Recording final : dettrial::detail::ReportOutlet {
    std::vector<std::string>* seen;
    explicit Recording(std::vector<std::string>& s) : seen(&s) {}
    void training(const dettrial::detail::TrainingReport& r) override {
      seen->push_back("training " + std::to_string(r.batches) + " loss " + std::to_string(r.metrics.at("loss")) + " " +
                      r.learning_rates.at(0).first);
    }
    void validation(const dettrial::detail::ValidationReport& r) override {
      seen->push_back("validation " + std::to_string(r.batches) + " records " + std::to_string(r.records));
    }
    void checkpoint(const dettrial::detail::CheckpointReport& r) override {
      seen->push_back("checkpoint " + std::to_string(r.batches) + " " + r.path.filename().string());
    }
    void system(const dettrial::detail::SystemMetricsReport& r) override {
      seen->push_back("system " + std::to_string(r.batches) + " " + std::to_string(r.report.values.size()));
    }
    void restart(const dettrial::detail::RestartReport& r) override {
      seen->push_back("restart " + std::to_string(r.ranks_before) + "->" + std::to_string(r.ranks));
    }
  };
  std::vector<std::string> seen;
  {
    TensorBoardWriter writer(dir / "tensorboard");
    dettrial::detail::Reporter reporter(true, ReportOptions{.quiet = true}, dir, std::nullopt, &writer);
    reporter.add_outlet(std::make_unique<Recording>(seen));
    MetricValues training, validation;
    training.set("batches", 3);
    training.set("epochs", 0);
    training.set("loss", 0.5);
    validation.set("validation_loss", 0.25);
    reporter.restart(0, 0, 2, 3, 1);
    reporter.training(3, 0, training, 120.0, 0.1, dettrial::detail::PhaseTimes{.data = 0.01}, {{"lr", 0.05}});
    reporter.validation(3, 0, validation, 17, 0.2);
    reporter.checkpoint(3, 0, dir / "checkpoints" / "abc", 0.3, 0.0);
    dettrial::detail::SystemReport system;
    system.values = {{"cpu_util_simple", 12.5}, {"memory_free", 3.0}};
    reporter.system(3, 0, system);
  }
  CHECK(seen == std::vector<std::string>{"restart 2->3", "training 3 loss 0.500000 lr", "validation 3 records 17", "checkpoint 3 abc",
                                         "system 3 2"});
  // The built-in outlets got the same reports, each keeping what it keeps.
  const std::vector<dettrial::detail::Json> records = dettrial::detail::JsonlFile(dir / "metrics.jsonl").read();
  std::vector<std::string> types;
  for (const auto& record : records) types.push_back(record.at("type").get<std::string>());
  CHECK(types == std::vector<std::string>{"restart", "training", "validation", "checkpoint", "system"});
  CHECK(records[1].at("learning_rates").at("lr") == 0.05);
  CHECK(records[1].at("seconds").at("data") == 0.01);
  CHECK(records[2].at("metrics").at("validation_loss") == 0.25);
  CHECK(records[3].at("uuid") == "abc");
  CHECK(records[4].at("cpu_util_simple") == 12.5);
  std::ifstream csv(dir / "metrics.csv");
  const std::string table((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
  CHECK(std::count(table.begin(), table.end(), '\n') == 3);  // the header, a training row, a validation row
  const auto events = all_events(dir / "tensorboard");
  CHECK(count_tag(events, "train/loss") == 1);
  CHECK(count_tag(events, "validation/validation_loss") == 1);
  CHECK(count_tag(events, "timing/checkpoint_seconds") == 1);
  CHECK(count_tag(events, "system/cpu_util_simple") == 1);
  CHECK(count_tag(events, "train/batches") == 0);
  // Another rank's reporter writes nothing and hands nothing on.
  const auto other = fresh_dir("outlets-other");
  {
    dettrial::detail::Reporter reporter(false, ReportOptions{}, other, std::nullopt);
    MetricValues validation;
    validation.set("validation_loss", 0.25);
    reporter.validation(3, 0, validation, 17, 0.2);
  }
  CHECK_FALSE(std::filesystem::exists(other / "metrics.jsonl"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

TEST_CASE("profiling writes a Chrome trace of its batches that names the model's operators and dettrial's phases") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 4});
  Trainer<test::DeclarativeRegression> trainer(context);
  FitOptions options = test::quiet({.max_length = Batch(12), .reporting_period = Batch(4)});
  options.profiling = {.enabled = true, .begin_on_batch = 5, .end_after_batch = 7};
  const FitResult r = trainer.fit(options);
  const auto trace_path = r.output_dir / "trace.json";
  REQUIRE(std::filesystem::exists(trace_path));
  const nlohmann::json trace = nlohmann::json::parse(test::read_text(trace_path));
  REQUIRE(trace.contains("traceEvents"));
  // Host-side events only: on CUDA, Kineto also draws each annotation on the GPU's timeline.
  const auto on_host = [](const nlohmann::json& e) { return e.is_object() && e.value("cat", "") != "gpu_user_annotation"; };
  std::multiset<std::string> names;
  for (const auto& e : trace["traceEvents"])
    if (on_host(e) && e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  CHECK(names.count("dettrial::train_batch") == 3);  // batches 5, 6 and 7
  CHECK(names.count("dettrial::backward") == 3);
  CHECK(names.count("dettrial::optimizer_step") == 3);
  CHECK(names.count("aten::addmm") >= 3 * 2);  // two Linear layers a forward pass
  CHECK(names.count("aten::mse_loss") >= 3);
  // A range that training ends inside: the trace is written at the end.
  test::Context open_context(test::hparams(), ContextOptions{.trial_seed = 4});
  Trainer<test::DeclarativeRegression> open_trainer(open_context);
  FitOptions open_options = test::quiet({.max_length = Batch(6)});
  open_options.profiling = {.enabled = true, .begin_on_batch = 4};
  const FitResult open = open_trainer.fit(open_options);
  const nlohmann::json open_trace = nlohmann::json::parse(test::read_text(open.output_dir / "trace.json"));
  std::size_t batches = 0;
  for (const auto& e : open_trace["traceEvents"]) batches += on_host(e) && e.value("name", "") == "dettrial::train_batch" ? 1 : 0;
  CHECK(batches == 2);
  std::filesystem::remove_all(r.output_dir);
  std::filesystem::remove_all(open.output_dir);
}

namespace {
/// This process's resident memory in bytes (/proc/self/statm's second field, in pages).
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

/// The regression trial, measuring its process's resident memory at two batches.
struct MeasuredRegression : test::DeclarativeRegression {
  inline static std::int64_t early_batch = 0, late_batch = 0, early_bytes = 0, late_bytes = 0, sleep_ms = 0;
  using DeclarativeRegression::DeclarativeRegression;
  dettrial::Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t epoch_idx, std::int64_t batch_idx) {
    const std::int64_t batch = context.current_train_batch();
    if (batch == early_batch) early_bytes = resident_bytes();
    if (batch == late_batch) late_bytes = resident_bytes();
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return DeclarativeRegression::train_batch(b, model, epoch_idx, batch_idx);
  }
};

/// The records of one type in a run's metrics.jsonl.
std::vector<nlohmann::json> records_of(const std::filesystem::path& run, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("type", "") == type) out.push_back(std::move(record));
  }
  return out;
}
}  // namespace

// Determined's `profiling: {enabled: true}` with no range: the operator trace is bounded (LibTorch's
// profiler holds a cycle's events in memory until it ends), so a long run's memory stays flat.
// Before, the trace ran to the end of training: 4,000 batches held every event, and the process
// grew by tens of megabytes between batch 1,000 and 4,000 (the contrast below measures it).
TEST_CASE("an open-ended profiling section traces a bounded range, and a long run's memory stays flat") {
  if (*test::memory_unmeasurable()) return test::skip(test::memory_unmeasurable());
  const auto run = [](std::optional<std::int64_t> end_after_batch) {
    test::Context context(test::hparams(), ContextOptions{.trial_seed = 5});
    Trainer<MeasuredRegression> trainer(context);
    MeasuredRegression::early_batch = 1000;
    MeasuredRegression::late_batch = 3999;
    FitOptions options = test::quiet({.max_length = Batch(4000), .reporting_period = Batch(1000)});
    options.profiling = {.enabled = true, .end_after_batch = end_after_batch};
    const FitResult r = trainer.fit(options);
    const nlohmann::json trace = nlohmann::json::parse(test::read_text(r.output_dir / "trace.json"));
    std::size_t traced = 0;
    for (const auto& e : trace["traceEvents"])
      traced += e.is_object() && e.value("cat", "") != "gpu_user_annotation" && e.value("name", "") == "dettrial::train_batch";
    std::filesystem::remove_all(r.output_dir);
    return std::pair{traced, MeasuredRegression::late_bytes - MeasuredRegression::early_bytes};
  };
  const auto [traced, growth] = run(std::nullopt);
  CHECK(traced == ExperimentConfig::Profiling::default_traced_batches);  // batches 0 to 9
  CAPTURE(growth);
  CHECK(growth < 8 * 1024 * 1024);
  // The same run traced to its end (the old default) holds every batch's events: the measurement
  // above would see it.
  const auto [all_traced, all_growth] = run(3999);
  CHECK(all_traced == 4000);
  CAPTURE(all_growth);
  CHECK(all_growth > 3 * std::max<std::int64_t>(growth, 4 * 1024 * 1024));
}

// Determined's meaning of profiling.enabled: the machine's system metrics, sampled on a thread
// (here every 0.1 s, two samples a report), in metrics.jsonl, TensorBoard and the report's charts.
TEST_CASE("profiling.enabled samples the machine into metrics.jsonl, TensorBoard and the report") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 6});
  Trainer<MeasuredRegression> trainer(context);
  MeasuredRegression::early_batch = MeasuredRegression::late_batch = -1;
  FitOptions options = test::quiet({.max_length = Batch(400), .reporting_period = Batch(100)});
  options.profiling = {.enabled = true, .end_after_batch = 1, .sampling_interval = 0.1, .samples_per_report = 2};
  // Long enough for reports while training: the trial sleeps a millisecond a batch.
  MeasuredRegression::sleep_ms = 1;
  const FitResult r = trainer.fit(options);
  MeasuredRegression::sleep_ms = 0;
  const std::vector<nlohmann::json> system = records_of(r.output_dir, "system");
  REQUIRE(!system.empty());
  std::int64_t last_batches = -1;
  for (const nlohmann::json& record : system) {
    CAPTURE(record.dump());
    REQUIRE(record.contains("cpu_util_simple"));
    CHECK(record["cpu_util_simple"].get<double>() >= 0);
    CHECK(record["cpu_util_simple"].get<double>() <= 100.0001);
    CHECK(record["memory_free"].get<double>() > 0);  // GB
    CHECK(record["disk_util"].get<double>() > 0);
    CHECK(record["disk_util"].get<double>() <= 100);
    CHECK(record["net_throughput_sent"].get<double>() >= 0);
    CHECK(record["net_throughput_recv"].get<double>() >= 0);
    CHECK(record["disk_throughput_write"].get<double>() >= 0);
    const std::string time = record["time"].get<std::string>();  // 2026-12-02T01:02:03.456Z
    CHECK(time.size() == 24);
    CHECK(time.back() == 'Z');
    CHECK(record["batches"].get<std::int64_t>() >= last_batches);
    last_batches = record["batches"].get<std::int64_t>();
  }
  CHECK(last_batches <= 400);
  const auto events = all_events(r.output_dir / "tensorboard");
  CHECK(count_tag(events, "system/cpu_util_simple") == system.size());
  CHECK(count_tag(events, "system/memory_free") == system.size());
  const std::string page = test::read_text(r.output_dir / "report.html");
  CHECK(page.find("CPU utilization (percent of all cores)") != std::string::npos);
  CHECK(page.find("free memory (GB)") != std::string::npos);
  std::filesystem::remove_all(r.output_dir);
}

// The counters dettrial reads from /proc are psutil's (what Determined's profiler samples with):
// read before and after Python reads its own, each of psutil's monotonic counters lies between them.
TEST_CASE("system metrics: the machine's counters read as psutil reads them") {
  const char* given = std::getenv("DETTRIAL_TEST_PYTHON");
  const std::string python = given ? given : "";
  if (python.empty()) return test::skip("no Python given (-DDETTRIAL_PYTHON=...)");
  const std::filesystem::path out = std::filesystem::temp_directory_path() / ("dettrial-psutil-" + std::to_string(::getpid()) + ".json");
  const std::string script =
      "import json, os, sys\n"
      "try:\n import psutil\nexcept ImportError:\n sys.exit(77)\n"
      "c = psutil.cpu_times(); d = psutil.disk_io_counters(); n = psutil.net_io_counters()\n"
      "json.dump({'idle': c.idle, 'tick': os.sysconf('SC_CLK_TCK'), 'reads': d.read_count, 'writes': d.write_count,\n"
      "           'read_bytes': d.read_bytes, 'write_bytes': d.write_bytes, 'sent': n.bytes_sent, 'recv': n.bytes_recv,\n"
      "           'disk_percent': psutil.disk_usage('/').percent}, open(sys.argv[1], 'w'))\n";
  const std::filesystem::path script_path = out.string() + ".py";
  std::ofstream(script_path) << script;
  namespace sm = dettrial::detail::system_metrics;
  const auto idle_ticks = [] {
    std::ifstream in("/proc/stat");
    std::string cpu;
    std::uint64_t user = 0, nice = 0, sys = 0, idle = 0;
    in >> cpu >> user >> nice >> sys >> idle;
    return idle;
  };
  const std::uint64_t idle_before = idle_ticks();
  const dettrial::detail::SystemCounters before = sm::read_counters("/");
  const int status = std::system(("'" + python + "' '" + script_path.string() + "' '" + out.string() + "'").c_str());
  const dettrial::detail::SystemCounters after = sm::read_counters("/");
  const std::uint64_t idle_after = idle_ticks();
  std::filesystem::remove(script_path);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return test::skip(python + " has no psutil");
  REQUIRE(status == 0);
  const nlohmann::json p = nlohmann::json::parse(test::read_text(out));
  std::filesystem::remove(out);
  REQUIRE(before.disk_reads.has_value());
  REQUIRE(before.net_sent_bytes.has_value());
  const auto between = [](std::uint64_t low, const nlohmann::json& value, std::uint64_t high) {
    const auto v = value.get<std::uint64_t>();
    return low <= v && v <= high;
  };
  CHECK(between(*before.disk_reads, p["reads"], *after.disk_reads));
  CHECK(between(*before.disk_writes, p["writes"], *after.disk_writes));
  CHECK(between(*before.disk_read_bytes, p["read_bytes"], *after.disk_read_bytes));
  CHECK(between(*before.disk_write_bytes, p["write_bytes"], *after.disk_write_bytes));
  CHECK(between(*before.net_sent_bytes, p["sent"], *after.net_sent_bytes));
  CHECK(between(*before.net_recv_bytes, p["recv"], *after.net_recv_bytes));
  // psutil's idle seconds are /proc/stat's ticks over the clock's rate: dettrial's busy and total
  // read the same line.
  const double tick = p["tick"].get<double>();
  CHECK(p["idle"].get<double>() >= static_cast<double>(idle_before) / tick - 0.011);
  CHECK(p["idle"].get<double>() <= static_cast<double>(idle_after) / tick + 0.011);
  REQUIRE(before.cpu_total.has_value());
  CHECK(*after.cpu_total >= *before.cpu_total);
  // The file system's use, as df and psutil count it (within what other tests write meanwhile).
  REQUIRE(before.disk_used_percent.has_value());
  CHECK(std::abs(*before.disk_used_percent - p["disk_percent"].get<double>()) < 1.0);
}

TEST_CASE("system metrics: /proc's formats, a sampler's reports and its bounds") {
  namespace sm = dettrial::detail::system_metrics;
  // Lines as Linux 6.1 writes them.
  const auto cpu = sm::cpu_ticks("cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n");
  REQUIRE(cpu.has_value());
  CHECK(cpu->first == 1000);         // user..steal; guest is inside user
  CHECK(cpu->second == 1000 - 840);  // all but idle and iowait
  CHECK(!sm::cpu_ticks("intr 5 6\n").has_value());
  CHECK(sm::memory_available("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   12000000 kB\n") ==
        std::uint64_t{12000000} * 1024);
  CHECK(!sm::memory_available("MemTotal: 5 kB\n").has_value());
  const std::string diskstats =
      "   8       0 sda 1000 10 20000 500 2000 30 40000 900 0 1200 1400 0 0 0 0 0 0\n"
      "   8       1 sda1 900 10 18000 450 1900 30 38000 850 0 1100 1300 0 0 0 0 0 0\n"
      "   7       0 loop0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
  const auto disks = sm::disk_totals(diskstats, [](std::string_view name) { return name == "sda" || name == "loop0"; });
  REQUIRE(disks.has_value());
  CHECK(disks->reads == 1005);  // sda1 is a partition of sda: not counted twice
  CHECK(disks->writes == 2000);
  CHECK(disks->read_bytes == (20000 + 10) * 512);
  CHECK(disks->write_bytes == std::uint64_t{40000} * 512);
  const auto net = sm::net_totals(
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
      "    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n"
      "  eth0: 5000      20    0    0    0     0          0         0      700       7    0    0    0     0       0          0\n");
  REQUIRE(net.has_value());
  CHECK(net->first == 1700);   // sent
  CHECK(net->second == 6000);  // received
  // A sampler: the reports come while it runs, each an average of its samples; a stop ends it with
  // the samples it has.
  dettrial::detail::SystemMetricsSampler sampler({.interval = std::chrono::milliseconds(100), .samples_per_report = 2, .disk = "/"});
  CHECK(sampler.running());
  const auto waited_from = std::chrono::steady_clock::now();
  while (!sampler.ready() && std::chrono::steady_clock::now() - waited_from < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<dettrial::detail::SystemReport> reports = sampler.take();
  REQUIRE(!reports.empty());
  CHECK(reports.front().samples == 2);
  CHECK(!sampler.ready());
  sampler.stop();
  CHECK(!sampler.running());
  for (auto& r : sampler.take()) reports.push_back(std::move(r));
  for (const auto& r : reports) {
    const auto has = [&](const char* name) {
      return std::any_of(r.values.begin(), r.values.end(), [&](const auto& v) { return v.first == name; });
    };
    CHECK(has("cpu_util_simple"));
    CHECK(has("memory_free"));
    CHECK(has("disk_util"));
  }
  CHECK_THROWS_WITH_AS(dettrial::detail::SystemMetricsSampler({.interval = std::chrono::milliseconds(50)}),
                       "the system metrics' sampling interval is 0.05 s; it must be at least 0.1 s", std::invalid_argument);
  // The config's keys, checked where they are written.
  CHECK_THROWS_WITH_AS(
      ExperimentConfig::parse("profiling: {enabled: true, sampling_interval: 0.05}\n"),
      "<string>:1:47: profiling.sampling_interval is 0.05 seconds; it must be at least 0.1 (as Determined's profiler requires)",
      ConfigError);
  const ExperimentConfig open = ExperimentConfig::parse("profiling: {enabled: true, begin_on_batch: 100}\n");
  CHECK(open.profiling.last_traced_batch() == 109);
  CHECK(open.profiling.sampling_interval == 1.0);
  CHECK(open.profiling.samples_per_report == 10);
}

TEST_CASE("set_profiler's schedule acts at every step as torch.profiler.schedule does") {
  using dettrial::detail::ProfilerAction;
  constexpr auto N = ProfilerAction::none, W = ProfilerAction::warmup, R = ProfilerAction::record, S = ProfilerAction::record_and_save;
  // Printed by Python's torch.profiler.schedule(...)(step) for steps 0 to 11.
  const std::vector<std::pair<ProfilerSchedule, std::vector<ProfilerAction>>> cases = {
      {{.wait = 1, .warmup = 1, .active = 2, .repeat = 2}, {N, W, R, S, N, W, R, S, N, N, N, N}},
      {{.wait = 0, .warmup = 0, .active = 3, .repeat = 0, .skip_first = 2}, {N, N, R, R, S, R, R, S, R, R, S, R}},
      {{.wait = 2, .warmup = 0, .active = 1, .repeat = 1, .skip_first = 1}, {N, N, N, S, N, N, N, N, N, N, N, N}},
  };
  for (const auto& [schedule, expected] : cases) {
    std::vector<ProfilerAction> got;
    for (std::int64_t step = 0; step < 12; ++step) got.push_back(dettrial::detail::profiler_action(schedule, step));
    CHECK((got == expected));  // (not decomposed: the actions have no operator<<)
  }
  test::Context context(test::hparams());
  CHECK_THROWS_WITH_AS(context.set_profiler({.schedule = {.active = 0}}), "set_profiler: schedule active is 0; it must be at least 1",
                       ConfigError);
  CHECK_THROWS_WITH_AS(context.set_profiler({.schedule = {.wait = -1}}), "set_profiler: schedule wait is -1; it must be at least 0",
                       ConfigError);
  CHECK_THROWS_WITH_AS(context.set_profiler({.activities = {}}), doctest::Contains("no activities"), ConfigError);
  CHECK_FALSE(context.profiler_options());
}

TEST_CASE("set_profiler: each cycle's trace in the TensorBoard folder, named for its plugin, its steps marked") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 4});
  // Determined's example: skip batch 0, warm up on 1, record 2 and 3; twice.
  context.set_profiler(
      {.activities = {ProfilerActivity::cpu, ProfilerActivity::cuda}, .schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 2}});
  Trainer<test::DeclarativeRegression> trainer(context);
  const FitResult r = trainer.fit(test::quiet({.max_length = Batch(12), .reporting_period = Batch(4)}));
  std::vector<std::filesystem::path> traces;
  for (const auto& entry : std::filesystem::directory_iterator(r.output_dir / "tensorboard"))
    if (entry.path().filename().string().ends_with(".pt.trace.json")) traces.push_back(entry.path());
  std::sort(traces.begin(), traces.end());
  REQUIRE(traces.size() == 2);
  const std::vector<std::set<std::string>> steps = {{"ProfilerStep#2", "ProfilerStep#3"}, {"ProfilerStep#6", "ProfilerStep#7"}};
  for (std::size_t i = 0; i < traces.size(); ++i) {
    CAPTURE(traces[i]);
    const nlohmann::json trace = nlohmann::json::parse(test::read_text(traces[i]));
    std::set<std::string> marked;
    std::size_t batches = 0;
    for (const auto& e : trace["traceEvents"]) {
      if (!e.is_object() || e.value("cat", "") == "gpu_user_annotation") continue;
      const std::string name = e.value("name", "");
      if (name.starts_with("ProfilerStep#")) marked.insert(name);
      batches += name == "dettrial::train_batch" ? 1 : 0;
    }
    CHECK(marked == steps[i]);
    CHECK(batches == 2);
  }
  // For the check by TensorBoard's own profile plugin (tests/python/read_profile.py).
  if (const char* keep = std::getenv("DETTRIAL_PROFILE_DIR")) {
    std::filesystem::remove_all(keep);
    std::filesystem::create_directories(keep);
    for (const auto& t : traces) std::filesystem::copy_file(t, std::filesystem::path(keep) / t.filename());
  }
  std::filesystem::remove_all(r.output_dir);
}

TEST_CASE("the profiling section maps to the fit options, and a range that cannot be is refused") {
  const auto config = ExperimentConfig::parse(
      "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n"
      "profiling: {enabled: true, begin_on_batch: 2, end_after_batch: 4, sync_timings: false}\n");
  ExperimentConfig assigned;
  assigned = config;  // the command line's --set path assigns the re-parsed config
  const FitOptions o = FitOptions::from_config(assigned);
  CHECK(o.profiling.enabled);
  CHECK(o.profiling.begin_on_batch == 2);
  CHECK(o.profiling.end_after_batch == std::optional<std::int64_t>(4));
  CHECK_FALSE(o.profiling.sync_timings);
  CHECK(ExperimentConfig::parse("searcher: {name: single, metric: loss}\nprofiling: {enabled: true}\n").ignored_fields.empty());
  CHECK_THROWS_WITH_AS(
      ExperimentConfig::parse("searcher: {name: single, metric: loss}\nprofiling: {begin_on_batch: 5, end_after_batch: 2}\n", "p.yaml"),
      doctest::Contains("p.yaml:2:"), ConfigError);
}

TEST_CASE("slurm.sbatch_args go to each trial's srun, and sbatch-only options are refused with the reason") {
  const auto config = ExperimentConfig::parse(
      "searcher: {name: single, metric: loss}\n"
      "slurm: {sbatch_args: [--partition=debug, --time=01:00:00], slots_per_node: 4}\n");
  ExperimentConfig assigned;
  assigned = config;
  CHECK(assigned.slurm_args == std::vector<std::string>{"--partition=debug", "--time=01:00:00"});
  CHECK(assigned.ignored_fields == std::vector<std::string>{"slurm.slots_per_node"});
  CHECK_THROWS_WITH_AS(ExperimentConfig::parse("searcher: {name: single, metric: loss}\nslurm: {sbatch_args: [--array=1-4]}\n", "s.yaml"),
                       doctest::Contains("'--array=1-4' is an sbatch option that srun"), ConfigError);
  CHECK_THROWS_AS(ExperimentConfig::parse("searcher: {name: single, metric: loss}\nslurm: {sbatch_args: --partition=x}\n"), ConfigError);
}

// ---- report.html: a run's page and a search's page from their files, with awkward data (a null,
// one record, a torn last line, thousands of points, names with HTML in them), and the errors of a
// folder without data or with a damaged line.

namespace report_cases {

namespace fs = std::filesystem;

/// A new, empty folder under the system's temporary directory.
fs::path fresh_dir(const std::string& name) {
  static int counter = 0;
  const fs::path dir =
      fs::temp_directory_path() / ("dettrial-report-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The text of the chart `<svg data-chart="CHART">`, or empty when the page has none.
std::string chart_of(const std::string& html, const std::string& chart) {
  const auto start = html.find("<svg class=\"chart\" data-chart=\"" + chart + "\"");
  if (start == std::string::npos) return {};
  return html.substr(start, html.find("</svg>", start) - start);
}

/// The `data-points` of series SERIES in chart CHART, or -1 when either is missing.
long points_of(const std::string& html, const std::string& chart, const std::string& series) {
  const std::string svg = chart_of(html, chart);
  const std::string key = "data-series=\"" + series + "\" data-points=\"";
  const auto at = svg.find(key);
  return at == std::string::npos ? -1 : std::stol(svg.substr(at + key.size()));
}

/// Every `points="..."` of the page is x,y pairs of plain numbers (no nan, no inf, no locale's decimal commas).
bool coordinates_are_numbers(const std::string& html) {
  for (auto at = html.find(" points=\""); at != std::string::npos; at = html.find(" points=\"", at + 1)) {
    const auto begin = at + 9, end = html.find('"', begin);
    std::size_t commas = 0, pairs = end > begin ? 1 : 0;
    for (std::size_t i = begin; i < end; ++i) {
      const char c = html[i];
      if (c == ',') ++commas;
      else if (c == ' ') ++pairs;
      else if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-')) return false;
    }
    if (commas != pairs) return false;
  }
  return true;
}

// Reports every 10 batches; a null loss (NaN), a null accuracy, the timings and throughput, and a
// last line torn by a crash.
const char* const run_metrics =
    R"({"type":"training","batches":10,"epochs":0,"samples_per_second":100.0,"seconds":{"data":0.5,"train_batch":1.5},"metrics":{"batches":10.0,"epochs":0.0,"loss":2.0,"lr":0.1}}
{"type":"validation","batches":10,"epochs":0,"seconds":0.25,"metrics":{"batches":10.0,"epochs":0.0,"validation_loss":1.5,"accuracy":null}}
{"type":"training","batches":20,"epochs":0,"samples_per_second":110.0,"seconds":{"data":0.4,"train_batch":1.4},"metrics":{"loss":null,"lr":0.05}}
{"type":"validation","batches":20,"epochs":1,"seconds":0.25,"metrics":{"validation_loss":1.2,"accuracy":0.7}}
{"type":"training","batches":30,"epochs":1,"samples_per)";

TEST_CASE("a run's report: a chart per metric, nulls and a torn last line left out") {
  const fs::path dir = fresh_dir("run");
  write(dir / "metrics.jsonl", run_metrics);
  write(dir / "config.yaml", "hyperparameters:\n  learning_rate: 0.1\n  layers: {hidden: 64}\n");
  const fs::path page = dettrial::write_report(dir);
  CHECK(page == dir / "report.html");
  const std::string html = read(page);
  REQUIRE(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("</html>") != std::string::npos);
  // Training and validation loss share a chart; the null loss is no point.
  CHECK(points_of(html, "loss", "loss") == 1);
  CHECK(points_of(html, "loss", "validation_loss") == 2);
  CHECK(points_of(html, "accuracy", "accuracy") == 1);
  CHECK(points_of(html, "lr", "lr") == 2);
  CHECK(points_of(html, "samples_per_second", "samples_per_second") == 2);
  CHECK(points_of(html, "seconds", "data") == 2);
  CHECK(points_of(html, "seconds", "train_batch") == 2);
  CHECK(points_of(html, "seconds", "validation seconds") == 2);
  // The records' own counters are the x axis, not charts.
  CHECK(chart_of(html, "batches").empty());
  CHECK(chart_of(html, "epochs").empty());
  CHECK(html.find("incomplete") != std::string::npos);  // the torn line is said to be left out
  CHECK(html.find("data-ready") == std::string::npos);  // set by the script, not written
  CHECK(html.find("learning_rate") != std::string::npos);
  CHECK(html.find("layers.hidden") != std::string::npos);
  CHECK(coordinates_are_numbers(html));
  // Offline: nothing fetched from elsewhere.
  CHECK(html.find("<link") == std::string::npos);
  CHECK(html.find(" src=") == std::string::npos);
  CHECK(html.find("@import") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  // Written whole (a temporary renamed over it), and nothing else left behind.
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  CHECK(files == 3);
  fs::remove_all(dir);
}

TEST_CASE("a run's report: one record, equal and negative values draw without NaN") {
  const fs::path dir = fresh_dir("one-record");
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"loss":-3.5,"flat":7.0}})"
                               "\n");
  std::string html = read(dettrial::write_run_report(dir));
  CHECK(points_of(html, "loss", "loss") == 1);
  CHECK(chart_of(html, "loss").find("<circle") != std::string::npos);  // a single point gets a dot
  CHECK(coordinates_are_numbers(html));
  // Three equal values, all negative.
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"loss":-2.0}}
{"type":"training","batches":2,"epochs":0,"metrics":{"loss":-2.0}}
{"type":"training","batches":3,"epochs":0,"metrics":{"loss":-2.0}}
)");
  html = read(dettrial::write_run_report(dir));
  CHECK(points_of(html, "loss", "loss") == 3);
  CHECK(coordinates_are_numbers(html));
  CHECK(chart_of(html, "loss").find(">-2.0<") != std::string::npos);  // a tick at the value
  // Only nulls: the chart says so, its series is there with no points.
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"loss":null}})"
                               "\n");
  html = read(dettrial::write_run_report(dir));
  CHECK(points_of(html, "loss", "loss") == 0);
  CHECK(chart_of(html, "loss").find("no values to plot") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("thousands of points are thinned to 2000, keeping the first, the last and the extremes") {
  std::vector<std::pair<double, double>> points;
  for (int i = 0; i < 5000; ++i) points.emplace_back(i, std::sin(i / 50.0));
  points[2500].second = 100;
  points[3001].second = -100;
  const auto thinned = dettrial::detail::html::downsample(points);
  CHECK(thinned.size() <= 2000);
  CHECK(thinned.size() > 1000);
  CHECK(thinned.front() == points.front());
  CHECK(thinned.back() == points.back());
  CHECK(std::find(thinned.begin(), thinned.end(), points[2500]) != thinned.end());
  CHECK(std::find(thinned.begin(), thinned.end(), points[3001]) != thinned.end());
  CHECK(std::is_sorted(thinned.begin(), thinned.end()));
  CHECK(dettrial::detail::html::downsample({{1, 2}}).size() == 1);

  // Through a run's page: data-points says what is drawn, data-total what there was.
  const fs::path dir = fresh_dir("long");
  std::string lines;
  for (int i = 1; i <= 5000; ++i)
    lines += R"({"type":"training","batches":)" + std::to_string(i) + R"(,"epochs":0,"metrics":{"loss":)" +
             std::to_string(std::cos(i / 30.0)) + "}}\n";
  write(dir / "metrics.jsonl", lines);
  const std::string html = read(dettrial::write_run_report(dir));
  const long drawn = points_of(html, "loss", "loss");
  CHECK(drawn > 1000);
  CHECK(drawn <= 2000);
  CHECK(chart_of(html, "loss").find("data-total=\"5000\"") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a search's report: every trial's curve with ASHA's rungs, and a table with a column per hyperparameter") {
  const fs::path dir = fresh_dir("search");
  write(dir / "summary.json", R"({
  "experiment": "exp <&>",
  "searcher": "adaptive_asha",
  "metric": "validation_loss",
  "smaller_is_better": true,
  "time_metric": "batches",
  "max_trials": 2,
  "brackets": [{"rungs": [4, 16], "max_trials": 2}],
  "trials": [
    {"id": 1, "state": "COMPLETED", "batches_trained": 16, "restarts": 0, "hparams": {"lr": 0.1, "optimizer": {"name": "sgd"}},
     "best_metric": 0.5, "last_metric": 0.5, "best_checkpoint": "", "bracket": 0, "rung": 1},
    {"id": 2, "state": "STOPPED_EARLY", "batches_trained": 4, "restarts": 1, "hparams": {"lr": 0.001, "optimizer": {"name": "adam"}},
     "best_metric": 0.9, "last_metric": 0.9, "best_checkpoint": "", "bracket": 0, "rung": 0}
  ],
  "best_trial": 1
}
)");
  write(dir / "events.jsonl", R"({"event":"validation","trial":1,"metric":1.0,"time":4.0,"batches":4,"rung":0}
{"event":"validation","trial":2,"metric":0.9,"time":4.0,"batches":4,"rung":0,"stopped":true}
{"event":"end","trial":2,"state":"STOPPED_EARLY","restarts":1}
{"event":"validation","trial":1,"metric":0.5,"time":16.0,"batches":16,"rung":1}
{"event":"end","trial":1,"state":"COMPLETED","restarts":0}
)");
  write(dir / "trials" / "1" / "metrics.jsonl", R"({"type":"training","batches":4,"epochs":0,"metrics":{"loss":1.1}}
{"type":"validation","batches":4,"epochs":0,"metrics":{"validation_loss":1.0}}
{"type":"training","batches":16,"epochs":1,"metrics":{"loss":0.6}}
{"type":"validation","batches":16,"epochs":1,"metrics":{"validation_loss":0.5}}
)");
  write(dir / "trials" / "2" / "metrics.jsonl", R"({"type":"training","batches":4,"epochs":0,"metrics":{"loss":1.0}}
{"type":"validation","batches":4,"epochs":0,"metrics":{"validation_loss":0.9}}
)");
  const fs::path page = dettrial::write_report(dir);
  CHECK(page == dir / "report.html");
  const std::string html = read(page);
  // The table: one row per trial, in order, a column per (flattened) hyperparameter.
  REQUIRE(html.find("<table id=\"trials\"") != std::string::npos);
  const auto row1 = html.find("<tr data-trial=\"1\""), row2 = html.find("<tr data-trial=\"2\"");
  CHECK(row1 != std::string::npos);
  CHECK(row2 != std::string::npos);
  CHECK(row1 < row2);
  CHECK(html.find("data-column=\"lr\" data-type=\"number\"") != std::string::npos);
  CHECK(html.find("data-column=\"optimizer.name\" data-type=\"text\"") != std::string::npos);
  CHECK(html.find("data-column=\"best\"") != std::string::npos);
  CHECK(html.find(">STOPPED_EARLY<") != std::string::npos);
  // The searcher metric of each trial on one chart, the rungs, and the stopped trial's cross.
  CHECK(points_of(html, "validation_loss", "trial 1") == 2);
  CHECK(points_of(html, "validation_loss", "trial 2") == 1);
  const std::string curves = chart_of(html, "validation_loss");
  CHECK(curves.find(">rung 1<") != std::string::npos);
  CHECK(curves.find(">rung 2<") != std::string::npos);
  CHECK(curves.find("class=\"cross\"") != std::string::npos);
  CHECK(curves.find("stopped early") != std::string::npos);
  // The best metric against the hyperparameter that varies and is a number.
  CHECK(points_of(html, "validation_loss vs lr", "trial 1") == 1);
  CHECK(chart_of(html, "validation_loss vs optimizer.name").empty());
  // Each trial's own page, linked.
  CHECK(fs::exists(dir / "trials" / "1" / "report.html"));
  CHECK(fs::exists(dir / "trials" / "2" / "report.html"));
  CHECK(html.find("href=\"trials/1/report.html\"") != std::string::npos);
  // The experiment's name is the user's text: escaped.
  CHECK(html.find("exp &lt;&amp;&gt;") != std::string::npos);
  CHECK(html.find("exp <&>") == std::string::npos);
  CHECK(coordinates_are_numbers(html));
  fs::remove_all(dir);
}

TEST_CASE("a search's report while it runs: from the event log and the trials' folders, without summary.json") {
  const fs::path dir = fresh_dir("running");
  write(dir / "trials" / "1" / "config.yaml",
        "hyperparameters:\n  lr: 0.01\nsearcher:\n  name: single\n  metric: validation_loss\n  smaller_is_better: true\n");
  write(dir / "trials" / "1" / "metrics.jsonl", R"({"type":"validation","batches":5,"epochs":0,"metrics":{"validation_loss":2.0}})"
                                                "\n");
  write(dir / "trials" / "2" / "config.yaml", "hyperparameters:\n  lr: 0.02\n");
  write(dir / "events.jsonl", R"({"event":"validation","trial":1,"metric":2.0,"time":5.0,"batches":5}
{"event":"validation","trial":1,"metric":1.5,"ti)");  // torn by a crash
  const std::string html = read(dettrial::write_report(dir));
  CHECK(html.find("<tr data-trial=\"1\"") != std::string::npos);
  CHECK(html.find("<tr data-trial=\"2\"") != std::string::npos);
  CHECK(html.find(">RUNNING<") != std::string::npos);
  CHECK(html.find(">QUEUED<") != std::string::npos);
  CHECK(html.find("data-column=\"lr\"") != std::string::npos);
  CHECK(points_of(html, "validation_loss", "trial 1") == 1);
  CHECK(html.find("events.jsonl is incomplete") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("write_report on a folder without data names the folder and what it lacks") {
  const fs::path dir = fresh_dir("empty");
  const std::string folder = dir.string(), missing = (dir / "missing").string();
  CHECK_THROWS_WITH_AS(dettrial::write_report(dir), doctest::Contains(folder.c_str()), dettrial::Error);
  CHECK_THROWS_WITH_AS(dettrial::write_report(dir), doctest::Contains("metrics.jsonl"), dettrial::Error);
  CHECK_THROWS_WITH_AS(dettrial::write_run_report(dir), doctest::Contains("no metrics.jsonl"), dettrial::Error);
  CHECK_THROWS_WITH_AS(dettrial::write_experiment_report(dir), doctest::Contains("neither summary.json nor trials/"), dettrial::Error);
  CHECK_THROWS_WITH_AS(dettrial::write_report(missing), doctest::Contains(missing.c_str()), dettrial::Error);
  CHECK_FALSE(fs::exists(dir / "report.html"));
  fs::remove_all(dir);
}

TEST_CASE("a corrupt line before the last is an error naming the file and the line") {
  const fs::path dir = fresh_dir("corrupt");
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"loss":1.0}}
{"type":"training","batc
{"type":"training","batches":3,"epochs":0,"metrics":{"loss":0.5}}
)");
  CHECK_THROWS_WITH_AS(dettrial::write_report(dir), doctest::Contains("metrics.jsonl' line 2 is not a JSON record"), dettrial::Error);
  CHECK_FALSE(fs::exists(dir / "report.html"));
  // The same line last: torn, left out.
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"loss":1.0}}
{"type":"training","batc)");
  CHECK(points_of(read(dettrial::write_report(dir)), "loss", "loss") == 1);
  fs::remove_all(dir);
}

TEST_CASE("HTML in metric and hyperparameter names is escaped") {
  const fs::path dir = fresh_dir("escape");
  write(dir / "metrics.jsonl", R"({"type":"training","batches":1,"epochs":0,"metrics":{"<b>\"x\"&'y'":1.0}}
{"type":"training","batches":2,"epochs":0,"metrics":{"<b>\"x\"&'y'":2.0}}
)");
  write(dir / "config.yaml", "hyperparameters:\n  \"<script>alert(1)</script>\": 3\n");
  const std::string html = read(dettrial::write_run_report(dir));
  CHECK(points_of(html, "&lt;b&gt;&quot;x&quot;&amp;&#39;y&#39;", "&lt;b&gt;&quot;x&quot;&amp;&#39;y&#39;") == 2);
  CHECK(html.find("<b>\"x\"") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(1)&lt;/script&gt;") != std::string::npos);
  CHECK(html.find("<script>alert") == std::string::npos);
  fs::remove_all(dir);
}

}  // namespace report_cases

TEST_CASE("metrics.csv holds each training and validation report as a row, a new metric adding its column, and a resume's rows once") {
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> trainer(context);
  // 8 batches an epoch; reports every 3 (and at each boundary), validation every 4: the first
  // validation brings a column of its own after three training rows were written.
  FitOptions options = test::quiet({.max_length = Batch(10),
                                    .validation_period = Batch(4),
                                    .checkpoint_period = Batch(4),
                                    .reporting_period = Batch(3),
                                    .checkpoint_policy = CheckpointPolicy::none,
                                    .retention = {.save_trial_best = 0, .save_trial_latest = 5}});
  const FitResult r = trainer.fit(options);
  const auto csv_text = [&] { return test::read_text(r.output_dir / "metrics.csv"); };
  std::vector<std::string> lines;
  {
    std::istringstream in(csv_text());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  REQUIRE(lines.size() == 10);  // the header, 6 training and 3 validation rows
  CHECK(lines[0] == "type,batches,epochs,loss,validation_loss");
  CHECK(lines[1].rfind("training,3,0,", 0) == 0);
  CHECK(lines[1].back() == ',');  // a training row has no validation_loss
  CHECK(lines[3].rfind("validation,4,0,,", 0) == 0);
  // The same numbers as metrics.jsonl (9 significant digits).
  std::ifstream log(r.output_dir / "metrics.jsonl");
  std::string first;
  std::getline(log, first);
  const double loss = nlohmann::json::parse(first)["metrics"]["loss"].get<double>();
  CHECK(std::stod(lines[1].substr(std::string("training,3,0,").size())) == doctest::Approx(loss).epsilon(1e-8));
  // Resumed from batch 4: the rows after it are written again, not twice.
  test::Context again(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> resumed(again);
  options.latest_checkpoint = r.checkpoints.front().path;
  REQUIRE(r.checkpoints.front().batches_trained == 4);
  options.output_dir = r.output_dir;
  resumed.fit(options);
  CHECK(csv_text() == [&] {
    std::string all;
    for (const auto& line : lines) all += line + "\n";
    return all;
  }());
  std::filesystem::remove_all(r.output_dir);
}

TEST_CASE(
    "metrics.jsonl resumed at batch N drops the records after N and a torn last line, and a damaged line stops the resume naming it") {
  const auto dir = fresh_dir("metrics-resume");
  const auto path = dir / "metrics.jsonl";
  const auto loss = [](double value) {
    MetricValues values;
    values.set("loss", value);
    return values;
  };
  {
    MetricsLog log(dir);
    for (std::int64_t batches = 10; batches <= 40; batches += 10) log.write("training", batches, 0, loss(0.1 * batches));
  }
  // The stopped run was killed while writing its record at 50.
  std::ofstream(path, std::ios::app | std::ios::binary) << R"({"type":"training","batches":50,"ep)";
  {
    MetricsLog resumed(dir, std::int64_t{20});
    CHECK(resumed.dropped() == 3);  // 30, 40 and the torn one
    resumed.write("training", 30, 0, loss(3.5));
  }
  const auto batches_in = [&](bool* torn = nullptr) {
    std::vector<std::int64_t> batches;
    for (const auto& record : dettrial::detail::JsonlFile(path).read(torn)) batches.push_back(record.at("batches").get<std::int64_t>());
    return batches;
  };
  CHECK(batches_in() == std::vector<std::int64_t>{10, 20, 30});
  CHECK(dettrial::detail::JsonlFile(path).read().back()["metrics"]["loss"] == 3.5);
  // Opened again without a resume: a torn last line is cut, so the next record is a line of its own.
  std::ofstream(path, std::ios::app | std::ios::binary) << R"({"type":"valid)";
  {
    MetricsLog again(dir);
    CHECK(again.dropped() == 0);
    again.write("validation", 30, 0, loss(1.0));
  }
  bool torn = true;
  CHECK(batches_in(&torn) == std::vector<std::int64_t>{10, 20, 30, 30});
  CHECK_FALSE(torn);
  // A damaged line before the last is not dropped as if torn: the resume stops naming it, and the file is as it was.
  std::string text = test::read_text(path);
  text.insert(text.find('\n') + 1, "{\"type\":\"training\",\"batches\":1\n");
  std::ofstream(path, std::ios::trunc | std::ios::binary) << text;
  CHECK_THROWS_WITH_AS(MetricsLog(dir, std::int64_t{20}),
                       doctest::Contains(("'" + path.string() + "' line 2 is not a JSON record").c_str()), Error);
  CHECK(test::read_text(path) == text);
  // metrics.csv reads metrics.jsonl by the same rule.
  CHECK_THROWS_WITH_AS(CsvLog{dir}, doctest::Contains("line 2 is not a JSON record"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "mlflow-pending.jsonl reads as JSON lines: a torn last line and a record without its api are left out, a damaged line is an error") {
  std::istringstream kept(R"({"api":"runs/log-batch","body":{"metrics":[]}})"
                          "\n"
                          R"({"body":{}})"
                          "\n"
                          R"({"api":"runs/upd)");
  const auto pending = dettrial::detail::read_mlflow_pending(kept, "pending.jsonl");
  REQUIRE(pending.size() == 1);
  CHECK(pending[0]["api"] == "runs/log-batch");
  std::istringstream damaged("{\"api\":\"runs/log-batch\"}\nnot json\n{\"api\":\"runs/update\"}\n");
  CHECK_THROWS_WITH_AS(dettrial::detail::read_mlflow_pending(damaged, "pending.jsonl"),
                       doctest::Contains("'pending.jsonl' line 2 is not a JSON record"), Error);
  CHECK(dettrial::detail::read_mlflow_pending(fresh_dir("no-pending") / "mlflow-pending.jsonl").empty());
}

TEST_CASE("a run whose MLflow server does not answer trains on, keeps every request in its folder, and --sync-mlflow says what failed") {
  if (!dettrial::detail::http_available()) {
    MESSAGE("skipped: this build has no libcurl");
    return;
  }
  // A port nothing listens on: every request is refused at once.
  const int port = dettrial::detail::free_local_port();
  test::Context context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<test::DeclarativeRegression> trainer(context);
  FitOptions options = test::quiet({.max_length = Batch(6), .validation_period = Batch(3), .reporting_period = Batch(3)});
  options.mlflow.tracking_uri = "http://127.0.0.1:" + std::to_string(port);
  options.mlflow.experiment_name = "unreachable";
  const FitResult r = trainer.fit(options);
  CHECK(r.batches_trained == 6);
  const nlohmann::json state = nlohmann::json::parse(test::read_text(r.output_dir / "mlflow.json"));
  CHECK(state["run_id"] == "");  // never created
  CHECK(state["sent"]["training"] == 6);
  CHECK(state["sent"]["validation"] == 6);
  // The typed state reads what the run wrote, and writes it back the same.
  const auto typed = dettrial::detail::MlflowState::read(r.output_dir);
  CHECK(typed.continues(options.mlflow.tracking_uri));
  CHECK(typed.experiment_name == "unreachable");
  CHECK(typed.run_id.empty());
  CHECK(typed.sent.at("training") == 6);
  CHECK(std::ranges::count(typed.tags, std::pair<std::string, std::string>("dettrial.ranks", "1")) == 1);
  CHECK(nlohmann::json::parse(typed.to_json()) == state);
  CHECK(dettrial::detail::MlflowState::from_json(typed.to_json()).to_json() == typed.to_json());
  // A torn file is no state: the run is started afresh rather than continued from half a record.
  CHECK_FALSE(dettrial::detail::MlflowState::from_json(R"({"tracking_uri": "http://127.0.0.1:1", "crea)").continues("http://127.0.0.1:1"));
  // The params, two training and two validation reports, the checkpoint's tags, and the status.
  std::vector<nlohmann::json> pending;
  {
    std::ifstream in(r.output_dir / "mlflow-pending.jsonl");
    for (std::string line; std::getline(in, line);) pending.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(pending.size() >= 6);
  CHECK(pending.front()["body"]["params"].size() == 2);  // lr and batch_size
  CHECK(pending.back()["api"] == "runs/update");
  CHECK(pending.back()["body"]["status"] == "FINISHED");
  std::size_t metric_requests = 0;
  for (const auto& p : pending) metric_requests += p["body"].contains("metrics") && !p["body"]["metrics"].empty() ? 1 : 0;
  CHECK(metric_requests == 4);
  // Still down: the sync fails naming the server, and keeps everything.
  CHECK_THROWS_WITH(dettrial::detail::sync_mlflow_folder(r.output_dir), doctest::Contains(("127.0.0.1:" + std::to_string(port)).c_str()));
  CHECK(std::filesystem::exists(r.output_dir / "mlflow-pending.jsonl"));
  CHECK_THROWS_WITH(dettrial::detail::sync_mlflow_folder(r.output_dir / "checkpoints"),
                    doctest::Contains("holds no run tracked in MLflow"));
  std::filesystem::remove_all(r.output_dir);

  // A fit that throws ends its MLflow run FAILED.
  struct Failing : test::DeclarativeRegression {
    using DeclarativeRegression::DeclarativeRegression;
    dettrial::Metrics train_batch(test::Batch& b, torch::nn::Sequential& model, std::int64_t e, std::int64_t i) {
      if (i == 2) throw std::runtime_error("the trial failed at batch 2");
      return DeclarativeRegression::train_batch(b, model, e, i);
    }
  };
  test::Context failing_context(test::hparams(), ContextOptions{.trial_seed = 3});
  Trainer<Failing> failing(failing_context);
  FitOptions failing_options = test::quiet({.max_length = Batch(6)});
  failing_options.mlflow = options.mlflow;
  CHECK_THROWS_WITH(failing.fit(failing_options), doctest::Contains("the trial failed at batch 2"));
  std::string last;
  {
    std::ifstream in(failing_options.output_dir / "mlflow-pending.jsonl");
    for (std::string line; std::getline(in, line);) last = line;
  }
  CHECK(nlohmann::json::parse(last)["body"]["status"] == "FAILED");
  std::filesystem::remove_all(failing_options.output_dir);
}
