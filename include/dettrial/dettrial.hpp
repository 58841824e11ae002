// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial: Determined's trial API for LibTorch, composed at compile time. Include this header.
///
/// A trial is a plain type with hooks (build_training_data_loader, build_validation_data_loader,
/// train_batch, evaluate_batch, and either build_model/optimizer or a constructor that wraps them in
/// the Context). dettrial::Trainer<MyTrial> checks them with concepts and runs Determined's loop.
/// The command line (dettrial::main: the launcher, the experiment runner) is one more, opt-in header:
/// <dettrial/main.hpp>; the search spaces and searchers on their own are <dettrial/search.hpp>.
#pragma once

#include "version.hpp"

#include "error.hpp"
#include "layout.hpp"

#include "config/experiment_config.hpp"
#include "config/hyperparameters.hpp"
#include "config/profiler_options.hpp"
#include "config/units.hpp"
#include "data/data_loader.hpp"
#include "data/idx.hpp"
#include "data/to_device.hpp"
#include "vocabulary/metrics.hpp"
#include "metrics/reducers.hpp"
#include "optim/python_layout.hpp"
#include "optim/libtorch_layouts.hpp"
#include "optim/adadelta.hpp"
#include "optim/adam_family.hpp"
#include "optim/muon.hpp"
#include "nn/activation_checkpoint.hpp"
#include "optim/fused.hpp"
#include "optim/clip.hpp"
#include "optim/detail/lr_state.hpp"
#include "optim/lr_step.hpp"
#include "optim/averaged_model.hpp"
#include "optim/schedulers.hpp"
#include "tensorboard/event_file.hpp"
#include "distributed/detail/agreement.hpp"
#include "distributed/communicator.hpp"
#include "distributed/detail/gradient_buckets.hpp"
#include "process/launch_environment.hpp"
#include "distributed/detail/metrics.hpp"
#include "distributed/sync_batch_norm.hpp"
#include "process/process_settings.hpp"
#include "process/threads.hpp"
#include "context/context.hpp"
#include "context/init.hpp"
#include "vocabulary/trial.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/detail/checkpointer.hpp"
#include "checkpoint/load_weights.hpp"
#include "checkpoint/policy.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/detail/snapshot.hpp"
#include "checkpoint/state_dict.hpp"
#include "checkpoint/storage.hpp"
#include "checkpoint/detail/trial_checkpoint.hpp"
#include "report/html_report.hpp"
#include "report/metrics_log.hpp"
#include "report/detail/profiler.hpp"
#include "report/progress.hpp"
#include "report/detail/reporter.hpp"
#include "report/detail/runtime.hpp"
#include "trainer/detail/callback_set.hpp"
#include "trainer/fit_options.hpp"
#include "trainer/load_trial.hpp"
#include "trainer/trainer.hpp"
