# What the compiler must accept and refuse: the concepts, and the one-sentence diagnostics.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# Concepts checked at compile time: building this library is the test. Its static_asserts stand at
# namespace scope, decided as the file is parsed: a parse check.
add_library(dettrial_static_checks OBJECT static/concepts_test.cpp)
target_link_libraries(dettrial_static_checks PRIVATE dettrial::dettrial)
dettrial_use_pch(dettrial_static_checks)
dettrial_parse_check(dettrial_static_checks)

# Compile-fail tests: each bad trial must fail to build with its one-sentence diagnostic (the
# first line of the file, after "EXPECT: "). One step builds them all, two at a time, and keeps each
# target's compiler output (tests/compile_fail/build_all.py); each test then matches its own output.
option(DETTRIAL_COMPILE_FAIL_TESTS "Run the compile-fail tests (each builds one bad trial)" ON)
if(DETTRIAL_COMPILE_FAIL_TESTS)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  set(_compile_fail_logs "${CMAKE_CURRENT_BINARY_DIR}/compile_fail_logs")
  set(_compile_fail_targets "")
  function(dettrial_compile_fail name target source expected)
    add_executable(${target} EXCLUDE_FROM_ALL "${source}")
    target_link_libraries(${target} PRIVATE dettrial::dettrial)
    # The sentence must be the first error; stopping there also spares the cascade after it.
    target_compile_options(${target} PRIVATE -fmax-errors=1)
    # The sentences come from templates, the same in either linkage mode: separate compilation,
    # with <dettrial/dettrial.hpp> precompiled, leaves each case its own few lines to parse (13 s
    # to a few a case). The src.hpp cases test the linkage modes themselves and choose their own.
    if(name MATCHES "^src_")
      dettrial_use_pch(${target})
    else()
      target_compile_definitions(${target} PRIVATE DETTRIAL_SEPARATE_COMPILATION)
      dettrial_use_compiled_pch(${target})
    endif()
    add_test(NAME "compile-fail: ${name}" COMMAND "${CMAKE_COMMAND}" -E cat "${_compile_fail_logs}/${target}.log")
    set_tests_properties("compile-fail: ${name}" PROPERTIES PASS_REGULAR_EXPRESSION "${expected}"
                         FIXTURES_REQUIRED dettrial_compile_fail_logs)
    set(_compile_fail_targets ${_compile_fail_targets} ${target} PARENT_SCOPE)
  endfunction()
  file(GLOB _compile_fail_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cpp")
  foreach(_source IN LISTS _compile_fail_sources)
    get_filename_component(_name "${_source}" NAME_WE)
    file(STRINGS "${_source}" _first LIMIT_COUNT 1)
    string(REGEX REPLACE "^// EXPECT: " "" _expected "${_first}")
    dettrial_compile_fail("${_name}" compile_fail_${_name} "${_source}" "${_expected}")
  endforeach()
  # Every hook of the callback table (vocabulary/callbacks.hpp), declared with a parameter the trainer
  # never passes: one sentence naming that hook. One translation unit holds all fourteen cases (each
  # static_assert is reported on its own); each hook's test finds its sentence in that output.
  # (state_dict and on_training_workload_end have sentences of their own, with tests above.)
  set(_hooks_target compile_fail_callback_hooks)
  add_executable(${_hooks_target} EXCLUDE_FROM_ALL "${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/hooks/mistyped_hooks.cpp")
  target_link_libraries(${_hooks_target} PRIVATE dettrial::dettrial)
  target_compile_definitions(${_hooks_target} PRIVATE DETTRIAL_SEPARATE_COMPILATION)
  dettrial_use_compiled_pch(${_hooks_target})
  list(APPEND _compile_fail_targets ${_hooks_target})
  foreach(_hook IN ITEMS on_trial_startup on_trial_shutdown on_training_start on_training_epoch_start on_training_epoch_end
                         on_validation_start on_validation_epoch_start on_validation_epoch_end on_validation_end
                         on_checkpoint_save_start on_checkpoint_write_end on_checkpoint_upload_end on_checkpoint_load_start
                         load_state_dict)
    add_test(NAME "compile-fail: callback hook ${_hook} mistyped"
             COMMAND "${CMAKE_COMMAND}" -E cat "${_compile_fail_logs}/${_hooks_target}.log")
    set_tests_properties("compile-fail: callback hook ${_hook} mistyped" PROPERTIES
                         PASS_REGULAR_EXPRESSION "${_hook} is declared but cannot be called as ${_hook}\\("
                         FIXTURES_REQUIRED dettrial_compile_fail_logs)
  endforeach()
  add_test(NAME "compile-fail: build every case"
           COMMAND Python3::Interpreter "${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/build_all.py" "${CMAKE_BINARY_DIR}"
                   "${_compile_fail_logs}" ${_compile_fail_targets})
  # Alone: two compilers beside the timing-sensitive process tests (signals, launchers) would make
  # those flaky on a 2-core machine.
  set_tests_properties("compile-fail: build every case" PROPERTIES FIXTURES_SETUP dettrial_compile_fail_logs RUN_SERIAL ON)
endif()
