#!/usr/bin/env python3
"""How many lines of dettrial's headers a trial's translation unit reads: the source preprocessed as
a project compiles it against dettrial::compiled (DETTRIAL_SEPARATE_COMPILATION: the non-template
bodies left out), and the non-blank lines that come from include/dettrial/ counted, in total and
per folder, largest first. The default source is the minimal trial unit of bench/compile/
(the MNIST trial, a Context and Trainer::fit, no command line).

  tools/trial_unit_lines.py [SOURCE] [--include DIR]... [--compiler g++] [--top N]

LibTorch's headers are found as CMake's builds find them: TORCH_INCLUDE (a folder holding
torch/torch.h and torch/csrc/api/include), else Debian's /usr/include."""
import argparse
import collections
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DETTRIAL = ROOT / "include" / "dettrial"
LINEMARKER = re.compile(r'^# (\d+) "([^"]*)"')


def torch_includes() -> list:
    import os
    base = pathlib.Path(os.environ.get("TORCH_INCLUDE", "/usr/include"))
    return [str(base), str(base / "torch" / "csrc" / "api" / "include")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default=str(ROOT / "bench" / "compile" / "trial_only.cpp"))
    parser.add_argument("--include", action="append", default=[], help="a further include folder")
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--top", type=int, default=12, help="folders and files to list")
    args = parser.parse_args()
    includes = [str(ROOT / "include"), str(ROOT / "examples")] + args.include + torch_includes()
    command = [args.compiler, "-std=c++20", "-E", "-DDETTRIAL_SEPARATE_COMPILATION", args.source]
    for folder in includes:
        command += ["-I", folder]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
        print(f"trial_unit_lines.py: {args.source} did not preprocess", file=sys.stderr)
        return 1
    per_file = collections.Counter()
    current = None
    for line in out.stdout.splitlines():
        marker = LINEMARKER.match(line)
        if marker:
            path = pathlib.Path(marker[2])
            current = path.resolve() if path.is_absolute() or path.exists() else None
            continue
        if current is None or not line.strip():
            continue
        try:
            per_file[current.relative_to(DETTRIAL).as_posix()] += 1
        except ValueError:
            pass
    total = sum(per_file.values())
    per_folder = collections.Counter()
    for name, count in per_file.items():
        per_folder[name.split("/")[0] if "/" in name else "(top)"] += count
    print(f"{total} non-blank lines of include/dettrial/ in {pathlib.Path(args.source).name}'s unit "
          f"({len(per_file)} headers), separate compilation")
    print("by folder: " + ", ".join(f"{name} {count}" for name, count in per_folder.most_common(args.top)))
    print("largest headers: " + ", ".join(f"{name} {count}" for name, count in per_file.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
