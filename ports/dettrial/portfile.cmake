# vcpkg overlay port for dettrial, built from this source tree:
#   vcpkg install dettrial --overlay-ports=<dettrial>/ports
# It installs what `cmake --install` installs (headers and share/cmake/dettrial), the contract the
# test suite's find_package consumer test proves.
get_filename_component(DETTRIAL_SOURCE "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_cmake_configure(
  SOURCE_PATH "${DETTRIAL_SOURCE}"
  OPTIONS
    -DDETTRIAL_BUILD_TESTS=OFF
    -DDETTRIAL_BUILD_EXAMPLES=OFF
    -DDETTRIAL_BUILD_BENCH=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/dettrial)

# Header-only: nothing in lib/ or debug/.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")
set(VCPKG_POLICY_EMPTY_PACKAGE enabled)
vcpkg_install_copyright(FILE_LIST "${DETTRIAL_SOURCE}/LICENSE")
