// Where the tests' data files are (this checkout's tests/ folder).
#pragma once

namespace test {
/// The tests/ folder of the checkout the tests were built from.
const char* tests_source_dir();
}  // namespace test
