// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief dettrial's command line, opt-in: `dettrial::main<MyTrial>(argc, argv)` (one trial, a
/// data-parallel job through the built-in launcher, or a hyperparameter search). Include it in the
/// one translation unit that defines `main`; trials need only <dettrial/dettrial.hpp>.
#pragma once

#include "dettrial.hpp"
#include "search.hpp"

#include "cli/main.hpp"
