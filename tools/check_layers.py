#!/usr/bin/env python3
"""Fails when a header of include/dettrial/ includes one from a folder above its own (see the layers
in CONTRIBUTING.md), or when the trial API (dettrial.hpp) pulls in the command line."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DETTRIAL = ROOT / "include" / "dettrial"

# Bottom to top. A header may include headers of its own folder and of lower layers only; folders on
# one layer do not include each other. The top-level files: version.hpp and error.hpp are the base
# (detail/'s internals use the public error types),
# dettrial.hpp (the trial API) sits below the command line, main.hpp above it, and src.hpp (the
# separate-compilation mode's source, which includes everything) on top.
LAYERS = [
    ["version.hpp", "error.hpp", "layout.hpp"],
    ["detail"],
    ["vocabulary", "process"],
    ["config", "data", "metrics", "optim", "tensorboard"],
    ["tracking", "nn"],
    ["distributed"],
    ["step"],
    ["context", "vision"],
    ["checkpoint", "report"],
    ["trainer"],
    ["search", "keras"],
    ["dettrial.hpp"],
    ["vision.hpp", "search.hpp", "samplers.hpp", "keras.hpp", "tokens.hpp"],
    ["cli"],
    ["main.hpp"],
    ["src.hpp"],
]
RANK = {name: level for level, names in enumerate(LAYERS) for name in names}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def room(path: pathlib.Path) -> str:
    """The folder (or top-level file) a header belongs to."""
    return path.relative_to(DETTRIAL).parts[0]


def main() -> int:
    problems = []
    headers = sorted(DETTRIAL.rglob("*.hpp"))
    for header in headers:
        source = room(header)
        if source not in RANK:
            problems.append(f"{header.relative_to(ROOT)}: folder '{source}' is on no layer; add it to LAYERS and CONTRIBUTING.md")
            continue
        for name in INCLUDE_RE.findall(header.read_text()):
            target_path = (header.parent / name).resolve()
            if DETTRIAL not in target_path.parents:
                continue
            target = room(target_path)
            if target == source:
                continue
            if target not in RANK or RANK[target] >= RANK[source]:
                where = "above" if RANK.get(target, 99) > RANK[source] else "on the same layer as"
                problems.append(f"{header.relative_to(ROOT)} includes {target_path.relative_to(ROOT)}: '{target}' is {where} '{source}'")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} include(s) break the layers (CONTRIBUTING.md, 'Layers')", file=sys.stderr)
        return 1
    print(f"{len(headers)} headers, {len(LAYERS)} layers: no header includes one above its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
