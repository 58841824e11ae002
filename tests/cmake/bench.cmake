# The benchmarks' quick mode: their claims, not their timings.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# The benchmarks' quick mode checks their claims, not their timings: the Trainer's losses and
# parameters bit-identical to a hand-written loop's (the MLP and the MNIST example network), and
# Python PyTorch (DETTRIAL_PYTHON, the torch matching this LibTorch) computing the same losses to 5
# decimals from the same weights, batches and generator state (both networks; the MNIST one when
# Fashion-MNIST is installed).
set(_gpu_bench_test "bench: gpu_bench trains each of its runs briefly on a GPU")
if(TARGET gpu_bench)
  add_test(NAME "${_gpu_bench_test}" COMMAND gpu_bench --quick)
  set_tests_properties("${_gpu_bench_test}" PROPERTIES SKIP_RETURN_CODE 77)
else()
  dettrial_skipped_test("${_gpu_bench_test}" "LibTorch is CPU-only: the GPU benchmark is built where LibTorch has CUDA")
endif()
if(TARGET trainer_bench)
  set(_parity "${CMAKE_CURRENT_BINARY_DIR}/parity")
  add_test(NAME "bench quick: Trainer bit-identical to a hand-written loop"
           COMMAND trainer_bench --quick --parity-dir "${_parity}")
  set_tests_properties("bench quick: Trainer bit-identical to a hand-written loop" PROPERTIES FIXTURES_SETUP dettrial_parity_data)
  # The end-to-end row (bench/e2e.sh) runs dettrial as a user's run does: at the default thread
  # count (every CPU it may use, as Python's side), never pinned to one thread.
  add_test(NAME "bench quick: the end-to-end MNIST row trains at the default thread count and says which"
           COMMAND ${_needs_fashion} "${CMAKE_CURRENT_SOURCE_DIR}/bench/default_threads.sh" $<TARGET_FILE:trainer_bench>)
  set_tests_properties("bench quick: the end-to-end MNIST row trains at the default thread count and says which" PROPERTIES
                       SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: the default threads")
  if(DETTRIAL_PYTHON)
    add_test(NAME "bench quick: Python PyTorch computes the same losses"
             COMMAND "${DETTRIAL_PYTHON}" "${PROJECT_SOURCE_DIR}/bench/parity.py" "${_parity}")
    set_tests_properties("bench quick: Python PyTorch computes the same losses" PROPERTIES FIXTURES_REQUIRED dettrial_parity_data)
  else()
    dettrial_skipped_test("bench quick: Python PyTorch computes the same losses"
                          "no Python with this LibTorch's torch given (-DDETTRIAL_PYTHON=...)")
  endif()
endif()
