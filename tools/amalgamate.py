#!/usr/bin/env python3
"""Generates single_include/dettrial/dettrial.hpp from include/ (dettrial's headers inlined once each,
system and third-party includes kept). `--check` fails when the committed file is stale."""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
ENTRY = INCLUDE / "dettrial" / "dettrial.hpp"
OUTPUT = ROOT / "single_include" / "dettrial" / "dettrial.hpp"
BANNER = """// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
"""
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def resolve(current: pathlib.Path, kind: str, name: str):
    candidates = [current.parent / name] if kind == '"' else []
    candidates.append(INCLUDE / name)
    for c in candidates:
        c = c.resolve()
        if c.is_file() and INCLUDE in c.parents:
            return c
    return None


def inline(path: pathlib.Path, seen: set, out: list):
    if path in seen:
        return
    seen.add(path)
    rel = path.relative_to(INCLUDE).as_posix()
    out.append(f"// ---- begin {rel}\n")
    for line in path.read_text().splitlines(keepends=True):
        if line.strip() == "#pragma once" or "IWYU pragma: private" in line:
            continue
        m = INCLUDE_RE.match(line)
        if m:
            target = resolve(path, m.group(1), m.group(2))
            if target is not None:
                inline(target, seen, out)
                continue
        out.append(line)
    out.append(f"// ---- end {rel}\n")


def generate() -> str:
    out = [BANNER, "#pragma once\n"]
    inline(ENTRY.resolve(), set(), out)
    return "".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed single header is stale")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python3 tools/amalgamate.py", file=sys.stderr)
            return 1
        print(f"{OUTPUT.relative_to(ROOT)} is up to date")
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, newline="\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
