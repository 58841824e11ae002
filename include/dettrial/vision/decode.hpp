// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Decoding JPEG and PNG files into 8-bit images, converted as PIL converts them.
///
/// JPEG goes through libjpeg-turbo's TurboJPEG API, PNG through libspng: both are in Debian, Conan
/// and vcpkg, both decode from memory with no global state, and libjpeg-turbo is what PIL and
/// torchvision decode JPEG with, so the pixels are the same. Both are optional at build time: CMake
/// defines `DETTRIAL_HAS_TURBOJPEG` and `DETTRIAL_HAS_SPNG` where it finds them, and without one
/// decoding that format throws an ImageError saying so.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "image.hpp"

namespace dettrial::vision {

/// Whether this build decodes JPEG (libjpeg-turbo was found), PNG (libspng was found) and WebP
/// (libwebp was found).
#if defined(DETTRIAL_HAS_TURBOJPEG)
inline constexpr bool decodes_jpeg = true;
#else
inline constexpr bool decodes_jpeg = false;
#endif
#if defined(DETTRIAL_HAS_SPNG)
inline constexpr bool decodes_png = true;
#else
inline constexpr bool decodes_png = false;
#endif
#if defined(DETTRIAL_HAS_WEBP)
inline constexpr bool decodes_webp = true;
#else
inline constexpr bool decodes_webp = false;
#endif

/**
 * @brief Decodes a JPEG (gray, colour, CMYK), PNG (8- or 16-bit; grayscale, gray with alpha, RGB,
 * RGBA or palette) or WebP (lossy or lossless, with or without alpha) file's bytes into `mode`, as
 * PIL's `Image.open(f).convert(mode)`: 16-bit samples keep their high byte, alpha is dropped. Throws ImageError naming `name` and
 * the decoder's reason for anything else: a truncated or corrupt file (a JPEG the decoder would only
 * warn about included: a silently grey-filled image is a wrong batch), another format, or a format
 * this build has no decoder for.
 */
DETTRIAL_INLINE Image decode_image(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name);

/// Reads and decodes the image file at `path` (see decode_image).
DETTRIAL_INLINE Image read_image(const std::filesystem::path& path, ImageMode mode);

/// Whether this build decodes a window of a JPEG without the rest (libjpeg-turbo's libjpeg API was found).
#if defined(DETTRIAL_HAS_LIBJPEG)
inline constexpr bool decodes_jpeg_windows = true;
#else
inline constexpr bool decodes_jpeg_windows = false;
#endif

/**
 * @brief The window `choose(height, width)` picks of the image in `bytes`: decode_image's pixels
 * cropped to it, bit for bit. A JPEG decodes only what the window needs where this build has
 * libjpeg's API (decodes_jpeg_windows): no row below it, the rows above it entropy-decoded and
 * skipped, and only the block columns it covers transformed. Damage below the window's last row
 * therefore goes unseen (every pixel returned is the file's own); damage up to it is an ImageError
 * as in decode_image. Other formats decode whole, then crop. A window that allows it
 * (PixelWindow::at_least_height and at_least_width) comes back from a JPEG at the smallest DCT
 * scale that keeps it that large: not the full decode's pixels, as the caller asked.
 */
DETTRIAL_INLINE Image decode_image_window(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name,
                                          WindowChooser choose);

/// Reads the image file at `path` and decodes the window `choose` picks (see decode_image_window).
DETTRIAL_INLINE Image read_image_window(const std::filesystem::path& path, ImageMode mode, WindowChooser choose);

/// Reads a whole file into `buffer` (reusing its capacity). Throws ImageError naming the file.
DETTRIAL_INLINE void read_file(const std::filesystem::path& path, std::vector<std::uint8_t>& buffer);

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#if defined(DETTRIAL_HAS_TURBOJPEG)
#include <turbojpeg.h>
#endif
#if defined(DETTRIAL_HAS_LIBJPEG)
#include <csetjmp>
#include <cstdio>  // jpeglib.h uses FILE without including it

#include <jpeglib.h>
#endif
#if defined(DETTRIAL_HAS_SPNG)
#include <spng.h>
#endif
#if defined(DETTRIAL_HAS_WEBP)
#include <webp/decode.h>
#endif

namespace dettrial::detail {

/// The largest image accepted, a guard against decompression bombs (a damaged header can claim any
/// size): 32768 a side, and PIL's own limit in all (twice its MAX_IMAGE_PIXELS, where it refuses).
inline constexpr std::int64_t max_image_side = 1 << 15;
inline constexpr std::int64_t max_image_pixels = 2 * 89'478'485;

inline void check_size(std::int64_t width, std::int64_t height, const std::string& name) {
  if (width < 1 || height < 1 || width > max_image_side || height > max_image_side || width * height > max_image_pixels)
    throw ImageError("cannot decode '" + name + "': its header claims " + std::to_string(width) + "x" + std::to_string(height) +
                     " pixels (the limit is " + std::to_string(max_image_side) + " a side and " + std::to_string(max_image_pixels) +
                     " in all)");
}

/// PIL's RGB to L conversion, in place: the first third of `pixels` becomes the gray image.
inline void rgb_to_gray(vision::Image& image) {
  const std::int64_t n = image.height * image.width;
  std::uint8_t* p = image.pixels.data();
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = vision::pil_luma(p[3 * i], p[3 * i + 1], p[3 * i + 2]);
  }
  image.pixels.resize(static_cast<std::size_t>(n));
  image.channels = 1;
}

/// A CMYK JPEG's samples as PIL reads and converts them to RGB: PIL takes every CMYK JPEG's samples
/// as Adobe writes them, inverted (its raw mode "CMYK;I"), then `convert("RGB")` computes each
/// channel as (255 - K) - C (255 - K) / 255, rounded as its MULDIV255. `cmyk` holds the file's samples.
inline vision::Image pil_cmyk_to_rgb(const std::vector<std::uint8_t>& cmyk, std::int64_t height, std::int64_t width) {
  vision::Image rgb(height, width, 3);
  const std::int64_t n = height * width;
  const std::uint8_t* in = cmyk.data();
  std::uint8_t* out = rgb.pixels.data();
  for (std::int64_t i = 0; i < n; ++i, in += 4, out += 3) {
    const int not_black = in[3];  // 255 - K, K being the inverted sample 255 - in[3]
    for (int c = 0; c < 3; ++c) {
      const int t = (255 - in[c]) * not_black + 128;
      out[c] = static_cast<std::uint8_t>(not_black - (((t >> 8) + t) >> 8));
    }
  }
  return rgb;
}

/// PIL's L to RGB conversion: each gray sample three times.
inline vision::Image gray_to_rgb(const vision::Image& gray) {
  vision::Image rgb(gray.height, gray.width, 3);
  const std::int64_t n = gray.height * gray.width;
  for (std::int64_t i = 0; i < n; ++i) rgb.pixels[3 * i] = rgb.pixels[3 * i + 1] = rgb.pixels[3 * i + 2] = gray.pixels[i];
  return rgb;
}

#if defined(DETTRIAL_HAS_TURBOJPEG)
/// One TurboJPEG decompressor per thread (a handle is not thread-safe; creating one costs more than
/// decoding a small image).
/// A handle that failed is replaced: after an error TurboJPEG 2.x can leave state behind that breaks
/// the next, valid file.
struct JpegDecompressor {
  tjhandle handle = tjInitDecompress();
  JpegDecompressor() = default;
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;
  ~JpegDecompressor() {
    if (handle) tjDestroy(handle);
  }
  void renew() {
    if (handle) tjDestroy(handle);
    handle = tjInitDecompress();
  }
};

inline JpegDecompressor& jpeg_decompressor() {
  thread_local JpegDecompressor d;
  if (!d.handle) throw ImageError(std::string("cannot start libjpeg-turbo's decompressor: ") + tjGetErrorStr2(nullptr));
  return d;
}

inline vision::Image decode_jpeg(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  JpegDecompressor& decompressor = jpeg_decompressor();
  tjhandle tj = decompressor.handle;
  const auto fail = [&] {
    ImageError error("cannot decode '" + name + "' as JPEG: " + tjGetErrorStr2(tj));
    decompressor.renew();
    return error;
  };
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height, &subsampling, &colorspace) != 0)
    throw fail();
  check_size(width, height, name);
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    // libjpeg-turbo converts YCCK to CMYK; the samples come out as the file holds them.
    std::vector<std::uint8_t> cmyk(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 4);
    if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), cmyk.data(), width, 0, height, TJPF_CMYK,
                      TJFLAG_STOPONWARNING) != 0)
      throw fail();
    vision::Image image = pil_cmyk_to_rgb(cmyk, height, width);
    if (mode == vision::ImageMode::gray) rgb_to_gray(image);  // PIL's CMYK to L is its CMYK to RGB, then RGB to L
    return image;
  }
  // A gray JPEG decodes to gray; a colour one to RGB (to gray after that, as PIL converts).
  const bool gray_source = colorspace == TJCS_GRAY;
  vision::Image image(height, width, gray_source ? 1 : 3);
  // Stop on warnings: libjpeg fills a truncated file's missing rows with grey and only warns.
  if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), image.pixels.data(), width, 0, height,
                    gray_source ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0)
    throw fail();
  if (mode == vision::ImageMode::rgb && gray_source) return gray_to_rgb(image);
  if (mode == vision::ImageMode::gray && !gray_source) rgb_to_gray(image);
  return image;
}
#endif

