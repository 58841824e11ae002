# The example programs' command line, end to end.
# Included from tests/CMakeLists.txt (same scope: its variables and helpers are in reach).

# The example program's command line: bad input exits 1 with one message naming the problem.
if(TARGET mnist)
  set(_cli "${CMAKE_CURRENT_SOURCE_DIR}/cli")
  set(_expect "${_cli}/expect_error.sh")
  # A wrong configuration exits 78 (an experiment does not retry it); other failures exit 1.
  function(dettrial_cli_error name status regex)
    add_test(NAME "cli: ${name}" COMMAND "${_expect}" "${status}" "${regex}" $<TARGET_FILE:mnist> ${ARGN})
  endfunction()
  dettrial_cli_error("missing config file" 78 "cannot read experiment config '.*nope.yaml': no such file"
                     --config "${_cli}/nope.yaml")
  dettrial_cli_error("YAML syntax error" 78 "broken_syntax.yaml:3:[0-9]+: YAML syntax error"
                     --config "${_cli}/broken_syntax.yaml")
  dettrial_cli_error("missing hyperparameter" 78 "hyperparameter 'n_filters2' is missing from .*missing_hparam.yaml"
                     --config "${_cli}/missing_hparam.yaml")
  dettrial_cli_error("wrongly typed hyperparameter" 78 "wrong_type.yaml:2:18: hyperparameter 'learning_rate' is 'fast', which is not a number"
                     --config "${_cli}/wrong_type.yaml")
  dettrial_cli_error("zero max_length" 78 "max_length is 0 batches" --config "${_cli}/zero_length.yaml")
  dettrial_cli_error("missing max_length" 78 "sets no training length" --config "${_cli}/no_length.yaml")
  dettrial_cli_error("missing data file" 1 "no MNIST images file for split 'train' in '/nonexistent/mnist'"
                     --config "${_cli}/missing_data.yaml")
  dettrial_cli_error("bad --set" 78 "--set needs KEY=VALUE" --config "${_cli}/zero_length.yaml" --set nonsense)
  dettrial_cli_error("--set with a YAML syntax error" 78 "--set hyperparameters.learning_rate's value:1:[0-9]+: YAML syntax error"
                     --config "${_cli}/zero_length.yaml" --set "hyperparameters.learning_rate=[0.1,")
  # SIGTERM: checkpoint and exit 75; --resume continues from that batch.
  add_test(NAME "cli: SIGTERM checkpoints and exits 75; --resume continues"
           COMMAND ${_needs_mnist} "${_cli}/signal_resume.sh" $<TARGET_FILE:mnist> "${_cli}/resume.yaml" "${DETTRIAL_MNIST10K_DIR}"
                   "${CMAKE_CURRENT_BINARY_DIR}/runs/signal-resume")
  set_tests_properties("cli: SIGTERM checkpoints and exits 75; --resume continues" PROPERTIES SKIP_RETURN_CODE 77)
  # One process per run folder: a second one (--resume, the same --output, a second search runner)
  # is refused naming the holder; a SIGKILLed holder leaves no lock behind.
  add_test(NAME "cli: a second process in a live run or experiment folder is refused naming the holder's pid and host"
           COMMAND ${_needs_mnist} "${_cli}/run_lock.sh" $<TARGET_FILE:mnist> "${_cli}/resume.yaml"
                   "${PROJECT_SOURCE_DIR}/examples/mnist/random.yaml" "${DETTRIAL_MNIST10K_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/runs/run-lock")
  set_tests_properties("cli: a second process in a live run or experiment folder is refused naming the holder's pid and host"
                       PROPERTIES SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: a second process is refused")
  # The image example on real image files: a stop mid-epoch and --resume give the straight run's metrics.
  foreach(_format png jpeg)
    string(TOUPPER "${_format}" _upper)
    set(_name "cli: the image example on ${_format} files resumes mid-epoch exactly, augmentation included")
    if(DETTRIAL_DECODES_${_upper})
      add_test(NAME "${_name}" COMMAND ${_needs_image_folders} "${_cli}/image_resume.sh" $<TARGET_FILE:image_folder>
                                       "${_cli}/image_folder_${_format}.yaml" "${DETTRIAL_IMAGE_FOLDER_DIR}"
                                       "${CMAKE_CURRENT_BINARY_DIR}/runs/image-${_format}")
      set_tests_properties("${_name}" PROPERTIES SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "records after batch 6 equal")
    else()
      dettrial_skipped_test("${_name}" "this build has no ${_upper} decoder (libjpeg-turbo's TurboJPEG, libspng)")
    endif()
  endforeach()
  # The porting guide's ImageNet trial on an ImageNet-shaped folder (CMYK JPEGs and a PNG named .JPEG
  # among the files): a stop mid-epoch and --resume give the straight run's metrics; a torchvision
  # ResNet-50 state dict saved by Python warm-starts it.
  set(_imagenet_folder "${CMAKE_CURRENT_BINARY_DIR}/imagenet-folder")
  set(_imagenet_resume "imagenet example: the guide's trial on an ImageNet-shaped folder resumes mid-epoch exactly, CMYK files included")
  set(_imagenet_recipe
      "imagenet example: TrivialAugmentWide, RandomErasing, MixUp or CutMix, label smoothing and reduced_decode resume mid-epoch exactly")
  set(_imagenet_bad_data "imagenet example: a data value of the wrong type is named (data.reduced_decode: maybe)")
  set(_imagenet_pretrained "imagenet example: a torchvision ResNet-50 state dict saved by Python warm-starts the guide's trial")
  set(_imagenet_lr "imagenet example: the guide's trial decays its learning rate after the epochs Python's StepLR does")
  set(_imagenet_seed "imagenet example: the porting guide's const.yaml, verbatim, runs (pretrained from torch.hub's cache, records_per_epoch not used, smaller_is_better warned)")
  if(DETTRIAL_DECODES_JPEG AND DETTRIAL_DECODES_PNG AND DETTRIAL_PYTHON)
    add_test(NAME "imagenet example: an ImageNet-shaped folder is written from Fashion-MNIST"
             COMMAND ${_needs_fashion} "${DETTRIAL_PYTHON}" "${PROJECT_SOURCE_DIR}/scripts/lib/imagenet_folder.py"
                     /usr/share/datasets/fashion-mnist "${_imagenet_folder}" 8 4)
    set_tests_properties("imagenet example: an ImageNet-shaped folder is written from Fashion-MNIST" PROPERTIES
                         FIXTURES_SETUP dettrial_imagenet_folder SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "(^|\n)ok: ")
    add_test(NAME "${_imagenet_resume}" COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" --
                                                "${_cli}/image_resume.sh" $<TARGET_FILE:imagenet> "${_cli}/imagenet.yaml" "${_imagenet_folder}"
                                                "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet")
    set_tests_properties("${_imagenet_resume}" PROPERTIES FIXTURES_REQUIRED dettrial_imagenet_folder SKIP_RETURN_CODE 77
                                                          PASS_REGULAR_EXPRESSION "records after batch 6 equal")
    # torchvision's reference recipe on top: TrivialAugmentWide, RandomErasing, MixUp or CutMix per
    # batch and label smoothing, every draw keyed so that the resumed run is the straight one.
    add_test(NAME "${_imagenet_recipe}" COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" --
                                                "${_cli}/image_resume.sh" $<TARGET_FILE:imagenet> "${_cli}/imagenet.yaml" "${_imagenet_folder}"
                                                "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet-recipe" --set hyperparameters.auto_augment=ta_wide
                                                --set hyperparameters.random_erase=0.25 --set hyperparameters.mixup_alpha=0.2
                                                --set hyperparameters.cutmix_alpha=1.0 --set hyperparameters.label_smoothing=0.1
                                                --set data.reduced_decode=true)
    set_tests_properties("${_imagenet_recipe}" PROPERTIES FIXTURES_REQUIRED dettrial_imagenet_folder SKIP_RETURN_CODE 77
                                                          PASS_REGULAR_EXPRESSION "records after batch 6 equal")
    add_test(NAME "${_imagenet_bad_data}"
             COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" -- "${CMAKE_COMMAND}" -E env
                     "DETTRIAL_IMAGE_FOLDER=${_imagenet_folder}" $<TARGET_FILE:imagenet> --config "${_cli}/imagenet.yaml" --set
                     data.reduced_decode=maybe --output "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet-bad-data")
    set_tests_properties("${_imagenet_bad_data}" PROPERTIES FIXTURES_REQUIRED dettrial_imagenet_folder SKIP_RETURN_CODE 77
                                                            PASS_REGULAR_EXPRESSION "error: data.reduced_decode: 'maybe' is not true or false")
    add_test(NAME "${_imagenet_pretrained}"
             COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" -- "${_requires}"
                     "${CMAKE_CURRENT_BINARY_DIR}/torchvision_resnets/resnet50.pt" "torchvision's ResNet-50 (tests/python/torchvision_resnets.py)" --
                     "${_cli}/imagenet_pretrained.sh" $<TARGET_FILE:imagenet> "${_cli}/imagenet.yaml" "${_imagenet_folder}"
                     "${CMAKE_CURRENT_BINARY_DIR}/torchvision_resnets/resnet50.pt" "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet-pretrained")
    set_tests_properties("${_imagenet_pretrained}" PROPERTIES FIXTURES_REQUIRED "dettrial_imagenet_folder;dettrial_model_tests"
                                                              SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: warm-started")
    add_test(NAME "${_imagenet_lr}" COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" --
                                            "${_cli}/imagenet_lr.sh" $<TARGET_FILE:imagenet> "${_cli}/imagenet.yaml" "${_imagenet_folder}"
                                            "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet-lr" "${DETTRIAL_PYTHON}")
    set_tests_properties("${_imagenet_lr}" PROPERTIES FIXTURES_REQUIRED dettrial_imagenet_folder SKIP_RETURN_CODE 77
                                                      PASS_REGULAR_EXPRESSION "ok: the learning rates after 1, 2 and 3 epochs")
    add_test(NAME "${_imagenet_seed}"
             COMMAND "${_requires}" "${_imagenet_folder}/complete" "the ImageNet-shaped folder" -- "${_requires}"
                     "${CMAKE_CURRENT_BINARY_DIR}/torchvision_resnets/resnet18.pt" "torchvision's ResNet-18 (tests/python/torchvision_resnets.py)" --
                     "${_cli}/imagenet_seed_config.sh" $<TARGET_FILE:imagenet> "${_cli}/seed_imagenet_const.yaml" "${_imagenet_folder}"
                     "${CMAKE_CURRENT_BINARY_DIR}/torchvision_resnets/resnet18.pt" "${CMAKE_CURRENT_BINARY_DIR}/runs/imagenet-seed")
    set_tests_properties("${_imagenet_seed}" PROPERTIES FIXTURES_REQUIRED "dettrial_imagenet_folder;dettrial_model_tests"
                                                        SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: the guide's const.yaml ran as written")
  else()
    dettrial_skipped_test("${_imagenet_resume}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
    dettrial_skipped_test("${_imagenet_recipe}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
    dettrial_skipped_test("${_imagenet_bad_data}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
    dettrial_skipped_test("${_imagenet_pretrained}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
    dettrial_skipped_test("${_imagenet_lr}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
    dettrial_skipped_test("${_imagenet_seed}" "this build has no JPEG or PNG decoder, or no Python to write the folder")
  endif()
  set(_slurm_tests "slurm: srun (on one node and on two) and sbatch run the 2-rank MNIST job as the built-in launcher does; a failed task ends the step")
  if(_gloo_missing)
    dettrial_skipped_test("${_slurm_tests}" "${_gloo_missing}")
  else()
    add_test(NAME "${_slurm_tests}"
             COMMAND ${_needs_mnist} "${CMAKE_CURRENT_SOURCE_DIR}/slurm/srun_ddp.sh" $<TARGET_FILE:mnist> "${_cli}/ddp.yaml"
                     "${DETTRIAL_MNIST10K_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/runs/slurm-ddp")
    set_tests_properties("${_slurm_tests}" PROPERTIES FIXTURES_REQUIRED dettrial_slurm SKIP_RETURN_CODE 77
                         ENVIRONMENT "SLURM_CONF=${_slurm_dir}/slurm.conf" RESOURCE_LOCK dettrial_slurm_cpus
                         PASS_REGULAR_EXPRESSION "ok: srun \\(one node and two\\) and sbatch jobs train as the built-in launcher does")
  endif()
  # TensorBoard files, the profiler's trace and a resume, read back by Python's TensorBoard reader.
  set(DETTRIAL_TENSORBOARD_PYTHON "" CACHE FILEPATH "A Python with PyPI's tensorboard, whose reader checks the event files")
  set(_observability "cli: TensorBoard's reader returns a resumed MNIST run's metrics exactly; the profiler's trace names its operators")
  if(DETTRIAL_TENSORBOARD_PYTHON)
    add_test(NAME "${_observability}"
             COMMAND ${_needs_mnist} "${_cli}/observability.sh" $<TARGET_FILE:mnist> "${DETTRIAL_MNIST10K_DIR}"
                     "${CMAKE_CURRENT_BINARY_DIR}/runs/observability" "${DETTRIAL_TENSORBOARD_PYTHON}")
    set_tests_properties("${_observability}" PROPERTIES SKIP_RETURN_CODE 77 FIXTURES_SETUP dettrial_observability_run
                         PASS_REGULAR_EXPRESSION "ok: TensorBoard files, hparams and trace of a resumed run")
    add_test(NAME "report: the MNIST run's page renders in headless Chromium"
             COMMAND ${_needs_mnist} "${CMAKE_CURRENT_SOURCE_DIR}/report/render_report.sh" "${CMAKE_CURRENT_BINARY_DIR}/runs/observability/report.html"
                     loss accuracy learning_rates seconds)
    set_tests_properties("report: the MNIST run's page renders in headless Chromium" PROPERTIES
                         FIXTURES_REQUIRED dettrial_observability_run SKIP_RETURN_CODE 77)
  else()
    dettrial_skipped_test("${_observability}" "no Python with the tensorboard package given (-DDETTRIAL_TENSORBOARD_PYTHON=...)")
  endif()
  # MLflow: a real server (PyPI's mlflow), read back over its REST API.
  set(DETTRIAL_MLFLOW_PYTHON "" CACHE FILEPATH "A Python with PyPI's mlflow, whose server the MLflow tests track runs in")
  set(_mlflow "mlflow: a run, its resume, two ranks and a search appear in a real MLflow server; a dead server loses no metrics")
  # The tracking client (libcurl, JSON) is the same code with any LibTorch: CI runs it in one build.
  option(DETTRIAL_MLFLOW_TESTS "Run the MLflow server test" ON)
  if(NOT DETTRIAL_MLFLOW_TESTS)
    dettrial_skipped_test("${_mlflow}" "MLflow tests are off in this build (-DDETTRIAL_MLFLOW_TESTS=OFF)")
  elseif(DETTRIAL_MLFLOW_PYTHON AND DETTRIAL_TRACKS_MLFLOW)
    add_test(NAME "${_mlflow}"
             COMMAND ${_needs_mnist} "${DETTRIAL_MLFLOW_PYTHON}" "${CMAKE_CURRENT_SOURCE_DIR}/mlflow/mlflow_server.py" $<TARGET_FILE:mnist>
                     "${DETTRIAL_MNIST10K_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/runs/mlflow" "${_gloo_missing}")
    set_tests_properties("${_mlflow}" PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
                         PASS_REGULAR_EXPRESSION "ok: runs, a resume, two ranks, a search and a dead server, read back from MLflow's REST API")
  elseif(NOT DETTRIAL_TRACKS_MLFLOW)
    dettrial_skipped_test("${_mlflow}" "this build has no libcurl (Debian: libcurl4-openssl-dev), so no MLflow tracking")
  else()
    dettrial_skipped_test("${_mlflow}" "no Python with the mlflow package given (-DDETTRIAL_MLFLOW_PYTHON=...)")
  endif()
  # One trial from a search config (--test-mode, searcher single over a space), and --resume of a run
  # that stopped before its first checkpoint.
  add_test(NAME "cli: a search config trains one drawn trial in test mode or under single; a run without checkpoint resumes afresh"
           COMMAND ${_needs_mnist} "${_cli}/one_trial.sh" $<TARGET_FILE:mnist> "${PROJECT_SOURCE_DIR}/examples/mnist/random.yaml"
                   "${DETTRIAL_MNIST10K_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/runs/one-trial")
  set_tests_properties("cli: a search config trains one drawn trial in test mode or under single; a run without checkpoint resumes afresh"
                       PROPERTIES SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: one trial from a search config")
  # Data parallel from the command line: the built-in launcher (slots_per_trial: 2), and mpirun.
  set(_ddp_tests "cli: slots_per_trial 2 trains in two processes (built-in launcher, Gloo)"
                 "cli: --nproc 2 on uneven data trains and validates by epochs to the end"
                 "cli: OMP_NUM_THREADS sets each rank's threads" "cli: --threads sets each rank's threads"
                 "cli: mpirun -np 2 trains in two processes (Open MPI environment, Gloo)"
                 "cli: the built-in launcher, mpirun and torchrun give each rank the same thread pools and the same results"
                 "cli: rank_invariant at the default threads: 1 rank aggregating 2 batches and 2 ranks end bit-identical")
  find_program(DETTRIAL_MPIRUN mpirun)
  if(_gloo_missing)
    foreach(_name IN LISTS _ddp_tests)
      dettrial_skipped_test("${_name}" "${_gloo_missing}")
    endforeach()
  else()
    add_test(NAME "cli: slots_per_trial 2 trains in two processes (built-in launcher, Gloo)"
             COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${_cli}/ddp.yaml" --set "data.dir=${DETTRIAL_MNIST10K_DIR}"
                     --output "${CMAKE_CURRENT_BINARY_DIR}/runs/ddp-builtin")
    set_tests_properties("cli: slots_per_trial 2 trains in two processes (built-in launcher, Gloo)" PROPERTIES
                         PASS_REGULAR_EXPRESSION "2 processes \\(RANK/WORLD_SIZE, gloo\\), rendezvous at 127.0.0.1:[0-9]+, global batch 64.*\\[validation\\]"
                         FAIL_REGULAR_EXPRESSION "error:")
    # Uneven data through the real command line: 8,968 training records in per-slot batches of 32 are
    # 281 batches, odd for 2 ranks, with epoch-based length and validation; each rank takes its share
    # of the cores (bound to its own CPUs, or on one CPU sharing it), and says so in the first line.
    add_test(NAME "cli: --nproc 2 on uneven data trains and validates by epochs to the end"
             COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${_cli}/ddp.yaml" --set "data.dir=${DETTRIAL_MNIST10K_DIR}"
                     --set data.holdout=1032 --set "searcher.max_length={epochs: 1}" --set "min_validation_period={epochs: 1}"
                     --set scheduling_unit=50 --nproc 2 --output "${CMAKE_CURRENT_BINARY_DIR}/runs/ddp-uneven")
    set_tests_properties("cli: --nproc 2 on uneven data trains and validates by epochs to the end" PROPERTIES
                         ENVIRONMENT_MODIFICATION "OMP_NUM_THREADS=unset:"
                         PASS_REGULAR_EXPRESSION "threads? \\((CPUs? [0-9,-]+ bound to this rank by the launcher|[0-9]+ cores / 2 ranks on this node): intra-op [0-9]+, [A-Za-z]+ [0-9]+.*an epoch is 141 batches.*\\[train\\] +batches 141 +epochs 1.*\\[validation\\] +batches 141 +epochs 1"
                         FAIL_REGULAR_EXPRESSION "error:")
    # A user's thread count wins: OMP_NUM_THREADS, then --threads.
    add_test(NAME "cli: OMP_NUM_THREADS sets each rank's threads"
             COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${_cli}/ddp.yaml" --set "data.dir=${DETTRIAL_MNIST10K_DIR}" --test-mode
                     --output "${CMAKE_CURRENT_BINARY_DIR}/runs/ddp-omp")
    set_tests_properties("cli: OMP_NUM_THREADS sets each rank's threads" PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1"
                         PASS_REGULAR_EXPRESSION "1 thread \\(OMP_NUM_THREADS: intra-op 1, [A-Za-z]+ 1" FAIL_REGULAR_EXPRESSION "error:")
    add_test(NAME "cli: --threads sets each rank's threads"
             COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${_cli}/ddp.yaml" --set "data.dir=${DETTRIAL_MNIST10K_DIR}" --test-mode
                     --threads 3 --output "${CMAKE_CURRENT_BINARY_DIR}/runs/ddp-threads")
    set_tests_properties("cli: --threads sets each rank's threads" PROPERTIES ENVIRONMENT_MODIFICATION "OMP_NUM_THREADS=unset:"
                         PASS_REGULAR_EXPRESSION "3 threads \\(--threads: intra-op 3, [A-Za-z]+ 3" FAIL_REGULAR_EXPRESSION "error:")
    if(DETTRIAL_MPIRUN)
      add_test(NAME "cli: mpirun -np 2 trains in two processes (Open MPI environment, Gloo)"
               COMMAND ${_needs_mnist} "${DETTRIAL_MPIRUN}" -np 2 --allow-run-as-root --oversubscribe -x MASTER_PORT=29517
                       $<TARGET_FILE:mnist> --config "${_cli}/ddp.yaml" --set "data.dir=${DETTRIAL_MNIST10K_DIR}"
                       --output "${CMAKE_CURRENT_BINARY_DIR}/runs/ddp-mpirun")
      set_tests_properties("cli: mpirun -np 2 trains in two processes (Open MPI environment, Gloo)" PROPERTIES
                           PASS_REGULAR_EXPRESSION "2 processes \\(MPI, gloo\\), rendezvous at [^ ]+:[0-9]+, global batch 64.*\\[validation\\]"
                           FAIL_REGULAR_EXPRESSION "error:")
    else()
      dettrial_skipped_test("cli: mpirun -np 2 trains in two processes (Open MPI environment, Gloo)"
                            "no mpirun on the PATH at configure time (Debian: openmpi-bin)")
    endif()
    # Every launcher gives each rank the same thread pools (the BLAS library's own included), so the
    # same job ends with the same metrics under each.
    list(GET _ddp_tests -2 _launchers_test)
    add_test(NAME "${_launchers_test}"
             COMMAND ${_needs_mnist} "${_cli}/launchers.sh" $<TARGET_FILE:mnist> "${_cli}/ddp.yaml" "${DETTRIAL_MNIST10K_DIR}"
                     "${CMAKE_CURRENT_BINARY_DIR}/runs/launchers" "${DETTRIAL_PYTHON}")
    set_tests_properties("${_launchers_test}" PROPERTIES SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: [0-9] launchers")
    # rank_invariant as a user runs it: no --threads, no OMP_NUM_THREADS (a 1-rank run would take
    # every core and each of 2 ranks half, and matrix products round by their thread count).
    list(GET _ddp_tests -1 _rank_invariant_test)
    add_test(NAME "${_rank_invariant_test}"
             COMMAND ${_needs_mnist} "${_cli}/rank_invariant.sh" $<TARGET_FILE:mnist> "${_cli}/ddp.yaml" "${DETTRIAL_MNIST10K_DIR}"
                     "${CMAKE_CURRENT_BINARY_DIR}/runs/rank-invariant" "${DETTRIAL_PYTHON}")
    set_tests_properties("${_rank_invariant_test}" PROPERTIES PASS_REGULAR_EXPRESSION "ok: 1 rank aggregating 2 batches")
    set_tests_properties(${_ddp_tests} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
  # The example search configs run (shrunk: fewer and shorter trials, the 10,000 MNIST digits).
  set(_small_data --set "data.dir=${DETTRIAL_MNIST10K_DIR}" --set data.train_split=t10k --set data.holdout=1000)
  add_test(NAME "cli: examples/mnist/random.yaml runs a random search"
           COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${PROJECT_SOURCE_DIR}/examples/mnist/random.yaml" ${_small_data}
                   --set searcher.max_trials=3 --set searcher.max_length.batches=20 --set min_validation_period.batches=10
                   --output "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-random")
  set_tests_properties("cli: examples/mnist/random.yaml runs a random search" PROPERTIES
                       PASS_REGULAR_EXPRESSION "best: trial [0-9]+, checkpoint" FAIL_REGULAR_EXPRESSION "error:|ERRORED")
  add_test(NAME "cli: examples/mnist/adaptive.yaml runs adaptive ASHA"
           COMMAND ${_needs_mnist} $<TARGET_FILE:mnist> --config "${PROJECT_SOURCE_DIR}/examples/mnist/adaptive.yaml" ${_small_data}
                   --set searcher.max_trials=4 --set searcher.max_time=40 --set min_validation_period.batches=10
                   --output "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-adaptive")
  set_tests_properties("cli: examples/mnist/adaptive.yaml runs adaptive ASHA" PROPERTIES
                       PASS_REGULAR_EXPRESSION "best: trial [0-9]+, checkpoint" FAIL_REGULAR_EXPRESSION "error:|ERRORED")
  set_tests_properties("cli: examples/mnist/random.yaml runs a random search" "cli: examples/mnist/adaptive.yaml runs adaptive ASHA"
                       PROPERTIES SKIP_RETURN_CODE 77)
  # A fresh search each time (the same command on an existing folder continues that search).
  add_test(NAME "cli: examples/mnist searches start afresh"
           COMMAND "${CMAKE_COMMAND}" -E rm -rf "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-random" "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-adaptive")
  set_tests_properties("cli: examples/mnist searches start afresh" PROPERTIES FIXTURES_SETUP dettrial_mnist_searches_clean)
  set_tests_properties("cli: examples/mnist/random.yaml runs a random search" "cli: examples/mnist/adaptive.yaml runs adaptive ASHA"
                       PROPERTIES FIXTURES_REQUIRED dettrial_mnist_searches_clean)
  set_tests_properties("cli: examples/mnist/adaptive.yaml runs adaptive ASHA" PROPERTIES FIXTURES_SETUP dettrial_mnist_asha)
  add_test(NAME "report: the MNIST ASHA search's page renders in headless Chromium"
           COMMAND ${_needs_mnist} "${CMAKE_CURRENT_SOURCE_DIR}/report/render_report.sh" "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-adaptive/report.html"
                   --sort best validation_error "validation_error vs learning_rate")
  set_tests_properties("report: the MNIST ASHA search's page renders in headless Chromium" PROPERTIES
                       FIXTURES_REQUIRED dettrial_mnist_asha SKIP_RETURN_CODE 77)
  if(DETTRIAL_TENSORBOARD_PYTHON)
    add_test(NAME "cli: TensorBoard's reader returns each MNIST ASHA trial's metrics exactly"
             COMMAND ${_needs_mnist} sh -c "for t in \"$1\"/trials/*/; do \"$0\" \"$2\" \"$t\" || exit 1; done"
                     "${DETTRIAL_TENSORBOARD_PYTHON}" "${CMAKE_CURRENT_BINARY_DIR}/runs/mnist-adaptive" "${CMAKE_CURRENT_SOURCE_DIR}/python/read_tensorboard.py")
    set_tests_properties("cli: TensorBoard's reader returns each MNIST ASHA trial's metrics exactly" PROPERTIES
                         FIXTURES_REQUIRED dettrial_mnist_asha SKIP_RETURN_CODE 77)
  else()
    dettrial_skipped_test("cli: TensorBoard's reader returns each MNIST ASHA trial's metrics exactly"
                          "no Python with the tensorboard package given (-DDETTRIAL_TENSORBOARD_PYTHON=...)")
  endif()
  # The seed's const.yaml runs unchanged (and its cluster-only entrypoint is named in one warning).
  # (Through expect_error.sh: the run must also succeed, exit status 0, not only print the line.)
  add_test(NAME "cli: the seed's cluster-only fields get one warning"
           COMMAND ${_needs_fashion} "${_expect}" 0 "warning: ignoring fields that mean something only on a Determined cluster: entrypoint"
                   $<TARGET_FILE:mnist> --config "${PROJECT_SOURCE_DIR}/examples/mnist/const.yaml" --test-mode
                   --output "${CMAKE_CURRENT_BINARY_DIR}/runs/const-warning")
  set_tests_properties("cli: the seed's cluster-only fields get one warning" PROPERTIES SKIP_RETURN_CODE 77)
  # records_per_epoch (Determined's legacy epoch size) is not used by a PyTorch-style trial, as
  # Determined's PyTorchTrial ignores it: the epoch stays the loader's 938 batches of 64, and a line says so.
  add_test(NAME "cli: records_per_epoch is not used by a PyTorch-style trial, and a line says so"
           COMMAND ${_needs_fashion} "${_expect}" 0 "records_per_epoch 60000 is not used: an epoch is the training data loader's 938 batches on this rank, as Determined's PyTorchTrial ignores"
                   $<TARGET_FILE:mnist> --config "${PROJECT_SOURCE_DIR}/examples/mnist/const.yaml" --test-mode
                   --set records_per_epoch=60000 --output "${CMAKE_CURRENT_BINARY_DIR}/runs/records-per-epoch")
  set_tests_properties("cli: records_per_epoch is not used by a PyTorch-style trial, and a line says so" PROPERTIES SKIP_RETURN_CODE 77)
  dettrial_cli_error("unknown field with a suggestion" 78 "unknown_field.yaml:6:3: unknown field 'searcher.max_trails'; did you mean 'max_trials'\\?"
                     --config "${_cli}/unknown_field.yaml")
  # The seed's const.yaml runs unchanged (one batch in test mode, on Fashion-MNIST).
  add_test(NAME "cli: seed const.yaml runs unchanged"
           COMMAND ${_needs_fashion} "${_expect}" 0 "\\[validation\\].*accuracy"
                   $<TARGET_FILE:mnist> --config "${PROJECT_SOURCE_DIR}/examples/mnist/const.yaml" --test-mode
                   --output "${CMAKE_CURRENT_BINARY_DIR}/runs/const-test-mode")
  set_tests_properties("cli: seed const.yaml runs unchanged" PROPERTIES SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "error:")
endif()

# The Keras-style example on the TFKerasTrial tutorial's const.yaml, unchanged, on Fashion-MNIST: its
# legacy lengths, val_ metrics, and the accuracy Keras itself reaches (bench/keras_mnist_reference.py).
if(TARGET keras_mnist)
  add_test(NAME "keras example: the tutorial's const.yaml runs unchanged and reaches Keras's accuracy"
           COMMAND ${_needs_fashion} "${CMAKE_CURRENT_SOURCE_DIR}/cli/keras_const.sh" $<TARGET_FILE:keras_mnist>
                   "${PROJECT_SOURCE_DIR}/examples/keras_mnist/const.yaml" "${CMAKE_CURRENT_BINARY_DIR}/runs/keras-const" 0.845)
  set_tests_properties("keras example: the tutorial's const.yaml runs unchanged and reaches Keras's accuracy" PROPERTIES
                       SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "ok: the tutorial's const.yaml trains 4000 batches")
endif()
