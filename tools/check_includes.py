#!/usr/bin/env python3
"""Fails when a header of include/dettrial/ uses a third-party library (LibTorch, its profiler,
yaml-cpp, range-v3, nlohmann/json) without including that library's header itself or through the
dettrial headers it includes; and when a header under detail/ lacks the include-what-you-use pragma
that marks it internal (`// IWYU pragma: private, include <dettrial/dettrial.hpp>`).

The header self-containment build (DETTRIAL_VERIFY_HEADERS) compiles the headers that need LibTorch
with these libraries precompiled, which is minutes faster but cannot see a missing include of one of
them: this check sees it, in a second."""
import re
import sys

from check_layers import DETTRIAL, INCLUDE_RE, ROOT

# library: (what using it looks like, what including it looks like)
LIBRARIES = {
    "LibTorch": (re.compile(r"\b(?:torch|at|c10)::"), re.compile(r"^\s*#\s*include\s*<(?:torch|ATen|c10)/", re.M)),
    "LibTorch's profiler": (re.compile(r"\btorch::autograd::profiler::|\btorch::profiler::"),
                            re.compile(r"^\s*#\s*include\s*<torch/csrc/(?:autograd/profiler|profiler/)", re.M)),
    "yaml-cpp": (re.compile(r"\bYAML::"), re.compile(r"^\s*#\s*include\s*<yaml-cpp/", re.M)),
    "range-v3": (re.compile(r"(?<!std::)\b(?:ranges|views)::"),
                 re.compile(r"^\s*#\s*include\s*<range/v3/", re.M)),
    "nlohmann/json": (re.compile(r"\bnlohmann::"), re.compile(r"^\s*#\s*include\s*<nlohmann/", re.M)),
}
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
PRIVATE_PRAGMA = "// IWYU pragma: private, include <dettrial/dettrial.hpp>"


def main() -> int:
    headers = sorted(DETTRIAL.rglob("*.hpp"))
    text = {h: h.read_text() for h in headers}
    code = {h: COMMENT_RE.sub("", t) for h, t in text.items()}
    direct = {h: [(h.parent / name).resolve() for name in INCLUDE_RE.findall(t)] for h, t in text.items()}

    def closure(header) -> set:
        seen, stack = {header}, [header]
        while stack:
            for included in direct.get(stack.pop(), []):
                if included not in seen and included in text:
                    seen.add(included)
                    stack.append(included)
        return seen

    problems = []
    for header in headers:
        reach = closure(header)
        for library, (use, include) in LIBRARIES.items():
            if use.search(code[header]) and not any(include.search(text[h]) for h in reach):
                problems.append(f"{header.relative_to(ROOT)} uses {library} but includes none of its headers, "
                                f"itself or through the dettrial headers it includes")
    for header in headers:
        if header.parent.name == "detail" and PRIVATE_PRAGMA not in text[header]:
            problems.append(f"{header.relative_to(ROOT)} is internal (under detail/) but lacks the line "
                            f"'{PRIVATE_PRAGMA}' after its #pragma once")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(headers)} headers: each includes the third-party headers it uses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
