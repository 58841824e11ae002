// Hyperparameter search: spaces (sampling, grids), searchers (single, random, grid, adaptive ASHA)
// against Determined's rules and worked examples, and the errors of a bad space.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <dettrial/search.hpp>
#include <dettrial/search/experiment.hpp>
#include <dettrial/detail/json.hpp>  // JsonFieldError, the schema errors SearchEvent::from_json throws

using namespace dettrial;

namespace {
HyperparameterSpace space_of(const std::string& yaml) { return HyperparameterSpace(YAML::Load(yaml), "space.yaml"); }

SearcherSettings asha(std::int64_t max_trials, std::int64_t max_time, double divisor, const std::string& mode,
                      std::int64_t concurrency = 16) {
  SearcherSettings c;
  c.kind = SearcherKind::adaptive_asha;
  c.metric = "validation_loss";
  c.max_trials = max_trials;
  c.max_time = max_time;
  c.divisor = divisor;
  c.mode = mode;
  c.max_concurrent_trials = concurrency;
  return c;
}
}  // namespace

TEST_CASE("ASHA brackets follow Determined's worked example") {
  // max_trials 16, max_time 1000, divisor 4, standard mode: 3 rungs at most; brackets of 3 and 2
  // rungs with 12 and 4 trials and 8 concurrent each; rung lengths 62, 250, 1000 and 250, 1000.
  const auto brackets = searcher::asha_brackets(asha(16, 1000, 4, "standard"));
  REQUIRE(brackets.size() == 2);
  CHECK(brackets[0].rungs == 3);
  CHECK(brackets[1].rungs == 2);
  CHECK(brackets[0].max_trials == 12);
  CHECK(brackets[1].max_trials == 4);
  CHECK(brackets[0].max_concurrent == 8);
  CHECK(brackets[1].max_concurrent == 8);
  CHECK(brackets[0].units_needed == std::vector<std::int64_t>{62, 250, 1000});
  CHECK(brackets[1].units_needed == std::vector<std::int64_t>{250, 1000});
  // The other modes: conservative keeps every bracket, aggressive only the deepest.
  CHECK(searcher::asha_brackets(asha(16, 1000, 4, "conservative")).size() == 3);
  CHECK(searcher::asha_brackets(asha(16, 1000, 4, "aggressive")).size() == 1);
  CHECK_THROWS_WITH_AS(searcher::asha_brackets(asha(16, 1000, 4, "bold")),
                       doctest::Contains("mode must be aggressive, standard or conservative"), ConfigError);
}

TEST_CASE("ASHA stops a trial that ranks outside the top 1/divisor of its rung, and at the top rung") {
  searcher::AdaptiveAsha s(asha(16, 1000, 4, "aggressive"), space_of("lr: {type: double, minval: 0.001, maxval: 0.1}"), 7);
  const auto first = s.initial();
  REQUIRE(first.size() == 16);  // one bracket: min(16 concurrent, 16 trials)
  CHECK(first[0].max_length == 1000);
  // Rung 0 needs 62 units.
  CHECK(s.on_validation(1, 0.5, 30) == SearcherDecision::keep_training);   // before the first rung
  CHECK(s.on_validation(1, 0.5, 62) == SearcherDecision::keep_training);   // first in rung 0
  CHECK(s.on_validation(2, 0.9, 62) == SearcherDecision::stop);            // second of 2: outside max(2/4, 1) = 1
  CHECK(s.on_validation(3, 0.1, 70) == SearcherDecision::keep_training);   // the new best
  CHECK(s.on_validation(1, 0.4, 250) == SearcherDecision::keep_training);  // rung 1, first there
  CHECK(s.on_validation(1, 0.3, 1000) == SearcherDecision::stop);          // the top rung: done
  // A stopped trial is replaced while the bracket has trials to create; here all 16 were created.
  CHECK(s.on_trial_end(2).empty());
}

