# Where the C++ standard library's symbols bind (PyPI's LibTorch exports a copy of some).
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# The C++ standard library's symbols bind to libstdc++, never to the copy a LibTorch wheel exports:
# the same std::filesystem calls linked through dettrial::dettrial, and as the control without
# dettrial's link order (the check must see the hazard there, or it proves nothing). Each is linked
# twice: with the toolchain as it is, and as a toolchain whose libstdc++ is a static archive only
# (a library folder holding libstdc++.a alone, searched first), where the hazard crashed programs.
foreach(_variant IN ITEMS dettrial control)
  add_library(stdlib_calls_${_variant} OBJECT stdlib/filesystem_calls.cpp)
  target_link_libraries(stdlib_calls_${_variant} PUBLIC dettrial::dettrial)
  dettrial_use_pch(stdlib_calls_${_variant})
  add_executable(stdlib_filesystem_${_variant} $<TARGET_OBJECTS:stdlib_calls_${_variant}>)
  target_link_libraries(stdlib_filesystem_${_variant} PRIVATE dettrial::dettrial)
  set_target_properties(stdlib_filesystem_${_variant} PROPERTIES LINKER_LANGUAGE CXX)
endforeach()
target_compile_definitions(stdlib_calls_dettrial PRIVATE DETTRIAL_STDLIB_CHECK_WITH_DETTRIAL)
set_target_properties(stdlib_filesystem_control PROPERTIES DETTRIAL_KEEP_LINK_ORDER ON)
set(_stdlib_dettrial "stdlib: a dettrial program's std:: symbols bind to libstdc++, not to LibTorch")
set(_stdlib_control "stdlib: control, without dettrial's link order they bind into LibTorch")
set(_stdlib_static_dettrial "stdlib: with a static-only libstdc++, a dettrial program carries its own std:: code")
set(_stdlib_static_control "stdlib: control, with a static-only libstdc++ and no link order they bind into LibTorch")
add_test(NAME "${_stdlib_dettrial}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/stdlib/bindings.sh" expect-none $<TARGET_FILE:stdlib_filesystem_dettrial>)
add_test(NAME "${_stdlib_control}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/stdlib/bindings.sh" expect-some $<TARGET_FILE:stdlib_filesystem_control>)
execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.a OUTPUT_VARIABLE _stdcxx_archive
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND IS_ABSOLUTE "${_stdcxx_archive}" AND EXISTS "${_stdcxx_archive}")
  set(_static_only "${CMAKE_CURRENT_BINARY_DIR}/stdlib-static-only")
  file(MAKE_DIRECTORY "${_static_only}")
  file(CREATE_LINK "${_stdcxx_archive}" "${_static_only}/libstdc++.a" SYMBOLIC)
  foreach(_variant IN ITEMS dettrial control)
    add_executable(stdlib_filesystem_static_${_variant} $<TARGET_OBJECTS:stdlib_calls_${_variant}>)
    target_link_libraries(stdlib_filesystem_static_${_variant} PRIVATE dettrial::dettrial)
    target_link_options(stdlib_filesystem_static_${_variant} PRIVATE "-L${_static_only}")
    set_target_properties(stdlib_filesystem_static_${_variant} PROPERTIES LINKER_LANGUAGE CXX)
  endforeach()
  set_target_properties(stdlib_filesystem_static_control PROPERTIES DETTRIAL_KEEP_LINK_ORDER ON)
  add_test(NAME "${_stdlib_static_dettrial}"
           COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/stdlib/bindings.sh" expect-none $<TARGET_FILE:stdlib_filesystem_static_dettrial>)
  add_test(NAME "${_stdlib_static_control}"
           COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/stdlib/bindings.sh" expect-some $<TARGET_FILE:stdlib_filesystem_static_control>)
else()
  dettrial_skipped_test("${_stdlib_static_dettrial}" "this compiler has no libstdc++.a (it is not GCC, or its static runtime is absent)")
  dettrial_skipped_test("${_stdlib_static_control}" "this compiler has no libstdc++.a (it is not GCC, or its static runtime is absent)")
endif()
set_tests_properties("${_stdlib_dettrial}" "${_stdlib_control}" "${_stdlib_static_dettrial}" "${_stdlib_static_control}"
                     PROPERTIES SKIP_RETURN_CODE 77)
