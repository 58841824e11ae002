// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Header-only (the default) or separate compilation: where dettrial's non-template code is compiled.
///
/// Header-only, every function is `inline` and compiled in each translation unit that uses it. With
/// `DETTRIAL_SEPARATE_COMPILATION` defined in every translation unit of a program (the CMake target
/// `dettrial::compiled` does it), the headers declare the non-template functions only and
/// <dettrial/src.hpp>, included in one source file, compiles them once: a trial's translation unit
/// then instantiates the loop for its own trial and nothing else (the way Asio and fmt offer it).
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#define DETTRIAL_DETAIL_LINKAGE_INCLUDED 1

#if defined(DETTRIAL_SEPARATE_COMPILATION)
/// Marks a non-template function defined in a header's definitions section.
#define DETTRIAL_INLINE
#if defined(DETTRIAL_COMPILING_DEFINITIONS)
#define DETTRIAL_HEADER_DEFINITIONS 1
#else
#define DETTRIAL_HEADER_DEFINITIONS 0
#endif
#elif defined(DETTRIAL_HEADER_CHECK)
// The header check (CMake's DETTRIAL_VERIFY_HEADERS: one translation unit per header, the header
// included first): the checked header's definitions compile with what it includes, and the headers
// it includes are read as declarations only (their own translation units check their definitions;
// reading them again in every header that includes them was most of the check's time). Checked
// this way, a header may not lean on what another's definitions section includes.
#define DETTRIAL_INLINE
#define DETTRIAL_HEADER_DEFINITIONS (__INCLUDE_LEVEL__ == 1)
#else
#define DETTRIAL_INLINE inline
/// 1 where a header's definitions section is compiled: always header-only, in <dettrial/src.hpp> otherwise.
#define DETTRIAL_HEADER_DEFINITIONS 1
#endif
