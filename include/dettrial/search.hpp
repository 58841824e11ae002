// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Hyperparameter search for dettrial: Determined's search spaces (`hyperparameters` with
/// `type: const | int | double | log | categorical`) and searchers (single, random, grid, ASHA), for a
/// program that samples or drives trials itself. Opt-in, next to <dettrial/dettrial.hpp>: a trial's
/// translation unit does not read them (<dettrial/main.hpp>, the experiment runner, includes them).
#pragma once

#include "dettrial.hpp"

#include "search/hyperparameter_space.hpp"
#include "search/searchers.hpp"
