# The sanitizer builds' tests (DETTRIAL_SANITIZE; docs/testing.md, "Sanitizer builds"): the unit
# tests of the code that reads outside input or runs threads, compiled with the sanitizers, their
# cases in one process each program as in the plain build (shared_run.cmake). A report fails the
# test it appears in: the shared run's, when it comes at the program's exit (a leak), or a case's.
# Included from tests/CMakeLists.txt in place of the other kinds of test.
set(_suppressions "${CMAKE_CURRENT_SOURCE_DIR}/sanitize")
if(DETTRIAL_SANITIZE STREQUAL "thread")
  set(_name tsan)
  # The code that runs threads: the loader's workers and prefetch (data), the background checkpoint
  # writer and its pacing (checkpoint), the copy-ahead (step_capture), the MLflow sender and the
  # system-metrics sampler (observability).
  set(_files data_test checkpoint_test step_capture_test observability_test)
  # LibTorch's intra-op pool (OpenMP's, uninstrumented: its hand-offs are invisible to TSan) not
  # started: LibTorch's operators run on the thread that calls them, dettrial's threads are all
  # there are, and each of their hand-offs is one TSan sees. second_deadlock_stack: both stacks of
  # a lock-order report.
  set(_options "TSAN_OPTIONS=suppressions=${_suppressions}/tsan.supp:second_deadlock_stack=1:halt_on_error=0:print_suppressions=0"
               "OMP_NUM_THREADS=1")
  set(_report "WARNING: ThreadSanitizer|ThreadSanitizer: reported")
else()
  set(_name asan)
  # The readers of outside input: checkpoints (python_state: the pickle machine and the zip
  # container; checkpoint: dettrial's and Determined's folders), IDX and the data pipeline (data),
  # configs and search spaces (config, config_schema, search), metrics.jsonl, events.jsonl and
  # TensorBoard's files (observability), safetensors (huggingface), token files (token_file), and the image decoders (vision, below).
  set(_files python_state_test checkpoint_test data_test config_test config_schema_test search_test observability_test huggingface_test token_file_test)
  set(_options "ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:halt_on_error=1"
               "LSAN_OPTIONS=suppressions=${_suppressions}/lsan.supp:print_suppressions=0"
               "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${_suppressions}/ubsan.supp")
  set(_report "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: UndefinedBehaviorSanitizer")
endif()
set(_program dettrial_${_name}_tests)
list(TRANSFORM _files PREPEND "unit/")
list(TRANSFORM _files APPEND ".cpp")
add_executable(${_program} unit/main.cpp unit/source_dir.cpp ${_files})
target_include_directories(${_program} PRIVATE "${PROJECT_SOURCE_DIR}/examples/gpt")  # huggingface_test's GPT-2 cases
target_link_libraries(${_program} PRIVATE dettrial::compiled doctest::doctest)
target_compile_definitions(${_program} PRIVATE DETTRIAL_MNIST10K_DIR="${DETTRIAL_MNIST10K_DIR}")
dettrial_use_compiled_pch(${_program})
dettrial_shared_run_tests(${_program} "${_name}:every case in one process" "${_name}: "
                          ENVIRONMENT "DETTRIAL_TEST_PYTHON=${DETTRIAL_PYTHON}" ${_options}
                          PROPERTIES FAIL_REGULAR_EXPRESSION "${_report}")

# The image decoders (ASan and UBSan): the vision cases over the files PIL wrote and its pixels.
if(_name STREQUAL "asan")
  add_executable(dettrial_asan_vision_tests unit/main.cpp unit/vision_test.cpp)
  target_link_libraries(dettrial_asan_vision_tests PRIVATE dettrial::compiled doctest::doctest)
  dettrial_use_compiled_pch(dettrial_asan_vision_tests)
  dettrial_python_fixture(dettrial_asan_vision_tests "${DETTRIAL_PYTHON}" vision_fixtures.py
                          "asan: vision: PIL and torchvision write the image fixtures" _fixtures)
  dettrial_shared_run_tests(dettrial_asan_vision_tests "asan: vision: every case in one process" "asan: "
                            ENVIRONMENT "DETTRIAL_VISION_FIXTURES=${_fixtures}" ${_options}
                            PROPERTIES FAIL_REGULAR_EXPRESSION "${_report}" FIXTURES_REQUIRED dettrial_asan_vision_tests)
endif()

# The canary: each defect this build is there to catch, made on purpose (sanitize/canary.cpp); each
# test passes only when its sanitizer's report is in the output, so a build that stopped reporting
# (its flags, runtime or options) fails here instead of passing every case.
add_executable(dettrial_sanitizer_canary sanitize/canary.cpp)
target_compile_features(dettrial_sanitizer_canary PRIVATE cxx_std_20)
target_link_libraries(dettrial_sanitizer_canary PRIVATE Threads::Threads)
if(_name STREQUAL "tsan")
  set(_canaries "data-race=WARNING: ThreadSanitizer: data race")
else()
  set(_canaries "heap-overflow=ERROR: AddressSanitizer: heap-buffer-overflow" "use-after-free=ERROR: AddressSanitizer: heap-use-after-free"
                "leak=ERROR: LeakSanitizer: detected memory leaks" "signed-overflow=runtime error: signed integer overflow")
endif()
foreach(_canary IN LISTS _canaries)
  string(REGEX MATCH "^[^=]+" _defect "${_canary}")
  string(REGEX REPLACE "^[^=]+=" "" _expected "${_canary}")
  add_test(NAME "${_name}: the build reports a ${_defect} (canary)" COMMAND dettrial_sanitizer_canary ${_defect})
  set_tests_properties("${_name}: the build reports a ${_defect} (canary)" PROPERTIES ENVIRONMENT "${_options}" PASS_REGULAR_EXPRESSION "${_expected}")
endforeach()
