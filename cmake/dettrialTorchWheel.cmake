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
