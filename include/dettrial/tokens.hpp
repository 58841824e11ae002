// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Token data for language models: `TokenFile` (a memory-mapped file of token ids, as
/// nanoGPT's `train.bin`) and `TokenWindows` (its windows as (input, target) batches for
/// `DataLoader`). Opt-in, next to <dettrial/dettrial.hpp>: a trial that reads no tokens does not
/// read their declarations.
#pragma once

#include "dettrial.hpp"

#include "data/token_file.hpp"
