#!/usr/bin/env python3
"""Fails when a header of include/dettrial/ uses a third-party library (LibTorch, its profiler,
yaml-cpp, range-v3, nlohmann/json) without including that library's header itself or through the
dettrial headers it includes; when the include-what-you-use pragma that marks a header internal
(`// IWYU pragma: private, include <dettrial/dettrial.hpp>`) is not exactly on the headers under a
detail/ folder (every header there has it, no other header has it); when a header under detail/
opens a namespace outside `dettrial::detail`, or one outside holds internals only (it belongs under
its folder's detail/); and when a
header spells a namespace other than the one way: every namespace is opened at file scope by its
full name (`namespace dettrial::detail {`, never one block inside another), and every internal
lives in `dettrial::detail` (a file's own helpers in `dettrial::detail::<name>`; never a
`dettrial::vision::detail`, which would shadow `dettrial::detail` inside `dettrial::vision`, nor a
`<name>_detail`), so a reader finds every internal by one search and spells it one way.

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


def is_internal(namespace: str) -> bool:
    return namespace == "dettrial::detail" or namespace.startswith("dettrial::detail::")


FORWARD_DECLARATION_RE = re.compile(r"^(?:template <[^>]*>\s*)?(?:class|struct) \w+;$")


def namespaces_opened(text: str) -> list:
    """The namespaces a header opens, less those whose blocks only declare a class ahead (an
    internal header may name the public type it serves)."""
    opened = []
    for name, body in re.findall(r"^namespace ([\w:]+) \{\n(.*?)^\}  // namespace", text, re.M | re.S):
        code = " ".join(line.strip() for line in COMMENT_RE.sub("", body).splitlines() if line.strip())
        declarations = [d.strip() + ";" for d in code.split(";") if d.strip()]
        if not declarations or not all(FORWARD_DECLARATION_RE.match(d) for d in declarations):
            opened.append(name)
    return opened


def is_private_path(header) -> bool:
    return "detail" in header.relative_to(DETTRIAL).parts[:-1]


def privacy_problems(name: str, private: bool, text: str) -> list:
    """The pragma on exactly the headers under detail/, which hold internals only; a header outside
    that holds internals only belongs under its folder's detail/."""
    problems, opened = [], namespaces_opened(text)
    has_pragma = PRIVATE_PRAGMA in text
    if private and not has_pragma:
        problems.append(f"{name} is internal (under detail/) but lacks the line '{PRIVATE_PRAGMA}' after its #pragma once")
    if not private and "IWYU pragma: private" in text:
        problems.append(f"{name} is public (not under detail/) but carries the private pragma: drop it, or move "
                        f"the header under its folder's detail/ if it holds internals only")
    public = [n for n in opened if not is_internal(n)]
    if private and public:
        problems.append(f"{name} is under detail/ but opens the public namespace '{public[0]}': public API "
                        f"lives in a public header")
    if not private and opened and not public:
        problems.append(f"{name} holds internals only (every namespace it opens is dettrial::detail...): move it "
                        f"under its folder's detail/")
    return problems


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
            elif "detail" in opened[1].split("::") and not is_internal(opened[1]):
                problems.append(f"{where}: internals live in 'dettrial::detail' (a file's own in "
                                f"'dettrial::detail::<name>'), not in '{opened[1]}'")
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
        "nested detail": "namespace dettrial::vision::detail {\n}  // namespace dettrial::vision::detail\n",
    }
    failures = [] if not namespace_problems("good.hpp", good) else ["the one way was refused"]
    failures += [f"'{case}' passed" for case, text in bad.items() if not namespace_problems(case, text)]
    internal = "#pragma once\n" + PRIVATE_PRAGMA + "\n" + good
    public = "#pragma once\nnamespace dettrial {\nint p;\n}  // namespace dettrial\n"
    privacy = {  # (private?, text): what must be refused
        "internal without the pragma": (True, good),
        "public with the pragma": (False, internal.replace(good, public.split("\n", 1)[1])),
        "public namespace under detail/": (True, "#pragma once\n" + PRIVATE_PRAGMA + "\n" + public.split("\n", 1)[1]),
        "internals only outside detail/": (False, good),
    }
    if privacy_problems("internal.hpp", True, internal) or privacy_problems("public.hpp", False, public):
        failures.append("a well-placed header was refused")
    failures += [f"'{case}' passed" for case, (private, text) in privacy.items() if not privacy_problems(case, private, text)]
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
        problems += privacy_problems(str(header.relative_to(ROOT)), is_private_path(header), text[header])
    for header in headers:
        problems += namespace_problems(str(header.relative_to(ROOT)), text[header])
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(headers)} headers: each includes the third-party headers it uses, internal ones say so, "
          f"the private pragma is exactly on the headers under detail/, and each namespace is opened one way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