#if defined(DETTRIAL_HAS_SPNG)
inline vision::Image decode_png(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(0), spng_ctx_free);
  if (!ctx) throw ImageError("cannot decode '" + name + "': libspng could not start");
  const auto fail = [&](const char* what, int status) {
    return ImageError("cannot decode '" + name + "' as PNG: " + what + ": " + spng_strerror(status));
  };
  int status = spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_DISCARD);
  if (status == 0) status = spng_set_image_limits(ctx.get(), max_image_side, max_image_side);
  if (status == 0) status = spng_set_chunk_limits(ctx.get(), 1u << 26, 1u << 26);
  if (status == 0) status = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  if (status != 0) throw fail("setup", status);
  spng_ihdr header{};
  if ((status = spng_get_ihdr(ctx.get(), &header)) != 0) throw fail("header", status);
  check_size(header.width, header.height, name);
  // libspng's gray output takes gray sources of up to 8 bits; everything else decodes to RGB first.
  const bool gray_source = header.color_type == SPNG_COLOR_TYPE_GRAYSCALE || header.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA;
  const bool direct_gray = gray_source && header.bit_depth <= 8 && header.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
  const int format = direct_gray ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
  std::size_t size = 0;
  if ((status = spng_decoded_image_size(ctx.get(), format, &size)) != 0) throw fail("size", status);
  vision::Image image(header.height, header.width, direct_gray ? 1 : 3);
  if (size != image.pixels.size()) throw ImageError("cannot decode '" + name + "' as PNG: unexpected decoded size");
  if ((status = spng_decode_image(ctx.get(), image.pixels.data(), size, format, 0)) != 0) throw fail("pixels", status);
  // The chunks after the pixels, to IEND: a file cut short there is damaged too.
  if ((status = spng_decode_chunks(ctx.get())) != 0) throw fail("after the pixels", status);
  if (mode == vision::ImageMode::rgb && direct_gray) return gray_to_rgb(image);
  if (mode == vision::ImageMode::gray && !direct_gray) {
    if (gray_source) {  // gray with alpha or 16-bit gray: the gray sample, which RGB8 replicated
      const std::int64_t n = image.height * image.width;
      for (std::int64_t i = 0; i < n; ++i) image.pixels[i] = image.pixels[3 * i];
      image.pixels.resize(static_cast<std::size_t>(n));
      image.channels = 1;
    } else {
      rgb_to_gray(image);
    }
  }
  return image;
}
#endif

