# Running a test program's doctest cases in one process while CTest reports each case on its own
# (unit/shared_run.hpp says how): the program once as `<shared test>`, then each case's own test
# reporting its record, or running alone when it has none or failed there.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).
add_executable(dettrial_shared_run_case unit/shared_run_case.cpp)
target_compile_features(dettrial_shared_run_case PRIVATE cxx_std_20)
set_target_properties(dettrial_shared_run_case PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")

# dettrial_shared_run_tests(TARGET SHARED_TEST PREFIX [ENVIRONMENT ...] [PROPERTIES ...]): TARGET's
# cases as CTest tests named PREFIX<case>, after SHARED_TEST, each with the ENVIRONMENT and the test
# PROPERTIES given (both the shared run's and the cases').
function(dettrial_shared_run_tests target shared_test prefix)
  cmake_parse_arguments(PARSE_ARGV 3 _run "" "" "ENVIRONMENT;PROPERTIES")
  set(_dir "${CMAKE_CURRENT_BINARY_DIR}/shared-run/${target}")
  add_dependencies(${target} dettrial_shared_run_case)
  # A path, not $<TARGET_FILE>: CMake puts the emulator before every add_test command naming the
  # target, unevaluated.
  set_target_properties(${target} PROPERTIES CROSSCOMPILING_EMULATOR "${CMAKE_CURRENT_BINARY_DIR}/dettrial_shared_run_case;${_dir}")
  # Through shared_run_case, which passes however the program ends (the cases' own tests report).
  add_test(NAME "${shared_test}" COMMAND dettrial_shared_run_case "${_dir}" "$<TARGET_FILE:${target}>" "--dettrial-shared-run=${_dir}")
  set_tests_properties("${shared_test}" PROPERTIES ENVIRONMENT "${_run_ENVIRONMENT}" TIMEOUT 1800 ${_run_PROPERTIES})
  doctest_discover_tests(${target} TEST_PREFIX "${prefix}" PROPERTIES SKIP_RETURN_CODE 77 DEPENDS "${shared_test}"
                         ENVIRONMENT "${_run_ENVIRONMENT}" ${_run_PROPERTIES})
endfunction()
