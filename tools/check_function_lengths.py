#!/usr/bin/env python3
"""Fails when a function defined in include/dettrial/ is longer than 80 lines, or one in
include/dettrial/search/ longer than 40 (the search runner is read as one decision after another:
each its own named step), the pickle reader's opcode switch aside (one case per opcode reads best as
one switch). Functions are found by Universal Ctags, which knows where each one ends; without it the
check is skipped (exit 77)."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 80
# Tighter limits for the folders under include/dettrial/ named here.
FOLDER_LIMITS = {"search": 40}
# By qualified name, so that no other function of the same name is let through.
EXEMPT = {"dettrial::detail::pickle::Machine::step"}  # an opcode switch: one case per opcode


def main() -> int:
    ctags = shutil.which("ctags")
    if not ctags:
        print("skipped: no ctags (Debian: universal-ctags)")
        return 77
    version = subprocess.run([ctags, "--version"], capture_output=True, text=True).stdout
    if "Universal Ctags" not in version:
        print("skipped: ctags is not Universal Ctags, which knows where functions end")
        return 77
    listing = subprocess.run([ctags, "-R", "--languages=C++", "--kinds-C++=f", "--fields=+neZ", "-x",
                              "--_xformat=%{line} %{end} %{scope} %N %F", str(ROOT / "include" / "dettrial")],
                             capture_output=True, text=True, check=True).stdout
    functions = 0
    long = []
    for row in listing.splitlines():
        # A name may hold a space (`operator ()`); the path, last, holds none.
        head, path = row.rsplit(" ", 1)
        line, end, scope, name = head.split(" ", 3)
        if not end.isdigit():
            continue
        functions += 1
        length = int(end) - int(line) + 1
        qualified = f"{scope}::{name}" if scope != "-" else name
        relative = pathlib.Path(path).relative_to(ROOT)
        limit = FOLDER_LIMITS.get(relative.parts[2], LIMIT) if len(relative.parts) > 3 else LIMIT
        if length > limit and qualified not in EXEMPT:
            long.append((length, name, relative, int(line), limit))
    if functions < 100:
        print(f"ctags found only {functions} functions: the listing is not what this check reads", file=sys.stderr)
        return 1
    for length, name, path, line, limit in sorted(long, reverse=True):
        print(f"{path}:{line}: {name} is {length} lines, over {limit}: split it into named steps", file=sys.stderr)
    if long:
        return 1
    tighter = ", ".join(f"{limit} in {folder}/" for folder, limit in FOLDER_LIMITS.items())
    print(f"ok: {functions} functions, none over {LIMIT} lines ({tighter}) but {', '.join(sorted(EXEMPT))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
