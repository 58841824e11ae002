# Moving runs between Determined and dettrial, against PyPI's `determined` itself (0.38):
# `ctest -R "^determined:"`. Included from tests/CMakeLists.txt (same scope).
#
# DETTRIAL_DETERMINED_PYTHON is a Python with `determined` and torch (scripts/test installs one);
# without it, or without the MNIST digits, the tests are reported skipped with the reason.
set(DETTRIAL_DETERMINED_PYTHON "" CACHE FILEPATH "A Python with PyPI's determined (and torch), for the determined: tests")

add_executable(determined_mnist determined/determined_mnist.cpp)
target_link_libraries(determined_mnist PRIVATE dettrial::compiled)
dettrial_use_compiled_pch(determined_mnist)

set(_determined "${CMAKE_CURRENT_SOURCE_DIR}/determined")
foreach(_case "from-determined;sgd;none;plain;a checkpoint Determined wrote continues in dettrial as in Determined (SGD with momentum)"
              "from-determined;adam;step;plain;a checkpoint Determined wrote continues in dettrial as in Determined (Adam, StepLR every batch)"
              "from-determined;sgd;multistep;plain;a checkpoint Determined wrote with MultiStepLR (milestones a Counter) continues in dettrial as in Determined"
              "from-determined;adamw;none;batchnorm;a checkpoint Determined wrote with AdamW and BatchNorm continues in dettrial as in Determined, and is refused into Adam"
              "to-determined;sgd;none;plain;a dettrial checkpoint continues in Determined as in dettrial (SGD with momentum)"
              "to-determined;adam;step;plain;a dettrial checkpoint continues in Determined as in dettrial (Adam, StepLR every batch)"
              "from-determined;adam;lambda;plain;a checkpoint Determined wrote with LambdaLR warmup and decay continues in dettrial as in Determined"
              "to-determined;adam;lambda;plain;a dettrial checkpoint with LambdaLR warmup and decay continues in Determined as in dettrial"
              "from-determined;sgd;onecycle;plain;a checkpoint Determined wrote with OneCycleLR (its rates and momenta in the optimizer's groups) continues in dettrial as in Determined"
              "to-determined;sgd;onecycle;plain;a dettrial checkpoint with OneCycleLR continues in Determined as in dettrial")
  list(GET _case 0 _direction)
  list(GET _case 1 _optimizer)
  list(GET _case 2 _scheduler)
  list(GET _case 3 _net)
  list(GET _case 4 _what)
  set(_name "determined: ${_what}")
  add_test(NAME "${_name}"
           COMMAND ${_needs_mnist} "${_determined}/continue.sh" "${_direction}" $<TARGET_FILE:determined_mnist>
                   "${DETTRIAL_DETERMINED_PYTHON}" "${_determined}/mnist.yaml" "${DETTRIAL_MNIST10K_DIR}"
                   "${CMAKE_CURRENT_BINARY_DIR}/runs/determined-${_direction}-${_optimizer}-${_scheduler}" "${_optimizer}" "${_scheduler}"
                   "${Torch_VERSION}" "${_net}")
  set_tests_properties("${_name}" PROPERTIES SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "the same records, learning rates and losses")
  # SGD's losses are bit-equal where this LibTorch is the release Determined's torch is (continue.sh
  # compares to 1e-6 relative otherwise, and says so). Adam's differ in the last bit from the second continued batch on:
  # LibTorch's C++ Adam updates its first moment as mul + add where Python's uses lerp (the state
  # carried over is the same: a wrong step count or moment would differ by orders of magnitude).
  if(_optimizer MATCHES "^adamw?$")
    set_tests_properties("${_name}" PROPERTIES ENVIRONMENT "DETTRIAL_LOSS_TOLERANCE=1e-6")
  endif()
endforeach()
