# LibTorch from a PyPI wheel finds its CUDA libraries (NCCL, cuBLAS, ...) in the sibling nvidia/
# packages at run time through its RPATH; the linker must look there too, or it resolves them against
# older system copies (a CUDA toolkit's NCCL) and fails on symbols only the wheel's versions have.
# Used by dettrial's own build and by its installed package config (paths are the consumer's).
function(dettrial_link_torch_wheel_cuda target)
  if(NOT TORCH_INSTALL_PREFIX)
    return()
  endif()
  file(GLOB _dirs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  foreach(_dir IN LISTS _dirs)
    target_link_options(${target} INTERFACE "LINKER:-rpath-link,${_dir}")
  endforeach()
endfunction()

# CUDA: when LibTorch is CUDA-built, DETTRIAL_HAS_CUDA turns on what needs its CUDA headers (the
# training step captured in a CUDA graph, streams for copies); without it those refuse at the start.
function(dettrial_enable_cuda target)
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    target_compile_definitions(${target} INTERFACE DETTRIAL_HAS_CUDA)
  endif()
endfunction()

# NCCL: LibTorch's ProcessGroupNCCL is compiled only with USE_C10D_NCCL, which a CUDA-built LibTorch
# does not export to its users. When this LibTorch has CUDA and nccl.h is found (the wheel's own
# nvidia/nccl first, then the CUDA toolkit's), dettrial's communicator gets its NCCL backend.
function(dettrial_enable_nccl target)
  if(NOT TARGET torch_cuda AND NOT TORCH_CUDA_LIBRARIES)
    return()
  endif()
  set(_hints)
  if(TORCH_INSTALL_PREFIX)
    list(APPEND _hints "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include")
  endif()
  find_path(DETTRIAL_NCCL_INCLUDE_DIR nccl.h HINTS ${_hints} PATHS /usr/local/cuda/include /usr/local/include /usr/include)
  if(NOT DETTRIAL_NCCL_INCLUDE_DIR)
    message(STATUS "dettrial: LibTorch has CUDA but nccl.h was not found; the NCCL backend is left out")
    return()
  endif()
  message(STATUS "dettrial: NCCL backend on (nccl.h in ${DETTRIAL_NCCL_INCLUDE_DIR})")
  target_compile_definitions(${target} INTERFACE DETTRIAL_HAS_NCCL USE_C10D_NCCL)
  target_include_directories(${target} SYSTEM INTERFACE "${DETTRIAL_NCCL_INCLUDE_DIR}")
endfunction()

# PyPI's torch wheels link parts of libstdc++ statically into libtorch_cpu.so and export them
# (std::filesystem among them; PyTorch issue 133437). The dynamic linker binds a program's symbol to
# the first library in its search order that defines it, and the compiler names libstdc++ after the
# user's libraries, so a program's std::filesystem calls would run the wheel's copy, built from
# another libstdc++ than the program's headers: it crashes in remove_all on some toolchains. So
# libstdc++ is named in the link libraries ahead of LibTorch (the caller links this before torch):
#  - where the toolchain's libstdc++ is shared, it becomes the program's first needed library, kept
#    under --as-needed, and every std:: symbol binds to the system's own libstdc++;
#  - where it is a static archive only (a compiler installed without its shared runtime, as on some
#    GPU images), the archive is searched after the program's objects and before LibTorch, so the
#    program carries the std:: code its own headers describe instead of resolving it to LibTorch.
#    Named among the link flags, before the objects, an archive would add nothing: that crashed.
# Harmless with LibTorch builds that export nothing of it (Debian's). A target opts out with the
# property DETTRIAL_KEEP_LINK_ORDER (for example when it links libc++).
function(dettrial_link_stdlib_first target)
  target_link_libraries(${target} INTERFACE
    "$<$<AND:$<PLATFORM_ID:Linux>,$<CXX_COMPILER_ID:GNU,Clang>,$<NOT:$<BOOL:$<TARGET_PROPERTY:DETTRIAL_KEEP_LINK_ORDER>>>>:-Wl$<COMMA>--push-state$<COMMA>--no-as-needed$<COMMA>-lstdc++$<COMMA>--pop-state>")
endfunction()
