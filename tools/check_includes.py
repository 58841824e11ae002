#!/usr/bin/env python3
"""Fails when a header of include/dettrial/ uses a third-party library (LibTorch, its profiler,
yaml-cpp, range-v3, nlohmann/json) without including that library's header itself or through the
dettrial headers it includes; and when a header under detail/ lacks the include-what-you-use pragma
that marks it internal (`// IWYU pragma: private, include <dettrial/dettrial.hpp>`); and when a
header spells a namespace other than the one way: every namespace is opened at file scope by its
full name (`namespace dettrial::vision::detail {`, never one block inside another), and the
internals of a namespace N live in `N::detail` (a file's own helpers in `N::detail::<name>`, never
a `<name>_detail` of their own), so a reader finds every internal by one search.

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
NAMESPACE_OPEN_RE = re.compile(r"^namespace ([\w:]+) \{$")
NAMESPACE_CLOSE_RE = re.compile(r"^\}  // namespace ([\w:]+)$")


def namespace_problems(name: str, text: str) -> list:
    """The namespace rule's breaks in one header: a block opened inside another, a name that is not
    dettrial's full path, an internal namespace spelled `<name>_detail`, and a close that names
    another block (the comment is how a reader finds where a block ends)."""
    problems, open_block = [], None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{number}"
        if re.search(r"\bnamespace\s+[\w:]*_detail\b|\b\w+_detail::", line):
            problems.append(f"{where}: internals go in '<namespace>::detail' (a file's own in "
                            f"'<namespace>::detail::<name>'), not a '<name>_detail' namespace")
        opened, closed = NAMESPACE_OPEN_RE.match(line), NAMESPACE_CLOSE_RE.match(line)
        if opened:
            if open_block is not None:
                problems.append(f"{where}: namespace '{opened[1]}' is opened inside '{open_block}': close it and "
                                f"open '{open_block}::{opened[1]}' at file scope")
            if opened[1] != "dettrial" and not opened[1].startswith("dettrial::"):
                problems.append(f"{where}: namespace '{opened[1]}' is not opened by its full name (dettrial::...)")
            open_block = opened[1]
        elif closed:
            if closed[1] != open_block:
                problems.append(f"{where}: the comment names '{closed[1]}' but the block closed is '{open_block}'")
            open_block = None
        elif re.match(r"^\s*namespace\s+[\w:]*\s*\{", line):
            problems.append(f"{where}: a namespace opens on its own line as 'namespace <full name> {{' at column 0")
    return problems


def self_test() -> int:
    """The namespace rule catches each way of breaking it, and passes the one way."""
    good = "namespace dettrial::detail {\nint a;\n}  // namespace dettrial::detail\n"
    bad = {
        "nested": "namespace dettrial {\nnamespace detail {\n}  // namespace detail\n}  // namespace dettrial\n",
        "own _detail": "namespace dettrial::cyclic_detail {\n}  // namespace dettrial::cyclic_detail\n",
        "used _detail": "namespace dettrial {\nint b = cyclic_detail::x;\n}  // namespace dettrial\n",
        "short name": "namespace vision {\n}  // namespace vision\n",
        "wrong close": "namespace dettrial::detail {\n}  // namespace dettrial\n",
        "indented": "namespace dettrial {\n  namespace detail { int c; }\n}  // namespace dettrial\n",
    }
    failures = [] if not namespace_problems("good.hpp", good) else ["the one way was refused"]
    failures += [f"'{case}' passed" for case, text in bad.items() if not namespace_problems(case, text)]
    for failure in failures:
        print(f"check_includes self-test: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
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
    for header in headers:
        problems += namespace_problems(str(header.relative_to(ROOT)), text[header])
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(headers)} headers: each includes the third-party headers it uses, internal ones say so, "
          f"and each namespace is opened one way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
