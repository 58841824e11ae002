// The first stage of a trial program, its command line, on its own: this program includes no LibTorch
// (its target links doctest and dettrial's include folder only), so a command line is checked in a
// second of compile time, and the stage provably does not depend on the rest.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <dettrial/cli/command_line.hpp>

#if defined(TORCH_VERSION_MAJOR) || defined(AT_ASSERT)
#error "the command line's stage must not include LibTorch"
#endif

namespace {

dettrial::CommandLine parse(std::vector<const char*> args) {
  args.insert(args.begin(), "trainer");
  return dettrial::parse_command_line(static_cast<int>(args.size()), args.data());
}

std::string error_of(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const dettrial::CommandLineError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("parse_command_line: every flag lands in its field, and each rank's command line drops --nproc alone") {
  const auto line = parse({"--config",   "c.yaml", "--set",       "a.b=1",   "--nproc",      "3",  "--set",     "hyperparameters.lr=0.1",
                           "--output",   "out",    "--threads",   "2",       "--timeout",    "60", "--backend", "gloo",
                           "--launcher", "slurm",  "--test-mode", "--quiet", "--no-cpu-bind"});
  CHECK(line.program == "trainer");
  CHECK(line.config_path == "c.yaml");
  CHECK(line.overrides == std::vector<std::string>{"a.b=1", "hyperparameters.lr=0.1"});
  CHECK(line.output == "out");
  CHECK(line.nproc == 3);
  CHECK(line.threads == 2);
  CHECK(line.timeout_seconds == 60);
  CHECK(line.backend_name == "gloo");
  CHECK(line.slurm_launcher);
  CHECK(line.test_mode);
  CHECK(line.quiet);
  CHECK(line.no_cpu_bind);
  CHECK_FALSE(line.help);
  CHECK(line.rank_args == std::vector<std::string>{
                              "trainer",  "--config",   "c.yaml",    "--set",       "a.b=1",     "--set",        "hyperparameters.lr=0.1",
                              "--output", "out",        "--threads", "2",           "--timeout", "60",           "--backend",
                              "gloo",     "--launcher", "slurm",     "--test-mode", "--quiet",   "--no-cpu-bind"});
}

TEST_CASE("parse_command_line: --nproc MIN:MAX and --max-restarts, which each rank also gets") {
  const auto line = parse({"--config", "c.yaml", "--nproc", "2:4", "--max-restarts", "0"});
  CHECK(line.nproc_min == 2);
  CHECK(line.nproc == 4);
  CHECK(line.max_restarts == 0L);
  CHECK(line.rank_args == std::vector<std::string>{"trainer", "--config", "c.yaml", "--max-restarts", "0"});
  const auto fixed = parse({"--config", "c.yaml", "--nproc", "3"});
  CHECK(fixed.nproc_min == 0);
  CHECK_FALSE(fixed.max_restarts);
}

TEST_CASE("parse_command_line: the defaults, --resume without --config, --report and --help alone") {
  const auto resumed = parse({"--resume", "runs/a"});
  CHECK(resumed.resume == "runs/a");
  CHECK(resumed.config_path.empty());
  CHECK(resumed.nproc == 0);
  CHECK_FALSE(resumed.threads);
  CHECK(resumed.timeout_seconds == 300);
  CHECK(resumed.backend_name.empty());
  CHECK_FALSE(resumed.slurm_launcher);
  CHECK(parse({"--report", "runs/a"}).report_dir == "runs/a");
  CHECK(parse({"--help"}).help);
  CHECK(parse({"-h"}).help);
}

TEST_CASE("parse_command_line: each wrong command line is one sentence naming the flag and the value") {
  CHECK(error_of({"--config"}) == "--config needs a value");
  CHECK(error_of({"--config", "c.yaml", "--nproc", "0"}) == "--nproc needs a positive integer, not '0'");
  CHECK(error_of({"--config", "c.yaml", "--threads", "two"}) == "--threads needs a positive integer, not 'two'");
  CHECK(error_of({"--config", "c.yaml", "--timeout", "5s"}) == "--timeout needs a positive integer, not '5s'");
  CHECK(error_of({"--config", "c.yaml", "--backend", "mpi"}) == "--backend must be gloo or nccl, not 'mpi'");
  CHECK(error_of({"--config", "c.yaml", "--launcher", "k8s"}) == "--launcher must be local or slurm, not 'k8s'");
  CHECK(error_of({"--config", "c.yaml", "--bogus"}) == "unknown argument '--bogus'");
  CHECK(error_of({"--config", "c.yaml", "--nproc", "3:2"}) == "--nproc MIN:MAX needs MIN <= MAX, not '3:2'");
  CHECK(error_of({"--config", "c.yaml", "--nproc", "0:2"}) == "--nproc needs a positive integer, not '0'");
  CHECK(error_of({"--config", "c.yaml", "--nproc", "2:"}) == "--nproc needs a positive integer, not ''");
  CHECK(error_of({"--config", "c.yaml", "--max-restarts", "-1"}) == "--max-restarts needs a non-negative integer, not '-1'");
  CHECK(error_of({"--set", "a=1"}) == "--config FILE is required (or --resume DIR, which reads the run's own config)");
  CHECK(error_of({}) == "--config FILE is required (or --resume DIR, which reads the run's own config)");
}

TEST_CASE("parse_command_line: the usage follows only where the shape of the whole command is in doubt") {
  auto usage_shown = [](std::vector<const char*> args) {
    try {
      parse(std::move(args));
    } catch (const dettrial::CommandLineError& e) {
      return e.show_usage;
    }
    FAIL("no error");
    return false;
  };
  CHECK(usage_shown({"--config", "c.yaml", "--bogus"}));
  CHECK(usage_shown({}));
  CHECK_FALSE(usage_shown({"--config", "c.yaml", "--nproc", "x"}));
  CHECK(std::string(dettrial::main_usage()).find("usage: %s --config FILE") == 0);
}
