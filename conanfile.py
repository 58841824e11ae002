"""Conan 2 recipe for dettrial, a header-only C++20 library."""
import os
import re

from conan import ConanFile
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import load


class DettrialConan(ConanFile):
    name = "dettrial"
    description = "Determined's trial API (PyTorchTrial) for LibTorch, composed at compile time"
    license = "Apache-2.0"
    topics = ("libtorch", "pytorch", "training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # Image files (<dettrial/vision.hpp>): JPEG through libjpeg-turbo, PNG through libspng, WebP through libwebp.
    options = {"with_images": [True, False], "with_mlflow": [True, False]}
    default_options = {"with_images": True, "with_mlflow": True}
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*", "single_include/*"
    no_copy_source = True
    generators = "CMakeDeps"

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "dettrial", "version.hpp"))
        self.version = re.search(r'#define DETTRIAL_VERSION_STRING "([^"]+)"', text).group(1)

    def requirements(self):
        # dettrial's headers include these, so consumers need their headers too.
        self.requires("libtorch/[>=1.13]", transitive_headers=True)
        self.requires("yaml-cpp/[>=0.7]", transitive_headers=True)
        self.requires("range-v3/[>=0.12]", transitive_headers=True)
        self.requires("nlohmann_json/[>=3.10]", transitive_headers=True)
        self.requires("zlib/[>=1.2]", transitive_headers=True)
        if self.options.with_images:
            self.requires("libjpeg-turbo/[>=2.1]", transitive_headers=True)
            self.requires("libspng/[>=0.7]", transitive_headers=True)
            self.requires("libwebp/[>=1.2]", transitive_headers=True)
        if self.options.with_mlflow:
            self.requires("libcurl/[>=7.68]", transitive_headers=True)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        toolchain = CMakeToolchain(self)
        toolchain.cache_variables["DETTRIAL_BUILD_TESTS"] = False
        toolchain.cache_variables["DETTRIAL_BUILD_EXAMPLES"] = False
        toolchain.cache_variables["DETTRIAL_IMAGE_CODECS"] = bool(self.options.with_images)
        toolchain.cache_variables["DETTRIAL_MLFLOW"] = bool(self.options.with_mlflow)
        toolchain.generate()

    def package(self):
        # CMake's install writes the headers and dettrialConfig.cmake (which finds the dependencies).
        cmake = CMake(self)
        cmake.configure()
        cmake.install()

    def package_id(self):
        self.info.clear()

    def package_info(self):
        # Consumers use the package's own dettrialConfig.cmake (target dettrial::dettrial).
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "dettrial")]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
