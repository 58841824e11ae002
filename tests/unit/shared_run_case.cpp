// shared_run_case DIR PROGRAM ARGS...: one test case's CTest test (the test program's
// CROSSCOMPILING_EMULATOR, so doctest's discovery puts it before each case's command). With
// `--test-case=NAME` among ARGS and a record of NAME in DIR written by the shared run since PROGRAM
// was built (shared_run.hpp): prints it, deletes it, and exits as the case ended (0 passed, 77
// skipped). Otherwise, a failed record included, runs PROGRAM ARGS in this process's place.
// The shared run itself (`--dettrial-shared-run=` among ARGS) passes however the program ends: a
// case that crashed it leaves the cases after it without records, and their own tests run them.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "shared_run.hpp"

namespace {

/// A doctest filter's text as the case's name: doctest escapes a comma in a filter as "\,".
std::string unescaped(std::string_view filter) {
  std::string name;
  for (std::size_t i = 0; i < filter.size(); ++i) {
    if (filter[i] == '\\' && i + 1 < filter.size() && filter[i + 1] == ',') ++i;
    name += filter[i];
  }
  return name;
}

/// Runs PROGRAM with `args` in this process's place; returns only if it cannot.
void run_program(const std::filesystem::path& program, std::vector<char*>& args) {
  ::execv(program.c_str(), args.data());
  std::fprintf(stderr, "shared_run_case: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
}

/// The shared run, in a child: passes however it ends (the cases it did not record run alone).
int shared_run(const std::filesystem::path& program, std::vector<char*>& args) {
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    run_program(program, args);
    ::_exit(127);
  }
  if (child < 0) {
    std::printf("the shared run did not start (fork: %s): each case runs alone, in its own test\n", std::strerror(errno));
    return 0;
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    std::printf("the shared run ended by signal %d: each case it did not record runs alone, in its own test\n", WTERMSIG(status));
  else if (WEXITSTATUS(status) != 0)
    std::printf("the shared run ended with status %d: each case it did not record runs alone, in its own test\n", WEXITSTATUS(status));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: shared_run_case DIR PROGRAM ARGS...\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1], program = argv[2];
  std::vector<std::string_view> filters;
  for (int i = 3; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with("--test-case=")) filters.push_back(std::string_view(argv[i]).substr(12));
  if (filters.size() == 1) {
    const std::string case_name = unescaped(filters.front());
    if (const auto record = test::shared_run::read(dir, case_name, program)) {
      std::error_code ignored;
      std::filesystem::remove(test::shared_run::record_path(dir, case_name), ignored);  // reported once
      using test::shared_run::Outcome;
      if (record->outcome != Outcome::failed) {
        std::printf("%s%s in the shared run of %s (CTest's \"unit:every case in one process\")\n", record->text.c_str(),
                    std::string(test::shared_run::name(record->outcome)).c_str(), program.filename().c_str());
        return record->outcome == Outcome::passed ? 0 : 77;
      }
      std::printf("failed in the shared run of %s: run again alone, in a process of its own\n", program.filename().c_str());
      std::fflush(stdout);
    }
  }
  std::vector<char*> args(argv + 2, argv + argc);
  args.push_back(nullptr);
  if (std::any_of(argv + 3, argv + argc, [](const char* arg) { return std::string_view(arg).starts_with(test::shared_run::option); }))
    return shared_run(program, args);
  run_program(program, args);
  return 1;
}
