# dettrial's image decoders, optional like Gloo: libjpeg-turbo's TurboJPEG API for JPEG (and its
# libjpeg API for a crop's window), libspng for PNG and libwebp for WebP (all in Debian, Conan and
# vcpkg). Each one found is linked to `target` with DETTRIAL_HAS_TURBOJPEG, DETTRIAL_HAS_LIBJPEG,
# DETTRIAL_HAS_SPNG or DETTRIAL_HAS_WEBP (and DETTRIAL_DECODES_JPEG / _JPEG_WINDOW / _PNG / _WEBP set
# for the caller); without it dettrial still builds, says so here, and decoding that
# format is an ImageError naming what is missing.

# One decoder (`format` as the variables spell it, `name` as people do): the first of the package targets (ARGN) that the caller's find_package made, else its
# header and library found by name (Debian ships libspng and libwebp with only a pkg-config file),
# linked to `target` with DETTRIAL_HAS_<define>; DETTRIAL_DECODES_<format> is set for the caller of
# dettrial_find_image_codecs (a macro: it runs in that function's scope).
macro(_dettrial_link_image_codec target format name define header library what debian)
  set(_codec "")
  foreach(_candidate IN ITEMS ${ARGN})
    if(NOT _codec AND TARGET ${_candidate})
      set(_codec ${_candidate})
    endif()
  endforeach()
  if(NOT _codec)
    find_path(DETTRIAL_${define}_INCLUDE_DIR ${header})
    find_library(DETTRIAL_${define}_LIBRARY NAMES ${library})
    if(DETTRIAL_${define}_INCLUDE_DIR AND DETTRIAL_${define}_LIBRARY)
      set(_codec "${DETTRIAL_${define}_LIBRARY}")
      target_include_directories(${target} SYSTEM INTERFACE "${DETTRIAL_${define}_INCLUDE_DIR}")
    endif()
  endif()
  if(_codec)
    target_link_libraries(${target} INTERFACE ${_codec})
    target_compile_definitions(${target} INTERFACE DETTRIAL_HAS_${define})
    message(STATUS "dettrial: ${name} decoding on (${what})")
    set(DETTRIAL_DECODES_${format} TRUE PARENT_SCOPE)
  else()
    message(STATUS "dettrial: ${what} was not found: ${name} decoding is left out (Debian: ${debian})")
  endif()
endmacro()

function(dettrial_find_image_codecs target)
  # TurboJPEG: libjpeg-turbo's own CMake package (Debian, vcpkg), else the header and the library.
  find_package(libjpeg-turbo CONFIG QUIET)
  _dettrial_link_image_codec(${target} JPEG JPEG TURBOJPEG turbojpeg.h turbojpeg "libjpeg-turbo's TurboJPEG" libturbojpeg0-dev
                             libjpeg-turbo::turbojpeg libjpeg-turbo::turbojpeg-static)
  # Its libjpeg API, for decoding only a crop's window (jpeg_crop_scanline, jpeg_skip_scanlines).
  _dettrial_link_image_codec(${target} JPEG_WINDOW "cropped JPEG" LIBJPEG jpeglib.h jpeg "libjpeg-turbo's libjpeg API" libjpeg62-turbo-dev
                             libjpeg-turbo::jpeg libjpeg-turbo::jpeg-static)
  # jpeglib.h includes jconfig.h, which multiarch systems keep in include/<arch>, where the compiler
  # may find another libjpeg's first (libjpeg 8's, say, changing the structs' layout): the one for the
  # jpeglib.h found is named (DETTRIAL_LIBJPEG_CONFIG_DIR, which the tests read too) and, for a
  # header found by name, put on the include path.
  if(_codec)
    set(_jpeg_include "${DETTRIAL_LIBJPEG_INCLUDE_DIR}")
    if(TARGET ${_codec})
      get_target_property(_jpeg_include ${_codec} INTERFACE_INCLUDE_DIRECTORIES)
    endif()
    set(_jpeg_config_paths "")
    foreach(_dir IN LISTS _jpeg_include)
      list(APPEND _jpeg_config_paths "${_dir}/${CMAKE_LIBRARY_ARCHITECTURE}" "${_dir}")
    endforeach()
    find_path(DETTRIAL_LIBJPEG_CONFIG_DIR jconfig.h NO_DEFAULT_PATH PATHS ${_jpeg_config_paths})
    if(DETTRIAL_LIBJPEG_CONFIG_DIR AND NOT TARGET ${_codec})
      target_include_directories(${target} SYSTEM INTERFACE "${DETTRIAL_LIBJPEG_CONFIG_DIR}")
    endif()
  endif()
  # libspng: its CMake package (vcpkg: SPNG, Conan: spng).
  find_package(SPNG CONFIG QUIET)
  if(NOT TARGET spng::spng AND NOT TARGET spng::spng_static)
    find_package(spng CONFIG QUIET)
  endif()
  _dettrial_link_image_codec(${target} PNG PNG SPNG spng.h spng libspng libspng-dev spng::spng spng::spng_static)
  # libwebp: its CMake package (vcpkg and Conan: WebP).
  find_package(WebP CONFIG QUIET)
  _dettrial_link_image_codec(${target} WEBP WebP WEBP webp/decode.h webp libwebp libwebp-dev WebP::webp)
endfunction()
