#!/usr/bin/env python3
"""Builds every compile-fail target in one `cmake --build` (two compile jobs, keep going) and leaves
each target's compiler output in LOG_DIR/<target>.log, which the compile-fail tests then match
against their expected sentence. A target that builds leaves no log (its test fails: no sentence).

usage: build_all.py BUILD_DIR LOG_DIR TARGET...
"""
import pathlib
import re
import shutil
import subprocess
import sys

TARGET_RE = re.compile(r"CMakeFiles/(compile_fail_[A-Za-z0-9_]+)\.dir/")


def main() -> int:
    build_dir, log_dir, targets = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    run = subprocess.run(["cmake", "--build", build_dir, "-j", "2", "--target", *targets, "--", "-k", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    # Ninja prints a failed step as "FAILED: <outputs>", its command and its output, together.
    blocks: dict = {}
    current = None
    for line in run.stdout.splitlines(keepends=True):
        if line.startswith("FAILED: "):
            match = TARGET_RE.search(line)
            current = match.group(1) if match else None
        elif line.startswith("[") or line.startswith("ninja: "):
            current = None
        if current is not None:
            blocks.setdefault(current, []).append(line)
    for target, lines in blocks.items():
        (log_dir / f"{target}.log").write_text("".join(lines))
    built = [t for t in targets if t not in blocks]
    print(f"{len(blocks)} of {len(targets)} compile-fail targets failed to build, as they must")
    for target in built:
        print(f"built, but must not: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
