// The checkout's path is compiled into this one small file only: a translation unit that includes
// LibTorch and held it would miss the compiler cache in every other checkout (a clone at another
// path, as CI's), where the rest of the suite hits.
#include "source_dir.hpp"

const char* test::tests_source_dir() { return DETTRIAL_TESTS_SOURCE_DIR; }
