// Experiment configs against Determined's own schema test cases (determined-ai/determined,
// schemas/test_cases/v0/*.yaml, at c1e9c6d7b821ef246d612bb9922f7fb1b58dcf2e, 2025-03-20): every config
// they call valid for http://determined.ai/schemas/expconf/v0/experiment.json is accepted, and so is
// every valid case of a section (searcher, resources, checkpoint storage, length, hyperparameter, ...)
// put into a minimal experiment (the file's "minimal valid experiment": an entrypoint and a single
// searcher). Cases are copied as data (fields and values kept, comments dropped). Configs Determined's
// schema calls valid that dettrial deliberately refuses are refused with their reason; configs it
// calls invalid are ConfigErrors.

// LibTorch before doctest (as the precompiled header has it): Debian's LibTorch brings glog, whose
// CHECK macro must not be the one the test cases use.
#include <dettrial/dettrial.hpp>

#include <doctest/doctest.h>

#include <optional>
#include <string>

using namespace dettrial;

namespace {

struct SchemaCase {
  const char* name;
  const char* yaml;
};

// Skipped from the valid cases (deliberately refused; checked below to be refused with their reason):
//  - searchers.yaml "custom searcher (valid)": searcher 'custom' (EOL in Determined too: its master
//    answers "the 'custom' searcher has been removed and is not valid for new experiments").
//  - searchers.yaml "sync_halving searcher defaults", "sync_halving searcher (valid)", "adaptive searcher
//    defaults", "adaptive searcher (valid)", "adaptive_simple searcher defaults", "adaptive_simple searcher
//    (valid)": searchers removed from Determined (its master refuses them for new experiments).
//  - defaults.yaml "async_halving searcher defaults", "adaptive_asha searcher defaults": no max_time (nor the
//    deprecated max_length); Determined's master refuses them too ("requires `max_time` and `time_metric`").
//  - unions.yaml "s3 checkpoint storage (valid, no prefix)", "gcs checkpoint storage (valid)", misc.yaml
//    "s3/gcs checkpoint storage (valid, prefix single dot | prefix mangled looking)", misc.yaml "azure is valid
//    when ..." (2), eventually.yaml "azure connection string valid", "azure account url valid", "azure account
//    url and credential valid": checkpoint storage dettrial does not write (only shared_fs and directory).
// Not experiment configs (nothing to parse): merging.yaml (merge results), test-structs.yaml (test-only
// schemas), log_policies.yaml's merge cases, and the removed backward-compatibility.yaml (its "new" form,
// `actions:`, is not in the current log-policy.json).
const SchemaCase valid_cases[] = {
    // ---- experiment.yaml: whole experiment configs ----
    {"experiment.yaml: full valid experiment", R"(
bind_mounts:
  - host_path: /asdf
    container_path: /asdf
    read_only: true
    propagation: "rprivate"
checkpoint_policy: best
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  storage_path: determined-cp
  propagation: rprivate
  container_path: /asdf
  checkpoint_path: /qwer
  tensorboard_path: /zxcv
  save_experiment_best: 0
  save_trial_best: 1
  save_trial_latest: 1
data:
  any: thing
integrations:
  pachyderm:
    pachd:
      host: localhost
      port: 80
    proxy:
      scheme: http
      host: localhost
      port: 80
    dataset:
      branch: br
      commit: commit-hash
      project: proj
      repo: repo-name
      token: tkn
data_layer:
  container_storage_path: null
  type: shared_fs
debug: false
description: pytorch-noop description
entrypoint: long.module.path.model_def:NoopPyTorchTrial
environment:
  environment_variables: {}
  force_pull_image: false
  image:
    cpu: determinedai/pytorch-ngc-dev:0736b6d
    cuda: determinedai/pytorch-ngc-dev:0736b6d
    rocm: determinedai/environments:rocm-5.0-pytorch-1.10-tf-2.7-rocm-622d512
  pod_spec: null
  ports:
    qwer: 1234
    asdf: 5678
  registry_auth:
    username: usr
    password: pwd
    auth: ath
    email: eml
    serveraddress: srvaddr
    identitytoken: idtkn
    registrytoken: rgtkn
  add_capabilities:
    - CAP_CHOWN
  drop_capabilities:
    - CAP_KILL
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
internal: null
labels: []
log_policies: []
max_restarts: 5
min_validation_period:
  batches: 0
name: pytorch-noop
optimizations:
  aggregation_frequency: 1
  auto_tune_tensor_fusion: false
  average_aggregated_gradients: true
  average_training_metrics: true
  gradient_compression: false
  grad_updates_size_file: "/tmp/hi I am a size file"
  mixed_precision: O0
  tensor_fusion_cycle_time: 1
  tensor_fusion_threshold: 64
perform_initial_validation: false
pbs:
  slots_per_node: 99
  pbsbatch_args:
    - --aa bb
profiling:
  enabled: true
  begin_on_batch: 0
  end_after_batch: 1
  sync_timings: false
records_per_epoch: 0
reproducibility:
  experiment_seed: 1606239866
resources:
  agent_label: 'big_al'
  devices:
    - host_path: "/dev/infiniband"
      container_path: "/dev/infiniband"
      mode: "rmw"
    - "/host/dev1:/container/dev1"
  slots_per_trial: 15
  weight: 1000
  max_slots: 900
  priority: 55
  resource_pool: 'asdf'
  native_parallel: false
scheduling_unit: 100
searcher:
  max_length:
    batches: 1000
  metric: loss
  name: single
  smaller_is_better: true
  source_checkpoint_uuid: null
  source_trial_id: null
security:
  kerberos:
    config_file: xyz
tensorboard_storage:
  type: shared_fs
  host_path: /tmp
  container_path: /asdf
  checkpoint_path: /qwer
  tensorboard_path: /zxcv
slurm:
  slots_per_node: 101
  sbatch_args:
    - --another
)"},
    {"experiment.yaml: minimal valid experiment", R"(
searcher:
  name: single
  metric: loss
entrypoint: model_def:MyTrial
)"},
    // The same case as Determined fills it in (its `defaulted`), which is what it shows and exports as the
    // experiment's config. Its '*' placeholders (any value) stay the string '*', except the seed, an integer.
    {"experiment.yaml: minimal valid experiment (defaulted)", R"(
bind_mounts: []
checkpoint_policy: best
checkpoint_storage: null
data: {}
integrations: null
debug: false
description: null
entrypoint: model_def:MyTrial
environment:
  environment_variables:
    cpu: []
    cuda: []
    rocm: []
  force_pull_image: false
  image:
    cpu: '*'
    cuda: '*'
    rocm: '*'
  pod_spec:
  ports: {}
  proxy_ports: []
  registry_auth: null
  add_capabilities: []
  drop_capabilities: []
hyperparameters: {}
log_policies:
  - name: "*"
    pattern: "*"
  - name: "*"
    pattern: "*"
labels: []
max_restarts: 5
min_checkpoint_period:
  batches: 0
min_validation_period:
  batches: 0
name: '*'
optimizations:
  aggregation_frequency: 1
  auto_tune_tensor_fusion: false
  average_aggregated_gradients: true
  average_training_metrics: true
  gradient_compression: false
  grad_updates_size_file: null
  mixed_precision: O0
  tensor_fusion_cycle_time: 1
  tensor_fusion_threshold: 64
pbs: {}
perform_initial_validation: false
preemption_timeout: null
profiling:
  enabled: false
  begin_on_batch: 0
  end_after_batch: null
  sync_timings: true
records_per_epoch: 0
reproducibility:
  experiment_seed: 1606239866
resources:
  devices: []
  native_parallel: false
  shm_size: null
  slots_per_trial: 1
  weight: 1
  max_slots: null
  priority: null
  resource_pool: ''
  is_single_node: null
scheduling_unit: 100
searcher:
  metric: loss
  name: single
  smaller_is_better: true
  source_checkpoint_uuid: null
  source_trial_id: null
slurm: {}
workspace: ''
project: ''
)"},
    {"experiment.yaml: check grid conditional (valid)", R"(
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
      count: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
      count: 2
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
      count: 2
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
searcher:
  name: grid
  metric: loss
entrypoint: model_def:MyTrial
)"},
    // Removed from experiment.yaml in 2022 (with global_batch_size's requirement); still valid.
    {"experiment.yaml (2021): records_per_epoch conditional (valid)", R"(
hyperparameters:
  global_batch_size: 32
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
  max_length:
    epochs: 10
min_validation_period:
  epochs: 10
min_checkpoint_period:
  epochs: 10
records_per_epoch: 10
)"},

    // ---- entrypoint.yaml: whole experiment configs ----
    {"entrypoint.yaml: entrypoint check (command string, valid)", R"(
entrypoint: python3 train.py
)"},
    {"entrypoint.yaml: entrypoint check (array, valid)", R"(
entrypoint: ["python3", "-m", "determined.launch.autohorovod", "model_def:Trial"]
)"},

    // ---- searchers.yaml and defaults.yaml: each valid searcher as the experiment's searcher ----
    {"searchers.yaml: single searcher (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  max_length:
    batches: 1000
  metric: loss
  smaller_is_better: true
  source_checkpoint_uuid: null
  source_trial_id: null
)"},
    {"searchers.yaml: random searcher (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: random
  max_concurrent_trials: 2
  max_length:
    batches: 1000
  max_trials: 1000
  metric: loss
  smaller_is_better: true
  source_checkpoint_uuid: "asdf"
  source_trial_id: null
)"},
    {"searchers.yaml: grid searcher (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: grid
  max_concurrent_trials: 2
  max_length:
    batches: 1000
  metric: loss
  smaller_is_better: true
  source_checkpoint_uuid: "asdf"
  source_trial_id: null
)"},
    {"searchers.yaml: async_halving searcher (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: async_halving
  num_rungs: 5
  max_length:
    batches: 1000
  max_trials: 100
  divisor: 1.5
  max_concurrent_trials: 2
  metric: loss
  smaller_is_better: true
  source_checkpoint_uuid: null
  source_trial_id: 15
  stop_once: true
)"},
    {"searchers.yaml: adaptive_asha searcher (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: adaptive_asha
  max_length:
    batches: 1000
  max_trials: 100
  bracket_rungs: [1, 2, 3, 4, 5]
  divisor: 5
  mode: standard
  max_rungs: 5
  max_concurrent_trials: 5
  metric: loss
  smaller_is_better: true
  source_checkpoint_uuid: null
  source_trial_id: 15
  stop_once: true
)"},
    {"searchers.yaml: single searcher (unitless)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  max_length: 10
  metric: loss
)"},
    {"defaults.yaml: single searcher defaults", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
)"},
    {"defaults.yaml: random searcher defaults", R"(
entrypoint: model_def:MyTrial
searcher:
  name: random
  max_trials: 1000
  metric: loss
  source_checkpoint_uuid: "asdf"
)"},
    {"defaults.yaml: grid searcher defaults", R"(
entrypoint: model_def:MyTrial
searcher:
  name: grid
  metric: loss
  source_trial_id: 15
)"},

    // ---- defaults.yaml, misc.yaml, gpu-cuda-migration.yaml, environment.yaml, unions.yaml: sections ----
    {"defaults.yaml: bind_mount defaults", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
bind_mounts:
  - host_path: /asdf
    container_path: /zxcv
)"},
    {"defaults.yaml: environment defaults with k8sV1.Pod present", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  environment_variables:
    - ASDF=asdf
  pod_spec: {}
  ports:
    asdf: 1
  registry_auth:
    username: samiam
    password: eggsnham
  add_capabilities:
    - CAP_STRING
  drop_capabilities:
    - OTHER_CAP_STRING
)"},
    {"defaults.yaml: devices defaults, in string and map forms", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
resources:
  devices:
    - host_path: "/h1"
      container_path: "/c1"
      mode: "r"
    - host_path: "/h2"
      container_path: "/c2"
    - "/h3:/c3:r"
    - "/h4:/c4"
)"},
    {"misc.yaml: allow useless slots config in resources", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
resources:
  slots: 1
  slots_per_trial: 1
)"},
    {"misc.yaml: shm size valid 1.5 gb", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
resources:
  shm_size: 1.5 gb
)"},
    {"misc.yaml: shm size valid 1 (omitting bytes)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
resources:
  shm_size: 1
)"},
    {"misc.yaml: shm size valid 1219021 b", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
resources:
  shm_size: 1219021 b
)"},
    {"misc.yaml: profiling is valid when empty", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling: {}
)"},
    {"misc.yaml: profiling is valid when only enabled is set", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling:
  enabled: true
)"},
    {"misc.yaml: profiling is valid when full", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling:
  enabled: true
  begin_on_batch: 10
  end_after_batch: 100
)"},
    {"misc.yaml: profiling is valid when begin == end", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling:
  enabled: true
  begin_on_batch: 10
  end_after_batch: 10
)"},
    {"misc.yaml: check counts for grid (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: grid, metric: loss}
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  a: 1
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
      count: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
      count: 4
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
      count: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
)"},
    {"compare_properties.yaml: a<=b compareProperties (valid, nonequal) (profiling)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling:
  enabled: true
  begin_on_batch: 2
  end_after_batch: 3
)"},
    {"compare_properties.yaml: a<=b compareProperties (valid, equal) (profiling)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
profiling:
  enabled: true
  begin_on_batch: 2
  end_after_batch: 2
)"},
    {"compare_properties.yaml: a_is_subdir_of_b (valid, no storage path)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
)"},
    {"compare_properties.yaml: a_is_subdir_of_b (valid, absolute)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  storage_path: /tmp/storage_path
)"},
    {"compare_properties.yaml: a_is_subdir_of_b (valid, relative)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  storage_path: storage_path
)"},
    {"unions.yaml: shared_fs checkpoint storage (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: shared_fs
  host_path: /tmp
  storage_path: determined-cp
  propagation: rprivate
  container_path: /asdf
  checkpoint_path: /qwer
  tensorboard_path: /zxcv
  save_experiment_best: 0
  save_trial_best: 1
  save_trial_latest: 1
)"},
    {"unions.yaml: directory checkpoint storage (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: directory
  container_path: /path/on/disk
  save_experiment_best: 0
  save_trial_best: 1
  save_trial_latest: 1
)"},
    {"unions.yaml: directory checkpoint storage minimal (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
checkpoint_storage:
  type: directory
  container_path: /path/on/disk
)"},
    {"unions.yaml: environment image string (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image: "alpine"
)"},
    {"unions.yaml: environment image map of string (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image:
    cpu: "alpine"
    cuda: "alpine"
    rocm: "alpine"
)"},
    {"unions.yaml: environment variables list of strings (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  environment_variables:
    - "ABCD=1234"
)"},
    {"unions.yaml: environment variables map of lists of strings (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  environment_variables:
    cpu:
      - "ABCD=1234"
    cuda:
      - "ABCD=1234"
    rocm:
      - "ABCD=1234"
)"},
    {"unions.yaml: whole environment with no objects", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image: "alpine"
  environment_variables:
    - "ABCD=1234"
)"},
    {"unions.yaml: whole environment with all objects", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image:
    cpu: "alpine"
    cuda: "alpine"
    rocm: "alpine"
  environment_variables:
    cpu:
      - "ABCD=1234"
    cuda:
      - "ABCD=1234"
    rocm:
      - "ABCD=1234"
)"},
    {"environment.yaml: podspec can configure sidecar", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  pod_spec:
    spec:
      containers:
        - name: my-sidecar
          security_context: whatever
)"},
    {"gpu-cuda-migration.yaml: recognize gpu field for backwards compatibility", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image:
    gpu: hellocuda
  environment_variables:
    gpu:
      - ASDF=asdf
    cpu:
      - CPU=cpu
    rocm:
      - ROCM=ROCM
  pod_spec: {}
  ports:
    asdf: 1
  registry_auth:
    username: samiam
    password: eggsnham
  add_capabilities:
    - CAP_STRING
  drop_capabilities:
    - OTHER_CAP_STRING
)"},
    {"gpu-cuda-migration.yaml: recognize cuda field and backfill", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
environment:
  image:
    cuda: hellocuda
  environment_variables:
    cuda:
      - ASDF=asdf
    cpu:
      - CPU=cpu
    rocm:
      - ROCM=ROCM
  pod_spec: {}
  ports:
    asdf: 1
  registry_auth:
    username: samiam
    password: eggsnham
  add_capabilities:
    - CAP_STRING
  drop_capabilities:
    - OTHER_CAP_STRING
)"},
    {"optional_ref.yaml: optionalRef extension (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
security:
  kerberos:
    config_file: asdf
)"},
    {"optional_ref.yaml: optionalRef extension (null)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
security:
  kerberos: null
)"},

    // ---- log_policies.yaml: policies (a policy case as a one-policy list) ----
    {"log_policies.yaml: valid log policy", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - name: policy name
    pattern: a
    action: cancel_retries
)"},
    {"log_policies.yaml: valid legacy log policy", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - pattern: a
    action:
      type: cancel_retries
)"},
    {"log_policies.yaml: valid log policy (after shim applied to a legacy policy)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - pattern: a
    action: cancel_retries
)"},
    {"log_policies.yaml: valid log policy (user wants to override default log policy)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - name: policy name
    pattern: a
)"},
    {"log_policies.yaml: valid log policies", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - name: policy name
    pattern: a
    action: exclude_node
)"},
    {"log_policies.yaml: default values", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies: []
)"},
    {"log_policies.yaml: user can override default values", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
log_policies:
  - name: CUDA OOM
  - name: ECC Error
)"},

    // ---- length.yaml, unions.yaml: lengths, as periods (length.json) and, when positive, as max_length ----
    {"length.yaml: positive Length", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
  max_length:
    batches: 1
min_validation_period:
  batches: 1
min_checkpoint_period:
  batches: 1
)"},
    {"length.yaml: zero Length", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
min_validation_period:
  batches: 0
min_checkpoint_period:
  batches: 0
)"},
    {"unions.yaml: records length (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
  max_length:
    records:
      1
min_validation_period:
  records:
    1
)"},
    {"unions.yaml: batches length (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
  max_length:
    batches:
      1
min_checkpoint_period:
  batches:
    1
)"},
    {"unions.yaml: epochs length (valid)", R"(
entrypoint: model_def:MyTrial
searcher:
  name: single
  metric: loss
  max_length:
    epochs:
      1
min_validation_period:
  epochs:
    1
)"},

    // ---- hyperparameters.yaml, compare_properties.yaml: each valid hyperparameter as `h` ----
    {"hyperparameters.yaml: implicit const hyperparameter (valid, empty, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, null, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h: null
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, bool, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h: true
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, int, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h: 1
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, float, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h: 1.0
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, list, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    - 1
    - fish
    - 2
    - fish
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, dict, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    red: fish
    blue: fish
)"},
    {"hyperparameters.yaml: explicit const hyperparameter (valid, str, explicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: const
    val: asdf
)"},
    {"hyperparameters.yaml: explicit const hyperparameter (valid, list, explicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: const
    val: [1, "fish", 2, "fish"]
)"},
    {"hyperparameters.yaml: explicit const hyperparameter (valid, dict, explicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: const
    val: {"red": "fish", "blue": "fish"}
)"},
    {"hyperparameters.yaml: int hyperparameter (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: int
    minval: 1
    maxval: 2
)"},
    {"hyperparameters.yaml: double hyperparameter (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: double
    minval: 1
    maxval: 2
)"},
    {"hyperparameters.yaml: log hyperparameter (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: log
    minval: 1
    maxval: 10
    base: 3.14
)"},
    {"hyperparameters.yaml: categorical hyperparameter (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: categorical
    vals:
      - null
      - true
      - 0
      - 0.0
      - asdf
      - [1, "fish", 2, "fish"]
      - {"red": "fish", "blue": "fish"}
)"},
    {"hyperparameters.yaml: implicit const hyperparameter (valid, implicit)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    nest:
      const_implicit_empty:
      const_implicit_null: null
      const_implicit_bool: true
      const_implicit_int: 1234
      const_implicit_float: 1234.5678
      const_implicit_list:
        - 1
        - fish
        - 2
        - fish
      const_implicit_dict:
        red: fish
        blue: fish
)"},
    {"compare_properties.yaml: a<b compareProperties (valid)", R"(
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss}
hyperparameters:
  h:
    type: int
    minval: 2
    maxval: 3
)"},
};

}  // namespace