TEST_CASE("ASHA replaces stopped trials while its bracket has some to create") {
  searcher::AdaptiveAsha s(asha(16, 1000, 4, "standard", 2), space_of("lr: {type: double, minval: 0.001, maxval: 0.1}"), 7);
  const auto first = s.initial();  // 1 concurrent per bracket
  REQUIRE(first.size() == 2);
  CHECK(first[0].bracket == 0);
  CHECK(first[1].bracket == 1);
  const auto next = s.on_trial_end(first[0].id);
  REQUIRE(next.size() == 1);
  CHECK(next[0].bracket == 0);
  CHECK(next[0].id == 3);
}

TEST_CASE("grid points: Determined's count rules per axis type, the cartesian product") {
  const HyperparameterSpace space = space_of(R"(
layers: {type: int, minval: 1, maxval: 3, count: 5}
dropout: {type: double, minval: 0.0, maxval: 0.5, count: 3}
lr: {type: log, base: 10, minval: -3, maxval: -1, count: 3}
optimizer: {type: categorical, vals: [sgd, adam]}
global_batch_size: 64
)");
  const auto& axes = space.axes();
  REQUIRE(axes.size() == 5);
  auto values = [](const HyperparameterAxis& a) {
    std::vector<double> out;
    for (const auto& v : HyperparameterSpace::grid_values(a)) out.push_back(v.as<double>());
    return out;
  };
  CHECK(values(axes[0]) == std::vector<double>{1, 2, 3});  // count capped at max - min + 1
  CHECK(values(axes[1]) == std::vector<double>{0.0, 0.25, 0.5});
  const auto lr = values(axes[2]);
  CHECK(lr[0] == doctest::Approx(0.001));
  CHECK(lr[1] == doctest::Approx(0.01));
  CHECK(lr[2] == doctest::Approx(0.1));
  const auto points = space.grid();
  CHECK(points.size() == 3 * 3 * 3 * 2);
  std::set<std::string> distinct;
  for (const auto& p : points) distinct.insert(YAML::Dump(p));
  CHECK(distinct.size() == points.size());
  CHECK(points[0]["global_batch_size"].as<int>() == 64);
  // One point of an int axis is its middle, rounded.
  CHECK(HyperparameterSpace::grid_values(space_of("n: {type: int, minval: 1, maxval: 4, count: 1}").axes()[0])[0].as<int>() == 3);
  CHECK_THROWS_WITH_AS(space_of("lr: {type: double, minval: 0.1, maxval: 1.0}").grid(),
                       doctest::Contains("needs 'count' for hyperparameter 'lr'"), ConfigError);
}

TEST_CASE("random samples stay in range, nest, and repeat with the experiment seed") {
  const HyperparameterSpace space = space_of(R"(
units: {type: int, minval: 8, maxval: 12}
lr: {type: log, base: 10, minval: -4, maxval: -2}
optimizer: {type: categorical, vals: [sgd, adam]}
arch:
  depth: {type: int, minval: 1, maxval: 2}
  width: 32
)");
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const YAML::Node p = space.sample(rng);
    CHECK(p["units"].as<int>() >= 8);
    CHECK(p["units"].as<int>() <= 12);
    CHECK(p["lr"].as<double>() >= 1e-4);
    CHECK(p["lr"].as<double>() <= 1e-2);
    CHECK((p["optimizer"].as<std::string>() == "sgd" || p["optimizer"].as<std::string>() == "adam"));
    CHECK(p["arch"]["width"].as<int>() == 32);
    CHECK(p["arch"]["depth"].as<int>() >= 1);
  }
  SearcherSettings random;
  random.kind = SearcherKind::random;
  random.max_trials = 5;
  random.max_concurrent_trials = 2;
  searcher::Random a(random, space, 42), b(random, space, 42), c(random, space, 43);
  const auto ta = a.initial(), tb = b.initial(), tc = c.initial();
  REQUIRE(ta.size() == 2);
  CHECK(YAML::Dump(ta[0].hparams) == YAML::Dump(tb[0].hparams));
  CHECK(ta[0].seed == tb[0].seed);
  CHECK(YAML::Dump(ta[0].hparams) + YAML::Dump(ta[1].hparams) != YAML::Dump(tc[0].hparams) + YAML::Dump(tc[1].hparams));
  // A new trial each time one ends, until max_trials were created.
  std::int64_t created = 2;
  for (std::int64_t id = 1; id <= 5; ++id) created += static_cast<std::int64_t>(a.on_trial_end(id).size());
  CHECK(created == 5);
  // Nested hyperparameters reach a trial as a nested map (the Context reads "arch.depth").
  const Hyperparameters h(space.sample(rng), "trial");
  CHECK(h.get<int>("arch.width") == 32);
}