#if defined(DETTRIAL_HAS_WEBP)
/// libwebp's reasons, in words.
inline const char* webp_status(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "its data is damaged";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "it uses a feature libwebp does not support";
    case VP8_STATUS_SUSPENDED: return "decoding was suspended";
    case VP8_STATUS_USER_ABORT: return "decoding was aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "it ends early";
    default: return "libwebp refused it";
  }
}

inline vision::Image decode_webp(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name) {
  WebPBitstreamFeatures features{};
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status != VP8_STATUS_OK) throw ImageError("cannot decode '" + name + "' as WebP: " + webp_status(status));
  if (features.has_animation)
    throw ImageError("cannot decode '" + name + "': it is an animated WebP, and dettrial decodes still images only");
  check_size(features.width, features.height, name);
  // RGB straight from the decoder: alpha dropped, not composited, as PIL's convert("RGB").
  vision::Image image(features.height, features.width, 3);
  if (WebPDecodeRGBInto(bytes.data(), bytes.size(), image.pixels.data(), image.pixels.size(), static_cast<int>(image.width * 3)) == nullptr)
    throw ImageError("cannot decode '" + name + "' as WebP: its data is damaged or ends early");
  if (mode == vision::ImageMode::gray) rgb_to_gray(image);
  return image;
}
#endif

