// The JPEG window decoder compiled against a jconfig.h of another libjpeg version than the library it
// runs with (a machine with libjpeg 8's jconfig.h in the system's folder and libjpeg-turbo 6.2's
// jpeglib.h on the prefix path, as a GPU machine had): the library's own check at creation must come
// back as an ImageError naming the mismatch, not as a crash. The build points this program's
// jconfig.h at a copy whose JPEG_LIB_VERSION is not the library's (tests/cmake/unit.cmake); it
// includes no LibTorch.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <dettrial/vision/decode.hpp>

#if !defined(DETTRIAL_HAS_LIBJPEG) || !defined(DETTRIAL_OTHER_JPEG_LIB_VERSION)
#error "this program is built only with libjpeg's API and the copied jconfig.h"
#endif
static_assert(JPEG_LIB_VERSION == DETTRIAL_OTHER_JPEG_LIB_VERSION, "jpeglib.h must have read the copied jconfig.h");

TEST_CASE("vision: a JPEG decoder compiled for another libjpeg version than the one it runs with is an ImageError, not a crash") {
  using namespace dettrial::vision;
  // The check fails before any byte is read: a JPEG's first bytes are enough.
  const std::vector<std::uint8_t> bytes{0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0x00};
  const auto whole = [](std::int64_t height, std::int64_t width) {
    return PixelWindow{.top = 0, .left = 0, .height = height, .width = width};
  };
  for (int attempt = 0; attempt < 2; ++attempt)  // and again: nothing was left half made
    CHECK_THROWS_WITH_AS(decode_image_window(bytes, ImageMode::rgb, "other-version.jpg", whole),
                         doctest::Contains("cannot decode 'other-version.jpg' as JPEG: Wrong JPEG library version"), dettrial::ImageError);
}
