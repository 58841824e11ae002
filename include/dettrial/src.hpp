// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Separate-compilation mode: include this in exactly one source file of a program whose
/// translation units all define `DETTRIAL_SEPARATE_COMPILATION`; it compiles dettrial's non-template
/// code (configuration, checkpoints, collectives, reports, the search runner and the command line)
/// once. The CMake target `dettrial::compiled` is that source file as a static library.
#pragma once

#if !defined(DETTRIAL_SEPARATE_COMPILATION)
#error \
    "<dettrial/src.hpp> belongs to separate-compilation mode: define DETTRIAL_SEPARATE_COMPILATION in every translation unit (linking dettrial::compiled does), or leave it out (header-only)"
#endif
#if defined(DETTRIAL_DETAIL_LINKAGE_INCLUDED)
#error \
    "<dettrial/src.hpp> must be the first dettrial header of its source file: headers included before it were read without their definitions"
#endif

#define DETTRIAL_COMPILING_DEFINITIONS 1
#include "main.hpp"
#include "vision.hpp"
#include "keras.hpp"
#include "tokens.hpp"
