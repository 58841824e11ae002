// Running a test program's cases in one process while CTest still reports each case on its own.
// A program that links LibTorch spends most of a second in LibTorch's start-up before its first
// case: over two hundred cases, one process each, that was minutes of every suite. So CTest's test
// "unit:every case in one process" runs the program once with `--dettrial-shared-run=DIR`, which
// writes one record per case into DIR (passed, skipped with its reason, failed), and each case's
// own CTest test (the program's CROSSCOMPILING_EMULATOR is shared_run_case) reports its record and
// deletes it. A case with no record (a shared run that crashed, was not run, or ran before the
// program was last built) or a failed one runs alone, in its own process, as before.
// Cases that change the process for good (applying ProcessSettings) are in the test suite
// `own_process_suite`: the shared run leaves them out, and they always run alone.
// No LibTorch and no doctest here: shared_run_case starts in a millisecond.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace test::shared_run {

inline constexpr std::string_view option = "--dettrial-shared-run=";
inline constexpr const char* own_process_suite = "own process";

/// How a case ended in the shared run.
enum class Outcome { passed, skipped, failed };
inline constexpr std::array<std::string_view, 3> outcome_names = {"passed", "skipped", "failed"};

inline std::string_view name(Outcome outcome) { return outcome_names[static_cast<std::size_t>(outcome)]; }

/// What a case did in the shared run, and what to print for it (a skip's reason).
struct Record {
  Outcome outcome;
  std::string text;
};

/// The file of `test_case`'s record in `dir`: FNV-1a of the name (a case's name is too long, and
/// has too many kinds of characters, for a file name).
inline std::filesystem::path record_path(const std::filesystem::path& dir, std::string_view test_case) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const char c : test_case) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.case", static_cast<unsigned long long>(hash));
  return dir / name;
}

/// Writes the record whole or not at all (a reader never sees half of one).
inline void write(const std::filesystem::path& dir, std::string_view test_case, const Record& record) {
  const std::filesystem::path path = record_path(dir, test_case);
  const std::filesystem::path part = path.string() + ".part";
  {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    out << name(record.outcome) << '\n' << record.text;
  }
  std::filesystem::rename(part, path);
}

/// `test_case`'s record, if the shared run wrote one for it after `program` was last built.
inline std::optional<Record> read(const std::filesystem::path& dir, std::string_view test_case, const std::filesystem::path& program) {
  const std::filesystem::path path = record_path(dir, test_case);
  std::error_code error;
  const auto written = std::filesystem::last_write_time(path, error);
  if (error) return std::nullopt;
  const auto built = std::filesystem::last_write_time(program, error);
  if (error || written < built) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::string outcome;
  if (!std::getline(in, outcome)) return std::nullopt;
  const auto known = std::find(outcome_names.begin(), outcome_names.end(), outcome);
  if (known == outcome_names.end()) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return Record{static_cast<Outcome>(known - outcome_names.begin()), text.str()};
}

}  // namespace test::shared_run
