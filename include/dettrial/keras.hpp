// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Keras-style trials for dettrial (Determined's TFKerasTrial): `build_model()` returning
/// `keras::compile(...)`'s model, in-memory sequences, losses, metrics and optimizers by name, and
/// Keras's callbacks; `Trainer` and `dettrial::main` run such a trial through keras::TrialAdapter.
/// Opt-in, next to <dettrial/dettrial.hpp>.
#pragma once

#include "dettrial.hpp"

#include "keras/keras_callbacks.hpp"
#include "keras/keras.hpp"
