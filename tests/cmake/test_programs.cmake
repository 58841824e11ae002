# What the unit-test programs of every build share (the plain build's unit.cmake and the sanitizer
# builds' sanitize.cmake): the Python their cases compare with, their common sources, and the
# Python fixture writers whose outputs they read.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).
set(DETTRIAL_PYTHON "" CACHE FILEPATH "A Python with the torch that matches this LibTorch, for the parity and
       checkpoint interop checks")

# The data files some tests read (the schema test's cases, the checkpoint an earlier dettrial wrote,
# the Python scripts) are read where they are: the checkout's path is compiled into source_dir.cpp
# alone, which includes no LibTorch, so that the other files hit the compiler cache in any checkout.
set_source_files_properties(unit/main.cpp unit/source_dir.cpp PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
set_source_files_properties(unit/source_dir.cpp PROPERTIES COMPILE_DEFINITIONS "DETTRIAL_TESTS_SOURCE_DIR=\"${CMAKE_CURRENT_SOURCE_DIR}\"")

# A Python script that writes what a program's cases compare with, run first as a CTest fixture
# named FIXTURE_SETUP (a line of its output must begin "ok: ", after any notes; exit 77 is skipped,
# with the reason) into the build folder, whose path goes to OUT_VARIABLE. Through
# tests/python/fixture_cache.py: with DETTRIAL_FIXTURE_CACHE, a folder the same script, Python and
# packages wrote before (another build's, an earlier run's) is linked, not written again. Without
# `python` nothing is registered: the cases find nothing there and skip themselves.
set(DETTRIAL_FIXTURE_CACHE "" CACHE PATH
    "A folder where the Python fixture writers' outputs are kept, keyed by all their inputs (empty: written each run)")
function(dettrial_python_fixture fixture_setup python script test_name out_variable)
  get_filename_component(_stem "${script}" NAME_WE)
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/${_stem}")
  if(python)
    add_test(NAME "${test_name}" COMMAND "${python}" "${CMAKE_CURRENT_SOURCE_DIR}/python/fixture_cache.py" "${DETTRIAL_FIXTURE_CACHE}"
                                         "${CMAKE_CURRENT_SOURCE_DIR}/python/${script}" "${_out}")
    set_tests_properties("${test_name}" PROPERTIES FIXTURES_SETUP ${fixture_setup} SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "(^|\n)ok: ")
  endif()
  set(${out_variable} "${_out}" PARENT_SCOPE)
endfunction()
