# The single header, the examples, and the installed package as a consumer finds it.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# The single header: up to date with include/, and a whole trial builds and runs against it.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# The checks of the source tree read no build: the same for every LibTorch, so CI runs them in one
# build (-DDETTRIAL_SOURCE_CHECKS=OFF on the other, where they are registered skipped).
option(DETTRIAL_SOURCE_CHECKS "Run the checks of the source tree (format, layers, includes, links, ...)" ON)
function(dettrial_source_check name)
  if(DETTRIAL_SOURCE_CHECKS)
    add_test(NAME "${name}" COMMAND Python3::Interpreter ${ARGN})
    set_tests_properties("${name}" PROPERTIES SKIP_RETURN_CODE 77)
  else()
    dettrial_skipped_test("${name}" "the source checks run in another build (-DDETTRIAL_SOURCE_CHECKS=OFF here)")
  endif()
endfunction()
dettrial_source_check("single header is up to date" "${PROJECT_SOURCE_DIR}/tools/amalgamate.py" --check)
dettrial_source_check("layers: no header includes one from a folder above its own" "${PROJECT_SOURCE_DIR}/tools/check_layers.py")
dettrial_source_check("includes: each header includes the third-party headers it uses, and opens its namespaces one way"
                      "${PROJECT_SOURCE_DIR}/tools/check_includes.py")
dettrial_source_check("includes: the namespace rule refuses each way of breaking it" "${PROJECT_SOURCE_DIR}/tools/check_includes.py" --self-test)
dettrial_source_check("parse check: a file passes while it parses clean, and fails with the compiler's own first error"
                      "${PROJECT_SOURCE_DIR}/tools/compile_check_cache.py" --self-test "${CMAKE_CXX_COMPILER}")
dettrial_source_check("docs: every relative link and anchor in the markdown resolves, every docs/ page is linked"
                      "${PROJECT_SOURCE_DIR}/tools/check_links.py")
dettrial_source_check("functions: none in include/ is over 80 lines" "${PROJECT_SOURCE_DIR}/tools/check_function_lengths.py")
dettrial_source_check("format: every C++ file but single_include/ follows .clang-format" "${PROJECT_SOURCE_DIR}/tools/check_format.py")
dettrial_source_check("compiler launcher: a precompiled header is handed out only for the input files it was compiled from"
                      "${PROJECT_SOURCE_DIR}/tests/python/ccache_launcher.py" "${CMAKE_CXX_COMPILER}")
dettrial_source_check("fixture cache: a Python fixture folder is reused only for the same inputs, never a failed or skipped one"
                      "${PROJECT_SOURCE_DIR}/tests/python/fixture_cache.py" --self-test)
# The generated header is the same text for every LibTorch: CI builds it once (-DDETTRIAL_SINGLE_HEADER_TEST=OFF on the other).
option(DETTRIAL_SINGLE_HEADER_TEST "Build and run the MNIST example against single_include/" ON)
if(TARGET mnist AND NOT DETTRIAL_SINGLE_HEADER AND DETTRIAL_SINGLE_HEADER_TEST)
  add_executable(mnist_single_header "${PROJECT_SOURCE_DIR}/examples/mnist/main.cpp")
  target_include_directories(mnist_single_header BEFORE PRIVATE "${PROJECT_SOURCE_DIR}/single_include")
  target_link_libraries(mnist_single_header PRIVATE dettrial::dettrial)
  dettrial_use_pch(mnist_single_header)  # LibTorch's headers only: the single header is compiled whole
  add_test(NAME "single header: the MNIST trial runs"
           COMMAND ${_needs_fashion} $<TARGET_FILE:mnist_single_header>
                   --config "${PROJECT_SOURCE_DIR}/examples/mnist/const.yaml" --test-mode
                   --output "${CMAKE_CURRENT_BINARY_DIR}/runs/single-header")
  set_tests_properties("single header: the MNIST trial runs" PROPERTIES SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "\\[validation\\].*accuracy" FAIL_REGULAR_EXPRESSION "error:")
endif()

