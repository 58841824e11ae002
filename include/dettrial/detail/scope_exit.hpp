// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Runs a function when a scope ends, however it ends (std::experimental::scope_exit's role).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <utility>

namespace dettrial::detail {

template <class F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  ~ScopeExit() {
    if (armed_) f_();
  }
  /// The scope ended as planned: do not run the function.
  void dismiss() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

/// `auto guard = on_scope_exit([&] { ... });`
template <class F>
ScopeExit<F> on_scope_exit(F f) {
  return ScopeExit<F>(std::move(f));
}

}  // namespace dettrial::detail
