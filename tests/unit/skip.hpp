// Skipping a test case at run time, reported to CTest as skipped (exit code 77), never as passed.
// doctest has no run-time skip: a test case whose data, backend or tool is absent calls test::skip
// and returns; the program exits 77 when every test case it ran was skipped (CTest runs each
// discovered case alone, so that case is reported skipped with its reason).
#pragma once

#include <cstdio>
#include <string>

namespace test {

struct SkipCount {
  int ran = 0;
  int skipped = 0;
  bool current_skipped = false;
  std::string current_reason;  ///< the running case's, when it skipped
};
inline SkipCount skip_count;

/// Marks the running test case skipped and says why (the caller returns right after).
inline void skip(const std::string& reason) {
  std::printf("skipped: %s\n", reason.c_str());
  std::fflush(stdout);
  skip_count.current_skipped = true;
  skip_count.current_reason = reason;
}

/// Why this program's memory is no measure of what the code keeps, when a sanitizer's allocator
/// serves it (AddressSanitizer's quarantine holds freed blocks, ThreadSanitizer's allocator its
/// own caches); empty otherwise. Cases that measure memory skip themselves with it.
inline const char* memory_unmeasurable() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr bool sanitized = true;  // GCC's macros
#elif defined(__has_feature)
  constexpr bool sanitized = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);  // clang's
#else
  constexpr bool sanitized = false;
#endif
  return sanitized ? "a sanitizer's allocator serves this build (AddressSanitizer's quarantine keeps freed memory): its memory figures are "
                     "not the code's"
                   : "";
}

}  // namespace test
