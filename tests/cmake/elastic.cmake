# Elastic data parallel: a run resumed on another rank count keeps its global batches; a job that
# loses a rank is restarted from its checkpoint (the built-in launcher, --nproc MIN:MAX, torchrun's agent).
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).
add_executable(elastic_trial elastic/elastic_trial.cpp)
target_link_libraries(elastic_trial PRIVATE dettrial::compiled)
dettrial_use_compiled_pch(elastic_trial)
set(_elastic_tests "elastic: a run resumed on 1, 2 or 3 ranks trains the global batches of the rank count it began on"
                   "elastic: a rank killed mid-epoch is survived under the built-in launcher and --nproc MIN:MAX"
                   "elastic: torchrun's agent restarts a job that lost a rank or a node from its checkpoint")
if(_gloo_missing)
  foreach(_name IN LISTS _elastic_tests)
    dettrial_skipped_test("${_name}" "${_gloo_missing}")
  endforeach()
else()
  list(GET _elastic_tests 0 _name)
  add_test(NAME "${_name}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/elastic/rank_counts.sh" $<TARGET_FILE:elastic_trial>
                                   "${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic.yaml" "${CMAKE_CURRENT_BINARY_DIR}/elastic/rank-counts")
  set_tests_properties("${_name}" PROPERTIES PASS_REGULAR_EXPRESSION "ok: resumed on another rank count" TIMEOUT 600)
  list(GET _elastic_tests 1 _name)
  add_test(NAME "${_name}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/elastic/restarts.sh" $<TARGET_FILE:elastic_trial>
                                   "${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic.yaml" "${CMAKE_CURRENT_BINARY_DIR}/elastic/restarts")
  set_tests_properties("${_name}" PROPERTIES PASS_REGULAR_EXPRESSION "ok: a killed rank was survived" TIMEOUT 600)
  set(DETTRIAL_OTHER_TORCH_PYTHON "" CACHE FILEPATH
      "A Python whose torch is another release than this build's LibTorch: its torchrun must be refused with the reason")
  # torchrun from DETTRIAL_PYTHON's torch, the release this build's LibTorch comes from (the agent's
  # store speaks its own release's protocol); skipped with the reason when it cannot start a worker.
  list(GET _elastic_tests 2 _name)
  add_test(NAME "${_name}" COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/elastic/torchrun.sh" $<TARGET_FILE:elastic_trial>
                                   "${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic.yaml" "${CMAKE_CURRENT_BINARY_DIR}/elastic/torchrun"
                                   "${DETTRIAL_PYTHON}" "${DETTRIAL_OTHER_TORCH_PYTHON}")
  set_tests_properties("${_name}" PROPERTIES PASS_REGULAR_EXPRESSION "ok: torchrun's agent restarted" SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
# A Slurm job requeued mid-run (the test cluster of experiments.cmake; skipped when it does not answer).
add_test(NAME "slurm: a job requeued mid-run continues from its checkpoint with the uninterrupted job's global batches"
         COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/elastic/slurm_requeue.sh" $<TARGET_FILE:elastic_trial>
                 "${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic.yaml" "${CMAKE_CURRENT_BINARY_DIR}/elastic/slurm-requeue")
set_tests_properties("slurm: a job requeued mid-run continues from its checkpoint with the uninterrupted job's global batches" PROPERTIES
                     FIXTURES_REQUIRED dettrial_slurm SKIP_RETURN_CODE 77 RESOURCE_LOCK dettrial_slurm_cpus
                     ENVIRONMENT "SLURM_CONF=${_slurm_dir}/slurm.conf" PASS_REGULAR_EXPRESSION "ok: a Slurm job requeued")
