// The sanitizer builds' canary: each defect the builds are there to catch, made on purpose, so that
// CTest sees the sanitizer report it (tests/cmake/sanitize.cmake). A build whose flags, runtime or
// options stopped a sanitizer from reporting fails these tests instead of passing everything.
//   sanitizer_canary heap-overflow | use-after-free | leak | signed-overflow | data-race
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

namespace {
// Through a volatile pointer: the compiler cannot see, and so cannot remove, what the defect does.
int read_past_the_end() {
  int* volatile block = new int[4];
  const int value = block[4];
  delete[] block;
  return value;
}
int read_after_free() {
  int* volatile block = new int[4];
  delete[] block;
  return block[0];
}
int lose_a_block() {
  int* volatile block = new int[4];
  block = nullptr;
  return 0;
}
int overflow_an_int() {
  volatile int big = 2147483647;
  return big + 1;
}
int race() {
  static int shared = 0;
  std::thread other([] { ++shared; });
  ++shared;
  other.join();
  return shared;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string_view defect = argc > 1 ? argv[1] : "";
  if (defect == "heap-overflow") return read_past_the_end();
  if (defect == "use-after-free") return read_after_free();
  if (defect == "leak") return lose_a_block();
  if (defect == "signed-overflow") return overflow_an_int();
  if (defect == "data-race") return race();
  std::fprintf(stderr, "usage: sanitizer_canary heap-overflow|use-after-free|leak|signed-overflow|data-race\n");
  return 2;
}
