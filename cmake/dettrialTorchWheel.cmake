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
