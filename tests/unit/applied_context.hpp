// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief test::Context: a dettrial::Context whose process settings are applied as dettrial::main
/// applies them, the one call a main of one's own makes.
#pragma once

#include <dettrial/dettrial.hpp>

namespace test {

/// A Context made as a training process's main makes it: its process settings (threads,
/// determinism, the allocator, the trial's seed) applied right after it is constructed.
struct Context : dettrial::Context {
  using dettrial::Context::Context;

 private:
  // Inherited constructors still run default member initializers: this one runs after the base.
  bool applied_ = (process_settings().apply(), true);
};

}  // namespace test
