// SPDX-License-Identifier: Apache-2.0
// dettrial::compiled: dettrial's non-template code, compiled once (separate-compilation mode).
#include <dettrial/src.hpp>