inline std::string leading_bytes(std::span<const std::uint8_t> bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 8; ++i) {
    if (i) out += ' ';
    out += hex[bytes[i] >> 4];
    out += hex[bytes[i] & 15];
  }
  return out.empty() ? "nothing: the file is empty" : out;
}

/// `window`, which must lie inside the `height` x `width` image `name`: a DataError says where it does not.
inline vision::PixelWindow checked_window(const vision::PixelWindow& w, std::int64_t height, std::int64_t width, const std::string& name) {
  if (w.top < 0 || w.left < 0 || w.height < 1 || w.width < 1 || w.top + w.height > height || w.left + w.width > width)
    throw DataError("a window of " + std::to_string(w.height) + "x" + std::to_string(w.width) + " at (" + std::to_string(w.top) + ", " +
                    std::to_string(w.left) + ") does not lie inside '" + name + "' (" + std::to_string(height) + "x" +
                    std::to_string(width) + ")");
  return w;
}

#if defined(DETTRIAL_HAS_LIBJPEG)
/// libjpeg's error manager, turned into exceptions: an error, and a warning too (libjpeg only warns
/// about a file cut short, filling the rest with grey), jumps back to the decoding function with
/// the message, which then throws (nothing with a destructor lives between the jump's two ends).
struct JpegErrors {
  jpeg_error_mgr manager{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {};

  static void fail(j_common_ptr info) {
    auto* self = reinterpret_cast<JpegErrors*>(info->err);
    (*info->err->format_message)(info, self->message);
    std::longjmp(self->jump, 1);
  }
  static void message_or_warning(j_common_ptr info, int level) {
    if (level < 0) fail(info);  // a warning; trace messages (level >= 0) are dropped
  }
};

/// Where `w` allows it, the largest DCT reduction (1/8, 1/4, 1/2) that keeps the window at least its
/// asked size: sets the decoder's scale and returns the window in the reduced image's pixels (its
/// edges rounded outwards, within the image).
inline vision::PixelWindow reduced_window(jpeg_decompress_struct& info, const vision::PixelWindow& w) {
  for (const unsigned denominator : {8u, 4u, 2u}) {
    const auto d = static_cast<std::int64_t>(denominator);
    if (w.height / d < w.at_least_height || w.width / d < w.at_least_width) continue;
    info.scale_num = 1;
    info.scale_denom = denominator;
    jpeg_calc_output_dimensions(&info);
    const std::int64_t top = w.top / d, left = w.left / d;
    const std::int64_t bottom = std::min<std::int64_t>(info.output_height, (w.top + w.height + d - 1) / d);
    const std::int64_t right = std::min<std::int64_t>(info.output_width, (w.left + w.width + d - 1) / d);
    return vision::PixelWindow{.top = top, .left = left, .height = bottom - top, .width = right - left};
  }
  return w;
}

/// The window of a JPEG through libjpeg's API: the rows above it skipped (entropy-decoded only), the
/// block columns around it decoded (and one more each side), the rows below never read. The decoder's settings are TurboJPEG's defaults
/// (islow DCT, fancy upsampling), so the pixels are decode_jpeg's.
inline vision::Image decode_jpeg_window(std::span<const std::uint8_t> bytes, vision::ImageMode mode, const std::string& name,
                                        vision::WindowChooser choose) {
  JpegErrors errors;
  jpeg_decompress_struct info{};
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = &JpegErrors::fail;
  errors.manager.emit_message = &JpegErrors::message_or_warning;
  // Creating checks that the library is the version of the jpeglib.h and jconfig.h this was compiled
  // with, and fails through error_exit: its jump target is set first (a libjpeg 8 jconfig.h beside
  // libjpeg 6.2's jpeglib.h crashed here on a machine that had both). Nothing is allocated yet.
  if (setjmp(errors.jump) != 0)
    throw ImageError("cannot decode '" + name + "' as JPEG: " + errors.message +
                     " (dettrial was compiled with another libjpeg's jpeglib.h or jconfig.h than the library it runs with)");
  jpeg_create_decompress(&info);
  const std::unique_ptr<jpeg_decompress_struct, void (*)(jpeg_decompress_struct*)> destroy(&info, jpeg_destroy_decompress);
  // Made before the jump target: nothing between setjmp and a longjmp may need destroying.
  std::vector<std::uint8_t> rows;
  vision::Image window;
  if (setjmp(errors.jump) != 0) throw ImageError("cannot decode '" + name + "' as JPEG: " + errors.message);
  jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  const std::int64_t height = info.image_height, width = info.image_width;
  check_size(width, height, name);
  const bool cmyk = info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK;
  const bool gray_source = info.jpeg_color_space == JCS_GRAYSCALE;
  info.out_color_space = cmyk ? JCS_CMYK : gray_source ? JCS_GRAYSCALE : JCS_RGB;
  vision::PixelWindow w = checked_window(choose(height, width), height, width, name);
  if (w.at_least_height > 0 && w.at_least_width > 0) w = reduced_window(info, w);
  jpeg_start_decompress(&info);
  // One block column more on each side than the window: fancy upsampling of subsampled chroma reads
  // its neighbours, and at the edge of a cropped scanline libjpeg-turbo has none (it repeats the
  // edge), so the window's outer pixels would differ from the whole decode's. jpeg_crop_scanline
  // then widens to whole blocks.
  const std::int64_t margin = static_cast<std::int64_t>(info.max_h_samp_factor) * DCTSIZE;
  const std::int64_t output_width = info.output_width;
  const std::int64_t from = std::max<std::int64_t>(0, w.left - margin), to = std::min(output_width, w.left + w.width + margin);
  auto first_column = static_cast<JDIMENSION>(from), columns = static_cast<JDIMENSION>(to - from);
  jpeg_crop_scanline(&info, &first_column, &columns);
  if (w.top > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(w.top));
  const std::int64_t channels = info.output_components, stride = static_cast<std::int64_t>(columns) * channels;
  const std::int64_t offset = (w.left - static_cast<std::int64_t>(first_column)) * channels;
  rows.resize(static_cast<std::size_t>(stride));
  window = vision::Image(w.height, w.width, channels);
  for (std::int64_t y = 0; y < w.height; ++y) {
    JSAMPROW row = rows.data();
    jpeg_read_scanlines(&info, &row, 1);
    std::memcpy(window.row(y), rows.data() + offset, static_cast<std::size_t>(w.width * channels));
  }
  jpeg_abort_decompress(&info);  // the rows below the window are not needed
  if (cmyk) {
    vision::Image rgb = pil_cmyk_to_rgb(window.pixels, window.height, window.width);
    if (mode == vision::ImageMode::gray) rgb_to_gray(rgb);
    return rgb;
  }
  if (mode == vision::ImageMode::rgb && gray_source) return gray_to_rgb(window);
  if (mode == vision::ImageMode::gray && !gray_source) rgb_to_gray(window);
  return window;
}
#endif

/// The bytes' format by their signature.
enum class ImageFormat { jpeg, png, webp, other };
inline ImageFormat format_of(std::span<const std::uint8_t> bytes) {
  static constexpr std::uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return ImageFormat::jpeg;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_signature, 8) == 0) return ImageFormat::png;
  if (bytes.size() >= 12 && std::memcmp(bytes.data(), "RIFF", 4) == 0 && std::memcmp(bytes.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::webp;
  return ImageFormat::other;
}

}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE Image decode_image(std::span<const std::uint8_t> bytes, [[maybe_unused]] ImageMode mode, const std::string& name) {
  const detail::ImageFormat format = detail::format_of(bytes);
  if (format == detail::ImageFormat::jpeg) {
#if defined(DETTRIAL_HAS_TURBOJPEG)
    return detail::decode_jpeg(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no JPEG decoder (libjpeg-turbo was not found when it was configured)");
#endif
  }
  if (format == detail::ImageFormat::png) {
#if defined(DETTRIAL_HAS_SPNG)
    return detail::decode_png(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no PNG decoder (libspng was not found when it was configured)");
#endif
  }
  if (format == detail::ImageFormat::webp) {
#if defined(DETTRIAL_HAS_WEBP)
    return detail::decode_webp(bytes, mode, name);
#else
    throw ImageError("cannot decode '" + name +
                     "': this build of dettrial has no WebP decoder (libwebp was not found when it was configured)");
#endif
  }
  throw ImageError("cannot decode '" + name + "': it is not JPEG, PNG or WebP (it begins with " + detail::leading_bytes(bytes) + ")");
}

DETTRIAL_INLINE void read_file(const std::filesystem::path& path, std::vector<std::uint8_t>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ImageError("cannot open '" + path.string() + "': " + std::strerror(errno));
  struct stat info{};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw ImageError("cannot read '" + path.string() + "': not a regular file");
  }
  buffer.resize(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < buffer.size()) {
    const ssize_t n = ::read(fd, buffer.data() + done, buffer.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      throw ImageError("cannot read '" + path.string() + "': " + (n == 0 ? std::string("it ended early") : std::strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

DETTRIAL_INLINE Image read_image(const std::filesystem::path& path, ImageMode mode) {
  thread_local std::vector<std::uint8_t> buffer;
  read_file(path, buffer);
  return decode_image(buffer, mode, path.string());
}

DETTRIAL_INLINE Image decode_image_window(std::span<const std::uint8_t> bytes, ImageMode mode, const std::string& name,
                                          WindowChooser choose) {
#if defined(DETTRIAL_HAS_LIBJPEG)
  if (detail::format_of(bytes) == detail::ImageFormat::jpeg) return detail::decode_jpeg_window(bytes, mode, name, choose);
#endif
  const Image image = decode_image(bytes, mode, name);
  const PixelWindow w = detail::checked_window(choose(image.height, image.width), image.height, image.width, name);
  return detail::crop(image, w.top, w.left, w.height, w.width);
}

DETTRIAL_INLINE Image read_image_window(const std::filesystem::path& path, ImageMode mode, WindowChooser choose) {
  thread_local std::vector<std::uint8_t> buffer;
  read_file(path, buffer);
  return decode_image_window(buffer, mode, path.string(), choose);
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
