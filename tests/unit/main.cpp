#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "shared_run.hpp"
#include "skip.hpp"

namespace {

// With --dettrial-shared-run=DIR: the folder each case's record goes to (shared_run.hpp).
std::filesystem::path shared_run_dir;

// Counts the test cases that ran and those that called test::skip; in a shared run, records each
// case's outcome for its own CTest test.
struct SkipListener : doctest::IReporter {
  explicit SkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    test::skip_count.current_skipped = false;
    test::skip_count.current_reason.clear();
    current_name = data.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    ++test::skip_count.ran;
    if (test::skip_count.current_skipped) ++test::skip_count.skipped;
    if (shared_run_dir.empty()) return;
    using test::shared_run::Outcome;
    const Outcome outcome = !stats.testCaseSuccess             ? Outcome::failed
                            : test::skip_count.current_skipped ? Outcome::skipped
                                                               : Outcome::passed;
    test::shared_run::write(shared_run_dir, current_name,
                            {outcome, outcome == Outcome::skipped ? "skipped: " + test::skip_count.current_reason + "\n" : ""});
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

  std::string current_name;
};
REGISTER_LISTENER("skips", 1, SkipListener);

}  // namespace

int main(int argc, char** argv) {
  // --dettrial-shared-run=DIR is this program's, not doctest's; it leaves out the cases that need a
  // process of their own.
  std::vector<char*> args(argv, argv + argc);
  std::string exclude = "--test-suite-exclude=" + std::string(test::shared_run::own_process_suite);
  for (auto it = args.begin() + 1; it != args.end(); ++it) {
    if (std::string_view(*it).starts_with(test::shared_run::option)) {
      shared_run_dir = std::string_view(*it).substr(test::shared_run::option.size());
      args.erase(it);
      std::filesystem::remove_all(shared_run_dir);
      std::filesystem::create_directories(shared_run_dir);
      args.push_back(exclude.data());
      break;
    }
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  const int result = context.run();
  if (context.shouldExit()) return result;
  if (!shared_run_dir.empty()) {
    // Each case's CTest test reports its own outcome (a failed case runs again, alone, there).
    std::printf("shared run: %d cases recorded in %s\n", test::skip_count.ran, shared_run_dir.c_str());
    return test::skip_count.ran > 0 ? 0 : 1;
  }
  // CTest runs each discovered case by name: a filter that matches no test case (a name CMake's
  // list cut short at a ';', a renamed case) would otherwise pass without running anything.
  const bool filtered = std::any_of(argv + 1, argv + argc, [](const char* arg) {
    const std::string_view a(arg);
    return a.starts_with("--test-case=") || a.starts_with("-tc=");
  });
  if (result == 0 && filtered && test::skip_count.ran == 0) {
    std::fprintf(stderr, "no test case matches the --test-case filter: nothing ran\n");
    return 1;
  }
  // Every test case that ran was skipped: CTest's SKIP_RETURN_CODE.
  if (result == 0 && test::skip_count.ran > 0 && test::skip_count.skipped == test::skip_count.ran) return 77;
  return result;
}
