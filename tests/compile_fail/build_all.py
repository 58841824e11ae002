#!/usr/bin/env python3
"""Builds every compile-fail target in one `cmake --build` (two compile jobs, keep going) and leaves
each target's compiler output in LOG_DIR/<target>.log, which the compile-fail tests then match
against their expected sentence. A target that builds leaves no log (its test fails: no sentence).

usage: build_all.py BUILD_DIR LOG_DIR TARGET...

With DETTRIAL_COMPILE_CHECK_CACHE set to a folder, a case whose compiler output is known (the same
command, case and compiler, and every file it read unchanged: tools/compile_check_cache.py) is not
compiled again; ccache cannot do this, as it caches no failed compilation.
"""
import concurrent.futures
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
from compile_check_cache import Cache  # noqa: E402

TARGET_RE = re.compile(r"CMakeFiles/(compile_fail_[A-Za-z0-9_]+)\.dir/")


def build(build_dir, targets):
    """Builds `targets`; returns each failed one's compiler output."""
    if not targets:
        return {}
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
    return {target: "".join(lines) for target, lines in blocks.items()}


def compile_command(build_dir, target):
    """The case's compile command (no launcher), from ninja."""
    commands = subprocess.run(["ninja", "-C", build_dir, "-t", "commands", target],
                              stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()
    mine = [c for c in commands if f"CMakeFiles/{target}.dir/" in c and " -c " in c]
    if len(mine) != 1:
        return None
    words = shlex.split(mine[0])
    return words[1:] if words[0].endswith("ccache") else words


def main() -> int:
    build_dir, log_dir, targets = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    folder = os.environ.get("DETTRIAL_COMPILE_CHECK_CACHE")
    cache = Cache(folder, build_dir) if folder else None
    logs: dict = {}
    commands: dict = {}
    if cache:
        for target in targets:
            commands[target] = compile_command(build_dir, target)
            known = cache.lookup(commands[target]) if commands[target] else None
            if known is not None and known["status"] != 0:
                logs[target] = known["log"]
    to_build = [t for t in targets if t not in logs]
    built_logs = build(build_dir, to_build)
    if cache:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: cache.store(commands[t], 1, built_logs[t]),
                          [t for t in built_logs if commands.get(t)]))
    logs.update(built_logs)
    for target, text in logs.items():
        (log_dir / f"{target}.log").write_text(text)
    built = [t for t in targets if t not in logs]
    print(f"{len(logs)} of {len(targets)} compile-fail targets failed to build, as they must "
          f"({len(targets) - len(to_build)} known from the cache, unchanged inputs)")
    for target in built:
        print(f"built, but must not: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