# The imperative trial of docs/trials.md builds, runs and learns.
if(TARGET regression)
  add_test(NAME "example: the imperative regression trial of docs/trials.md learns" COMMAND regression)
  set_tests_properties("example: the imperative regression trial of docs/trials.md learns" PROPERTIES WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
endif()

# Seed 004's train.py in local mode (const.yaml's hyperparameters, 100 batches) on the real digits,
# the last 2,000 held out: a main of one's own through dettrial::init, Trainer and fit.
if(TARGET mnist_trainer)
  add_test(NAME "example: seed 004's train.py trains locally (dettrial::init, Trainer, fit) on the real digits"
           COMMAND ${_needs_mnist} sh -c "rm -rf \"$2\" && exec \"$0\" --data \"$1\" --holdout 2000 --output \"$2\""
                   $<TARGET_FILE:mnist_trainer> "${DETTRIAL_MNIST10K_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-trainer-local")
  set_tests_properties("example: seed 004's train.py trains locally (dettrial::init, Trainer, fit) on the real digits" PROPERTIES
                       SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "validation accuracy 0\\.(8|9)[0-9]* after 100 batches")
endif()

# The consumer projects' CMake options: this build's LibTorch (Torch_DIR and Caffe2_DIR: Caffe2 would
# otherwise be found on the system first, whatever Torch_DIR says), flags and compiler launcher (a
# rebuild with nothing changed then compiles nothing again; what is linked and run is the same).
set(_consumer_options "-DTorch_DIR=${Torch_DIR}" "-DCaffe2_DIR=${Caffe2_DIR}" "-DCMAKE_BUILD_TYPE=Release"
                      "-DCMAKE_CXX_FLAGS_RELEASE=${CMAKE_CXX_FLAGS_RELEASE}")
if(CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND _consumer_options "-DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}")
endif()

# Packaging: install to a staging prefix, then build and run a separate project that finds it with
# find_package(dettrial CONFIG REQUIRED).
set(_stage "${CMAKE_CURRENT_BINARY_DIR}/package-stage")
add_test(NAME "package: install to a staging prefix"
         COMMAND "${CMAKE_COMMAND}" -E env "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}" --prefix "${_stage}")
set_tests_properties("package: install to a staging prefix" PROPERTIES FIXTURES_SETUP dettrial_installed)
# It links dettrial::compiled (the installed source compiled in the consumer), or, with
# -DDETTRIAL_CONSUMER_COMPILED=OFF, dettrial::dettrial: CI's second build links the header-only
# target (its add_subdirectory consumer links dettrial::compiled), which spares it compiling
# dettrial's non-template code a third time.
option(DETTRIAL_CONSUMER_COMPILED "The find_package consumer links dettrial::compiled (else dettrial::dettrial)" ON)
if(DETTRIAL_CONSUMER_COMPILED)
  set(_consumer_target dettrial::compiled)
else()
  set(_consumer_target dettrial::dettrial)
endif()
add_test(NAME "package: a find_package consumer builds and trains"
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${CMAKE_CURRENT_SOURCE_DIR}/consumer" "${CMAKE_CURRENT_BINARY_DIR}/consumer"
                 --build-generator "${CMAKE_GENERATOR}" --build-noclean
                 --build-options "-DCMAKE_PREFIX_PATH=${_stage}" "-DDETTRIAL_CONSUMER_TARGET=${_consumer_target}" ${_consumer_options}
                 --test-command consumer)
set_tests_properties("package: a find_package consumer builds and trains" PROPERTIES FIXTURES_REQUIRED dettrial_installed
                     FIXTURES_SETUP dettrial_consumer)
# docs/install.md's other two ways, as written: add_subdirectory (dettrial::compiled) and
# FetchContent from a clone of this repository at HEAD (dettrial::dettrial). The consumer finds no
# package itself, so LibTorch's and the other imported targets must reach it from dettrial's folder.
set(_subdirectory_options ${_consumer_options} "-DDETTRIAL_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
add_test(NAME "package: an add_subdirectory consumer that finds nothing itself builds and trains"
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${CMAKE_CURRENT_SOURCE_DIR}/subdirectory" "${CMAKE_CURRENT_BINARY_DIR}/subdirectory"
                 --build-generator "${CMAKE_GENERATOR}" --build-noclean
                 --build-options ${_subdirectory_options} -DDETTRIAL_CONSUMER_MODE=subdirectory
                 --test-command my_trial)
find_package(Git QUIET)
set(_fetch_test "package: a FetchContent consumer (a clone of this repository at HEAD) builds and trains")
if(GIT_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse HEAD WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                  OUTPUT_VARIABLE _head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _head_status)
endif()
# What it adds to the add_subdirectory consumer (a clone of the commit, fetched by CMake) is the
# same with any LibTorch: CI runs it in one build.
option(DETTRIAL_FETCHCONTENT_TEST "Build and run the FetchContent consumer" ON)
if(NOT DETTRIAL_FETCHCONTENT_TEST)
  dettrial_skipped_test("${_fetch_test}" "the FetchContent consumer is off in this build (-DDETTRIAL_FETCHCONTENT_TEST=OFF)")
elseif(_head AND _head_status EQUAL 0)
  add_test(NAME "${_fetch_test}"
           COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${CMAKE_CURRENT_SOURCE_DIR}/subdirectory" "${CMAKE_CURRENT_BINARY_DIR}/fetchcontent"
                   --build-generator "${CMAKE_GENERATOR}" --build-noclean
                   --build-options ${_subdirectory_options} -DDETTRIAL_CONSUMER_MODE=fetchcontent "-DDETTRIAL_GIT_TAG=${_head}"
                   --test-command my_trial)
else()
  dettrial_skipped_test("${_fetch_test}" "this source tree is not a git checkout (FetchContent clones one)")
endif()
# The installed package carries the link order: the consumer's std:: symbols bind to libstdc++.
add_test(NAME "package: the consumer's std:: symbols bind to libstdc++, not to LibTorch"
         COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/stdlib/bindings.sh" expect-none "${CMAKE_CURRENT_BINARY_DIR}/consumer/consumer")
set_tests_properties("package: the consumer's std:: symbols bind to libstdc++, not to LibTorch" PROPERTIES
                     FIXTURES_REQUIRED dettrial_consumer SKIP_RETURN_CODE 77)