TEST_CASE("every experiment config Determined's schema test cases call valid is accepted") {
  for (const SchemaCase& c : valid_cases) {
    INFO("case: " << c.name);
    std::optional<ExperimentConfig> config;
    CHECK_NOTHROW(config.emplace(ExperimentConfig::parse(c.yaml, c.name)));
    if (!config) continue;
    // The search space reads too (lists are constants, as in Determined's hyperparameter.json), and a grid
    // searcher's points exist (every int, double and log axis has its count).
    CHECK_NOTHROW(HyperparameterSpace(config->hyperparameters, config->source));
    if (config->searcher.name == "grid") {
      CHECK_NOTHROW(HyperparameterSpace(config->hyperparameters, config->source).grid());
    }
  }
}

TEST_CASE("schema-valid configs that dettrial deliberately refuses are refused with their reason") {
  const struct {
    const char* name;
    const char* yaml;
    const char* reason;
  } refused[] = {
      {"searchers.yaml: custom searcher (valid)", "entrypoint: model_def:MyTrial\nsearcher:\n  name: custom\n",
       "unknown searcher 'custom'"},
      {"searchers.yaml: sync_halving searcher defaults",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: sync_halving\n  max_length:\n    batches: 1000\n  num_rungs: 5\n"
       "  budget:\n    epochs: 1\n  metric: loss\n  smaller_is_better: true\n",
       "searcher 'sync_halving' was removed from Determined"},
      {"searchers.yaml: adaptive searcher defaults",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: adaptive\n  max_length:\n    batches: 1000\n  budget:\n    batches: 10000\n"
       "  metric: loss\n",
       "searcher 'adaptive' was removed from Determined"},
      {"searchers.yaml: adaptive_simple searcher defaults",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: adaptive_simple\n  max_length:\n    batches: 1000\n  max_trials: 100\n"
       "  max_rungs: 5\n  metric: loss\n",
       "searcher 'adaptive_simple' was removed from Determined"},
      {"searchers.yaml: sync_halving searcher (valid)",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: sync_halving\n  max_length:\n    batches: 1000\n  num_rungs: 5\n"
       "  budget:\n    epochs: 1\n  divisor: 1.5\n  train_stragglers: true\n  metric: loss\n  smaller_is_better: true\n"
       "  source_checkpoint_uuid: null\n  source_trial_id: 15\n",
       "searcher 'sync_halving' was removed from Determined"},
      {"searchers.yaml: adaptive searcher (valid)",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: adaptive\n  max_length:\n    batches: 1000\n  budget:\n    batches: 10000\n"
       "  bracket_rungs: [1, 2, 3, 4, 5]\n  divisor: 1.5\n  train_stragglers: true\n  max_rungs: 5\n  mode: standard\n"
       "  metric: loss\n  smaller_is_better: true\n  source_checkpoint_uuid: null\n  source_trial_id: 15\n",
       "searcher 'adaptive' was removed from Determined"},
      {"searchers.yaml: adaptive_simple searcher (valid)",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: adaptive_simple\n  max_length:\n    batches: 1000\n  max_trials: 100\n"
       "  max_rungs: 5\n  mode: standard\n  divisor: 1.5\n  metric: loss\n  smaller_is_better: true\n"
       "  source_checkpoint_uuid: null\n  source_trial_id: 15\n",
       "searcher 'adaptive_simple' was removed from Determined"},
      {"defaults.yaml: async_halving searcher defaults",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: async_halving\n  num_rungs: 5\n  max_trials: 100\n  metric: loss\n",
       "searcher 'adaptive_asha' needs max_time"},
      {"defaults.yaml: adaptive_asha searcher defaults",
       "entrypoint: model_def:MyTrial\nsearcher:\n  name: adaptive_asha\n  max_trials: 100\n  metric: loss\n",
       "searcher 'adaptive_asha' needs max_time"},
      {"unions.yaml: s3 checkpoint storage (valid, no prefix)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: s3\n  bucket: determined-cp\n  access_key: minio\n"
       "  secret_key: \"12341234\"\n  endpoint_url: \"http://192.168.0.4:9000\"\n  save_experiment_best: 0\n  save_trial_best: 1\n"
       "  save_trial_latest: 1\n",
       "checkpoint_storage type 's3' is not one dettrial writes"},
      {"misc.yaml: s3 checkpoint storage (valid, prefix mangled looking)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: s3\n  bucket: determined-cp\n  access_key: minio\n"
       "  secret_key: \"12341234\"\n  prefix: \"this/is/././.../a/prefix/\"\n  endpoint_url: \"http://192.168.0.4:9000\"\n"
       "  save_experiment_best: 0\n  save_trial_best: 1\n  save_trial_latest: 1\n",
       "checkpoint_storage type 's3' is not one dettrial writes"},
      {"misc.yaml: s3 checkpoint storage (valid, prefix single dot)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: s3\n  bucket: determined-cp\n  access_key: minio\n"
       "  secret_key: \"12341234\"\n  prefix: \"this/./prefix\"\n  endpoint_url: \"http://192.168.0.4:9000\"\n"
       "  save_experiment_best: 0\n  save_trial_best: 1\n  save_trial_latest: 1\n",
       "checkpoint_storage type 's3' is not one dettrial writes"},
      {"misc.yaml: gcs checkpoint storage (valid, prefix mangled looking)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: gcs\n  bucket: determined-cp\n  prefix: \"this/is/././.../a/prefix/\"\n",
       "checkpoint_storage type 'gcs' is not one dettrial writes"},
      {"unions.yaml: gcs checkpoint storage (valid)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: gcs\n  bucket: determined-cp\n  save_experiment_best: 0\n"
       "  save_trial_best: 1\n  save_trial_latest: 1\n",
       "checkpoint_storage type 'gcs' is not one dettrial writes"},
      {"misc.yaml: gcs checkpoint storage (valid, prefix single dot)",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: gcs\n  bucket: determined-cp\n  prefix: \"this/./prefix\"\n",
       "checkpoint_storage type 'gcs' is not one dettrial writes"},
      {"eventually.yaml: azure connection string valid",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: azure\n  container: container_name\n"
       "  connection_string: connection_string\n",
       "checkpoint_storage type 'azure' is not one dettrial writes"},
      {"eventually.yaml: azure account url valid",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: azure\n  container: container_name\n  account_url: account_url\n",
       "checkpoint_storage type 'azure' is not one dettrial writes"},
      {"eventually.yaml: azure account url and credential valid",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: azure\n  container: container_name\n  account_url: account_url\n"
       "  credential: credential\n",
       "checkpoint_storage type 'azure' is not one dettrial writes"},
      {"misc.yaml: azure is valid when both account_url and credential specified",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: azure\n  container: my_container\n  account_url: my_acc_url\n"
       "  credential: my_pwd\n",
       "checkpoint_storage type 'azure' is not one dettrial writes"},
      {"misc.yaml: azure is valid when connection_string and credential specified, but one is null",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: azure\n  container: my_container\n"
       "  connection_string: my_conn_str\n  credential: null\n",
       "checkpoint_storage type 'azure' is not one dettrial writes"},
  };
  for (const auto& c : refused) {
    INFO("case: " << c.name);
    CHECK_THROWS_WITH_AS(ExperimentConfig::parse(c.yaml, c.name), doctest::Contains(c.reason), ConfigError);
  }
}