TEST_CASE("a bad search space names the file, line and column") {
  CHECK_THROWS_WITH_AS(space_of("lr: {type: double, minval: 1.0, maxval: 0.5}"), doctest::Contains("space.yaml:1:"), ConfigError);
  CHECK_THROWS_WITH_AS(space_of("lr: {type: double, minval: 1.0, maxval: 0.5}"), doctest::Contains("needs minval < maxval"), ConfigError);
  CHECK_THROWS_WITH_AS(space_of("lr: {type: log, minval: -3, maxval: -1, base: -2}"), doctest::Contains("needs base > 0"), ConfigError);
  CHECK_THROWS_WITH_AS(space_of("opt: {type: categorical, vals: []}"), doctest::Contains("needs a non-empty list 'vals'"), ConfigError);
  CHECK_THROWS_WITH_AS(space_of("n: {type: int, minval: a, maxval: 3}"), doctest::Contains("needs a number 'minval'"), ConfigError);
  CHECK_THROWS_WITH_AS(space_of("n: {type: integer, minval: 1, maxval: 3}"), doctest::Contains("unknown type 'integer'"), ConfigError);
}

TEST_CASE("a search's event log: another experiment's trial, a second end, a damaged line or a mistyped field is refused naming the file") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dettrial-events-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The search of tests/experiment/asha.yaml: trial 1 is among its first.
  const ExperimentConfig config = ExperimentConfig::parse(R"(name: asha
hyperparameters:
  global_batch_size: 16
  lr: {type: log, base: 10, minval: -4, maxval: -1}
searcher: {name: adaptive_asha, metric: validation_loss, max_trials: 12, max_time: 64, time_metric: batches, divisor: 2, mode: aggressive,
           max_concurrent_trials: 2}
reproducibility: {experiment_seed: 5}
)",
                                                          "asha.yaml");
  const std::string events = (dir / "events.jsonl").string();
  const auto replay = [&](const std::string& log) {
    std::ofstream(events, std::ios::binary | std::ios::trunc) << log;
    Experiment experiment(config, {.output_dir = dir, .quiet = true});
    experiment.replay();
    return experiment.trials();
  };
  const std::string validated = R"({"event":"validation","trial":1,"metric":0.25,"time":4,"batches":4})"
                                "\n";
  const std::string ended = R"({"event":"end","trial":1,"state":"COMPLETED","restarts":1})"
                            "\n";
  // What a runner wrote reads back, and a torn last line (a runner killed while writing it) is left out.
  auto trials = replay(validated + ended + R"({"event":"valid)");
  CHECK(trials.at(1).state == TrialState::completed);
  CHECK(trials.at(1).best_metric == 0.25);
  CHECK(trials.at(1).restarts == 1);
  CHECK_THROWS_WITH_AS(
      replay(R"({"event":"end","trial":999,"state":"COMPLETED","restarts":0})"
             "\n"),
      doctest::Contains(("'" + events + "' has an event of trial 999, which this experiment's searcher did not create").c_str()), Error);
  CHECK_THROWS_WITH_AS(replay(validated + ended + ended),
                       ("'" + events + "' ends trial 1 a second time: " + ended.substr(0, ended.size() - 1)).c_str(), Error);
  CHECK_THROWS_WITH_AS(replay("{\"event\":\n" + ended), doctest::Contains(("'" + events + "' line 1 is not a JSON record").c_str()), Error);
  // A number past a double's range (nlohmann/json's out_of_range, not a parse_error; the fuzz target's finding).
  CHECK_THROWS_WITH_AS(replay(R"({"event":"validation","trial":1,"metric":1e99999,"time":4})"
                              "\n" +
                              ended),
                       doctest::Contains(("'" + events + "' line 1 is not a JSON record (number overflow parsing '1e99999')").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(replay(R"({"event":"validation","trial":1,"metric":"0.25","time":4})"
                              "\n"),
                       doctest::Contains("lacks a field or has one of the wrong type ('metric' is a string, not a number)"), Error);
  // An event kind, or an end state, that no runner writes is refused with the field named.
  CHECK_THROWS_WITH_AS(replay(R"({"event":"paused","trial":1})"
                              "\n"),
                       doctest::Contains("('event' is 'paused', not validation, restart or end)"), Error);
  CHECK_THROWS_WITH_AS(replay(R"({"event":"end","trial":1,"state":"RUNNING","restarts":0})"
                              "\n"),
                       doctest::Contains("('state' is 'RUNNING', not COMPLETED, STOPPED_EARLY or ERRORED)"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a search event reads back what it writes, each kind with its optional fields") {
  const std::vector<SearchEvent> events = {
      {.trial = 3,
       .what = SearchEvent::Validation{.metric = 0.125, .time = 48, .batches = 96, .rung = 1, .stopped = true},
       .slurm_job = std::nullopt},
      {.trial = 4,
       .what = SearchEvent::Validation{.metric = -2, .time = 7.5, .batches = std::nullopt, .rung = std::nullopt, .stopped = false},
       .slurm_job = std::nullopt},
      {.trial = 5, .what = SearchEvent::Restart{.restarts = 2}, .slurm_job = 812},
      {.trial = 6, .what = SearchEvent::End{.state = TrialState::stopped_by_searcher, .restarts = 0}, .slurm_job = std::nullopt},
      {.trial = 7, .what = SearchEvent::End{.state = TrialState::errored, .restarts = 3}, .slurm_job = 9}};
  for (const SearchEvent& e : events) {
    const dettrial::detail::Json line = e.to_json();
    CAPTURE(line.dump());
    const SearchEvent back = SearchEvent::from_json(dettrial::detail::Json::parse(line.dump()));
    CHECK(back.trial == e.trial);
    CHECK(back.slurm_job == e.slurm_job);
    CHECK(back.what.index() == e.what.index());
    if (const auto* v = std::get_if<SearchEvent::Validation>(&e.what)) {
      const auto& w = std::get<SearchEvent::Validation>(back.what);
      CHECK(w.metric == v->metric);
      CHECK(w.time == v->time);
      CHECK(w.batches == v->batches);
      CHECK(w.rung == v->rung);
      CHECK(w.stopped == v->stopped);
    } else if (const auto* r = std::get_if<SearchEvent::Restart>(&e.what)) {
      CHECK(std::get<SearchEvent::Restart>(back.what).restarts == r->restarts);
    } else {
      CHECK(std::get<SearchEvent::End>(back.what).state == std::get<SearchEvent::End>(e.what).state);
      CHECK(std::get<SearchEvent::End>(back.what).restarts == std::get<SearchEvent::End>(e.what).restarts);
    }
  }
  // The line a runner of an earlier release wrote (Determined's state names) reads as it did.
  const SearchEvent end =
      SearchEvent::from_json(dettrial::detail::Json::parse(R"({"event":"end","trial":2,"state":"STOPPED_EARLY","restarts":1})"));
  CHECK(std::get<SearchEvent::End>(end.what).state == TrialState::stopped_by_searcher);
  CHECK_THROWS_WITH_AS(SearchEvent::from_json(dettrial::detail::Json::parse(R"({"event":"restart","trial":2})")),
                       doctest::Contains("restarts"), dettrial::detail::JsonFieldError);
  CHECK_THROWS_WITH_AS(
      SearchEvent::from_json(dettrial::detail::Json::parse(R"({"event":"validation","trial":2,"metric":1,"time":1,"stopped":1})")),
      doctest::Contains("stopped"), dettrial::detail::JsonFieldError);
}

TEST_CASE("a JSON-lines file: a torn last line is left out and cut before the next append, and a file is followed by inode and offset") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dettrial-jsonl-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path path = dir / "log.jsonl";
  const dettrial::detail::JsonlFile file(path);
  CHECK_THROWS_WITH_AS(file.read(), doctest::Contains("cannot read"), Error);
  std::ofstream(path, std::ios::binary) << "{\"a\":1}\n\n{\"a\":2}\n{\"a\":";
  bool torn = false;
  auto records = file.read(&torn);
  CHECK(torn);
  REQUIRE(records.size() == 2);
  CHECK(records[1]["a"] == 2);
  // The next record starts a line of its own: the torn one is cut off first.
  CHECK(file.cut_torn_line());
  CHECK_FALSE(file.cut_torn_line());
  file.append({{"a", 3}});
  records = file.read(&torn);
  CHECK_FALSE(torn);
  REQUIRE(records.size() == 3);
  CHECK(records[2]["a"] == 3);
  // Rewritten with the records kept: a torn last line goes with the dropped ones, and a file with
  // nothing to drop is left as it is (its inode too).
  std::ofstream(path, std::ios::binary | std::ios::app) << "{\"a\":";
  const auto inode = [&] {
    struct stat st{};
    ::stat(path.c_str(), &st);
    return st.st_ino;
  };
  CHECK(file.keep_only([](const dettrial::detail::Json& r) { return r["a"] != 2; }) == 2);
  CHECK(dettrial::detail::JsonlFile(path).read().size() == 2);
  {
    std::ifstream in(path, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "{\"a\":1}\n{\"a\":3}\n");
  }
  const auto kept_inode = inode();
  CHECK(file.keep_only([](const dettrial::detail::Json&) { return true; }) == 0);
  CHECK(inode() == kept_inode);
  // Damage before the last line is an error naming the file and the line, and so is a line that is not an object.
  std::ofstream(path, std::ios::binary | std::ios::app) << "\n[1, 2]\n{\"a\":4}\n";
  CHECK_THROWS_WITH_AS(file.read(), doctest::Contains(("'" + path.string() + "' line 4 is not a JSON record (it is an array").c_str()),
                       Error);

  // The tail: complete lines only (one being written waits), in order, each once.
  const fs::path metrics = dir / "metrics.jsonl";
  dettrial::detail::JsonlTail tail;
  CHECK(tail.read_new(metrics).empty());  // not there yet
  std::ofstream(metrics, std::ios::binary) << "{\"b\":1}\n{\"b\":";
  auto lines = tail.read_new(metrics);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["b"] == 1);
  std::ofstream(metrics, std::ios::binary | std::ios::app) << "2}\nnot json\n{\"b\":3}\n";
  lines = tail.read_new(metrics);
  REQUIRE(lines.size() == 2);  // the line that does not parse is skipped
  CHECK(lines[0]["b"] == 2);
  CHECK(lines[1]["b"] == 3);
  CHECK(tail.read_new(metrics).empty());
  // A file replaced (a resumed trial rewrites its metrics.jsonl) is read again from its start,
  // even when the new one is as long as the old.
  const fs::path replacement = dir / "metrics.jsonl.new";
  std::ofstream(replacement, std::ios::binary) << "{\"b\":9}\n";
  fs::rename(replacement, metrics);
  lines = tail.read_new(metrics);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["b"] == 9);
  fs::remove_all(dir);
}
