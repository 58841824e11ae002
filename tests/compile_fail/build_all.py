#!/usr/bin/env python3
"""Compiles every compile-fail target and leaves each target's compiler output in LOG_DIR/<target>.log,
which the compile-fail tests then match against their expected sentence. A target that builds
leaves no log (its test fails: no sentence).

A case that stops at its first error (-fmax-errors=1) is parse-checked first, two at a time
(tools/compile_check_cache.py): a sentence from a class template is found while the file is parsed,
the first error a whole compilation prints too, in a second instead of the 15 s GCC spends on
LibTorch's templates at the end of the file. The cases whose file parses clean (their error comes
from a function template, instantiated at the end) are then built in one `cmake --build` (two
compile jobs, keep going).

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
from compile_check_cache import Cache, parse_check, parsed_clean, without_outputs  # noqa: E402

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
    # The builds' launchers: ccache, or scripts/lib/ccache-launcher in front of it.
    return words[1:] if os.path.basename(words[0]) in ("ccache", "ccache-launcher") else words


def parse_case(build_dir, log_dir, target, command):
    """The case's first error and the files it read, when its file has an error before the end of
    parsing; else None."""
    if command is None or "-fmax-errors=1" not in command:
        return None  # a case that reports every error (the hooks') needs the whole compilation
    status, printed, files = parse_check(without_outputs(command), log_dir / f"{target}.parse.cpp", build_dir)
    return None if status == 0 or parsed_clean(printed) else (printed, files)


def main() -> int:
    build_dir, log_dir, targets = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    folder = os.environ.get("DETTRIAL_COMPILE_CHECK_CACHE")
    cache = Cache(folder, build_dir) if folder else None
    logs: dict = {}
    commands = {target: compile_command(build_dir, target) for target in targets}
    if cache:
        for target in targets:
            known = cache.lookup(commands[target]) if commands[target] else None
            if known is not None and known["status"] != 0:
                logs[target] = known["log"]
    unknown = [t for t in targets if t not in logs]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        parsed = dict(zip(unknown, pool.map(lambda t: parse_case(build_dir, log_dir, t, commands[t]), unknown)))
    parsed = {t: found for t, found in parsed.items() if found is not None}
    new_logs = {t: log for t, (log, _) in parsed.items()}
    to_build = [t for t in unknown if t not in new_logs]
    new_logs.update(build(build_dir, to_build))
    if cache:  # a parsed case's files are known; a built one's come from the compiler's -M
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: cache.store(commands[t], 1, new_logs[t], parsed[t][1] if t in parsed else None),
                          [t for t in new_logs if commands[t]]))
    logs.update(new_logs)
    for target, text in logs.items():
        (log_dir / f"{target}.log").write_text(text)
    built = [t for t in targets if t not in logs]
    print(f"{len(logs)} of {len(targets)} compile-fail targets failed to build, as they must "
          f"({len(targets) - len(unknown)} known from the cache, unchanged inputs; "
          f"{len(unknown) - len(to_build)} by their parse alone, {len(to_build)} compiled whole)")
    for target in built:
        print(f"built, but must not: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