TEST_CASE("configs Determined's schema test cases call invalid are ConfigErrors") {
  const SchemaCase invalid_configs[] = {
      // length.yaml "negative Length", as a period and as the searcher's max_length.
      {"length.yaml: negative Length (min_validation_period)",
       "searcher: {name: single, metric: loss}\nmin_validation_period:\n  batches: -1\n"},
      {"length.yaml: negative Length (searcher.max_length)", "searcher:\n  name: single\n  metric: loss\n  max_length:\n    batches: -1\n"},
      {"searcher-length.json: a negative unitless max_length", "searcher:\n  name: single\n  metric: loss\n  max_length: -1\n"},
      // length.yaml "empty length (invalid)" and "double length (invalid)".
      {"length.yaml: empty length (invalid)", "searcher: {name: single, metric: loss}\nmin_checkpoint_period: {}\n"},
      {"length.yaml: double length (invalid)", "searcher: {name: single, metric: loss}\nmin_validation_period:\n  batches: 10\n  records: 10\n"},
      // experiment.json's additionalProperties: false, at the top and in a section.
      {"experiment.json: an unknown top-level field", "searcher: {name: single, metric: loss}\nnot_a_field: 1\n"},
      {"resources.json: an unknown field", "searcher: {name: single, metric: loss}\nresources:\n  slots_per_trail: 2\n"},
      // Wrong types.
      {"experiment.json: max_restarts is an integer", "searcher: {name: single, metric: loss}\nmax_restarts: five\n"},
      {"experiment.json: searcher is an object", "searcher: [single, loss]\n"},
      {"experiment.json: hyperparameters is an object", "searcher: {name: single, metric: loss}\nhyperparameters: [1, 2]\n"},
      {"searcher-single.json: smaller_is_better is a boolean", "searcher: {name: single, metric: loss, smaller_is_better: maybe}\n"},
      {"length.json: a length is an integer", "searcher: {name: single, metric: loss}\nmin_validation_period:\n  batches: 1.5\n"},
      // Enums and minimums.
      {"experiment.json: checkpoint_policy is best, all or none", "searcher: {name: single, metric: loss}\ncheckpoint_policy: sometimes\n"},
      {"optimizations.json: mixed_precision is O0..O3", "searcher: {name: single, metric: loss}\noptimizations:\n  mixed_precision: O4\n"},
      {"experiment.json: scheduling_unit is at least 1", "searcher: {name: single, metric: loss}\nscheduling_unit: 0\n"},
      {"optimizations.json: aggregation_frequency is at least 1", "searcher: {name: single, metric: loss}\noptimizations:\n  aggregation_frequency: 0\n"},
      {"resources.json: slots_per_trial is at least 0", "searcher: {name: single, metric: loss}\nresources:\n  slots_per_trial: -1\n"},
      {"shared-fs.json: save_trial_best is at least 0",
       "searcher: {name: single, metric: loss}\ncheckpoint_storage:\n  type: shared_fs\n  host_path: /tmp\n  save_trial_best: -1\n"},
      {"searcher-random.json: max_trials is at least 1", "searcher: {name: random, metric: loss, max_trials: 0}\n"},
      {"searcher-random.json: max_concurrent_trials is at least 0",
       "searcher: {name: random, metric: loss, max_trials: 2, max_concurrent_trials: -1}\n"},
      // profiling.json: the batches are at least 0, and the end does not come before the beginning.
      {"profiling.json: begin_on_batch is at least 0", "searcher: {name: single, metric: loss}\nprofiling: {enabled: true, begin_on_batch: -1}\n"},
      {"profiling.json: end_after_batch not before begin_on_batch",
       "searcher: {name: single, metric: loss}\nprofiling: {enabled: true, begin_on_batch: 10, end_after_batch: 9}\n"},
      {"profiling.json: an unknown field", "searcher: {name: single, metric: loss}\nprofiling: {enabled: true, end_on_batch: 9}\n"},
      {"profiling.json: enabled is a boolean", "searcher: {name: single, metric: loss}\nprofiling: {enabled: sometimes}\n"},
  };
  for (const SchemaCase& c : invalid_configs) {
    INFO("case: " << c.name);
    CHECK_THROWS_AS(ExperimentConfig::parse(c.yaml, c.name), ConfigError);
  }

  // Hyperparameter spaces are checked where they are read (the searcher's space), not by parse.
  {
    INFO("case: experiment.yaml: check grid conditional (invalid)");
    const ExperimentConfig c = ExperimentConfig::parse(R"(
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
      count: 2
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
searcher:
  name: grid
  metric: loss
)",
                                                       "grid.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source).grid(),
                         doctest::Contains("needs 'count' for hyperparameter 'dict_hparam.log_hparam'"), ConfigError);
  }
  {
    INFO("case: misc.yaml: check counts for grid (invalid)");
    const ExperimentConfig c = ExperimentConfig::parse(R"(
searcher: {name: grid, metric: loss}
hyperparameters:
  global_batch_size:
    type: const
    val: 32
  a: 1
  list_hparam:
    - 10
    - type: const
      val: asdf
    - type: int
      minval: 1
      maxval: 2
  dict_hparam:
    double_hparam:
      type: double
      minval: 1
      maxval: 10
    log_hparam:
      type: log
      minval: 1
      maxval: 10
      base: 1
  categorical_hparam:
    type: categorical
    vals: [1, 2, 3, 4]
)",
                                                       "grid.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source).grid(),
                         doctest::Contains("needs 'count' for hyperparameter 'dict_hparam.double_hparam'"), ConfigError);
  }
  {
    INFO("case: hyperparameters.yaml: nested hyperparameters (invalid, to show paths in errors)");
    const ExperimentConfig c =
        ExperimentConfig::parse("searcher: {name: random, metric: loss, max_trials: 2}\nhyperparameters:\n  one:\n    a:\n      type: categorical\n",
                                "nested.yaml");
    CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source),
                         doctest::Contains("hyperparameter 'one.a' of type categorical needs a non-empty list 'vals'"), ConfigError);
  }
  {
    INFO("case: compare_properties.yaml: a<b compareProperties (invalid, equal) and (invalid, nonequal)");
    for (const char* maxval : {"2", "1"}) {
      INFO("maxval: " << maxval);
      const ExperimentConfig c = ExperimentConfig::parse(
          std::string("searcher: {name: random, metric: loss, max_trials: 2}\nhyperparameters:\n  h: {type: int, minval: 2, maxval: ") + maxval +
              "}\n",
          "int.yaml");
      CHECK_THROWS_WITH_AS(HyperparameterSpace(c.hyperparameters, c.source), doctest::Contains("hyperparameter 'h' needs minval < maxval"),
                           ConfigError);
    }
  }
}
